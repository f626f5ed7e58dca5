"""``sparkpriv bench dpgm``: examples per second of one DP-SGD step vs the non-private step.

For each model (RBM on ``--items`` binary columns with ``--rbm-hidden`` hidden
units; VAE on ``--vae-cols`` columns, one hidden layer of ``--vae-hidden``
units, 2-d latent) and each batch size, on one core (BLAS threads limited to
1): the median wall time of ``--repeats`` calls of

* the non-private step: the per-example gradient sum (no clipping, no noise;
  the RBM's negative phase included in both);
* the DP-SGD step: per-example norms from the outer-product identity, the
  clipped sum in the same matrix products, and the discrete Gaussian noise on
  the grid (one draw per parameter);

and their ratio (the DP overhead; target <= 1.5x). Records are random sparse
binary rows (about 11 items of ``--items``) or uniform [0, 1] rows. A
benchmark, not a test: it asserts nothing. Prints a table and, as its last
line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

__all__ = ["add_arguments", "run_from_args", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--items", type=int, default=1303, help="RBM visible units [default: 1303]")
    parser.add_argument("--rbm-hidden", type=int, default=32, help="RBM hidden units [default: 32]")
    parser.add_argument("--vae-cols", type=int, default=784, help="VAE columns [default: 784]")
    parser.add_argument("--vae-hidden", type=int, default=200, help="VAE hidden units [default: 200]")
    parser.add_argument("--batches", type=str, default="256,1024", help="batch sizes [default: 256,1024]")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per case [default: 7]")


def run_from_args(args: argparse.Namespace) -> dict:
    batches = [int(b) for b in str(args.batches).split(",") if b]
    return run(items=args.items, rbm_hidden=args.rbm_hidden, vae_cols=args.vae_cols,
               vae_hidden=args.vae_hidden, batches=batches, repeats=args.repeats)


def _median_time(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def run(*, items: int = 1303, rbm_hidden: int = 32, vae_cols: int = 784, vae_hidden: int = 200,
        batches=(256, 1024), repeats: int = 7) -> dict:
    from threadpoolctl import threadpool_limits

    from sparkpriv.mechanisms import dpsgd
    from sparkpriv.mechanisms.rbm import RBM
    from sparkpriv.mechanisms.vae import VAE
    from sparkpriv.privacy.random import stream

    rows = []
    with threadpool_limits(1):
        rng = np.random.default_rng(0)
        for name, model in (("rbm", RBM(items, rbm_hidden)), ("vae", VAE(vae_cols, vae_hidden, 2))):
            theta = model.init(rng)
            state = model.init_state(rng)
            noise = dpsgd.step_noise(clip=1.0, noise_multiplier=1.0, dim=model.dim, max_abs=1e7)
            for B in batches:
                if name == "rbm":
                    X = (rng.random((B, items)) < 11.0 / items).astype(np.float64)
                else:
                    X = rng.random((B, vae_cols))
                nrng, mrng = stream(1, 1), stream(1, 2)

                def plain():
                    s, _ = model.clipped_sum(X, theta, None, mrng)
                    t, _ = model.model_term(theta, state, mrng, None)
                    return s / B + t

                def private():
                    s, _ = model.clipped_sum(X, theta, 1.0, mrng)
                    t, _ = model.model_term(theta, state, mrng, 1.0)
                    return dpsgd.noisy_sum(s, noise, nrng) / B + t

                tp = _median_time(plain, repeats)
                td = _median_time(private, repeats)
                tn = _median_time(lambda: dpsgd.noisy_sum(np.zeros(model.dim), noise, nrng), repeats)
                rows.append({"model": name, "params": model.dim, "batch": B,
                             "plain_examples_per_s": B / tp, "dp_examples_per_s": B / td,
                             "overhead": td / tp, "noise_ms": 1e3 * tn})
    print("| model | parameters | batch | non-private ex/s | DP-SGD ex/s | overhead | noise ms/step |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['params']} | {r['batch']} | {r['plain_examples_per_s']:.0f} | "
              f"{r['dp_examples_per_s']:.0f} | {r['overhead']:.2f}x | {r['noise_ms']:.1f} |")
    out = {"rows": rows}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    from sparkpriv.bench import module_main

    raise SystemExit(module_main("dpgm"))
