"""Sufficient statistics perturbation with AdaSSP's adaptive ridge (Wang 2018, Alg. 2): the domain,
the sensitivities, the plan, the per-block statistics and the driver's noise (docs/math.md section 6.1).

Data and bounds
---------------
Each record is a feature row ``x`` (``d`` values) and a target ``y``. Both are clipped to declared
public bounds: ``x`` to a per-feature box ``[lower, upper]`` and/or a row norm ball ``||x|| <= R``
(box first, then the ball: :func:`sparkpriv.privacy.bounds.clip_rows`), ``y`` to ``[t_lo, t_hi]`` (or,
for ``model="logistic"``, mapped to ``s = +1`` for the ``positive`` value, ``-1`` for any other).
A missing value (null, and NaN or an infinity that reaches the mechanism) is replaced by a public
value, never refused: the declared ``fill``, else the centre of the declared domain (the box's
centre, 0 for a feature bounded by the ball only, the target range's centre; for a logistic target
``s = 0``), and counted in the owner diagnostics. Then

    u = clip(x) - c,   x~ = [u, 1] (with an intercept) or u,   y~ = clip(y) - c_y,

with public centres ``c`` (the box centre when the intercept is fitted and that shrinks the bound
below, else 0) and ``c_y`` (the range's centre with an intercept, else 0). Public radii:
``||u||^2 <= R_u^2`` (:func:`feature_radius_sq`), ``B_X^2 = R_u^2 + [intercept]``,
``|y~| <= B_Y`` (``B_Y = 1`` for a logistic target).

Statistics and sensitivities
----------------------------
Three Gaussian noise additions, each a ``GaussianDpEvent`` (the noise multiplier is noise over the
sensitivity of the declared relation, docs/math.md section 1), composed exactly in Gaussian DP:

1. ``lambda_min(X~^T X~)``, the smallest eigenvalue (AdaSSP's step 1). Replacing one record adds
   ``E = x~' x~'^T - x~ x~^T``, whose eigenvalues lie in ``[-||x~||^2, ||x~'||^2]``, so
   ``||E||_2 <= B_X^2`` and by Weyl's inequality ``lambda_min`` moves by at most ``B_X^2``
   (add-remove: ``+-x~ x~^T``, the same bound). Sensitivity ``B_X^2``, both relations.
2. ``triu(X~^T X~)``, the ``d'(d'+1)/2`` upper-triangle entries (``d' = d + [intercept]``), one draw
   per entry, mirrored. For a symmetric ``D``, ``||triu(D)||^2 = (||D||_F^2 + sum_i D_ii^2) / 2``.
   Add-remove, ``D = x~ x~^T``: ``(||x~||^4 + sum_i x~_i^4) / 2 <= (B_X^4 + R_u^4 + [intercept]) / 2``.
   Replace-one, ``D = x~ x~^T - x~' x~'^T``: ``||D||_F^2 = ||x~||^4 + ||x~'||^4 - 2 (x~ . x~')^2
   <= 2 B_X^4`` and ``sum_i D_ii^2 = sum_i (u_i^2 - u'_i^2)^2 <= sum_i u_i^4 + u'_i^4 <= 2 R_u^4`` (the
   intercept's diagonal entry is 1 on both sides), so ``||triu(D)||^2 <= B_X^4 + R_u^4``: exact
   without an intercept (``x~ = R e_1``, ``x~' = R e_2``: ``2 R^4``).
3. The moments ``[X~^T y~, w_yy y~^T y~, w_n n]`` (``d' + 2`` values) with public weights
   ``w_yy = B_X / (2 B_Y)`` and ``w_n = B_X B_Y / 2`` (they put ``y^T y`` and ``n``, which the
   intervals need, on the scale of ``X^T y``). Add-remove: ``||[x~ y~, w_yy y~^2, w_n]||^2 <=
   B_X^2 B_Y^2 (1 + 1/4 + 1/4)``. Replace-one (``n`` unchanged): ``||x~ y~ - x~' y~'||^2 <=
   (2 B_X B_Y)^2`` and ``w_yy^2 (y~^2 - y~'^2)^2 <= B_X^2 B_Y^2 / 4``: ``4.25 B_X^2 B_Y^2``.

With ``target_quantile`` the target range is chosen first (:func:`target_histogram_fn`): a
histogram of ``y`` over public signed power-of-two edges gets discrete Laplace noise (L1 sensitivity
2 under replace-one, a record moves between two bins; 1 under add-remove), a ``LaplaceDpEvent`` of
``target_epsilon_share`` of epsilon, composed with the three Gaussian events in the same release
event; the events depend on epsilon and delta only, so the whole spend is known before any data is
read. The Gaussian multipliers are fitted so that dp_accounting's PLD epsilon of the composed event
is at most the request (:func:`sparkpriv.privacy.accounting.fit_to_epsilon`).

Noise is drawn once, on the driver, from the library's discrete Gaussian on a power-of-two grid
(docs/math.md section 7) with multiplier at least the recorded one. The grid holds values up to
``2^30`` noise scales; every exact statistic is clamped to that public range first (a clamp never
increases a sensitivity), so no value of the data can make the noise step fail; it acts only on
tables of more than about ``10^9 z`` rows (``z`` the noise multiplier) and is counted for the owner.

A logistic model with ``logistic_steps = K > 0`` adds ``K`` passes (:func:`logistic_pass_fn`: the
gradient at a public ``theta``, the last pass also the weighted Gram matrix), ``K + 1`` more Gaussian
events in the same composition (:func:`gradient_sensitivity`, :func:`hessian_sensitivity`; the driver's
side is :mod:`._logistic`, docs/math.md section 6.2).

The ridge (AdaSSP): ``lambda~_min = max(lambda_min + noise - s_l Phi^{-1}(1 - rho), 0)`` (a lower
bound holding with probability ``1 - rho``) and ``lambda = max(0, sqrt(d' log(2 d'^2 / rho)) s_G -
lambda~_min)`` with ``s_l``, ``s_G`` the noise std of steps 1 and 2 and ``rho = 0.05``: post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from dp_accounting import dp_event as _ev

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.regression._params import RegressionParams, _search_range
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import compose, epsilon_of, fit_to_epsilon
from sparkpriv.privacy.bounds import Bounds, broadcast_box, clip_rows
from sparkpriv.privacy.calibration import gdp_mu_for, split_epsilon, split_mu

RHO = 0.05  # AdaSSP's failure probability of the eigenvalue's lower bound
EIGEN_STAGE, GRAM_STAGE, MOMENT_STAGE, TARGET_STAGE = 31, 32, 33, 34  # public labels of the driver streams
GRADIENT_STAGE, HESSIAN_STAGE = 35, 36  # the logistic passes: (GRADIENT_STAGE, step), (HESSIAN_STAGE,)
GRID_SCALES = 2.0**30  # the noise grids hold values up to this many noise scales (clamped beyond)
COUNTERS = ("rows", "values_replaced", "rows_with_replaced_values", "rows_box_clipped", "rows_norm_clipped",
            "rows_target_clipped")


# ----------------------------------------------------------------------------- the public domain


@dataclass(frozen=True)
class SSPDomain:
    """The declared domain of the records and the public radii the noise is calibrated to."""

    d: int
    intercept: bool
    lower: tuple | None
    upper: tuple | None
    row_bound: float | None
    centre: tuple  # c, subtracted from the clipped features
    radius_sq: float  # R_u^2 >= ||clip(x) - c||^2
    model: str
    target_range: tuple | None  # (t_lo, t_hi) of a linear target; None until chosen, or logistic
    positive: float = 1.0
    fill: float | None = None

    @property
    def dz(self) -> int:
        """``d'``: the features, and the intercept's constant."""
        return self.d + int(self.intercept)

    @property
    def bx_sq(self) -> float:
        return self.radius_sq + float(self.intercept)

    @property
    def target_centre(self) -> float:
        if self.model == "logistic" or not self.intercept:
            return 0.0
        lo, hi = self.target_range
        return 0.5 * (lo + hi)

    @property
    def by(self) -> float:
        if self.model == "logistic":
            return 1.0
        lo, hi = self.target_range
        c = self.target_centre
        return max(abs(lo - c), abs(hi - c))

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.d, self.lower, self.upper, self.row_bound, _caller="release_regression")

    def feature_replacement(self) -> np.ndarray:
        """The public value of a missing feature: ``fill``, else the box centre, else 0."""
        if self.fill is not None:
            return np.full(self.d, float(self.fill))
        if self.lower is not None:
            return 0.5 * (np.asarray(self.lower, float) + np.asarray(self.upper, float))
        return np.zeros(self.d)

    def target_replacement(self) -> float:
        """The public value of a missing target: ``fill``, else the range's centre (logistic: NaN, s = 0)."""
        if self.fill is not None:
            return float(self.fill)
        if self.model == "logistic":
            return math.nan
        lo, hi = self.target_range
        return 0.5 * (lo + hi)

    def with_target_range(self, lo: float, hi: float) -> "SSPDomain":
        from dataclasses import replace

        return replace(self, target_range=(float(lo), float(hi)))

    def to_public_dict(self) -> dict:
        return {"features": {"lower": None if self.lower is None else list(self.lower),
                             "upper": None if self.upper is None else list(self.upper),
                             "row_bound": self.row_bound, "norm": "l2", "centre": list(self.centre),
                             "radius_sq": self.radius_sq},
                "intercept": self.intercept, "model": self.model,
                "target": ({"positive": self.positive, "encoding": "+1 positive, -1 other, 0 missing"}
                           if self.model == "logistic" else
                           {"lower": None if self.target_range is None else self.target_range[0],
                            "upper": None if self.target_range is None else self.target_range[1],
                            "centre": None if self.target_range is None else self.target_centre}),
                "replacement_of_missing": "fill" if self.fill is not None else "centre of the declared domain"}


def feature_radius_sq(centre, lower, upper, row_bound) -> float:
    """``sup ||clip(x) - c||^2`` over the declared domain (box, then ball; docs/math.md section 6.1).

    The box gives ``sum_j max((lower_j - c_j)^2, (upper_j - c_j)^2)``, used when there is no ball or
    the box holds the origin (the ball's clip then keeps a row inside the box); the ball gives
    ``(R + ||c||)^2``; the smaller of those that apply.
    """
    c = np.asarray(centre, dtype=np.float64)
    vals = []
    if lower is not None:
        lo = np.asarray(lower, float)
        hi = np.asarray(upper, float)
        if row_bound is None or (np.all(lo <= 0) and np.all(hi >= 0)):
            vals.append(float(np.sum(np.maximum((lo - c) ** 2, (hi - c) ** 2))))
    if row_bound is not None:
        vals.append((float(row_bound) + float(np.linalg.norm(c))) ** 2)
    return min(vals)


def ssp_domain(params: RegressionParams, d: int, caller: str) -> SSPDomain:
    """The public domain of an SSP release with ``d`` features (the centre chosen to shrink the bound)."""
    lower = broadcast_box(params.lower, d, "lower", caller)
    upper = broadcast_box(params.upper, d, "upper", caller)
    Bounds(d, lower, upper, params.row_bound, _caller=caller)  # shapes, finiteness, upper > lower
    zero = np.zeros(d)
    centre, r2 = zero, feature_radius_sq(zero, lower, upper, params.row_bound)
    if params.fit_intercept and lower is not None:
        mid = 0.5 * (np.asarray(lower) + np.asarray(upper))
        r2_mid = feature_radius_sq(mid, lower, upper, params.row_bound)
        if r2_mid < r2:
            centre, r2 = mid, r2_mid
    target = None
    if params.model == "linear" and params.target_quantile is None:
        target = (float(params.target_lower), float(params.target_upper))
    dom = SSPDomain(d, bool(params.fit_intercept), lower, upper, params.row_bound,
                    tuple(float(v) for v in centre), float(r2), params.model, target,
                    params.positive_value, params.fill)
    if not (math.isfinite(dom.bx_sq) and 0 < dom.bx_sq < 1e120):
        raise ParameterError(f"The declared feature bounds of {caller} give a squared radius {dom.bx_sq!r} "
                             "outside the range the noise can be calibrated to; rescale the features.")
    return dom


# ----------------------------------------------------------------------------- sensitivities


def eigen_sensitivity(dom: SSPDomain) -> float:
    """``B_X^2``: L2 (absolute) sensitivity of ``lambda_min(X~^T X~)``, both relations."""
    return dom.bx_sq


def gram_sensitivity(dom: SSPDomain, neighbors: str) -> float:
    """L2 sensitivity of ``triu(X~^T X~)`` (module docstring)."""
    b2, r2 = dom.bx_sq, dom.radius_sq  # scaled by b2 so that no fourth power overflows or underflows
    if neighbors == "add-remove":
        extra = (1.0 / b2) / b2 if dom.intercept else 0.0  # b2 >= 1 with an intercept
        return b2 * math.sqrt((1.0 + (r2 / b2) ** 2 + extra) / 2.0)
    return math.hypot(b2, r2)


def moment_weights(dom: SSPDomain, by: float | None = None) -> tuple[float, float]:
    """``(w_yy, w_n)``: the public weights of ``y^T y`` and ``n`` among the moments."""
    by = dom.by if by is None else by
    bx = math.sqrt(dom.bx_sq)
    return bx / (2.0 * by), bx * by / 2.0


def moment_sensitivity(dom: SSPDomain, neighbors: str, by: float | None = None) -> float:
    """L2 sensitivity of ``[X~^T y~, w_yy y~^T y~, w_n n]`` (module docstring)."""
    by = dom.by if by is None else by
    factor = 1.5 if neighbors == "add-remove" else 4.25
    return math.sqrt(factor * dom.bx_sq) * by


def gradient_sensitivity(dom: SSPDomain, neighbors: str) -> float:
    """L2 sensitivity of the logistic gradient ``sum_i -s_i sigma(-s_i theta . x~_i) x~_i`` at any public
    ``theta``: each row's term has norm below ``||x~|| <= B_X`` (``|sigma| < 1``; a missing class, ``s = 0``,
    adds 0), so ``B_X`` (add-remove) or ``2 B_X`` (replace-one; a supremum, approached as ``|theta|``
    grows). docs/math.md section 6.2."""
    return math.sqrt(dom.bx_sq) * (1.0 if neighbors == "add-remove" else 2.0)


def hessian_sensitivity(dom: SSPDomain, neighbors: str) -> float:
    """L2 sensitivity of ``triu(sum_i w_i x~_i x~_i^T)``, ``w_i = p_i (1 - p_i) in (0, 1/4]``: as the Gram
    matrix's with the weights (add-remove: ``sqrt((B_X^4 + R_u^4 + [intercept]) / 2) / 4``; replace-one:
    ``sqrt(B_X^4 + R_u^4 + [intercept]) / 4``, where the intercept's diagonal ``w - w'`` no longer cancels).
    docs/math.md section 6.2."""
    b2, r2 = dom.bx_sq, dom.radius_sq
    extra = (1.0 / b2) / b2 if dom.intercept else 0.0
    inner = 1.0 + (r2 / b2) ** 2 + extra
    return 0.25 * b2 * math.sqrt(inner / 2.0 if neighbors == "add-remove" else inner)


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class SSPPlan:
    """Everything public about a calibrated SSP release (no secrets)."""

    domain: SSPDomain
    neighbors: str
    epsilon: float
    delta: float
    multipliers: tuple  # (z_eigen, z_gram, z_moments[, z_gradient x K, z_hessian]): noise std / sensitivity
    histogram: _noise.LaplaceNoise | None = None  # the target range's histogram (target_quantile)
    quantile: float | None = None
    candidates: np.ndarray | None = field(default=None, repr=False)
    confidence: float = 0.95
    bootstrap: int = 1000
    steps: int = 0  # logistic: noisy gradient passes; multipliers then hold K gradients and the Hessian
    split: tuple = ()

    def events(self) -> list:
        ev = [_ev.GaussianDpEvent(z) for z in self.multipliers]
        if self.histogram is not None:
            ev.insert(0, self.histogram.dp_event())
        return ev

    def dp_event(self):
        return compose(self.events())

    def noises(self, dom: SSPDomain | None = None) -> tuple:
        """The three Gaussian noises for the domain (its target range chosen)."""
        dom = self.domain if dom is None else dom
        sens = (eigen_sensitivity(dom), gram_sensitivity(dom, self.neighbors), moment_sensitivity(dom, self.neighbors))
        dims = (1, dom.dz * (dom.dz + 1) // 2, dom.dz + 2)
        return tuple(_noise.gaussian_noise_from_multiplier(sensitivity=s, noise_multiplier=z, dim=k,
                                                           max_abs=GRID_SCALES * z * s)
                     for s, z, k in zip(sens, self.multipliers[:3], dims))

    def step_noises(self, dom: SSPDomain | None = None) -> tuple:
        """``(gradient, hessian)`` noises of the logistic passes (each gradient pass has the same)."""
        dom = self.domain if dom is None else dom
        if not self.steps:
            return ()
        sg, sh = gradient_sensitivity(dom, self.neighbors), hessian_sensitivity(dom, self.neighbors)
        zg, zh = self.multipliers[3], self.multipliers[-1]
        return (_noise.gaussian_noise_from_multiplier(sensitivity=sg, noise_multiplier=zg, dim=dom.dz,
                                                      max_abs=GRID_SCALES * zg * sg),
                _noise.gaussian_noise_from_multiplier(sensitivity=sh, noise_multiplier=zh,
                                                      dim=dom.dz * (dom.dz + 1) // 2, max_abs=GRID_SCALES * zh * sh))

    def to_public_dict(self) -> dict:
        dom = self.domain
        out = {
            "mechanism": "sufficient statistics perturbation with AdaSSP's adaptive ridge (docs/math.md "
                         "section 6.1)",
            "method": "ssp", "neighbors": self.neighbors,
            "noise_multipliers": {"smallest_eigenvalue": self.multipliers[0], "gram": self.multipliers[1],
                                  "moments": self.multipliers[2]},
            "sensitivity": {"smallest_eigenvalue": "B_X^2",
                            "gram": "sqrt(B_X^4 + R_u^4)" if self.neighbors == "replace-one"
                            else "sqrt((B_X^4 + R_u^4 + intercept) / 2)",
                            "moments": ("sqrt(4.25) B_X B_Y" if self.neighbors == "replace-one"
                                        else "sqrt(1.5) B_X B_Y")},
            "adassp_rho": RHO,
            "budget_split": list(self.split),
            "domain": dom.to_public_dict(),
        }
        if self.steps:
            out["logistic_steps"] = {
                "passes": self.steps,
                "method": "Bohning steps on noisy gradients, the last a Newton step on a noisy Hessian "
                          "(docs/math.md section 6.2)",
                "noise_multipliers": {"gradient_per_pass": self.multipliers[3], "hessian": self.multipliers[-1]},
                "sensitivity": {"gradient": "2 B_X" if self.neighbors == "replace-one" else "B_X",
                                "hessian": ("sqrt(B_X^4 + R_u^4 + intercept) / 4" if self.neighbors == "replace-one"
                                            else "sqrt((B_X^4 + R_u^4 + intercept) / 2) / 4")}}
        if self.histogram is not None:
            out["target_range_estimation"] = {
                "method": "DP central quantile range of the target (Laplace histogram over public signed "
                          "power-of-two edges)", "coverage": self.quantile,
                "candidates": [float(self.candidates[0]), float(self.candidates[-1])],
                "histogram_noise": self.histogram.to_public_dict()}
        return out


def plan_ssp(params: RegressionParams, d: int, caller: str) -> SSPPlan:
    """Validate the domain, split the budget and fit the multipliers to the request. Reads no data."""
    if d < 1:
        raise ParameterError(f"{caller} needs at least one feature column. Got none.")
    dom = ssp_domain(params, d, caller)
    eps, delta = float(params.epsilon), float(params.delta)
    hist, candidates, eps_gauss = None, None, eps
    if params.target_quantile is not None:
        lo, hi = _search_range(params.target_search, caller)
        candidates = 2.0 ** np.arange(lo, hi + 1, dtype=np.float64)
        eps_hist, eps_gauss = split_epsilon(eps, float(params.target_epsilon_share))
        sens = 1.0 if params.neighbors == "add-remove" else 2.0
        buckets = 2 * candidates.size + 2
        hist = _noise.calibrate_laplace_noise(sensitivity=sens, epsilon=eps_hist, dim=buckets,
                                              max_abs=GRID_SCALES * sens / eps_hist)
    mu = gdp_mu_for(eps_gauss, delta)
    split = params.split
    k = params.steps
    shares = list(split[:3]) + ([split[3] / k] * k + [split[4]] if k else [])

    def events(r: float) -> list:
        ev = [_ev.GaussianDpEvent(1.0 / m) for m in split_mu(r * mu, shares)]
        return ([hist.dp_event()] if hist is not None else []) + ev

    r = fit_to_epsilon(lambda r: compose(events(r)), epsilon=eps, delta=delta, caller=caller)
    zs = tuple(1.0 / m for m in split_mu(r * mu, shares))
    plan = SSPPlan(dom, params.neighbors, eps, delta, zs, hist, params.target_quantile, candidates,
                   float(params.confidence), int(params.bootstrap), k, tuple(split))
    if dom.model == "logistic" or dom.target_range is not None:  # refusals of the calibration come now
        if not all(math.isfinite(nz.variance) and nz.variance > 0 for nz in plan.noises() + plan.step_noises()):
            raise ParameterError(f"The declared bounds of {caller} with epsilon={eps!r} give a noise variance "
                                 "outside the floating-point range; rescale the features or the target.")
    return plan


def accounted_epsilon(plan: SSPPlan) -> float:
    return epsilon_of(plan.dp_event(), plan.delta)


# ----------------------------------------------------------------------------- per-block functions


def _split_block(block):
    """``(M, missing)`` of a block: a matrix, or a ``TableRows`` with the null mask; NaN and infinities
    count as missing too (they reach here only from engines that pass them through). ``M`` is the
    block's own array (not copied)."""
    M = np.asarray(getattr(block, "X", block), dtype=np.float64)
    miss = getattr(block, "missing", None)
    bad = ~np.isfinite(M)
    miss = bad if miss is None else (np.asarray(miss, bool) | bad)
    return M, miss


def prepare_block(block, dom: SSPDomain):
    """``(Z, counts)``: ``Z = [u, (1), y~]`` (n, d' + 1), the clipped and centred features, the intercept's
    constant and the target on its public scale (``clip(y) - c_y``, or ``s`` in {-1, 0, 1}); and the owner
    counts (rows, replaced values, rows with a replacement, rows box-clipped, norm-clipped, target-clipped).
    One copy of the block (into ``Z``), clipped in place."""
    M, miss = _split_block(block)
    n, d = M.shape[0], dom.d
    Z = np.empty((n, dom.dz + 1))
    U = Z[:, :d]
    U[...] = M[:, :d]
    y = M[:, d].copy()
    replaced = int(np.count_nonzero(miss))
    rows_replaced = 0
    if replaced:
        rows_replaced = int(np.count_nonzero(miss.any(axis=1)))
        mx = miss[:, :d]
        if mx.any():
            U[mx] = np.broadcast_to(dom.feature_replacement(), U.shape)[mx]
        y[miss[:, d]] = dom.target_replacement()
    _, counts = clip_rows(U, dom.bounds, out=U)
    if any(dom.centre):
        U -= np.asarray(dom.centre)
    if dom.intercept:
        Z[:, d] = 1.0
    if dom.model == "logistic":
        Z[:, -1] = np.where(np.isnan(y), 0.0, np.where(y == dom.positive, 1.0, -1.0))
        target_clipped = 0
    else:
        lo, hi = dom.target_range
        target_clipped = int(np.count_nonzero((y < lo) | (y > hi)))
        np.clip(y, lo, hi, out=Z[:, -1])
        if dom.target_centre:
            Z[:, -1] -= dom.target_centre
    return Z, (n, replaced, rows_replaced, counts.box_clipped, counts.norm_clipped, target_clipped)


def stats_size(dom: SSPDomain) -> int:
    """Length of a block's statistics: the ``(d'+1)^2`` cross-products of ``[x~, y~]``, then ``n``."""
    return (dom.dz + 1) ** 2 + 1


def block_statistics(Z: np.ndarray) -> np.ndarray:
    """``vec(Z^T Z)`` of ``Z = [u, (1), y~]`` and the row count (sums over blocks add up)."""
    k = Z.shape[1]
    out = np.empty(k * k + 1)
    out[:-1] = (Z.T @ Z).ravel()
    out[-1] = Z.shape[0]
    return out


def statistics_fn(dom: SSPDomain, counters=None):
    """``fn(block) -> vector`` for ``engine.aggregate``: prepare the rows, their cross-products.
    Built from plain values (pickled into Spark tasks)."""

    def ssp_statistics(block):
        Z, counts = prepare_block(block, dom)
        if counters is not None:
            for c, v in zip(counters, counts):
                c.add(v)
        return block_statistics(Z)

    return ssp_statistics


def logistic_pass_size(dom: SSPDomain, hessian: bool) -> int:
    """Length of a logistic pass's per-block vector: the gradient (``d'``), then ``vec`` of the Hessian."""
    return dom.dz + (dom.dz * dom.dz if hessian else 0)


def logistic_pass_fn(dom: SSPDomain, theta: np.ndarray, hessian: bool):
    """``fn(block)`` for ``engine.aggregate``: the logistic loss's gradient ``sum -s sigma(-s theta . x~) x~``
    at the public ``theta`` (the released scale: ``x~`` as :func:`prepare_block` makes it, ``s`` in
    {-1, 0, +1}) and, with ``hessian``, ``vec(sum sigma(m)(1 - sigma(m)) x~ x~^T)``, ``m = theta . x~``.
    Built from plain values (pickled into Spark tasks)."""
    from scipy.special import expit

    theta = np.array(theta, dtype=np.float64)
    dz = dom.dz

    def logistic_pass(block):
        Z, _ = prepare_block(block, dom)
        X, s = Z[:, :dz], Z[:, dz]
        m = X @ theta
        out = np.empty(logistic_pass_size(dom, hessian))
        out[:dz] = X.T @ (-s * expit(-s * m))
        if hessian:
            p = expit(m)
            out[dz:] = ((X * (p * (1.0 - p))[:, None]).T @ X).ravel()
        return out

    return logistic_pass


def signed_edges(candidates: np.ndarray) -> np.ndarray:
    """``[-c_K, .., -c_1, 0, c_1, .., c_K]``: the public edges of the target histogram."""
    c = np.asarray(candidates, dtype=np.float64)
    return np.concatenate([-c[::-1], [0.0], c])


def target_histogram_fn(dom: SSPDomain, candidates: np.ndarray):
    """``fn(block)``: counts of the target over the bins of :func:`signed_edges` (``2K + 2`` bins, the
    outer two open); a missing target (without ``fill``) is in no bin."""
    edges = signed_edges(candidates)

    def target_histogram(block):
        M, miss = _split_block(block)
        y = M[:, dom.d]
        m = miss[:, dom.d]
        if dom.fill is not None:
            y = np.where(m, float(dom.fill), y)
            m = np.zeros_like(m)
        idx = np.searchsorted(edges, y[~m], side="right")
        return np.bincount(idx, minlength=edges.size + 1).astype(np.float64)

    return target_histogram


def occupancy_threshold(hist: _noise.LaplaceNoise, false_positive: float = 0.001) -> float:
    """A noisy count above which a bin is taken to hold data: pure noise passes it in any of the
    histogram's bins with probability at most ``false_positive`` (Laplace tail ``e^{-t/b} / 2`` per
    bin, ``b`` the noise scale in counts). Public: a function of the noise only."""
    b = hist.scale * hist.grid
    return b * math.log(hist.dim / (2.0 * false_positive))


def choose_target_range(noisy: np.ndarray, candidates: np.ndarray, coverage: float,
                        threshold: float = 0.0) -> tuple[float, float]:
    """The central range holding ``coverage`` of the noisy histogram (post-processing).

    Only the bins between the outermost ones whose noisy count exceeds ``threshold``
    (:func:`occupancy_threshold`) count: the noise of the many empty bins of a wide public grid would
    otherwise add up to more than a tail's share. Among those, the lower bound is the largest edge
    with at most ``(1 - coverage) / 2`` of their (clamped) noisy total below it, the upper the smallest
    edge with at least ``(1 + coverage) / 2`` below it; at least one bin apart. Without any such bin:
    the whole public grid.
    """
    edges = signed_edges(candidates)
    raw = np.asarray(noisy, float)
    occ = np.flatnonzero(raw > threshold)
    if occ.size == 0:
        return float(edges[0]), float(edges[-1])
    c = np.zeros_like(raw)
    c[occ[0]:occ[-1] + 1] = np.maximum(raw[occ[0]:occ[-1] + 1], 0.0)
    total = c.sum()
    below = np.cumsum(c)[:-1]  # below[i]: noisy count of values < edges[i] (the region's bins only)
    ql, qu = 0.5 * (1.0 - coverage) * total, 0.5 * (1.0 + coverage) * total
    first, last = max(occ[0] - 1, 0), min(occ[-1], edges.size - 1)  # the region's outer edges
    lo_i = np.flatnonzero(below[:last + 1] <= ql)
    i = max(int(lo_i[-1]) if lo_i.size else first, first)
    hi_j = np.flatnonzero(below >= qu)
    j = min(int(hi_j[0]) if hi_j.size else last, last)
    if j <= i:
        if i < edges.size - 1:
            j = i + 1
        else:
            i = j - 1
    return float(edges[i]), float(edges[j])
