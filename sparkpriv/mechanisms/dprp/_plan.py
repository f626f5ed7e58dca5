"""DPRP's defaults, sensitivities and plan: the budget split, the noise calibration, the secret
projection (docs/dprp.md; docs/math.md section 3)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
from dp_accounting import dp_event as _ev

from sparkpriv._validation import Interval, Options, check_param, refuse_row_level_add_remove
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.projection import draw_projection_matrix
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import compose, fit_to_epsilon
from sparkpriv.privacy.bounds import NEIGHBOR_MEANING, Bounds
from sparkpriv.privacy.calibration import gdp_mu_for, split_mu
from sparkpriv.privacy.random import new_secret_seed

_log = logging.getLogger("sparkpriv.mechanisms.dprp")  # one logger for the package

LABEL_MODES = ("public", "private")
DEFAULT_BUDGET_SPLIT = (0.8, 0.2)
DEFAULT_IMPUTE_SHARE = 0.05
AMPLIFICATION_WARN = 2.5  # warn when 1 / s_min(V'^T R) exceeds this
ROW_NOISE_STAGE = 1  # public labels of the noise streams
GRAM_NOISE_STAGE = 2
IMPUTE_NOISE_STAGE = 3
_SAFETY = 1.0 + 1e-9  # relative pad on computed singular values (rounding of the SVD)


# ----------------------------------------------------------------------------- defaults


def default_k2(d: int) -> int:
    """``round(0.6 d)`` (at least 1), the paper's choice."""
    return max(1, int(round(0.6 * d)))


def default_k1(k2: int) -> int:
    """``4 k2``: amplification ``1 / s_min(V'^T R)`` about 1.7 (module docstring)."""
    return 4 * int(k2)


# ----------------------------------------------------------------------------- sensitivities


def _domain_sq(d: int, row_bound: float, n_label_columns: int, label_scale: float):
    """``(d, Z^2, s^2 or None)`` of the prepared-row domain (``s^2`` only with a private label block)."""
    s2 = float(label_scale) ** 2 if int(n_label_columns) > 0 else None
    return int(d), float(row_bound) ** 2, s2


def difference_bound_sq(d: int, row_bound: float, n_label_columns: int = 0, label_scale: float = 1.0) -> float:
    """``sup ||x - y||_2^2`` over two prepared rows ``x, y`` (replace-one); exact.

    ``max_{k=0..d} min(k + s^2, Z^2) + min(d - k + s^2, Z^2)`` with a private
    one-hot label block of value ``s`` (without one, ``s^2`` is dropped): ``d``
    at the default ``Z`` without labels, ``d + 2 s^2`` with private labels,
    ``min(2 L, d)`` for event records (``Z^2 = L``). Proof and the worst pair:
    docs/research/dprp-sensitivity.md (summary: docs/dprp.md, "Sensitivity").
    """
    d, z2, s2 = _domain_sq(d, row_bound, n_label_columns, label_scale)
    a = 0.0 if s2 is None else s2
    k = np.arange(d + 1, dtype=np.float64)
    return float(np.max(np.minimum(k + a, z2) + np.minimum(d - k + a, z2)))


def _gram_vertex_sq(d: int, s2: float | None) -> float:
    """Largest ``||triu(x x^T - y y^T)||^2`` over the vertices of the box (features in
    ``{0, 1}``, labels of two different classes with value ``s``); by the vertex
    theorem (docs/research/dprp-sensitivity.md) the supremum over the box (with any norm clip)."""
    if s2 is None:
        return d * (d + 1) / 2.0
    q = np.arange(d + 1, dtype=np.float64)
    best = 0.0
    for p in range(d + 1):  # |S| = p, |T| = q features set to 1, i = |S & T| as small as possible
        i = np.maximum(0.0, p + q - d)
        v = p * (p + 1) / 2.0 + q * (q + 1) / 2.0 - i * (i + 1) + s2 * (p + q) + 2.0 * s2 * s2
        best = max(best, float(v.max()))
    return best


def _gram_ball_sq(d: int, z2: float, s2: float | None) -> float:
    """``2 max ||triu(x x^T)||^2`` over prepared rows of norm at most ``Z``:
    ``T^2 + max sum z_i^2`` with ``z_i = x_i^2`` (caps 1, and ``s^2`` for the
    label), ``sum z_i = T = min(Z^2, d [+ s^2])``, largest caps filled first."""
    caps = [(1.0, d)] if s2 is None else sorted([(1.0, d), (s2, 1)], reverse=True)
    total = min(z2, float(d) + (0.0 if s2 is None else s2))
    left, sumsq = total, 0.0
    for cap, count in caps:
        full = min(count, int(math.floor(left / cap)))
        sumsq += full * cap * cap
        left -= full * cap
        if full < count:
            sumsq += left * left
            left = 0.0
        if left <= 0.0:
            break
    return total * total + sumsq


def gram_bound_sq(d: int, row_bound: float, n_label_columns: int = 0, label_scale: float = 1.0) -> float:
    """Upper bound on ``sup ||triu(x x^T - y y^T)||_2^2`` over two prepared rows (replace-one).

    The smaller of the vertex bound (``d (d + 1) / 2`` without labels) and the
    ball bound; exact when no row is norm-clipped (the default ``Z``) and
    whenever two rows of largest ``||triu(x x^T)||`` fit on disjoint supports
    (event records with ``d >= 2 L``: ``L (L + 1)``). Proof:
    docs/research/dprp-sensitivity.md (summary: docs/dprp.md, "Sensitivity").
    """
    d, z2, s2 = _domain_sq(d, row_bound, n_label_columns, label_scale)
    return min(_gram_vertex_sq(d, s2), _gram_ball_sq(d, z2, s2))


def projection_sensitivity(R: np.ndarray, row_bound: float, d: int | None = None,
                           label_scale: float = 1.0) -> float:
    """``sqrt(difference_bound_sq) * s_max(R)``: L2 sensitivity of ``x -> x R`` under replace-one.

    ``R`` (d_aug, k1) is the realized secret matrix; ``d`` the feature columns
    (default ``d_aug``: no label block), the other ``d_aug - d`` rows of ``R``
    the private one-hot label block of value ``label_scale``.
    """
    R = np.asarray(R, float)
    d_aug = R.shape[0]
    d = d_aug if d is None else int(d)
    smax = float(np.linalg.norm(R, 2))
    return math.sqrt(difference_bound_sq(d, row_bound, d_aug - d, label_scale)) * smax * _SAFETY


def gram_sensitivity(d: int, row_bound: float, n_label_columns: int = 0, label_scale: float = 1.0) -> float:
    """``sqrt(gram_bound_sq)``: L2 sensitivity of the upper triangle of ``X^T X`` under replace-one
    (``d (d + 1) / 2`` entries at ``Z`` the box's largest norm, without labels)."""
    return math.sqrt(gram_bound_sq(d, row_bound, n_label_columns, label_scale)) * _SAFETY


def split_budget(epsilon: float, delta: float, budget_split=DEFAULT_BUDGET_SPLIT,
                 impute_share: float | None = None) -> dict:
    """Gaussian-DP ``mu`` of each step: ``{"total", "projection", "gram", "impute"}``.

    ``mu_total = gdp_mu_for(epsilon, delta)``; with ``impute_share`` the
    imputation step gets that share of ``mu_total^2`` and the rest is split by
    ``budget_split`` (exact: ``sum mu_i^2 <= mu_total^2``).
    """
    p, g = (float(x) for x in budget_split)

    def split(mu: float) -> dict:
        if impute_share is None:
            mp, mg = split_mu(mu, [p, g])
            mi = None
        else:
            s = float(impute_share)
            mi, mp, mg = split_mu(mu, [s, (1.0 - s) * p, (1.0 - s) * g])
        return {"total": mu, "projection": mp, "gram": mg, "impute": mi}

    def events(mu: dict):
        return compose([_ev.GaussianDpEvent(1.0 / m) for m in (mu["impute"], mu["projection"], mu["gram"])
                        if m is not None])

    # the accountant's epsilon of the composed events must not exceed the request
    mu = gdp_mu_for(epsilon, delta)
    r = fit_to_epsilon(lambda r: events(split(r * mu)), epsilon=epsilon, delta=delta, caller="split_budget")
    return split(r * mu)


def _grid_noise(*, sensitivity: float, noise_multiplier: float, dim: int,
                max_abs: float) -> _noise.GaussianNoise:
    """Gaussian noise of the noise module whose grid holds ``|value| <= max_abs`` (a public bound)."""
    return _noise.gaussian_noise_from_multiplier(sensitivity=sensitivity, noise_multiplier=noise_multiplier,
                                                 dim=dim, max_abs=max_abs)


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class DPRPPlan:
    """Everything public about a calibrated DPRP release (no secrets)."""

    d: int  # feature columns
    n_label_columns: int  # one-hot block width (private labels), else 0
    k1: int
    k2: int
    row_bound: float
    neighbors: str
    label_mode: str | None
    classes: tuple
    label_scale: float
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    integer_columns: tuple[int, ...]
    budget_split: tuple[float, float]
    impute_share: float | None
    fill: float | str | None
    epsilon: float
    delta: float
    mu: dict
    projection_sensitivity: float
    gram_sensitivity: float
    projection_noise: _noise.GaussianNoise
    unit_bounds: Bounds = field(repr=False)

    @property
    def d_aug(self) -> int:
        return self.d + self.n_label_columns

    @property
    def n_groups(self) -> int:
        """Separate runs: one per class with public labels, else one."""
        return len(self.classes) if self.label_mode == "public" else 1

    def events(self) -> list:
        ev = []
        if self.mu["impute"] is not None:
            ev.append(_ev.GaussianDpEvent(1.0 / self.mu["impute"]))
        ev.append(_ev.GaussianDpEvent(1.0 / self.mu["projection"]))
        ev.append(_ev.GaussianDpEvent(1.0 / self.mu["gram"]))
        return ev

    def dp_event(self):
        """The composed event of the release (one run; per-class runs compose in parallel)."""
        return compose(self.events())

    def gram_noise(self, max_rows: int) -> _noise.GaussianNoise:
        """Noise of the Gram step for groups of at most ``max_rows`` rows."""
        d = self.d_aug
        return _grid_noise(sensitivity=self.gram_sensitivity, noise_multiplier=1.0 / self.mu["gram"],
                           dim=d * (d + 1) // 2, max_abs=max(int(max_rows), 1) * self.row_bound**2 * 1.01 + 1.0)

    def impute_noise(self, max_rows: int) -> _noise.GaussianNoise:
        """Noise of the DP column means (sums and counts of non-missing values)."""
        return _grid_noise(sensitivity=math.sqrt(2.0 * self.d) * _SAFETY,
                           noise_multiplier=1.0 / self.mu["impute"], dim=2 * self.d,
                           max_abs=max(int(max_rows), 1) * 1.01 + 1.0)

    def to_public_dict(self) -> dict:
        return {
            "d": self.d,
            "k1": self.k1,
            "k2": self.k2,
            "neighbors": self.neighbors,
            "protects": NEIGHBOR_MEANING[self.neighbors],
            "row_bound": self.row_bound,
            "feature_bounds": {"lower": list(self.lower), "upper": list(self.upper)},
            "integer_columns_rounded": list(self.integer_columns),
            "labels": self.label_mode,
            "classes": [_jsonable(c) for c in self.classes],
            "label_scale": self.label_scale if self.label_mode == "private" else None,
            "fill_for_nulls": self.fill,
            "budget": {
                "split": "Gaussian DP, exact: mu_i = sqrt(share_i) * mu_total",
                "mu_total": self.mu["total"],
                "projection_share": self.budget_split[0],
                "gram_share": self.budget_split[1],
                "impute_share_of_mu_squared": self.impute_share,
                "mu_projection": self.mu["projection"],
                "mu_gram": self.mu["gram"],
                "mu_impute": self.mu["impute"],
            },
            "sensitivity": {
                "projection_l2": self.projection_sensitivity,
                "projection_formula": "sup ||x - y||_2 over prepared rows (box [0, 1]^d, one-hot "
                                      "label block, norm <= row_bound) * s_max(R), R the realized "
                                      "secret matrix",
                "projection_input_l2": math.sqrt(difference_bound_sq(self.d, self.row_bound, self.n_label_columns,
                                                                       self.label_scale)),
                "gram_l2": self.gram_sensitivity,
                "gram_formula": "sup ||triu(x x^T - y y^T)||_2 over prepared rows (upper triangle "
                                "with the diagonal, each entry once)",
            },
            "projection_noise": self.projection_noise.to_public_dict(),
        }


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    return v


def validate_params(*, d: int, epsilon, delta, lower, upper, k1, k2, row_bound, budget_split,
                    labels, classes, label_scale, fill, impute_share, neighbors, caller: str) -> dict:
    """Check every parameter (before any secret is drawn); return normalized values."""
    check_param("epsilon", epsilon, [Interval("real", 0, None, "neither")], caller)
    if isinstance(delta, (int, float)) and not isinstance(delta, bool) and delta == 0:
        raise ParameterError(
            f"The 'delta' parameter of {caller} must be in (0, 1): DPRP adds Gaussian noise and "
            "gives (epsilon, delta)-DP. Got 0 instead: give e.g. delta=1e-6 (at most 1/n)."
        )
    check_param("delta", delta, [Interval("real", 0, 1, "neither")], caller)
    refuse_row_level_add_remove(neighbors, release="a DPRP release (one output row per person)", caller=caller)
    check_param("neighbors", neighbors, [Options(("replace-one",))], caller)
    if lower is None or upper is None:
        raise ParameterError(
            f"{caller} needs declared public per-column bounds 'lower' and 'upper' (--lower/--upper): "
            "they map every feature to [0, 1] and give the sensitivity. They must not be computed "
            "from the data itself."
        )
    lo = tuple(float(v) for v in np.atleast_1d(np.asarray(lower, float)))
    hi = tuple(float(v) for v in np.atleast_1d(np.asarray(upper, float)))
    Bounds(d, lo, hi, _caller=caller)  # shape, finiteness and order checks
    check_param("labels", labels, [None, Options(LABEL_MODES)], caller)
    n_lab = 0
    if labels is not None:
        if classes is None or len(classes) < 2 or len(set(classes)) != len(classes):
            raise ParameterError(
                f"The 'classes' parameter of {caller} must list at least two distinct declared label "
                f"values. Got {None if classes is None else list(classes)!r} instead: a label column "
                "with one class cannot be released with labels."
            )
        if labels == "private":
            n_lab = len(classes)
    check_param("label_scale", label_scale, [Interval("real", 0, None, "neither")], caller)
    d_aug = d + n_lab
    if k2 is None:
        k2 = default_k2(d_aug)
    check_param("k2", k2, [Interval("integer", 1, d_aug, "both")], caller)
    if k1 is None:
        k1 = default_k1(k2)
    check_param("k1", k1, [Interval("integer", 1, None, "left")], caller)
    if k1 < k2:
        raise ParameterError(
            f"The 'k1' parameter of {caller} must be at least k2 = {k2} (the reconstruction inverts "
            f"the k2 x k1 matrix V'^T R). Got {k1} instead; the default is 4 * k2 = {4 * k2}."
        )
    if k1 < 4 * k2:
        _log.warning("%s: k1 = %d < 4 k2 = %d: the reconstruction amplifies the projection noise "
                     "(1/s_min(V'^T R) about %.1f); prefer k1 >= %d", caller, k1, 4 * k2,
                     1.0 / max(1.0 - math.sqrt(k2 / k1), 0.05), 4 * k2)
    # largest norm of a prepared row: d features in [0, 1] plus one label entry label_scale
    zmax = math.sqrt(d + (float(label_scale) ** 2 if n_lab else 0.0))
    if row_bound is None:
        row_bound = zmax
    check_param("row_bound", row_bound, [Interval("real", 1e-3, None, "both")], caller)
    # no prepared row is longer than zmax: a larger declared bound is the same bound (and a bound
    # of 1e15 on the [0, 1] scale would leave the Gram noise no grid to be drawn on)
    row_bound = min(float(row_bound), zmax)
    split = _check_split(budget_split, caller)
    if isinstance(fill, str):
        if fill != "dp-mean":
            raise ParameterError(
                f"The 'fill' parameter of {caller} must be a number (a public constant, in the "
                f"columns' units) or 'dp-mean'. Got {fill!r} instead."
            )
        check_param("impute_share", impute_share, [Interval("real", 0, 1, "neither")], caller)
    else:
        check_param("fill", fill, [None, Interval("real", None, None, "neither")], caller)
    return {"lower": lo, "upper": hi, "k1": int(k1), "k2": int(k2), "row_bound": float(row_bound),
            "budget_split": split, "n_label_columns": n_lab}


def plan_dprp(R: np.ndarray, *, d: int, epsilon: float, delta: float, lower, upper, k2: int,
              row_bound: float, budget_split, labels, classes, label_scale: float,
              integer_columns=(), fill=None, impute_share: float | None = None,
              neighbors: str = "replace-one") -> DPRPPlan:
    """Calibrate a DPRP release for the realized ``R`` (parameters already validated)."""
    d_aug, k1 = R.shape
    n_lab = d_aug - d
    imp = float(impute_share) if fill == "dp-mean" else None
    mu = split_budget(epsilon, delta, budget_split, imp)
    ps = projection_sensitivity(R, row_bound, d, label_scale)
    gsens = gram_sensitivity(d, row_bound, n_lab, label_scale)
    # |x R|_j <= ||x|| ||R e_j|| <= Z s_max(R): the row noise grid must hold it
    zs = float(row_bound) * float(np.linalg.norm(np.asarray(R, float), 2))
    pnoise = _grid_noise(sensitivity=ps, noise_multiplier=1.0 / mu["projection"], dim=k1,
                         max_abs=zs * 1.02 + 1e-300)
    unit_hi = (1.0,) * d + (float(label_scale),) * n_lab
    unit = Bounds(d_aug, (0.0,) * d_aug, unit_hi, row_bound=float(row_bound))
    return DPRPPlan(
        d=d, n_label_columns=n_lab, k1=k1, k2=int(k2), row_bound=float(row_bound), neighbors=neighbors,
        label_mode=labels, classes=tuple(classes) if classes is not None else (),
        label_scale=float(label_scale), lower=tuple(lower), upper=tuple(upper),
        integer_columns=tuple(int(i) for i in integer_columns), budget_split=tuple(budget_split),
        impute_share=imp, fill=fill, epsilon=float(epsilon), delta=float(delta), mu=mu,
        projection_sensitivity=ps, gram_sensitivity=gsens, projection_noise=pnoise, unit_bounds=unit,
    )


def draw_secrets(d_aug: int, k1: int) -> tuple[np.ndarray, int]:
    """The secret ``R`` (d_aug, k1), ``N(0, 1/k1)`` entries, and a noise seed, from OS entropy."""
    r_seed = new_secret_seed("dprp-matrix")
    return draw_projection_matrix(d_aug, k1, r_seed), new_secret_seed("dprp-noise")


def _check_split(budget_split, caller: str) -> tuple:
    try:
        split = tuple(float(x) for x in budget_split)
    except (TypeError, ValueError):
        split = ()
    if len(split) != 2 or not all(math.isfinite(x) and x > 0 for x in split) or abs(sum(split) - 1.0) > 1e-9:
        raise ParameterError(
            f"The 'budget_split' parameter of {caller} must be two positive shares (projection, Gram) "
            f"of the Gaussian-DP budget that sum to 1, e.g. (0.8, 0.2). Got {budget_split!r} instead."
        )
    return split
