"""What the benchmarks against the non-private query and the peers share (``bench counts``,
``bench aggregates``): CPU-seconds from ``/proc``, a timed pipeline, the generated CDR table,
warm-up and alternating repeats on one SparkSession, and a peer run in its own Python and process.

CPU-seconds are counted two ways: of the benchmark's own processes (the driver, its JVM and the
JVM's Python workers, from ``/proc/<pid>/stat``, sampled while a pipeline runs so that workers that
end meanwhile still count: :class:`TreeCpu`) and of the whole machine (``/proc/stat``, which on a
shared machine includes other people's work).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from sparkpriv.bench import _treecpu
from sparkpriv.bench._treecpu import TreeCpu

__all__ = ["machine_cpu", "TreeCpu", "timed", "ensure_table", "alternate", "run_peer", "PEER_COMMON",
           "rounded", "add_run_arguments", "open_bench", "timing_figures"]

_log = logging.getLogger(__name__)


def add_run_arguments(parser, warmup_people: int) -> None:
    """The options every benchmark against the peers takes (where it runs, how often, the peers'
    interpreters); ``warmup_people``: the default size of the untimed warm-up table."""
    parser.add_argument("--data-dir", default="./bench-data", help="where tables and outputs go [default: ./bench-data]")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each pipeline [default: 3]")
    parser.add_argument("--master", default="local[2]", help="Spark master [default: local[2]]")
    parser.add_argument("--driver-memory", default="6g", help="spark.driver.memory [default: 6g]")
    parser.add_argument("--shuffle-partitions", type=int, default=None,
                        help="spark.sql.shuffle.partitions [default: one per 250k people, at least 8]")
    parser.add_argument("--warmup-people", type=int, default=None,
                        help=f"people in the untimed warm-up table [default: min(--people, {warmup_people})]")
    parser.add_argument("--tumult-python", default=None,
                        help="python of a virtual environment with tmlt.analytics (runs the Tumult peer)")
    parser.add_argument("--pipelinedp-python", default=None,
                        help="python of a virtual environment with pipeline-dp and pyspark (runs the PipelineDP peer)")
    parser.add_argument("--peer-repeats", type=int, default=None, help="timed runs of each peer [default: --repeats]")


def open_bench(name: str, people: int, data_dir: str, master: str, driver_memory: str,
               shuffle_partitions: int | None):
    """``(spark, shuffle partitions, absolute data_dir)`` of a benchmark run: one SparkSession named
    ``sparkpriv-bench-<name>``, one shuffle partition per 250k people (at least 8) unless given."""
    from sparkpriv.spark.session import get_spark

    data_dir = os.path.abspath(data_dir)
    os.makedirs(data_dir, exist_ok=True)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    sp = shuffle_partitions or max(8, -(-people // 250_000))
    spark = get_spark({"spark.driver.memory": driver_memory, "spark.sql.shuffle.partitions": str(sp)},
                      app_name=f"sparkpriv-bench-{name}", master=master)
    return spark, sp, data_dir


def timing_figures(runs: dict) -> dict:
    """The result's timing entries from :func:`alternate`'s ``runs`` (pipelines ``sparkpriv`` and
    ``nonprivate``): every repeat's wall and CPU-seconds, the medians and the paired ratios."""
    import numpy as np

    times, cpu, mcpu = runs["seconds"], runs["cpu"], runs["machine_cpu"]
    paired = [a / b for a, b in zip(times["sparkpriv"], times["nonprivate"])]
    return {"seconds_each_repeat": rounded(times["sparkpriv"], 2),
            "nonprivate_seconds_each_repeat": rounded(times["nonprivate"], 2),
            "cpu_seconds_each_repeat": rounded(cpu["sparkpriv"]),
            "nonprivate_cpu_seconds_each_repeat": rounded(cpu["nonprivate"]),
            "machine_cpu_seconds_each_repeat": rounded(mcpu["sparkpriv"]),
            "nonprivate_machine_cpu_seconds_each_repeat": rounded(mcpu["nonprivate"]),
            "median_seconds": round(float(np.median(times["sparkpriv"])), 2),
            "nonprivate_median_seconds": round(float(np.median(times["nonprivate"])), 2),
            "ratio_each_repeat": [round(r, 3) for r in paired],
            "ratio_median": round(float(np.median(paired)), 3)}


def machine_cpu() -> tuple[float, float] | None:
    """(busy, steal) CPU-seconds of the whole machine so far (``/proc/stat``)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / hz, v[7] / hz


def timed(fn, out: str) -> tuple[float, float | None, float | None, object]:
    """``fn(out)`` timed: ``(wall seconds, own CPU-seconds, machine CPU-seconds, its result)``; a
    CPU figure is None when it cannot be read."""
    with TreeCpu() as own:
        m0, t = machine_cpu(), time.perf_counter()
        res = fn(out)
        secs = time.perf_counter() - t
        m1 = machine_cpu()
    return secs, own.seconds, (m1[0] - m0[0]) if (m0 and m1) else None, res


def ensure_table(spark, data_dir: str, people: int, seed: int = 0, *, name: str = "cdr", build=None) -> str:
    """The Parquet table ``<data_dir>/<name>-<people>-s<seed>``, written once and reused:
    ``build(spark, people, seed)`` (default: :func:`~sparkpriv.spark.generate_events.generate_cdr`)."""
    if build is None:
        from sparkpriv.spark.generate_events import generate_cdr

        def build(spark, people, seed):
            return generate_cdr(spark, people=people, seed=seed)

    path = os.path.join(data_dir, f"{name}-{people}-s{seed}")
    if not os.path.exists(os.path.join(path, "_SUCCESS")):
        t = time.perf_counter()
        build(spark, people, seed).write.mode("overwrite").parquet(path)
        _log.info("generated %s in %.1f s", path, time.perf_counter() - t)
    return path


def alternate(pipes: dict, table: str, small: str, data_dir: str, repeats: int, *, prime=None) -> dict:
    """Each pipeline ``pipes[name](src, out)`` once untimed on ``small`` (JVM, JIT, Python workers),
    then ``repeats`` timed runs on ``table``, back to back, the order alternating; every repeat
    printed. ``prime()`` (e.g. a scan of the table) runs after the warm-up.

    Returns ``{"seconds", "cpu", "machine_cpu": {name: [each repeat]}, "result": {name: the last
    repeat's return value}, "output": {name: the last repeat's output path}}`` (earlier outputs
    are deleted).
    """
    for fn in pipes.values():
        o = os.path.join(data_dir, f"warm-{uuid.uuid4().hex[:8]}")
        fn(small, o)
        shutil.rmtree(o, ignore_errors=True)
    if prime is not None:
        prime()
    out = {"seconds": {n: [] for n in pipes}, "cpu": {n: [] for n in pipes},
           "machine_cpu": {n: [] for n in pipes}, "result": {}, "output": {}}
    for rep in range(repeats):
        order = list(pipes) if rep % 2 == 0 else list(pipes)[::-1]
        for name in order:
            path = os.path.join(data_dir, f"out-{name}-{uuid.uuid4().hex[:8]}")
            secs, c, mc, res = timed(lambda o, name=name: pipes[name](table, o), path)
            out["seconds"][name].append(secs)
            out["cpu"][name].append(c)
            out["machine_cpu"][name].append(mc)
            own = "n/a" if c is None else f"{c:.1f}"
            whole = "n/a" if mc is None else f"{mc:.1f}"
            print(f"repeat {rep} {name}: {secs:.2f} s, {own} CPU-s (own processes), "
                  f"{whole} CPU-s (whole machine)", flush=True)
            out["result"][name] = res
            if rep == repeats - 1:
                out["output"][name] = path
            else:
                shutil.rmtree(path, ignore_errors=True)
    return out


def rounded(xs, digits: int = 1) -> list:
    """Each figure rounded (None kept: a CPU figure that could not be read)."""
    return [None if x is None else round(float(x), digits) for x in xs]


# --------------------------------------------------------------------------- peers

#: The driver of a peer's process. A peer's script defines ``query(src, out)`` (it may use
#: ``spark`` and ``args``); :func:`run_peer` puts it before the warm-up and the timed repeats.
PEER_COMMON = r'''
import json, os, shutil, sys, threading, time, uuid
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYSPARK_PYTHON"] = sys.executable
args = json.loads(sys.argv[1])
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master(args["master"]).appName("peer")
         .config("spark.driver.memory", args["driver_memory"])
         .config("spark.sql.shuffle.partitions", str(args["shuffle_partitions"]))
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

# (the benchmark's TreeCpu, sparkpriv/bench/_treecpu.py, is put here by run_peer)

def timed(src, out):
    with TreeCpu() as own:
        t = time.perf_counter()
        query(src, out)
        s = time.perf_counter() - t
    return s, own.seconds

query(args["warmup"], os.path.join(args["data_dir"], "peer-warm-" + uuid.uuid4().hex[:8]))
secs, cpus = [], []
for r in range(args["repeats"]):
    out = os.path.join(args["data_dir"], "peer-out-" + uuid.uuid4().hex[:8])
    s, c = timed(args["table"], out)
    secs.append(s); cpus.append(c)
    print("repeat", r, round(s, 2), "s", "n/a" if c is None else round(c, 1), "cpu-s", file=sys.stderr, flush=True)
    if r < args["repeats"] - 1:
        shutil.rmtree(out, ignore_errors=True)
print(json.dumps({"seconds_each_repeat": secs, "cpu_seconds_each_repeat": cpus, "output": out}))
'''


def run_peer(name: str, python: str, script: str, cfg: dict) -> dict:
    """Run one peer in its own process (``python``: the interpreter of its virtual environment);
    returns its timings and output path, or ``{"error": the reason it failed}``."""
    if not os.path.exists(python):
        return {"peer": name, "error": f"no such interpreter {python!r}"}
    # the peer's query is defined first, then the common driver code runs it; its CPU-seconds are
    # counted by the benchmark's own TreeCpu: the text of bench/_treecpu.py (stdlib only), copied in whole
    head, tail = PEER_COMMON.split("\nquery(args", 1)
    meter = Path(_treecpu.__file__).read_text()
    with tempfile.NamedTemporaryFile("w", suffix=f"-{name}.py", delete=False) as f:
        f.write(head + meter + "\n" + script + "\nquery(args" + tail)
        path = f.name
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "SPARK_HOME")}
    t = time.perf_counter()
    try:
        p = subprocess.run([python, path, json.dumps(cfg)], capture_output=True, text=True, env=env,
                           timeout=cfg.get("timeout", 3600), cwd=cfg["data_dir"])  # peers' temp tables there
    except subprocess.TimeoutExpired:
        return {"peer": name, "error": f"timed out after {cfg.get('timeout', 3600)} s"}
    finally:
        os.unlink(path)
    for line in p.stderr.splitlines():
        if line.startswith("repeat"):
            print(f"{name} {line}", flush=True)
    if p.returncode != 0:
        lines = (p.stderr or "").strip().splitlines()
        first = [ln for ln in lines if any(w in ln for w in ("OutOfMemory", "Killed", "Error:", "Exception:"))][:5]
        tail = "\n".join(first + lines[-6:])
        return {"peer": name, "error": f"exit {p.returncode}: {tail}"}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["peer"] = name
    res["process_seconds"] = round(time.perf_counter() - t, 1)
    return res
