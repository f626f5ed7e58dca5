"""Utility of the DPRP release, measured honestly (results in docs/dprp.md, section "Utility", and docs/research/dprp-utility.md).

Train on the release, test on real data: for each run, a stratified 80/20
split; the 80 % is released with :func:`sparkpriv.api.release_dprp_array` on the
local engine (the same mechanism and per-block numpy functions the Spark engine runs
per Arrow batch: prepare_rows, gram_partial, reconstruct_rows, decode_rows, and the
same driver solve; :func:`sparkpriv.api.table_arrays` gives the rows back); a
scikit-learn RandomForestClassifier with default parameters is trained on the
released rows and labels and scored on the real 20 %. Accuracy and AUPRC
(average precision; binary: the disease / "yes" class is positive; several
classes: macro average of one-vs-rest) are averaged over the runs, next to the
no-privacy score (RF on the real 80 %), the majority-class rate (share of the
training majority class in the test split) and the paper's Table 2 (docs/math.md).

Declared bounds: the per-column min and max of the whole dataset, a stand-in
for the domain knowledge a real release must declare (it is not private).
Missing values (ILPD, Dermatology) use fill="dp-mean", which spends 5 % of the
Gaussian-DP budget. Defaults everywhere else: k2 = round(0.6 d), k1 = 4 k2,
budget split 80/20 of mu, rows not norm-clipped (Z = the box's largest norm).

Usage::

    python scripts/dprp_utility.py real --runs 10 --out docs/dprp_utility_real.json
    python scripts/dprp_utility.py synthetic --out docs/dprp_utility_synth.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np
import pandas as pd
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier
from sklearn.metrics import accuracy_score, average_precision_score
from sklearn.model_selection import train_test_split

from sparkpriv.api import release_dprp_array, table_arrays

DATA = os.environ.get("SPARKPRIV_DATASETS",
                      os.path.join(os.path.dirname(__file__), "..", "..", "shared", "datasets"))
EPSILONS = (1.0, 2.0, 4.0, 6.0, 8.0)
DELTA = 1e-4

# docs/math.md section 3, paper Table 2: (accuracy, AUPRC) per epsilon, and no privacy
PAPER = {
    "coimbra": {8: (.56, .63), 6: (.54, .62), 4: (.52, .59), 2: (.51, .59), 1: (.51, .56), "none": (.94, .69)},
    "wisconsin": {8: (.71, .74), 6: (.69, .68), 4: (.68, .65), 2: (.63, .61), 1: (.58, .62), "none": (.98, .98)},
    "ilpd": {8: (.79, .70), 6: (.79, .66), 4: (.77, .66), 2: (.75, .65), 1: (.72, .66), "none": (.83, .74)},
    "dermatology": {8: (.35, .31), 6: (.35, .31), 4: (.32, .30), 2: (.27, .29), 1: (.28, .29), "none": (.95, .99)},
    "caesarian": {8: (.56, .71), 6: (.56, .69), 4: (.55, .66), 2: (.55, .64), 1: (.54, .59), "none": (.78, .96)},
}


def load(name: str):
    """``(X float (n, d) with NaN for missing, y, positive class or None, column names)``."""
    if name == "coimbra":
        df = pd.read_csv(os.path.join(DATA, "coimbra_breast_cancer", "dataR2.csv"), encoding="utf-8-sig")
        y = df.pop("Classification").to_numpy()
        return df.to_numpy(float), y, 2, list(df.columns)
    if name == "wisconsin":
        df = pd.read_csv(os.path.join(DATA, "wisconsin_breast_cancer", "wdbc.data"), header=None)
        y = df[1].to_numpy()
        X = df.drop(columns=[0, 1])
        return X.to_numpy(float), y, "M", [f"f{i}" for i in range(X.shape[1])]
    if name == "ilpd":
        df = pd.read_csv(os.path.join(DATA, "ilpd", "ilpd.csv"))
        df["sex"] = (df["sex"] == "Female").astype(float)
        y = df.pop("label").to_numpy()
        return df.to_numpy(float), y, 1, list(df.columns)
    if name == "dermatology":
        df = pd.read_csv(os.path.join(DATA, "dermatology", "dermatology.data"), na_values="?")
        y = df.pop("Classification").to_numpy()
        return df.to_numpy(float), y, None, list(df.columns)
    if name == "caesarian":
        rows = []
        with open(os.path.join(DATA, "caesarian", "caesarian.csv.arff")) as f:
            data = False
            for line in f:
                line = line.strip()
                if line.lower() == "@data":
                    data = True
                elif data and line and not line.startswith("%"):
                    rows.append([float(v) for v in line.split(",")])
        a = np.array(rows)
        return a[:, :-1], a[:, -1].astype(int), 1, ["age", "delivery_number", "delivery_time", "bp", "heart"]
    raise ValueError(name)


def auprc(y_true, proba, classes_model, positive, classes_all):
    """Average precision; binary: ``positive`` vs rest; else macro one-vs-rest."""
    def col(c):
        idx = np.flatnonzero(np.asarray(classes_model) == c)
        return proba[:, idx[0]] if idx.size else np.zeros(len(y_true))

    if positive is not None:
        return average_precision_score(y_true == positive, col(positive))
    return float(np.mean([average_precision_score(y_true == c, col(c)) for c in classes_all
                          if np.any(y_true == c)]))


def score(Xtr, ytr, Xte, yte, positive, classes_all, seed):
    rf = RandomForestClassifier(random_state=seed, n_jobs=1)
    rf.fit(Xtr, ytr)
    return accuracy_score(yte, rf.predict(Xte)), auprc(yte, rf.predict_proba(Xte), rf.classes_, positive,
                                                       classes_all)


def evaluate(X, y, positive, *, runs, epsilons, label_modes, seed0=0, log=print):
    lower = np.nanmin(X, axis=0)
    upper = np.nanmax(X, axis=0)
    upper = np.where(upper > lower, upper, lower + 1.0)
    ints = [j for j in range(X.shape[1]) if np.all(np.isnan(X[:, j]) | (X[:, j] == np.rint(X[:, j])))]
    fill = "dp-mean" if np.isnan(X).any() else None
    classes = tuple(np.unique(y).tolist())
    res = {"n": len(y), "d": X.shape[1], "classes": len(classes), "runs": runs, "none": [], "majority": []}
    for mode in label_modes:
        for e in epsilons:
            res[f"{mode}:{e:g}"] = []
    for r in range(runs):
        seed = seed0 + r
        Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, stratify=y, random_state=seed)
        maj = pd.Series(ytr).mode()[0]
        res["majority"].append(float(np.mean(yte == maj)))
        # no privacy: the real training rows (missing values filled with the training column mean)
        Xtr_f = np.where(np.isnan(Xtr), np.nanmean(Xtr, axis=0), Xtr)
        Xte_f = np.where(np.isnan(Xte), np.nanmean(Xtr, axis=0), Xte)
        res["none"].append(score(Xtr_f, ytr, Xte_f, yte, positive, classes, seed))
        for mode in label_modes:
            for e in epsilons:
                rel = release_dprp_array(Xtr, ytr, labels=mode, classes=classes, epsilon=e, delta=DELTA,
                                         lower=lower, upper=upper, integer_columns=ints, fill=fill)
                assert rel.epsilon <= e * (1 + 1e-3)
                Xr, yr = table_arrays(rel)
                res[f"{mode}:{e:g}"].append(score(Xr, yr, Xte_f, yte, positive, classes, seed))
        log(f"  run {r + 1}/{runs} done")
    return res


def summarize(res):
    out = {}
    for k, v in res.items():
        if isinstance(v, list) and v:
            a = np.asarray(v, float)
            if a.ndim == 1:
                out[k] = {"mean": round(float(a.mean()), 3), "sd": round(float(a.std()), 3)}
            else:
                out[k] = {"acc": round(float(a[:, 0].mean()), 3), "acc_sd": round(float(a[:, 0].std()), 3),
                          "auprc": round(float(a[:, 1].mean()), 3), "auprc_sd": round(float(a[:, 1].std()), 3)}
        elif not isinstance(v, list):
            out[k] = v
    return out


def markdown_real(summary: dict, modes) -> str:
    lines = []
    head = "| data (n x d) | labels | " + " | ".join(f"eps={e:g}" for e in sorted(EPSILONS, reverse=True)) \
        + " | no privacy | majority |"
    lines += [head, "|" + "---|" * (len(EPSILONS) + 4)]
    for name, s in summary.items():
        tag = f"{name} ({s['n']} x {s['d']})"
        for mode in modes:
            cells = [f"{s[f'{mode}:{e:g}']['acc']:.2f}, {s[f'{mode}:{e:g}']['auprc']:.2f}"
                     for e in sorted(EPSILONS, reverse=True)]
            lines.append(f"| {tag} | {mode} | " + " | ".join(cells)
                         + f" | {s['none']['acc']:.2f}, {s['none']['auprc']:.2f} | {s['majority']['mean']:.2f} |")
        p = PAPER[name]
        cells = [f"{p[int(e)][0]:.2f}, {p[int(e)][1]:.2f}" for e in sorted(EPSILONS, reverse=True)]
        lines.append(f"| {tag} | paper Table 2 | " + " | ".join(cells)
                     + f" | {p['none'][0]:.2f}, {p['none'][1]:.2f} | |")
    return "\n".join(lines)


def run_real(args):
    summary = {}
    for name in args.datasets:
        X, y, pos, _ = load(name)
        t0 = time.time()
        print(f"{name}: {X.shape}", file=sys.stderr)
        res = evaluate(X, y, pos, runs=args.runs, epsilons=EPSILONS, label_modes=args.labels,
                       log=lambda m: print(m, file=sys.stderr))
        summary[name] = summarize(res)
        summary[name]["seconds"] = round(time.time() - t0, 1)
    print(markdown_real(summary, args.labels))
    return summary


def run_synthetic(args):
    summary = {}
    for n in args.sizes:
        runs = max(1, min(args.runs, int(args.budget_rows // n)))
        X, y = make_classification(n_samples=n, n_features=args.d, n_informative=args.d // 2, n_redundant=0,
                                   n_classes=2, class_sep=1.0, random_state=0)
        # declared public bounds: the box [-5, 5] (values outside are clipped)
        X = np.clip(X, -5, 5)
        t0 = time.time()
        print(f"synthetic n={n}: {runs} run(s)", file=sys.stderr)
        res = evaluate(X, y, 1, runs=runs, epsilons=args.epsilons, label_modes=args.labels,
                       log=lambda m: print(m, file=sys.stderr))
        s = summarize(res)
        s["seconds"] = round(time.time() - t0, 1)
        summary[str(n)] = s
        print(json.dumps({str(n): s}), file=sys.stderr)
    lines = ["| n | runs | labels | " + " | ".join(f"eps={e:g}" for e in args.epsilons)
             + " | no privacy | majority |", "|" + "---|" * (len(args.epsilons) + 5)]
    for n, s in summary.items():
        for mode in args.labels:
            cells = [f"{s[f'{mode}:{e:g}']['acc']:.2f}, {s[f'{mode}:{e:g}']['auprc']:.2f}" for e in args.epsilons]
            lines.append(f"| {n} | {s['runs']} | {mode} | " + " | ".join(cells)
                         + f" | {s['none']['acc']:.2f}, {s['none']['auprc']:.2f} | {s['majority']['mean']:.2f} |")
    print("\n".join(lines))
    return summary


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("real")
    r.add_argument("--runs", type=int, default=10)
    r.add_argument("--datasets", nargs="+", default=list(PAPER))
    r.add_argument("--labels", nargs="+", default=["private", "public"], choices=["private", "public"])
    r.add_argument("--out")
    s = sub.add_parser("synthetic")
    s.add_argument("--runs", type=int, default=5)
    s.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000, 1_000_000])
    s.add_argument("--d", type=int, default=10)
    s.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, 8.0])
    s.add_argument("--labels", nargs="+", default=["private", "public"], choices=["private", "public"])
    s.add_argument("--budget-rows", type=float, default=1e6, help="runs = min(--runs, budget_rows / n)")
    s.add_argument("--out")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    summary = run_real(args) if args.what == "real" else run_synthetic(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
