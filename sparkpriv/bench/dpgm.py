"""``sparkpriv bench dpgm``: examples per second of one DP-SGD step vs the non-private step.

For each model (RBM on ``--items`` binary columns with ``--rbm-hidden`` hidden
units; VAE on ``--vae-cols`` columns, one hidden layer of ``--vae-hidden``
units, 2-d latent) and each batch size, on one core (BLAS threads limited to
1): the median wall time of ``--repeats`` calls of

* the non-private step: the per-example gradient sum (no clipping, no noise;
  the RBM's negative phase included in both);
* the DP-SGD step: per-example norms from the outer-product identity, the
  clipped sum in the same matrix products, and the discrete Gaussian noise on
  the grid (one draw per parameter);

and their ratio (the DP overhead; target <= 1.5x). Records are random sparse
binary rows (about 11 items of ``--items``) or uniform [0, 1] rows.

With ``--release-people N`` (or ``--events PATH``, a ``sparkpriv generate cdr``
table), also the wall time of the WHOLE release (bounding, DP k-means, the
clusters' DP-SGD, the model file) on a Spark standalone cluster started for the
run (``local-cluster[E, 1, MB]``: E executors of one core each, launched by
worker JVMs as on a real cluster), for each ``--executors`` count, alternating
the counts over ``--release-repeats`` rounds, each run in its own process (its
own JVMs); the ratio of the medians is the speed-up from 1 to 2 executors
(clusters train in parallel; target >= 1.7x). Each run also reports the
driver's peak resident memory (the Python driver process, which holds the
model parameters only: flat in N). A benchmark, not a test: it asserts
nothing. Prints tables and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

__all__ = ["add_arguments", "run_from_args", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--items", type=int, default=1303, help="RBM visible units [default: 1303]")
    parser.add_argument("--rbm-hidden", type=int, default=32, help="RBM hidden units [default: 32]")
    parser.add_argument("--vae-cols", type=int, default=784, help="VAE columns [default: 784]")
    parser.add_argument("--vae-hidden", type=int, default=200, help="VAE hidden units [default: 200]")
    parser.add_argument("--batches", type=str, default="256,1024", help="batch sizes [default: 256,1024]")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per case [default: 7]")
    parser.add_argument("--release-people", type=int, default=0,
                        help="also time whole DPGM releases of a generated CDR table of this many people "
                             "[default: 0, off]")
    parser.add_argument("--events", default=None, help="time releases of this event table (sparkpriv "
                        "generate cdr output) instead of generating one")
    parser.add_argument("--executors", default="1,2", help="executor counts of the release runs [default: 1,2]")
    parser.add_argument("--executor-memory", type=int, default=6144, help="MB per executor [default: 6144]")
    parser.add_argument("--release-repeats", type=int, default=2, help="rounds of release runs [default: 2]")
    parser.add_argument("--release-args", default="--sampling-rate 0.002 --epochs 0.8 --max-items 128",
                        help="release options of the runs (k, sampling rate, epochs, max items) "
                             "[default: '--sampling-rate 0.002 --epochs 0.8 --max-items 128']")
    parser.add_argument("--workdir", default=None, help="where a generated table is kept [default: a temp dir]")
    parser.add_argument("--skip-step", action="store_true", help="only the release runs")


def run_from_args(args: argparse.Namespace) -> dict:
    batches = [int(b) for b in str(args.batches).split(",") if b]
    out = {}
    if not args.skip_step:
        out = run(items=args.items, rbm_hidden=args.rbm_hidden, vae_cols=args.vae_cols,
                  vae_hidden=args.vae_hidden, batches=batches, repeats=args.repeats, last_line=False)
    if args.release_people or args.events:
        out["release"] = run_releases(people=args.release_people, events=args.events,
                                      executors=[int(e) for e in str(args.executors).split(",") if e],
                                      executor_mb=args.executor_memory, repeats=args.release_repeats,
                                      release_args=str(args.release_args).split(), workdir=args.workdir)
    print(json.dumps(out))
    return out


def _child(argv) -> None:
    """One timed release in this process (its own Spark application): prints one JSON line."""
    import resource

    ap = argparse.ArgumentParser()
    ap.add_argument("--events", required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--executor-mb", type=int, required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--sampling-rate", type=float, default=0.002)
    ap.add_argument("--epochs", type=float, default=0.8)
    ap.add_argument("--max-items", type=int, default=128)
    a = ap.parse_args(argv)
    from sparkpriv.api import release_dpgm
    from sparkpriv.spark.events import bound_contributions
    from sparkpriv.spark.generate_events import CDR_MODEL
    from sparkpriv.spark.session import get_spark

    marks: dict = {}

    class _Phases(logging.Handler):  # the release's own progress messages mark its phases
        def emit(self, record):
            msg = record.getMessage()
            for key, prefix in (("kmeans", "dpgm: k-means"), ("training", "dpgm: training")):
                if msg.startswith(prefix) and key not in marks:
                    marks[key] = time.perf_counter()

    lg = logging.getLogger("sparkpriv.dpgm")
    lg.addHandler(_Phases(logging.INFO))
    lg.setLevel(logging.INFO)
    t0 = time.perf_counter()
    spark = get_spark({"spark.executor.memory": f"{a.executor_mb}m", "spark.driver.memory": "2g",
                       "spark.sql.shuffle.partitions": "16"}, master=a.master, app_name="sparkpriv-bench-dpgm")
    started = time.perf_counter() - t0
    events = spark.read.parquet(a.events)
    t = time.perf_counter()
    records = bound_contributions(events, person="caller_id", item="tower_id", max_items=a.max_items,
                                  vocabulary=f"0..{CDR_MODEL.items - 1}")
    rel = release_dpgm(records, epsilon=1.0, delta=1e-7, k=a.k, sampling_rate=a.sampling_rate, epochs=a.epochs,
                       source=a.events)
    rel.write(a.output)
    end = time.perf_counter()
    seconds = end - t
    phases = {}
    if "kmeans" in marks and "training" in marks:
        phases = {"bounding": marks["kmeans"] - t, "kmeans": marks["training"] - marks["kmeans"],
                  "training": end - marks["training"]}
    print(json.dumps({"seconds": seconds, "startup_seconds": started, "phase_seconds": phases,
                      "n": rel.public.get("model", {}).get("n"),
                      "steps": rel.public.get("steps"),
                      "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}),
          flush=True)
    spark.stop()


def run_releases(*, people: int, events: str | None, executors, executor_mb: int, repeats: int,
                 release_args, workdir: str | None) -> dict:
    """Whole DPGM releases on ``local-cluster`` masters, alternating executor counts (module docstring)."""
    work = workdir or tempfile.mkdtemp(prefix="sparkpriv-bench-dpgm-")
    if events is None:
        events = os.path.join(work, f"cdr-{people}")
        if not os.path.exists(os.path.join(events, "_SUCCESS")):
            from sparkpriv.spark.generate_events import generate_cdr
            from sparkpriv.spark.session import get_spark

            spark = get_spark({"spark.driver.memory": "4g"})
            generate_cdr(spark, people=people, seed=0).write.mode("overwrite").parquet(events)
    env = dict(os.environ, SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
    times: dict = {e: [] for e in executors}
    runs = []
    for r in range(int(repeats)):
        for e in executors:
            out = os.path.join(work, f"release-{e}-{r}")
            cmd = [sys.executable, "-m", "sparkpriv.bench.dpgm", "--child", "--events", events,
                   "--master", f"local-cluster[{e},1,{executor_mb}]", "--executor-mb", str(executor_mb),
                   "--output", out, *release_args]
            cpu0, w0 = _busy_cpu_seconds(), time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            cpu1, w1 = _busy_cpu_seconds(), time.perf_counter()
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"release run with {e} executor(s) failed (exit {p.returncode}):\n"
                                   f"{p.stderr[-3000:]}")
            res = dict(json.loads(lines[-1]), executors=e, round=r + 1)
            # the whole machine's busy cores over the child's run (every JVM and Python worker of
            # the application; the machine is assumed otherwise quiet); None where /proc/stat is absent
            res["busy_cores"] = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / (w1 - w0)
            runs.append(res)
            times[e].append(res["seconds"])
            ph = res.get("phase_seconds") or {}
            phase_txt = ", ".join(f"{k} {v:.1f} s" for k, v in ph.items())
            busy = "" if res["busy_cores"] is None else f"{res['busy_cores']:.2f} cores busy, "
            print(f"round {r + 1}, {e} executor(s): {res['seconds']:.1f} s ({phase_txt}; {busy}driver peak RSS "
                  f"{res['driver_peak_rss_mb']:.0f} MB)", flush=True)
    med = {e: statistics.median(v) for e, v in times.items()}
    med_busy = {e: _median_or_none([r["busy_cores"] for r in runs if r["executors"] == e]) for e in executors}
    med_phase = {e: {k: statistics.median([r["phase_seconds"][k] for r in runs
                                           if r["executors"] == e and r.get("phase_seconds")])
                     for k in ("bounding", "kmeans", "training")
                     if any(r.get("phase_seconds") for r in runs if r["executors"] == e)}
                 for e in executors}
    print("| executors | runs (s) | median (s) | bounding (s) | k-means (s) | training (s) | busy cores |")
    print("|---|---|---|---|---|---|---|")
    for e in executors:
        ph = med_phase[e]
        cells = [f"{ph[k]:.1f}" if k in ph else "" for k in ("bounding", "kmeans", "training")]
        busy = "" if med_busy[e] is None else f"{med_busy[e]:.2f}"
        print(f"| {e} | {', '.join(f'{t:.1f}' for t in times[e])} | {med[e]:.1f} | {' | '.join(cells)} | {busy} |")
    out = {"events": events, "runs": runs, "median_seconds": {str(e): v for e, v in med.items()},
           "median_phase_seconds": {str(e): v for e, v in med_phase.items()},
           "median_busy_cores": {str(e): v for e, v in med_busy.items()}, "machine_cores": os.cpu_count()}
    if len(executors) >= 2:
        lo, hi = executors[0], executors[-1]
        out["speedup"] = med[lo] / med[hi]
        print(f"speed-up {lo} -> {hi} executors: {out['speedup']:.2f}x")
        if med_busy[lo]:
            # the runs with `lo` executors already keep med_busy[lo] cores busy (driver, JVMs, workers):
            # on a machine of os.cpu_count() cores no executor count can do better than this ratio
            out["speedup_ceiling"] = (os.cpu_count() or 1) / med_busy[lo]
            print(f"this machine's ceiling: {os.cpu_count()} cores / {med_busy[lo]:.2f} busy with {lo} executor(s) "
                  f"= {out['speedup_ceiling']:.2f}x")
    return out


def _busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy (not idle, not waiting on I/O) since boot,
    from ``/proc/stat``; None where it is not readable (not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    v = [int(x) for x in fields[1:]]
    busy = sum(v) - v[3] - (v[4] if len(v) > 4 else 0)  # minus idle and iowait
    return busy / float(os.sysconf("SC_CLK_TCK"))


def _median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _median_time(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def run(*, items: int = 1303, rbm_hidden: int = 32, vae_cols: int = 784, vae_hidden: int = 200,
        batches=(256, 1024), repeats: int = 7, last_line: bool = True) -> dict:
    from threadpoolctl import threadpool_limits

    from sparkpriv.mechanisms import dpsgd
    from sparkpriv.mechanisms.dpgm import DEFAULT_LENGTH_STRATA
    from sparkpriv.mechanisms.rbm import RBM
    from sparkpriv.mechanisms.vae import VAE
    from sparkpriv.privacy.random import stream

    rows = []
    with threadpool_limits(1):
        rng = np.random.default_rng(0)
        # the rbm with the default length strata: chains of fixed lengths, 1-20 items (docs/research/dpgm.md,
        # "Length strata"); its non-private step has the same negative phase
        strata = RBM(items, rbm_hidden, strata=DEFAULT_LENGTH_STRATA,
                     chain_lengths=tuple(int(v) for v in np.random.default_rng(1).integers(1, min(items, 20) + 1, 100)))
        for name, model in (("rbm", RBM(items, rbm_hidden)), ("rbm+strata", strata),
                            ("vae", VAE(vae_cols, vae_hidden, 2))):
            theta = model.init(rng)
            state = model.init_state(rng)
            noise = dpsgd.step_noise(clip=1.0, noise_multiplier=1.0, dim=model.dim, max_abs=1e7)
            for B in batches:
                if name.startswith("rbm"):
                    X = (rng.random((B, items)) < 11.0 / items).astype(np.float64)
                else:
                    X = rng.random((B, vae_cols))
                nrng, mrng = stream(1, 1), stream(1, 2)

                def plain():
                    s, _ = model.clipped_sum(X, theta, None, mrng)
                    t, _ = model.model_term(theta, state, mrng, None)
                    return s / B + t

                def private():
                    s, _ = model.clipped_sum(X, theta, 1.0, mrng)
                    t, _ = model.model_term(theta, state, mrng, 1.0)
                    return dpsgd.noisy_sum(s, noise, nrng) / B + t

                tp = _median_time(plain, repeats)
                td = _median_time(private, repeats)
                tn = _median_time(lambda: dpsgd.noisy_sum(np.zeros(model.dim), noise, nrng), repeats)
                rows.append({"model": name, "params": model.dim, "batch": B,
                             "plain_examples_per_s": B / tp, "dp_examples_per_s": B / td,
                             "overhead": td / tp, "noise_ms": 1e3 * tn})
    print("| model | parameters | batch | non-private ex/s | DP-SGD ex/s | overhead | noise ms/step |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['params']} | {r['batch']} | {r['plain_examples_per_s']:.0f} | "
              f"{r['dp_examples_per_s']:.0f} | {r['overhead']:.2f}x | {r['noise_ms']:.1f} |")
    out = {"rows": rows}
    if last_line:
        print(json.dumps(out))
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:])
        raise SystemExit(0)
    from sparkpriv.bench import module_main

    raise SystemExit(module_main("dpgm"))
