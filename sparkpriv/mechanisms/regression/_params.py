"""Private regression's public parameters, the methods and models offered, and the limits every
parameter is checked against before anything is reserved (docs/regression.md, docs/math.md section 6).

Two methods share one parameters class (one command line, one receipt format):

* ``ssp`` (the default): sufficient statistics perturbation with AdaSSP's adaptive ridge (Wang 2018;
  :mod:`sparkpriv.mechanisms.regression._ssp`), for a ``linear`` or a ``logistic`` model;
* ``sketch``: the sample-mixing sketch ``S M + W`` of Showkatbakhsh et al. (and its ``additive``
  baseline ``M + W``; :mod:`sparkpriv.mechanisms.regression._sketch`), linear only.

A parameter of one method given to the other is refused by name (:meth:`RegressionParams.check`),
as is every public value whose arithmetic would overflow or underflow (a bound of ``1e300``, a
``delta`` of ``1e-300``): those refusals come from the parameters alone, before the input is
opened, so no record decides whether a release runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.errors import ParameterError
from sparkpriv.privacy.quantile import DEFAULT_EXPONENTS

METHODS = ("ssp", "sketch")
MODELS = ("linear", "logistic")
SCHEMES = ("sketch", "additive")
SKETCH_RULES = ("log", "linear", "full")
SSP_NEIGHBORS = ("replace-one", "add-remove")
SKETCH_NEIGHBORS = ("replace-one",)
NEIGHBORS_OK = SKETCH_NEIGHBORS  # the sketch's (kept for the sketch's own entry points)
DEFAULT_SPLIT = (1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0)  # AdaSSP: eigenvalue, Gram matrix, moments
# the logistic model refined by noisy gradient passes: eigenvalue, Gram matrix, moments, the gradients
# (all passes together), the Hessian of the last pass (docs/math.md section 6.2)
DEFAULT_LOGISTIC_SPLIT = (0.1, 0.3, 0.1, 0.3, 0.2)
DEFAULT_LOGISTIC_STEPS = 5
MAX_LOGISTIC_STEPS = 50

# Limits of the public values (docs/regression.md, "Limits"): those every mechanism is held to
# (protocol.Params._check_magnitudes, checked first), plus the box widths and the target range, which
# are differences of two bounds, and delta at most 0.5. Inside them every quantity the plan and the
# driver compute (B^4 for the Gram sensitivity, B^2 n for n <= 2^63, the noise grids, the accountant's
# PLD) is a finite float; outside them a release is refused by name before anything is reserved.
EPSILON_RANGE = _p.EPSILON_RANGE
DELTA_RANGE = (_p.MIN_DELTA, 0.5)
BOUND_MAX = _p.MAX_PUBLIC_MAGNITUDE  # |bound| (row_bound, lower, upper, target bounds, fill)
BOUND_MIN = _p.MIN_PUBLIC_SCALE  # smallest row_bound, box width and target range
_POS = Interval("real", 0, None, "neither")
_REAL = Interval("real", None, None, "neither")

# Parameters of one method only, with the value that means "not given".
_SKETCH_ONLY = {"scheme": "sketch", "sketch_rows": None, "sketch_rule": "log", "ridge": 0.0, "debias": True}
_SSP_ONLY = {"model": "linear", "lower": None, "upper": None, "target_lower": None, "target_upper": None,
             "target_quantile": None, "target_epsilon_share": 0.1, "target_search": DEFAULT_EXPONENTS,
             "positive": None, "fit_intercept": True, "budget_split": None, "bootstrap": 1000,
             "logistic_steps": DEFAULT_LOGISTIC_STEPS}


@dataclass(frozen=True, kw_only=True)
class RegressionParams(_p.Params):
    """Public parameters of a private regression release (docs/regression.md)."""

    columns: tuple | None = _p.option(None, help="numeric feature columns, in order", kind="strs")
    target: str | None = _p.option(None, help="numeric (or boolean) target column, not one of the features",
                                   kind="str")
    epsilon: float = _p.option(help="the epsilon of the release", constraints=[_POS])
    delta: float = _p.option(help="the delta of the release (Gaussian noise), in [1e-12, 0.5]",
                             constraints=[Interval("real", 0, 1, "neither")])
    method: str = _p.option("ssp", help="ssp: noisy sufficient statistics X^T X, X^T y with AdaSSP's "
                            "adaptive ridge (one pass; the useful method); sketch: the sample-mixing sketch "
                            "S M + W of Showkatbakhsh et al. (releases a sketch; not useful under "
                            "(epsilon, delta)-DP, docs/regression.md)", constraints=[Options(METHODS)])
    model: str = _p.option("linear", help="ssp: linear (least squares) or logistic (binary target; the "
                           "logistic loss's quadratic approximation on the same statistics)",
                           constraints=[Options(MODELS)])
    row_bound: float | None = _p.option(None, help="ssp: declared bound on the L2 norm of each row of "
                                        "FEATURES (rows are clipped to it); sketch: bound on the L2 norm of "
                                        "[features..., target]", constraints=[None, _POS],
                                        doc_default="none (ssp: row_bound or lower/upper is required)")
    lower: tuple | None = _p.option(None, help="ssp: declared per-feature lower bounds (one value for all, "
                                    "or one per feature; values are clipped)", kind="floats")
    upper: tuple | None = _p.option(None, help="ssp: declared per-feature upper bounds (one value for all, "
                                    "or one per feature)", kind="floats")
    target_lower: float | None = _p.option(None, help="ssp, linear: declared lower bound of the target "
                                           "(values are clipped to [target_lower, target_upper])",
                                           constraints=[None, _REAL])
    target_upper: float | None = _p.option(None, help="ssp, linear: declared upper bound of the target",
                                           constraints=[None, _REAL])
    target_quantile: float | None = _p.option(None, help="ssp, linear: instead of target_lower/upper, "
                                              "choose the target range as the central DP quantile range "
                                              "of this coverage (e.g. 0.98; spends target_epsilon_share of "
                                              "epsilon, one more pass)",
                                              constraints=[None, Interval("real", 0, 1, "neither")])
    target_epsilon_share: float = _p.option(0.1, help="ssp: share of epsilon spent on target_quantile",
                                            constraints=[Interval("real", 0, 1, "neither")])
    target_search: tuple = _p.option(DEFAULT_EXPONENTS, help="ssp, target_quantile: the public candidate "
                                     "bounds are +-2^j for j in this (lo, hi) range of integers",
                                     kind="object")
    positive: float | None = _p.option(None, help="ssp, logistic: the target value of the positive class "
                                       "(every other value is the negative class)", constraints=[None, _REAL],
                                       doc_default="1")
    fit_intercept: bool = _p.option(True, help="ssp: fit an intercept (a constant feature; the declared "
                                    "boxes are centred first when that shrinks the bound)",
                                    constraints=[bool], kind="bool")
    logistic_steps: int = _p.option(DEFAULT_LOGISTIC_STEPS, help="ssp, logistic: passes over the data that "
                                    "refine the one-pass quadratic approximation with noisy gradients (Bohning "
                                    "steps; the last also releases the Hessian for a Newton step and the "
                                    "intervals); 0: the one-pass approximation alone",
                                    constraints=[Interval("integer", 0, MAX_LOGISTIC_STEPS, "both")])
    budget_split: tuple | None = _p.option(None, help="ssp: shares of the Gaussian budget (mu^2) for the "
                                           "smallest eigenvalue, the Gram matrix X^T X and the moments "
                                           "(X^T y, y^T y, n); logistic with logistic_steps > 0: five shares, "
                                           "then the gradients (all passes) and the Hessian", kind="floats",
                                           doc_default="1/3, 1/3, 1/3; logistic: 0.1, 0.3, 0.1, 0.3, 0.2")
    bootstrap: int = _p.option(1000, help="ssp: parametric bootstrap samples of the confidence intervals "
                               "(post-processing of the released statistics)",
                               constraints=[Interval("integer", 100, 100_000, "both")])
    scheme: str = _p.option("sketch", help="sketch: release S M + W (m rows); additive: the baseline "
                            "M + W (one noisy row per input row, for comparisons)", constraints=[Options(SCHEMES)])
    sketch_rows: int | None = _p.option(None, help="sketch: m, rows of the sketch (1 <= m <= n)",
                                        constraints=[None, Interval("integer", 1, None, "left")],
                                        doc_default="the sketch_rule")
    sketch_rule: str = _p.option("log", help="sketch: m when sketch_rows is not given: log max(p + 10, "
                                 "ceil(10 ln n)), linear max(log, ceil(n / 10)), full n; at most n",
                                 constraints=[Options(SKETCH_RULES)])
    ridge: float = _p.option(0.0, help="sketch: ridge penalty lambda >= 0 of the fitted model "
                             "(post-processing; ssp chooses its ridge itself)",
                             constraints=[Interval("real", 0, None, "left")])
    debias: bool = _p.option(True, help="sketch: subtract the noise's expected r s^2 I from the Gram matrix "
                             "before solving", constraints=[bool], kind="bool")
    confidence: float = _p.option(0.95, help="level of the coefficient confidence intervals",
                                  constraints=[Interval("real", 0, 1, "neither")])
    fill: float | None = _p.option(None, help="public value that replaces nulls (ssp: also NaN and "
                                   "infinities) in the columns; ssp without it: the centre of the declared "
                                   "domain", constraints=[None, _REAL])
    neighbors: str = _p.option("replace-one", help="neighbour relation: replace-one (n is public) or, for "
                               "ssp, add-remove", kind="neighbors")

    def input_columns(self) -> tuple:
        """The columns the engine opens: the features, then the target."""
        return tuple(self.columns or ()) + ((self.target,) if self.target else ())

    @property
    def features(self) -> tuple:
        return tuple(self.columns or ())

    @property
    def positive_value(self) -> float:
        return 1.0 if self.positive is None else float(self.positive)

    @property
    def steps(self) -> int:
        """Noisy gradient passes after the statistics (logistic only)."""
        return int(self.logistic_steps) if self.model == "logistic" else 0

    @property
    def split(self) -> tuple:
        """The shares of the Gaussian budget: ``budget_split``, or the default for the model."""
        if self.budget_split is not None:
            return tuple(float(w) for w in self.budget_split)
        return DEFAULT_LOGISTIC_SPLIT if self.steps else DEFAULT_SPLIT

    def validate(self, caller: str = "release_regression") -> None:
        """Refuse bad parameters (they alone decide: no data is read)."""
        check_param("method", self.method, [Options(METHODS)], caller)
        check_neighbors(self.neighbors, self.method, caller, scheme=self.scheme)
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
        _check_budget(self.epsilon, self.delta, caller)
        for name in ("row_bound", "target_lower", "target_upper", "fill", "positive"):
            _check_magnitude(name, getattr(self, name), caller)
        if self.row_bound is not None and not float(self.row_bound) >= BOUND_MIN:
            raise ParameterError(f"The 'row_bound' parameter of {caller} must be at least {BOUND_MIN:g} (a "
                                 f"smaller bound underflows when squared). Got {self.row_bound!r}; rescale the "
                                 "features.")
        if self.method == "sketch":
            self._check_sketch(caller)
        else:
            self._check_ssp(caller)

    def _check_sketch(self, caller: str) -> None:
        for name, unset in _SSP_ONLY.items():
            if getattr(self, name) != unset:
                raise ParameterError(
                    f"The {name!r} parameter of {caller} applies to method='ssp' only; the sketch "
                    "(method='sketch') takes row_bound, a bound on [features..., target]. Drop it, or use "
                    "method='ssp'."
                )
        if self.row_bound is None:
            raise ParameterError(
                f"{caller} (method='sketch') needs a declared public bound on the rows: give row_bound "
                "(--row-bound), a bound B on the L2 norm of [features..., target] for every row. Bounds "
                "computed from the data are not private."
            )

    def _check_ssp(self, caller: str) -> None:
        for name, unset in _SKETCH_ONLY.items():
            if getattr(self, name) != unset:
                raise ParameterError(
                    f"The {name!r} parameter of {caller} applies to method='sketch' only (the default "
                    "method 'ssp' chooses its ridge with AdaSSP and releases noisy sufficient statistics). "
                    "Drop it, or give method='sketch'."
                )
        if self.row_bound is None and self.lower is None and self.upper is None:
            raise ParameterError(
                f"{caller} needs declared public bounds on the features: give row_bound (--row-bound, a "
                "bound on the L2 norm of each row of features), per-feature lower and upper (--lower "
                "--upper), or both. Bounds must not be computed from the data: they are what the noise "
                "is calibrated to."
            )
        if (self.lower is None) != (self.upper is None):
            raise ParameterError(f"The 'lower' and 'upper' parameters of {caller} go together: give both "
                                 "per-feature bounds or neither.")
        for name in ("lower", "upper"):
            for v in _values(getattr(self, name)):
                _check_magnitude(name, v, caller)
        if self.lower is not None:
            lo, hi = _values(self.lower), _values(self.upper)
            if len(lo) == len(hi) or len(lo) == 1 or len(hi) == 1:
                pairs = zip(lo * (len(hi) if len(lo) == 1 else 1), hi * (len(lo) if len(hi) == 1 else 1))
                for j, (a, b) in enumerate(pairs):
                    if not float(b) - float(a) >= BOUND_MIN:
                        raise ParameterError(
                            f"Each upper bound of {caller} must exceed its lower bound by at least "
                            f"{BOUND_MIN:g}; feature index {j} has lower={a!r}, upper={b!r}.")
        self._check_target(caller)
        split = tuple(self.budget_split) if self.budget_split is not None else self.split
        want, what = ((5, "five positive shares (smallest eigenvalue, Gram matrix, moments, gradients, "
                          "Hessian; model='logistic' with logistic_steps > 0)") if self.steps else
                      (3, "three positive shares (smallest eigenvalue, Gram matrix, moments)"))
        if len(split) != want or not all(isinstance(w, (int, float)) and math.isfinite(w) and w > 0 for w in split) \
                or sum(split) > 1.0 + 1e-12:
            raise ParameterError(
                f"The 'budget_split' parameter of {caller} must be {what} summing to at most 1. Got "
                f"{self.budget_split!r} instead.")
        if min(split) < 1e-3 or (self.steps and split[3] / self.steps < 1e-3):
            raise ParameterError(f"The 'budget_split' parameter of {caller} gives a step less than 1e-3 of "
                                 f"the budget. Got {self.budget_split!r}; raise the smallest share.")

    def _check_target(self, caller: str) -> None:
        declared = self.target_lower is not None or self.target_upper is not None
        if self.model == "logistic":
            for name in ("target_lower", "target_upper", "target_quantile"):
                if getattr(self, name) is not None:
                    raise ParameterError(
                        f"The {name!r} parameter of {caller} does not apply to model='logistic': the target is "
                        "a class (the 'positive' value against every other value), bounded by construction.")
            return
        if self.positive is not None:
            raise ParameterError(f"The 'positive' parameter of {caller} applies to model='logistic' only.")
        if self.logistic_steps != DEFAULT_LOGISTIC_STEPS:
            raise ParameterError(f"The 'logistic_steps' parameter of {caller} applies to model='logistic' only.")
        if self.target_quantile is not None:
            if declared:
                raise ParameterError(
                    f"{caller}: target_quantile chooses the target range privately; it cannot be combined "
                    "with a declared target_lower/target_upper. Give one or the other.")
            lo, hi = _search_range(self.target_search, caller)
            del lo, hi
            return
        if self.target_lower is None or self.target_upper is None:
            raise ParameterError(
                f"{caller} needs a declared range of the target: give target_lower and target_upper "
                "(--target-lower --target-upper; values are clipped to it), or target_quantile (a DP "
                "quantile range that spends target_epsilon_share of epsilon). A range computed from the "
                "data is not private.")
        if not float(self.target_upper) - float(self.target_lower) >= BOUND_MIN:
            raise ParameterError(
                f"The 'target_upper' parameter of {caller} must exceed target_lower by at least {BOUND_MIN:g}. "
                f"Got target_lower={self.target_lower!r}, target_upper={self.target_upper!r}.")


def _values(v: Any) -> tuple:
    """A box parameter as a tuple of its values (a single number is one value)."""
    if v is None:
        return ()
    if isinstance(v, (tuple, list)):
        return tuple(v)
    try:
        return tuple(float(x) for x in v)  # a numpy array
    except TypeError:
        return (v,)


def _search_range(search: Any, caller: str) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in search)
        ok = all(float(v).is_integer() for v in search) and lo < hi and hi - lo <= 200
    except (TypeError, ValueError):
        ok = False
    if not ok or not (-300 <= lo and hi <= 300):
        raise ParameterError(
            f"The 'target_search' parameter of {caller} must be two integers lo < hi, at most 200 apart, "
            f"in [-300, 300] (the candidates are +-2^j). Got {search!r} instead.")
    if 2.0 ** hi > BOUND_MAX or 2.0 ** lo < BOUND_MIN:
        raise ParameterError(f"The 'target_search' parameter of {caller} reaches beyond [{BOUND_MIN:g}, "
                             f"{BOUND_MAX:g}]. Got {search!r} instead.")
    return lo, hi


def _check_budget(epsilon: Any, delta: Any, caller: str) -> None:
    """epsilon and delta inside the range where calibration and accounting are finite."""
    if epsilon is not None:
        check_param("epsilon", epsilon, [Interval("real", *EPSILON_RANGE, "both")], caller)
    if delta is not None:
        check_param("delta", delta, [Interval("real", *DELTA_RANGE, "both")], caller)


def _check_magnitude(name: str, value: Any, caller: str) -> None:
    if value is None:
        return
    check_param(name, value, [Interval("real", -BOUND_MAX, BOUND_MAX, "both")], caller)


def check_neighbors(neighbors: Any, method: str, caller: str, *, scheme: str = "sketch") -> None:
    """Refuse a relation the method does not offer, with the reason (docs/math.md section 6)."""
    if neighbors == "element":
        raise ParameterError(
            f"The 'neighbors' parameter of {caller} cannot be 'element' for a regression release: "
            "rows are clipped to an L2 ball, and a norm clip rescales the whole row, so one changed "
            "attribute changes every coordinate (docs/math.md section 2); a regression protects a "
            "person (a row). Use neighbors='replace-one' or, for method='ssp', 'add-remove'."
        )
    if neighbors == "add-remove" and method == "sketch":
        raise ParameterError(
            f"The 'neighbors' parameter of {caller} cannot be 'add-remove' for the sketch (method='sketch'): "
            "the noise is calibrated from the realized columns of the secret sketch S, one per record "
            "of the public row count n, and an added record would bring a column that is not among "
            "them; the additive scheme has one output row per record, which no noise hides. Use "
            "neighbors='replace-one' (one person replaced; n is public), or method='ssp', which "
            "offers add-remove."
        )
    check_param("neighbors", neighbors, [Options(SSP_NEIGHBORS if method == "ssp" else SKETCH_NEIGHBORS)],
                caller)
