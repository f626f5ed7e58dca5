"""``sparkpriv bench synthetic-scale``: the synthetic release at catalogue sizes, against the non-private query.

On one event table of ``--people`` people over ``--items`` items (a Zipf catalogue, 1.1 the
exponent, a geometric number of distinct items per person with mean ``--mean-items``; written
once as Parquet under ``--data-dir`` by numpy and pyarrow, no Spark), in one run and one
SparkSession, it times, in alternating order, ``--repeats`` times after one untimed warm-up:

a. ``release``: ``sparkpriv release synthetic --events --max-items auto`` (bounding, the DP
   quantile of the items per person, the per-item counts; model file and receipt written);
b. ``synthesize``: ``sparkpriv synthesize`` of ``--people`` synthetic people from that release;
c. ``nonprivate``: the same table's per-item distinct people by ``groupBy(item)
   .agg(countDistinct(person))``, written as Parquet (the floor a release cannot beat).

Every repeat is printed with its wall seconds; the last line is JSON with the ratios
``release / nonprivate`` of the medians. The driver holds the per-item counts (``O(d)``) and
never the people: memory does not grow with ``--people``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import time

import numpy as np

__all__ = ["add_arguments", "run_from_args", "write_table"]

_log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--people", type=int, default=100_000, help="people in the table [default: 100000]")
    p.add_argument("--items", type=int, default=16_000, help="items in the catalogue [default: 16000]")
    p.add_argument("--mean-items", type=float, default=10.0, help="mean distinct items per person [default: 10]")
    p.add_argument("--epsilon", type=float, default=1.0, help="epsilon of the release [default: 1]")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each step [default: 3]")
    p.add_argument("--data-dir", default="./bench-data", help="where the table and outputs go")
    p.add_argument("--master", default=None, help="Spark master [default: the library's local default]; e.g. "
                   "local-cluster[2,1,3072] for two executor JVMs of one core")
    p.add_argument("--executor-memory", default=None, help="spark.executor.memory, e.g. 2g (a cluster master)")
    p.add_argument("--driver-memory", default=None, help="spark.driver.memory, e.g. 1g [default: sized to the machine]")


def write_table(path: str, people: int, items: int, mean_items: float, seed: int = 0) -> int:
    """The event table (``person``, ``item`` int64) as Parquet at ``path``; returns its rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, items + 1) ** 1.1
    cdf = np.cumsum(weights / weights.sum())
    os.makedirs(path, exist_ok=True)
    rows, block = 0, 250_000
    for b, start in enumerate(range(0, people, block)):
        m = min(block, people - start)
        length = rng.geometric(1.0 / mean_items, size=m)
        person = np.repeat(np.arange(start, start + m, dtype=np.int64), length)
        item = np.minimum(np.searchsorted(cdf, rng.random(person.size), side="right"), items - 1).astype(np.int64)
        pq.write_table(pa.table({"person": person, "item": item}), os.path.join(path, f"part-{b:05d}.parquet"))
        rows += person.size
    return rows


def run_from_args(args) -> dict:
    from pyspark.sql import functions as F

    from sparkpriv.cli import main as cli
    from sparkpriv.spark.session import get_spark

    if min(args.people, args.items, args.repeats) < 1:
        raise SystemExit("--people, --items and --repeats must be positive")
    base = os.path.abspath(args.data_dir)
    src = os.path.join(base, f"zipf-{args.people}x{args.items}-{args.mean_items:g}")
    if not os.path.exists(os.path.join(src, "_DONE")):
        shutil.rmtree(src, ignore_errors=True)
        rows = write_table(src, args.people, args.items, args.mean_items)
        open(os.path.join(src, "_DONE"), "w").write(str(rows))
    rows = int(open(os.path.join(src, "_DONE")).read())
    print(f"table: {src} ({args.people:,} people, {args.items:,} items, {rows:,} events)", flush=True)
    conf = {k: v for k, v in (("spark.master", args.master), ("spark.executor.memory", args.executor_memory),
                              ("spark.driver.memory", args.driver_memory)) if v}
    spark = get_spark(conf or None, size_local_driver=args.driver_memory is None)
    print("spark: " + ", ".join(f"{k}={spark.conf.get(k, 'default')}" for k in
                                ("spark.master", "spark.driver.memory", "spark.executor.memory")), flush=True)
    out = os.path.join(base, "synthetic-scale")
    ledger_file = os.path.join(base, "synthetic-scale-ledger.sqlite")
    for suffix in ("", "-wal", "-shm"):  # the benchmark's own ledger, fresh every run
        if os.path.exists(ledger_file + suffix):
            os.remove(ledger_file + suffix)
    ledger = f"sqlite:///{ledger_file}"
    from sparkpriv.ledger import open_ledger

    with open_ledger(ledger) as led:
        led.set_budget("bench.zipf", epsilon=1e5, delta=1e-3, reason="benchmark runs (not a real table)")

    def release():
        shutil.rmtree(out + "/release", ignore_errors=True)
        rc = cli(["release", "synthetic", "--input", src, "--events", "--person-col", "person", "--item-col", "item",
                  "--vocabulary", f"0..{args.items - 1}", "--max-items", "auto", "--epsilon", str(args.epsilon),
                  "--delta", f"{1.0 / (10 * args.people):.3g}", "--output", out + "/release", "--ledger", ledger,
                  "--table-id", "bench.zipf", "--log-level", "WARNING"])
        assert rc == 0, rc

    def synthesize():
        shutil.rmtree(out + "/synthetic", ignore_errors=True)
        rc = cli(["synthesize", "--model", out + "/release", "--rows", str(args.people), "--output", out + "/synthetic",
                  "--log-level", "WARNING"])
        assert rc == 0, rc

    def nonprivate():
        shutil.rmtree(out + "/nonprivate", ignore_errors=True)
        (spark.read.parquet(src).groupBy("item").agg(F.countDistinct("person").alias("people"))
         .write.parquet(out + "/nonprivate"))

    steps = {"release": release, "synthesize": synthesize, "nonprivate": nonprivate}
    for fn in steps.values():  # untimed warm-up
        fn()
    times: dict = {k: [] for k in steps}
    for r in range(args.repeats):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))
        for k in order:
            t = time.perf_counter()
            steps[k]()
            times[k].append(time.perf_counter() - t)
            print(f"repeat {r + 1}: {k:<11} {times[k][-1]:7.1f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"benchmark": "synthetic-scale", "people": args.people, "items": args.items, "events": rows,
           "seconds": {k: [round(x, 2) for x in v] for k, v in times.items()},
           "median": {k: round(v, 2) for k, v in med.items()},
           "release_over_nonprivate": round(med["release"] / med["nonprivate"], 2),
           "synthesize_over_nonprivate": round(med["synthesize"] / med["nonprivate"], 2)}
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    from sparkpriv.bench import module_main

    raise SystemExit(module_main("synthetic_scale"))
