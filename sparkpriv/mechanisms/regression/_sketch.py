"""Private regression's parameters, neighbour relations and the sketch's layout, per-batch
partials and sensitivity (docs/math.md section 6)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.errors import ParameterError
from sparkpriv.privacy.random import stream


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
