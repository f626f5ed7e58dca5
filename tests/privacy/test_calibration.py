"""Calibration against closed forms and the numbers in docs/math.md."""

import math

import pytest
from scipy.stats import norm

from sparkpriv.errors import ParameterError
from sparkpriv.privacy.calibration import (
    calibrate_analytic_gaussian,
    calibrate_laplace,
    gaussian_delta,
    gdp_epsilon_delta,
    gdp_mu_for,
    split_mu,
)


def test_laplace_closed_form():
    assert calibrate_laplace(sensitivity=3.0, epsilon=0.5) == 6.0


def test_analytic_gaussian_matches_math_md():
    # docs/math.md: at epsilon = 1, delta = 1e-5 analytic sigma = 3.73 Delta (classic: 4.84)
    s = calibrate_analytic_gaussian(sensitivity=1.0, epsilon=1.0, delta=1e-5)
    assert s == pytest.approx(3.73, abs=0.005)
    classic = math.sqrt(2 * math.log(1.25 / 1e-5))
    assert classic == pytest.approx(4.84, abs=0.01)
    assert calibrate_analytic_gaussian(sensitivity=2.5, epsilon=1.0, delta=1e-5) == pytest.approx(2.5 * s)


def test_achieved_delta_is_at_most_target_and_tight():
    for eps in (0.1, 1.0, 8.0, 20.0):
        s = calibrate_analytic_gaussian(sensitivity=1.0, epsilon=eps, delta=1e-5)
        # independent closed form (Balle & Wang 2018, Theorem 8) with scipy's norm
        d = norm.cdf(-eps * s + 1 / (2 * s)) - math.exp(eps) * norm.cdf(-eps * s - 1 / (2 * s))
        assert d <= 1e-5
        s2 = s * 0.999
        d2 = norm.cdf(-eps * s2 + 1 / (2 * s2)) - math.exp(eps) * norm.cdf(-eps * s2 - 1 / (2 * s2))
        assert d2 > 1e-5


def test_classic_formula_fails_at_large_epsilon():
    # the reason we use the analytic mechanism: docs/math.md says classic fails for eps >= 8.42
    eps = 9.0
    classic = math.sqrt(2 * math.log(1.25 / 1e-5)) / eps
    assert gaussian_delta(classic, eps) > 1e-5


def test_gdp_roundtrip_and_split():
    mu = gdp_mu_for(1.0, 1e-5)
    assert gdp_epsilon_delta(mu, 1e-5) == pytest.approx(1.0, rel=1e-6)
    parts = split_mu(mu, [0.8, 0.2])
    assert sum(p * p for p in parts) <= mu * mu
    assert parts[0] == pytest.approx(math.sqrt(0.8) * mu)


@pytest.mark.parametrize("kw", [
    {"sensitivity": 1.0, "epsilon": 0.0, "delta": 1e-5},
    {"sensitivity": 1.0, "epsilon": 1.0, "delta": 0.0},
    {"sensitivity": -1.0, "epsilon": 1.0, "delta": 1e-5},
    {"sensitivity": 1.0, "epsilon": 1.0, "delta": 1.0},
])
def test_bad_parameters(kw):
    with pytest.raises(ParameterError, match="parameter of calibrate_analytic_gaussian"):
        calibrate_analytic_gaussian(**kw)


def test_split_rejects_overspend():
    with pytest.raises(ParameterError):
        split_mu(1.0, [0.8, 0.3])
