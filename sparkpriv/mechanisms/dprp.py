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

The mechanism (docs/architecture.md): :class:`DPRPParams` and :class:`DPRP`
(``dprp``), for tables and bounded event records, on either engine.
:meth:`DPRP.plan` validates, draws ``R`` and the noise seed (the secrets) and
calibrates every step, so every event (the DP-means pass with
``fill="dp-mean"`` too) is known before the budget is reserved.
:meth:`DPRP.run`: the DP-means pass (optional) and the Gram pass through
``engine.aggregate`` (only the sums reach the driver), the noise added once
and the solve on the driver, then the rows pass through ``engine.map_rows``:
row noise from ``stream(seed, ROW_NOISE_STAGE, partition id)``, drawn block
after block, so a retried task reproduces it. The release function is
:func:`sparkpriv.api.release_dprp`.

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
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.mechanisms.projection import draw_projection_matrix
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import compose, epsilon_of, fit_to_epsilon
from sparkpriv.privacy.bounds import NEIGHBOR_MEANING, Bounds, ClipCounts, clip_rows
from sparkpriv.privacy.calibration import gdp_mu_for, split_mu
from sparkpriv.privacy.random import new_secret_seed, stream

__all__ = [
    "check_noise_multiplier",
    "DPRP",
    "DPRPParams",
    "DPRPPlan",
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
    "fill_value_std",
    "released_value_std",
    "noisy_grams",
    "reconstruction_matrix",
    "reconstruct_rows",
    "decode_rows",
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


def dp_column_means(total: np.ndarray, noise, rng: np.random.Generator | None, plan: DPRPPlan,
                    *, with_std: bool = False):
    """Column means in the columns' units from a summed :func:`impute_partial`.

    Noise is added once, on the driver (``noise=None``: exact means, for tests).
    ``with_std``: also their first-order std (:func:`fill_value_std`, from the
    noisy counts: post-processing), returned as ``(means, std)``.
    """
    d = plan.d
    noisy = total[:2 * d] if noise is None else _noise.add_noise(total[:2 * d], noise, rng)
    m = np.clip(noisy[:d] / np.maximum(noisy[d:], 1.0), 0.0, 1.0)
    lo = np.asarray(plan.lower, float)
    means = lo + m * (np.asarray(plan.upper, float) - lo)
    if with_std:
        return means, fill_value_std(m, noisy[d:], 0.0 if noise is None else noise.std, plan)
    return means


def fill_value_std(means01: np.ndarray, noisy_counts: np.ndarray, noise_std: float, plan: DPRPPlan) -> np.ndarray:
    """First-order (delta method) std of the DP column means, in the columns' units:
    ``sigma sqrt(1 + m^2) / max(count, 1) (upper - lower)``, ``m`` the mean on the [0, 1]
    scale, ``sigma`` the noise std of each sum and each count, ``count`` the noisy count of
    non-missing values (docs/dprp.md, "Uncertainty"; meaningful when the count is far above sigma)."""
    m = np.asarray(means01, float)
    w = np.asarray(plan.upper, float) - np.asarray(plan.lower, float)
    return float(noise_std) * np.sqrt(1.0 + m * m) / np.maximum(np.asarray(noisy_counts, float), 1.0) * w


def released_value_std(M: np.ndarray, noise, plan: DPRPPlan) -> np.ndarray:
    """Std of the noise in each released column, before the decode's clip: ``(e M)_j`` with ``e``
    i.i.d. of the row noise's variance, so ``std_j = s ||M[:, j]||_2``; feature columns are mapped
    to the columns' units (times ``upper - lower``); label-block columns stay on their scale."""
    s = math.sqrt(float(noise.variance))
    std = s * np.linalg.norm(np.asarray(M, float), axis=0)
    w = np.asarray(plan.upper, float) - np.asarray(plan.lower, float)
    std[:plan.d] *= w
    return std


def uncertainty_public(dplan: DPRPPlan, Ms: Sequence[np.ndarray], columns: Sequence[str], *,
                       fill_std=None, kind: str = "table") -> dict:
    """The receipt's ``uncertainty`` of a DPRP release (public: functions of the noisy Gram, the
    realized ``R`` and the public noise scale; docs/dprp.md, "Uncertainty")."""
    stds = [released_value_std(M, dplan.projection_noise, dplan) for M in Ms]
    if kind == "records":
        v = stds[0]  # bounds [0, c]: already in events (c (e M)_j)
        return {
            "value_std": {"min": float(v.min()), "median": float(np.median(v)), "max": float(v.max())},
            "value_note": "std of the noise in each item's reconstructed value (in events) before the "
                          "threshold: an item is released when value >= threshold; the noise is Gaussian, "
                          "so an item whose noise-free value is t is released with probability "
                          "1 - Phi((threshold - t) / std)",
            "docs": "docs/dprp.md",
        }
    names = list(columns)

    def per_column(std):
        return {c: float(v) for c, v in zip(names, std[:dplan.d])}

    if dplan.label_mode == "public":
        value_std = {str(_jsonable(c)): per_column(sd) for c, sd in zip(dplan.classes, stds)}
    else:
        value_std = per_column(stds[0])
    out = {
        "value_std": value_std,
        "value_std_by": "class (labels are public: one run per class)" if dplan.label_mode == "public"
                        else "column",
        "value_note": "each released cell is the noise-free reconstruction (x R M of the prepared row) plus "
                      "Gaussian noise of this std, in the column's units, then clipped to [lower, upper]; "
                      "95%: value +- 1.96 std covers the clipped noise-free reconstruction (at least 95%: the "
                      "clip only moves a value closer); integer columns: add 0.5 (rounding). The "
                      "reconstruction's own error against the input (rank k2, the noisy Gram) is not in it",
        "docs": "docs/dprp.md",
    }
    if dplan.label_mode == "private":
        out["label_note"] = "private labels are decoded by argmax: no interval"
    if fill_std is not None:
        out["fill_value_std"] = {c: float(v) for c, v in zip(names, fill_std)}
        out["fill_note"] = ("first-order std of each DP column mean (dp_fill_values), from the noisy count "
                            "of non-missing values; 95%: fill +- 1.96 std")
    return out


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


def check_noise_multiplier(noise, mu: float) -> None:
    """Internal invariant: the recorded event of ``noise`` is at least as noisy as the
    plan's Gaussian-DP share ``mu`` (multiplier >= 1 / mu); raises RuntimeError if not."""
    m = noise.dp_event().noise_multiplier
    if not m >= 1.0 / mu:
        raise RuntimeError("noise multiplier below the planned one")


# ----------------------------------------------------------------------------- the mechanism (protocol)

DEFAULT_THRESHOLD = 0.5  # event records: a released person visited an item when X'_j >= this
_POS = Interval("real", 0, None, "neither")
_EMPTY = "The input table is empty: there is nothing to release."


@dataclass(frozen=True, kw_only=True)
class DPRPParams(_p.Params):
    """Public parameters of the DPRP release (docs/dprp.md; docs/math.md section 3)."""

    epsilon: float = _p.option(help="the total epsilon of the release", constraints=[_POS])
    delta: float = _p.option(help="the total delta of the release, in (0, 1): DPRP adds Gaussian noise and "
                             "needs a delta (e.g. 1e-6, at most 1/n)", kind="float")
    columns: tuple = _p.option(None, help="numeric feature columns (one row per person); integer columns "
                               "are rounded back to integers; not with event records", kind="strs")
    lower: tuple | None = _p.option(None, help="declared per-column lower bounds (one value for all columns, "
                                    "or one per column); features are mapped to [0, 1] by them",
                                    kind="floats", required_unless="events")
    upper: tuple | None = _p.option(None, help="declared per-column upper bounds (one value for all columns, "
                                    "or one per column)", kind="floats", required_unless="events")
    label: str | None = _p.option(None, help="label column (integer, string or boolean)", kind="str")
    labels: str | None = _p.option(None, help="how the label is treated: public (released as is, one run per "
                                   "class, class sizes released) or private (protected, decoded by argmax)",
                                   constraints=[Options(LABEL_MODES)])
    classes: tuple | None = _p.option(None, help="the declared label values, comma-separated (required with "
                                      "--label)", kind="strs")
    k1: int | None = _p.option(None, help="projection dimension", doc_default="4 k2",
                               constraints=[Interval("integer", 1, None, "left")])
    k2: int | None = _p.option(None, help="eigenvectors kept", doc_default="round(0.6 d); with --events "
                               "min(d, 64)", constraints=[Interval("integer", 1, None, "left")])
    row_bound: float | None = _p.option(None, help="L2 bound of a row on the [0, 1] scale (rows are clipped "
                                        "to it)", doc_default="the largest norm the bounds allow: no clipping",
                                        constraints=[_POS])
    budget_split: tuple = _p.option(DEFAULT_BUDGET_SPLIT, help="shares of the Gaussian-DP budget for "
                                    "projection,Gram (sum 1)", kind="floats", doc_default="0.8,0.2")
    fill: float | str | None = _p.option(None, help="public value that replaces nulls in the feature "
                                         "columns, or 'dp-mean': DP column means (spends impute_share of "
                                         "the budget; one more read of the input)", kind="float")
    impute_share: float = _p.option(DEFAULT_IMPUTE_SHARE, help="share of the Gaussian-DP budget (mu^2) for "
                                    "--fill-dp-mean", doc_default="0.05",
                                    constraints=[Interval("real", 0, 1, "neither")])
    label_scale: float = _p.option(1.0, help="value of the one-hot label entry with private labels",
                                   doc_default="1.0", constraints=[_POS])
    keep_columns: tuple = _p.option((), help="input columns declared PUBLIC, copied to the output "
                                    "unchanged", kind="strs")
    threshold: float | None = _p.option(None, help="event tables: a released person visited an item when "
                                        "its reconstructed value (events; 1 for binary) is at least this; "
                                        "the output is items array<int>", doc_default="0.5",
                                        constraints=[_POS])
    neighbors: str = _p.option("replace-one", help="neighbour relation: replace-one (a person; n is "
                               "public). add-remove cannot hold for a row-level release and is refused",
                               kind="neighbors")
    integer_columns: object = _p.option((), help="indices of columns rounded back to integers besides those "
                                        "of an integer type (in-memory float arrays)", kind="object",
                                        cli=False)

    def check(self, caller: str) -> None:
        """The rules that need no schema; the others are in :meth:`DPRP.plan` (public only)."""
        if isinstance(self.delta, (int, float)) and not isinstance(self.delta, bool) and self.delta == 0:
            raise ParameterError(
                f"The 'delta' parameter of {caller} must be in (0, 1): DPRP adds Gaussian noise and "
                "gives (epsilon, delta)-DP. Got 0 instead: give e.g. delta=1e-6 (at most 1/n)."
            )
        check_param("delta", self.delta, [Interval("real", 0, 1, "neither")], caller)
        if self.label is not None and self.labels is None:
            raise ParameterError(
                f"{caller} got label={self.label!r}: declare labels='public' (released as they are, one run "
                "per class, class sizes released) or labels='private' (protected, decoded by argmax)."
            )
        if self.labels is not None and self.label is None:
            raise ParameterError(f"The 'labels' parameter of {caller} is {self.labels!r} but no label column "
                                 "was given.")
        if self.classes is not None and (len(self.classes) < 2 or len(set(self.classes)) != len(self.classes)):
            raise ParameterError(
                f"The 'classes' parameter of {caller} must list at least two distinct declared label "
                f"values. Got {list(self.classes)!r} instead: a label column with one class cannot be "
                "released with labels."
            )
        if self.k1 is not None and self.k2 is not None and self.k1 < self.k2:
            raise ParameterError(
                f"The 'k1' parameter of {caller} must be at least k2 = {self.k2} (the reconstruction inverts "
                f"the k2 x k1 matrix V'^T R). Got {self.k1} instead; the default is 4 * k2 = {4 * self.k2}."
            )
        _check_split(self.budget_split, caller)
        if isinstance(self.fill, str):
            if self.fill != "dp-mean":
                raise ParameterError(
                    f"The 'fill' parameter of {caller} must be a number (a public constant, in the "
                    f"columns' units) or 'dp-mean'. Got {self.fill!r} instead."
                )
        else:
            check_param("fill", self.fill, [None, Interval("real", None, None, "neither")], caller)


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


@dataclass
class _DPRPState:
    """What :meth:`DPRP.run` needs besides the secrets (all public)."""

    plan: DPRPPlan
    kind: str
    label: str | None = None
    keep: tuple = ()
    threshold: float = DEFAULT_THRESHOLD
    cap: object = None  # ItemCap of event records
    noise_free: bool = False  # tests only (set on a plan's state by hand): the passes without noise


class DPRP(_p.Mechanism):
    """DPRP: noisy random projection + noisy Gram; the same columns on the same scale."""

    name = "dprp"
    title = "DPRP (a row-level release)"
    summary = "DPRP private table release: noisy random projection + noisy Gram, same columns and scale"
    Params = DPRPParams
    neighbors = (_p.REPLACE_ONE,)
    refused_neighbors = {"element": "it protects whole records (people), not single attributes"}
    row_level = True
    inputs = ("table", "records")

    def open_args(self, params: DPRPParams) -> dict:
        # fill (a constant or "dp-mean") is applied by the mechanism on the null mask, so that
        # the same values are filled on every engine; the label is decoded to class codes
        labels = None
        if params.label is not None and params.classes is not None:
            labels = (params.label, tuple(params.classes))
        return {"columns": params.columns, "fill": params.fill, "labels": labels,
                "missing": params.fill is not None, "keep": tuple(params.keep_columns)}

    def plan(self, params: DPRPParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        if facts.kind == "records":
            return self._plan_records(params, facts, caller)
        if params.threshold is not None:
            raise ParameterError(
                f"The 'threshold' parameter of {caller} applies to bounded event records only: a table "
                "release keeps its columns and scale (threshold the released columns afterwards)."
            )
        columns, keep = list(facts.columns), list(params.keep_columns)
        label, labels = params.label, params.labels
        classes = facts.classes if label is not None else None
        if label is not None:
            if classes is None or not classes:
                raise ParameterError(
                    f"The 'classes' parameter of {caller} is required with a label column: declare the "
                    "label values (e.g. classes=[0, 1] / --classes 0,1)."
                )
            if label in columns or label in keep:
                raise ParameterError(f"The label column {label!r} must not also be a feature or kept column.")
        overlap = set(columns) & set(keep)
        if overlap:
            raise ParameterError(
                f"Column {sorted(overlap)[0]!r} is both a feature column and a kept public column; "
                "a released column cannot be both private input and public output."
            )
        d = facts.d
        lower = None if params.lower is None else _per_column(params.lower, d, "lower", caller)
        upper = None if params.upper is None else _per_column(params.upper, d, "upper", caller)
        v = validate_params(d=d, epsilon=params.epsilon, delta=params.delta, lower=lower, upper=upper,
                            k1=params.k1, k2=params.k2, row_bound=params.row_bound,
                            budget_split=params.budget_split, labels=labels, classes=classes,
                            label_scale=params.label_scale, fill=params.fill, impute_share=params.impute_share,
                            neighbors="replace-one", caller=caller)
        ints = sorted(set(facts.integer_columns) | {int(i) for i in params.integer_columns})
        if ints and not (0 <= ints[0] and ints[-1] < d):
            raise ParameterError(f"The 'integer_columns' parameter of {caller} must hold column indices in "
                                 f"[0, {d}). Got {list(params.integer_columns)!r}.")
        R, seed = draw_secrets(d + v["n_label_columns"], v["k1"])
        dplan = plan_dprp(R, d=d, epsilon=params.epsilon, delta=params.delta, lower=v["lower"],
                          upper=v["upper"], k2=v["k2"], row_bound=v["row_bound"], budget_split=v["budget_split"],
                          labels=labels, classes=classes, label_scale=params.label_scale, integer_columns=ints,
                          fill=params.fill, impute_share=params.impute_share)
        event = dplan.dp_event()
        public = dict(dplan.to_public_dict(), matrix_source="OS entropy, discarded after the job",
                      events_note="GaussianDpEvent(1/mu_i) per step; the noise objects' own multipliers "
                                  "are at least these (checked)")
        resolved = {"columns": columns, "classes": [_jsonable(c) for c in dplan.classes], "k1": dplan.k1,
                    "k2": dplan.k2, "row_bound": dplan.row_bound, "budget_split": list(dplan.budget_split),
                    "impute_share": dplan.impute_share, "label_scale": dplan.label_scale,
                    "lower": list(dplan.lower), "upper": list(dplan.upper), "keep_columns": keep,
                    "bounds": {"lower": list(dplan.lower), "upper": list(dplan.upper)}}
        state = _DPRPState(dplan, "table", label=label, keep=tuple(keep))
        return _p.Plan(events=event, epsilon=epsilon_of(event, dplan.delta), delta=dplan.delta, public=public,
                       neighbors=_p.REPLACE_ONE, state=state, secrets=(R, seed), parameters=resolved)

    def _plan_records(self, params: DPRPParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        from sparkpriv.mechanisms.dprp_records import default_k2_records
        from sparkpriv.mechanisms.sparse import ItemCap

        given = [n for n, val in (("columns", params.columns), ("lower", params.lower), ("upper", params.upper),
                                  ("row_bound", params.row_bound), ("label", params.label),
                                  ("labels", params.labels), ("classes", params.classes), ("fill", params.fill),
                                  ("keep_columns", list(params.keep_columns) or None),
                                  ("label_scale", None if params.label_scale == 1.0 else params.label_scale),
                                  ("impute_share", None if params.impute_share == DEFAULT_IMPUTE_SHARE
                                   else params.impute_share),
                                  ("integer_columns", list(params.integer_columns) or None)) if val is not None]
        if given:
            raise ParameterError(
                f"The {', '.join(repr(g) for g in given)} parameter(s) of {caller} do not apply to "
                "bounded event records: the items are the vocabulary, the bounds come from the item "
                "cap (max_items, weights), and an event table has no label or public columns. "
                "Remove them."
            )
        d, c = facts.d, float(facts.value_cap)
        z = facts.l2_bound / c  # sqrt(L): the row bound on the [0, 1] scale
        max_items = int(round(z * z))
        cap = ItemCap(max_items) if c == 1.0 else ItemCap(max_items, "counts", int(round(c)))
        threshold = DEFAULT_THRESHOLD if params.threshold is None else float(params.threshold)
        v = validate_params(d=d, epsilon=params.epsilon, delta=params.delta, lower=(0.0,) * d, upper=(c,) * d,
                            k1=params.k1, k2=default_k2_records(d) if params.k2 is None else params.k2,
                            row_bound=z, budget_split=params.budget_split, labels=None, classes=None,
                            label_scale=1.0, fill=None, impute_share=DEFAULT_IMPUTE_SHARE,
                            neighbors="replace-one", caller=caller)
        R, seed = draw_secrets(d, v["k1"])
        dplan = plan_dprp(R, d=d, epsilon=params.epsilon, delta=params.delta, lower=v["lower"], upper=v["upper"],
                          k2=v["k2"], row_bound=v["row_bound"], budget_split=v["budget_split"], labels=None,
                          classes=None, label_scale=1.0)
        event = dplan.dp_event()
        public = dplan.to_public_dict()
        public["feature_bounds"] = {"per_item": [0.0, c], "scaled_to": [0.0, 1.0],
                                    "row_bound_formula": "sqrt(max_items) on the [0, 1] scale"}
        for key in ("integer_columns_rounded", "labels", "classes", "label_scale", "fill_for_nulls"):
            public.pop(key, None)
        public.update(input_kind="event table (sparse person records)",
                      output="items array<int>: vocabulary indices where the reconstructed value >= threshold",
                      matrix_source="OS entropy, discarded after the job",
                      events_note="GaussianDpEvent(1/mu_i) per step; the noise objects' own multipliers "
                                  "are at least these (checked)")
        resolved = {"k1": dplan.k1, "k2": dplan.k2, "budget_split": list(dplan.budget_split),
                    "threshold": threshold, "bounds": public["feature_bounds"]}
        state = _DPRPState(dplan, "records", threshold=threshold, cap=cap)
        return _p.Plan(events=event, epsilon=epsilon_of(event, dplan.delta), delta=dplan.delta, public=public,
                       neighbors=_p.REPLACE_ONE, state=state, secrets=(R, seed), parameters=resolved)

    def run(self, engine, source, plan: _p.Plan, progress) -> _p.Outcome:
        st: _DPRPState = plan.state
        if st.kind == "records":
            return _run_records(engine, source, st, plan.secrets, progress)
        return _run_table(engine, source, st, plan.secrets, progress)


def _per_column(values, d: int, name: str, caller: str) -> tuple:
    values = tuple(float(v) for v in np.atleast_1d(np.asarray(values, float)))
    if len(values) == 1:
        return values * d
    if len(values) != d:
        raise ParameterError(f"The {name!r} parameter of {caller} must have one value, or one per "
                             f"column ({d}). Got {len(values)}.")
    return values


def _run_table(engine, source, st: _DPRPState, secrets, progress) -> _p.Outcome:
    from sparkpriv.errors import InputError

    dplan = st.plan
    R, seed = secrets
    d = dplan.d
    public: dict = {}
    fill_values = fill_std = None
    if dplan.fill == "dp-mean":  # pass 0: DP column means, noise added once here
        tot = engine.aggregate(source, _impute_fn(dplan), 2 * d + 1)
        n = int(tot[-1])
        if n == 0:
            raise InputError(_EMPTY)
        noise = dplan.impute_noise(n)
        check_noise_multiplier(noise, dplan.mu["impute"])
        fill_values, fill_std = dp_column_means(tot, None if st.noise_free else noise,
                                                stream(seed, IMPUTE_NOISE_STAGE), dplan, with_std=True)
        public["impute_noise"] = noise.to_public_dict()
        public["dp_fill_values"] = [float(x) for x in fill_values]
    elif dplan.fill is not None:
        fill_values = np.full(d, float(dplan.fill))
    size = dplan.n_groups * (1 + dplan.d_aug * (dplan.d_aug + 1) // 2)
    total = engine.aggregate(source, _gram_fn(dplan, fill_values), size)  # pass 1: the Gram matrices
    sizes, grams = gram_from_partial(total, dplan.d_aug, dplan.n_groups)
    if sizes.sum() == 0:
        raise InputError(_EMPTY)
    if dplan.label_mode == "public":
        if np.count_nonzero(sizes) < 2:
            raise InputError(
                f"The label column {st.label!r} has one class only in the data: there is nothing to "
                "separate; release without a label column."
            )
        public["class_sizes"] = {str(_jsonable(c)): int(s) for c, s in zip(dplan.classes, sizes)}
        public["class_sizes_note"] = ("labels are declared public: every row's label is released as it "
                                      "is, the classes are released by separate runs (parallel "
                                      "composition), and these class sizes are released")
    gnoise = dplan.gram_noise(int(sizes.max()))
    check_noise_multiplier(gnoise, dplan.mu["gram"])
    check_noise_multiplier(dplan.projection_noise, dplan.mu["projection"])
    public["gram_noise"] = gnoise.to_public_dict()
    Cs = noisy_grams(grams, None if st.noise_free else gnoise, stream(seed, GRAM_NOISE_STAGE))
    Ms = solve(Cs, R, dplan.k2, caller=progress.caller)
    public["uncertainty"] = uncertainty_public(dplan, Ms, source.facts.columns, fill_std=fill_std)
    progress.log("dprp: Gram solved (d = %d, k1 = %d, k2 = %d, %d run(s)); rows pass", d, dplan.k1, dplan.k2,
                 dplan.n_groups)
    counters = engine.counters(("rows", "rows_box_clipped", "rows_norm_clipped"))
    row_noise = None if st.noise_free else dplan.projection_noise
    columns = [(c, "as-input", True) for c in source.facts.columns]
    if st.label is not None:
        columns.append((st.label, "label", True))
    table, rows = engine.map_rows(source, _rows_fn(dplan, R, Ms, row_noise, seed, fill_values, counters,
                                                   st.label is not None),
                                  columns, keep=st.keep)

    def diagnostics() -> dict:
        if counters is None:
            return {}
        return {"rows": counters[0].value, "rows_box_clipped": counters[1].value,
                "rows_norm_clipped": counters[2].value}

    return _p.Outcome(table=table, rows=rows, public=public, extras={"diagnostics": diagnostics})


def _run_records(engine, source, st: _DPRPState, secrets, progress) -> _p.Outcome:
    from sparkpriv.errors import InputError

    dplan = st.plan
    R, seed = secrets
    d = dplan.d
    total = engine.aggregate(source, _records_gram_fn(st.cap, d), 1 + d * (d + 1) // 2, count=True)
    sizes, grams = gram_from_partial(total, d, 1)
    if sizes.sum() == 0:
        raise InputError(_EMPTY)
    gnoise = dplan.gram_noise(int(sizes.max()))
    check_noise_multiplier(gnoise, dplan.mu["gram"])
    check_noise_multiplier(dplan.projection_noise, dplan.mu["projection"])
    Cs = noisy_grams(grams, None if st.noise_free else gnoise, stream(seed, GRAM_NOISE_STAGE))
    (M,) = solve(Cs, R, dplan.k2, caller=progress.caller)
    progress.log("dprp of event records: Gram of %d people, d = %d, k1 = %d, k2 = %d",
                 int(sizes[0]), d, dplan.k1, dplan.k2)
    row_noise = None if st.noise_free else dplan.projection_noise
    table, rows = engine.map_rows(source, _records_rows_fn(R, M, row_noise, seed, st.cap, d, st.threshold),
                                  [("items", "array<int>", False)], count=False)
    unc = uncertainty_public(dplan, [M], (), kind="records")
    return _p.Outcome(table=table, rows=rows, public={"gram_noise": gnoise.to_public_dict(), "uncertainty": unc})


# per-block functions: built from plain values (numpy arrays, numbers), pickled into Spark's tasks


def _parts(block):
    """``(X, codes, missing)`` of a dense block (a matrix, or TableRows)."""
    if isinstance(block, _p.TableRows):
        return block.X, block.codes, block.missing
    return block, None, None


def _impute_fn(dplan: DPRPPlan):
    """Block -> per-column sums and counts of non-missing values, and the rows (DP means pass)."""

    def means(block):
        X, _, missing = _parts(block)
        if missing is None:
            missing = np.zeros(X.shape, dtype=bool)
        return impute_partial(X, missing, dplan)

    return means


def _gram_fn(dplan: DPRPPlan, fill_values):
    """Block -> per group ``[count, upper triangle of Xp^T Xp]`` of the prepared rows."""
    fill_values = None if fill_values is None else np.array(fill_values, dtype=np.float64)
    public = dplan.label_mode == "public"
    size = dplan.n_groups * (1 + dplan.d_aug * (dplan.d_aug + 1) // 2)

    def gram(block):
        X, codes, missing = _parts(block)
        if X.shape[0] == 0:
            return np.zeros(size)
        fill_missing(X, missing, fill_values)
        Xp, _ = prepare_rows(X, dplan, codes)
        return gram_partial(Xp, codes if public else None, dplan.n_groups)

    return gram


def _rows_fn(dplan: DPRPPlan, R, Ms, noise, seed, fill_values, counters, with_label: bool):
    """The row map: ``P' = Xp R + keyed noise``, ``X' = P' M_g``, decoded (``noise=None``: without noise).

    One noise stream per partition, ``stream(seed, ROW_NOISE_STAGE, pid)``, drawn block after block in
    order, so a retried task reproduces the same noise.
    """
    R = np.ascontiguousarray(R)
    Ms = [np.ascontiguousarray(M) for M in Ms]
    fill_values = None if fill_values is None else np.array(fill_values, dtype=np.float64)
    public = dplan.label_mode == "public"

    def rows(pid, blocks):
        rng = stream(seed, ROW_NOISE_STAGE, pid)
        tot = ClipCounts()
        for block in blocks:
            X, codes, missing = _parts(block)
            fill_missing(X, missing, fill_values)
            Xp, counts = prepare_rows(X, dplan, codes)
            tot = tot + counts
            Xr = reconstruct_rows(Xp, R, Ms, codes if public else None, noise, rng)
            Xo, out_codes = decode_rows(Xr, dplan)
            cols = list(np.ascontiguousarray(Xo.T))
            if with_label:
                cols.append(codes if public else out_codes)
            yield cols
        if counters is not None:
            counters[0].add(tot.rows)
            counters[1].add(tot.box_clipped)
            counters[2].add(tot.norm_clipped)

    return rows


def _records_gram_fn(cap, d: int):
    """Sparse block -> ``[n, upper triangle of (X / c)^T (X / c)]`` (the records' Gram partial)."""
    from sparkpriv.mechanisms.dprp_records import gram_partial_sparse
    from sparkpriv.mechanisms.sparse import clip_sparse_rows

    c = cap.value_cap
    size = 1 + d * (d + 1) // 2

    def gram(block):
        if block.n == 0:
            return np.zeros(size)
        vals, _ = clip_sparse_rows(block.offsets, block.indices, block.values, cap, d)  # a no-op on capped records
        return gram_partial_sparse(block.offsets, block.indices, vals, d, c)

    return gram


def _records_rows_fn(R, M, noise, seed, cap, d: int, threshold: float):
    """The row map of event records: thresholded reconstruction as ``items array<int>``."""
    import pyarrow as pa

    from sparkpriv.mechanisms.dprp_records import reconstruct_sparse_items
    from sparkpriv.mechanisms.sparse import clip_sparse_rows

    R = np.ascontiguousarray(R)
    M = np.ascontiguousarray(M)
    c = cap.value_cap

    def rows(pid, blocks):
        rng = stream(seed, ROW_NOISE_STAGE, pid)
        for block in blocks:
            vals, _ = clip_sparse_rows(block.offsets, block.indices, block.values, cap, d)
            o, items = reconstruct_sparse_items(block.offsets, block.indices, vals, R, M, noise, rng,
                                                value_cap=c, threshold=threshold)
            yield [pa.ListArray.from_arrays(pa.array(o.astype(np.int32)), pa.array(items, pa.int32()))]

    return rows


DPRP_MECHANISM = _p.register(DPRP())
