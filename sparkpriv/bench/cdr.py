"""``sparkpriv bench cdr``: a call-detail-record release at scale against its floor.

On one CDR event table of ``--people`` people (generated once by
:func:`~sparkpriv.spark.generate_events.generate_cdr` under ``--data-dir`` and
reused by later runs of the same size), in one run, on one SparkSession, it
times two pipelines that read the events and write a Parquet table:

a. ``sparkpriv``: :func:`~sparkpriv.spark.events.bound_contributions` (at most
   ``--max-items`` towers per person, keyed uniform choice) +
   :func:`~sparkpriv.api.release_projection` (``k = --k``,
   Laplace, sparse records) + ``Release.write``;
b. ``floor``: the same ``groupBy(person)`` collecting each person's towers,
   written with plain Spark SQL (no bounding, projection, noise or receipt).

It reports seconds, events, ``ratio_vs_floor`` = a / b (best of the repeats
of each), ``ratio_median_of_repeats`` (the median of each repeat's a / b: the
two run back to back, in alternating order, so a repeat's ratio sees one
machine state; on the development machine the same pipeline's time moved by
tens of percent between repeats, docs/research/cdr-figures.md) and the driver's peak
memory: the Python driver's and the JVM's peak resident set (``VmHWM`` from
``/proc``, reset before the timed runs). Under ``local[*]`` the executors run
inside the driver JVM, so the JVM figure includes them. The last line is JSON.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
import uuid

__all__ = ["add_arguments", "run_from_args", "run"]

_log = logging.getLogger(__name__)
_WARMUP_PEOPLE = 1_000_000  # default warm-up table: min(people, this)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--people", type=int, default=1_000_000, help="people in the CDR table [default: 1000000]")
    parser.add_argument("--k", type=int, default=64, help="projection dimension [default: 64]")
    parser.add_argument("--max-items", type=int, default=32, help="towers kept per person [default: 32]")
    parser.add_argument("--epsilon", type=float, default=1.0, help="epsilon of the release [default: 1.0]")
    parser.add_argument("--data-dir", default="./bench-data", help="where tables and outputs go [default: ./bench-data]")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of each pipeline, best kept [default: 1]")
    parser.add_argument("--master", default="local[2]", help="Spark master [default: local[2]]")
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory [default: 4g]")
    parser.add_argument("--writer", default="auto", choices=("auto", "spark", "arrow"),
                        help="who writes the release's part files (Release.write) [default: auto]")
    parser.add_argument("--warmup-people", type=int, default=None,
                        help="people in the table each pipeline runs on once, untimed, first "
                             f"[default: min(--people, {_WARMUP_PEOPLE})]")
    parser.add_argument("--shuffle-partitions", type=int, default=None,
                        help="spark.sql.shuffle.partitions [default: one per 250k people, at least 8]")


def run_from_args(args: argparse.Namespace) -> dict:
    from sparkpriv.errors import ParameterError

    for name in ("people", "k", "max_items", "repeats") + (("warmup_people",) if args.warmup_people is not None else ()):
        if getattr(args, name) < 1:
            raise ParameterError(f"--{name.replace('_', '-')} must be a positive integer. Got {getattr(args, name)}.")
    return run(people=args.people, k=args.k, max_items=args.max_items, epsilon=args.epsilon,
               data_dir=args.data_dir, repeats=args.repeats, master=args.master,
               driver_memory=args.driver_memory, shuffle_partitions=args.shuffle_partitions, writer=args.writer,
               warmup_people=args.warmup_people)


def _compiled_status() -> str:
    """Whether the noise/projection kernels were compiled (the driver's view; local
    executors share its environment)."""
    from sparkpriv.privacy import _compiled

    return _compiled.status()


def _vm_hwm_kb(pid) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm(pid) -> None:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _jvm_pid(spark) -> int | None:
    try:
        return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:
        return None


def _ensure_table(spark, data_dir: str, people: int, seed: int = 0) -> tuple[str, float]:
    from sparkpriv.spark.generate_events import generate_cdr

    path = os.path.join(data_dir, f"cdr-{people}-s{seed}")
    if os.path.exists(os.path.join(path, "_SUCCESS")):
        return path, 0.0
    t = time.perf_counter()
    generate_cdr(spark, people=people, seed=seed).write.mode("overwrite").parquet(path)
    return path, time.perf_counter() - t


def _run_sparkpriv(spark, src, out, k, max_items, epsilon, writer):
    from sparkpriv.io.writer import check_output_path, choose_writer
    from sparkpriv.spark.events import bound_contributions
    from sparkpriv.api import release_projection

    ev = spark.read.parquet(src)
    recs = bound_contributions(ev, person="caller_id", item="tower_id", max_items=max_items,
                               vocabulary=range(0, 1303), source=src)
    rel = release_projection(recs, k=k, epsilon=epsilon)
    used = choose_writer(spark, check_output_path(spark, out, False), rel.rows, writer)
    rel.write(out, writer=writer)
    return dict(rel.diagnostics(), writer=used)


def _run_floor(spark, src, out):
    from pyspark.sql import functions as F

    ev = spark.read.parquet(src)
    ev.groupBy("caller_id").agg(F.collect_set("tower_id").alias("towers")).write.parquet(out)


def _machine_cpu() -> tuple[float, float] | None:
    """(busy, steal) CPU-seconds of the whole machine so far (:func:`sparkpriv.bench._timing.machine_cpu`)."""
    from sparkpriv.bench._timing import machine_cpu

    return machine_cpu()


def _timed(data_dir, fn, cpu=None):
    """Run ``fn(out)``; returns (seconds, result). ``cpu``, a list, gets the run's
    machine (busy, steal) CPU-seconds appended."""
    out = os.path.join(data_dir, f"out-{uuid.uuid4().hex[:8]}")
    c0 = _machine_cpu()
    t = time.perf_counter()
    try:
        res = fn(out)
        secs = time.perf_counter() - t
        c1 = _machine_cpu()
        if cpu is not None and c0 and c1:
            cpu.append((c1[0] - c0[0], c1[1] - c0[1]))
        return secs, res
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run(*, people: int, k: int = 64, max_items: int = 32, epsilon: float = 1.0, data_dir: str = "./bench-data",
        repeats: int = 1, master: str = "local[2]", driver_memory: str = "4g",
        shuffle_partitions: int | None = None, writer: str = "auto", warmup_people: int | None = None) -> dict:
    from sparkpriv.bench._timing import open_bench

    spark, sp, data_dir = open_bench("cdr", people, data_dir, master, driver_memory, shuffle_partitions)
    table, gen_secs = _ensure_table(spark, data_dir, people)
    warm = min(people, warmup_people or _WARMUP_PEOPLE)
    small, _ = _ensure_table(spark, data_dir, warm)
    events = spark.read.parquet(table).count()
    _log.info("table %s: %d people, %d events (generated in %.1f s)", table, people, events, gen_secs)
    pipes = {"sparkpriv": lambda src, out: _run_sparkpriv(spark, src, out, k, max_items, epsilon, writer),
             "floor": lambda src, out: _run_floor(spark, src, out)}
    # warm-up: JVM classes and JIT, Python workers and kernels. A small table is not enough: the
    # first full-size run after a 20,000-people warm-up took 15.9 s against 7.3-8.6 s later at 1 M
    # people (without any warm-up the first run's JVM used 30.7 CPU-s against about 12 later);
    # after a 1 M warm-up the three repeats took 10.9-11.2 s.
    for name, fn in pipes.items():
        _timed(data_dir, lambda out, fn=fn: fn(small, out))
    # and one read of the table's two columns, so that neither pipeline's first timed run
    # is the one that reads the table from disk into the page cache
    spark.read.parquet(table).select("caller_id", "tower_id").write.format("noop").mode("overwrite").save()
    jvm = _jvm_pid(spark)
    _reset_hwm(os.getpid())
    if jvm:
        _reset_hwm(jvm)
    load_start = os.getloadavg()
    times: dict[str, list[float]] = {name: [] for name in pipes}
    cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in pipes}
    diag = {}
    for rep in range(repeats):
        order = list(pipes) if rep % 2 == 0 else list(pipes)[::-1]
        for name in order:
            secs, res = _timed(data_dir, lambda out, name=name: pipes[name](table, out), cpu[name])
            if name == "sparkpriv":
                diag = res
            times[name].append(secs)
            _log.info("%s: %.1f s", name, secs)
    best = {name: min(ts) for name, ts in times.items()}
    # each repeat runs both pipelines back to back: its ratio sees the same machine state
    paired = sorted(a / b for a, b in zip(times["sparkpriv"], times["floor"]))
    load_end = os.getloadavg()
    py_hwm, jvm_hwm = _vm_hwm_kb(os.getpid()), (_vm_hwm_kb(jvm) if jvm else None)
    result = {
        "benchmark": "cdr",
        "people": people,
        "events": events,
        "k": k,
        "max_items": max_items,
        "seconds": round(best["sparkpriv"], 2),
        "floor_seconds": round(best["floor"], 2),
        "ratio_vs_floor": round(best["sparkpriv"] / best["floor"], 3),
        "ratio_median_of_repeats": round(paired[len(paired) // 2] if len(paired) % 2
                                         else (paired[len(paired) // 2 - 1] + paired[len(paired) // 2]) / 2, 3),
        "seconds_each_repeat": [round(t, 2) for t in times["sparkpriv"]],
        "floor_seconds_each_repeat": [round(t, 2) for t in times["floor"]],
        # the machine's CPU-seconds over each run (all processes: the JVM, its Python
        # workers, anything else) and the steal time, which a busy virtual machine loses
        "cpu_seconds_each_repeat": [round(c[0], 1) for c in cpu["sparkpriv"]],
        "floor_cpu_seconds_each_repeat": [round(c[0], 1) for c in cpu["floor"]],
        "steal_seconds_each_repeat": [round(c[1], 1) for c in cpu["sparkpriv"]],
        "floor_steal_seconds_each_repeat": [round(c[1], 1) for c in cpu["floor"]],
        "microseconds_per_event": round(1e6 * best["sparkpriv"] / events, 3),
        "floor_microseconds_per_event": round(1e6 * best["floor"] / events, 3),
        "driver_python_peak_rss_mb": None if py_hwm is None else round(py_hwm / 1024, 1),
        "driver_jvm_peak_rss_mb": None if jvm_hwm is None else round(jvm_hwm / 1024, 1),
        "people_truncated": diag.get("people_truncated"),
        "writer": diag.get("writer"),
        "compiled_kernels": _compiled_status(),
        "generate_seconds": round(gen_secs, 1),
        "master": master,
        "shuffle_partitions": sp,
        "cpu_count": os.cpu_count(),
        "load_average_start_end": [round(load_start[0], 1), round(load_end[0], 1)],
        "repeats": repeats,
        "warmup_people": warm,
    }
    print(f"{'pipeline':<48}{'seconds':>10}{'us/event':>10}")
    print(f"{'(a) bound_contributions + projection k=%d + write' % k:<48}{best['sparkpriv']:>10.1f}"
          f"{result['microseconds_per_event']:>10.2f}")
    print(f"{'(b) floor: groupBy + collect_set + write':<48}{best['floor']:>10.1f}"
          f"{result['floor_microseconds_per_event']:>10.2f}")
    print(json.dumps(result))
    return result
