"""Benchmarks (not tests): each compares sparkpriv against baselines on the same
data in one run, prints a table, and prints one JSON object as its last line.

Each module has ``add_arguments(parser)`` and ``run_from_args(args)``.
"""

BENCHMARKS = {
    "projection": ("sparkpriv.bench.projection", "projection release vs MLlib multiply, identity floor, single process"),
    "noise": ("sparkpriv.bench.noise", "float-safe samplers vs numpy's laplace/normal"),
}
