"""Private linear regression on a sample-mixing sketch (docs/math.md section 6).

Data ``M = [A b]`` (n x p, ``p = d + 1``: the features, then the target), every
row clipped to ``||m_i||_2 <= B`` (``row_bound``, declared and public).

Schemes
-------
* ``sketch``: release ``S M + W``. ``S`` is ``m x n`` with i.i.d. ``N(0, 1/m)``
  entries, secret, drawn independently of the data; ``W`` is ``m x p`` Gaussian
  noise. The noise enters ``m`` rows instead of ``n``:
  ``E[(S A + W_A)^T (S A + W_A)] = A^T A + m s^2 I`` (``E S^T S = I_n``).
* ``additive`` (the baseline): release ``M + W`` (n x p), one noisy row per
  input row; ``E[(A + W_A)^T (A + W_A)] = A^T A + n s^2 I``.

Privacy
-------
Neighbours: replace-one only (``n`` is public). Changing row ``i`` from ``m_i``
to ``m_i'`` changes ``S M`` by the rank-one matrix ``S_{:,i} (m_i' - m_i)^T``,
whose Frobenius norm is ``||S_{:,i}||_2 ||m_i' - m_i||_2 <= 2 B ||S_{:,i}||_2``,
with equality at ``m_i' = -m_i``, ``||m_i|| = B``. So the exact L2 sensitivity
for the REALIZED ``S`` is ``Delta_2 = 2 B max_i ||S_{:,i}||_2`` (near ``2 B``
for ``m >= 100``); the additive scheme has ``Delta_2 = 2 B``. ``S`` is drawn
independently of the data, so the Gaussian mechanism calibrated to the realized
``S`` is ``(epsilon, delta)``-DP conditional on every ``S``, hence
unconditionally. Publishing the noise scale reveals ``max_i ||S_{:,i}||``, a
function of ``S`` alone: the conditional guarantee holds even against someone
who knows all of ``S``.

Refused neighbour relations (decided from the parameters, before any data):

* ``add-remove``: the noise is calibrated from the realized columns of ``S``,
  one per record of the public ``n``; an added record would bring a column
  that is not among them (its norm is unbounded), and ``m <= n`` is checked
  against ``n``. The additive scheme has one output row per record, and no
  noise hides the number of rows.
* ``element`` (one attribute changes): the rows are clipped to a norm ball, and
  a norm clip rescales the whole row, so one changed attribute changes every
  coordinate (docs/math.md section 2); section 6 bounds rows, i.e. people.

Calibration: the analytic Gaussian mechanism in Gaussian-DP form. Before any
data is read, :func:`plan_regression` fixes the noise multiplier ``z`` (noise
std / sensitivity) with ``fit_to_epsilon`` so that dp_accounting's epsilon of
the recorded ``GaussianDpEvent(z)`` is at most the request. After the pass the
realized sensitivity is known and :func:`finalize_sketch` draws discrete
Gaussian noise on a power-of-two grid (docs/math.md section 7) whose multiplier,
grid rounding and samplers' slack included, is at least ``z``
(:func:`sparkpriv.privacy.noise.gaussian_noise_from_multiplier`); the receipt
therefore never states less than was spent. The grid holds the public value
bound ``B max_j ||S_{j,:}||_1`` (a function of ``S`` only).

Sketch layout (both engines)
----------------------------
Column ``i`` of ``S`` belongs to the record with GLOBAL row index ``i`` (its
position in the table: partition offset + position in the partition). Columns
are drawn in blocks of :func:`block_rows` ``(m)`` records: block ``k`` is
``stream(seed, SKETCH_STAGE, k).standard_normal((block_rows, m)) / sqrt(m)``,
its row ``j`` is column ``k block_rows + j`` of ``S``. So the columns of a record
depend only on the secret seed, ``m`` and its global index: any partitioning of
the same ordered table gives the same ``S``, a retried task regenerates the same
columns, and no engine ever holds ``S`` whole. (Why the layout is private: the
columns are i.i.d. whatever the keys, and the noise scale is a symmetric
function of them, so ANY assignment of records to distinct indices that does
not depend on ``S`` gives the same output distribution.)

Fits (post-processing of the release)
-------------------------------------
From the released ``R = [A~ b~]`` (``r`` rows: ``m`` for the sketch, ``n`` for
the additive scheme) with per-entry noise variance ``s^2``:
``H = A~^T A~ - debias * r s^2 I + ridge I``, ``x = H^{-1} A~^T b~``. If ``H``
is not positive definite after debiasing, its eigenvalues are raised to a floor
(post-processing; reported as ``eigenvalues_floored``).

Confidence intervals: the rows of the sketch are i.i.d. (rows of ``S`` and of
``W`` are), and ``x`` solves ``sum_j psi_j(x) = 0`` with
``psi_j(x) = a~_j (b~_j - a~_j^T x) + debias s^2 x - ridge x / r``, whose
expectation at the non-private least-squares solution ``x*`` (of the clipped
data, ridge 0) is zero. The sandwich ``H^{-1} (sum_j psi_j psi_j^T) H^{-1}``
estimates the covariance of ``x`` around ``x*`` (times ``r / (r - d)``, the
usual small-sample factor); intervals use Student's t with ``r - d`` degrees
of freedom. For the additive scheme the rows are
independent but not identically distributed; the same sandwich is then
conservative. With ``ridge > 0`` the intervals are around the ridge target,
not ``x*``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dp_accounting import dp_event

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.errors import InputError, ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import epsilon_of, fit_to_epsilon
from sparkpriv.privacy.bounds import Bounds, ClipCounts, clip_rows
from sparkpriv.privacy.calibration import gdp_mu_for
from sparkpriv.privacy.random import new_secret_seed, stream

__all__ = [
    "SCHEMES",
    "SKETCH_RULES",
    "RegressionParams",
    "RegressionFacts",
    "RegressionPlan",
    "RegressionFit",
    "RegressionRelease",
    "sketch_rows_for",
    "block_rows",
    "sketch_columns",
    "sketch_matrix",
    "sketch_partial",
    "partial_size",
    "pack_partial",
    "plan_regression",
    "clip_regression_rows",
    "finalize_sketch",
    "additive_noise_rows",
    "fit_from_release",
    "fit_from_moments",
    "sandwich_moments",
    "sketch_sensitivity",
    "release_regression_array",
    "relative_objective_error",
]

SCHEMES = ("sketch", "additive")
SKETCH_RULES = ("log", "linear", "full")
NEIGHBORS_OK = ("replace-one",)
SKETCH_STAGE = 21  # public label of the sketch's column streams: (seed, SKETCH_STAGE, block)
NOISE_STAGE = 22  # driver noise of the sketch: (noise seed, NOISE_STAGE, 0)
ADDITIVE_STAGE = 23  # row noise of the additive scheme: (noise seed, ADDITIVE_STAGE, partition)
_BLOCK_VALUES = 2**18  # about this many normals per column block (2 MB)

_POS = Interval("real", 0, None, "neither")


@dataclass(frozen=True, kw_only=True)
class RegressionParams(_p.Params):
    """Public parameters of a private linear regression release (docs/regression.md)."""

    columns: tuple | None = _p.option(None, help="numeric feature columns (the design matrix A), in order",
                                      kind="strs")
    target: str | None = _p.option(None, help="numeric target column b (not one of the feature columns)",
                                   kind="str")
    row_bound: float = _p.option(help="declared bound B on the L2 norm of each row [features..., target]; "
                                 "rows are clipped to it (counted)", constraints=[_POS])
    epsilon: float = _p.option(help="the epsilon of the release", constraints=[_POS])
    delta: float = _p.option(help="the delta of the release, in (0, 1) (Gaussian noise)",
                             constraints=[Interval("real", 0, 1, "neither")])
    scheme: str = _p.option("sketch", help="sketch: release S M + W (m rows); additive: the baseline "
                            "M + W (one noisy row per input row, for comparisons)", constraints=[Options(SCHEMES)])
    sketch_rows: int | None = _p.option(None, help="m, rows of the sketch (1 <= m <= n)",
                                        constraints=[Interval("integer", 1, None, "left")],
                                        doc_default="the sketch_rule")
    sketch_rule: str = _p.option("log", help="m when sketch_rows is not given: log max(p + 10, "
                                 "ceil(10 ln n)), linear max(log, ceil(n / 10)), full n; at most n",
                                 constraints=[Options(SKETCH_RULES)])
    ridge: float = _p.option(0.0, help="ridge penalty lambda >= 0 of the fitted model (post-processing)",
                             constraints=[Interval("real", 0, None, "left")])
    debias: bool = _p.option(True, help="subtract the noise's expected r s^2 I from the Gram matrix "
                             "before solving", constraints=[bool], kind="bool")
    confidence: float = _p.option(0.95, help="level of the coefficient confidence intervals",
                                  constraints=[Interval("real", 0, 1, "neither")])
    fill: float | None = _p.option(None, help="public value that replaces nulls in the columns",
                                   constraints=[Interval("real", None, None, "neither")])
    neighbors: str = _p.option("replace-one", help="neighbour relation: replace-one (n is public)",
                               kind="neighbors")

    def input_columns(self) -> tuple:
        """The columns the engine opens: the features, then the target."""
        return tuple(self.columns or ()) + ((self.target,) if self.target else ())

    @property
    def features(self) -> tuple:
        return tuple(self.columns or ())

    def validate(self, caller: str = "release_regression") -> None:
        """Refuse bad parameters (they alone decide: no data is read)."""
        if self.row_bound is None:
            raise ParameterError(
                f"{caller} needs a declared public bound on the rows: give row_bound (--row-bound), "
                "a bound B on the L2 norm of [features..., target] for every row. Bounds computed "
                "from the data are not private."
            )
        check_param("row_bound", self.row_bound, [Interval("real", 0, None, "neither")], caller)
        if not math.isfinite(float(self.row_bound)):
            raise ParameterError(f"The 'row_bound' parameter of {caller} must be finite. Got {self.row_bound!r}.")
        check_neighbors(self.neighbors, self.scheme, caller)
        super().validate(caller)

    def check(self, caller: str) -> None:
        feats = self.features
        if self.target and self.target in feats:
            raise ParameterError(
                f"The target column {self.target!r} of {caller} is also listed as a feature: a model "
                "that predicts a column from itself has nothing to fit. Remove it from the features."
            )
        if len(set(feats)) != len(feats):
            raise ParameterError(f"The 'columns' parameter of {caller} lists a column twice: {list(feats)!r}.")


def check_neighbors(neighbors: Any, scheme: str, caller: str) -> None:
    """Refuse every neighbour relation but replace-one, with the reason (module docstring)."""
    if neighbors == "add-remove":
        raise ParameterError(
            f"The 'neighbors' parameter of {caller} cannot be 'add-remove' for a regression release: "
            "the noise is calibrated from the realized columns of the secret sketch S, one per record "
            "of the public row count n, and an added record would bring a column that is not among "
            "them; the additive scheme has one output row per record, which no noise hides. Use "
            "neighbors='replace-one' (one person replaced; n is public)."
        )
    if neighbors == "element":
        raise ParameterError(
            f"The 'neighbors' parameter of {caller} cannot be 'element' for a regression release: "
            "rows are clipped to an L2 ball, and a norm clip rescales the whole row, so one changed "
            "attribute changes every coordinate (docs/math.md section 2). Use neighbors='replace-one', "
            "which protects a whole row (a person)."
        )
    check_param("neighbors", neighbors, [Options(NEIGHBORS_OK)], caller)


def sketch_rows_for(rule: str, n: int, p: int) -> int:
    """``m`` for a rule (public: depends on ``n`` and ``p`` only); always in ``[1, n]``."""
    log_m = max(p + 10, math.ceil(10.0 * math.log(max(n, 2))))
    if rule == "log":
        m = log_m
    elif rule == "linear":
        m = max(log_m, math.ceil(n / 10.0))
    elif rule == "full":
        m = n
    else:
        raise ParameterError(f"The 'sketch_rule' must be one of {SKETCH_RULES!r}. Got {rule!r} instead.")
    return int(max(1, min(m, n)))


# ----------------------------------------------------------------------------- the sketch S


def block_rows(m: int) -> int:
    """Records per column block of ``S`` (a function of ``m`` only)."""
    return max(1, _BLOCK_VALUES // int(m))


def _block(seed: int, m: int, k: int) -> np.ndarray:
    """Block ``k`` of ``S^T``: ``(block_rows(m), m)``, row ``j`` = column ``k block_rows + j`` of ``S``."""
    rng = stream(seed, SKETCH_STAGE, int(k))
    G = rng.standard_normal((block_rows(m), m))
    G *= 1.0 / math.sqrt(m)
    return G


def sketch_columns(seed: int, m: int, start: int, stop: int):
    """Yield ``(lo, hi, C)`` covering global rows ``[start, stop)``: ``C`` is ``(hi - lo, m)``,
    its row ``t`` the column ``lo + t`` of ``S``. Whole blocks are generated, parts used."""
    br = block_rows(m)
    lo = int(start)
    while lo < stop:
        k = lo // br
        hi = min(stop, (k + 1) * br)
        G = _block(seed, m, k)
        yield lo, hi, G[lo - k * br: hi - k * br]
        lo = hi


def sketch_matrix(seed: int, m: int, n: int) -> np.ndarray:
    """The whole ``S`` (m x n). TESTS AND SMALL REFERENCES ONLY: engines never build it."""
    S = np.empty((m, n))
    for lo, hi, C in sketch_columns(seed, m, 0, n):
        S[:, lo:hi] = C.T
    return S


def partial_size(m: int, p: int, slots: int = 1) -> int:
    """Length of a sketch partial: ``vec(S M)`` (m p), row L1 norms of ``S`` (m), ``slots`` maxima."""
    return m * p + m + slots


def sketch_partial(Mc: np.ndarray, seed: int, m: int, start: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``(S_part M_part, row L1 norms of S_part, max column norm of S_part)`` for clipped rows
    ``Mc`` (k, p) with global indices ``start .. start + k - 1``."""
    k, p = Mc.shape
    SM = np.zeros((m, p))
    l1 = np.zeros(m)
    cmax = 0.0
    for lo, hi, C in sketch_columns(seed, m, start, start + k):
        rows = Mc[lo - start: hi - start]
        SM += C.T @ rows
        l1 += np.abs(C).sum(axis=0)
        cmax = max(cmax, float(np.sqrt(np.einsum("ij,ij->i", C, C).max())))
    return SM, l1, cmax


def pack_partial(SM: np.ndarray, l1: np.ndarray, cmax: float, slot: int = 0, slots: int = 1) -> np.ndarray:
    """One float64 vector of a partial; column-norm maxima go to their own slot, so that sums
    of partials (tree aggregation) keep every partition's maximum."""
    m, p = SM.shape
    v = np.zeros(partial_size(m, p, slots))
    v[: m * p] = SM.ravel()
    v[m * p: m * p + m] = l1
    v[m * p + m + int(slot)] = cmax
    return v


def sketch_sensitivity(S: np.ndarray, row_bound: float) -> float:
    """``2 B max_i ||S_{:,i}||_2`` (replace-one; exact for the realized ``S``)."""
    return 2.0 * float(row_bound) * float(np.sqrt(np.einsum("ij,ij->j", S, S).max()))


# ----------------------------------------------------------------------------- plan


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


# ----------------------------------------------------------------------------- rows


def clip_regression_rows(A: np.ndarray, b: np.ndarray, row_bound: float) -> tuple[np.ndarray, ClipCounts]:
    """``M = [A b]`` clipped to ``||m_i||_2 <= row_bound`` and the clip counts."""
    M = np.concatenate([np.asarray(A, np.float64), np.asarray(b, np.float64).reshape(-1, 1)], axis=1)
    return clip_rows(M, Bounds(M.shape[1], row_bound=float(row_bound), _caller="release_regression"), out=M)


def additive_noise_rows(Mc: np.ndarray, plan: RegressionPlan, rng: np.random.Generator) -> np.ndarray:
    """``M + W`` for clipped rows (the additive baseline's row map)."""
    return _noise.add_noise(Mc, plan.additive_noise(), rng)


# ----------------------------------------------------------------------------- finalize and fit


@dataclass(frozen=True)
class RegressionFit:
    """Coefficients of a fit on a release, with their standard errors and intervals."""

    coef: np.ndarray
    stderr: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    confidence: float
    ridge: float
    debias: bool
    eigenvalues_floored: int

    def to_public_dict(self, names=None) -> dict:
        names = list(names) if names is not None else [f"x{j}" for j in range(self.coef.size)]
        return {
            "coefficients": {nm: float(c) for nm, c in zip(names, self.coef)},
            "stderr": {nm: float(c) for nm, c in zip(names, self.stderr)},
            "confidence_intervals": {nm: [float(lo), float(hi)]
                                     for nm, lo, hi in zip(names, self.ci_low, self.ci_high)},
            "confidence": self.confidence,
            "ridge": self.ridge,
            "debias": self.debias,
            "eigenvalues_floored": self.eigenvalues_floored,
            "interval_method": "sandwich (M-estimation) over the released rows, Student t",
        }


@dataclass(frozen=True)
class RegressionRelease:
    """The released matrix (``m x p`` sketch or ``n x p`` noisy rows), its plan and noise, a fit."""

    R: np.ndarray
    plan: RegressionPlan
    noise: _noise.GaussianNoise
    sensitivity: float
    fit: RegressionFit
    clip_counts: ClipCounts | None = None
    release_df: Any = field(default=None, repr=False, compare=False)  # Spark, additive scheme: the noisy rows

    @property
    def noise_variance(self) -> float:
        return float(self.noise.variance)

    def epsilon(self, delta: float | None = None) -> float:
        return epsilon_of(self.plan.dp_event(), self.plan.delta if delta is None else delta)

    def to_public_dict(self) -> dict:
        out = self.plan.to_public_dict()
        out["sensitivity_value"] = self.sensitivity
        out["noise"] = self.noise.to_public_dict()
        out["noise_variance_per_entry"] = self.noise_variance
        out["model"] = self.fit.to_public_dict(self.plan.params.features or None)
        return out


def sketch_noise(plan: RegressionPlan, max_col_norm: float, max_row_l1: float) -> tuple[_noise.GaussianNoise, float]:
    """The sketch's noise for the realized column and row norms of ``S``, and the sensitivity."""
    B = float(plan.params.row_bound)
    sens = 2.0 * B * float(max_col_norm)
    if not sens > 0:
        raise InputError("The sketch has no columns: there is nothing to release.")
    nz = _noise.gaussian_noise_from_multiplier(sensitivity=sens, noise_multiplier=plan.noise_multiplier,
                                               dim=plan.m * plan.p, max_abs=max(B * float(max_row_l1), sens))
    return nz, sens


def finalize_sketch(total: np.ndarray, plan: RegressionPlan, rng: np.random.Generator | None = None,
                    *, slots: int = 1) -> RegressionRelease:
    """Driver step: unpack the summed partials, calibrate to the realized ``S``, add noise once, fit."""
    m, p = plan.m, plan.p
    total = np.asarray(total, np.float64)
    if total.shape != (partial_size(m, p, slots),):
        raise ValueError(f"sketch partial total has shape {total.shape}, expected ({partial_size(m, p, slots)},)")
    SM = total[: m * p].reshape(m, p)
    l1 = total[m * p: m * p + m]
    cmax = float(total[m * p + m:].max())
    nz, sens = sketch_noise(plan, cmax, float(l1.max()))
    if rng is None:
        rng = stream(plan.noise_seed, NOISE_STAGE, 0)
    R = _noise.add_noise(SM, nz, rng)
    fit = fit_from_release(R, nz.variance, ridge=plan.params.ridge, debias=plan.params.debias,
                           confidence=plan.params.confidence, gaussian_rows=True)
    return RegressionRelease(R, plan, nz, sens, fit)


def _solve(G: np.ndarray, rows: int, s2: float, ridge: float, debias: bool) -> tuple[np.ndarray, np.ndarray, int]:
    d = G.shape[0] - 1
    H = G[:d, :d].copy()
    if debias:
        H[np.diag_indices(d)] -= rows * s2
    if ridge:
        H[np.diag_indices(d)] += ridge
    H = 0.5 * (H + H.T)
    w, V = np.linalg.eigh(H)
    floor = max(1e-9 * max(float(np.abs(w).max()), 1e-300), rows * s2 * 1e-3 if debias else 0.0)
    floored = int(np.count_nonzero(w < floor))
    if floored:
        w = np.maximum(w, floor)
        H = (V * w) @ V.T
    x = V @ ((V.T @ G[:d, d]) / w)
    return x, H, floored


def fit_from_moments(G: np.ndarray, rows: int, s2: float, *, ridge: float = 0.0, debias: bool = True):
    """Coefficients from the released Gram matrix ``G = R^T R`` ((d+1) x (d+1)), ``rows`` released rows."""
    x, _, floored = _solve(np.asarray(G, np.float64), rows, s2, ridge, debias)
    return x, floored


def sandwich_moments(R: np.ndarray, x: np.ndarray, s2: float, *, ridge: float, debias: bool, rows: int) -> np.ndarray:
    """``sum_j psi_j psi_j^T`` over released rows ``R`` (a batch; sums over batches add up)."""
    A, b = R[:, :-1], R[:, -1]
    e = b - A @ x
    c = (s2 if debias else 0.0) * x - (ridge / rows) * x
    Psi = A * e[:, None] + c[None, :]
    return Psi.T @ Psi


def _intervals(x, H, meat, rows, confidence):
    from scipy import stats

    Hinv = np.linalg.inv(H)
    cov = Hinv @ meat @ Hinv * (rows / max(rows - x.size, 1))  # small-sample factor (HC1)
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    df = max(rows - x.size, 1)
    q = float(stats.t.ppf(0.5 + confidence / 2.0, df))
    return se, x - q * se, x + q * se


def gaussian_meat(R: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``Var(sum_j psi_j)`` for i.i.d. zero-mean Gaussian rows (the sketch's), by Isserlis:
    ``r (s_e^2 Sigma_AA + c c^T)`` with ``e = b~ - A~ x``, ``s_e^2 = mean(e^2)``, ``c = mean(a~ e)``,
    ``Sigma_AA = A~^T A~ / r``."""
    A, b = R[:, :-1], R[:, -1]
    r = R.shape[0]
    e = b - A @ x
    c = A.T @ e / r
    return (float(e @ e) / r) * (A.T @ A) + r * np.outer(c, c)


def fit_from_release(R: np.ndarray, s2: float, *, ridge: float = 0.0, debias: bool = True,
                     confidence: float = 0.95, gaussian_rows: bool = False) -> RegressionFit:
    """Least-squares (or ridge) coefficients and sandwich intervals from a released matrix ``R``."""
    R = np.asarray(R, np.float64)
    rows = R.shape[0]
    x, H, floored = _solve(R.T @ R, rows, s2, ridge, debias)
    if gaussian_rows:
        meat = gaussian_meat(R, x)
    else:
        meat = sandwich_moments(R, x, s2, ridge=ridge, debias=debias, rows=rows)
    se, lo, hi = _intervals(x, H, meat, rows, confidence)
    return RegressionFit(x, se, lo, hi, float(confidence), float(ridge), bool(debias), floored)


def fit_from_gram_and_meat(G: np.ndarray, meat: np.ndarray, x: np.ndarray, rows: int, s2: float, *,
                           ridge: float, debias: bool, confidence: float) -> RegressionFit:
    """The fit when ``G`` and the sandwich ``meat`` were aggregated by an engine (two passes)."""
    _, H, floored = _solve(G, rows, s2, ridge, debias)
    se, lo, hi = _intervals(x, H, meat, rows, confidence)
    return RegressionFit(np.asarray(x), se, lo, hi, float(confidence), float(ridge), bool(debias), floored)


# ----------------------------------------------------------------------------- in memory


def _check_arrays(A, b, features: int | None = None):
    A = np.asarray(A)
    b = np.asarray(b)
    if A.ndim != 2:
        raise InputError(f"A must be a 2-D array (n_samples, n_features). Got shape {A.shape}.")
    if b.ndim != 1 or b.shape[0] != A.shape[0]:
        raise InputError(f"b must be a 1-D array with one value per row of A ({A.shape[0]}). Got shape {b.shape}.")
    for name, X in (("A", A), ("b", b)):
        if np.iscomplexobj(X) or not np.issubdtype(X.dtype, np.number):
            raise InputError(f"{name} must hold real numbers. Got dtype {X.dtype}.")
    if A.shape[0] == 0:
        raise InputError("A is empty: there is nothing to release.")
    A = A.astype(np.float64, copy=False)
    b = b.astype(np.float64, copy=False)
    bad = np.flatnonzero(~np.isfinite(A).all(axis=0))
    if bad.size:
        raise InputError(f"A has NaN or infinite values in column index {int(bad[0])}; replace them with a "
                         "public value first.")
    if not np.isfinite(b).all():
        raise InputError("b has NaN or infinite values; replace them with a public value first.")
    return A, b


def release_regression_array(A, b, params: RegressionParams) -> RegressionRelease:
    """Private regression of an in-memory ``(A, b)`` (the single-machine reference path).

    Parameters
    ----------
    A : ndarray (n, d); b : ndarray (n,)
    params : RegressionParams
        ``features`` may be empty here (names default to ``x0..``).

    Returns
    -------
    RegressionRelease
        ``R`` is the released ``m x p`` sketch (or ``n x p`` noisy rows for the
        additive scheme); ``fit`` the coefficients with intervals.
    """
    caller = "release_regression_array"
    params.validate(caller)
    A = np.asarray(A)
    d = A.shape[1] if A.ndim == 2 else 0
    if params.features and len(params.features) != d:
        raise ParameterError(f"{caller}: {len(params.features)} feature names for {d} columns of A.")
    n = A.shape[0] if A.ndim == 2 else 0
    if n == 0:
        raise InputError("A is empty: there is nothing to release.")
    plan = plan_regression(params, RegressionFacts(int(n)), d=d, caller=caller)
    A, b = _check_arrays(A, b)
    Mc, counts = clip_regression_rows(A, b, params.row_bound)
    if plan.scheme == "sketch":
        SM, l1, cmax = sketch_partial(Mc, plan.sketch_seed, plan.m, 0)
        rel = finalize_sketch(pack_partial(SM, l1, cmax), plan)
        return RegressionRelease(rel.R, plan, rel.noise, rel.sensitivity, rel.fit, counts)
    nz = plan.additive_noise()
    R = additive_noise_rows(Mc, plan, stream(plan.noise_seed, ADDITIVE_STAGE, 0))
    fit = fit_from_release(R, nz.variance, ridge=params.ridge, debias=params.debias, confidence=params.confidence)
    return RegressionRelease(R, plan, nz, 2.0 * float(params.row_bound), fit, counts)


def relative_objective_error(A: np.ndarray, b: np.ndarray, x_hat: np.ndarray) -> float:
    """``(||A x^ - b||^2 - ||A x* - b||^2) / ||A x* - b||^2`` with ``x*`` the least-squares solution."""
    A = np.asarray(A, np.float64)
    b = np.asarray(b, np.float64)
    x_star = np.linalg.lstsq(A, b, rcond=None)[0]
    f_star = float(np.sum((A @ x_star - b) ** 2))
    f_hat = float(np.sum((A @ x_hat - b) ** 2))
    return (f_hat - f_star) / f_star


# ----------------------------------------------------------------------------- the protocol mechanism


def sketch_slots(n: int, m: int) -> int:
    """Column-norm slots of an indexed pass: one per column block of ``S`` (``ceil(n / block_rows)``)."""
    return -(-int(n) // block_rows(m))


def indexed_sketch_fn(seed: int, m: int, n: int, row_bound: float, counters=None):
    """``fn(block, start)`` for :meth:`engine.index(...).aggregate`: the packed partial of a block of
    rows with global indices ``start ..``. Column norms: the block holding the first row of a column
    block of ``S`` writes that column block's largest column norm (columns below ``n``) into the
    block's own slot, so sums of partials keep every maximum exactly once."""
    br = block_rows(m)
    slots = sketch_slots(n, m)

    def sketch_block(X, start):
        p = X.shape[1]
        Mc, counts = clip_rows(X, Bounds(p, row_bound=float(row_bound), _caller="release_regression"))
        if counters is not None:
            counters[0].add(counts.rows)
            counters[1].add(counts.norm_clipped)
        out = np.zeros(partial_size(m, p, slots))
        SM = out[: m * p].reshape(m, p)
        l1 = out[m * p: m * p + m]
        stop = start + X.shape[0]
        lo = start
        while lo < stop:
            k = lo // br
            hi = min(stop, (k + 1) * br)
            G = _block(seed, m, k)
            C = G[lo - k * br: hi - k * br]
            SM += C.T @ Mc[lo - start: hi - start]
            l1 += np.abs(C).sum(axis=0)
            if start <= k * br < stop:
                used = G[: min(br, n - k * br)]
                out[m * p + m + k] = float(np.sqrt(np.einsum("ij,ij->i", used, used).max()))
            lo = hi
        return out

    return sketch_block


@dataclass(frozen=True)
class _RegressionState:
    params: RegressionParams
    noise_multiplier: float
    mu: float


class Regression(_p.Mechanism):
    """Linear regression on a sample-mixing sketch: releases the noisy sketch and a model."""

    name = "regression"
    title = "private linear regression (sample-mixing sketch)"
    summary = "linear regression on a sample-mixing sketch S M + W; releases the sketch and coefficients"
    Params = RegressionParams
    neighbors = (_p.REPLACE_ONE,)
    refused_neighbors = {
        "add-remove": "the noise is calibrated from the realized columns of the secret sketch S, one per "
                      "record of the public row count n; an added record would bring a column outside them",
        "element": "rows are clipped to an L2 ball, and a norm clip rescales the whole row, so one changed "
                   "attribute changes every coordinate",
    }
    inputs = ("table",)

    def plan(self, params: RegressionParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        if not params.columns or not params.target:
            raise ParameterError(f"{caller} needs feature columns (columns / --columns) and a target column "
                                 "(target / --target).")
        eps, delta = float(params.epsilon), float(params.delta)
        mu = gdp_mu_for(eps, delta)
        r = fit_to_epsilon(lambda r: dp_event.GaussianDpEvent(1.0 / (r * mu)), epsilon=eps, delta=delta,
                           caller=caller)
        z = 1.0 / (r * mu)
        event = dp_event.GaussianDpEvent(z)
        sketch = params.scheme == "sketch"
        public = {
            "mechanism": ("linear regression on a sample-mixing sketch (docs/math.md section 6)" if sketch else
                          "linear regression, additive noise baseline M + W (docs/math.md section 6)"),
            "scheme": params.scheme,
            "features": list(params.columns), "target": params.target, "row_bound": float(params.row_bound),
            "bounds": {"row_bound": float(params.row_bound), "norm": "l2", "applies_to": "[features..., target]"},
            "noise_multiplier": z, "gaussian_dp_mu": r * mu,
            "sensitivity": ("2 row_bound max_i ||S_:,i||_2 of the realized secret sketch S" if sketch else
                            "2 row_bound (one row replaced changes one released row)"),
        }
        return _p.Plan(events=event, epsilon=epsilon_of(event, delta), delta=delta, public=public,
                       neighbors=_p.REPLACE_ONE, state=_RegressionState(params, z, r * mu),
                       secrets=(new_secret_seed("regression-sketch"), new_secret_seed("regression-noise")))

    def run(self, engine, source, plan: _p.Plan, progress) -> _p.Outcome:
        st: _RegressionState = plan.state
        pr = st.params
        d = len(pr.columns)
        p = d + 1
        idx = engine.index(source)
        n = idx.rows
        if n == 0:
            raise InputError("The input table is empty: there is nothing to release.")
        if pr.scheme == "additive":
            return _run_additive(engine, source, plan, n, progress)
        m = sketch_rows_for(pr.sketch_rule, n, p) if pr.sketch_rows is None else int(pr.sketch_rows)
        if m > n:
            raise ParameterError(
                f"The 'sketch_rows' parameter of {progress.caller} must be at most the number of rows n = {n} "
                f"(S is m x n; m = n is the 'full' sketch). Got {m} instead: lower it, or use "
                "sketch_rule='full'."
            )
        sketch_seed, noise_seed = plan.secrets
        rplan = RegressionPlan(pr, n, d, m, st.noise_multiplier, st.mu, plan.epsilon, plan.delta,
                               sketch_seed=sketch_seed, noise_seed=noise_seed)
        progress.log("regression: n=%d rows, sketch of m=%d rows, p=%d columns", n, m, p)
        counters = engine.counters(("rows", "rows_norm_clipped"))
        slots = sketch_slots(n, m)
        total = idx.aggregate(indexed_sketch_fn(sketch_seed, m, n, pr.row_bound, counters),
                              partial_size(m, p, slots))
        rel = finalize_sketch(total, rplan, slots=slots)
        names = list(pr.columns) + [pr.target]
        table = engine.table([tuple(float(v) for v in row) for row in rel.R],
                             [(c, "double", False) for c in names])
        model = rel.fit.to_public_dict(pr.columns)
        model.update({"features": list(pr.columns), "target": pr.target, "sketch_rows": m, "n": n,
                      "noise_variance_per_entry": rel.noise_variance})
        public = {"n": n, "sketch_rows": m,
                  "sketch_rule": pr.sketch_rule if pr.sketch_rows is None else "given",
                  "sensitivity_value": rel.sensitivity, "noise": rel.noise.to_public_dict(),
                  "noise_variance_per_entry": rel.noise_variance, "model": model,
                  "uncertainty": {"coefficient_stderr": model["stderr"],
                                  "confidence_intervals": model["confidence_intervals"],
                                  "confidence": model["confidence"],
                                  "sketch_entry_std": rel.noise.std}}
        diagnostics = {}
        if counters is not None:
            diagnostics = {"rows": counters[0].value, "rows_norm_clipped": counters[1].value}
        return _p.Outcome(table=table, model=rel.fit, public=public,
                          files={MODEL_FILE: json.dumps(model, indent=2, sort_keys=True).encode()},
                          extras={"sketch": rel.R, "diagnostics": diagnostics})


def _additive_row_map(noise_seed: int, nz: _noise.GaussianNoise, row_bound: float, counters=None):
    """``row_map(pid, blocks)`` of the additive baseline: clip each row to ``row_bound``, add the
    per-entry Gaussian noise from the partition's keyed stream ``(noise_seed, ADDITIVE_STAGE, pid)``."""

    def additive_rows(pid, blocks):
        rng = stream(noise_seed, ADDITIVE_STAGE, pid)
        for X in blocks:
            Mc, counts = clip_rows(np.asarray(X, np.float64),
                                   Bounds(X.shape[1], row_bound=float(row_bound), _caller="release_regression"))
            if counters is not None:
                counters[0].add(counts.rows)
                counters[1].add(counts.norm_clipped)
            R = _noise.add_noise(Mc, nz, rng)
            yield [R[:, j] for j in range(R.shape[1])]

    return additive_rows


def _gram_fn():
    def gram(X):
        X = np.asarray(X, np.float64)
        return (X.T @ X).reshape(-1)

    return gram


def _meat_fn(x: np.ndarray, s2: float, ridge: float, debias: bool, rows: int):
    def meat(X):
        return sandwich_moments(np.asarray(X, np.float64), x, s2, ridge=ridge, debias=debias, rows=rows).reshape(-1)

    return meat


def _run_additive(engine, source, plan: _p.Plan, n: int, progress) -> _p.Outcome:
    """The additive baseline ``M + W`` as a release: one noisy row per input row (a row-level output,
    keyed per-partition streams), and the model fitted on exactly those released rows (two more
    passes that regenerate them: post-processing)."""
    st: _RegressionState = plan.state
    pr = st.params
    d = len(pr.columns)
    p = d + 1
    _, noise_seed = plan.secrets
    rplan = RegressionPlan(pr, n, d, n, st.noise_multiplier, st.mu, plan.epsilon, plan.delta,
                           noise_seed=noise_seed)
    nz = rplan.additive_noise()
    names = list(pr.columns) + [pr.target]
    cols = [(c, "double", False) for c in names]
    progress.log("regression (additive baseline): n=%d noisy rows of p=%d columns", n, p)
    counters = engine.counters(("rows", "rows_norm_clipped"))
    counted, _ = engine.map_rows(source, _additive_row_map(noise_seed, nz, pr.row_bound, counters), cols)
    table, rows = engine.map_rows(source, _additive_row_map(noise_seed, nz, pr.row_bound), cols)
    caller = progress.caller
    s2 = float(nz.variance)
    G = engine.aggregate(engine.open(counted, columns=names, fill=None, caller=caller), _gram_fn(), p * p)
    G = G.reshape(p, p)
    x, floored = fit_from_moments(G, n, s2, ridge=pr.ridge, debias=pr.debias)
    meat = engine.aggregate(engine.open(table, columns=names, fill=None, caller=caller),
                            _meat_fn(x, s2, pr.ridge, pr.debias, n), d * d).reshape(d, d)
    fit = fit_from_gram_and_meat(G, meat, x, n, s2, ridge=pr.ridge, debias=pr.debias, confidence=pr.confidence)
    model = fit.to_public_dict(pr.columns)
    model.update({"features": list(pr.columns), "target": pr.target, "scheme": "additive", "n": n,
                  "noise_variance_per_entry": s2})
    public = {"n": n, "sketch_rows": None, "sensitivity_value": 2.0 * float(pr.row_bound),
              "noise": nz.to_public_dict(), "noise_variance_per_entry": s2, "model": model,
              "uncertainty": {"coefficient_stderr": model["stderr"],
                              "confidence_intervals": model["confidence_intervals"],
                              "confidence": model["confidence"], "entry_std": nz.std}}
    diagnostics = (lambda: {"rows": counters[0].value, "rows_norm_clipped": counters[1].value}) \
        if counters is not None else {}
    return _p.Outcome(table=table, rows=rows, model=fit, public=public,
                      files={MODEL_FILE: json.dumps(model, indent=2, sort_keys=True).encode()},
                      extras={"diagnostics": diagnostics})


MODEL_FILE = "_regression_model.json"
REGRESSION = _p.register(Regression())
