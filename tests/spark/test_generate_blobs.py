"""`generate blobs` (sparkpriv.spark.generate): the sample table of the projection demo and the
command line. Runs on both PySpark legs of CI (it is Spark's mapInArrow)."""

import numpy as np
import pytest

pytestmark = pytest.mark.spark


def test_blobs_follow_their_centres_and_do_not_depend_on_the_partitioning(spark):
    from sparkpriv.spark.generate import blob_centers, generate_blobs

    rows, cols, std = 20_000, 3, 0.5
    df = generate_blobs(spark, rows=rows, cols=cols, clusters=2, separation=4.0, cluster_std=std, seed=3,
                        partitions=3)
    assert df.columns == ["id", "f0", "f1", "f2", "label"]
    a = df.toPandas().sort_values("id").reset_index(drop=True)
    assert a["id"].tolist() == list(range(rows))
    assert set(a["label"]) == {0, 1}
    # rows are a function of their id: another partitioning gives the same table
    b = generate_blobs(spark, rows=rows, cols=cols, clusters=2, separation=4.0, cluster_std=std, seed=3,
                       partitions=1).toPandas().sort_values("id").reset_index(drop=True)
    assert a.equals(b)
    # another seed, another table
    c = generate_blobs(spark, rows=rows, cols=cols, clusters=2, separation=4.0, cluster_std=std, seed=4,
                       partitions=3).toPandas().sort_values("id").reset_index(drop=True)
    assert not np.allclose(a[["f0", "f1", "f2"]].to_numpy(), c[["f0", "f1", "f2"]].to_numpy())
    # two centres exactly `separation` apart; each label's rows around its centre with spread `std`
    centres = blob_centers(cols, 2, 4.0, 3)
    assert np.linalg.norm(centres[0] - centres[1]) == pytest.approx(4.0)
    X = a[["f0", "f1", "f2"]].to_numpy()
    for lab in (0, 1):
        sel = a["label"].to_numpy() == lab
        assert 0.45 * rows < sel.sum() < 0.55 * rows  # labels uniform: 14 binomial standard deviations either side
        dev = X[sel] - centres[lab]
        # the mean within 5 standard errors, the standard deviation within 3 %
        np.testing.assert_array_less(np.abs(dev.mean(axis=0)), 5 * std / np.sqrt(sel.sum()))
        np.testing.assert_allclose(dev.std(axis=0), std, rtol=0.03)


def test_bad_parameters_name_the_parameter(spark):
    from sparkpriv.errors import ParameterError
    from sparkpriv.spark.generate import generate_blobs

    for kwargs, name in [({"rows": 0}, "rows"), ({"cols": 0}, "cols"), ({"clusters": 0}, "clusters"),
                         ({"cluster_std": -1.0}, "cluster_std")]:
        args = {"rows": 10, "cols": 2, **kwargs}
        with pytest.raises(ParameterError, match=name):
            generate_blobs(spark, **args)
