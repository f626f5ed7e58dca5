"""The Spark releases run the audited numpy cores: their noise and receipts are
those the numpy audits measured, and every relation they accept is audited.

The Spark paths are not audited trial by trial: each batch runs the same numpy
functions (another suite checks the Spark output equals the numpy output bit
for bit). Here: the receipt's noise of a Spark release equals the noise of the
audited core calibration for the same public parameters and secret matrix,
the released values sit on that noise's grid, and the relations the Spark
functions accept are all in the audit table of ``test_coverage.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparkpriv.errors import ParameterError
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.bounds import NEIGHBORS, Bounds

from .test_coverage import AUDITED
from .test_projection import D, K, KEY, R, matrix

pytestmark = [pytest.mark.audit, pytest.mark.spark]

COLS = [f"x{i}" for i in range(D)]


def _df(spark, n: int = 16, seed: int = 0):
    X = np.random.default_rng(seed).uniform(-0.6, 0.6, size=(n, D))
    return spark.createDataFrame([tuple(float(v) for v in row) for row in X], COLS), X


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_spark_projection_noise_is_the_audited_noise(spark, noise):
    from sparkpriv import release_projection
    from sparkpriv.mechanisms.projection import plan_projection

    df, X = _df(spark)
    delta = 1e-3 if noise == "gaussian" else 0.0
    rel = release_projection(df, columns=COLS, k=K, epsilon=1.0, delta=delta, noise=noise, row_bound=R,
                             matrix_key=KEY)
    P = matrix()
    plan = plan_projection(P, Bounds(D, row_bound=R), epsilon=1.0, delta=delta, noise=noise)
    assert rel.public["noise"] == plan.noise.to_public_dict()
    assert rel.public["sensitivity"]["value"] == plan.sensitivity
    assert rel.epsilon == epsilon_of(plan.dp_event(), delta)
    Z = np.array(rel.df.select(*[f"z{i}" for i in range(K)]).collect(), dtype=float)
    g = plan.noise.grid
    assert np.array_equal(np.rint(Z / g), Z / g)  # on the audited grid
    rel.abandon("audit test")


def test_spark_kmeans_noise_is_the_audited_noise(spark):
    from sparkpriv import release_kmeans
    from sparkpriv.mechanisms import kmeans as km

    df, _ = _df(spark, n=25)
    rel = release_kmeans(df, columns=COLS, k=2, epsilon=1.0, delta=1e-3, iterations=1, variant="linear",
                         row_bound=1.0)
    fmap = km.make_feature_map("linear", Bounds(D, row_bound=1.0))
    plan = km.plan_kmeans(fmap, k=2, epsilon=1.0, delta=1e-3, iterations=1)
    assert rel.public["iteration_noise"] == plan.iter_noise.to_public_dict()
    assert rel.public["gdp"]["mu_per_iteration"] == plan.mu_iter
    assert rel.epsilon == plan.epsilon_spent()
    rel.abandon("audit test")


def test_spark_dprp_budget_is_the_audited_split(spark):
    from sparkpriv import release_dprp
    from sparkpriv.mechanisms import dprp as core

    df, _ = _df(spark, n=20)
    rel = release_dprp(df, columns=COLS, epsilon=1.5, delta=1e-3, lower=[-1.0] * D, upper=[1.0] * D)
    mu = core.split_budget(1.5, 1e-3, core.DEFAULT_BUDGET_SPLIT)
    b = rel.public["budget"]
    assert (b["mu_total"], b["mu_projection"], b["mu_gram"]) == (mu["total"], mu["projection"], mu["gram"])
    pn = rel.public["projection_noise"]
    assert pn["sigma"] / pn["grid_sensitivity"] >= 1.0 / mu["projection"]
    assert pn["sensitivity"] == rel.public["sensitivity"]["projection_l2"]
    rel.abandon("audit test")


def _accepted(call) -> bool:
    try:
        rel = call()
    except ParameterError:
        return False
    rel.abandon("audit probe")
    return True


def test_spark_relations_are_audited(spark):
    from sparkpriv import release_dprp, release_kmeans, release_projection

    df, _ = _df(spark, n=25)
    offered = set()
    for rel in NEIGHBORS:
        for noise, delta in (("laplace", 0.0), ("gaussian", 1e-3)):
            kw = {"element_bound": 0.5} if rel == "element" else {"row_bound": R}
            kind = "element_bound" if rel == "element" else "l2"
            if _accepted(lambda: release_projection(df, columns=COLS, k=K, epsilon=1.0, delta=delta, noise=noise,
                                                    neighbors=rel, **kw)):
                offered.add(("projection", noise, rel, kind))
        if _accepted(lambda: release_projection(df, columns=COLS, k=K, epsilon=1.0, neighbors=rel,
                                                row_bound_quantile=0.9)):
            offered.add(("row-bound-quantile", "laplace", rel, "histogram"))
        if _accepted(lambda: release_dprp(df, columns=COLS, epsilon=1.0, delta=1e-3, lower=[-1.0] * D,
                                          upper=[1.0] * D, neighbors=rel)):
            offered.add(("dprp", "gaussian", rel, "table"))
        if _accepted(lambda: release_kmeans(df, columns=COLS, k=2, epsilon=1.0, delta=1e-3, iterations=1,
                                            variant="linear", row_bound=1.0, neighbors=rel)):
            offered.add(("kmeans-linear", "gaussian", rel, "rows"))
    missing = sorted(offered - set(AUDITED))
    assert not missing, f"relations the Spark releases accept with no audit: {missing}"
