"""Every Spark benchmark runs end to end on a tiny table and prints its JSON line.

Smoke tests only: they catch a benchmark that no longer runs (the figures in the
docs come from real runs); nothing here looks at timings. CI's PySpark 3.5 leg runs
only the projection benchmark (the harness, and MLlib's RowMatrix on 3.5): the others
are marked ``main_leg``.
"""

import json
import os
import time

import pytest

pytestmark = pytest.mark.spark


def _last_json(capsys) -> dict:
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


@pytest.mark.main_leg
def test_bench_dprp_smoke(spark, tmp_path, capsys):
    from sparkpriv.bench import dprp

    res = dprp.run(rows=3000, cols=6, data_dir=str(tmp_path), master="local[2]")
    assert _last_json(capsys) == json.loads(json.dumps(res))
    assert res["rows"] == 3000 and res["gram_ratio_vs_mllib"] > 0
    assert res["release_rows_per_s"] > 0 and res["mapinarrow_gram_ratio_vs_mllib"] > 0


@pytest.mark.main_leg
def test_bench_kmeans_smoke(spark, tmp_path, capsys):
    from sparkpriv.bench import kmeans

    res = kmeans.run(rows=3000, cols=6, k=3, iterations=2, frequencies=3, data_dir=str(tmp_path))
    assert _last_json(capsys)["iteration_ratio_vs_mllib"] == res["iteration_ratio_vs_mllib"] > 0


def test_bench_projection_smoke(spark, tmp_path, capsys):
    from sparkpriv.bench import projection

    res = projection.run(rows=3000, cols=6, k=3, data_dir=str(tmp_path))
    assert _last_json(capsys)["ratio_vs_mllib"] == res["ratio_vs_mllib"] > 0
    assert res["reader"] == "arrow" and res["ratio_vs_spark_reader"] > 0
    for name, secs in res["seconds"].items():  # every repeat is reported, the best is kept
        assert res["times_s"][name] == [secs]


@pytest.mark.main_leg
def test_bench_cdr_smoke(spark, tmp_path, capsys):
    from sparkpriv.bench import cdr

    res = cdr.run(people=2000, k=4, max_items=8, data_dir=str(tmp_path), repeats=2, warmup_people=500)
    assert _last_json(capsys)["ratio_vs_floor"] == res["ratio_vs_floor"] > 0
    a, b = res["seconds_each_repeat"], res["floor_seconds_each_repeat"]
    assert len(a) == len(b) == 2 and res["seconds"] == min(a) and res["floor_seconds"] == min(b)
    mean = (a[0] / b[0] + a[1] / b[1]) / 2  # the median of two; times are rounded to 10 ms here
    assert res["ratio_median_of_repeats"] == pytest.approx(mean, rel=0.05)
    assert res["people"] == 2000 and res["events"] > 2000 and res["writer"] == "arrow"
    assert res["warmup_people"] == 500 and (tmp_path / "cdr-500-s0" / "_SUCCESS").exists()
    from sparkpriv.privacy import _compiled

    assert res["compiled_kernels"] == _compiled.status()
    for key in ("cpu_seconds_each_repeat", "floor_cpu_seconds_each_repeat", "steal_seconds_each_repeat",
                "floor_steal_seconds_each_repeat"):
        assert len(res[key]) == 2 and all(x >= 0 for x in res[key]), key
    # machine CPU-seconds of a run: some, and at most all cores for the run's wall time
    ncpu = os.cpu_count()
    for secs, cpu in zip(a + b, res["cpu_seconds_each_repeat"] + res["floor_cpu_seconds_each_repeat"]):
        assert 0 < cpu <= ncpu * secs + 0.2


@pytest.mark.main_leg
def test_bench_dpgm_release_runs_on_a_local_cluster(spark, tmp_path, capsys):
    """``bench dpgm --release-people``: a whole release in its own process on a standalone
    ``local-cluster`` (a worker JVM launching the executor), its JSON line, the model file written."""
    import argparse

    from sparkpriv.bench import dpgm

    p = argparse.ArgumentParser()
    dpgm.add_arguments(p)
    args = p.parse_args(["--skip-step", "--release-people", "1500", "--executors", "1", "--release-repeats", "1",
                         "--executor-memory", "1024", "--workdir", str(tmp_path),
                         "--release-args", "--k 3 --sampling-rate 0.05 --epochs 0.2 --max-items 16"])
    res = dpgm.run_from_args(args)
    assert _last_json(capsys) == json.loads(json.dumps(res))
    (run,) = res["release"]["runs"]
    assert run["executors"] == 1 and run["seconds"] > 0 and run["driver_peak_rss_mb"] > 0
    assert run["steps"] == 4 and 1000 < run["n"] <= 1500  # people with events; ceil(0.2 / 0.05) steps
    assert os.path.exists(tmp_path / "release-1-0" / "_dpgm_model.npz")
    ph = run["phase_seconds"]  # the release's phases, from its own progress messages, add up to its time
    assert set(ph) == {"bounding", "kmeans", "training"} and all(v > 0 for v in ph.values())
    assert sum(ph.values()) == pytest.approx(run["seconds"], rel=1e-6)
    if os.path.exists("/proc/stat"):
        assert 0 < run["busy_cores"] <= os.cpu_count() + 0.5  # whole-machine busy cores over the run


def test_busy_cpu_seconds_counts_this_process_work():
    """The machine's busy CPU seconds grow by at least this process's own CPU time over a busy loop."""
    from sparkpriv.bench.dpgm import _busy_cpu_seconds

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    b0, c0 = _busy_cpu_seconds(), time.process_time()
    while time.process_time() - c0 < 0.3:
        pass
    own = time.process_time() - c0
    assert _busy_cpu_seconds() - b0 >= 0.8 * own


def test_bench_dpgm_step_smoke(capsys):
    """The step benchmark (no Spark) times the RBM, the RBM with length strata and the VAE."""
    from sparkpriv.bench.dpgm import run

    res = run(items=40, rbm_hidden=4, vae_cols=20, vae_hidden=8, batches=(32,), repeats=1)
    assert [r["model"] for r in res["rows"]] == ["rbm", "rbm+strata", "vae"]
    assert _last_json(capsys) == json.loads(json.dumps(res))
    strata = res["rows"][1]
    assert strata["params"] == 40 * 4 + 40 + 4 + 4 * 40  # W, b, c and the offsets of 4 strata
    assert all(r["overhead"] > 0 and r["dp_examples_per_s"] > 0 for r in res["rows"])


@pytest.mark.main_leg
def test_bench_synthetic_scale_smoke(spark, tmp_path, capsys):
    import argparse

    import pyarrow.parquet as pq

    from sparkpriv.bench import synthetic_scale

    p = argparse.ArgumentParser()
    synthetic_scale.add_arguments(p)
    res = synthetic_scale.run_from_args(p.parse_args(["--people", "3000", "--items", "300", "--repeats", "1",
                                                      "--data-dir", str(tmp_path)]))
    assert _last_json(capsys) == json.loads(json.dumps(res))
    assert all(len(v) == 1 for v in res["seconds"].values()) and res["release_over_nonprivate"] > 0
    t = pq.read_table(str(tmp_path / "zipf-3000x300-10")).to_pandas()
    assert len(t) == res["events"] and t["person"].nunique() == 3000 and t["item"].between(0, 299).all()
    assert pq.read_table(str(tmp_path / "synthetic-scale" / "synthetic")).num_rows == 3000


@pytest.mark.main_leg
def test_bench_aggregates_smoke(spark, tmp_path, capsys):
    """``bench aggregates`` without peers: its non-private figures and its error figures against an
    independent pandas computation on the generated table."""
    import numpy as np
    import pyarrow.parquet as pq

    from sparkpriv.bench import aggregates

    res = aggregates.run(people=1500, repeats=1, warmup_people=300, data_dir=str(tmp_path), keep_outputs=True)
    assert _last_json(capsys) == json.loads(json.dumps(res))
    assert len(res["seconds_each_repeat"]) == len(res["nonprivate_seconds_each_repeat"]) == 1
    assert res["ratio_each_repeat"][0] == pytest.approx(res["seconds_each_repeat"][0]
                                                        / res["nonprivate_seconds_each_repeat"][0], rel=0.02)
    ev = pq.read_table(res["outputs"]["table"]).to_pandas()
    assert len(ev) == res["events"] and ev["caller_id"].nunique() == 1500
    assert ev["hour"].between(0, 23).all() and (ev["duration"] >= 1).all()
    assert (ev["duration"] == ev["duration"].round()).all() and 60 < ev["duration"].median() < 130
    g = ev.groupby(["tower_id", "hour"])["duration"]
    ref = {"count_distinct": ev.groupby(["tower_id", "hour"])["caller_id"].nunique(), "count": g.size(),
           "sum_duration": g.sum(), "mean_duration": g.mean(),
           "p50_duration": g.quantile(0.5, interpolation="lower")}  # percentile_approx: an element, the lower one

    def dense(t, col):
        v = np.full(aggregates.TOWERS * aggregates.HOURS, np.nan)
        v[t["tower_id"].to_numpy() * 24 + t["hour"].to_numpy()] = t[col].to_numpy()
        return v

    nonpriv = pq.read_table(res["outputs"]["nonprivate"]).to_pandas()
    assert len(nonpriv) == len(ref["count"])  # the non-private query has a row per cell with calls
    truth = {}
    for a, s in ref.items():
        t = s.rename(a).reset_index()
        truth[a] = dense(t, a)
        got = dense(nonpriv, a)
        assert np.allclose(got[~np.isnan(truth[a])], truth[a][~np.isnan(truth[a])], rtol=1e-9), a
    # the benchmark's error figures, from the released table and the pandas truth
    rel = pq.read_table(res["outputs"]["sparkpriv"]).to_pandas()
    assert len(rel) == aggregates.TOWERS * aggregates.HOURS  # every cell of the public domain
    for a in ("count_distinct", "count"):
        t = np.nan_to_num(truth[a])
        assert res["errors"]["sparkpriv"][a]["mean_abs_error"] == pytest.approx(
            np.mean(np.abs(dense(rel, a) - t)), rel=1e-9)
        assert res["errors"]["nonprivate"][a]["mean_abs_error"] == 0
    busy = ~np.isnan(truth["mean_duration"])
    assert res["errors"]["sparkpriv"]["mean_duration"]["cells"] == busy.sum()
    assert res["errors"]["sparkpriv"]["mean_duration"]["mean_abs_error"] == pytest.approx(
        np.mean(np.abs(dense(rel, "mean_duration") - truth["mean_duration"])[busy]), rel=1e-9)
    assert res["sparkpriv_stated"]["count_distinct"]["mean_stated_std"] > 0
