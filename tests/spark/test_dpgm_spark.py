"""DPGM on Spark: one task per cluster, the same models as the numpy path for a test seed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from sparkpriv.mechanisms import dpgm
from sparkpriv.spark import dpgm as sdpgm

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("min_batch", [None, 40])
def test_spark_per_cluster_training_equals_numpy(spark, min_batch):
    """With ``min_batch`` 40 (expected batches of 30): clusters 0 and 1 make 2 base steps per update,
    the empty cluster 2 all 10 at once; Spark's tasks must train with the same per-cluster rates."""
    rng = np.random.default_rng(3)
    n, d = 600, 8
    X = (rng.random((n, d)) < np.where(np.arange(n)[:, None] % 2 == 0, 0.7, 0.1)).astype(float)
    params = dpgm.DPGMParams(epsilon=3.0, delta=1e-5, k=3, sampling_rate=0.1, epochs=1, hidden=3, accountant="rdp",
                             kmeans_iterations=2, chains=10, min_batch=min_batch)
    plan = dpgm.plan_dpgm(params, n=n, d=d)
    assert plan.batches([300.0, 300.0, 0.0]) == ([1, 1, 1] if min_batch is None else [2, 2, 10])
    centers = np.vstack([np.full(d, 0.7), np.full(d, 0.1), np.full(d, 5.0)])  # cluster 2 gets no rows
    sizes = np.array([300.0, 300.0, 0.0])
    row_bound = float(np.sqrt(d))
    labels = dpgm.assign_clusters(X, centers, row_bound)
    assert set(np.unique(labels)) == {0, 1}
    ref = dpgm.train_clusters(X, labels, sizes, centers, plan, seed=5)
    if min_batch is not None:  # the rates reached the training
        one = dpgm.plan_dpgm(dataclasses.replace(params, min_batch=None), n=n, d=d)
        assert not np.allclose(dpgm.train_clusters(X, labels, sizes, centers, one, seed=5)[:2], ref[:2])
    cols = [f"c{j}" for j in range(d)]
    df = spark.createDataFrame(pd.DataFrame(X, columns=cols))  # partitions keep the row order
    got = sdpgm.train_clusters(df, cols, centers, sizes, plan, seed=5, row_bound=row_bound)
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)


def test_spark_training_does_not_depend_on_the_sources_row_order(spark):
    """The same rows, reversed and spread over 3 partitions (a source whose partitions or rows come
    back in another order, as a retried task's may): the same models, equal to numpy's on the rows
    in their first order (each cluster trains on its rows in their canonical order)."""
    rng = np.random.default_rng(8)
    n, d = 600, 8
    X = (rng.random((n, d)) < np.where(np.arange(n)[:, None] % 2 == 0, 0.7, 0.1)).astype(float)
    params = dpgm.DPGMParams(epsilon=3.0, delta=1e-5, k=2, sampling_rate=0.1, epochs=1, hidden=3, accountant="rdp",
                             kmeans_iterations=2, chains=10)
    plan = dpgm.plan_dpgm(params, n=n, d=d)
    centers = np.vstack([np.full(d, 0.7), np.full(d, 0.1)])
    sizes = np.array([300.0, 300.0])
    row_bound = float(np.sqrt(d))
    ref = dpgm.train_clusters(X, dpgm.assign_clusters(X, centers, row_bound), sizes, centers, plan, seed=5)
    cols = [f"c{j}" for j in range(d)]
    pdf = pd.DataFrame(X[::-1].copy(), columns=cols)
    for df in (spark.createDataFrame(pdf).coalesce(1), spark.createDataFrame(pdf).repartition(3)):
        got = sdpgm.train_clusters(df, cols, centers, sizes, plan, seed=5, row_bound=row_bound)
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)


def _events(spark, parts):
    """300 people over 10 items: even people visit items 0-4, odd people items 5-9 (each w.p. 0.7)."""
    rng = np.random.default_rng(12)
    rows = []
    for p in range(300):
        base = 0 if p % 2 == 0 else 5
        for it in range(base, base + 5):
            if rng.random() < 0.7:
                rows += [(p * 31 + 7, it)] * int(rng.integers(1, 3))
    return spark.createDataFrame(rows, "person long, item int").repartition(parts)


_KW = dict(epsilon=4.0, delta=1e-5, k=2, sampling_rate=0.2, epochs=1, hidden=3, chains=10, kmeans_iterations=2,
           accountant="rdp")


def test_dpgm_on_bounded_event_records(spark, monkeypatch):
    """Event records are the people's 0/1 rows over the vocabulary: the k-means part equals the
    release of the same rows as a dense table (same seed; sums do not depend on the order), the
    row bound is sqrt(max_items) from the cap, and the trained models do not depend on how the
    events are partitioned (records are trained in the keyed person layout). The exact length
    histograms, made before training (records: from the cached records; a table: from its rows),
    are the auditor's, and both releases start their RBMs from the same masses. With the per-item
    counts (marginal_share): the exact counts are the auditor's people per item, and the shift
    (each cluster's task samples its share of the records that measure the marginals) does not
    depend on the partitioning either."""
    from sparkpriv.api import release_dpgm
    from sparkpriv.privacy.random import insecure_fixed_seed
    from sparkpriv.spark.events import bound_contributions

    exact, counted = [], []
    real_counts = dpgm.MarginalPlan.release
    monkeypatch.setattr(dpgm.MarginalPlan, "release", lambda self, c, seed: counted.append(np.array(c)) or
                        real_counts(self, c, seed))
    real_release = dpgm.LengthPlan.release
    monkeypatch.setattr(dpgm.LengthPlan, "release", lambda self, h, seed: exact.append(np.array(h)) or
                        real_release(self, h, seed))
    # the centres the k-means' last round assigned with, as each release's k-means loop passed them
    last = []
    real_last = dpgm.last_round_centres

    def recording(stats):
        out = real_last(stats)
        last.append(out[1])
        return out

    monkeypatch.setattr(dpgm._mechanism, "last_round_centres", recording)  # the release's k-means loop
    kw = dict(_KW, epsilon=16.0)  # the models' marginals off by more than the counts' noise: a shift
    thetas, calibrations = [], []
    for parts in (1, 3):
        with insecure_fixed_seed(31):
            rec = bound_contributions(_events(spark, parts), person="person", item="item", max_items=4,
                                      vocabulary="0..9")
            rel = release_dpgm(rec, marginal_share=0.1, marginal_samples=3000, **kw)
        thetas.append(np.asarray(rel.model.thetas))
        calibrations.append(rel.model.plan_public["marginal_calibration"])
        assert rel.public["bounds"]["row_bound"] == pytest.approx(2.0)
    np.testing.assert_array_equal(thetas[0], thetas[1])
    # the same records as a dense 0/1 table: the same k-means (centres, noisy sizes)
    items = [r["items"] for r in rec.df.collect()]
    X = np.zeros((len(items), 10))
    for i, its in enumerate(items):
        X[i, its] = 1.0
    assert X.sum(axis=1).max() <= 4 and 290 <= X.shape[0] <= 300  # people with at least one event
    cols = [f"c{j}" for j in range(10)]
    with insecure_fixed_seed(31):
        bound_contributions(_events(spark, 1), person="person", item="item", max_items=4, vocabulary="0..9")
        dense = release_dpgm(spark.createDataFrame(pd.DataFrame(X, columns=cols)), columns=cols, row_bound=2.0,
                             marginal_share=0.1, marginal_samples=3000, **kw)
    np.testing.assert_allclose(rel.model.centers, dense.model.centers, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rel.model.sizes, dense.model.sizes, rtol=1e-9, atol=1e-9)
    assert np.isfinite(thetas[0]).all() and np.abs(thetas[0]).sum() > 0
    # the auditor's histograms: its own assignment to the nearest of the last round's centres (the
    # same in all three releases), and its own lengths
    assert len(last) == 3
    c = last[0]["centres"]
    for other in last[1:]:
        np.testing.assert_allclose(other["centres"], c, rtol=1e-9, atol=1e-12)
    labels = np.argmin((c * c).sum(1)[None, :] - 2 * X @ c.T, axis=1)
    edges = rel.model.length_edges
    want = np.zeros((2, edges.size - 1))
    for j, m in zip(labels, X.sum(axis=1).astype(int)):
        want[j, np.searchsorted(edges, m, side="right") - 1] += 1
    assert len(exact) == 3  # records (twice), then the table
    for h in exact:
        np.testing.assert_array_equal(h, want)
    np.testing.assert_allclose(rel.model.lengths, dense.model.lengths, atol=1e-9)
    # the sizes: the inverse-variance mean of the k-means' counts and the histograms' sums
    km, H = rel.model.plan_public["kmeans_sizes"], rel.model.lengths.sum(axis=1)
    K = np.array(km["values"])
    vk, vh = km["count_std"] ** 2, (edges.size - 1) * rel.model.length_std ** 2
    np.testing.assert_allclose(rel.model.sizes, np.maximum((K * vh + H * vk) / (vk + vh), 0), atol=1e-9)
    assert rel.public["model"]["cluster_sizes"] == pytest.approx(list(rel.model.sizes))
    assert rel.model.plan_public["start_masses"] == pytest.approx(dense.model.plan_public["start_masses"])
    assert rel.model.plan_public["start_masses"] == pytest.approx(
        [dpgm.expected_length(rel.model.lengths[j], edges, rel.model.length_std) for j in range(2)])
    # the per-item counts: the auditor's people per item, on both layouts and as a table
    assert len(counted) == 3
    for c in counted:
        np.testing.assert_array_equal(c, X.sum(axis=0))
    np.testing.assert_allclose(rel.model.item_counts, dense.model.item_counts, atol=1e-9)
    assert np.all(np.isfinite(rel.model.marginal_shift)) and np.any(rel.model.marginal_shift != 0)
    # the sampled sums and sums of squares the tasks returned: the same whatever the partitioning
    assert calibrations[0] == calibrations[1] and calibrations[0]["model_error"] > 0
    assert calibrations[0]["sampling_std_total"] > 0
    assert rel.model.plan_public["marginal_calibration"]["samples_per_cluster"] == \
        dpgm.marginal_plan(dpgm.DPGMParams(row_bound=2.0, marginal_share=0.1, marginal_samples=3000, **kw),
                           10).cluster_samples(rel.model.sizes).tolist()


def test_dpgm_event_records_refusals(spark):
    from sparkpriv.api import release_dpgm
    from sparkpriv.errors import ParameterError
    from sparkpriv.spark.events import bound_contributions

    rec = bound_contributions(_events(spark, 1), person="person", item="item", max_items=4, vocabulary="0..9")
    with pytest.raises(ParameterError, match="'row_bound'.*do not apply"):
        release_dpgm(rec, row_bound=3.0, **_KW)
    counted = bound_contributions(_events(spark, 1), person="person", item="item", max_items=4,
                                  vocabulary="0..9", weights="counts", max_events_per_item=3)
    with pytest.raises(ParameterError, match="binary"):
        release_dpgm(counted, **_KW)


def test_cli_release_dpgm_of_an_event_table(spark, tmp_path, monkeypatch):
    import json

    from sparkpriv.cli import main
    from sparkpriv.mechanisms.dpgm import MODEL_FILE, DPGMModel

    path = str(tmp_path / "events.parquet")
    _events(spark, 2).write.parquet(path)
    monkeypatch.setenv("SPARKPRIV_LEDGER", f"sqlite:///{tmp_path}/ledger.sqlite")
    out = tmp_path / "out"
    rc = main(["release", "dpgm", "--input", path, "--output", str(out), "--events", "--person-col", "person",
               "--item-col", "item", "--vocabulary", "0..9", "--max-items", "4", "--epsilon", "4", "--delta", "1e-5",
               "--k", "2", "--sampling-rate", "0.2", "--epochs", "1", "--hidden", "3", "--chains", "10"])
    assert rc == 0
    r = json.loads((out / "_privacy_receipt.json").read_text())
    assert r["mechanism"] == "dpgm" and r["guarantee"]["epsilon"] <= 4.0
    assert r["mechanism_details"]["bounds"]["row_bound"] == pytest.approx(2.0)
    model = DPGMModel.load(str(out / MODEL_FILE))
    assert model.d == 10 and model.thetas.shape[0] == 2
