"""Audit of private linear regression (docs/math.md section 6): the sketch ``S M + W`` and the
additive baseline ``M + W``, replace-one (the only relation offered).

Sketch: the auditor fixes the secret sketch seed (so it knows ``S``) and the
worst-case pair for the realized ``S``: the record at the column ``i*`` of
largest norm is ``x = B v`` in ``D`` and ``x' = -B v`` in ``D'`` (given at three
times the bound, so that the release's clipping makes them), which moves
``S M`` by ``2 B ||S_{:,i*}||``, the claimed sensitivity. The noisy matrix is
made by the auditor exactly as ``finalize_sketch`` makes it (checked bit for
bit), then ``add_noise`` with the release's noise runs ``n`` trials at once.

Additive: the changed row moves by ``2 B``; the whole noisy table is the
release (checked against ``additive_noise_rows``).

Claims: the plan's recorded ``GaussianDpEvent`` (its epsilon at delta, by
dp_accounting, and ``mu = 1 / multiplier``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sparkpriv.mechanisms import regression as reg
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.random import stream

from ._audit import N_GAUSS, check, gaussian_game, gaussian_step_claim, grid_integers, trials_of, weaken_noise

pytestmark = pytest.mark.audit

DELTA = 1e-3
EPS = 1.0
B = 1.0
N = N_GAUSS
REST = np.array([[0.1, 0.2], [-0.3, 0.1], [0.05, -0.4], [0.2, 0.2], [-0.1, -0.1]])  # (a, b) rows
SKETCH_SEED = 0x5EED


def _plan(scheme: str):
    n = len(REST) + 1
    params = reg.RegressionParams(method="sketch", row_bound=B, epsilon=EPS, delta=DELTA, scheme=scheme,
                                  sketch_rows=3 if scheme == "sketch" else None)
    plan = reg.plan_regression(params, reg.RegressionFacts(n), d=1)
    return dataclasses.replace(plan, sketch_seed=SKETCH_SEED, noise_seed=4)


def _tables(S: np.ndarray | None):
    n = len(REST) + 1
    i = int(np.argmax(np.linalg.norm(S, axis=0))) if S is not None else n - 1
    v = np.array([0.6, 0.8])
    t_d = np.insert(REST, i, 3.0 * B * v, axis=0)
    t_dp = np.insert(REST, i, -3.0 * B * v, axis=0)
    return t_d, t_dp


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("scheme", ["sketch", "additive"])
def test_regression_release(scheme, control, monkeypatch):
    if control:
        weaken_noise(monkeypatch)
    plan = _plan(scheme)
    n = plan.n
    if scheme == "sketch":
        S = reg.sketch_matrix(SKETCH_SEED, plan.m, n)
        t_d, t_dp = _tables(S)
        M_d, _ = reg.clip_regression_rows(t_d[:, :1], t_d[:, 1], B)
        M_dp, _ = reg.clip_regression_rows(t_dp[:, :1], t_dp[:, 1], B)
        parts = reg.sketch_partial(M_d, SKETCH_SEED, plan.m, 0)
        noise, sens = reg.sketch_noise(plan, parts[2], float(parts[1].max()))
        assert sens == pytest.approx(2 * B * np.linalg.norm(S, axis=0).max(), rel=1e-12)
        v_d, v_dp = S @ M_d, S @ M_dp
        assert np.linalg.norm(v_d - v_dp) == pytest.approx(sens, rel=1e-9)  # the pair attains the claim
        # the auditor's matrix is the one finalize_sketch noises, draw for draw
        rel = reg.finalize_sketch(reg.pack_partial(*parts), plan, rng=stream(3, reg.NOISE_STAGE, 0))
        assert np.array_equal(rel.R, nz.add_noise(parts[0], noise, stream(3, reg.NOISE_STAGE, 0)))
        np.testing.assert_allclose(parts[0], v_d, rtol=1e-12, atol=1e-15)
    else:
        t_d, t_dp = _tables(None)
        v_d, _ = reg.clip_regression_rows(t_d[:, :1], t_d[:, 1], B)
        v_dp, _ = reg.clip_regression_rows(t_dp[:, :1], t_dp[:, 1], B)
        noise = plan.additive_noise()
        assert noise.sensitivity == 2 * B
        ref = reg.additive_noise_rows(v_d, plan, stream(3, reg.ADDITIVE_STAGE, 0))
        assert np.array_equal(ref, nz.add_noise(v_d, noise, stream(3, reg.ADDITIVE_STAGE, 0)))
    g = noise.grid
    u = np.rint(np.ravel(v_d) / g).astype(np.int64)
    up = np.rint(np.ravel(v_dp) / g).astype(np.int64)
    I_d = grid_integers(nz.add_noise(trials_of(v_d, N), noise, stream(61, 1)), g)
    I_dp = grid_integers(nz.add_noise(trials_of(v_dp, N), noise, stream(62, 1)), g)
    eps_claim, mu_claim = gaussian_step_claim(plan.dp_event(), DELTA)
    res = gaussian_game(f"regression {scheme}, replace-one, L2 row bound", I_d, I_dp, u, up, noise.sigma,
                        eps_claim, DELTA, mu_claim, control=control)
    check(res)


@pytest.mark.parametrize("scheme", ["sketch", "additive"])
def test_regression_accounted_epsilon_within_request(scheme):
    assert _plan(scheme).accounted_epsilon() <= EPS


@pytest.mark.spark
def test_spark_regression_noise_is_the_audited_noise_and_relations(spark):
    """The Spark release runs the audited numpy functions: its receipt states the noise of the
    numpy reference for the same secrets, and it accepts replace-one only."""
    from sparkpriv.api import release_regression
    from sparkpriv.errors import ParameterError
    from sparkpriv.privacy.random import insecure_fixed_seed

    rng = np.random.default_rng(0)
    X = rng.uniform(-0.5, 0.5, (300, 3))
    df = spark.createDataFrame([tuple(map(float, r)) for r in X], "a double, b double, y double")
    kw = dict(method="sketch", columns=["a", "b"], target="y", row_bound=B, epsilon=EPS, delta=DELTA, sketch_rows=5)
    with insecure_fixed_seed(1):
        rel = release_regression(df, **kw)
    with insecure_fixed_seed(1):
        ref = reg.release_regression_array(X[:, :2], X[:, 2], reg.RegressionParams(
            method="sketch", row_bound=B, epsilon=EPS, delta=DELTA, sketch_rows=5))
    noise = rel.public["noise"]
    assert noise["sigma"] == ref.noise.sigma and noise["grid"] == ref.noise.grid
    assert rel.public["sensitivity_value"] == pytest.approx(ref.sensitivity, rel=1e-12)
    assert rel.events == ref.plan.dp_event()
    for relation in ("add-remove", "element"):
        with pytest.raises(ParameterError):
            release_regression(df, **dict(kw, neighbors=relation))
