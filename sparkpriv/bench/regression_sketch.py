"""The sketch's utility study (docs/research/regression-sketch.md): ``sparkpriv bench regression
--sketch-study``.

Relative objective error and test error against n and epsilon, for the sketch (m by the 'log',
'linear', 'full' rules), the additive baseline, AdaSSP as a numpy-float baseline
(:mod:`sparkpriv.bench.adassp`, the study that led to ``method="ssp"``), diffprivlib's
LinearRegression and the non-private fit, at the same (epsilon, delta), on the paper's uniform data
and MNIST 4 vs 9 (300 highest-energy pixels, 80/20 split, read from ``../shared/datasets/mnist``).
Prints Markdown tables. Superseded for users by ``--utility`` (:mod:`sparkpriv.bench.regression_utility`).
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import sys
import time
import types
import warnings

import numpy as np

__all__ = ["sketch_study", "read_idx", "load_mnist_49", "uniform_data", "tables_from"]

MNIST_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "..",
                         "shared", "datasets", "mnist")


# ----------------------------------------------------------------------------- utility


def read_idx(path: str) -> np.ndarray:
    """An MNIST idx file (gzip) as a uint8 array of its declared shape."""
    with gzip.open(path) as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_mnist_49(seed: int = 0):
    """MNIST training digits 4 and 9 (11,791 images), the 300 pixels of most energy, labels +-1;
    an 80/20 split. The pixel choice looks at the data (as the paper does): not private."""
    X = read_idx(os.path.join(MNIST_DIR, "train-images.idx3-ubyte.gz")).reshape(-1, 784) / 255.0
    y = read_idx(os.path.join(MNIST_DIR, "train-labels.idx1-ubyte.gz"))
    keep = (y == 4) | (y == 9)
    X, y = X[keep], np.where(y[keep] == 4, 1.0, -1.0)
    pix = np.argsort(-(X * X).sum(axis=0))[:300]
    X = X[:, pix]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    cut = int(0.8 * len(y))
    return X[order[:cut]], y[order[:cut]], X[order[cut:]], y[order[cut:]]


def uniform_data(n: int, d: int, rng: np.random.Generator, x0: np.ndarray | None = None):
    """Features i.i.d. U(-1, 1) / sqrt(d) (so ||a|| <= 1), target ``a . x0 + 0.1 N(0, 1)``, ``||x0|| = 1``
    (``x0`` drawn from ``rng`` unless given); returns ``(A, b, x0)``."""
    A = rng.uniform(-1, 1, (n, d)) / math.sqrt(d)
    if x0 is None:
        x0 = rng.standard_normal(d)
        x0 /= np.linalg.norm(x0)
    b = A @ x0 + 0.1 * rng.standard_normal(n)
    return A, b, x0


def _diffprivlib_lr():
    warnings.filterwarnings("ignore")
    stub = types.ModuleType("diffprivlib.models.forest")  # sklearn >= 1.9 lacks what its forests import
    stub.RandomForestClassifier = stub.DecisionTreeClassifier = None
    sys.modules.setdefault("diffprivlib.models.forest", stub)
    from diffprivlib.models import LinearRegression

    return LinearRegression


def _methods(A, b, *, eps, delta, B, rng, sketch_cap, lo, hi):
    """Coefficients of every method on (A, b) (rows already within the bound B)."""
    from sparkpriv.bench.adassp import adassp
    from sparkpriv.mechanisms.regression import RegressionParams, release_regression_array, sketch_rows_for

    n, d = A.shape
    out = {"non-private": np.linalg.lstsq(A, b, rcond=None)[0]}
    for rule in ("log", "linear", "full"):
        m = sketch_rows_for(rule, n, d + 1)
        if m * n > sketch_cap:
            continue
        rel = release_regression_array(A, b, RegressionParams(method="sketch", row_bound=B, epsilon=eps, delta=delta,
                                                              sketch_rule=rule))
        out[f"sketch {rule} (m={m})"] = rel.fit.coef
        if rule == "log":  # the paper's estimator: no debiasing (the noise acts as a ridge m s^2)
            out[f"sketch log, not debiased (m={m})"] = release_regression_array(A, b, RegressionParams(
                method="sketch", row_bound=B, epsilon=eps, delta=delta, sketch_rule=rule, debias=False)).fit.coef
    rel = release_regression_array(A, b, RegressionParams(method="sketch", row_bound=B, epsilon=eps, delta=delta, scheme="additive"))
    out["additive"] = rel.fit.coef
    out["additive, not debiased"] = release_regression_array(A, b, RegressionParams(
        method="sketch", row_bound=B, epsilon=eps, delta=delta, scheme="additive", debias=False)).fit.coef
    out["AdaSSP"] = adassp(A, b, epsilon=eps, delta=delta, bound_x=B, bound_y=B, rng=rng)
    LR = _diffprivlib_lr()
    lr = LR(epsilon=eps, bounds_X=(lo, hi), bounds_y=(-B, B), fit_intercept=False,
            random_state=int(rng.integers(2**31)))
    out["diffprivlib (pure eps)"] = lr.fit(A, b).coef_.ravel()
    return out


def _rel_obj(A, b, x, f_star):
    return (float(np.sum((A @ x - b) ** 2)) - f_star) / f_star


def sketch_study(*, trials: int = 5, json_path: str | None = None, delta: float = 1e-6,
            uniform_ns=(1_000, 10_000, 100_000), uniform_eps=(0.5, 1.0, 2.0, 4.0, 8.0), uniform_n_fixed=10_000,
            mnist: bool = True,
            mnist_ns=(1_000, 3_000, None), mnist_eps=(1.0, 4.0), mnist_eps_fixed=1.0,
            sketch_cap: float = 4e8) -> dict:
    """Both studies of the sketch; returns (and optionally writes) every record, prints Markdown tables."""
    logging.getLogger("sparkpriv").setLevel(logging.CRITICAL)
    records = _Records(json_path)
    d = 10
    B = math.sqrt(2.0)  # ||a|| <= 1 and |b| <= about 1 for the uniform data
    lo, hi = -1 / math.sqrt(d), 1 / math.sqrt(d)
    from sparkpriv.mechanisms.regression import clip_regression_rows

    grid = [(n, 1.0) for n in uniform_ns] + [(uniform_n_fixed, e) for e in uniform_eps if e != 1.0]
    for n, eps in grid:
        for t in range(trials):
            rng = np.random.default_rng(1000 * t + n)
            A, b, x0 = uniform_data(n, d, rng)
            M, _ = clip_regression_rows(A, b, B)
            A, b = M[:, :-1], M[:, -1]
            At, bt, _ = uniform_data(max(n // 4, 1000), d, np.random.default_rng(10**6 + t), x0)
            x_star = np.linalg.lstsq(A, b, rcond=None)[0]
            f_star = float(np.sum((A @ x_star - b) ** 2))
            t0 = time.perf_counter()
            for name, x in _methods(A, b, eps=eps, delta=delta, B=B, rng=rng, sketch_cap=sketch_cap,
                                    lo=lo, hi=hi).items():
                records.append({"data": "uniform", "n": n, "epsilon": eps, "trial": t, "method": name,
                                "rel_obj": _rel_obj(A, b, x, f_star),
                                "test_mse": float(np.mean((At @ x - bt) ** 2))})
            print(f"uniform n={n} eps={eps} trial={t}: {time.perf_counter() - t0:.1f} s", flush=True)
    if mnist and os.path.isdir(MNIST_DIR):
        Xtr, ytr, Xte, yte = load_mnist_49()
        Bm = 10.0
        for n, eps in [(n, mnist_eps_fixed) for n in mnist_ns] + [(None, e) for e in mnist_eps if e != mnist_eps_fixed]:
            for t in range(trials):
                rng = np.random.default_rng(77 + t)
                idx = rng.permutation(len(ytr))[: (n or len(ytr))]
                M, counts = clip_regression_rows(Xtr[idx], ytr[idx], Bm)
                A, b = M[:, :-1], M[:, -1]
                x_star = np.linalg.lstsq(A, b, rcond=None)[0]
                f_star = float(np.sum((A @ x_star - b) ** 2))
                t0 = time.perf_counter()
                for name, x in _methods(A, b, eps=eps, delta=delta, B=Bm, rng=rng, sketch_cap=sketch_cap,
                                        lo=0.0, hi=1.0).items():
                    records.append({"data": "mnist49", "n": len(idx), "epsilon": eps, "trial": t,
                                    "method": name, "rel_obj": _rel_obj(A, b, x, f_star),
                                    "test_error": float(np.mean(np.sign(Xte @ x) != yte)),
                                    "rows_clipped": int(counts.norm_clipped)})
                print(f"mnist n={len(idx)} eps={eps} trial={t}: {time.perf_counter() - t0:.1f} s", flush=True)
    _print_tables(records)
    return {"records": list(records)}


class _Records(list):
    """The records, each also appended to a JSON-lines file as it is made (a long run can be read
    before it ends: ``--json PATH``, then ``tables_from(PATH)``)."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def append(self, r):
        super().append(r)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(r) + "\n")


def tables_from(path: str) -> None:
    """Print the Markdown tables of a JSON-lines file written by :func:`utility`."""
    with open(path) as f:
        _print_tables([json.loads(line) for line in f if line.strip()])


def _print_tables(records):
    import collections

    groups = collections.defaultdict(list)
    for r in records:
        groups[(r["data"], r["n"], r["epsilon"], r["method"])].append(r)
    for data, metric in (("uniform", "rel_obj"), ("uniform", "test_mse"), ("mnist49", "rel_obj"),
                         ("mnist49", "test_error")):
        keys = sorted({(k[1], k[2]) for k in groups if k[0] == data})
        methods = sorted({k[3] for k in groups if k[0] == data}, key=_method_order)
        if not keys:
            continue
        print(f"\n{data}: {metric} (median over trials)\n")
        print("| method | " + " | ".join(f"n={n}, eps={e:g}" for n, e in keys) + " |")
        print("|---|" + "---|" * len(keys))
        for m in methods:
            cells = []
            for n, e in keys:
                g = groups.get((data, n, e, m))
                cells.append(f"{np.median([r[metric] for r in g]):.3g}" if g else "-")
            print(f"| {m} | " + " | ".join(cells) + " |")
    sys.stdout.flush()


def _method_order(name: str):
    order = ["non-private", "sketch log", "sketch linear", "sketch full", "additive", "AdaSSP", "diffprivlib"]
    for i, o in enumerate(order):
        if name.startswith(o):
            return (i, name)
    return (len(order), name)
