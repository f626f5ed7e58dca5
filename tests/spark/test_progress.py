"""Progress of long passes: the status-tracker poller, DPGM training steps, the event bounding pass."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from sparkpriv.spark.progress import TaskProgress


def _slow(it):
    import time

    time.sleep(0.2)
    yield sum(1 for _ in it)


def _progress_threads():
    return [t for t in threading.enumerate() if t.name.endswith(" progress") and t.name.startswith("sparkpriv")]


def test_task_progress_reports_tasks_and_a_final_step(spark):
    steps = []
    with TaskProgress(spark, "pass", lambda *a: steps.append(a), interval=0.1) as p:
        assert spark.sparkContext.parallelize(range(60), 6).mapPartitions(_slow).sum() == 60
    assert steps[-1] == ("pass", 6, 6, "Spark tasks of stage 1 of the pass")  # the job's 6 tasks, then i == n
    assert all(0 <= i <= n for _, i, n, _ in steps) and len(steps) == p.steps
    assert len(set(steps)) == len(steps)  # a step only when the count changed
    assert not _progress_threads()


def test_the_total_never_moves_within_a_stage_and_each_stage_is_named(spark):
    """Two jobs of 2 and then 5 tasks (and a shuffle stage of 3): the steps never show a total that
    grows while a stage runs (the old sum over stages seen so far went 0/2, 2/5, 3/16, 11/37); each
    stage's tasks are reported against that stage's own count, with the stage's ordinal."""
    steps = []
    with TaskProgress(spark, "pass", lambda *a: steps.append(a), interval=0.05):
        spark.sparkContext.parallelize(range(20), 2).mapPartitions(_slow).count()
        rdd = spark.sparkContext.parallelize(range(50), 5).mapPartitions(_slow).map(lambda x: (x % 3, 1))
        rdd.reduceByKey(lambda a, b: a + b, 3).mapPartitions(_slow).count()
    by_stage: dict = {}
    for _, i, n, msg in steps:
        by_stage.setdefault(msg, set()).add(n)
        assert 0 <= i <= n
    assert all(len(ns) == 1 for ns in by_stage.values()), by_stage  # one total per stage
    assert {n for ns in by_stage.values() for n in ns} <= {2, 5, 3}
    assert steps[-1] == ("pass", 3, 3, f"Spark tasks of stage {len(by_stage)} of the pass")
    assert len(by_stage) >= 2  # at least the first and the last stage were seen


def test_declared_units_give_one_total_from_start_to_end(spark):
    """With ``units`` the steps count what the tasks report (an accumulator), out of the declared
    total, and a heartbeat repeats the last step while one long task runs."""
    acc = spark.sparkContext.accumulator(0)

    def work(it):
        import time

        time.sleep(0.4)
        acc.add(1)
        yield sum(1 for _ in it)

    steps = []
    with TaskProgress(spark, "fit", lambda *a: steps.append(a), interval=0.05, heartbeat=0.2,
                      units=("models trained", 4, acc)):
        spark.sparkContext.parallelize(range(8), 4).mapPartitions(work).count()
    assert {n for _, _, n, _ in steps} == {4}
    assert [i for _, i, _, _ in steps] == sorted(i for _, i, _, _ in steps) and steps[-1][1] == 4
    assert all(m.startswith("models trained") for *_, m in steps)
    assert any("still running" in m for *_, m in steps)  # 0.4 s tasks, a 0.2 s heartbeat


def test_task_progress_only_counts_its_own_jobs(spark):
    steps = []
    spark.sparkContext.parallelize(range(10), 5).count()  # before: not counted
    with TaskProgress(spark, "pass", lambda *a: steps.append(a), interval=0.1):
        spark.sparkContext.parallelize(range(10), 3).count()
    assert steps[-1][1:3] == (3, 3)


def test_a_failing_job_stops_the_thread_without_a_final_step(spark):
    steps = []

    def boom(it):
        raise RuntimeError("task failed on purpose")
        yield  # pragma: no cover

    with pytest.raises(Exception, match="task failed on purpose"):
        with TaskProgress(spark, "pass", lambda *a: steps.append(a), interval=0.05):
            spark.sparkContext.parallelize(range(4), 2).mapPartitions(boom).collect()
    assert all(i < n for _, i, n, _ in steps)
    assert not _progress_threads()
    with TaskProgress(spark, "after", lambda *a: steps.append(a), interval=0.05):  # the session still works
        spark.sparkContext.parallelize(range(4), 2).count()
    assert steps[-1][:3] == ("after", 2, 2)


def test_a_broken_display_or_no_report_does_not_fail_the_pass(spark):
    def broken(*a):
        raise ValueError("display gone")

    with TaskProgress(spark, "pass", broken, interval=0.05):
        assert spark.sparkContext.parallelize(range(4), 2).count() == 4
    with TaskProgress(spark, "pass", None) as p:  # nothing to report to: no thread, no tag
        spark.sparkContext.parallelize(range(4), 2).count()
    assert p.steps == 0 and not _progress_threads()


def _dpgm_data(n=300, d=5):
    rng = np.random.default_rng(3)
    return (rng.random((n, d)) < np.where(np.arange(n)[:, None] % 2 == 0, 0.8, 0.1)).astype(float)


DPGM_ARGS = dict(epsilon=4.0, delta=1e-5, k=2, sampling_rate=0.2, epochs=3, hidden=3, chains=10,
                 kmeans_iterations=2, accountant="rdp")


def test_dpgm_training_steps_in_order_with_the_spend_on_the_local_engine():
    """k clusters x min(T, 10) DP-SGD chunks, in order, after the k-means iterations; while the
    first cluster trains the spend so far grows up to the release's epsilon (the events released
    before training, the k-means, the length histograms and the item counts, plus t DP-SGD steps), then the whole
    reserved epsilon is spent (parallel composition)."""
    from sparkpriv.api import release_dpgm
    from sparkpriv.mechanisms import dpsgd
    from sparkpriv.privacy.accounting import compose, epsilon_of

    steps = []
    rel = release_dpgm(_dpgm_data(), on_step=lambda *a: steps.append(a), **DPGM_ARGS)
    T = int(np.ceil(3 / 0.2))
    assert [s[:3] for s in steps[:2]] == [("kmeans iteration", 1, 2), ("kmeans iteration", 2, 2)]
    train = steps[2:]
    assert [s[:3] for s in train] == [("dpgm training", i, 2 * 10) for i in range(1, 21)]
    ts = [int(s[3].split("DP-SGD step ")[1].split("/")[0]) for s in train]
    assert ts == [int(np.ceil(c * T / 10)) for c in range(1, 11)] * 2
    spent = [float(s[3].split("at most ")[1].split(" of")[0]) for s in train]
    before = list(rel.events.events[:-1])  # the k-means, the length histograms, the item counts (rbm defaults)
    assert len(before) == 3 and rel.public["lengths"]["share_of_epsilon"] == 0.1
    assert rel.public["item_counts"]["share_of_epsilon"] == 0.3
    sigma = rel.public["noise_multiplier"]
    for t, e in zip(ts[:9], spent[:9]):  # independent: the accountant on those + t steps
        want = epsilon_of(compose(before + [dpsgd.dpsgd_event(0.2, sigma, t)]), 1e-5)
        assert e == pytest.approx(want, rel=1e-3)
    assert spent[:10] == sorted(spent[:10]) and spent[0] < rel.epsilon
    assert spent[9:] == [pytest.approx(rel.epsilon, rel=1e-3)] * 11
    assert all(f"of the reserved {rel.epsilon:.4g}" in s[3] for s in train)
    assert [s[3].split(",")[0] for s in train] == ["cluster 1/2"] * 10 + ["cluster 2/2"] * 10


def _groups(block):
    X = np.asarray(block, dtype=np.float64)
    return (X[:, 0] > 0.5).astype(np.int64), X


def _train(j, rows):
    return np.array([float(j), float(rows.shape[0])])


def test_spark_training_reports_its_tasks_and_not_the_in_process_callback(spark):
    """The Spark engine's train_groups reports the job's tasks to the release's progress (set by
    release()); the per-step callback of in-process training is not called from the tasks."""
    from sparkpriv.spark.engine import SparkEngine

    df = spark.createDataFrame([(float(i % 2), float(i)) for i in range(40)], ["a", "b"]).repartition(3)
    eng = SparkEngine()
    src = eng.open(df, columns=["a", "b"], fill=None, caller="test")
    steps, calls = [], []
    eng.progress = lambda *a: steps.append(a)
    out = eng.train_groups(src, _groups, _train, 3, 2, 2, on_train=lambda *a: calls.append(a), what="training")
    np.testing.assert_array_equal(out, [[0.0, 20.0], [1.0, 20.0], [2.0, 0.0]])  # group 2: no rows, its own task
    assert steps and steps[-1][0] == "training" and steps[-1][1] == steps[-1][2] == 3  # out of k = 3 models
    assert {s[2] for s in steps} == {3} and all(s[3].startswith("models trained") for s in steps)
    assert calls == []


def test_the_event_bounding_pass_reports_steps(spark):
    from sparkpriv.api import release_kmeans
    from sparkpriv.spark.events import bound_contributions

    rows = [(p, 100 + (p * 7 + e) % 20) for p in range(40) for e in range(6)]
    events = spark.createDataFrame(rows, "person long, tower long")
    recs = bound_contributions(events, person="person", item="tower", max_items=3, vocabulary="range:100:120")
    steps = []
    release_kmeans(recs, k=2, epsilon=1.0, delta=1e-5, iterations=2, frequencies=16, kernel_width=1.0,
                   on_step=lambda *a: steps.append(a))
    bounding = [s for s in steps if s[0] == "event bounding"]
    assert bounding and bounding[-1][1] == bounding[-1][2] > 0
    names = [s[0] for s in steps]
    assert names.index("event bounding") < names.index("kmeans iteration")  # the first pass bounds


def test_a_row_level_release_reports_its_bounding_when_written(spark, tmp_path):
    """Projection of event records: the bounding pass is part of the output's job, which runs at
    write(): its tasks are reported there, with a final i == n step."""
    from sparkpriv.api import release_projection
    from sparkpriv.spark.events import bound_contributions

    rows = [(p, 100 + (p * 7 + e) % 20) for p in range(40) for e in range(6)]
    events = spark.createDataFrame(rows, "person long, tower long")
    recs = bound_contributions(events, person="person", item="tower", max_items=3, vocabulary="range:100:120")
    steps = []
    rel = release_projection(recs, k=2, epsilon=1.0, on_step=lambda *a: steps.append(a))
    assert [s for s in steps if s[0] == "event bounding and write"] == []  # nothing has run yet
    rel.write(str(tmp_path / "out"))
    mine = [s for s in steps if s[0] == "event bounding and write"]
    assert mine and mine[-1][1] == mine[-1][2] > 0
    assert _progress_threads() == []


def _train_where(j, rows):
    from pyspark import TaskContext

    ctx = TaskContext.get()  # None on the driver (a group without rows)
    where = (-1.0, -1.0) if ctx is None else (float(ctx.partitionId()), float(ctx.stageId()))
    return np.array([float(j), float(rows.shape[0]), *where])


def test_spark_training_runs_each_group_in_its_own_task_in_the_given_order(spark):
    """Each group trains in its own partition (no hash collisions, no adaptive coalescing, even
    with one shuffle partition configured), and partition p holds group ``order[p]``."""
    from sparkpriv.spark.engine import SparkEngine

    rows = [(float(i % 5) / 5 + 0.01, float(i)) for i in range(100)]
    df = spark.createDataFrame(rows, ["a", "b"]).repartition(3)
    eng = SparkEngine()
    src = eng.open(df, columns=["a", "b"], fill=None, caller="test")

    def groups(block):
        X = np.asarray(block, dtype=np.float64)
        return np.floor(X[:, 0] * 5).astype(np.int64), X

    prev = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        out = eng.train_groups(src, groups, _train_where, 6, 4, 2, order=[3, 1, 0, 2, 4, 5])
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", prev)
    np.testing.assert_array_equal(out[:, 0], [0, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(out[:, 1], [20] * 5 + [0])  # group 5 has no rows: trained on none
    np.testing.assert_array_equal(out[:, 2], [2, 1, 3, 0, 4, 5])  # slot of each group, the empty one too
    assert len(set(out[:, 3])) == 1  # one stage: the groups trained side by side, none after on the driver
    with pytest.raises(ValueError, match="permutation"):
        eng.train_groups(src, groups, _train_where, 6, 4, 2, order=[0, 0, 1, 2, 3, 4])


def test_spark_training_still_trains_every_group_when_groups_share_a_partition(spark, monkeypatch):
    """If Spark's hashing ever put two groups in one partition (every key the same here), the
    task trains each group it finds, on its own rows: the same result as one group per task."""
    from sparkpriv.spark import engine as spark_engine

    rows = [(float(i % 4) / 4 + 0.01, float(i)) for i in range(80)]
    df = spark.createDataFrame(rows, ["a", "b"]).repartition(3)
    eng = spark_engine.SparkEngine()
    src = eng.open(df, columns=["a", "b"], fill=None, caller="test")

    def groups(block):
        X = np.asarray(block, dtype=np.float64)
        return np.floor(X[:, 0] * 4).astype(np.int64), X

    def train(j, rows):  # the group's id, its row count and the sum of its rows' second column
        return np.array([float(j), float(rows.shape[0]), float(np.asarray(rows)[:, 1].sum())])

    want = eng.train_groups(src, groups, train, 4, 3, 2)
    monkeypatch.setattr(spark_engine, "slot_keys", lambda _spark, k: [7] * k)
    got = eng.train_groups(src, groups, train, 4, 3, 2)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want[:, 1], [20] * 4)
    np.testing.assert_array_equal(want[:, 2], [sum(float(i) for i in range(80) if i % 4 == j) for j in range(4)])
