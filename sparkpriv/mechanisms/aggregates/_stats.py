"""Per-block statistics of an aggregates release: the person-level bounding and the per-key totals, in
numpy (docs/math.md section 11; the engines call these on each block of people's events).

For each person of an :class:`~sparkpriv.mechanisms.protocol.EventRows` block:

1. the person's events are grouped by key (``n`` events at each key);
2. at most ``L`` keys are kept, by the keyed uniform choice of
   :func:`~sparkpriv.mechanisms.sparse.kept_entries` (the choice of the counts release: the same
   key index gets the same score);
3. at a kept key the person's events are weighted ``min(n, c) / n``; each value is clamped to its
   column's ``[lo, hi]`` (a null, NaN or infinity takes the public fill ``(lo + hi) / 2``, then the
   clamp: docs/privacy.md, "Failures");
4. the person's statistics at the key (people 1, events ``min(n, c)``, the weighted sums of ``x -
   mid`` and ``(x - mid)^2``, the weighted events per bucket of ``B`` equal buckets of ``[lo, hi]``)
   are added to the key's totals.

The totals of a block are the sum over its people: they add up over blocks and partitions, so any
partitioning gives the same totals (up to float rounding of the sums). A person is always whole in
one block (the engines group by person first).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkpriv.mechanisms.sparse import kept_entries

__all__ = ["Bounding", "DIAGNOSTICS", "key_totals", "auto_histograms", "clamp_candidates", "bucket_of"]

# owner diagnostics (never released): counted in the data pass
DIAGNOSTICS = ("people", "people_truncated", "keys_dropped", "events", "events_beyond_cap", "values_clamped",
               "values_filled", "events_outside_domain")


@dataclass(frozen=True)
class Bounding:
    """The public parameters of the per-person bounding of one pass (plain values: pickled into tasks).

    ``columns``: the value columns in block order; ``lo``, ``hi``: their clamps (float64 arrays,
    NaN for a column whose clamp is still to be chosen); ``groups``: the measured groups, in the
    plan's order.
    """

    max_keys: int
    max_events_per_key: int
    columns: tuple
    lo: tuple
    hi: tuple
    buckets: int
    groups: tuple

    @property
    def width(self) -> int:
        return sum(g.width for g in self.groups)


@dataclass
class _Pairs:
    order: np.ndarray  # events sorted by (person, key)
    pair_of_event: np.ndarray
    pair_row: np.ndarray
    pair_code: np.ndarray
    pair_key: np.ndarray
    pair_off: np.ndarray  # per person, into the pairs
    n_pk: np.ndarray
    span: int
    uniq: np.ndarray | None


def _pairs(offsets, keys, span: int | None) -> _Pairs:
    """Distinct (person, key) pairs of a block. ``span``: the domain size (public keys), or None for
    64-bit key ids (coded within the block)."""
    offsets = np.asarray(offsets, np.int64)
    keys = np.asarray(keys, np.int64)
    n = offsets.size - 1
    E = keys.size
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
    if span is None:
        uniq, code = np.unique(keys, return_inverse=True)
        code = code.astype(np.int64).reshape(-1)
        span = max(int(uniq.size), 1)
    else:
        uniq, code = None, keys
    comb = rows * int(span) + code
    order = np.argsort(comb, kind="stable")
    sc = comb[order]
    new = np.ones(E, bool)
    if E:
        new[1:] = sc[1:] != sc[:-1]
    starts = np.flatnonzero(new)
    pair_of_event = np.empty(E, np.int64)
    pair_of_event[order] = np.cumsum(new) - 1
    n_pk = np.diff(np.append(starts, E)).astype(np.int64)
    first = order[starts]
    pair_row = rows[first]
    pair_off = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(pair_row, minlength=n), out=pair_off[1:])
    return _Pairs(order, pair_of_event, pair_row, code[first], keys[first], pair_off, n_pk, int(span), uniq)


def bucket_of(x: np.ndarray, lo: float, hi: float, buckets: int) -> np.ndarray:
    """Bucket ``0 .. B-1`` of clamped values ``x`` in ``B`` equal buckets of ``[lo, hi]`` (``hi`` in the last)."""
    w = (hi - lo) / buckets
    return np.clip(np.floor((x - lo) / w), 0, buckets - 1).astype(np.int64)


def _clamped(x: np.ndarray, lo: float, hi: float):
    """``(clamped values, clamped count, filled count)``: non-finite values take ``(lo + hi) / 2``."""
    finite = np.isfinite(x)
    filled = int(x.size - np.count_nonzero(finite))
    xf = np.where(finite, x, (lo + hi) / 2.0) if filled else x
    out = np.clip(xf, lo, hi)
    clamped = int(np.count_nonzero(finite & ((x < lo) | (x > hi))))
    return out, clamped, filled


def key_totals(block, bounding: Bounding, choice_key: int, domain_size: int | None):
    """The block's per-key totals of every group and its owner diagnostics.

    Public keys (``domain_size`` d): ``(totals (d, W), diag)``. Private keys (None): ``(key ids (u,),
    totals (u, W), diag)`` for the ``u`` keys some kept person holds. ``W = bounding.width``: the
    groups' columns side by side (a histogram takes ``B`` columns). ``diag``: :data:`DIAGNOSTICS`.
    """
    P = _pairs(block.offsets, block.keys, domain_size)
    L, c = int(bounding.max_keys), int(bounding.max_events_per_key)
    keep = kept_entries(P.pair_off, P.pair_key, block.person_hash, L, choice_key)
    m = np.minimum(P.n_pk, c)
    scale = m / np.maximum(P.n_pk, 1)
    span = P.span
    W = bounding.width
    kc = P.pair_code[keep]
    totals = np.zeros((span, W), np.float64)
    ev_keep = keep[P.pair_of_event]
    ev_code = P.pair_code[P.pair_of_event][ev_keep]
    ev_scale = scale[P.pair_of_event][ev_keep]
    clamped = filled = 0
    cache: dict = {}

    def column(col):
        nonlocal clamped, filled
        if col not in cache:
            j = bounding.columns.index(col)
            x, cl, fi = _clamped(np.asarray(block.values[:, j], np.float64), bounding.lo[j], bounding.hi[j])
            cache[col] = (x[ev_keep], bounding.lo[j], bounding.hi[j])
            clamped, filled = clamped + cl, filled + fi
        return cache[col]

    o = 0
    for g in bounding.groups:
        if g.kind == "people":
            totals[:, o] = np.bincount(kc, minlength=span)
        elif g.kind == "events":
            totals[:, o] = np.bincount(kc, weights=m[keep].astype(np.float64), minlength=span)
        elif g.kind in ("sum", "sumsq"):
            x, lo, hi = column(g.column)
            y = x - (lo + hi) / 2.0
            w = ev_scale * (y if g.kind == "sum" else y * y)
            totals[:, o] = np.bincount(ev_code, weights=w, minlength=span)
        else:  # histogram
            x, lo, hi = column(g.column)
            B = g.width
            b = bucket_of(x, lo, hi, B)
            totals[:, o:o + B] = np.bincount(ev_code * B + b, weights=ev_scale, minlength=span * B).reshape(span, B)
        o += g.width
    for col in bounding.columns:  # every value column's clamping is counted, measured or not
        column(col)
    sizes = np.diff(P.pair_off)
    diag = (block.n, int(np.count_nonzero(sizes > L)), int(np.sum(np.maximum(sizes - L, 0))), int(P.n_pk.sum()),
            int(np.sum(np.maximum(P.n_pk[keep] - c, 0))), clamped, filled, int(block.dropped))
    if domain_size is not None:
        return totals, diag
    present = np.unique(kc)
    return P.uniq[present] if P.uniq is not None else present, totals[present], diag


def clamp_candidates(exponents: tuple[int, int] = (-10, 30)) -> np.ndarray:
    """The public candidates of an automatic clamp: ``-2^hi .. -2^lo, 0, 2^lo .. 2^hi``."""
    from sparkpriv.privacy.quantile import candidate_bounds

    pos = candidate_bounds(exponents)
    return np.concatenate([-pos[::-1], [0.0], pos])


def auto_histograms(block, *, key_limit: int | None, event_limit: int | None, auto_columns: tuple,
                    candidates: np.ndarray, domain_size: int | None) -> np.ndarray:
    """The histograms of the automatic bounds, one vector (docs/math.md section 11, "Automatic bounds"):

    * ``key_limit``: people by their number of distinct keys ``0 .. key_limit`` (the last bucket:
      ``key_limit`` or more), weight 1 per person;
    * ``event_limit``: (person, key) pairs by their events ``0 .. event_limit``, each person's pairs
      weighted ``1 / (their number of keys)``;
    * each of ``auto_columns`` (indices into the values): events by the candidate bucket of their
      value (the smallest candidate at least the value; the last bucket above every candidate),
      each person's finite values weighted ``1 / (their number)``.

    Every person adds a total weight of at most 1 to each histogram.
    """
    parts = []
    P = _pairs(block.offsets, block.keys, domain_size) if (key_limit or event_limit) else None
    if key_limit:
        k = np.diff(P.pair_off)
        parts.append(np.bincount(np.minimum(k, key_limit), minlength=key_limit + 1).astype(np.float64))
    if event_limit:
        k = np.diff(P.pair_off)
        w = 1.0 / np.maximum(k[P.pair_row], 1)
        parts.append(np.bincount(np.minimum(P.n_pk, event_limit), weights=w, minlength=event_limit + 1))
    if auto_columns:
        n = block.n
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(np.asarray(block.offsets, np.int64)))
        for j in auto_columns:
            x = np.asarray(block.values[:, j], np.float64)
            fin = np.isfinite(x)
            per = np.bincount(rows[fin], minlength=n)
            w = 1.0 / np.maximum(per[rows[fin]], 1)
            b = np.searchsorted(candidates, x[fin], side="left")
            parts.append(np.bincount(b, weights=w, minlength=candidates.size + 1))
    return np.concatenate(parts) if parts else np.zeros(0)
