"""Declared public bounds and clipping (docs/math.md section 0).

Sensitivity only exists on a bounded domain. A release takes declared, public
bounds: a per-column box ``[lower_j, upper_j]`` (values outside are clipped to
the box) and/or a row norm bound ``R`` (rows whose L2 or L1 norm exceeds ``R``
are scaled down onto the ball). Clipping is an explicit step whose counts are
reported to the data owner (never in the release). Bounds are never estimated
from the data here.

Order: box clip first, then norm clip. Scaling a row towards the origin can
leave the box only if the box does not contain the origin; in that case the
norm bound is checked against the box and both constraints are still enforced
because the norm clip is applied last and the box widths used for the
sensitivity bound the *change* of a record, which the norm clip can only
shrink when 0 is in the box. When 0 is not in the box, only the norm bound is
used for the sensitivity (see :meth:`Bounds.change_constraints`).

The element-wise relation (one attribute changes by at most its bound) admits
only clipping that acts on each coordinate separately (the box): clipping a
row onto a norm ball rescales the whole row, so a change of one attribute
becomes a change of every coordinate and the element-wise sensitivity no
longer bounds it. :meth:`Bounds.change_constraints` refuses that combination.

Norms are computed without overflow: a row with an entry above about
``1.3e154`` (whose squared norm overflows) is scaled by its largest entry
first, so it is clipped onto the ball in its own direction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import ParameterError

__all__ = ["Bounds", "ClipCounts", "broadcast_box", "clip_rows", "row_norms"]

NEIGHBORS = ("replace-one", "add-remove", "element")
NEIGHBOR_MEANING = {
    "replace-one": "one record (person) replaced by another; n is public",
    "add-remove": "one record (person) added or removed",
    "element": "ONE ATTRIBUTE of one record changed by at most its bound: protects one attribute, NOT a person",
}


@dataclass(frozen=True)
class ClipCounts:
    """How many rows each clipping step changed (owner diagnostics, never released)."""

    rows: int = 0
    box_clipped: int = 0
    norm_clipped: int = 0

    def __add__(self, other: "ClipCounts") -> "ClipCounts":
        return ClipCounts(
            self.rows + other.rows,
            self.box_clipped + other.box_clipped,
            self.norm_clipped + other.norm_clipped,
        )


@dataclass(frozen=True)
class Bounds:
    """Public bounds on the records of a table.

    Parameters
    ----------
    dim : int
        Number of features ``d``.
    lower, upper : tuple of float, optional
        Per-column box. Both or neither.
    row_bound : float, optional
        Bound ``R`` on each row's norm after the box clip.
    norm : {"l2", "l1"}
        Which norm ``row_bound`` refers to.
    element_bound : float, optional
        For the element-wise neighbour relation only: the largest change of one
        attribute (defaults to the box widths).
    """

    dim: int
    lower: tuple[float, ...] | None = None
    upper: tuple[float, ...] | None = None
    row_bound: float | None = None
    norm: str = "l2"
    element_bound: float | None = None
    _caller: str = field(default="Bounds", repr=False, compare=False)

    def __post_init__(self):
        c = self._caller
        check_param("norm", self.norm, [Options(("l2", "l1"))], c)
        check_param("row_bound", self.row_bound, [None, Interval("real", 0, None, "neither")], c)
        check_param("element_bound", self.element_bound, [None, Interval("real", 0, None, "neither")], c)
        if (self.lower is None) != (self.upper is None):
            raise ParameterError(
                f"The 'lower' and 'upper' parameters of {c} go together: give both per-column "
                "bounds or neither."
            )
        if self.lower is not None:
            lo = np.asarray(self.lower, dtype=float)
            hi = np.asarray(self.upper, dtype=float)
            for name, arr in (("lower", lo), ("upper", hi)):
                if arr.shape != (self.dim,):
                    raise ParameterError(
                        f"The {name!r} parameter of {c} must have one value per column "
                        f"({self.dim}). Got {arr.size} values instead."
                    )
                if not np.all(np.isfinite(arr)):
                    raise ParameterError(f"The {name!r} bounds of {c} must be finite numbers.")
            bad = np.flatnonzero(hi <= lo)
            if bad.size:
                raise ParameterError(
                    f"Each upper bound of {c} must exceed its lower bound; column index "
                    f"{int(bad[0])} has lower={lo[bad[0]]!r}, upper={hi[bad[0]]!r}."
                )

    @property
    def has_box(self) -> bool:
        return self.lower is not None

    def widths(self) -> np.ndarray:
        return np.asarray(self.upper, float) - np.asarray(self.lower, float)

    def require_any(self, caller: str) -> None:
        if not self.has_box and self.row_bound is None and self.element_bound is None:
            raise ParameterError(
                f"{caller} needs declared public bounds: give a row norm bound (row_bound / "
                "--row-bound), per-column bounds (lower and upper / --lower --upper or a "
                "bounds file), or both. Bounds must not be computed from the data itself; "
                "they are what the noise is calibrated to."
            )

    def check_element_wise(self, caller: str) -> None:
        """Refuse bounds that the element-wise relation cannot use (a whole-row clip)."""
        if self.row_bound is not None:
            raise ParameterError(
                f"The 'row_bound' parameter of {caller} cannot be combined with "
                "neighbors='element': clipping a row onto the norm ball rescales the whole row, so "
                "a change of one attribute becomes a change of every coordinate and the "
                "element-wise sensitivity no longer bounds it. Drop row_bound (and "
                "row_bound_quantile) and declare a per-column box (lower/upper) and/or "
                "element_bound, or keep row_bound with neighbors='replace-one' to protect a whole "
                "person."
            )
        if self.element_bound is None and not self.has_box:
            raise ParameterError(
                f"{caller}: the element-wise neighbour relation needs element_bound (the largest "
                "change of one attribute) or per-column lower/upper bounds."
            )

    def change_constraints(self, neighbors: str, caller: str | None = None) -> dict:
        """Constraints on the change ``v`` of one record, for the sensitivity functions.

        Under ``"element"`` one attribute changes by at most ``element_bound``;
        after the box clip (which acts on that coordinate alone) by at most
        ``min(element_bound, upper_i - lower_i)``. A row norm bound is refused
        (:meth:`check_element_wise`).
        """
        if neighbors == "element":
            self.check_element_wise(caller or self._caller)
            if self.element_bound is not None:
                w = np.full(self.dim, float(self.element_bound))
                return {"element_widths": np.minimum(w, self.widths()) if self.has_box else w}
            return {"element_widths": self.widths()}
        out: dict = {}
        factor = 2.0 if neighbors == "replace-one" else 1.0
        if self.row_bound is not None:
            key = "l2_radius" if self.norm == "l2" else "l1_radius"
            out[key] = factor * float(self.row_bound)
        if self.has_box:
            lo = np.asarray(self.lower, float)
            hi = np.asarray(self.upper, float)
            origin_inside = bool(np.all(lo <= 0) and np.all(hi >= 0))
            if self.row_bound is None or origin_inside:
                if neighbors == "replace-one":
                    out["box_widths"] = hi - lo
                else:  # add-remove: v = x itself
                    out["box_widths"] = np.maximum(np.abs(lo), np.abs(hi))
        return out

    def to_public_dict(self) -> dict:
        return {
            "lower": None if self.lower is None else [float(x) for x in self.lower],
            "upper": None if self.upper is None else [float(x) for x in self.upper],
            "row_bound": self.row_bound,
            "norm": self.norm,
            "element_bound": self.element_bound,
        }


def broadcast_box(values, dim: int, name: str, caller: str) -> tuple[float, ...] | None:
    """``lower`` or ``upper`` as one float per column: a single value is used for every column.

    None stays None; a sequence must have ``dim`` values (checked by :class:`Bounds`).
    """
    if values is None:
        return None
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise ParameterError(
            f"The {name!r} parameter of {caller} must be a number or one number per column. "
            f"Got {values!r} instead."
        ) from None
    if arr.ndim == 0 or arr.size == 1:
        arr = np.full(dim, float(arr.reshape(-1)[0]))
    return tuple(float(v) for v in arr.reshape(-1))


def _scaled_norms(X: np.ndarray, norm: str) -> tuple[np.ndarray, np.ndarray]:
    """``(m, ||X_r / m_r||)`` per row with ``m_r = max_j |X_rj|`` (no overflow; m = 0 -> 1)."""
    m = np.abs(X).max(axis=1)
    m[m == 0] = 1.0
    Y = X / m[:, None]
    return m, (np.sqrt(np.einsum("ij,ij->i", Y, Y)) if norm == "l2" else np.abs(Y).sum(axis=1))


def row_norms(X: np.ndarray, norm: str = "l2") -> np.ndarray:
    """The L2 or L1 norm of each row of ``X`` (n_samples, n_features).

    Rows whose norm overflows in the direct sum are recomputed scaled by
    their largest entry; a norm above the float64 range is ``inf``.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        n = np.sqrt(np.einsum("ij,ij->i", X, X)) if norm == "l2" else np.abs(X).sum(axis=1)
        big = np.isinf(n)
        if big.any():
            m, s = _scaled_norms(X[big], norm)
            n[big] = m * s
    return n


def clip_rows(X: np.ndarray, bounds: Bounds, *, out: np.ndarray | None = None) -> tuple[np.ndarray, ClipCounts]:
    """Clip each row of ``X`` (n_samples, n_features) to the declared bounds.

    Returns the clipped array (``X`` itself is modified when ``out is X``) and
    the counts of rows each step changed.
    """
    X = np.asarray(X, dtype=np.float64)
    if out is None:
        out = np.array(X, dtype=np.float64, copy=True)
    elif out is not X:
        np.copyto(out, X)
    n = out.shape[0]
    box = 0
    if bounds.has_box:
        lo = np.asarray(bounds.lower, float)
        hi = np.asarray(bounds.upper, float)
        outside = (out < lo) | (out > hi)
        box = int(np.count_nonzero(outside.any(axis=1)))
        if box:
            np.clip(out, lo, hi, out=out)
    normc = 0
    if bounds.row_bound is not None:
        R = float(bounds.row_bound)
        with np.errstate(over="ignore", invalid="ignore"):
            norms = np.sqrt(np.einsum("ij,ij->i", out, out)) if bounds.norm == "l2" \
                else np.abs(out).sum(axis=1)
            big = np.isinf(norms)
            if big.any():  # the squared (or summed) norm overflowed: scale by the largest entry
                idx = np.flatnonzero(big)
                m, s = _scaled_norms(out[idx], bounds.norm)
                norms[idx] = m * s  # the true norm (inf only above the float64 range)
                sel = norms[idx] > R
                out[idx[sel]] = out[idx[sel]] / m[sel, None] * (R / s[sel])[:, None]
        over = norms > R
        normc = int(np.count_nonzero(over))
        direct = over & ~big
        if direct.any():
            out[direct] *= (R / norms[direct])[:, None]
    return out, ClipCounts(n, box, normc)
