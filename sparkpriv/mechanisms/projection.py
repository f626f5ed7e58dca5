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

Distance recovery (corrected Algorithm 2): with ``s2`` the per-entry noise
variance, ``D = ||Z_i - Z_j||^2 - 2 k s2`` is unbiased for ``||x_i - x_j||^2``
(over ``P`` and the noise), and with ``x = x_i - x_j``

    Var D = (2/k) ||x||^4 + k c s2^2 + 8 s2 ||x||^2,

where ``c = Var(e^2) / s2^2`` for ``e`` the difference of two noise draws:
``c = 14`` for Laplace noise (``E e^4 = 18 s2^2``) and ``c = 8`` for Gaussian
noise (``E e^4 = 12 s2^2``). The paper's Claim 7 is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkpriv._validation import Interval, Options, check_param, refuse_row_level_add_remove
from sparkpriv.errors import InputError, ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.bounds import (
    NEIGHBOR_MEANING,
    NEIGHBORS,
    Bounds,
    ClipCounts,
    broadcast_box,
    clip_rows,
)
from sparkpriv.privacy.random import derive_seed, new_secret_seed, stream
from sparkpriv.privacy.sensitivity import l1_sensitivity, l2_sensitivity

__all__ = [
    "ProjectionPlan",
    "ArrayRelease",
    "draw_projection_matrix",
    "plan_projection",
    "project_rows",
    "clamp_projected",
    "projected_value_bound",
    "release_projection_array",
    "recover_sq_distances",
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


@dataclass(frozen=True)
class ArrayRelease:
    """The result of :func:`release_projection_array`."""

    Z: np.ndarray
    plan: ProjectionPlan
    clip_counts: ClipCounts

    @property
    def events(self):
        return self.plan.dp_event()

    def epsilon(self, delta: float | None = None) -> float:
        return epsilon_of(self.plan.dp_event(), self.plan.delta if delta is None else delta)


def release_projection_array(
    X: np.ndarray,
    *,
    k: int,
    epsilon: float,
    delta: float = 0.0,
    noise: str = "laplace",
    neighbors: str = "replace-one",
    row_bound: float | None = None,
    norm: str = "l2",
    lower=None,
    upper=None,
    element_bound: float | None = None,
    matrix_key: bytes | None = None,
) -> ArrayRelease:
    """Private JL projection of an in-memory array (the single-machine library).

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    k : int in [1, n_features]
        Output dimension.
    epsilon, delta : float
        The guarantee; ``delta`` must be 0 for Laplace and > 0 for Gaussian noise.
    noise : {"laplace", "gaussian"}
    neighbors : {"replace-one", "element"}
        ``"add-remove"`` is refused (one output row per input row).
        ``"element"`` needs ``lower``/``upper`` and/or ``element_bound`` and
        refuses ``row_bound``.
    row_bound, norm, lower, upper, element_bound
        Declared public bounds (:class:`~sparkpriv.privacy.bounds.Bounds`);
        ``lower``/``upper`` are one value per column or a single value for all.
    matrix_key : bytes, optional
        Secret key from which ``P`` is derived (to project later batches with the
        same ``P``); by default ``P`` comes from fresh OS entropy.

    Returns
    -------
    ArrayRelease
        ``Z`` of shape (n_samples, k), the public plan and clipping counts.

    Raises
    ------
    ParameterError
        Bad parameters (decided before the data is looked at).
    InputError
        ``X`` is not a non-empty 2-D real array of finite numbers.

    Privacy
    -------
    See the module docstring: exact sensitivity of the realized ``P`` under the
    declared relation and bounds, enforced by clipping; Laplace -> pure
    epsilon-DP, Gaussian -> (epsilon, delta)-DP.
    """
    caller = "release_projection_array"
    refuse_row_level_add_remove(neighbors, release="a projection release", caller=caller)
    X = np.asarray(X)
    if X.ndim != 2:
        raise InputError(f"X must be a 2-D array (n_samples, n_features). Got shape {X.shape}.")
    if np.iscomplexobj(X):
        raise InputError(f"X must be real numbers. Got dtype {X.dtype}: release the real and "
                         "imaginary parts as separate columns if both are meant.")
    if not np.issubdtype(X.dtype, np.number):
        raise InputError(f"X must be numeric. Got dtype {X.dtype}.")
    d = X.shape[1]
    check_param("k", k, [Interval("integer", 1, d, "both")], caller)
    bounds = Bounds(d, broadcast_box(lower, d, "lower", caller), broadcast_box(upper, d, "upper", caller),
                    row_bound, norm, element_bound, _caller=caller)
    P, noise_seed = secret_matrix_and_seed(d, k, matrix_key)
    plan = plan_projection(P, bounds, epsilon=epsilon, delta=delta, noise=noise,
                           neighbors=neighbors, caller=caller)
    if X.shape[0] == 0:
        raise InputError("X is empty: there is nothing to release.")
    X = X.astype(np.float64, copy=False)
    bad = np.flatnonzero(~np.isfinite(X).all(axis=0))
    if bad.size:
        raise InputError(f"X has NaN or infinite values in column index {int(bad[0])}; replace them with a "
                         "public value first.")
    Y, counts = project_rows(X, P, bounds, plan.value_bound)
    Z = _noise.add_noise(Y, plan.noise, stream(noise_seed, NOISE_STAGE, 0))
    return ArrayRelease(Z=Z, plan=plan, clip_counts=counts)


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
