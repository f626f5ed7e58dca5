"""JL random projection + noise (Dhaliwal et al.; docs/math.md section 2).

Release ``Z = clip(X) P + N`` with ``P`` in R^{d x k}, ``P_ij ~ N(0, 1/k)``,
drawn from a secret seed (OS entropy) independently of the data, and ``N``
i.i.d. noise per entry.

Privacy
-------
Neighbour relation: replace-one (default; ``n`` is public) or the paper's
element-wise relation (one attribute changes by at most its bound), which
protects ONE ATTRIBUTE, not a person, and is labelled so everywhere.
Add-remove is refused: the output has one row per input row, so adding or
removing a person changes the row count, which no noise hides. The
element-wise relation needs a per-column box and/or ``element_bound`` and
refuses ``row_bound``: a norm clip rescales the whole row, so one changed
attribute would change every coordinate.

Sensitivity: computed exactly from the *realized* ``P`` and the declared bounds
(:mod:`sparkpriv.privacy.sensitivity`); enforced by clipping every row to the
declared box and/or norm ball before projecting
(:func:`sparkpriv.privacy.bounds.clip_rows`). Since ``P`` is independent of the
data, the guarantee holds conditional on every ``P`` and hence unconditionally.

Guarantee: Laplace noise gives pure ``epsilon``-DP for the L1 sensitivity;
Gaussian noise gives ``(epsilon, delta)``-DP (analytic Gaussian mechanism) for
the L2 sensitivity. Both are added on a power-of-two grid by
:mod:`sparkpriv.privacy.noise`, and the single event is a dp_accounting event.

Range: every projected value is clamped to ``[-M, M]``, with ``M`` public: the
bound that the declared box or row bound implies for the realized ``P``
(:func:`projected_value_bound`), or, with ``element_bound`` alone (no declared
range), ``2^28`` noise standard deviations; each attribute is then first
clamped so that no projected value exceeds ``M``. Clamping each coordinate
never increases the distance between neighbouring outputs, so the sensitivity
is unchanged, and the noise grid is chosen to hold ``M``: a release never
fails because of a data value.

Public: ``d``, ``k``, the bounds, the noise kind and scale (needed for distance
recovery), ``n`` (replace-one), ``M``. Secret: ``P`` and the noise seed.

The mechanism: :class:`Projection` (registered as ``projection``) with its
:class:`ProjectionParams`, on the protocol (docs/architecture.md): dense rows of
a table, or bounded event records (sparse; the sum of the rows of ``P`` at a
person's items, docs/math.md section 8), on the local or the Spark engine;
the public function is :func:`sparkpriv.api.release_projection`.

Distance recovery (corrected Algorithm 2): with ``s2`` the per-entry noise
variance, ``D = ||Z_i - Z_j||^2 - 2 k s2`` is unbiased for ``||x_i - x_j||^2``
(over ``P`` and the noise), and with ``x = x_i - x_j``

    Var D = (2/k) ||x||^4 + k c s2^2 + 8 s2 ||x||^2,

where ``c = Var(e^2) / s2^2`` for ``e`` the difference of two noise draws:
``c = 14`` for Laplace noise (``E e^4 = 18 s2^2``) and ``c = 8`` for Gaussian
noise (``E e^4 = 12 s2^2``). The paper's Claim 7 is wrong.

Uncertainty (docs/math.md section 2, "Intervals for squared distances"): the
randomness is the draw of the secret ``P`` and the noise, for a fixed pair of
(clipped) rows. :func:`sq_distance_intervals` gives the estimate, its std and
a confidence interval; the interval inverts a scaled chi-square with the
mean and variance above (exact for Gaussian noise, where
``||Z_i - Z_j||^2 = (||x||^2 / k + 2 s2) chi2_k``), not ``D +- 1.96 std``,
which covers far less than claimed at small ``k`` (61% at ``k = 1``, 90% at
``k = 20``). ``Release.squared_distances`` is the accessor; the receipt
states the per-entry noise std (``uncertainty``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import InputError, ParameterError
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.bounds import (
    NEIGHBOR_MEANING,
    NEIGHBORS,
    Bounds,
    ClipCounts,
    broadcast_box,
    clip_rows,
    row_norms,
)
from sparkpriv.privacy.calibration import split_epsilon
from sparkpriv.privacy.quantile import (
    DEFAULT_EXPONENTS,
    candidate_bounds,
    choose_bound,
    histogram_noise,
    norm_bucket_counts,
)
from sparkpriv.privacy.random import derive_seed, new_secret_seed, stream
from sparkpriv.privacy.sensitivity import l1_sensitivity, l2_sensitivity

__all__ = [
    "ProjectionPlan",
    "ProjectionParams",
    "Projection",
    "draw_projection_matrix",
    "plan_projection",
    "project_rows",
    "clamp_projected",
    "projected_value_bound",
    "recover_sq_distances",
    "distance_variance",
    "sq_distance_intervals",
    "SqDistances",
    "NOISE_KINDS",
]

NOISE_KINDS = ("laplace", "gaussian")
NOISE_STAGE = 1  # public label of the projection's row-noise stream
# With no declared range (element_bound alone), projected values are clamped to
# this many noise standard deviations (public, from epsilon and the sensitivity).
DEFAULT_RANGE_STDS = 2.0**28


def draw_projection_matrix(d: int, k: int, seed: int) -> np.ndarray:
    """``P`` (d, k) with i.i.d. ``N(0, 1/k)`` entries from the secret ``seed``."""
    rng = stream(seed, 0)
    return rng.standard_normal((d, k)) / np.sqrt(k)


@dataclass(frozen=True)
class ProjectionPlan:
    """Everything public about a calibrated projection release (no secrets)."""

    d: int
    k: int
    neighbors: str
    noise_kind: str
    bounds: Bounds
    sensitivity: float
    sensitivity_method: str
    noise: "_noise.LaplaceNoise | _noise.GaussianNoise"
    epsilon: float
    delta: float
    value_bound: float = float("inf")
    value_bound_source: str = "declared bounds"

    def dp_event(self):
        return self.noise.dp_event()

    @property
    def noise_variance(self) -> float:
        """Per-entry noise variance in data units (what distance recovery needs)."""
        return float(self.noise.variance)

    def uncertainty(self) -> dict:
        """What the noise adds, in the released units (public; the receipt's ``uncertainty``)."""
        return {
            "value_std": float(self.noise.std),
            "value_variance": self.noise_variance,
            "value_note": "every released z value is the projected row (within the declared bounds) plus "
                          "independent noise of "
                          "this std, mean 0; z0..z{k-1} are in the units of the columns (projected), so "
                          "a 95% interval of one value around its noise-free projection is value +- 1.96 "
                          "value_std (Gaussian noise; Laplace noise: +- 2.12 value_std)",
            "squared_distances": {
                "accessor": "Release.squared_distances(Zi, Zj, confidence=0.95)",
                "estimate": "||Zi - Zj||^2 - 2 k value_variance, unbiased for the squared distance of the "
                            "two input rows after clipping to the declared bounds",
                "variance": "(2/k) D^2 + k c value_variance^2 + 8 value_variance D at the true squared "
                            "distance D (c = 14 Laplace, 8 Gaussian); std is it at max(estimate, 0)",
                "c": 14.0 if self.noise_kind == "laplace" else 8.0,
                "randomness": "the draw of the secret matrix P and the noise, for a fixed pair of rows",
                "interval": "inverts a scaled chi-square with that mean and variance (exact for Gaussian "
                            "noise; Laplace: coverage 95-98% by simulation, above the level when the "
                            "distance is below 2 k value_variance); not estimate +- 1.96 std",
                "docs": "docs/math.md section 2",
            },
        }

    def to_public_dict(self) -> dict:
        return {
            "d": self.d,
            "k": self.k,
            "neighbors": self.neighbors,
            "protects": NEIGHBOR_MEANING[self.neighbors],
            "noise_kind": self.noise_kind,
            "bounds": self.bounds.to_public_dict(),
            "sensitivity": {
                "norm": "l1" if self.noise_kind == "laplace" else "l2",
                "value": self.sensitivity,
                "method": self.sensitivity_method,
                "computed_from": "the realized secret matrix P and the declared bounds",
            },
            "noise": self.noise.to_public_dict(),
            "noise_variance_per_entry": self.noise_variance,
            "uncertainty": self.uncertainty(),
            "projected_value_range": {"bound": self.value_bound if np.isfinite(self.value_bound) else None,
                                      "source": self.value_bound_source,
                                      "note": "projected values are clamped to [-bound, bound] "
                                              "before noise"},
        }


def plan_projection(
    P: np.ndarray,
    bounds: Bounds,
    *,
    epsilon: float,
    delta: float = 0.0,
    noise: str = "laplace",
    neighbors: str = "replace-one",
    caller: str = "release_projection",
) -> ProjectionPlan:
    """Calibrate the noise of a projection release to the realized ``P``.

    Validates the privacy parameters and returns a public :class:`ProjectionPlan`.
    Every refusal depends on the parameters only (no data is read here). The
    plan's ``value_bound`` is the public range projected values are clamped to.
    """
    check_param("noise", noise, [Options(NOISE_KINDS)], caller)
    check_param("neighbors", neighbors, [Options(NEIGHBORS)], caller)
    check_param("epsilon", epsilon, [Interval("real", 0, None, "neither")], caller)
    check_param("delta", delta, [Interval("real", 0, 1, "left")], caller)
    if noise == "gaussian" and delta == 0:
        raise ParameterError(
            f"The 'delta' parameter of {caller} must be in (0, 1) for Gaussian noise "
            "(it gives (epsilon, delta)-DP). Got 0 instead: give e.g. delta=1e-6, or use "
            "noise='laplace' for pure epsilon-DP."
        )
    if noise == "laplace" and delta != 0:
        raise ParameterError(
            f"The 'delta' parameter of {caller} must be 0 with Laplace noise (pure "
            f"epsilon-DP). Got {delta!r} instead: drop it, or use noise='gaussian'."
        )
    bounds.require_any(caller)
    constraints = bounds.change_constraints(neighbors, caller)
    if not constraints:
        raise ParameterError(
            f"{caller}: the declared bounds do not bound a record's change for neighbours "
            f"{neighbors!r}; give row_bound."
        )
    d, k = P.shape
    max_abs = projected_value_bound(P, bounds)
    source = "declared bounds and the realized P"
    if noise == "laplace":
        sens, method = l1_sensitivity(P, **constraints)

        def calibrate(m):
            return _noise.calibrate_laplace_noise(sensitivity=sens, epsilon=epsilon, dim=k, max_abs=m)
    else:
        sens, method = l2_sensitivity(P, **constraints)

        def calibrate(m):
            return _noise.calibrate_gaussian_noise(sensitivity=sens, epsilon=epsilon, delta=delta, dim=k,
                                                   max_abs=m)
    if max_abs is None:  # element_bound alone: no declared range, take a public one from the noise
        max_abs = DEFAULT_RANGE_STDS * calibrate(None).std
        source = "2^28 noise standard deviations (no declared box)"
    nz = calibrate(max_abs)
    return ProjectionPlan(
        d=d, k=k, neighbors=neighbors, noise_kind=noise, bounds=bounds,
        sensitivity=float(sens), sensitivity_method=method, noise=nz,
        epsilon=float(epsilon), delta=float(delta),
        value_bound=float(min(max_abs, nz.max_abs_value)), value_bound_source=source,
    )


def projected_value_bound(P: np.ndarray, bounds: Bounds) -> float | None:
    """A public bound on ``|(clip(x) P)_j|`` from the declared bounds (None if unbounded).

    The noise grid must hold every projected value; checking this before any
    data is read keeps the "value out of range" failure data-independent.
    """
    cands = []
    if bounds.row_bound is not None:
        R = float(bounds.row_bound)
        if bounds.norm == "l2":
            cands.append(R * float(np.linalg.norm(P, axis=0).max()))
        else:
            cands.append(R * float(np.abs(P).max()))
    if bounds.has_box:
        lo = np.asarray(bounds.lower, float)
        hi = np.asarray(bounds.upper, float)
        origin_inside = bool(np.all(lo <= 0) and np.all(hi >= 0))
        if bounds.row_bound is None or origin_inside:
            cands.append(float((np.maximum(np.abs(lo), np.abs(hi)) @ np.abs(P)).max()))
    return min(cands) if cands else None


def project_rows(X: np.ndarray, P: np.ndarray, bounds: Bounds,
                 value_bound: float | None = None) -> tuple[np.ndarray, ClipCounts]:
    """Clip rows of ``X`` (n_samples, d) to ``bounds`` and return ``(clip(X) @ P, counts)``.

    This is the one implementation used by the numpy path and by every Spark
    batch, so both give the same projection before noise. With ``value_bound``
    (the plan's public range ``M``) the projected values are clamped to
    ``[-M, M]``; when the bounds declare no range (``element_bound`` alone),
    each attribute is first clamped to ``+-M / max_j ||P_:j||_1`` so the
    product cannot overflow. Both clamps act on one coordinate at a time, so
    they never increase the change of a record.
    """
    Xc, counts = clip_rows(X, bounds)
    if value_bound is not None and not bounds.has_box and bounds.row_bound is None:
        c = float(value_bound) / max(float(np.abs(P).sum(axis=0).max()), np.finfo(float).tiny)
        np.clip(Xc, -c, c, out=Xc)
    Y = Xc @ P
    if value_bound is not None:
        clamp_projected(Y, value_bound)
    return Y, counts


def clamp_projected(Y: np.ndarray, value_bound: float) -> np.ndarray:
    """Clamp ``Y`` in place to ``[-value_bound, value_bound]`` and return it."""
    return np.clip(Y, -value_bound, value_bound, out=Y)


def secret_matrix_and_seed(d: int, k: int, matrix_key: bytes | None) -> tuple[np.ndarray, int]:
    """Draw ``P`` (from ``matrix_key`` if given, else OS entropy) and a fresh noise seed."""
    if matrix_key is not None:
        if len(matrix_key) < 16:
            raise ParameterError("The projection matrix key must be at least 16 bytes of secret material.")
        p_seed = derive_seed(matrix_key, f"projection-matrix/{d}x{k}")
    else:
        p_seed = new_secret_seed("projection-matrix")
    return draw_projection_matrix(d, k, p_seed), new_secret_seed("projection-noise")


def recover_sq_distances(
    Zi: np.ndarray, Zj: np.ndarray, *, noise_variance: float, noise_kind: str = "laplace"
) -> tuple[np.ndarray, np.ndarray]:
    """Unbiased squared distances between released rows and their variance.

    Parameters
    ----------
    Zi, Zj : ndarray of shape (k,) or (n_pairs, k)
        Released rows (the same release).
    noise_variance : float
        Per-entry noise variance ``s2`` (the receipt's ``noise_variance_per_entry``).
    noise_kind : {"laplace", "gaussian"}

    Returns
    -------
    D : ndarray of shape () or (n_pairs,)
        ``||Zi - Zj||^2 - 2 k s2``, unbiased for ``||x_i - x_j||^2``.
    var : ndarray
        The variance formula of the module docstring evaluated at the plug-in
        estimate ``max(D, 0)`` of ``||x_i - x_j||^2``.
    """
    check_param("noise_kind", noise_kind, [Options(NOISE_KINDS)], "recover_sq_distances")
    Zi = np.asarray(Zi, float)
    Zj = np.asarray(Zj, float)
    k = Zi.shape[-1]
    s2 = float(noise_variance)
    D = np.sum((Zi - Zj) ** 2, axis=-1) - 2.0 * k * s2
    x2 = np.maximum(D, 0.0)
    return D, distance_variance(x2, k=k, noise_variance=s2, noise_kind=noise_kind)


def distance_variance(sq_distance, *, k: int, noise_variance: float, noise_kind: str = "laplace"):
    """``Var D`` for true squared distance ``||x||^2`` (module docstring)."""
    c = 14.0 if noise_kind == "laplace" else 8.0
    x2 = np.asarray(sq_distance, float)
    s2 = float(noise_variance)
    return (2.0 / k) * x2 ** 2 + k * c * s2 ** 2 + 8.0 * s2 * x2


@dataclass(frozen=True)
class SqDistances:
    """Recovered squared distances with their uncertainty (arrays of one shape, one entry per pair).

    ``estimate``: unbiased for the squared distance of the two clipped input
    rows; ``std``: the square root of :func:`distance_variance` at
    ``max(estimate, 0)``; ``low``, ``high``: the ``confidence`` interval
    (:func:`sq_distance_intervals`; never below 0). The randomness is the draw
    of the secret ``P`` and the noise, for a fixed pair (docs/math.md section 2).
    """

    estimate: np.ndarray
    std: np.ndarray
    low: np.ndarray
    high: np.ndarray
    confidence: float


def _chi2_match(x2, k: int, s2: float, c: float):
    """Scale ``a`` and degrees of freedom ``nu`` of the scaled chi-square ``a chi2_nu`` with the mean
    ``x2 + 2 k s2`` and the variance of ``||Z_i - Z_j||^2`` at true squared distance ``x2``."""
    m = x2 + 2.0 * k * s2
    v = (2.0 / k) * x2 * x2 + 8.0 * s2 * x2 + c * k * s2 * s2
    return v / (2.0 * m), 2.0 * m * m / v


def sq_distance_intervals(Zi, Zj, *, noise_variance: float, noise_kind: str = "laplace",
                          confidence: float = 0.95) -> SqDistances:
    """Squared distances between released rows, their std and ``confidence`` intervals.

    ``S = ||Z_i - Z_j||^2`` is ``||x P + e||^2``: ``x P ~ N(0, ||x||^2 / k I_k)``
    (``P`` Gaussian) and ``e`` the difference of two noise vectors. The
    interval is the set of ``||x||^2 >= 0`` at which ``S`` is inside the central
    ``confidence`` range of the scaled chi-square ``a chi2_nu`` with the mean and
    variance of module docstring: exact for Gaussian noise (``nu = k``,
    ``a = ||x||^2 / k + 2 s2``), a moment match for Laplace noise (coverage
    checked by simulation, tests/mechanisms/test_uncertainty_projection.py).
    When ``S`` is below the lower quantile even at distance 0 the interval is
    ``[0, 0]``. Rows of one release only (their noise is independent).
    """
    from scipy import special, stats

    check_param("noise_kind", noise_kind, [Options(NOISE_KINDS)], "sq_distances")
    check_param("confidence", confidence, [Interval("real", 0, 1, "neither")], "sq_distances")
    Zi = np.asarray(Zi, float)
    Zj = np.asarray(Zj, float)
    if Zi.shape[-1:] != Zj.shape[-1:]:
        raise ParameterError(f"sq_distances: the rows have {Zi.shape[-1]} and {Zj.shape[-1]} values; both "
                             "must be released rows of the same projection (k values each).")
    k = Zi.shape[-1]
    s2 = float(noise_variance)
    D, var = recover_sq_distances(Zi, Zj, noise_variance=s2, noise_kind=noise_kind)
    S = np.asarray(D + 2.0 * k * s2, float)
    c = 14.0 if noise_kind == "laplace" else 8.0
    alpha = 1.0 - float(confidence)
    if noise_kind == "gaussian":  # exact: S = (x2/k + 2 s2) chi2_k
        q_lo, q_hi = stats.chi2.ppf([alpha / 2, 1 - alpha / 2], k)
        low = np.maximum(k * (S / q_hi - 2.0 * s2), 0.0)
        high = np.maximum(k * (S / q_lo - 2.0 * s2), 0.0)
    else:
        def cdf(x2):  # P(a chi2_nu <= S): decreasing in x2
            a, nu = _chi2_match(x2, k, s2, c)
            return special.gammainc(nu / 2.0, S / (2.0 * a))

        def largest(target):  # the largest x2 >= 0 with cdf(x2) >= target (0 if none)
            lo = np.zeros_like(S)
            hi = np.maximum(S, 2.0 * k * s2) + np.finfo(float).tiny
            for _ in range(200):
                grow = cdf(hi) >= target
                if not grow.any():
                    break
                hi = np.where(grow, hi * 4.0, hi)
            for _ in range(64):
                mid = 0.5 * (lo + hi)
                ok = cdf(mid) >= target
                lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
            return np.where(cdf(np.zeros_like(S)) >= target, lo, 0.0)

        low, high = largest(1 - alpha / 2), largest(alpha / 2)
    return SqDistances(estimate=D, std=np.sqrt(var), low=low, high=high, confidence=float(confidence))


# ----------------------------------------------------------------------------- the mechanism (protocol)

_POS = Interval("real", 0, None, "neither")
ROW_COUNTERS = ("rows", "rows_box_clipped", "rows_norm_clipped")
_RECORDS_REFUSED = ("columns", "row_bound", "lower", "upper", "element_bound", "row_bound_quantile", "fill")


@dataclass(frozen=True, kw_only=True)
class ProjectionParams(_p.Params):
    """Public parameters of the JL projection release (docs/math.md section 2; event records: section 8).

    ``matrix_key`` is a secret (never recorded, never shown): the key from
    which ``P`` is derived so later releases can reuse the same ``P``.
    """

    k: int = _p.option(help="output dimension (columns z0..z{k-1}), 1 .. number of columns",
                       constraints=[Interval("integer", 1, None, "left")])
    epsilon: float = _p.option(help="the total epsilon of the release", constraints=[_POS])
    delta: float = _p.option(0.0, help="0 for Laplace noise (pure epsilon-DP); in (0, 1) for Gaussian "
                             "noise", constraints=[Interval("real", 0, 1, "left")])
    columns: tuple | None = _p.option(None, help="numeric feature columns (one row per person); not with "
                                      "event records", kind="strs")
    noise: str = _p.option("laplace", help="laplace (pure epsilon-DP) or gaussian ((epsilon, delta)-DP)",
                           constraints=[Options(NOISE_KINDS)])
    neighbors: str = _p.option("replace-one", help="neighbour relation: replace-one (a person; n is public) "
                               "or element (ONE ATTRIBUTE only, not a person; needs --lower/--upper or "
                               "--element-bound, not --row-bound). add-remove cannot hold for a row-level "
                               "release and is refused", kind="neighbors")
    row_bound: float | None = _p.option(None, help="declared bound on each row's norm (rows are clipped to "
                                        "it)", constraints=[_POS])
    norm: str = _p.option("l2", help="norm of --row-bound", constraints=[Options(("l2", "l1"))])
    lower: tuple | None = _p.option(None, help="declared per-column lower bounds (one value for all "
                                    "columns, or one per column)", kind="floats")
    upper: tuple | None = _p.option(None, help="declared per-column upper bounds (one value for all "
                                    "columns, or one per column)", kind="floats")
    element_bound: float | None = _p.option(None, help="largest change of one attribute (element-wise "
                                            "relation)", constraints=[_POS])
    row_bound_quantile: float | None = _p.option(None, help="instead of --row-bound: estimate the row "
                                                 "bound as this DP quantile of the row norms (spends "
                                                 "--bound-epsilon-share of epsilon)",
                                                 constraints=[Interval("real", 0, 1, "right")])
    bound_epsilon_share: float = _p.option(0.1, help="share of epsilon spent on --row-bound-quantile",
                                           constraints=[Interval("real", 0, 1, "neither")])
    bound_search: tuple = _p.option(DEFAULT_EXPONENTS, help="with row_bound_quantile: the public "
                                    "candidates are 2^j for j in this (lo, hi) range of integers",
                                    kind="object")
    keep_columns: tuple = _p.option((), help="input columns declared PUBLIC and copied to the output "
                                    "unchanged (nothing else of the input, person keys included, is copied)",
                                    kind="strs")
    fill: float | None = _p.option(None, help="public value that replaces nulls in the feature columns",
                                   constraints=[Interval("real", None, None, "neither")])
    matrix_key: bytes | None = _p.option(None, help="SECRET key (>= 16 bytes) from which P is derived, to "
                                         "reuse the same P across releases (default: fresh OS entropy); "
                                         "never recorded", kind="object", recorded=False)

    def __repr__(self) -> str:  # the matrix key is a secret: never in a repr, log or message
        shown = ", ".join(f"{n}={v!r}" for n, v in self.public_dict().items())
        return f"ProjectionParams({shown}{', matrix_key=<secret>' if self.matrix_key is not None else ''})"

    def check(self, caller: str) -> None:
        if self.matrix_key is not None and (not isinstance(self.matrix_key, (bytes, bytearray))
                                            or len(self.matrix_key) < 16):
            raise ParameterError("The projection matrix key must be at least 16 bytes of secret material "
                                 f"(the 'matrix_key' parameter of {caller}, bytes).")
        if self.row_bound_quantile is not None:
            if self.row_bound is not None:
                raise ParameterError(
                    f"{caller}: row_bound_quantile estimates the row bound; it cannot be combined with a "
                    "declared row_bound. Give one or the other."
                )
            if self.neighbors == "element":
                raise ParameterError(
                    f"The 'row_bound_quantile' parameter of {caller} cannot be combined with "
                    "neighbors='element': clipping a row onto the norm ball rescales the whole row, so a "
                    "change of one attribute becomes a change of every coordinate and the element-wise "
                    "sensitivity no longer bounds it. Declare a per-column box (lower/upper) and/or "
                    "element_bound instead, or use neighbors='replace-one'."
                )
        overlap = set(self.columns or ()) & set(self.keep_columns)
        if overlap:
            raise ParameterError(
                f"Column {sorted(overlap)[0]!r} is both a feature column and a kept public column; "
                "a released column cannot be both private input and public output."
            )


@dataclass
class _State:
    """Public: what ``run`` needs besides the secrets."""

    kind: str
    k: int
    bounds: Bounds
    plan: ProjectionPlan
    keep: tuple = ()
    quantile: dict | None = None  # the DP row-bound pre-pass (public parameters)


@dataclass
class _Secrets:
    P: np.ndarray = field(repr=False)
    seed: int = field(repr=False)
    histogram_seed: int | None = field(default=None, repr=False)


class _Counts(Mapping):
    """Owner diagnostics read when asked (a lazy Spark output fills its counters when written)."""

    def __init__(self, counters, names=ROW_COUNTERS):
        self._c = counters
        self._names = names if counters is not None else ()

    def __getitem__(self, name):
        return self._c[self._names.index(name)].value

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _records_cap(facts: _p.InputFacts):
    """The item cap of bounded records from their public facts (value cap c, L2 bound c sqrt(L))."""
    from sparkpriv.mechanisms.sparse import ItemCap

    c = float(facts.value_cap)
    L = int(round((float(facts.l2_bound) / c) ** 2))
    if c == 1.0:
        return ItemCap(L)
    return ItemCap(L, "counts", int(round(c)))


class Projection(_p.Mechanism):
    """JL random projection + calibrated noise; one output row per input row (or person)."""

    name = "projection"
    title = "a projection release (of rows, or of event-table records)"
    summary = "JL random projection + calibrated noise (pairwise distances recoverable)"
    Params = ProjectionParams
    neighbors = (_p.REPLACE_ONE, _p.ELEMENT)
    row_level = True
    inputs = ("table", "records")

    def plan(self, params: ProjectionParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        from sparkpriv.privacy.accounting import compose

        d, k = facts.d, params.k
        matrix_source = ("secret key (held outside the output)" if params.matrix_key is not None
                         else "OS entropy, discarded after the job")
        if facts.kind == "records":
            given = {n for n in _RECORDS_REFUSED if getattr(params, n) is not None}
            if given or params.keep_columns:
                raise ParameterError(
                    f"{caller}: {', '.join(sorted(given) or ['keep_columns'])} cannot be given with "
                    "event-table records: their bounds come from the item cap (max_items) and they have "
                    "no public columns."
                )
            check_param("k", k, [Interval("integer", 1, d, "both")], caller)
            from sparkpriv.mechanisms.sparse import plan_sparse_projection

            cap = _records_cap(facts)
            P, seed = secret_matrix_and_seed(d, k, params.matrix_key)
            pplan = plan_sparse_projection(P, cap, epsilon=params.epsilon, delta=params.delta,
                                           noise=params.noise, neighbors=params.neighbors, caller=caller)
            event = pplan.dp_event()
            public = dict(pplan.to_public_dict(), input_kind="event table (sparse person records)",
                          matrix_source=matrix_source, reusable_projection=params.matrix_key is not None)
            return _p.Plan(events=event, epsilon=epsilon_of(event, pplan.delta), delta=pplan.delta,
                           public=public, neighbors=_p.REPLACE_ONE,
                           state=_State("records", k, pplan.bounds, pplan), secrets=_Secrets(P, seed))

        keep = tuple(params.keep_columns)
        if keep:
            if not facts.names:
                raise ParameterError("keep_columns needs a pandas or Arrow table input (a numpy array has "
                                     "no other columns to keep).")
            from sparkpriv.errors import SchemaError

            for c in keep:
                if c not in facts.names:
                    raise SchemaError(f"The kept (public) column {c!r} is not in the input. Available "
                                      f"columns: {', '.join(facts.names)}.")
        check_param("k", k, [Interval("integer", 1, d, "both")], caller)
        lower = broadcast_box(params.lower, d, "lower", caller)
        upper = broadcast_box(params.upper, d, "upper", caller)
        quantile = None
        if params.row_bound_quantile is not None:
            candidates = candidate_bounds(tuple(params.bound_search))
            eps_bound, eps_release = split_epsilon(params.epsilon, params.bound_epsilon_share)  # sum <= eps
            hist_noise = _wide_grid(histogram_noise(epsilon=eps_bound, neighbors=params.neighbors,
                                                    buckets=candidates.size + 1))
            bounds = Bounds(d, lower, upper, float(candidates[-1]), params.norm, None, _caller=caller)
            quantile = {"candidates": candidates, "noise": hist_noise, "q": float(params.row_bound_quantile),
                        "epsilon": params.epsilon * params.bound_epsilon_share, "eps_release": eps_release,
                        "delta": params.delta, "noise_kind": params.noise, "neighbors": params.neighbors,
                        "caller": caller}
        else:
            eps_release = params.epsilon
            bounds = Bounds(d, lower, upper, params.row_bound, params.norm, params.element_bound,
                            _caller=caller)
        P, seed = secret_matrix_and_seed(d, k, params.matrix_key)
        pplan = plan_projection(P, bounds, epsilon=eps_release, delta=params.delta, noise=params.noise,
                                neighbors=params.neighbors, caller=caller)
        public = dict(pplan.to_public_dict(), matrix_source=matrix_source,
                      reusable_projection=params.matrix_key is not None)
        # The events depend on epsilon (and delta) only, not on the bound: they are known (and
        # reserved) before the data is read, even when the bound itself comes from the data.
        if quantile is not None:
            event = compose([quantile["noise"].dp_event(), pplan.dp_event()])
            b = bounds.to_public_dict()
            public["bounds"] = {"lower": b["lower"], "upper": b["upper"],
                                "row_bound": f"DP quantile {params.row_bound_quantile}", "norm": params.norm}
            secrets = _Secrets(P, seed, new_secret_seed("bound-histogram-noise"))
        else:
            event = pplan.dp_event()
            secrets = _Secrets(P, seed)
        neighbors = _p.ELEMENT if params.neighbors == "element" else _p.REPLACE_ONE
        return _p.Plan(events=event, epsilon=epsilon_of(event, pplan.delta), delta=pplan.delta,
                       public=public, neighbors=neighbors,
                       state=_State("table", k, bounds, pplan, keep, quantile), secrets=secrets)

    def run(self, engine, source, plan: _p.Plan, progress) -> _p.Outcome:
        st: _State = plan.state
        sec: _Secrets = plan.secrets
        pplan, bounds = st.plan, st.bounds
        out_cols = [(f"z{i}", "double", False) for i in range(st.k)]
        public = {}
        if st.kind == "records":
            fn = _sparse_row_map(sec.P, pplan.noise, sec.seed, pplan.value_bound)
            table, rows = engine.map_rows(source, fn, out_cols)
            return _p.Outcome(table=table, rows=rows, extras={"plan": pplan})
        if getattr(source, "rows", None) == 0:  # in-memory input: its size is known without reading it
            raise InputError("The input table is empty: there is nothing to release.")
        if st.quantile is not None:
            q = st.quantile
            R = _dp_row_bound(engine, source, bounds, q, sec.histogram_seed)
            bounds = Bounds(bounds.dim, bounds.lower, bounds.upper, R, bounds.norm, None, _caller=q["caller"])
            pplan = plan_projection(sec.P, bounds, epsilon=q["eps_release"], delta=q["delta"],
                                    noise=q["noise_kind"], neighbors=q["neighbors"], caller=q["caller"])
            from sparkpriv.privacy.accounting import compose

            if compose([q["noise"].dp_event(), pplan.dp_event()]) != plan.events:  # pragma: no cover
                raise RuntimeError("the release's events changed with the estimated row bound")
            public = dict(pplan.to_public_dict(), row_bound_estimation={
                "method": "DP quantile of row norms (Laplace histogram over public power-of-two candidates)",
                "quantile": q["q"], "epsilon": q["epsilon"],
                "candidates": [float(q["candidates"][0]), float(q["candidates"][-1])],
                "histogram_noise": q["noise"].to_public_dict(), "chosen_row_bound": R,
            })
            progress.log("DP row bound: %.6g (quantile %g)", R, q["q"])
        counters = engine.counters(ROW_COUNTERS)
        fn = _dense_row_map(sec.P, bounds, pplan.noise, sec.seed, pplan.value_bound, counters)
        table, rows = engine.map_rows(source, fn, out_cols, keep=st.keep)
        return _p.Outcome(table=table, rows=rows, public=public,
                          extras={"plan": pplan, "diagnostics": _Counts(counters)})


def _dp_row_bound(engine, source, bounds: Bounds, q: dict, seed: int) -> float:
    """One pass: the noisy histogram of the (box-clipped) row norms; noise drawn once on the driver."""
    candidates = q["candidates"]
    counts = engine.aggregate(source, _norm_histogram_fn(Bounds(bounds.dim, bounds.lower, bounds.upper),
                                                         bounds.norm, candidates), candidates.size + 1)
    # clamping each count (a public range) never increases the sensitivity; the
    # grid holds 2^30 noise scales, so this only acts on astronomically large tables
    hist_noise = q["noise"]
    clamp = hist_noise.max_abs_value
    counts = np.clip(np.asarray(counts, dtype=np.float64), -clamp, clamp)
    noisy = _noise.add_noise(counts, hist_noise, stream(seed, 0))
    return choose_bound(noisy, candidates, q["q"])


def _norm_histogram_fn(box: Bounds, norm: str, candidates: np.ndarray):
    candidates = np.array(candidates, dtype=np.float64, copy=True)

    def norm_histogram(X):
        Xc, _ = clip_rows(X, box)
        return norm_bucket_counts(row_norms(Xc, norm), candidates)

    return norm_histogram


def _wide_grid(hist_noise):
    """The same Laplace noise (same event) on a grid holding counts up to 2^30 noise scales.

    The default grid holds only 2^22 scales: with a large epsilon a bucket of a
    few thousand rows would overflow it, and the release would fail because of
    the data. The coarser grid costs a factor ``1 + dim g / sensitivity`` (about
    ``1 + dim 2^-30``) in noise.
    """
    return _noise.calibrate_laplace_noise(
        sensitivity=hist_noise.sensitivity, epsilon=hist_noise.epsilon, dim=hist_noise.dim,
        max_abs=2.0**30 * hist_noise.sensitivity / hist_noise.epsilon)


def _dense_row_map(P, bounds: Bounds, noise, seed: int, value_bound=None, counters=None):
    """The engine's row map of dense blocks, built from plain values only (it is pickled).

    Per partition ``pid`` the noise comes from the keyed stream
    ``stream(seed, NOISE_STAGE, pid)``: a retried task reproduces it.
    ``noise=None`` gives the projection before noise (tests compare the
    engines with :func:`project_rows`). ``value_bound``: the plan's public range.
    """
    value_bound = None if value_bound is None else float(value_bound)
    P = np.ascontiguousarray(P)

    def projection_rows(pid, blocks):
        rng = stream(seed, NOISE_STAGE, pid)
        tot = ClipCounts()
        for X in blocks:
            Y, counts = project_rows(X, P, bounds, value_bound)
            tot = tot + counts
            yield list(_noise.transposed(Y) if noise is None else _noise.add_noise_transposed(Y, noise, rng))
        if counters is not None:
            counters[0].add(tot.rows)
            counters[1].add(tot.box_clipped)
            counters[2].add(tot.norm_clipped)

    return projection_rows


def _sparse_row_map(P, noise, seed: int, value_bound=None):
    """The engine's row map of bounded event records (:class:`~sparkpriv.mechanisms.protocol.SparseRows`,
    in the keyed person order), from plain values (pickled): the sum of the rows of ``P`` at a
    person's items, clamped, plus noise from ``stream(seed, NOISE_STAGE, pid)``."""
    from sparkpriv.mechanisms.sparse import project_sparse_rows

    P = np.ascontiguousarray(P)
    value_bound = None if value_bound is None else float(value_bound)

    def sparse_projection_rows(pid, blocks):
        rng = stream(seed, NOISE_STAGE, pid)
        for b in blocks:
            Y = project_sparse_rows(b.offsets, b.indices, b.values, P)
            if value_bound is not None:
                clamp_projected(Y, value_bound)
            yield list(_noise.transposed(Y) if noise is None else _noise.add_noise_transposed(Y, noise, rng))

    return sparse_projection_rows


PROJECTION = _p.register(Projection())
