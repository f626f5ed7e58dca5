"""Utility of private person x item tables on real data: every method, every table, side by side.

``sparkpriv bench utility`` runs the methods of :mod:`sparkpriv.bench.utility_methods`
(sparkpriv's synthetic release and DPGM, DP per-item counts under independence at every
setting, k-means + Bernoulli, MST and AIM when their environment is set up, the empty
release, real samples of 1 % and 10 % of the people) on the real tables of
``../shared/datasets`` (:mod:`sparkpriv.bench.utility_data`) and on generated CDR and
transit tables, at several epsilons, several independent draws per cell, and scores each
output on three workloads (:mod:`sparkpriv.bench.utility_workloads`): union queries with
items drawn uniformly, union queries with items drawn by DP popularity, and the
co-occurrence of the most popular pairs. Error: mean relative error of 1,000 queries
(``|answer - truth| / max(truth, 0.001 n)``).

Writes ``results.json`` (every draw), ``results.md`` (mean +- std per cell, the best
setting of each swept family, and per table and workload whether sparkpriv's release is
below the best DP competitor by more than two standard deviations) and ``utility.png``
(error against epsilon, one panel per table and workload) into ``--out``. docs/utility.md
shows the current results.

``--quick``: three real tables, epsilon 1 and 4, 3 draws, the cheap methods (under 20 minutes
on 2 cores). Delta is ``1 / (10 n)`` for every method that takes one.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("sparkpriv.bench.utility")

FULL_EPSILONS = (0.5, 1.0, 2.0, 4.0)
QUICK_EPSILONS = (1.0, 4.0)
QUICK_TABLES = ("bms_webview_1", "bms_webview_2", "groceries")
GENERATED_PEOPLE = 50_000
OURS = ("synthetic", "dpgm")  # our synthesizers: the goal compares their best row with the rivals
WORKLOAD_TITLES = {"uniform": "union queries, items uniform", "popular": "union queries, popular items",
                   "pairs": "co-occurrence of popular pairs"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sparkpriv.bench.utility_data import GENERATED_TABLES, REAL_TABLES

    p.add_argument("--tables", default=None,
                   help=f"comma-separated tables (default: all of {', '.join(REAL_TABLES + GENERATED_TABLES)})")
    p.add_argument("--epsilons", default=None, help="comma-separated epsilons (default 0.5,1,2,4)")
    p.add_argument("--draws", type=int, default=None, help="independent draws per cell (default 5; --quick 3)")
    p.add_argument("--methods", default=None,
                   help="comma-separated method names or sweep families (default: every registered method)")
    p.add_argument("--quick", action="store_true", help="three real tables, epsilon 1 and 4, 3 draws, cheap methods")
    p.add_argument("--peers", action="store_true", help="also MST (32 columns) and AIM (16 columns), in their own "
                   "environment (--setup-peers installs it)")
    p.add_argument("--setup-peers", action="store_true",
                   help="create .bench-venvs/pgm with smartnoise-synth (needs the package registry), then run")
    p.add_argument("--people", type=int, default=GENERATED_PEOPLE,
                   help=f"people of each generated table (default {GENERATED_PEOPLE:,})")
    p.add_argument("--subsample", type=int, default=None,
                   help="real tables: a uniformly random subset of at most this many people (default: whole tables)")
    p.add_argument("--datasets", default=None, help="the real datasets' folder (default ../shared/datasets)")
    p.add_argument("--out", default="bench-data/utility", help="folder for results.json, results.md, utility.png")
    p.add_argument("--queries", type=int, default=1000, help="queries per workload (default 1000)")
    p.add_argument("--merge", nargs="+", default=None, metavar="RESULTS_JSON",
                   help="write one results table and plot from earlier runs' results.json (no method runs)")
    p.add_argument("--plugin", action="append", default=[],
                   help="module:function registering more methods (sparkpriv.bench.utility_methods.register)")


def _methods(args) -> list:
    import importlib

    from sparkpriv.bench import utility_methods as um

    um.default_methods()
    for spec in args.plugin:
        mod, _, fn = spec.partition(":")
        getattr(importlib.import_module(mod), fn or "register_methods")()
    if args.setup_peers:
        from sparkpriv.bench.utility_peers import setup_peers

        setup_peers()
    if args.peers or args.setup_peers:
        from sparkpriv.bench.utility_peers import pgm_peer, peer_python

        if peer_python() is None:
            raise SystemExit("--peers: the peers' environment is absent; run with --setup-peers once")
        if "MST" not in um.REGISTRY:
            um.register("MST", pgm_peer("mst", 32), family="peer", cost="high", quick=False,
                        note="MST (smartnoise-synth) on the 32 most popular items (DP-chosen), add/remove neighbours")
            um.register("AIM", pgm_peer("aim", 16), family="peer", cost="high", quick=False,
                        note="AIM (smartnoise-synth) on the 16 most popular items (DP-chosen), add/remove neighbours")
    chosen = list(um.REGISTRY.values())
    if args.methods:
        want = {w.strip() for w in re.split(r",(?![^\[]*\])", args.methods) if w.strip()}  # not inside [...]
        unknown = want - {m.name for m in chosen} - {m.sweep for m in chosen if m.sweep}
        if unknown:
            raise SystemExit(f"--methods: unknown {sorted(unknown)}; registered: "
                             f"{', '.join(m.name for m in chosen)}")
        chosen = [m for m in chosen if m.name in want or m.sweep in want]
    elif args.quick:
        chosen = [m for m in chosen if m.quick and m.cost == "low"]
    return chosen


def _seed(*parts) -> int:
    """A reproducible 63-bit seed from the cell's coordinates (public)."""
    import hashlib

    h = hashlib.sha256(json.dumps(parts).encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


def run(*, tables, epsilons, draws, methods, people=GENERATED_PEOPLE, subsample=None, datasets=None,
        queries=1000, on_row=None) -> dict:
    """Every method on every table, epsilon and draw; returns the results document (results.json)."""
    from sparkpriv.bench.utility_data import GENERATED_TABLES, load_table
    from sparkpriv.bench.utility_workloads import WORKLOADS, answers, errors, make_workload

    rows, table_facts, workloads = [], {}, {}
    for t in tables:
        size = people if t in GENERATED_TABLES else subsample
        table = load_table(t, root=datasets, people=size, seed=0)
        X = table.X
        n, d = X.shape
        wl = make_workload(X, seed=_seed("workload", t) % 2**31, n_queries=queries, n_pairs=queries)
        table_facts[t] = {**table.describe(), "delta": 1.0 / (10.0 * n)}
        workloads[t] = wl.selection
        popular = _dp_popular_order(wl, d)
        for m in methods:
            if hasattr(m.fn, "popular_items"):
                m.fn.popular_items = popular
        log.info("table %s: %d people x %d items (%s)", t, n, d, table.source)
        for eps in epsilons:
            delta = 1.0 / (10.0 * n)
            for m in methods:
                reps = 1 if m.family == "yardstick" and m.name == "empty" else draws
                for r in range(reps):
                    seed = _seed(t, eps, m.name, r)
                    start = time.perf_counter()
                    try:
                        out = m.fn(X, epsilon=eps, delta=delta, seed=seed)
                    except Exception as e:  # a method that cannot run on this table: recorded, not fatal
                        log.warning("%s on %s at epsilon %g failed: %s", m.name, t, eps, e)
                        rows.append({"table": t, "epsilon": eps, "method": m.name, "draw": r, "family": m.family,
                                     "error": f"{type(e).__name__}: {e}"[:300]})
                        break
                    seconds = time.perf_counter() - start
                    variants = out if isinstance(out, dict) else {None: out}
                    for v, o in variants.items():
                        name = m.name if v is None else f"{m.name}[{v}]"
                        e = errors(answers(o, wl), wl)
                        row = {"table": t, "epsilon": eps, "method": name, "base": m.name, "sweep": m.sweep,
                               "family": m.family, "draw": r, "seconds": round(seconds, 3),
                               **{w: e[w]["mean"] for w in WORKLOADS},
                               "groups": {w: e[w]["groups"] for w in WORKLOADS if "groups" in e[w]}}
                        rows.append(row)
                        if on_row:
                            on_row(row)
    notes = {m.name: m.note for m in methods}
    return {"tables": table_facts, "workloads": workloads, "epsilons": list(epsilons), "draws": draws,
            "queries": queries,
            "methods": notes, "rows": rows}


def _dp_popular_order(wl, d: int) -> np.ndarray:
    """Items in the order of the workload's DP popularity (the items of the chosen pairs first, then
    the popular query weights): public, from the workload's own DP counts."""
    order = list(dict.fromkeys(wl.pairs.ravel().tolist()))
    rest = np.setdiff1d(np.arange(d), order, assume_unique=False)
    return np.concatenate([np.asarray(order, dtype=np.int64), rest]).astype(np.int64)


# ----------------------------------------------------------------------------- summary


def summarize(doc: dict) -> dict:
    """Per (table, epsilon, method): mean and std over draws of each workload; per swept family its best
    setting per cell (by the mean) as ``<family> (best)``."""
    from sparkpriv.bench.utility_workloads import WORKLOADS

    cells: dict = {}
    for r in doc["rows"]:
        if "error" in r:
            continue
        cells.setdefault((r["table"], r["epsilon"], r["method"]), []).append(r)
    out = {}
    for (t, eps, name), rs in cells.items():
        first = rs[0]
        entry = {"family": first["family"], "sweep": first.get("sweep"), "draws": len(rs),
                 "seconds": float(np.mean([x["seconds"] for x in rs]))}
        for w in WORKLOADS:
            v = np.array([x[w] for x in rs])
            entry[w] = (float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0)
        out.setdefault((t, eps), {})[name] = entry
    for (t, eps), ms in out.items():
        sweeps = {}
        for name, e in ms.items():
            if e["sweep"]:
                sweeps.setdefault(e["sweep"], []).append(name)
        for s, names in sweeps.items():
            for w in WORKLOADS:
                best = min(names, key=lambda nm: ms[nm][w][0])
                ms.setdefault(f"{s} (best)", {"family": "private", "sweep": None, "best_of": {}, "draws": ms[best]["draws"],
                                              "seconds": ms[best]["seconds"]})
                ms[f"{s} (best)"][w] = ms[best][w]
                ms[f"{s} (best)"]["best_of"][w] = best
    return out


def verdicts(summary: dict) -> dict:
    """Per (table, epsilon, workload): sparkpriv's best synthesizer row (the synthetic release, the DPGM;
    the tables they write, not a model's ``[expected]`` answers) against the best DP competitor
    (families 'private' and 'peer', sweeps at their best settings, not our own rows):
    ``win`` when below it by more than two standard deviations of the draws (the larger of the two
    stds), ``loss`` when above by as much, else ``level``."""
    from sparkpriv.bench.utility_workloads import WORKLOADS

    res = {}
    for (t, eps), ms in summary.items():
        ours = [nm for nm in ms if nm.startswith(OURS) and not nm.endswith("[expected]")]
        rivals = [nm for nm, e in ms.items() if e["family"] in ("private", "peer") and not nm.startswith(OURS)
                  and not e.get("sweep")]
        if not ours or not rivals:
            continue
        for w in WORKLOADS:
            o = min(ours, key=lambda nm: ms[nm][w][0])
            b = min(rivals, key=lambda nm: ms[nm][w][0])
            (mo, so), (mb, sb) = ms[o][w], ms[b][w]
            gap = 2.0 * max(so, sb)
            verdict = "win" if mo < mb - gap else "loss" if mo > mb + gap else "level"
            res[(t, eps, w)] = {"ours": o, "ours_error": mo, "best_rival": b, "rival_error": mb, "verdict": verdict,
                                "sample_10": ms.get("sample 10%", {}).get(w, (math.nan,))[0]}
    return res


def _fmt(x) -> str:
    m, s = x
    return f"{m:.3f} ± {s:.3f}" if s else f"{m:.3f}"


def markdown(doc: dict) -> str:
    """The results table of :func:`run`'s document (Markdown)."""
    from sparkpriv.bench.utility_workloads import WORKLOADS

    summary = summarize(doc)
    ver = verdicts(summary)
    lines = ["# Utility on real and generated tables", "",
             f"Mean relative error of {doc['queries']} queries per workload "
             f"(mean ± std over {doc['draws']} draws; lower is better). Delta 1/(10 n).", ""]
    lines += ["| table | people | items | kind |", "|---|---|---|---|"]
    for t, f in doc["tables"].items():
        lines.append(f"| {t} | {f['people']:,} | {f['items']:,} | {f['kind']} |")
    for w in WORKLOADS:
        lines += ["", f"## {WORKLOAD_TITLES[w]}", ""]
        for t in doc["tables"]:
            eps = [e for e in doc["epsilons"] if (t, e) in summary]
            if not eps:
                continue
            names = []
            for e in eps:
                for nm, entry in summary[(t, e)].items():
                    if nm not in names and not entry.get("sweep"):
                        names.append(nm)
            names.sort(key=lambda nm: (nm.startswith(("empty", "sample")), not nm.startswith(OURS), nm))
            lines += [f"**{t}**", "", "| method | " + " | ".join(f"ε={e:g}" for e in eps) + " |",
                      "|---|" + "---|" * len(eps)]
            for nm in names:
                cells = []
                for e in eps:
                    entry = summary[(t, e)].get(nm)
                    cells.append(_fmt(entry[w]) if entry and w in entry else "–")
                label = nm
                if nm.endswith("(best)"):
                    picks = {summary[(t, e)][nm]["best_of"][w] for e in eps if nm in summary[(t, e)]}
                    label += " — " + "; ".join(sorted(p.split("[", 1)[1].replace("][", ", ").rstrip("]")
                                                      for p in picks if "[" in p))
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
            v = [ver[(t, e, w)]["verdict"] for e in eps if (t, e, w) in ver]
            if v:
                lines.append("| *sparkpriv against the best DP rival* | " + " | ".join(v) + " |")
            lines.append("")
    failed = [r for r in doc["rows"] if "error" in r]
    if failed:
        lines += ["## Methods that did not run", ""]
        for r in failed:
            lines.append(f"- {r['method']} on {r['table']} at ε={r['epsilon']:g}: {r['error']}")
    lines += ["", "## Methods", ""] + [f"- **{k}**: {v}" for k, v in doc["methods"].items()]
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: str) -> str | None:
    """Error against epsilon, one panel per table and workload (needs matplotlib; None without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        log.warning("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    from sparkpriv.bench.utility_workloads import WORKLOADS

    summary = summarize(doc)
    tables = list(doc["tables"])
    fig, axes = plt.subplots(len(WORKLOADS), len(tables), figsize=(3.2 * len(tables), 2.8 * len(WORKLOADS)),
                             squeeze=False)
    for j, t in enumerate(tables):
        eps = [e for e in doc["epsilons"] if (t, e) in summary]
        names = {nm for e in eps for nm, en in summary[(t, e)].items() if not en.get("sweep")}
        shown = [nm for nm in sorted(names) if nm.endswith("[table]")] + \
                [nm for nm in sorted(names) if nm.endswith("(best)") or nm in ("MST", "AIM", "dpgm")] + \
                [nm for nm in ("sample 1%", "sample 10%") if nm in names]
        for i, w in enumerate(WORKLOADS):
            ax = axes[i][j]
            for nm in shown:
                xs = [e for e in eps if nm in summary[(t, e)] and w in summary[(t, e)][nm]]
                ys = np.array([summary[(t, e)][nm][w] for e in xs])
                if not xs:
                    continue
                style = "--" if nm.startswith("sample") else "-"
                lw = 2.5 if nm.startswith(OURS) else 1.2
                ax.errorbar(xs, ys[:, 0], yerr=2 * ys[:, 1], fmt=style, marker="o", ms=3, lw=lw, label=nm,
                            capsize=2)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.set_xticks(eps)
            ax.set_xticklabels([f"{e:g}" for e in eps])
            ax.tick_params(axis="y", which="both", labelsize=7)
            if i == 0:
                ax.set_title(t, fontsize=9)
            if j == 0:
                ax.set_ylabel(WORKLOAD_TITLES[w], fontsize=8)
            if i == len(WORKLOADS) - 1:
                ax.set_xlabel("epsilon")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if labels:  # a run of methods none of which is drawn (e.g. only the empty release) has no legend
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def merge_docs(docs: list) -> dict:
    """One results document from several runs' (their rows side by side; same workloads required)."""
    out = {"tables": {}, "workloads": {}, "epsilons": [], "draws": 0, "queries": docs[0]["queries"], "methods": {},
           "rows": [], "seconds": 0.0, "command": " ; ".join(d.get("command", "") for d in docs)}
    for d in docs:
        for t, w in d["workloads"].items():
            if t in out["workloads"] and out["workloads"][t] != w:
                raise SystemExit(f"--merge: table {t!r} has different workloads in two runs (other --queries?)")
            out["workloads"][t] = w
        out["tables"].update(d["tables"])
        out["epsilons"] = sorted(set(out["epsilons"]) | set(d["epsilons"]))
        out["draws"] = max(out["draws"], d["draws"])
        out["methods"].update(d["methods"])
        out["rows"] += d["rows"]
        out["seconds"] += d.get("seconds", 0.0)
    return out


def _write(doc: dict, out: Path) -> None:
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    md = markdown(doc)
    (out / "results.md").write_text(md)
    png = plot(doc, str(out / "utility.png"))
    print(md)
    ver = verdicts(summarize(doc))
    tally = {k: sum(1 for v in ver.values() if v["verdict"] == k) for k in ("win", "level", "loss")}
    print(json.dumps({"benchmark": "utility", "out": str(out), "plot": png, "seconds": doc["seconds"],
                      "cells": len(ver), **tally}))


def run_from_args(args) -> dict:
    from sparkpriv.bench.utility_data import GENERATED_TABLES, REAL_TABLES

    if getattr(args, "merge", None):
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        doc = merge_docs([json.loads(Path(f).read_text()) for f in args.merge])
        _write(doc, out)
        return doc

    tables = [t.strip() for t in args.tables.split(",")] if args.tables else \
        list(QUICK_TABLES if args.quick else REAL_TABLES + GENERATED_TABLES)
    for t in tables:
        if t not in REAL_TABLES + GENERATED_TABLES:
            raise SystemExit(f"--tables: unknown table {t!r}; choose from {', '.join(REAL_TABLES + GENERATED_TABLES)}")
    epsilons = [float(e) for e in args.epsilons.split(",")] if args.epsilons else \
        list(QUICK_EPSILONS if args.quick else FULL_EPSILONS)
    draws = args.draws or (3 if args.quick else 5)
    if draws < 2:
        raise SystemExit("--draws: at least 2 (the table reports the std of the draws)")
    methods = _methods(args)
    # each draw is a release under a fixed public seed (a reproducible measurement, not a private
    # release): said once here instead of once per release; the mechanisms' progress lines are quieted
    print("note: the releases of this benchmark use fixed seeds (insecure_fixed_seed): measurements, not private "
          "releases", flush=True)
    for name in ("sparkpriv.privacy.random", "sparkpriv.release"):  # the fixed-seed notice of every release
        logging.getLogger(name).setLevel(logging.CRITICAL)
    for name in ("sparkpriv.kmeans", "sparkpriv.dpgm", "sparkpriv.synthetic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def progress(row):
        print(f"{row['table']:>18} eps={row['epsilon']:<4g} {row['method']:<34} draw {row['draw']}  "
              f"uniform {row['uniform']:.4f}  popular {row['popular']:.4f}  pairs {row['pairs']:.4f}  "
              f"({row['seconds']:.1f} s)", flush=True)

    doc = run(tables=tables, epsilons=epsilons, draws=draws, methods=methods, people=args.people,
              subsample=args.subsample, datasets=args.datasets, queries=args.queries, on_row=progress)
    doc["seconds"] = round(time.perf_counter() - start, 1)
    doc["command"] = "sparkpriv bench utility " + " ".join(_argv_of(args))
    _write(doc, out)
    return doc


def _argv_of(args) -> list:
    out = []
    for k in ("tables", "epsilons", "draws", "methods", "people", "subsample", "out"):
        v = getattr(args, k, None)
        if v is not None:
            out += [f"--{k}", str(v)]
    if args.quick:
        out.append("--quick")
    if args.peers:
        out.append("--peers")
    return out


if __name__ == "__main__":
    from sparkpriv.bench import module_main

    raise SystemExit(module_main("utility"))
