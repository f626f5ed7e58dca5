"""The JL projection's matrix, plan, projected rows and the squared distances recovered from a
release (docs/math.md section 2)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.bounds import (
    NEIGHBOR_MEANING,
    NEIGHBORS,
    Bounds,
    ClipCounts,
    clip_rows,
)
from sparkpriv.privacy.random import derive_seed, new_secret_seed, stream
from sparkpriv.privacy.sensitivity import l1_sensitivity, l2_sensitivity


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
