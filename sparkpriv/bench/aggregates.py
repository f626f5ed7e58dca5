"""``sparkpriv bench aggregates``: DP aggregates per tower x hour against the non-private query
and the peers (docs/aggregates.md).

On one CDR event table of ``--people`` people (``caller_id, tower_id, hour, duration``: the events
of :func:`~sparkpriv.spark.generate_events.generate_cdr`, the hour of each call's UTC time, and a
call duration in whole seconds drawn from a log-normal of median 90 s by a hash of the event;
generated once under ``--data-dir`` and reused), in one run, on one SparkSession, it times
pipelines that read the events and write a Parquet table of one row per tower x hour (1,303 x 24
= 31,272 cells) holding distinct callers, calls, the total, mean and median duration:

a. ``sparkpriv``: :class:`~sparkpriv.api.Aggregates` ``.by("tower_id", "hour")`` over the public
   domain, ``count_distinct, count, sum, mean, median`` of ``duration`` clamped to ``[--lo,
   --hi]``, at most ``--max-keys`` cells per caller and ``--max-events-per-key`` calls per cell,
   epsilon ``--epsilon`` (discrete Laplace) + ``Release.write`` (table and receipt);
b. ``nonprivate``: the same five aggregates in Spark SQL + write: ``groupBy(tower_id,
   hour).agg(countDistinct(caller_id))`` joined to ``groupBy(tower_id, hour).agg(count, sum, avg,
   percentile_approx(duration, 0.5))`` (``--nonprivate-form split``, the default), or all five in one
   ``groupBy.agg`` (``single``: much slower, as Spark then merges a percentile digest for every
   (cell, caller) pair after the distinct aggregate's expansion).

They run back to back, in alternating order, ``--repeats`` times after one untimed warm-up of
each (on ``--warmup-people`` people); every repeat is printed with its wall seconds and
CPU-seconds (of the benchmark's own processes, and of the whole machine).

Peers (optional): ``--tumult-python`` / ``--pipelinedp-python`` name the Python of a separate
virtual environment with Tumult Analytics or PipelineDP (docs/aggregates.md says how to make
them). Each runs the same query in its own process and SparkSession (same master and driver
memory, warm-up and repeats): the same table, ``L``, ``c``, clamp and epsilon, the 31,272 cells as
public partitions (one key column ``cell = 24 tower_id + hour``: Tumult's ``MaxGroupsPerID``
bounds one column), Laplace noise, epsilon split in four equal parts as sparkpriv's default
split (distinct callers, calls, the duration sum, the median's measurement):

* Tumult Analytics: four queries of one Session (``count_distinct``, ``count``, ``sum``,
  ``median``; it has no query of several aggregates), each written; the mean is the noisy sum
  over the noisy count (post-processing, as sparkpriv's);
* PipelineDP: one ``DPEngine.aggregate`` of ``PRIVACY_ID_COUNT, COUNT, SUM, MEAN,
  PERCENTILE(50)`` on the Spark RDD backend (its ``MEAN`` measures the count and the sum that
  ``COUNT`` and ``SUM`` report).

Utility (``--no-utility`` skips it): per cell and aggregate, the error of each release against
the exact non-private answer (computed once, untimed, with the exact ``percentile``): mean and
median absolute error over the cells (for the mean and the median: the cells with calls), and by
quartile of the cells' true number of calls; beside them sparkpriv's stated noise std (mean over
the cells) and the share of cells whose stated 95 % interval holds the exact answer. The last
line is JSON. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys

from sparkpriv.bench._timing import (add_run_arguments, alternate, ensure_table, open_bench, rounded, run_peer,
                                      timing_figures)

__all__ = ["add_arguments", "run_from_args", "run", "AGGREGATES", "events_table"]

_log = logging.getLogger(__name__)
TOWERS = 1303
HOURS = 24
_WARMUP_PEOPLE = 200_000
#: the output columns compared, in the order of the query
AGGREGATES = ("count_distinct", "count", "sum_duration", "mean_duration", "p50_duration")
_DURATION_MEDIAN_S = 90.0
_DURATION_SIGMA = 1.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--people", type=int, default=1_000_000, help="people in the CDR table [default: 1000000]")
    parser.add_argument("--max-keys", type=int, default=32, help="tower x hour cells per caller, L [default: 32]")
    parser.add_argument("--max-events-per-key", type=int, default=4,
                        help="calls per caller and cell, c [default: 4]")
    parser.add_argument("--lo", type=float, default=0.0, help="duration clamp, low (seconds) [default: 0]")
    parser.add_argument("--hi", type=float, default=3600.0, help="duration clamp, high (seconds) [default: 3600]")
    parser.add_argument("--epsilon", type=float, default=1.0, help="epsilon of every release [default: 1.0]")
    add_run_arguments(parser, _WARMUP_PEOPLE)
    parser.add_argument("--peer-warmup-people", type=int, default=None,
                        help="people in the peers' untimed warm-up table [default: as --warmup-people]")
    parser.add_argument("--peer-timeout", type=int, default=7200,
                        help="seconds before a peer is stopped [default: 7200]")
    parser.add_argument("--nonprivate-form", choices=("split", "single"), default="split",
                        help="the non-private query: 'split' (countDistinct in its own groupBy, joined to the "
                             "others; the faster) or 'single' (one groupBy.agg of all five) [default: split]")
    parser.add_argument("--no-utility", dest="utility", action="store_false",
                        help="skip the error figures")


def run_from_args(args: argparse.Namespace) -> dict:
    from sparkpriv.errors import ParameterError

    for name in ("people", "max_keys", "max_events_per_key", "repeats"):
        if getattr(args, name) < 1:
            raise ParameterError(f"--{name.replace('_', '-')} must be a positive integer. Got {getattr(args, name)}.")
    if not (math.isfinite(args.lo) and math.isfinite(args.hi) and args.lo < args.hi):
        raise ParameterError(f"--lo and --hi must be finite with lo < hi. Got {args.lo} and {args.hi}.")
    return run(people=args.people, max_keys=args.max_keys, max_events_per_key=args.max_events_per_key,
               lo=args.lo, hi=args.hi, epsilon=args.epsilon, data_dir=args.data_dir, repeats=args.repeats,
               master=args.master, driver_memory=args.driver_memory, shuffle_partitions=args.shuffle_partitions,
               warmup_people=args.warmup_people, tumult_python=args.tumult_python,
               pipelinedp_python=args.pipelinedp_python, peer_repeats=args.peer_repeats,
               peer_warmup_people=args.peer_warmup_people,
               peer_timeout=args.peer_timeout, nonprivate_form=args.nonprivate_form, utility=args.utility)


# --------------------------------------------------------------------------- the table

def events_table(spark, people: int, seed: int = 0):
    """``caller_id, tower_id, hour, duration`` (lazy): the CDR events, the hour (0-23) of each call's
    UTC time, and a duration in whole seconds (at least 1) from a log-normal of median 90 s and
    sigma 1.1 (Box-Muller on two hashes of the event: deterministic, about 4 in 10,000 calls are
    longer than an hour)."""
    from pyspark.sql import functions as F

    from sparkpriv.spark.generate_events import generate_cdr

    ev = generate_cdr(spark, people=people, seed=seed)
    h1 = F.xxhash64("caller_id", "tower_id", "ts")
    h2 = F.xxhash64(h1, F.lit(1))
    den = float(1 << 52)
    u1 = (F.pmod(h1, F.lit(1 << 52)) + F.lit(0.5)) / F.lit(den)
    u2 = (F.pmod(h2, F.lit(1 << 52)) + F.lit(0.5)) / F.lit(den)
    z = F.sqrt(F.lit(-2.0) * F.log(u1)) * F.cos(F.lit(2.0 * math.pi) * u2)
    duration = F.greatest(F.lit(1.0), F.round(F.exp(F.lit(math.log(_DURATION_MEDIAN_S)) + F.lit(_DURATION_SIGMA) * z)))
    hour = F.floor(F.pmod(F.col("ts").cast("long"), F.lit(86400)) / F.lit(3600)).cast("int")
    return ev.select("caller_id", "tower_id", hour.alias("hour"), duration.alias("duration"))


def _ensure(spark, data_dir: str, people: int) -> str:
    return ensure_table(spark, data_dir, people, name="cdr-agg", build=lambda s, n, seed: events_table(s, n, seed))


# --------------------------------------------------------------------------- the two local pipelines

def _run_sparkpriv(spark, src: str, out: str, *, max_keys: int, max_events_per_key: int, lo: float, hi: float,
                   epsilon: float) -> dict:
    from sparkpriv.api import Aggregates

    rel = (Aggregates(spark.read.parquet(src), person="caller_id")
           .by("tower_id", "hour", domain={"tower_id": range(TOWERS), "hour": range(HOURS)})
           .count_distinct().count()
           .sum("duration", lo, hi).mean("duration", lo, hi).median("duration", lo, hi)
           .bound(max_keys=max_keys, max_events_per_key=max_events_per_key)
           .release(epsilon=epsilon, source=src))
    rel.write(out)
    return rel.diagnostics() if rel.diagnostics else {}


def _nonprivate_query(ev, *, exact: bool = False, form: str = "split"):
    """The non-private answer per cell with calls. ``form="single"``: one ``groupBy.agg`` of the five
    aggregates; ``"split"``: the distinct count in its own ``groupBy``, joined to the other four (the
    faster form: with a distinct aggregate beside it, Spark merges a percentile digest per (cell,
    caller) pair)."""
    from pyspark.sql import functions as F

    median = F.expr("percentile(duration, 0.5)") if exact else F.percentile_approx("duration", 0.5)
    distinct = F.countDistinct("caller_id").alias("count_distinct")
    others = [F.count(F.lit(1)).alias("count"), F.sum("duration").alias("sum_duration"),
              F.avg("duration").alias("mean_duration"), median.alias("p50_duration")]
    g = ev.groupBy("tower_id", "hour")
    if form == "single":
        return g.agg(distinct, *others)
    return (ev.groupBy("tower_id", "hour").agg(distinct).join(g.agg(*others), ["tower_id", "hour"])
            .select("tower_id", "hour", "count_distinct", "count", "sum_duration", "mean_duration", "p50_duration"))


def _run_nonprivate(spark, src: str, out: str, form: str = "split") -> None:
    _nonprivate_query(spark.read.parquet(src), form=form).write.parquet(out)


# --------------------------------------------------------------------------- peers

_TUMULT = r'''
from tmlt.analytics import (AddRowsWithID, KeySet, MaxGroupsPerID, MaxRowsPerGroupPerID, PureDPBudget,
                            QueryBuilder, Session)

def query(src, out):
    from pyspark.sql import functions as F
    L, c, lo, hi = args["max_keys"], args["max_events_per_key"], args["lo"], args["hi"]
    df = spark.read.parquet(src).select("caller_id", (F.col("tower_id") * 24 + F.col("hour")).alias("cell"),
                                        "duration")
    sess = Session.from_dataframe(privacy_budget=PureDPBudget(args["epsilon"]), source_id="events",
                                  dataframe=df, protected_change=AddRowsWithID(id_column="caller_id"))
    keys = KeySet.from_dict({"cell": list(range(args["cells"]))})

    def per_cell():
        return (QueryBuilder("events").enforce(MaxGroupsPerID("cell", L))
                .enforce(MaxRowsPerGroupPerID("cell", c)).groupby(keys))

    queries = [
        ("count_distinct", QueryBuilder("events").enforce(MaxGroupsPerID("cell", L)).groupby(keys)
         .count_distinct(["caller_id"], name="count_distinct")),
        ("count", per_cell().count(name="count")),
        ("sum_duration", per_cell().sum("duration", lo, hi, name="sum_duration")),
        ("p50_duration", per_cell().median("duration", lo, hi, name="p50_duration")),
    ]
    part = args["epsilon"] / len(queries)
    for i, (name, q) in enumerate(queries):
        budget = PureDPBudget(part) if i < len(queries) - 1 else sess.remaining_privacy_budget
        sess.evaluate(q, budget).write.parquet(os.path.join(out, name))
'''

_PIPELINEDP = r'''
import pipeline_dp

def query(src, out):
    from pyspark.sql import functions as F
    rdd = (spark.read.parquet(src)
           .select("caller_id", (F.col("tower_id") * 24 + F.col("hour")).alias("cell"), "duration").rdd.map(tuple))
    acc = pipeline_dp.NaiveBudgetAccountant(total_epsilon=args["epsilon"], total_delta=0)
    engine = pipeline_dp.DPEngine(acc, pipeline_dp.SparkRDDBackend(spark.sparkContext))
    M = pipeline_dp.Metrics
    params = pipeline_dp.AggregateParams(noise_kind=pipeline_dp.NoiseKind.LAPLACE,
                                         metrics=[M.PRIVACY_ID_COUNT, M.COUNT, M.SUM, M.MEAN, M.PERCENTILE(50)],
                                         max_partitions_contributed=args["max_keys"],
                                         max_contributions_per_partition=args["max_events_per_key"],
                                         min_value=args["lo"], max_value=args["hi"])
    ext = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1],
                                     value_extractor=lambda r: r[2])
    res = engine.aggregate(rdd, params, ext, public_partitions=list(range(args["cells"])))
    acc.compute_budgets()
    rows = res.map(lambda kv: (int(kv[0]), float(kv[1].privacy_id_count), float(kv[1].count), float(kv[1].sum),
                               float(kv[1].mean), float(kv[1].percentile_50)))
    rows.toDF(["cell", "count_distinct", "count", "sum_duration", "mean_duration", "p50_duration"]).write.parquet(out)
'''

#: what each peer's output holds, and how its mean is made
PEER_NOTES = {
    "tumult": "four queries of one Session at epsilon/4 each (count_distinct; count, sum and median after "
              "MaxGroupsPerID(cell, L) and MaxRowsPerGroupPerID(cell, c)); mean = noisy sum / noisy count "
              "clipped to [lo, hi], the clamp's centre where the noisy count is not positive (sparkpriv's "
              "post-processing of its own mean; Tumult has no query of several aggregates, and its average() "
              "would need a fifth share of the budget)",
    "pipelinedp": "one DPEngine.aggregate of PRIVACY_ID_COUNT, COUNT, SUM, MEAN, PERCENTILE(50); its budget "
                  "accountant gives epsilon/4 to each of the distinct count, MEAN's count, MEAN's sum (COUNT and "
                  "SUM are those of MEAN) and the quantile tree; its mean is not clipped to [lo, hi] and its sum "
                  "is that mean x the noisy count",
}


# --------------------------------------------------------------------------- outputs as dense arrays

def _cells(t, column_names) -> dict:
    """``{column: float64 array (TOWERS * HOURS,)}`` of a pyarrow table keyed by ``tower_id, hour``
    or by ``cell``; a cell absent from the table is NaN."""
    import numpy as np

    if "cell" in t.column_names:
        idx = t.column("cell").to_numpy().astype(np.int64)
    else:
        idx = t.column("tower_id").to_numpy().astype(np.int64) * HOURS + t.column("hour").to_numpy().astype(np.int64)
    out = {}
    for c in column_names:
        if c not in t.column_names:
            continue
        v = np.full(TOWERS * HOURS, np.nan)
        v[idx] = t.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
        out[c] = v
    return out


def _read_sparkpriv(path: str) -> dict:
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    cols = [f"{a}{s}" for a in AGGREGATES for s in ("", "_std", "_ci_low", "_ci_high")]
    return _cells(t, cols)


def _read_peer(name: str, path: str, lo: float, hi: float) -> dict:
    import numpy as np
    import pyarrow.parquet as pq

    if name == "tumult":
        out = {}
        for a in ("count_distinct", "count", "sum_duration", "p50_duration"):
            out.update(_cells(pq.read_table(os.path.join(path, a)), [a]))
        n = out["count"]
        with np.errstate(divide="ignore", invalid="ignore"):  # sparkpriv's post-processing of its mean
            out["mean_duration"] = np.where(n > 0, np.clip(out["sum_duration"] / n, lo, hi), (lo + hi) / 2.0)
        return out
    return _cells(pq.read_table(path), AGGREGATES)


def exact_answers(spark, table: str) -> dict:
    """The exact non-private answer of every cell (``AGGREGATES``; the exact ``percentile`` for the
    median), as dense arrays; NaN for the mean and the median of a cell without calls."""
    import numpy as np
    import pyarrow as pa

    pdf = _nonprivate_query(spark.read.parquet(table), exact=True).toPandas()
    t = pa.Table.from_pandas(pdf, preserve_index=False)
    out = _cells(t, AGGREGATES)
    for a in ("count_distinct", "count", "sum_duration"):
        out[a] = np.nan_to_num(out[a], nan=0.0)
    return out


def _errors(truth: dict, released: dict) -> dict:
    """Per aggregate: mean and median absolute error over the cells (cells with calls for the mean and
    median), and the mean absolute error by quartile of the cells' true number of calls."""
    import numpy as np

    calls = truth["count"]
    busy = calls > 0
    q = np.quantile(calls[busy], [0.25, 0.5, 0.75]) if busy.any() else np.zeros(3)
    bins = np.digitize(calls, q)
    out = {}
    for a in AGGREGATES:
        if a not in released:
            out[a] = None
            continue
        cells = busy if a in ("mean_duration", "p50_duration") else np.ones_like(busy)
        err = np.abs(released[a] - truth[a])
        missing = cells & np.isnan(err)
        ok = cells & ~np.isnan(err)
        out[a] = {"mean_abs_error": float(np.mean(err[ok])) if ok.any() else None,
                  "median_abs_error": float(np.median(err[ok])) if ok.any() else None,
                  "mean_abs_error_by_calls_quartile": [float(np.mean(err[ok & busy & (bins == i)]))
                                                       if (ok & busy & (bins == i)).any() else None
                                                       for i in range(4)],
                  "cells": int(ok.sum()), "missing_cells": int(missing.sum())}
    return out


def _stated(sp: dict, truth: dict) -> dict:
    """sparkpriv's stated noise std (mean and median over the cells) and its intervals' coverage of the
    exact answers."""
    import numpy as np

    busy = truth["count"] > 0
    out = {}
    for a in AGGREGATES:
        cells = busy if a in ("mean_duration", "p50_duration") else np.ones_like(busy)
        std = sp.get(f"{a}_std")
        lo, hi = sp.get(f"{a}_ci_low"), sp.get(f"{a}_ci_high")
        d = {}
        if std is not None:  # the median too: a mean's std is large where the noisy count is near 0
            d["mean_stated_std"] = float(np.nanmean(std[cells]))
            d["median_stated_std"] = float(np.nanmedian(std[cells]))
        if lo is not None and hi is not None:
            d["coverage_of_exact_answer"] = float(np.mean((lo[cells] <= truth[a][cells]) &
                                                          (truth[a][cells] <= hi[cells])))
        out[a] = d
    return out


# --------------------------------------------------------------------------- run

def run(*, people: int, max_keys: int = 32, max_events_per_key: int = 4, lo: float = 0.0, hi: float = 3600.0,
        epsilon: float = 1.0, data_dir: str = "./bench-data", repeats: int = 3, master: str = "local[2]",
        driver_memory: str = "6g", shuffle_partitions: int | None = None, warmup_people: int | None = None,
        tumult_python: str | None = None, pipelinedp_python: str | None = None, peer_repeats: int | None = None,
        peer_warmup_people: int | None = None, peer_timeout: int = 7200, nonprivate_form: str = "split",
        utility: bool = True, keep_outputs: bool = False) -> dict:
    """Run the benchmark (module docstring); returns the figures printed as the last line.
    ``keep_outputs``: keep the last repeat's outputs and the table (paths in ``"outputs"``)."""
    import numpy as np
    import pyarrow.parquet as pq

    spark, sp, data_dir = open_bench("aggregates", people, data_dir, master, driver_memory, shuffle_partitions)
    table = _ensure(spark, data_dir, people)
    warm = min(people, warmup_people or _WARMUP_PEOPLE)
    small = _ensure(spark, data_dir, warm)
    events = spark.read.parquet(table).count()
    opts = {"max_keys": max_keys, "max_events_per_key": max_events_per_key, "lo": lo, "hi": hi, "epsilon": epsilon}
    pipes = {"sparkpriv": lambda src, out: _run_sparkpriv(spark, src, out, **opts),
             "nonprivate": lambda src, out: _run_nonprivate(spark, src, out, nonprivate_form)}
    runs = alternate(pipes, table, small, data_dir, repeats,
                     prime=lambda: spark.read.parquet(table).write.format("noop").mode("overwrite").save())
    times, cpu, kept = runs["seconds"], runs["cpu"], runs["output"]
    owner = runs["result"]["sparkpriv"]  # the bounding's owner diagnostics (never released)
    peers = {}
    peer_small = _ensure(spark, data_dir, min(people, peer_warmup_people)) if peer_warmup_people else small
    cfg = {"master": master, "driver_memory": driver_memory, "shuffle_partitions": sp, "cells": TOWERS * HOURS,
           "table": table, "data_dir": data_dir, "warmup": peer_small, "repeats": peer_repeats or repeats,
           "timeout": peer_timeout, **opts}
    for name, py, script in (("tumult", tumult_python, _TUMULT), ("pipelinedp", pipelinedp_python, _PIPELINEDP)):
        if py:
            _log.info("running peer %s", name)
            peers[name] = run_peer(name, py, script, cfg)
    med = {n: float(np.median(ts)) for n, ts in times.items()}
    cpu_med = {n: float(np.median([c for c in cs if c is not None])) if any(c is not None for c in cs) else None
               for n, cs in cpu.items()}
    result = {
        "benchmark": "aggregates",
        "people": people,
        "events": events,
        "cells": TOWERS * HOURS,
        "query": "per tower x hour: count_distinct(caller_id), count, sum, mean and median of duration",
        "nonprivate_form": nonprivate_form,
        "max_keys": max_keys,
        "max_events_per_key": max_events_per_key,
        "clamp": [lo, hi],
        "epsilon": epsilon,
        **timing_figures(runs),
        "master": master,
        "shuffle_partitions": sp,
        "cpu_count": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 1),
        "repeats": repeats,
        "warmup_people": warm,
        "peer_repeats": peer_repeats or repeats,
        "peer_warmup_people": min(people, peer_warmup_people) if peer_warmup_people else warm,
        "people_truncated": owner.get("people_truncated"),
        "events_beyond_cap": owner.get("events_beyond_cap"),
        "values_clamped": owner.get("values_clamped"),
    }
    faster = None
    for name, p in peers.items():
        if "error" in p:
            result[f"{name}_error"] = p["error"]
            continue
        result[f"{name}_note"] = PEER_NOTES[name]
        result[f"{name}_seconds_each_repeat"] = rounded(p["seconds_each_repeat"], 2)
        result[f"{name}_cpu_seconds_each_repeat"] = rounded(p["cpu_seconds_each_repeat"])
        result[f"{name}_median_seconds"] = round(float(np.median(p["seconds_each_repeat"])), 2)
        result[f"{name}_over_sparkpriv"] = round(float(np.median(p["seconds_each_repeat"])) / med["sparkpriv"], 2)
        if cpu_med["sparkpriv"]:
            result[f"{name}_cpu_over_sparkpriv"] = round(float(np.median(p["cpu_seconds_each_repeat"]))
                                                         / cpu_med["sparkpriv"], 2)
        if faster is None or result[f"{name}_median_seconds"] < result[f"{faster}_median_seconds"]:
            faster = name
    if faster is not None:
        result["faster_peer"] = faster
        result["faster_peer_over_sparkpriv"] = result[f"{faster}_over_sparkpriv"]
    if utility:
        truth = exact_answers(spark, table)
        sp_out = _read_sparkpriv(kept["sparkpriv"])
        np_out = _cells(pq.read_table(kept["nonprivate"]), AGGREGATES)
        released = {"sparkpriv": sp_out, "nonprivate": np_out}
        for name, p in peers.items():
            if "error" not in p:
                try:
                    released[name] = _read_peer(name, p["output"], lo, hi)
                except Exception as exc:  # a peer's output we cannot read is reported, not fatal
                    result[f"{name}_utility_error"] = f"{type(exc).__name__}: {exc}"
        result["errors"] = {n: _errors(truth, r) for n, r in released.items()}
        result["sparkpriv_stated"] = _stated(sp_out, truth)
        result["true_calls_quartile_upper_bounds"] = [float(x) for x in np.quantile(truth["count"][truth["count"] > 0],
                                                                                    [0.25, 0.5, 0.75, 1.0])]
    outputs = list(kept.values()) + [p.get("output") for p in peers.values() if p.get("output")]
    if keep_outputs:
        result["outputs"] = {**kept, **{n: p["output"] for n, p in peers.items() if p.get("output")}, "table": table}
    else:
        for o in outputs:
            shutil.rmtree(o, ignore_errors=True)
    _print_table(result, med, peers)
    print(json.dumps(result))
    return result


def _print_table(result: dict, med: dict, peers: dict) -> None:
    print(f"{'pipeline':<90}{'median s':>10}  each repeat (wall s / own CPU-s)")
    label_b = ("(b) groupBy(tower, hour).agg(countDistinct, count, sum, avg, percentile_approx) + write"
               if result["nonprivate_form"] == "single" else
               "(b) groupBy.agg(countDistinct) join groupBy.agg(count, sum, avg, percentile_approx) + write")
    rows = [("(a) sparkpriv Aggregates (L=%d, c=%d, Laplace) + write" % (result["max_keys"],
                                                                       result["max_events_per_key"]), ""),
            (label_b, "nonprivate_")]
    for label, pre in rows:
        each = ", ".join(f"{s}/{c}" for s, c in zip(result[f"{pre}seconds_each_repeat"],
                                                  result[f"{pre}cpu_seconds_each_repeat"]))
        print(f"{label:<90}{result[pre + 'median_seconds']:>10.2f}  {each}")
    for name in peers:
        if f"{name}_median_seconds" in result:
            each = ", ".join(f"{s}/{c}" for s, c in zip(result[f"{name}_seconds_each_repeat"],
                                                      result[f"{name}_cpu_seconds_each_repeat"]))
            print(f"{'(peer) ' + name:<90}{result[name + '_median_seconds']:>10.2f}  {each}")
        else:
            print(f"(peer) {name}: {result[name + '_error']}")
    print(f"sparkpriv / non-private, each repeat: {result['ratio_each_repeat']} (median {result['ratio_median']})")
    if "faster_peer" in result:
        print(f"faster peer {result['faster_peer']}: {result['faster_peer_over_sparkpriv']}x sparkpriv's median time")
    if "errors" in result:
        print(f"{'mean abs error per cell':<24}" + "".join(f"{a:>16}" for a in AGGREGATES))
        for n, e in result["errors"].items():
            print(f"{n:<24}" + "".join(f"{_or_nan((e[a] or {}).get('mean_abs_error')):>16.3f}"
                                       for a in AGGREGATES))
        st = result["sparkpriv_stated"]
        print(f"{'sparkpriv median std':<24}" + "".join(f"{_or_nan(st[a].get('median_stated_std')):>16.3f}"
                                                       for a in AGGREGATES))


def _or_nan(x) -> float:
    return float("nan") if x is None else float(x)


if __name__ == "__main__":  # pragma: no cover
    from sparkpriv.bench import module_main

    sys.exit(module_main("aggregates"))
