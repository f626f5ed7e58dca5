"""DP k-means of bounded person records from an event table (sparse, kernel features)."""

import json
import os

import numpy as np
import pytest

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import kmeans as km
from sparkpriv.mechanisms.sparse import densify_rows, sparse_rows_from_lists
from sparkpriv.privacy.bounds import Bounds
from sparkpriv.api import release_kmeans
from sparkpriv.spark.engine import SparkEngine
from sparkpriv.spark.events import bound_contributions

pytestmark = pytest.mark.spark

D_VOC, L, K = 30, 4, 3


@pytest.fixture(scope="module")
def events(spark):
    # three groups of people, each using a few towers of its own area of a 30-tower map;
    # every 10th person also passes three more towers of the area (more than L: truncated)
    rng = np.random.default_rng(4)
    rows = []
    for p in range(240):
        area = p % 3
        towers = rng.choice(np.arange(area * 10, area * 10 + 4), size=rng.integers(2, 5))
        if p % 10 == 0:
            towers = np.concatenate([towers, area * 10 + np.array([4, 5, 6])])
        rows += [(f"u{p:03d}", int(t), i) for i, t in enumerate(np.repeat(towers, 2))]
    return spark.createDataFrame(rows, "caller string, tower int, t int").repartition(4)


def _records(events):
    return bound_contributions(events, person="caller", item="tower", max_items=L,
                               vocabulary=f"range:0:{D_VOC}", seed=b"k" * 16, source="events")


def _dense(recs):
    rows = recs.df.collect()
    off, idx = sparse_rows_from_lists([r["items"] for r in rows])
    return densify_rows(off, idx, None, recs.d)


def test_sparse_features_and_sums_on_spark_equal_dense_numpy_before_noise(spark, events):
    recs = _records(events)
    d = recs.d
    fmap = km.make_feature_map("kernel", Bounds(d, (0.0,) * d, (1.0,) * d, L ** 0.5), kernel_width=1.5,
                               frequencies=8, seed=3)
    centres = km.initial_centres(fmap, K, np.random.default_rng(1))
    engine = SparkEngine()
    src = engine.open(recs, columns=None, fill=None, caller="t")
    cache = engine.cache(src, km._features_fn(fmap, None), fmap.dim)
    try:
        got = cache.aggregate(km._stats_fn(centres), K * (fmap.dim + 1)).reshape(K, -1)
        assert cache.rows == 240
    finally:
        cache.release()
    fin = engine.aggregate(src, km._input_stats_fn(fmap, centres), K * (d + 1)).reshape(K, -1)
    # independent numpy on the densified records: explicit cos/sin features, loop per cluster
    X = _dense(recs)
    assert X.shape == (240, d) and X.sum(axis=1).max() <= L
    P = X @ fmap.W.T
    Z = np.hstack([np.cos(P), np.sin(P)]) / np.sqrt(fmap.W.shape[0])
    lab = np.argmin(((Z[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
    for j in range(K):
        assert got[j, 0] == np.sum(lab == j) == fin[j, 0]
        np.testing.assert_allclose(got[j, 1:], Z[lab == j].sum(axis=0), rtol=1e-10, atol=1e-9)
        np.testing.assert_array_equal(fin[j, 1:], X[lab == j].sum(axis=0))


def test_release_kmeans_of_event_records(spark, events, tmp_path, test_seed):
    recs = _records(events)
    init = np.zeros((K, D_VOC))  # a PUBLIC sample: one point per area (random domain points can
    for j in range(K):           # merge two areas, as docs/kmeans.md shows for blobs)
        init[j, j * 10:j * 10 + 2] = 1.0
    rel = release_kmeans(recs, k=K, epsilon=8.0, delta=1e-5, iterations=5, kernel_width=1.5,
                             frequencies=32, init=init)
    out = str(tmp_path / "rel")
    report = str(tmp_path / "owner.json")
    rel.write(out, owner_report=report)
    model = rel.model
    assert model.centers.shape == (K, D_VOC)
    receipt = json.load(open(os.path.join(out, "_privacy_receipt.json")))
    det = receipt["mechanism_details"]
    assert det["parameters"]["contribution_bound"]["max_items"] == L
    assert det["parameters"]["bounds"]["row_bound"] == pytest.approx(L ** 0.5)
    text = json.dumps(receipt)
    assert "u000" not in text and "people_truncated" not in text
    assert json.load(open(report))["diagnostics"]["people_truncated"] > 0
    # utility sanity check at epsilon 8: each released centre puts most of its mass on one area
    areas = np.add.reduceat(np.clip(model.centers, 0, None), [0, 10, 20], axis=1)
    assert sorted(np.argmax(areas, axis=1).tolist()) == [0, 1, 2]


def test_event_records_errors(spark, events):
    recs = _records(events)
    with pytest.raises(ParameterError, match="must be 'kernel' for bounded event records"):
        release_kmeans(recs, k=K, epsilon=1.0, delta=1e-5, variant="linear")
    with pytest.raises(ParameterError, match="'row_bound'.* do not apply to bounded event records"):
        release_kmeans(recs, k=K, epsilon=1.0, delta=1e-5, kernel_width=1.0, row_bound=2.0)
    with pytest.raises(ParameterError, match="'columns' parameter of release_kmeans is required"):
        release_kmeans(events, k=K, epsilon=1.0, delta=1e-5, kernel_width=1.0)


def test_cli_release_kmeans_from_events(spark, events, tmp_path):
    from sparkpriv.cli import main

    src = str(tmp_path / "ev.parquet")
    events.write.parquet(src)
    out = str(tmp_path / "out")
    base = ["release", "kmeans", "--input", src, "--events", "--person-col", "caller", "--item-col",
            "tower", "--max-items", str(L), "--vocabulary", f"0..{D_VOC - 1}", "--k", str(K),
            "--epsilon", "2", "--delta", "1e-5", "--kernel-width", "1.5", "--frequencies", "16",
            "--iterations", "3"]
    assert main([*base, "--output", out]) == 0
    assert spark.read.parquet(out).count() == K
    assert main([*base, "--output", str(tmp_path / "o2"), "--columns", "tower"]) == 2
