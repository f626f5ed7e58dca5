"""``sparkpriv demo``: a useful private table from a sample event table, on local Spark.

``sparkpriv demo`` (the default) generates a call-detail table (people x cell
towers) under ``<workdir>/cdr-<people>``, sets a budget in a ledger and makes
three releases of it at the same epsilon: the synthetic release (``sparkpriv
release synthetic`` at its defaults; docs/utility.md), whose synthetic table is
the demo's private table; DP counts per tower (the simplest DP answer, used
under independence); and the paper's DPGM (DP k-means, then one RBM per cluster
trained with DP-SGD; docs/dpgm.md). It generates a synthetic table of the same
number of people from each released model (post-processing) and prints where
the private table, its receipt and the other releases are, with the
counting-query error of each beside an empty release's. ``sparkpriv demo
projection`` is the JL projection demo (Gaussian blobs). The demos' ledger is
their own and is reset on every run (a real ledger never is).
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import numpy as np

from sparkpriv.config import Option

__all__ = ["run_demo", "run_projection_demo", "DEMO_OPTIONS", "PROJECTION_DEMO_OPTIONS"]

_log = logging.getLogger(__name__)

DEMO_OPTIONS = (
    Option("workdir", "str", "where the sample table, releases, synthetic table and ledger go",
           default="./sparkpriv-demo"),
    Option("people", "int", "people in the sample call-detail table (1,303 towers)", default=20_000),
    Option("epsilon", "float", "epsilon of each release (the DPGM, the synthetic release and the per-tower counts "
           "compared)", default=1.0),
    Option("max_items", "int", "towers kept per person by the DPGM and the per-tower counts (a keyed uniform "
           "choice among more); the synthetic release chooses its own cap with DP", default=32),
    Option("k", "int", "clusters of the DPGM (one RBM each)", default=10),
    Option("queries", "int", "random counting queries (sets of towers) of the utility summary", default=1000),
)

PROJECTION_DEMO_OPTIONS = (
    Option("workdir", "str", "where the sample table, release and ledger go", default="./sparkpriv-demo"),
    Option("rows", "int", "rows of the sample table", default=200_000),
    Option("cols", "int", "feature columns of the sample table", default=16),
    Option("k", "int", "projection dimension", default=8),
    Option("epsilon", "float", "epsilon of the release", default=4.0),
    Option("pairs", "int", "random pairs of rows for the utility summary", default=5000),
)

FEW_PEOPLE = 5_000  # below this the demo says most of an answer is noise (measured at epsilon 1: docs/dpgm.md, "Current figures")
DELTA = 1e-5  # the DPGM's delta (DP-SGD's Gaussian steps); the counts release is pure epsilon


def _reset(paths) -> None:
    for p in paths:
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)


DEMO_STEPS = 5


def _demo_step(i: int, what: str) -> None:
    """One line per stage of the demo, out of a fixed total, so a long stage is never silent."""
    _log.info("demo step %d/%d: %s", i, DEMO_STEPS, what)


def run_demo(*, workdir: str, people: int, epsilon: float, max_items: int = 32, k: int = 10,
             queries: int = 1000, spark_conf=None) -> dict:
    """The demo (module docstring). Returns the paths and the utility summary."""
    from pyspark.sql import functions as F

    from sparkpriv.api import release_counts, release_dpgm, release_synthetic
    from sparkpriv.io.synthesize import synthesize_dpgm, synthesize_items
    from sparkpriv.ledger import open_ledger
    from sparkpriv.mechanisms import counting_queries as cq
    from sparkpriv.mechanisms.counts import KeyDomain
    from sparkpriv.spark.counting_queries import answer_release
    from sparkpriv.spark.events import bound_contributions
    from sparkpriv.spark.generate_events import CDR_MODEL, generate_cdr
    from sparkpriv.spark.session import get_spark

    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    spark = get_spark(spark_conf, size_local_driver=True)
    src = os.path.join(workdir, f"cdr-{people}")
    out = os.path.join(workdir, "release")
    counts_out = os.path.join(workdir, "tower-counts")
    synthetic = os.path.join(workdir, "synthetic")
    syn_release = os.path.join(workdir, "synthetic-release")
    syn_items = os.path.join(workdir, "synthetic-items")
    ledger_path = os.path.join(workdir, "ledger.sqlite")
    _reset([out, counts_out, synthetic, syn_release, syn_items, ledger_path, ledger_path + "-wal",
            ledger_path + "-shm"])
    if not os.path.exists(os.path.join(src, "_SUCCESS")):
        generate_cdr(spark, people=people, seed=0).write.mode("overwrite").parquet(src)
    events = spark.read.parquet(src)
    d = CDR_MODEL.items
    vocabulary = f"0..{d - 1}"
    url = f"sqlite:///{ledger_path}"
    with open_ledger(url) as led:
        led.set_budget("demo.cdr", epsilon=10.0, delta=DELTA)

    # 1. the synthetic release at its defaults (max_items="auto": the cap chosen with DP from the towers per
    #    person) and the demo's private table: as many synthetic people, drawn from it (post-processing)
    _demo_step(1, f"the synthetic release of {people} people (epsilon {epsilon:g}) and a table of as many "
                  "synthetic people from it (no budget)")
    srec = bound_contributions(events, person="caller_id", item="tower_id", max_items="auto", vocabulary=vocabulary)
    srel = release_synthetic(srec, epsilon=epsilon, delta=DELTA, ledger=url, table_id="demo.cdr", source=src)
    srel.write(syn_release)
    syn_receipt = os.path.join(syn_release, "_privacy_receipt.json")
    syn2 = synthesize_items(syn_release, rows=people, output=syn_items)
    # 2. the simplest DP answer at the same epsilon: noisy per-tower counts (their own release)
    _demo_step(2, f"DP counts per tower (epsilon {epsilon:g})")
    domain = KeyDomain.product("tower_id", range(0, d))
    crec = bound_contributions(events, person="caller_id", item="tower_id", max_items=max_items,
                               vocabulary=vocabulary)
    crel = release_counts(crec, domain=domain, epsilon=epsilon, neighbors="replace-one", ledger=url,
                          table_id="demo.cdr", source=src)
    crel.write(counts_out)
    # 3. the paper's DPGM: each person's set of towers (at most max_items), a model file and receipt
    _demo_step(3, f"the DPGM release (epsilon {epsilon:g})")
    records = bound_contributions(events, person="caller_id", item="tower_id", max_items=max_items,
                                  vocabulary=vocabulary)
    rel = release_dpgm(records, epsilon=epsilon, delta=DELTA, k=k, ledger=url, table_id="demo.cdr", source=src)
    rel.write(out)
    receipt_path = os.path.join(out, "_privacy_receipt.json")
    # 4. a synthetic table of as many people from the DPGM (post-processing: no budget)
    _demo_step(4, f"a synthetic table of {people} people from the DPGM (no budget)")
    syn = synthesize_dpgm(out, rows=people, output=synthetic)

    # utility (owner side): the paper's counting queries against the real (uncapped) table
    _demo_step(5, f"{queries} counting queries on the real table and on each release")
    truth = bound_contributions(events, person="caller_id", item="tower_id", max_items=1 << 30,
                                vocabulary=vocabulary).df.persist()
    try:
        longest = int(truth.select(F.max(F.size("items"))).first()[0] or 1)
        qs = cq.draw_queries(d, max_length=longest, n_queries=queries, groups=5, seed=0)
        true_a, n = answer_release(truth, qs.matrix, items_col="items")
    finally:
        truth.unpersist()
    syn_df = spark.read.parquet(syn.output)  # person, items: the synthetic people's tower ids
    syn_a, n_syn = answer_release(syn_df, qs.matrix, items_col="items", item_ids=vocabulary)
    syn2_a, n_syn2 = answer_release(spark.read.parquet(syn2.output), qs.matrix, items_col="items",
                                    item_ids=vocabulary)
    counts = spark.read.parquet(counts_out).orderBy("tower_id").select("noisy_count").toPandas()["noisy_count"]
    ind_a = cq.answers_under_independence(counts.to_numpy(), n, qs.matrix)
    errors = {
        "synthetic release table": cq.relative_errors(true_a, syn2_a * (n / max(n_syn2, 1)), n),
        "DPGM synthetic table": cq.relative_errors(true_a, syn_a * (n / max(n_syn, 1)), n),
        "independent Bernoullis (DP per-tower counts)": cq.relative_errors(true_a, ind_a, n),
        "empty release": cq.relative_errors(true_a, np.zeros_like(true_a), n),
    }
    summary = {name: {"mean": float(e.mean()),
                      "groups": [g["mean_relative_error"] for g in cq.group_summary(e, qs)]}
               for name, e in errors.items()}
    with open(receipt_path) as f:
        receipt = json.load(f)
    spent = receipt["guarantee"]
    with open(syn_receipt) as f:
        syn_spent = json.load(f)["guarantee"]
    print(f"private table: {syn2.output}")
    print(f"               ({people} synthetic people x {d} towers, drawn from the synthetic release)")
    print(f"receipt:       {syn_receipt}")
    print(f"model:         {syn_release} (sparkpriv release synthetic, epsilon {syn_spent['epsilon']:.4g}, "
          f"delta {syn_spent['delta']:g})")
    usable = ((receipt["mechanism_details"].get("model") or {}).get("clusters") or {}).get("usable", k)
    print(f"DPGM:          {syn.output} (from the paper's mixture {out}: {k} clusters, {usable} usable, "
          f"epsilon {spent['epsilon']:.4g}, delta {spent['delta']:g}; its receipt in that folder)")
    print(f"tower counts:  {counts_out} (DP distinct people per tower, epsilon {crel.epsilon:g})")
    print(f"ledger:        {url} (table demo.cdr, budget epsilon 10, delta {DELTA:g}; three releases)")
    print(f"utility:       {qs.size} counting queries (how many people used at least one tower of a random set; "
          "5 length groups), mean relative error against the real table:")
    for name, v in summary.items():
        print(f"                 {name:46s} {v['mean']:.3f}   (by length: "
              + ", ".join(f"{x:.3f}" for x in v["groups"]) + ")")
    if people < FEW_PEOPLE:
        best = min(v["mean"] for name, v in summary.items() if name != "empty release")
        print(f"note:          {people} people is few for a private release: the best release above is off by "
              f"{best:.0%} of an answer on average (the empty release by 100%); give more people or a larger "
              "epsilon")
    return {"output": syn2.output, "release": syn_release, "receipt": syn_receipt, "counts": counts_out,
            "dpgm": {"output": syn.output, "release": out, "receipt": receipt_path}, "utility": summary}


def run_projection_demo(*, workdir: str, rows: int, cols: int, k: int, epsilon: float, pairs: int = 5000,
                        spark_conf=None) -> dict:
    """``sparkpriv demo projection``: Gaussian blobs, a private JL projection, distance recovery."""
    from sparkpriv.io.inputs import read_table
    from sparkpriv.ledger import open_ledger
    from sparkpriv.mechanisms.projection import recover_sq_distances
    from sparkpriv.spark.generate import generate_blobs
    from sparkpriv.api import release_projection
    from sparkpriv.spark.session import get_spark

    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    spark = get_spark(spark_conf, size_local_driver=True)
    src = os.path.join(workdir, "input")
    out = os.path.join(workdir, "release")
    ledger_path = os.path.join(workdir, "ledger.sqlite")
    for p in (out, ledger_path, ledger_path + "-wal", ledger_path + "-shm"):
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)
    if not os.path.exists(os.path.join(src, "_SUCCESS")):
        generate_blobs(spark, rows=rows, cols=cols, clusters=2, separation=4.0,
                       seed=0).write.mode("overwrite").parquet(src)
    df = read_table(spark, src)
    columns = [c for c in df.columns if c.startswith("f")]
    url = f"sqlite:///{ledger_path}"
    with open_ledger(url) as led:
        led.set_budget("demo.blobs", epsilon=10.0, delta=0.0)
    # Declared public bounds: each feature in [-8, 8], each row's L2 norm <= 8.
    rel = release_projection(
        df, columns=columns, k=k, epsilon=epsilon, noise="laplace", neighbors="replace-one",
        row_bound=8.0, lower=[-8.0] * len(columns), upper=[8.0] * len(columns),
        keep_columns=["id"],  # the sample table's id is synthetic, declared public for the demo
        ledger=url, table_id="demo.blobs", source=src,
    )
    path = rel.write(out)
    receipt_path = os.path.join(out, "_privacy_receipt.json")
    with open(receipt_path) as f:
        receipt = json.load(f)
    s2 = receipt["mechanism_details"]["noise_variance_per_entry"]

    # Utility (owner side): recovered vs true squared distances on 2,000 random pairs.
    rng = np.random.default_rng(1)
    pairs = min(pairs, rows // 2)
    ids = rng.choice(rows, size=2 * pairs, replace=False)
    pairs = ids.reshape(pairs, 2)
    from pyspark.sql import functions as F

    zcols = [f"z{i}" for i in range(k)]
    priv = {r["id"]: np.array([r[c] for c in zcols]) for r in
            spark.read.parquet(path).where(F.col("id").isin([int(i) for i in ids])).collect()}
    orig = {r["id"]: np.array([r[c] for c in columns]) for r in
            df.where(F.col("id").isin([int(i) for i in ids])).collect()}
    Zi = np.stack([priv[int(a)] for a, _ in pairs])
    Zj = np.stack([priv[int(b)] for _, b in pairs])
    clip = lambda x: x * min(1.0, 8.0 / max(np.linalg.norm(x), 1e-300))  # noqa: E731
    Xi = np.stack([clip(np.clip(orig[int(a)], -8, 8)) for a, _ in pairs])
    Xj = np.stack([clip(np.clip(orig[int(b)], -8, 8)) for _, b in pairs])
    true = np.sum((Xi - Xj) ** 2, axis=1)
    D, var = recover_sq_distances(Zi, Zj, noise_variance=s2, noise_kind="laplace")
    summary = {
        "pairs": int(true.size),
        "mean_true_sq_distance": float(true.mean()),
        "mean_recovered_sq_distance": float(D.mean()),
        "ci95_of_mean": float(1.96 * np.sqrt(np.mean(var) / true.size)),
        "rmse": float(np.sqrt(np.mean((D - true) ** 2))),
        "predicted_rmse": float(np.sqrt(np.mean(var))),
    }
    print(f"private table: {path}")
    print(f"receipt:       {receipt_path}")
    print(f"ledger:        {url} (table demo.blobs, budget epsilon 10; this release epsilon {rel.epsilon:g})")
    print(
        "utility:       squared distances of {pairs} random pairs: mean true {mean_true_sq_distance:.1f}, "
        "mean recovered {mean_recovered_sq_distance:.1f} +- {ci95_of_mean:.1f} (95%); per pair RMSE "
        "{rmse:.0f} (predicted {predicted_rmse:.0f}): each released row carries noise of scale "
        "R/epsilon, so single distances are noisy and averages are unbiased".format(**summary)
    )
    return {"output": path, "receipt": receipt_path, "utility": summary}
