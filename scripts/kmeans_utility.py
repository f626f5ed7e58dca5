"""Utility of DP k-means: clustering accuracy (ACC, Hungarian matching) on MNIST and blobs.

Compares, at each epsilon (delta = 1e-5), averaged over ``--repeats`` runs:

* sparkpriv ``kernel`` (random Fourier features) and ``linear`` (DPLloyd), with
  data-independent initial centres (uniform points of the declared box), run
  through the numpy core (:func:`sparkpriv.release_kmeans_array`,
  the same per-batch code the Spark path runs);
* diffprivlib's ``KMeans`` at the same epsilon (pure epsilon-DP, bounds [0, 1]);
* non-private scikit-learn ``KMeans`` (k-means++, n_init=1), once per repeat.

MNIST: ../shared/datasets/mnist (60,000 x 784 training images, pixels / 255).
Prints a Markdown table (mean +- std of ACC) and writes JSON with every run.

    python scripts/kmeans_utility.py --repeats 3 --json /tmp/kmeans_utility.json

diffprivlib 0.6.6 imports sklearn.tree internals removed in scikit-learn 1.9
(for its forests); this script stubs that unrelated module before importing
its KMeans.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
import warnings

import numpy as np

from sparkpriv.bench.regression import read_idx  # the MNIST idx reader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MNIST = os.path.join(ROOT, "..", "shared", "datasets", "mnist")
EPSILONS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
DELTA = 1e-5


def load_mnist():
    if not os.path.isdir(MNIST):
        sys.exit(f"MNIST not found at {MNIST} (../shared/datasets/mnist)")
    X = read_idx(os.path.join(MNIST, "train-images.idx3-ubyte.gz")).reshape(-1, 784) / 255.0
    y = read_idx(os.path.join(MNIST, "train-labels.idx1-ubyte.gz")).astype(int)
    return X, y


def load_blobs(seed=0):
    from sklearn.datasets import make_blobs

    X, y = make_blobs(n_samples=20000, n_features=16, centers=5, cluster_std=2.0,
                      center_box=(-8, 8), random_state=seed)
    return X, y


def diffprivlib_kmeans():
    warnings.filterwarnings("ignore")
    stub = types.ModuleType("diffprivlib.models.forest")
    stub.RandomForestClassifier = stub.DecisionTreeClassifier = None
    sys.modules.setdefault("diffprivlib.models.forest", stub)
    from diffprivlib.models import KMeans

    return KMeans


# dataset -> (settings of the sparkpriv runs, diffprivlib bounds)
SETTINGS = {
    "mnist": dict(k=10, iterations=8, lower=0.0, upper=1.0, row_bound=12.0, kernel_width=8.0,
                  frequencies=64),
    "blobs": dict(k=5, iterations=8, lower=-16.0, upper=16.0, row_bound=None, kernel_width=6.0,
                  frequencies=64),
}


def run(dataset: str, epsilons, repeats: int, methods, first_repeat: int = 0) -> list[dict]:
    from sklearn.cluster import KMeans as SkKMeans

    from sparkpriv import release_kmeans_array
    from sparkpriv.mechanisms.kmeans import clustering_accuracy

    X, y = load_mnist() if dataset == "mnist" else load_blobs()
    s = SETTINGS[dataset]
    n, d = X.shape
    lo, hi = np.full(d, s["lower"]), np.full(d, s["upper"])
    records = []

    def rec(method, eps, rep, acc, secs, **extra):
        records.append({"dataset": dataset, "method": method, "epsilon": eps, "repeat": rep,
                        "acc": acc, "seconds": round(secs, 2), **extra})
        more = "".join(f", {k} {v}" for k, v in extra.items())
        print(f"{dataset} {method:<12} eps={eps} rep={rep}: ACC {acc:.3f} ({secs:.1f} s{more})", flush=True)

    if "sklearn" in methods:
        for rep in range(first_repeat, first_repeat + repeats):
            t = time.perf_counter()
            m = SkKMeans(n_clusters=s["k"], n_init=1, random_state=rep).fit(X)
            rec("sklearn", None, rep, clustering_accuracy(y, m.labels_), time.perf_counter() - t)
    DPKMeans = diffprivlib_kmeans() if "diffprivlib" in methods else None
    for eps in epsilons:
        for rep in range(first_repeat, first_repeat + repeats):
            for variant in ("kernel", "linear"):
                if variant not in methods:
                    continue
                t = time.perf_counter()
                r = release_kmeans_array(
                    X, k=s["k"], epsilon=eps, delta=DELTA, iterations=s["iterations"], variant=variant,
                    lower=lo, upper=hi, row_bound=s["row_bound"], kernel_width=s["kernel_width"],
                    frequencies=s["frequencies"])
                m = r.model
                # predict leaves out the unreliable clusters (noisy size < 3 noise stds)
                rec(variant, eps, rep, clustering_accuracy(y, m.predict(X)), time.perf_counter() - t,
                    unreliable=len(m.unreliable),
                    raw_negative_sizes=int(np.sum(np.asarray(r.history[-1]) < 0)))
            if DPKMeans is not None:
                t = time.perf_counter()
                m = DPKMeans(n_clusters=s["k"], epsilon=eps, bounds=(lo, hi), random_state=rep).fit(X)
                rec("diffprivlib", eps, rep, clustering_accuracy(y, m.predict(X)), time.perf_counter() - t)
    return records


def table(records, dataset) -> str:
    rows = [r for r in records if r["dataset"] == dataset]
    eps = sorted({r["epsilon"] for r in rows if r["epsilon"] is not None})
    methods = [m for m in ("kernel", "linear", "diffprivlib") if any(r["method"] == m for r in rows)]
    out = ["| epsilon | " + " | ".join(f"sparkpriv {m}" if m != "diffprivlib" else m for m in methods) + " |",
           "|---|" + "---|" * len(methods)]
    for e in eps:
        cells = []
        for m in methods:
            a = np.array([r["acc"] for r in rows if r["method"] == m and r["epsilon"] == e])
            cells.append(f"{a.mean():.3f} +- {a.std():.3f} (n={a.size})")
        out.append(f"| {e:g} | " + " | ".join(cells) + " |")
    flagged = []
    for e in eps:
        parts = [f"{m} {np.mean([r['unreliable'] for r in rows if r['method'] == m and r['epsilon'] == e]):.1f}"
                 for m in ("kernel", "linear")
                 if any(r["method"] == m and r["epsilon"] == e and "unreliable" in r for r in rows)]
        if parts:
            flagged.append(f"{e:g}: " + ", ".join(parts))
    if flagged:
        out.append("\nmean number of unreliable clusters per run, by epsilon: " + "; ".join(flagged))
    sk = np.array([r["acc"] for r in rows if r["method"] == "sklearn"])
    if sk.size:
        out.append(f"\nnon-private scikit-learn KMeans: {sk.mean():.3f} +- {sk.std():.3f} (n={sk.size})")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="blobs,mnist")
    p.add_argument("--epsilons", default=",".join(str(e) for e in EPSILONS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--first-repeat", type=int, default=0,
                   help="index of the first repeat (diffprivlib/scikit-learn random_state)")
    p.add_argument("--methods", default="sklearn,kernel,linear,diffprivlib")
    p.add_argument("--json", default=None, help="write every run to this JSON file")
    a = p.parse_args(argv)
    eps = [float(e) for e in a.epsilons.split(",")]
    methods = set(a.methods.split(","))
    records = []
    for ds in a.datasets.split(","):
        records += run(ds, eps, a.repeats, methods, a.first_repeat)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(records, f, indent=1)
    for ds in a.datasets.split(","):
        print(f"\n### {ds} (delta = {DELTA}, mean +- std over repeats)\n")
        print(table(records, ds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
