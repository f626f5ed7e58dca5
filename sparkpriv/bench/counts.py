"""``sparkpriv bench counts``: DP counts of distinct people per tower against the
non-private query and the peers (docs/counts.md).

On one CDR event table of ``--people`` people (generated once under
``--data-dir`` by :func:`~sparkpriv.spark.generate_events.generate_cdr` and
reused), in one run, on one SparkSession, it times pipelines that read the
events and write a Parquet table of one row per tower:

a. ``sparkpriv``: :func:`~sparkpriv.spark.counts.bound_keys` (at most
   ``--max-keys`` towers per person) + ``release_counts`` (per-partition
   totals, discrete Laplace noise of epsilon ``--epsilon`` once on the
   driver) + ``Release.write`` (table and receipt);
b. ``nonprivate``: ``groupBy(tower_id).agg(countDistinct(caller_id))`` + write.

They run back to back, in alternating order, ``--repeats`` times after one
untimed warm-up of each; every repeat is printed with its wall seconds and CPU-seconds: of the
benchmark's own processes (the driver, its JVM and the JVM's Python workers,
from ``/proc/<pid>/stat``) and of the whole machine (``/proc/stat``, which
on a shared machine includes other people's work).

Peers (optional): ``--tumult-python`` / ``--pipelinedp-python`` name the
Python of a separate virtual environment holding Tumult Analytics or
PipelineDP (docs/counts.md says how to make them); each runs the same query
(the same table, bound ``L`` and epsilon, the 1,303 towers as public
partitions, Laplace noise) in its own process and SparkSession with the same
master and driver memory, warm-up and repeats, and writes its output, which
this process reads back for the utility figures.

Utility (``--utility``): per tower, the error of each release against the
true number of distinct people (mean absolute, and mean relative by
popularity quartile of the true count), and the share of towers whose
stated 95 % interval holds the true bounded total (sparkpriv) and the true
count. The last line is JSON. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys

from sparkpriv.bench._timing import add_run_arguments, alternate, ensure_table, open_bench, run_peer, timing_figures

__all__ = ["add_arguments", "run_from_args", "run"]

_log = logging.getLogger(__name__)
TOWERS = 1303
_WARMUP_PEOPLE = 200_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--people", type=int, default=1_000_000, help="people in the CDR table [default: 1000000]")
    parser.add_argument("--max-keys", type=int, default=32, help="towers counted per person, L [default: 32]")
    parser.add_argument("--epsilon", type=float, default=1.0, help="epsilon of every release [default: 1.0]")
    add_run_arguments(parser, _WARMUP_PEOPLE)
    parser.add_argument("--no-utility", dest="utility", action="store_false",
                        help="skip the error and coverage figures")


def run_from_args(args: argparse.Namespace) -> dict:
    from sparkpriv.errors import ParameterError

    for name in ("people", "max_keys", "repeats"):
        if getattr(args, name) < 1:
            raise ParameterError(f"--{name.replace('_', '-')} must be a positive integer. Got {getattr(args, name)}.")
    return run(people=args.people, max_keys=args.max_keys, epsilon=args.epsilon, data_dir=args.data_dir,
               repeats=args.repeats, master=args.master, driver_memory=args.driver_memory,
               shuffle_partitions=args.shuffle_partitions, warmup_people=args.warmup_people,
               tumult_python=args.tumult_python, pipelinedp_python=args.pipelinedp_python,
               peer_repeats=args.peer_repeats, utility=args.utility)


# --------------------------------------------------------------------------- the two local pipelines

def _run_sparkpriv(spark, src: str, out: str, max_keys: int, epsilon: float, bound_seed: bytes) -> dict:
    from sparkpriv.api import release_counts
    from sparkpriv.mechanisms.counts import KeyDomain
    from sparkpriv.spark.counts import bound_keys

    dom = KeyDomain.product("tower_id", range(0, TOWERS))
    rec = bound_keys(spark.read.parquet(src), person="caller_id", domain=dom, max_keys=max_keys, seed=bound_seed,
                     source=src)
    rel = release_counts(rec, domain=dom, epsilon=epsilon)
    rel.write(out)
    u = rel.uncertainty()
    return {"std": u["std"], "half_width": u["half_width"]}


def _run_nonprivate(spark, src: str, out: str) -> None:
    from pyspark.sql import functions as F

    ev = spark.read.parquet(src)
    ev.groupBy("tower_id").agg(F.countDistinct("caller_id").alias("people")).write.parquet(out)


# --------------------------------------------------------------------------- peers

_TUMULT = r'''
from tmlt.analytics import (AddRowsWithID, KeySet, MaxGroupsPerID, PureDPBudget, QueryBuilder, Session)

def query(src, out):
    df = spark.read.parquet(src).select("caller_id", "tower_id")
    sess = Session.from_dataframe(privacy_budget=PureDPBudget(args["epsilon"]), source_id="events",
                                  dataframe=df, protected_change=AddRowsWithID(id_column="caller_id"))
    keys = KeySet.from_dict({"tower_id": list(range(args["towers"]))})
    q = (QueryBuilder("events").enforce(MaxGroupsPerID("tower_id", args["max_keys"]))
         .groupby(keys).count_distinct(["caller_id"], name="count"))
    sess.evaluate(q, PureDPBudget(args["epsilon"])).write.parquet(out)
'''

_PIPELINEDP = r'''
import pipeline_dp

def query(src, out):
    rdd = spark.read.parquet(src).select("caller_id", "tower_id").rdd.map(tuple)
    acc = pipeline_dp.NaiveBudgetAccountant(total_epsilon=args["epsilon"], total_delta=0)
    engine = pipeline_dp.DPEngine(acc, pipeline_dp.SparkRDDBackend(spark.sparkContext))
    params = pipeline_dp.AggregateParams(noise_kind=pipeline_dp.NoiseKind.LAPLACE,
                                         metrics=[pipeline_dp.Metrics.PRIVACY_ID_COUNT],
                                         max_partitions_contributed=args["max_keys"],
                                         max_contributions_per_partition=1)
    ext = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1],
                                     value_extractor=lambda r: 0)
    res = engine.aggregate(rdd, params, ext, public_partitions=list(range(args["towers"])))
    acc.compute_budgets()
    res.map(lambda kv: (int(kv[0]), float(kv[1].privacy_id_count))).toDF(["tower_id", "count"]).write.parquet(out)
'''


# --------------------------------------------------------------------------- utility

def _read_counts(path: str, column: str):
    import numpy as np
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    keys = t.column("tower_id").to_numpy().astype(np.int64)
    vals = {c: np.full(TOWERS, np.nan) for c in column.split(",")}
    for c in vals:
        vals[c][keys] = t.column(c).to_numpy().astype(np.float64)
    return vals


def _utility(truth, bounded, released: dict) -> dict:
    """Errors against the true counts, by popularity quartile of the truth, and coverage."""
    import numpy as np

    q = np.quantile(truth, [0.25, 0.5, 0.75])
    bins = np.digitize(truth, q)
    out = {"popularity_quartile_upper_bounds": [float(x) for x in q] + [float(truth.max())]}
    for name, r in released.items():
        v = r["value"]
        err = v - truth
        rel = np.abs(err) / np.maximum(truth, 1.0)
        d = {"mean_abs_error": float(np.mean(np.abs(err))),
             "mean_abs_error_vs_bounded_total": float(np.mean(np.abs(v - bounded))) if bounded is not None else None,
             "mean_relative_error_by_popularity_quartile": [float(np.mean(rel[bins == i])) if (bins == i).any()
                                                            else None for i in range(4)],
             "mean_abs_error_by_popularity_quartile": [float(np.mean(np.abs(err)[bins == i])) if (bins == i).any()
                                                       else None for i in range(4)],
             "missing_keys": int(np.isnan(v).sum())}
        if "ci_low" in r:
            d["coverage_of_true_count"] = float(np.mean((r["ci_low"] <= truth) & (truth <= r["ci_high"])))
            if bounded is not None:
                d["coverage_of_bounded_total"] = float(np.mean((r["ci_low"] <= bounded) & (bounded <= r["ci_high"])))
        out[name] = d
    return out


# --------------------------------------------------------------------------- run

def run(*, people: int, max_keys: int = 32, epsilon: float = 1.0, data_dir: str = "./bench-data", repeats: int = 3,
        master: str = "local[2]", driver_memory: str = "6g", shuffle_partitions: int | None = None,
        warmup_people: int | None = None, tumult_python: str | None = None, pipelinedp_python: str | None = None,
        peer_repeats: int | None = None, utility: bool = True) -> dict:
    import numpy as np

    spark, sp, data_dir = open_bench("counts", people, data_dir, master, driver_memory, shuffle_partitions)
    table = ensure_table(spark, data_dir, people)
    warm = min(people, warmup_people or _WARMUP_PEOPLE)
    small = ensure_table(spark, data_dir, warm)
    events = spark.read.parquet(table).count()
    bound_seed = os.urandom(16)  # the same keyed choice in every run and in the owner-side totals
    pipes = {"sparkpriv": lambda src, out: _run_sparkpriv(spark, src, out, max_keys, epsilon, bound_seed),
             "nonprivate": lambda src, out: _run_nonprivate(spark, src, out)}
    runs = alternate(pipes, table, small, data_dir, repeats,
                     prime=lambda: spark.read.parquet(table).select("caller_id", "tower_id")
                     .write.format("noop").mode("overwrite").save())
    times, kept = runs["seconds"], runs["output"]
    info = runs["result"]["sparkpriv"]
    peers = {}
    cfg = {"master": master, "driver_memory": driver_memory, "shuffle_partitions": sp, "epsilon": epsilon,
           "max_keys": max_keys, "towers": TOWERS, "table": table, "warmup": small, "data_dir": data_dir,
           "repeats": peer_repeats or repeats}
    for name, py, script in (("tumult", tumult_python, _TUMULT), ("pipelinedp", pipelinedp_python, _PIPELINEDP)):
        if py:
            _log.info("running peer %s", name)
            peers[name] = run_peer(name, py, script, cfg)
    med = {n: float(np.median(ts)) for n, ts in times.items()}
    result = {
        "benchmark": "counts",
        "people": people,
        "events": events,
        "towers": TOWERS,
        "max_keys": max_keys,
        "epsilon": epsilon,
        **timing_figures(runs),
        "people_truncated": None,
        "noise_std": info.get("std"),
        "master": master,
        "shuffle_partitions": sp,
        "cpu_count": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 1),
        "repeats": repeats,
        "warmup_people": warm,
    }
    for name, p in peers.items():
        if "error" in p:
            result[f"{name}_error"] = p["error"]
            continue
        result[f"{name}_seconds_each_repeat"] = [round(t, 2) for t in p["seconds_each_repeat"]]
        result[f"{name}_cpu_seconds_each_repeat"] = [round(t, 1) for t in p["cpu_seconds_each_repeat"]]
        result[f"{name}_median_seconds"] = round(float(np.median(p["seconds_each_repeat"])), 2)
        result[f"{name}_speedup_of_sparkpriv"] = round(result[f"{name}_median_seconds"] / med["sparkpriv"], 1)
    if utility:
        nonpriv = _read_counts(kept["nonprivate"], "people")["people"]
        sp_out = _read_counts(kept["sparkpriv"], "noisy_count,ci_low,ci_high")
        released = {"sparkpriv": {"value": sp_out["noisy_count"], "ci_low": sp_out["ci_low"],
                                  "ci_high": sp_out["ci_high"]}}
        for name, p in peers.items():
            if "error" not in p:
                released[name] = {"value": _read_counts(p["output"], "count")["count"]}
        bounded, owner = _bounded_totals(spark, table, max_keys, bound_seed)
        result["people_truncated"] = owner.get("people_truncated")
        result["utility"] = _utility(nonpriv, bounded, released)
    for o in list(kept.values()) + [p.get("output") for p in peers.values() if p.get("output")]:
        shutil.rmtree(o, ignore_errors=True)
    print(f"{'pipeline':<58}{'median s':>10}")
    print(f"{'(a) sparkpriv counts (bound L=%d, Laplace, driver noise) + write' % max_keys:<58}{med['sparkpriv']:>10.2f}")
    print(f"{'(b) groupBy(tower).countDistinct(caller) + write':<58}{med['nonprivate']:>10.2f}")
    for name in peers:
        if f"{name}_median_seconds" in result:
            print(f"{'(peer) ' + name:<58}{result[name + '_median_seconds']:>10.2f}")
        else:
            print(f"(peer) {name}: {result[name + '_error']}")
    print(json.dumps(result))
    return result


def _bounded_totals(spark, table: str, max_keys: int, bound_seed: bytes):
    """The exact per-tower totals after sparkpriv's bounding (owner-side, for the coverage figure)."""
    from sparkpriv.mechanisms.counts import KeyDomain
    from sparkpriv.spark.counts import bound_keys, key_totals

    rec = bound_keys(spark.read.parquet(table), person="caller_id",
                     domain=KeyDomain.product("tower_id", range(0, TOWERS)), max_keys=max_keys, seed=bound_seed)
    totals = key_totals(rec, TOWERS).astype(float)
    return totals, rec.diagnostics()


if __name__ == "__main__":  # pragma: no cover
    from sparkpriv.bench import module_main

    sys.exit(module_main("counts"))
