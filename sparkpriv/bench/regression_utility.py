"""Utility of private regression on real tables: ``sparkpriv bench regression --utility``.

Tasks (tables of ``../shared/datasets``, read in place; a fixed 80/20 split, seed 0, except MNIST's
own test set):

* linear (test RMSE): ``ilpd-albumin`` (albumin from 7 other liver tests, 583 patients) and
  ``dermatology-age`` (age from 33 clinical and histopathological grades, 358 patients with an age);
* logistic (test error): ``wdbc`` (malignant, 30 features, 569), ``ilpd`` (liver patient, 10 features,
  579 with every value), ``coimbra`` (patient, 9 features, 116);
* MNIST one-vs-rest, digit ``k`` against the rest, 60,000 training images: the 28 x 28 pixels averaged
  over 2 x 2 blocks (196 features in [0, 1], a public transform), linear (least squares on +-1,
  classified by its sign) and logistic, test error on the 10,000 test images.

Methods, at the same epsilon (and delta = 1e-6 where a method has one), each on the same split:
sparkpriv's ``method="ssp"`` (AdaSSP, linear or logistic: the default 5 noisy gradient passes, and the
one-pass approximation, ``logistic_steps=0``) and ``method="sketch"`` (linear only; the log rule's ``m``), diffprivlib's ``LinearRegression`` and ``LogisticRegression`` (pure epsilon-DP: delta 0,
a stronger guarantee), DP-SGD on logistic regression with sparkpriv's DP-SGD code
(:mod:`sparkpriv.mechanisms.dpsgd`, replace-one PLD accounting; 5 epochs, expected batch 512, clip 1,
Adam at 0.05: fixed, not tuned on the test set), and the non-private model (scikit-learn's
``LinearRegression`` / ``LogisticRegression``).

Bounds: every method gets the same public bounds. For the UCI tables they are each column's minimum
and maximum over the whole table rounded outward to two significant digits: they LOOK AT THE DATA,
a benchmark convenience (a release must declare its own); the features are then mapped to
``[-1, 1]`` by that box (the same map for every method), the target keeps its units. MNIST: the
pixel box ``[0, 1]`` and, for sparkpriv and diffprivlib's logistic regression, a row bound of 4 on the
pooled image (clips 0.6 % of the training images). The sketch gets the box-centred features, a
constant 1 and the centred target (it fits no intercept), bounded in L2 by the box's corner.

Each cell is the median over ``--trials`` releases (fresh noise; fixed test seeds: measurements, not
private releases). Prints every trial as it is measured, then Markdown tables of the medians, and one
JSON object as the last line.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import sys
import time
import types
import warnings

import numpy as np

__all__ = ["utility", "TASKS", "load_task"]

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "..",
                    "shared", "datasets")
DELTA = 1e-6
EPSILONS = (0.5, 1.0, 2.0, 4.0)
TASKS = ("ilpd-albumin", "dermatology-age", "wdbc", "ilpd", "coimbra", "mnist-0", "mnist-3", "mnist-8")
_log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- data


def _round_out(v: np.ndarray, up: bool) -> np.ndarray:
    """Each value rounded outward to two significant digits (down for minima, up for maxima)."""
    out = []
    for x in np.asarray(v, float):
        if x == 0:
            out.append(0.0)
            continue
        e = 10.0 ** (math.floor(math.log10(abs(x))) - 1)
        out.append((math.ceil(x / e) if up else math.floor(x / e)) * e)
    return np.asarray(out)


def _split(X, y, seed=0, train=0.8):
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(train * len(y))
    return X[order[:cut]], y[order[:cut]], X[order[cut:]], y[order[cut:]]


def _csv(path, skip_bom=False):
    with open(path, newline="", encoding="utf-8-sig" if skip_bom else "utf-8") as f:
        return list(csv.reader(f))


def load_task(name: str) -> dict:
    """``{"kind", "Xtr", "ytr", "Xte", "yte", "lower", "upper", "t_lo", "t_hi", "row_bound", "n"}``."""
    if name.startswith("mnist-"):
        from sparkpriv.bench.regression_sketch import read_idx

        k = int(name.split("-")[1])
        d = os.path.join(DATA, "mnist")

        def pooled(f):
            X = read_idx(os.path.join(d, f)).reshape(-1, 28, 28) / 255.0
            return X.reshape(-1, 14, 2, 14, 2).mean(axis=(2, 4)).reshape(-1, 196)

        ytr = read_idx(os.path.join(d, "train-labels.idx1-ubyte.gz"))
        yte = read_idx(os.path.join(d, "t10k-labels.idx1-ubyte.gz"))
        return {"kind": "classification", "Xtr": pooled("train-images.idx3-ubyte.gz"), "ytr": (ytr == k) * 1.0,
                "Xte": pooled("t10k-images.idx3-ubyte.gz"), "yte": (yte == k) * 1.0, "lower": 0.0, "upper": 1.0,
                "row_bound": 4.0, "box_map": False}
    if name in ("ilpd", "ilpd-albumin"):
        rows = _csv(os.path.join(DATA, "ilpd", "ilpd.csv"))[1:]
        rows = [r for r in rows if all(v != "" for v in r)]
        num = lambda r, cols: [float(r[i]) for i in cols]  # noqa: E731
        if name == "ilpd":
            X = np.array([num(r, [0, 2, 3, 4, 5, 6, 7, 8, 9]) + [1.0 if r[1] == "Female" else 0.0] for r in rows])
            y = np.array([1.0 if r[10] == "1" else 0.0 for r in rows])
            kind = "classification"
        else:
            X = np.array([num(r, [0, 2, 3, 4, 5, 6, 7]) for r in rows])
            y = np.array([float(r[8]) for r in rows])
            kind = "regression"
    elif name == "dermatology-age":
        rows = [r for r in _csv(os.path.join(DATA, "dermatology", "dermatology.data"))[1:] if r[33] != "?"]
        X = np.array([[float(v) for v in r[:33]] for r in rows])
        y = np.array([float(r[33]) for r in rows])
        kind = "regression"
    elif name == "wdbc":
        rows = _csv(os.path.join(DATA, "wisconsin_breast_cancer", "wdbc.data"))
        X = np.array([[float(v) for v in r[2:]] for r in rows])
        y = np.array([1.0 if r[1] == "M" else 0.0 for r in rows])
        kind = "classification"
    elif name == "coimbra":
        rows = _csv(os.path.join(DATA, "coimbra_breast_cancer", "dataR2.csv"), skip_bom=True)[1:]
        X = np.array([[float(v) for v in r[:9]] for r in rows])
        y = np.array([1.0 if r[9] == "2" else 0.0 for r in rows])
        kind = "classification"
    else:
        raise ValueError(f"unknown task {name!r}; tasks: {', '.join(TASKS)}")
    lo, hi = _round_out(X.min(axis=0), False), _round_out(X.max(axis=0), True)
    hi = np.where(hi > lo, hi, lo + 1.0)
    c, w = 0.5 * (lo + hi), 0.5 * (hi - lo)
    X = (X - c) / w  # the box mapped to [-1, 1] (the same public map for every method)
    Xtr, ytr, Xte, yte = _split(X, y)
    out = {"kind": kind, "Xtr": Xtr, "ytr": ytr, "Xte": Xte, "yte": yte, "lower": -1.0, "upper": 1.0,
           "row_bound": None, "box_map": True}
    if kind == "regression":
        out["t_lo"], out["t_hi"] = float(_round_out([y.min()], False)[0]), float(_round_out([y.max()], True)[0])
    return out


# ----------------------------------------------------------------------------- methods


def _diffprivlib():
    """diffprivlib's LinearRegression and LogisticRegression under the installed scikit-learn.

    diffprivlib 0.6 imports tree internals that scikit-learn >= 1.9 no longer has (its forests are
    stubbed out: not used here) and passes ``multi_class`` to scikit-learn's LogisticRegression, which
    1.8 removed; the subclass below calls scikit-learn's constructor without it (``multi_class='ovr'``
    was diffprivlib's only choice, and a binary task has one class to fit either way). The mechanism
    (diffprivlib's ``fit``: objective perturbation of the logistic loss, Chaudhuri et al. 2011) is
    untouched."""
    warnings.filterwarnings("ignore")
    stub = types.ModuleType("diffprivlib.models.forest")
    stub.RandomForestClassifier = stub.DecisionTreeClassifier = None
    sys.modules.setdefault("diffprivlib.models.forest", stub)
    from diffprivlib.accountant import BudgetAccountant
    from diffprivlib.models import LinearRegression, LogisticRegression
    from sklearn.linear_model import LogisticRegression as SkLogisticRegression

    class DiffprivlibLogisticRegression(LogisticRegression):
        def __init__(self, *, epsilon=1.0, data_norm=None, tol=1e-4, C=1.0, fit_intercept=True, max_iter=100,
                     verbose=0, warm_start=False, n_jobs=None, random_state=None, accountant=None):
            SkLogisticRegression.__init__(self, penalty="l2", dual=False, tol=tol, C=C, fit_intercept=fit_intercept,
                                          intercept_scaling=1.0, class_weight=None, random_state=random_state,
                                          solver="lbfgs", max_iter=max_iter, verbose=verbose,
                                          warm_start=warm_start, n_jobs=n_jobs)
            self.epsilon = epsilon
            self.data_norm = data_norm
            self.classes_ = None
            self.accountant = BudgetAccountant.load_default(accountant)

    return LinearRegression, DiffprivlibLogisticRegression


def _ours(task, eps, seed, model, steps=None):
    from sparkpriv.estimators import DPLinearRegression, DPLogisticRegression
    from sparkpriv.privacy.random import insecure_fixed_seed

    bounds = dict(lower=task["lower"], upper=task["upper"], row_bound=task["row_bound"])
    with insecure_fixed_seed(seed):
        if model == "logistic":
            est = DPLogisticRegression(epsilon=eps, delta=DELTA, logistic_steps=steps,
                                       **bounds).fit(task["Xtr"], task["ytr"])
            return est.decision_function
        y = task["ytr"] if task["kind"] == "regression" else 2.0 * task["ytr"] - 1.0
        t_lo, t_hi = (task["t_lo"], task["t_hi"]) if task["kind"] == "regression" else (-1.0, 1.0)
        est = DPLinearRegression(epsilon=eps, delta=DELTA, target_lower=t_lo, target_upper=t_hi,
                                 **bounds).fit(task["Xtr"], y)
        return est.predict


def _sketch(task, eps, seed):
    """The sketch on the box-centred features, a constant 1 and the centred target."""
    from sparkpriv.api import release_regression
    from sparkpriv.privacy.random import insecure_fixed_seed

    lo, hi = float(task["lower"]), float(task["upper"])
    c = 0.5 * (lo + hi)
    reg = task["kind"] == "regression"
    y = task["ytr"] if reg else 2.0 * task["ytr"] - 1.0
    t_lo, t_hi = (task["t_lo"], task["t_hi"]) if reg else (-1.0, 1.0)
    cy = 0.5 * (t_lo + t_hi)
    Xtr = task["Xtr"]
    d = Xtr.shape[1]
    M = np.column_stack([Xtr - c, np.ones(len(Xtr)), np.clip(y, t_lo, t_hi) - cy])
    R = math.sqrt(d * (0.5 * (hi - lo)) ** 2 + 1.0 + (0.5 * (t_hi - t_lo)) ** 2)
    if task["row_bound"] is not None:
        R = math.sqrt(task["row_bound"] ** 2 + d * c * c + 1.0 + (0.5 * (t_hi - t_lo)) ** 2)
    cols = [f"x{j}" for j in range(d + 1)] + ["y"]
    with insecure_fixed_seed(seed):
        rel = release_regression(M, columns=cols[:-1], target="y", method="sketch", row_bound=R, epsilon=eps,
                                 delta=DELTA)
    coef = rel.model.coef
    return lambda X: (np.asarray(X) - c) @ coef[:d] + coef[d] + cy


def _dpl_linear(task, eps, seed):
    LR, _ = _diffprivlib()
    reg = task["kind"] == "regression"
    y = task["ytr"] if reg else 2.0 * task["ytr"] - 1.0
    t_lo, t_hi = (task["t_lo"], task["t_hi"]) if reg else (-1.0, 1.0)
    d = task["Xtr"].shape[1]
    m = LR(epsilon=eps, bounds_X=(np.full(d, task["lower"]), np.full(d, task["upper"])), bounds_y=(t_lo, t_hi),
           random_state=seed).fit(task["Xtr"], np.clip(y, t_lo, t_hi))
    return m.predict


def _dpl_logistic(task, eps, seed):
    _, LogR = _diffprivlib()
    d = task["Xtr"].shape[1]
    norm = task["row_bound"] or math.sqrt(d) * max(abs(task["lower"]), abs(task["upper"]))
    m = LogR(epsilon=eps, data_norm=norm, random_state=seed, max_iter=300).fit(task["Xtr"], task["ytr"])
    return m.decision_function


class _Logistic:
    """Logistic regression as a model of sparkpriv's DP-SGD (rows ``[x, 1, s]``, ``s = +-1``): the
    per-example gradient ``-s sigmoid(-s x~ . theta) x~``, clipped by its norm."""

    def init_state(self, rng, theta):
        return None

    def model_term(self, theta, state, rng, clip):
        return 0.0, state

    def clipped_sum(self, Xb, theta, clip, rng):
        from sparkpriv.mechanisms.dpsgd import clip_factors

        Z, s = Xb[:, :-1], Xb[:, -1]
        g = -(s / (1.0 + np.exp(np.clip(s * (Z @ theta), -500, 500))))
        sq = g * g * np.einsum("ij,ij->i", Z, Z)
        f = clip_factors(sq, clip)
        return Z.T @ (g * f), sq


def _dpsgd(task, eps, seed, epochs=5, batch=512, clip=1.0, lr=0.05):
    from sparkpriv.mechanisms.dpsgd import step_noise, train
    from sparkpriv.mechanisms.dpsgd_accounting import calibrate_noise_multiplier
    from sparkpriv.privacy.bounds import Bounds, clip_rows

    X = task["Xtr"]
    n, d = X.shape
    if task["row_bound"] is not None:
        X, _ = clip_rows(X, Bounds(d, row_bound=task["row_bound"]))
    q = min(1.0, batch / n)
    steps = max(1, int(round(epochs / q)))
    sigma = calibrate_noise_multiplier(epsilon=eps, delta=DELTA, sampling_rate=q, steps=steps)
    noise = step_noise(clip=clip, noise_multiplier=sigma, dim=d + 1, max_abs=n * clip + 1.0)
    rows = np.column_stack([X, np.ones(n), 2.0 * task["ytr"] - 1.0])
    theta = train(_Logistic(), rows, np.zeros(d + 1), clip=clip, sampling_rate=q, steps=steps, noise=noise,
                  n_pub=n, seed=seed, lr=lr)
    return lambda Xt: np.column_stack([Xt, np.ones(len(Xt))]) @ theta


def _non_private(task, model):
    from sklearn.linear_model import LinearRegression, LogisticRegression

    if model == "logistic":
        return LogisticRegression(max_iter=2000).fit(task["Xtr"], task["ytr"]).decision_function
    y = task["ytr"] if task["kind"] == "regression" else 2.0 * task["ytr"] - 1.0
    return LinearRegression().fit(task["Xtr"], y).predict


def _score(task, predict, threshold):
    f = predict(task["Xte"])
    if task["kind"] == "regression":
        return float(np.sqrt(np.mean((f - task["yte"]) ** 2)))
    return float(np.mean((f > threshold) != (task["yte"] > 0.5)))


def _methods(task):
    """(label, model, fn(task, eps, seed) -> predict, decision threshold); None: non-private."""
    cls = task["kind"] == "classification"
    out = [("sparkpriv ssp (linear)", "linear", lambda t, e, s: _ours(t, e, s, "linear"), 0.0),
           ("sparkpriv sketch (linear)", "linear", _sketch, 0.0),
           ("diffprivlib LinearRegression", "linear", _dpl_linear, 0.0)]
    if cls:
        out += [("sparkpriv ssp (logistic)", "logistic", lambda t, e, s: _ours(t, e, s, "logistic"), 0.0),
                ("sparkpriv ssp (logistic, one pass)", "logistic", lambda t, e, s: _ours(t, e, s, "logistic", 0), 0.0),
                ("diffprivlib LogisticRegression", "logistic", _dpl_logistic, 0.0),
                ("DP-SGD logistic (sparkpriv dpsgd)", "logistic", _dpsgd, 0.0)]
    return out


# ----------------------------------------------------------------------------- the study


def utility(*, tasks=TASKS, epsilons=EPSILONS, trials: int = 5, mnist_trials: int = 3,
            json_path: str | None = None) -> dict:
    """Every (task, epsilon, method, trial); prints Markdown tables; returns the records."""
    logging.getLogger("sparkpriv").setLevel(logging.ERROR)
    records = []
    for name in tasks:
        if name.startswith("mnist") and not os.path.isdir(os.path.join(DATA, "mnist")):
            print(f"skipping {name}: {os.path.join(DATA, 'mnist')} is absent")
            continue
        task = load_task(name)
        n = len(task["ytr"])
        for model in ("linear", "logistic") if task["kind"] == "classification" else ("linear",):
            t0 = time.perf_counter()
            records.append(_record(name, n, None, "non-private " + model, 0, _score(task, _non_private(task, model),
                                                                                      0.0), t0))
        T = mnist_trials if name.startswith("mnist") else trials
        for eps in epsilons:
            for label, _, fn, thr in _methods(task):
                for t in range(T):
                    t0 = time.perf_counter()
                    try:
                        s = _score(task, fn(task, eps, 1000 * t + 7), thr)
                    except Exception as exc:  # a peer that fails on a task is reported, not fatal
                        _log.warning("%s on %s at eps %g failed: %s", label, name, eps, exc)
                        s = float("nan")
                    records.append(_record(name, n, eps, label, t, s, t0))
                    print(f"{name} eps={eps:g} {label} trial {t}: {s:.4g} ({records[-1]['seconds']:.1f} s)",
                          flush=True)
        if json_path:
            with open(json_path, "w") as f:
                json.dump(records, f)
    _print_tables(records)
    print(json.dumps({"records": len(records), "delta": DELTA, "epsilons": list(epsilons)}))
    return {"records": records}


def _record(task, n, eps, method, trial, score, t0):
    return {"task": task, "n": n, "epsilon": eps, "method": method, "trial": trial, "score": score,
            "seconds": round(time.perf_counter() - t0, 3)}


def _print_tables(records) -> None:
    import collections

    groups = collections.defaultdict(list)
    for r in records:
        groups[(r["task"], r["method"], r["epsilon"])].append(r["score"])
    for task in dict.fromkeys(r["task"] for r in records):
        rs = [r for r in records if r["task"] == task]
        metric = "test RMSE" if task in ("ilpd-albumin", "dermatology-age") else "test error"
        eps = sorted({r["epsilon"] for r in rs if r["epsilon"] is not None})
        print(f"\n{task} (n = {rs[0]['n']} training rows): {metric}, median over trials\n")
        print("| method | " + " | ".join(f"eps {e:g}" for e in eps) + " |")
        print("|---|" + "---|" * len(eps))
        for m in dict.fromkeys(r["method"] for r in rs):
            if m.startswith("non-private"):
                v = groups[(task, m, None)]
                print(f"| {m} | " + " | ".join(f"{np.median(v):.4g}" for _ in eps) + " |")
            else:
                print(f"| {m} | " + " | ".join(
                    f"{np.nanmedian(groups[(task, m, e)]):.4g}" if groups[(task, m, e)] else "-" for e in eps) + " |")
    sys.stdout.flush()
