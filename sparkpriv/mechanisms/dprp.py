"""DPRP: private table release by noisy random projection + noisy covariance
(Gondara & Wang, UAI 2020; docs/math.md section 3, corrected).

Algorithm (on rows prepared as below, ``d`` columns after preparation)::

    R    ~ N(0, 1/k1)^{d x k1}                      secret, OS entropy
    P'   = X R + M1,   M1 i.i.d. Gaussian per entry  (projection step)
    C'   = X^T X + M2, M2 symmetric: upper triangle i.i.d., mirrored  (Gram step)
    V'   = top-k2 eigenvectors of C' (eigh)
    M    = (V'^T R)^+ V'^T                          (k1 x d), driver only
    X'   = P' M                                     (n x d)

Preparation of a row (one function, :func:`prepare_rows`, used by the numpy
path and by every Spark batch): nulls are filled (public constant or DP column
mean), each feature is mapped to ``[0, 1]`` by its declared public bounds
``(x - lower) / (upper - lower)`` and clipped to the box, a private label is
appended as a one-hot block with value ``label_scale``, and the row is clipped
to the L2 ball of radius ``Z = row_bound`` (default ``sqrt(d_features +
label_scale^2)``, the largest norm the box allows, so the norm clip never
changes a row). The output is decoded by :func:`decode_rows`: features clipped
to ``[0, 1]``, mapped back to ``[lower, upper]``, integer columns rounded; a
private label is the argmax of its reconstructed block. All of this is
post-processing of the two noisy quantities.

Privacy
-------
Neighbour relation: replace-one (one record replaced; ``n`` public), the
library default. Labels declared public (``labels="public"``) are public data:
a neighbour changes one record's features and keeps its label.

Sensitivities (exact suprema over the prepared-row domain; proofs in
docs/dprp.md, section "Sensitivity"). A prepared row ``x`` is non-negative,
its features are at most 1, its label block (private labels) has one entry
of value at most ``s = label_scale`` and ``||x||_2 <= Z``:

* Projection: one record changes one row of ``X R`` by ``(x - y) R``, so
  ``Delta_2(X R) = D s_max(R)`` for the realized ``R``, with
  ``D^2 = sup ||x - y||^2 = max_k min(k + s^2, Z^2) + min(d - k + s^2, Z^2)``
  (:func:`difference_bound_sq`; ``s = 0`` without a label block): ``d`` at
  the default ``Z`` (``d + 2 s^2`` with private labels; ``min(2 L, d)`` for
  event records). Exact for ``D`` (attained by two rows on disjoint
  supports); deterministic given ``R`` (the paper's Lemma 2 holds only with
  probability ``1 - delta`` for one fixed pair). ``R`` is independent of the
  data, so the guarantee holds conditional on every ``R``, hence
  unconditionally.
* Gram: the code noises the ``d (d + 1) / 2`` unique entries of ``X^T X``
  (upper triangle with the diagonal, each once, mirrored), which move by
  ``triu(x x^T - y y^T)``. Its supremum is attained at vertices of the box
  (features in {0, 1}): ``d (d + 1) / 2`` without labels, ``d (d + 1) / 2 +
  d + 2`` with private labels of scale 1 (:func:`gram_bound_sq`). With a
  norm clip below the box's largest norm the calibration is the smaller of
  that and ``2 max ||triu(x x^T)||^2``, exact when two largest rows fit on
  disjoint supports (event records with ``d >= 2 L``: ``L (L + 1)``).
  The general bounds ``2 Z`` and ``sqrt(2) Z^2`` (any real rows) over-noise
  by about 2x on the box and are not used.

Calibration (docs/math.md section 1): both steps are Gaussian mechanisms, split
exactly in Gaussian DP. ``mu = gdp_mu_for(epsilon, delta)`` is the largest
``mu`` whose (epsilon, delta) curve meets the target; shares ``w`` (default
80 % projection / 20 % Gram, ``budget_split``) give ``mu_i = sqrt(w_i) mu``
(rounded down), ``sum mu_i^2 <= mu^2``, and each step's noise multiplier is
``1 / mu_i`` (``sigma_i = Delta_i / mu_i``). The events are
``GaussianDpEvent(1 / mu_i)``; dp_accounting's PLD gives the composed
epsilon at ``delta``, which can exceed the analytic value slightly, so
``mu`` is lowered until it is at most the target (``fit_to_epsilon``; tested). The noise objects of
:mod:`sparkpriv.privacy.noise` (discrete Gaussian on a power-of-two grid) have
multipliers at least ``1 / mu_i`` (checked at run time), so the recorded
nominal events are conservative. With ``fill="dp-mean"`` a third Gaussian
step (per-column noisy sums and counts of non-missing values, L2 sensitivity
``sqrt(2 d)`` under replace-one: each of the ``d`` sums moves by at most 1 on
the ``[0, 1]`` scale and each count by at most 1) gets ``impute_share`` of
``mu^2`` first. Public labels: each class is released by its own run on the
rows of that class (each record is in exactly one class): parallel
composition, the overall event is the event of one run, and the class sizes
are released (said in the receipt).

Grids: a Gram entry can be as large as ``n Z^2``, far above the about 90
sigma that the noise module's default grid holds. The Gram (and imputation)
noise passes the public bound ``n Z^2`` (``n`` is public under replace-one) as
``max_abs`` to :func:`~sparkpriv.privacy.noise.gaussian_noise_from_multiplier`,
which coarsens the power-of-two grid (sigma stays at least ``2^30`` grid
steps, i.e. ``n Z^2 <= 2^32 sigma_gram``: ``n`` up to about ``3e9 / mu_gram``
at the default ``Z``, where ``sigma_gram >= Z^2 / (sqrt(2) mu_gram)``; a larger
``n`` is refused with a ParameterError). The row noise passes
``Z s_max(R)``, the largest ``|x R|_j``.

Public: ``d``, ``k1``, ``k2``, the bounds, ``Z``, the noise scales and
sensitivities (``D s_max(R)`` reveals ``s_max(R)``, as the projection
release reveals its sensitivity), the class values and, with public labels,
the class sizes. Secret: ``R`` and the noise seeds (never written, logged or
raised).

k1 and k2 (data-independent defaults)
-------------------------------------
``k2 = round(0.6 d)`` as in the paper. The noise of a released row is
``e M`` with ``e ~ N(0, sigma_1^2 I_k1)``: its energy is
``sigma_1^2 ||(V'^T R)^+||_F^2``, and ``sigma_1`` is proportional to
``s_max(R) ~ 1 + sqrt(d / k1)`` while the reconstruction amplifies by up to
``1 / s_min(V'^T R)``, about ``1 - sqrt(k2 / k1)`` (0.06 at ``k1 = k2``, 0.43
at ``2 k2``, 0.60 at ``4 k2``; docs/math.md). Both improve as ``k1`` grows, with a
cost (flops and noise draws per row) linear in ``k1``. ``k1 = 4 k2``
(``= 2.4 d``) keeps the amplification below about 2 and ``s_max(R)`` near
1.65 at a cost of ``4 k2`` noise draws per row. A warning is logged when
``k1 < 4 k2`` or the realized ``s_min(V'^T R)`` is below
``1 / AMPLIFICATION_WARN`` (the value itself is not logged: it depends on
``R``).

Event records (sparse person records): :mod:`sparkpriv.mechanisms.dprp_records`.

Reconstruction is exact without noise on data of rank ``r <= k2``: the rows
lie in the span of ``V'`` (top-``k2`` eigenvectors of ``X^T X``), so
``X R = (X V')(V'^T R)`` and ``V'^T R`` (``k2 x k1``, ``k1 >= k2``) has full row
rank almost surely, so ``X R (V'^T R)^+ V'^T = X V' V'^T = X`` (tested).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from dp_accounting import dp_event as _ev

from sparkpriv._validation import Interval, Options, check_param, refuse_row_level_add_remove
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.projection import draw_projection_matrix
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import compose, epsilon_of, fit_to_epsilon
from sparkpriv.privacy.bounds import NEIGHBOR_MEANING, Bounds, ClipCounts, clip_rows
from sparkpriv.privacy.calibration import gdp_mu_for, split_mu
from sparkpriv.privacy.random import new_secret_seed, stream

__all__ = [
    "check_noise_multiplier",
    "DPRPPlan",
    "DPRPArrayRelease",
    "LABEL_MODES",
    "DEFAULT_BUDGET_SPLIT",
    "default_k1",
    "default_k2",
    "projection_sensitivity",
    "gram_sensitivity",
    "difference_bound_sq",
    "gram_bound_sq",
    "split_budget",
    "plan_dprp",
    "draw_secrets",
    "prepare_rows",
    "gram_partial",
    "gram_from_partial",
    "impute_partial",
    "dp_column_means",
    "noisy_grams",
    "reconstruction_matrix",
    "reconstruct_rows",
    "decode_rows",
    "release_dprp_array",
]

_log = logging.getLogger(__name__)

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
    docs/dprp.md, section "Sensitivity".
    """
    d, z2, s2 = _domain_sq(d, row_bound, n_label_columns, label_scale)
    a = 0.0 if s2 is None else s2
    k = np.arange(d + 1, dtype=np.float64)
    return float(np.max(np.minimum(k + a, z2) + np.minimum(d - k + a, z2)))


def _gram_vertex_sq(d: int, s2: float | None) -> float:
    """Largest ``||triu(x x^T - y y^T)||^2`` over the vertices of the box (features in
    ``{0, 1}``, labels of two different classes with value ``s``); by the vertex
    theorem of docs/dprp.md the supremum over the box (with any norm clip)."""
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
    (event records with ``d >= 2 L``: ``L (L + 1)``). Proof: docs/dprp.md,
    section "Sensitivity".
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
    check_param("row_bound", row_bound, [Interval("real", 0, None, "neither")], caller)
    try:
        split = tuple(float(x) for x in budget_split)
    except (TypeError, ValueError):
        split = ()
    if len(split) != 2 or not all(math.isfinite(x) and x > 0 for x in split) or abs(sum(split) - 1.0) > 1e-9:
        raise ParameterError(
            f"The 'budget_split' parameter of {caller} must be two positive shares (projection, Gram) "
            f"of the Gaussian-DP budget that sum to 1, e.g. (0.8, 0.2). Got {budget_split!r} instead."
        )
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


# ----------------------------------------------------------------------------- per-batch work


def fill_missing(X: np.ndarray, missing: np.ndarray | None, values: np.ndarray | None) -> np.ndarray:
    """Replace ``X[missing]`` by the per-column ``values`` (in place); returns ``X``."""
    if missing is not None and values is not None and missing.any():
        cols = np.nonzero(missing)[1]
        X[missing] = np.asarray(values, float)[cols]
    return X


def prepare_rows(X: np.ndarray, plan: DPRPPlan, codes: np.ndarray | None = None
                 ) -> tuple[np.ndarray, ClipCounts]:
    """Scale features to [0, 1], append the private label block, clip to the box and ball.

    ``X`` (n_samples, d) in the columns' units, already filled; ``codes`` the class
    index of each row (needed for private labels). Returns ``(X_prepared, counts)``
    of shape (n_samples, d_aug).
    """
    n, d = X.shape
    lo = np.asarray(plan.lower, float)
    inv_w = 1.0 / (np.asarray(plan.upper, float) - lo)
    out = np.empty((n, plan.d_aug), dtype=np.float64)
    np.subtract(X, lo, out=out[:, :d])
    out[:, :d] *= inv_w
    if plan.n_label_columns:
        out[:, d:] = 0.0
        out[np.arange(n), d + np.asarray(codes, np.int64)] = plan.label_scale
    return clip_rows(out, plan.unit_bounds, out=out)


def gram_partial(Xp: np.ndarray, groups: np.ndarray | None, n_groups: int) -> np.ndarray:
    """Per group: ``[count, upper triangle of Xp_g^T Xp_g (row-major)]``, float64.

    Shape ``(n_groups * (1 + d (d + 1) / 2),)``; summed over batches and
    partitions it gives every group's size and Gram matrix.
    """
    d = Xp.shape[1]
    iu = np.triu_indices(d)
    t = 1 + iu[0].size
    out = np.zeros(n_groups * t, dtype=np.float64)
    for g in range(n_groups):
        Xg = Xp if groups is None else Xp[groups == g]
        if Xg.shape[0] == 0:
            continue
        G = Xg.T @ Xg
        out[g * t] = Xg.shape[0]
        out[g * t + 1:(g + 1) * t] = G[iu]
    return out


def gram_from_partial(total: np.ndarray, d: int, n_groups: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(counts, [symmetric Gram (d, d) per group])`` from a summed :func:`gram_partial`."""
    iu = np.triu_indices(d)
    t = 1 + iu[0].size
    counts = np.empty(n_groups)
    grams = []
    for g in range(n_groups):
        v = total[g * t:(g + 1) * t]
        counts[g] = v[0]
        G = np.zeros((d, d))
        G[iu] = v[1:]
        G[iu[1], iu[0]] = v[1:]
        grams.append(G)
    return counts, grams


def impute_partial(X: np.ndarray, missing: np.ndarray, plan: DPRPPlan) -> np.ndarray:
    """``[sums of non-missing values on the [0, 1] scale (clipped), counts of non-missing, rows]``.

    Shape ``(2 d + 1,)``. Only the first ``2 d`` entries are noised; the row
    count (public under replace-one) sizes the noise grid.
    """
    lo = np.asarray(plan.lower, float)
    w = np.asarray(plan.upper, float) - lo
    U = np.clip((X - lo) / w, 0.0, 1.0)
    U[missing] = 0.0
    present = ~missing
    return np.concatenate([U.sum(axis=0), present.sum(axis=0).astype(np.float64), [float(X.shape[0])]])


def dp_column_means(total: np.ndarray, noise, rng: np.random.Generator | None, plan: DPRPPlan) -> np.ndarray:
    """Column means in the columns' units from a summed :func:`impute_partial`.

    Noise is added once, on the driver (``noise=None``: exact means, for tests).
    """
    d = plan.d
    noisy = total[:2 * d] if noise is None else _noise.add_noise(total[:2 * d], noise, rng)
    m = np.clip(noisy[:d] / np.maximum(noisy[d:], 1.0), 0.0, 1.0)
    lo = np.asarray(plan.lower, float)
    return lo + m * (np.asarray(plan.upper, float) - lo)


# ----------------------------------------------------------------------------- driver solve


def noisy_grams(grams: Sequence[np.ndarray], noise, rng: np.random.Generator | None) -> list[np.ndarray]:
    """Add symmetric noise once per group (``noise=None``: no noise, for tests)."""
    if noise is None:
        return [np.array(G, float) for G in grams]
    return [_noise.add_noise_symmetric(G, noise, rng) for G in grams]


def reconstruction_matrix(C: np.ndarray, R: np.ndarray, k2: int) -> tuple[np.ndarray, float]:
    """``M = (V'^T R)^+ V'^T`` (k1, d) from the symmetric ``C`` (d, d); and ``s_min(V'^T R)``."""
    w, V = np.linalg.eigh(C)
    Vk = V[:, np.argsort(w)[::-1][:k2]]  # top-k2 eigenvectors, (d, k2)
    A = Vk.T @ R  # (k2, k1)
    U, s, Wt = np.linalg.svd(A, full_matrices=False)
    smin = float(s[-1])
    if smin <= s[0] * 1e-12:
        raise ParameterError("The matrix V'^T R is singular; increase k1.")  # probability 0
    M = (Wt.T / s) @ (U.T @ Vk.T)  # pinv(A) @ Vk.T
    return M, smin


def solve(grams_noisy: Sequence[np.ndarray], R: np.ndarray, k2: int, *, caller: str = "dprp") -> list[np.ndarray]:
    """Reconstruction matrices of every group; warns on bad conditioning (value not logged)."""
    Ms = []
    bad = 0
    for C in grams_noisy:
        M, smin = reconstruction_matrix(C, R, k2)
        bad += smin * AMPLIFICATION_WARN < 1.0
        Ms.append(M)
    if bad:
        _log.warning("%s: the realized V'^T R amplifies the projection noise by more than %.1fx "
                     "in %d of %d run(s); use a larger k1", caller, AMPLIFICATION_WARN, bad, len(Ms))
    return Ms


def reconstruct_rows(Xp: np.ndarray, R: np.ndarray, Ms: Sequence[np.ndarray], groups: np.ndarray | None,
                     noise, rng: np.random.Generator | None) -> np.ndarray:
    """``X' = (Xp R + noise) M_g`` row by row (``noise=None``: without noise, for tests)."""
    P = Xp @ R
    if noise is not None:
        P = _noise.add_noise(P, noise, rng)
    if groups is None or len(Ms) == 1:
        return P @ Ms[0]
    out = np.empty((Xp.shape[0], Ms[0].shape[1]))
    for g, M in enumerate(Ms):
        idx = np.flatnonzero(groups == g)
        if idx.size:
            out[idx] = P[idx] @ M
    return out


def decode_rows(Xr: np.ndarray, plan: DPRPPlan) -> tuple[np.ndarray, np.ndarray | None]:
    """Back to the columns' scale: clip to [0, 1], unscale, round integer columns.

    Returns ``(features (n, d), label codes (n,) or None)``; with private labels
    the code is the argmax of the reconstructed one-hot block.
    """
    d = plan.d
    lo = np.asarray(plan.lower, float)
    X = lo + np.clip(Xr[:, :d], 0.0, 1.0) * (np.asarray(plan.upper, float) - lo)
    if plan.integer_columns:
        ic = list(plan.integer_columns)
        X[:, ic] = np.clip(np.rint(X[:, ic]), np.ceil(lo[ic]), np.floor(np.asarray(plan.upper)[ic]))
    codes = np.argmax(Xr[:, d:], axis=1) if plan.n_label_columns else None
    return X, codes


# ----------------------------------------------------------------------------- in-memory release


@dataclass(frozen=True)
class DPRPArrayRelease:
    """The result of :func:`release_dprp_array`."""

    X: np.ndarray
    y: np.ndarray | None
    plan: DPRPPlan
    clip_counts: ClipCounts
    class_sizes: dict | None

    @property
    def event(self):
        return self.plan.dp_event()

    def epsilon(self, delta: float | None = None) -> float:
        return epsilon_of(self.plan.dp_event(), self.plan.delta if delta is None else delta)


def release_dprp_array(
    X: np.ndarray,
    y: np.ndarray | None = None,
    *,
    epsilon: float,
    delta: float,
    lower,
    upper,
    labels: str | None = None,
    classes: Sequence | None = None,
    k1: int | None = None,
    k2: int | None = None,
    row_bound: float | None = None,
    budget_split=DEFAULT_BUDGET_SPLIT,
    integer_columns: Sequence[int] = (),
    fill: float | str | None = None,
    impute_share: float = DEFAULT_IMPUTE_SHARE,
    label_scale: float = 1.0,
    neighbors: str = "replace-one",
    _noise_free: bool = False,
) -> DPRPArrayRelease:
    """DPRP release of an in-memory table (the single-machine library).

    The Spark path (:func:`sparkpriv.spark.dprp.release_dprp`) runs the same
    functions per Arrow batch (:func:`prepare_rows`, :func:`gram_partial`,
    :func:`reconstruct_rows`, :func:`decode_rows`) and the same driver solve.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
        Missing values are NaN (filled by ``fill``).
    y : ndarray of shape (n_samples,), optional
        Labels (``labels`` must then say how they are treated).
    epsilon : float > 0
    delta : float in (0, 1)
    lower, upper : sequence of float, shape (n_features,)
        Declared public bounds of each column (mapped to [0, 1]).
    labels : {"public", "private"}, optional
    classes : sequence, optional
        Declared label values (required for private labels; public default:
        the values in ``y``, which are public then).
    k1, k2 : int, optional
        Projection dimension and number of eigenvectors (defaults: module docstring).
    row_bound : float, optional
        ``Z`` on the [0, 1] scale (default: the box's largest norm, no clipping).
    budget_split : (float, float)
        Shares of the Gaussian-DP budget for (projection, Gram); sum 1.
    integer_columns : sequence of int
        Columns rounded back to integers.
    fill : float or "dp-mean", optional
        Public constant for NaN, or a DP column mean (spends ``impute_share``).
    impute_share : float in (0, 1)
        Share of ``mu^2`` spent on DP means with ``fill="dp-mean"``.
    label_scale : float > 0
        Value of the one-hot label block (private labels).

    Returns
    -------
    DPRPArrayRelease
        ``X`` (n_samples, n_features) released, ``y`` released labels (public:
        unchanged; private: decoded), the public plan, clip counts (owner
        diagnostics) and the class sizes (public labels).

    Privacy
    -------
    Module docstring: replace-one, exact sensitivities over the declared domain
    (``sqrt(d) s_max(R)`` and ``sqrt(d (d + 1) / 2)`` at the default ``Z``
    without labels) enforced by the box and norm clip, Gaussian noise composed
    in Gaussian DP to (epsilon, delta); public-label classes in parallel.
    """
    caller = "release_dprp_array"
    refuse_row_level_add_remove(neighbors, release="a DPRP release (one output row per person)", caller=caller)
    X = np.array(X, dtype=np.float64, copy=True)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ParameterError(f"X must be a non-empty 2-D array (n_samples, n_features). Got shape {X.shape}.")
    n, d = X.shape
    if y is not None and labels is None:
        raise ParameterError(
            f"{caller} got labels y: declare them labels='public' (released as they are, one run "
            "per class, class sizes released) or labels='private' (protected, decoded by argmax)."
        )
    if labels is not None and y is None:
        raise ParameterError(f"The 'labels' parameter of {caller} is {labels!r} but no labels y were given.")
    if y is not None:
        y = np.asarray(y)
        if y.shape != (n,):
            raise ParameterError(f"y must have shape ({n},). Got {y.shape}.")
        if classes is None:
            if labels == "private":
                raise ParameterError(
                    f"The 'classes' parameter of {caller} is required with private labels: declare "
                    "the label values (reading them from the data would leak them)."
                )
            classes = tuple(np.unique(y).tolist())
            if len(classes) < 2:
                raise ParameterError(f"The label column has one class only ({classes[0]!r}): there is "
                                     "nothing to separate; release without labels.")
    v = validate_params(d=d, epsilon=epsilon, delta=delta, lower=lower, upper=upper, k1=k1, k2=k2,
                        row_bound=row_bound, budget_split=budget_split, labels=labels, classes=classes,
                        label_scale=label_scale, fill=fill, impute_share=impute_share,
                        neighbors=neighbors, caller=caller)
    codes = None
    if y is not None:
        lookup = {c: i for i, c in enumerate(classes)}
        try:
            codes = np.array([lookup[c] for c in y.tolist()], dtype=np.int64)
        except KeyError as exc:
            raise ParameterError(f"y holds the value {exc.args[0]!r}, which is not a declared class.") from None
    missing = np.isnan(X)
    if np.isinf(X).any():
        raise ParameterError(f"X has infinite values in column index {int(np.flatnonzero(np.isinf(X).any(0))[0])}.")
    if missing.any() and fill is None:
        raise ParameterError(
            f"X has missing values (NaN) in column index {int(np.flatnonzero(missing.any(0))[0])}; "
            "give fill (a public constant) or fill='dp-mean'."
        )
    R, seed = draw_secrets(d + v["n_label_columns"], v["k1"])
    plan = plan_dprp(R, d=d, epsilon=epsilon, delta=delta, lower=v["lower"], upper=v["upper"], k2=v["k2"],
                     row_bound=v["row_bound"], budget_split=v["budget_split"], labels=labels,
                     classes=classes, label_scale=label_scale, integer_columns=integer_columns,
                     fill=fill, impute_share=impute_share, neighbors=neighbors)
    if fill == "dp-mean":
        tot = impute_partial(np.where(missing, 0.0, X), missing, plan)
        if _noise_free:
            means = dp_column_means(tot, None, None, plan)
        else:
            means = dp_column_means(tot, plan.impute_noise(n), stream(seed, IMPUTE_NOISE_STAGE), plan)
        fill_missing(X, missing, means)
    elif fill is not None:
        fill_missing(X, missing, np.full(d, float(fill)))
    groups = codes if labels == "public" else None
    Xp, counts = prepare_rows(X, plan, codes)
    total = gram_partial(Xp, groups, plan.n_groups)
    sizes, grams = gram_from_partial(total, plan.d_aug, plan.n_groups)
    if _noise_free:
        Cs, row_noise, rng = noisy_grams(grams, None, None), None, None
    else:
        Cs = noisy_grams(grams, plan.gram_noise(int(sizes.max())), stream(seed, GRAM_NOISE_STAGE))
        row_noise, rng = plan.projection_noise, stream(seed, ROW_NOISE_STAGE, 0)
    Ms = solve(Cs, R, plan.k2, caller=caller)
    Xr = reconstruct_rows(Xp, R, Ms, groups, row_noise, rng)
    del R
    Xout, out_codes = decode_rows(Xr, plan)
    if labels == "public":
        y_out = y.copy()
    elif labels == "private":
        y_out = np.asarray(classes, dtype=object if y.dtype == object else y.dtype)[out_codes]
    else:
        y_out = None
    class_sizes = ({_jsonable(c): int(s) for c, s in zip(classes, sizes)} if labels == "public" else None)
    return DPRPArrayRelease(X=Xout, y=y_out, plan=plan, clip_counts=counts, class_sizes=class_sizes)


def check_noise_multiplier(noise, mu: float) -> None:
    """Internal invariant: the recorded event of ``noise`` is at least as noisy as the
    plan's Gaussian-DP share ``mu`` (multiplier >= 1 / mu); raises RuntimeError if not."""
    m = noise.dp_event().noise_multiplier
    if not m >= 1.0 / mu:
        raise RuntimeError("noise multiplier below the planned one")
