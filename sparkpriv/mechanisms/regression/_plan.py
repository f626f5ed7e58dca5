"""Private regression's plan, made from public parameters before any data is read, clipping and
the additive scheme's row noise (docs/math.md section 6)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from dp_accounting import dp_event

from sparkpriv._validation import Interval, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import epsilon_of, fit_to_epsilon
from sparkpriv.privacy.bounds import Bounds, ClipCounts, clip_rows
from sparkpriv.privacy.calibration import gdp_mu_for
from sparkpriv.privacy.random import new_secret_seed
from sparkpriv.mechanisms.regression._params import RegressionParams
from sparkpriv.mechanisms.regression._sketch import sketch_rows_for


@dataclass(frozen=True)
class RegressionFacts:
    """Public facts the plan needs: the row count ``n`` (public under replace-one)."""

    n: int


@dataclass(frozen=True)
class RegressionPlan:
    """Everything about a calibrated regression release. Public in :meth:`to_public_dict`;
    the seeds are held here for the engines and never appear in it (nor in ``repr``)."""

    params: RegressionParams
    n: int
    d: int
    m: int
    noise_multiplier: float
    mu: float
    epsilon: float
    delta: float
    sketch_seed: int = field(default=0, repr=False, compare=False)
    noise_seed: int = field(default=0, repr=False, compare=False)

    @property
    def p(self) -> int:
        return self.d + 1

    @property
    def scheme(self) -> str:
        return self.params.scheme

    @property
    def rows_released(self) -> int:
        return self.m if self.scheme == "sketch" else self.n

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.p, row_bound=float(self.params.row_bound), _caller="release_regression")

    def dp_event(self) -> dp_event.DpEvent:
        """The one recorded event; the noise drawn later has multiplier at least this."""
        return dp_event.GaussianDpEvent(self.noise_multiplier)

    def accounted_epsilon(self) -> float:
        return epsilon_of(self.dp_event(), self.delta)

    def additive_noise(self) -> _noise.GaussianNoise:
        """The additive scheme's per-row noise (sensitivity 2B, dim p, values within B)."""
        B = float(self.params.row_bound)
        return _noise.gaussian_noise_from_multiplier(sensitivity=2.0 * B, noise_multiplier=self.noise_multiplier,
                                                     dim=self.p, max_abs=B)

    def to_public_dict(self) -> dict:
        pr = self.params
        return {
            "mechanism": "linear regression on a sample-mixing sketch" if self.scheme == "sketch"
            else "linear regression, additive noise baseline (M + W)",
            "scheme": self.scheme,
            "features": list(pr.features),
            "target": pr.target,
            "n": self.n,
            "d": self.d,
            "sketch_rows": self.m if self.scheme == "sketch" else None,
            "sketch_rule": (pr.sketch_rule if pr.sketch_rows is None else "given") if self.scheme == "sketch" else None,
            "row_bound": float(pr.row_bound),
            "neighbors": pr.neighbors,
            "protects": "one row (a person) replaced by any other row within the row bound",
            "noise_multiplier": self.noise_multiplier,
            "gaussian_dp_mu": self.mu,
            "sensitivity": ("2 row_bound max_i ||S_:,i||_2 of the realized secret sketch (docs/math.md section 6)"
                            if self.scheme == "sketch" else "2 row_bound"),
            "ridge": float(pr.ridge),
            "debias": bool(pr.debias),
        }


def plan_regression(params: RegressionParams, facts: RegressionFacts, *, d: int | None = None,
                    caller: str = "release_regression") -> RegressionPlan:
    """Validate, fix ``m`` and the noise multiplier, draw the secret seeds. Reads no data.

    ``d`` (the number of features) defaults to ``len(params.features)``.
    """
    if params.method != "sketch":
        raise ParameterError(f"{caller} plans the sketch: give method='sketch' (method='ssp' releases through "
                             "sparkpriv.api.release_regression).")
    params.validate(caller)
    d = len(params.features) if d is None else int(d)
    if d < 1:
        raise ParameterError(f"{caller} needs at least one feature column. Got none.")
    n = facts.n
    check_param("n", n, [Interval("integer", 1, None, "left")], caller)
    p = d + 1
    if params.scheme == "sketch":
        if params.sketch_rows is not None:
            m = int(params.sketch_rows)
            if m > n:
                raise ParameterError(
                    f"The 'sketch_rows' parameter of {caller} must be at most the number of rows n = {n} "
                    f"(S is m x n; m = n is the 'full' sketch). Got {m} instead: lower it, or use "
                    "sketch_rule='full'."
                )
        else:
            m = sketch_rows_for(params.sketch_rule, n, p)
    else:
        m = n
    eps, delta = float(params.epsilon), float(params.delta)
    mu = gdp_mu_for(eps, delta)
    r = fit_to_epsilon(lambda r: dp_event.GaussianDpEvent(1.0 / (r * mu)), epsilon=eps, delta=delta, caller=caller)
    z = 1.0 / (r * mu)
    return RegressionPlan(params, int(n), d, int(m), float(z), float(r * mu), eps, delta,
                          sketch_seed=new_secret_seed("regression-sketch"),
                          noise_seed=new_secret_seed("regression-noise"))


def clip_regression_rows(A: np.ndarray, b: np.ndarray, row_bound: float) -> tuple[np.ndarray, ClipCounts]:
    """``M = [A b]`` clipped to ``||m_i||_2 <= row_bound`` and the clip counts."""
    M = np.concatenate([np.asarray(A, np.float64), np.asarray(b, np.float64).reshape(-1, 1)], axis=1)
    return clip_rows(M, Bounds(M.shape[1], row_bound=float(row_bound), _caller="release_regression"), out=M)


def additive_noise_rows(Mc: np.ndarray, plan: RegressionPlan, rng: np.random.Generator) -> np.ndarray:
    """``M + W`` for clipped rows (the additive baseline's row map)."""
    return _noise.add_noise(Mc, plan.additive_noise(), rng)
