"""Benchmarks (not tests): each compares sparkpriv against baselines on the same
data in one run, prints a table, and prints one JSON object as its last line.

Each module has ``add_arguments(parser)`` and ``run_from_args(args)``.
"""

BENCHMARKS = {
    "projection": ("sparkpriv.bench.projection", "projection release vs MLlib multiply, identity floor, single process"),
    "kmeans": ("sparkpriv.bench.kmeans", "seconds per Lloyd iteration: DP k-means vs MLlib KMeans"),
    "noise": ("sparkpriv.bench.noise", "float-safe samplers vs numpy's laplace/normal"),
    "dprp": ("sparkpriv.bench.dprp", "DPRP Gram step vs MLlib computeGramianMatrix, and the whole release"),
    "cdr": ("sparkpriv.bench.cdr", "CDR events: bounding + sparse projection release vs groupBy/collect floor"),
    "dpgm": ("sparkpriv.bench.dpgm", "examples/s of one DP-SGD step (RBM, VAE) vs the non-private step"),
    "regression": ("sparkpriv.bench.regression", "AdaSSP regression release vs MLlib LinearRegression(normal); --utility"),
    "utility": ("sparkpriv.bench.utility", "private person x item tables on real data: every method, every table, "
                "union and pair workloads, results table and plot"),
    "synthetic-scale": ("sparkpriv.bench.synthetic_scale", "the synthetic release and synthesis at catalogue sizes "
                        "vs the non-private per-item query"),
    "counts": ("sparkpriv.bench.counts", "DP distinct people per tower vs groupBy.countDistinct and the peers"),
    "aggregates": ("sparkpriv.bench.aggregates", "DP distinct people, calls, sum, mean and median duration per "
                   "tower x hour vs the non-private groupBy.agg and the peers"),
}


def module_main(name: str, argv=None) -> int:
    """``python -m sparkpriv.bench.<name>``: the same as ``sparkpriv bench <name>``."""
    import argparse
    import importlib
    import logging

    mod = importlib.import_module(f"sparkpriv.bench.{name}")
    parser = argparse.ArgumentParser(prog=f"python -m sparkpriv.bench.{name}",
                                     description=mod.__doc__.splitlines()[0])
    mod.add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    mod.run_from_args(args)
    return 0
