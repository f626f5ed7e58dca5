"""Benchmark: float-safe grid noise vs numpy's textbook ``laplace`` / ``normal``.

In one process, on the same machine and the same array size, times (best of
``repeats``):

* numpy ``rng.laplace(0, b, n)`` and ``rng.normal(0, s, n)`` on numpy's own
  default generator (``default_rng``, PCG64; float64: the textbook samplers
  that leak through their low bits),
* sparkpriv ``add_noise`` with calibrated Laplace and Gaussian noise on a zeros
  array of ``n`` values: rounding to the grid, integer noise, conversion back,
  and the Laplace case again on the numpy path (``laplace_numpy_path``: the
  same bits without the compiled kernels of :mod:`sparkpriv.privacy._compiled`),
  all on a release stream (:func:`sparkpriv.privacy.random.stream`: AES-128-CTR),
* optionally (``exact=True``) the exact rational samplers against the fast ones
  on ``max(n // 1000, 1000)`` draws at a moderate scale (t = 50, sigma = 40).

The timed calls take turns in every repeat, so both sides see the same load.

Prints a table of samples/s and, as its last line, one JSON object.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import numpy as np

__all__ = ["run", "add_arguments", "run_from_args"]


def _best_interleaved(fns: dict, repeats: int) -> dict:
    """Best wall time of each callable, the callables taking turns in every round."""
    best = {name: float("inf") for name in fns}
    for _ in range(max(int(repeats), 1)):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def run(samples: int = 10_000_000, repeats: int = 3, exact: bool = False, out=sys.stdout) -> dict:
    """Run the benchmark and return its figures (also printed; JSON last).

    Parameters
    ----------
    samples : int
        Draws per timed call.
    repeats : int
        Each timing is the best of this many calls.
    exact : bool
        Also time the exact samplers on ``max(samples // 1000, 1000)`` draws.
    out : file-like
        Where the table and the JSON line go.
    """
    from sparkpriv.privacy.noise import (
        add_noise,
        calibrate_gaussian_noise,
        calibrate_laplace_noise,
        sample_discrete_gaussian,
        sample_discrete_laplace,
    )
    from sparkpriv.privacy import _compiled
    from sparkpriv.privacy.random import new_secret_seed, stream

    n = int(samples)
    rng = stream(new_secret_seed("bench-noise"), 0)  # AES-128-CTR, as in a release
    base = np.random.default_rng()  # numpy's own generator (PCG64) for its own samplers
    rng.standard_exponential(1000)  # warm up (the first AES call sets up its tables)
    lap = calibrate_laplace_noise(sensitivity=1.0, epsilon=1.0, dim=1)
    gau = calibrate_gaussian_noise(sensitivity=1.0, epsilon=1.0, delta=1e-6, dim=1)
    zeros = np.zeros(n)

    timings = _best_interleaved(
        {
            "numpy_laplace": lambda: base.laplace(0.0, 1.0, n),
            "numpy_gaussian": lambda: base.normal(0.0, gau.std, n),
            "laplace": lambda: add_noise(zeros, lap, rng),
            "laplace_numpy_path": lambda: add_noise(zeros, lap, rng, kern=None),
            "gaussian": lambda: add_noise(zeros, gau, rng),
        },
        repeats,
    )
    rows = [(name, secs, n) for name, secs in timings.items()]
    if exact:
        m = max(n // 1000, 1000)
        small = _best_interleaved(
            {
                "fast_laplace_t50": lambda: sample_discrete_laplace(rng, 50.0, m),
                "exact_laplace_t50": lambda: sample_discrete_laplace(rng, 50.0, m, exact=True),
                "fast_gaussian_s40": lambda: sample_discrete_gaussian(rng, 40.0, m),
                "exact_gaussian_s40": lambda: sample_discrete_gaussian(rng, 40.0, m, exact=True),
            },
            repeats,
        )
        rows += [(name, secs, m) for name, secs in small.items()]
    rate = {name: count / secs for name, secs, count in rows}

    print(f"{'sampler':<20} {'samples':>12} {'seconds':>10} {'samples/s':>14}", file=out)
    for name, secs, count in rows:
        print(f"{name:<20} {count:>12d} {secs:>10.4f} {count / secs:>14.4g}", file=out)
    result = {
        "samples": n,
        "repeats": int(repeats),
        "laplace_samples_per_s": rate["laplace"],
        "gaussian_samples_per_s": rate["gaussian"],
        "numpy_laplace_samples_per_s": rate["numpy_laplace"],
        "numpy_gaussian_samples_per_s": rate["numpy_gaussian"],
        "ratio_vs_numpy_laplace": rate["laplace"] / rate["numpy_laplace"],
        "ratio_vs_numpy_gaussian": rate["gaussian"] / rate["numpy_gaussian"],
        # the same draws and bits either way (sparkpriv.privacy._compiled); > 1: the kernels are faster
        "laplace_compiled_vs_numpy_path": rate["laplace"] / rate["laplace_numpy_path"],
        "compiled_kernels": _compiled.status(),
        "generator": type(rng.bit_generator).__name__,
        "aes_ni": bool(getattr(rng.bit_generator, "use_aesni", False)),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
    }
    if exact:
        for name in small:
            result[f"{name}_samples_per_s"] = rate[name]
    print(json.dumps(result, sort_keys=True), file=out)
    return result


def add_arguments(parser) -> None:
    """Add ``--samples``, ``--repeats`` and ``--exact`` to an argparse (sub)parser."""
    parser.add_argument("--samples", type=int, default=10_000_000, help="draws per timed call")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many calls")
    parser.add_argument(
        "--exact", action="store_true", help="also time the exact samplers (samples/1000 draws)"
    )


def run_from_args(args) -> dict:
    """Entry point for ``sparkpriv bench noise``."""
    return run(samples=args.samples, repeats=args.repeats, exact=args.exact)


if __name__ == "__main__":  # pragma: no cover
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    run_from_args(p.parse_args())
