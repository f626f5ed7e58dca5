"""Person records from event tables: contribution bounding and sparse
projection (docs/math.md section 8).

An event table (call-detail records, smart-card taps) has many rows per
person. Before any mechanism, the events of a person are reduced to ONE
bounded record: a sparse vector over a public item vocabulary (towers,
stations) holding at most ``L`` distinct items, chosen uniformly at random
among the person's items (not the first ``L``), with value 1 (``"binary"``) or
the person's event count at the item capped at ``c`` (``"counts"``).

Record format (one batch of ``n`` people, CSR-like, never densified)::

    offsets : int64 (n + 1,)   person r owns entries offsets[r]:offsets[r+1]
    indices : int32 (nnz,)     vocabulary indices in [0, d), sorted, distinct per person
    values  : float64 (nnz,) or None (binary: every value is 1)

Bounds implied by the cap (both hold for every record, so both can be used
for the sensitivity; the smaller sensitivity is chosen from the realized
matrix, which is data-independent)::

    binary:           ||x||_1 <= L,      ||x||_2 <= sqrt(L)
    counts, cap c:    ||x||_1 <= L c,    ||x||_2 <= c sqrt(L)

Replace-one doubles them as usual (``v = x - x'``).

Keyed choice. The ``L`` items kept for a person are the ``L`` with the
smallest keyed score ``mix(mix(h(person) ^ k0) ^ (item * G + k1))`` where
``h`` is a public 64-bit hash of the person key (Spark's ``xxhash64``),
``mix`` the SplitMix64 finalizer (a bijection with full avalanche) and
``(k0, k1)`` a 128-bit secret key. Scores of one person's items are
pseudo-independent and uniform, so the kept set is a uniformly random
``L``-subset; the choice depends only on the person's own items, so it does
not change the sensitivity argument (each bounded record is a function of one
person's events). The choice is reproducible for a given key, whatever the
partitioning, and the key is never a literal in a query plan (it travels in a
task closure). SplitMix64 is not a cryptographic PRF; the key keeps the choice
unpredictable to someone who does not hold it, which is all that is needed.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import InputError, ParameterError
from sparkpriv.privacy import _compiled
from sparkpriv.privacy.bounds import Bounds, ClipCounts

if TYPE_CHECKING:  # protocol imports this module; the annotation only names the type
    from sparkpriv.mechanisms.protocol import SparseRows

__all__ = [
    "WEIGHTS",
    "Vocabulary",
    "ItemCap",
    "TruncationCounts",
    "person_hash_mix",
    "keyed_item_scores",
    "dedupe_rows",
    "cap_items",
    "kept_entries",
    "clip_sparse_rows",
    "project_sparse_rows",
    "densify_rows",
    "take_rows",
    "rows_to_bytes",
    "rows_from_bytes",
    "rows_count_of_bytes",
    "stack_csr",
    "plan_sparse_projection",
]

WEIGHTS = ("binary", "counts")
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


# --------------------------------------------------------------------------- vocabulary

@dataclass(frozen=True)
class Vocabulary:
    """The public, declared item vocabulary: item id -> index in ``[0, d)``.

    Either a range of integer ids ``[start, stop)`` (index = id - start) or an
    explicit list of ids (index = position in the list). Items of an event
    table outside the vocabulary are dropped and counted (owner diagnostics).
    """

    start: int | None = None
    stop: int | None = None
    ids: tuple | None = None
    source: str = "declared"

    @classmethod
    def from_range(cls, start: int, stop: int) -> "Vocabulary":
        check_param("start", start, [Interval("integer", None, None, "neither")], "Vocabulary.from_range")
        if not isinstance(stop, (int, np.integer)) or stop <= start:
            raise ParameterError(f"A vocabulary range needs integer stop > start. Got [{start}, {stop!r}).")
        return cls(start=int(start), stop=int(stop), source=f"range [{int(start)}, {int(stop)})")

    @classmethod
    def from_ids(cls, ids: Iterable, source: str = "declared list") -> "Vocabulary":
        ids = tuple(ids)
        if not ids:
            raise ParameterError("The item vocabulary is empty: declare at least one item id.")
        if len(set(ids)) != len(ids):
            seen, dup = set(), None
            for i in ids:
                if i in seen:
                    dup = i
                    break
                seen.add(i)
            raise ParameterError(f"The item vocabulary ({source}) lists id {dup!r} twice; ids must be distinct.")
        kinds = {type(i) for i in ids}
        if not (kinds <= {int} or kinds <= {str}):
            raise ParameterError(f"The item vocabulary ({source}) must hold only integers or only strings.")
        return cls(ids=ids, source=source)

    @classmethod
    def from_file(cls, path: str) -> "Vocabulary":
        """One id per line (blank lines and ``#`` comments ignored); a CSV's first
        column is used and a header line ``id``/``item``/``*_id`` is skipped. Ids
        that all look like integers are read as integers."""
        try:
            with open(path, encoding="utf-8") as f:
                lines = [ln.split("#", 1)[0].strip() for ln in f]
        except OSError as exc:
            raise ParameterError(f"Cannot read the vocabulary file {path!r}: {exc.strerror}.") from None
        vals = [ln.split(",", 1)[0].strip() for ln in lines if ln]
        if vals and not _is_int(vals[0]) and len(vals) > 1 and all(_is_int(v) for v in vals[1:]):
            vals = vals[1:]  # header
        ids = [int(v) for v in vals] if vals and all(_is_int(v) for v in vals) else vals
        return cls.from_ids(ids, source=f"file {os.path.basename(path)}")

    @classmethod
    def parse(cls, spec) -> "Vocabulary":
        """``Vocabulary``, ``range(a, b)``, a sequence of ids, ``"range:a:b"``,
        ``"a..b"`` (inclusive) or a file path."""
        if isinstance(spec, Vocabulary):
            return spec
        if isinstance(spec, range):
            if spec.step != 1:
                raise ParameterError("A vocabulary range must have step 1.")
            return cls.from_range(spec.start, spec.stop)
        if isinstance(spec, str):
            s = spec.strip()
            if s.startswith("range:"):
                parts = s.split(":")
                if len(parts) == 3 and _is_int(parts[1]) and _is_int(parts[2]):
                    return cls.from_range(int(parts[1]), int(parts[2]))
            if ".." in s and all(_is_int(p) for p in s.split("..", 1)):
                a, b = (int(p) for p in s.split("..", 1))
                return cls.from_range(a, b + 1)
            return cls.from_file(s)
        if isinstance(spec, (list, tuple, np.ndarray)):
            return cls.from_ids([i.item() if isinstance(i, np.generic) else i for i in spec])
        raise ParameterError(
            "The 'vocabulary' must be declared: a range of ids (range(0, 1303) / 'range:0:1303' / "
            f"'0..1302'), a list of ids, or a file of ids. Got {type(spec).__name__} instead."
        )

    @property
    def is_range(self) -> bool:
        return self.ids is None

    @property
    def size(self) -> int:
        return (self.stop - self.start) if self.is_range else len(self.ids)

    @property
    def integer_ids(self) -> bool:
        return self.is_range or isinstance(self.ids[0], int)

    def index(self, items) -> np.ndarray:
        """Vocabulary indices of ``items`` (int32), -1 for items outside it."""
        items = np.asarray(items)
        if self.is_range:
            v = items.astype(np.int64) - self.start
            return np.where((v >= 0) & (v < self.size), v, -1).astype(np.int32)
        ids = np.asarray(self.ids)
        order = np.argsort(ids, kind="stable")
        sids = ids[order]
        items = items.astype(sids.dtype) if self.integer_ids else items.astype(str)
        pos = np.clip(np.searchsorted(sids, items), 0, sids.size - 1)
        hit = sids[pos] == items
        return np.where(hit, order[pos], -1).astype(np.int32)

    def to_public_dict(self) -> dict:
        out = {"size": self.size, "source": self.source}
        if self.is_range:
            out["range"] = [self.start, self.stop]
        else:
            h = hashlib.sha256("\n".join(map(str, self.ids)).encode()).hexdigest()
            out["ids_sha256"] = h
        return out


def _is_int(s: str) -> bool:
    s = s.strip()
    return bool(s) and (s.isdigit() or (s[0] in "+-" and s[1:].isdigit()))


# --------------------------------------------------------------------------- the cap

@dataclass(frozen=True)
class ItemCap:
    """The contribution bound of one person: at most ``max_items`` distinct items,
    value 1 (binary) or the event count capped at ``max_events_per_item`` (counts)."""

    max_items: int
    weights: str = "binary"
    max_events_per_item: int | None = None
    _caller: str = "bound_contributions"

    def __post_init__(self):
        c = self._caller
        check_param("max_items", self.max_items, [Interval("integer", 1, None, "left")], c)
        check_param("weights", self.weights, [Options(WEIGHTS)], c)
        check_param("max_events_per_item", self.max_events_per_item,
                    [None, Interval("integer", 1, None, "left")], c)
        if self.weights == "counts" and self.max_events_per_item is None:
            raise ParameterError(
                f"The 'max_events_per_item' parameter of {c} is required with weights='counts': an "
                "uncapped event count has no bound. Give e.g. max_events_per_item=10, or use "
                "weights='binary'."
            )
        if self.weights == "binary" and self.max_events_per_item is not None:
            raise ParameterError(
                f"The 'max_events_per_item' parameter of {c} only applies to weights='counts' (binary "
                f"records hold 1 per visited item). Got {self.max_events_per_item!r} with weights='binary'."
            )

    @property
    def value_cap(self) -> float:
        return 1.0 if self.weights == "binary" else float(self.max_events_per_item)

    @property
    def l1_bound(self) -> float:
        return self.max_items * self.value_cap

    @property
    def l2_bound(self) -> float:
        return math.sqrt(self.max_items) * self.value_cap

    def bounds(self, d: int, norm: str) -> Bounds:
        """The declared :class:`Bounds` for one of the two norms the cap implies."""
        return Bounds(d, row_bound=self.l1_bound if norm == "l1" else self.l2_bound, norm=norm,
                      _caller=self._caller)

    def to_public_dict(self) -> dict:
        return {"max_items": self.max_items, "weights": self.weights,
                "max_events_per_item": self.max_events_per_item,
                "l1_bound": self.l1_bound, "l2_bound": self.l2_bound}


@dataclass(frozen=True)
class TruncationCounts:
    """Owner diagnostics of contribution bounding (never released)."""

    people: int = 0
    people_truncated: int = 0
    items_dropped: int = 0          # (person, item) pairs dropped by the L cap
    events_dropped: int = 0         # events of those pairs (counts mode; 0 if unknown)
    events_capped: int = 0          # events beyond c at a kept item (counts mode)

    def __add__(self, o: "TruncationCounts") -> "TruncationCounts":
        return TruncationCounts(*(a + b for a, b in zip(self._t(), o._t())))

    def _t(self):
        return (self.people, self.people_truncated, self.items_dropped, self.events_dropped,
                self.events_capped)


# --------------------------------------------------------------------------- keyed choice

def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _key_words(key: int) -> tuple[np.uint64, np.uint64]:
    key = int(key) & ((1 << 128) - 1)
    return np.uint64(key & 0xFFFFFFFFFFFFFFFF), np.uint64(key >> 64)


def person_hash_mix(person_hash: np.ndarray, key: int) -> np.ndarray:
    """Keyed 64-bit mix of public person hashes (int64 from Spark's xxhash64)."""
    k0, _ = _key_words(key)
    return _splitmix(np.asarray(person_hash).astype(np.int64).view(np.uint64) ^ k0)


def keyed_item_scores(person_hash: np.ndarray, offsets: np.ndarray, indices: np.ndarray, key: int) -> np.ndarray:
    """uint64 score of every (person, item) entry; smaller scores are kept first."""
    _, k1 = _key_words(key)
    counts = np.diff(offsets)
    hp = np.repeat(person_hash_mix(person_hash, key), counts)
    with np.errstate(over="ignore"):
        it = indices.astype(np.uint64) * _GOLDEN + k1
    return _splitmix(hp ^ it)


# --------------------------------------------------------------------------- record operations

def _row_ids(offsets: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(offsets.size - 1, dtype=np.int64), np.diff(offsets))


def dedupe_rows(offsets: np.ndarray, indices: np.ndarray):
    """Distinct sorted items per person and their multiplicities.

    Returns ``(offsets, indices, counts)`` with ``counts`` int64.
    """
    offsets = np.asarray(offsets, np.int64)
    indices = np.asarray(indices, np.int32)
    rows = _row_ids(offsets)
    # one int64 key per entry; a plain sort of it orders by (person, item)
    width = int(indices.max(initial=0)) + 1
    key = np.sort(rows * width + indices)
    r, i = key // width, (key % width).astype(np.int32)
    new = np.ones(r.size, bool)
    new[1:] = key[1:] != key[:-1]
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, r.size)).astype(np.int64)
    out_off = np.zeros(offsets.size, np.int64)
    np.add.at(out_off, r[starts] + 1, 1)
    return np.cumsum(out_off), i[starts], counts


def kept_entries(offsets, indices, person_hash, max_items: int, key: int) -> np.ndarray:
    """bool mask of the entries kept when each person keeps at most ``max_items`` of theirs: every entry
    of a person with at most ``max_items``, else the ``max_items`` with the smallest keyed score
    (:func:`keyed_item_scores`; the choice of :func:`cap_items`). ``indices`` may be any integers
    (int32 vocabulary indices, or int64 key ids): the score uses their 64-bit two's-complement value."""
    offsets = np.asarray(offsets, np.int64)
    person_hash = np.asarray(person_hash, np.int64)
    sizes = np.diff(offsets)
    L = int(max_items)
    over = sizes > L
    keep = np.ones(int(offsets[-1] - offsets[0]), bool)
    if not over.any():
        return keep
    # only the entries of truncated people are ranked: by keyed score within each person
    sz = sizes[over]
    start = np.zeros(sz.size + 1, np.int64)
    np.cumsum(sz, out=start[1:])
    sub = np.flatnonzero(np.repeat(over, sizes))  # their entries, person after person
    scores = keyed_item_scores(person_hash[over], start, np.asarray(indices)[sub], key)
    o = np.argsort(scores)  # 64-bit scores: a tie has probability ~ L^2 / 2^64
    who = np.repeat(np.arange(sz.size, dtype=np.uint16 if sz.size <= 1 << 16 else np.int64), sz)[o]
    o = o[np.argsort(who, kind="stable")]  # by person, by score within (radix sort on 16 bits)
    rank = np.empty(sub.size, np.int64)
    rank[o] = np.arange(sub.size) - np.repeat(start[:-1], sz)
    keep[sub] = rank < L
    return keep


def cap_items(offsets, indices, counts, person_hash, cap: ItemCap, key: int):
    """Apply the cap: keep at most ``L`` items per person (keyed uniform choice)
    and, in counts mode, cap each count at ``c``.

    Parameters
    ----------
    offsets, indices : distinct items per person, in any order (see the module docstring)
    counts : int64 array (nnz,) or None
        Events per (person, item); None in binary mode when unknown.
    person_hash : int64 array (n,)
        Public hash of each person's key.
    cap : ItemCap
    key : int
        The secret 128-bit key of the choice.

    Returns
    -------
    offsets, indices, values, TruncationCounts
        ``values`` is None in binary mode, float64 counts in counts mode.
    """
    offsets = np.asarray(offsets, np.int64)
    person_hash = np.asarray(person_hash, np.int64)
    n = offsets.size - 1
    sizes = np.diff(offsets)
    L = cap.max_items
    over = sizes > L
    events_dropped = 0
    items_dropped = int(np.sum(sizes[over] - L))
    if over.any():
        keep = kept_entries(offsets, indices, person_hash, L, key)
        if counts is not None:
            events_dropped = int(counts[~keep].sum())
            counts = counts[keep]
        indices = indices[keep]  # entries keep their order within a person
        offsets = np.concatenate(([0], np.cumsum(np.minimum(sizes, L))))
    values = None
    capped = 0
    if cap.weights == "counts":
        c = cap.max_events_per_item
        capped = int(np.maximum(counts - c, 0).sum())
        values = np.minimum(counts, c).astype(np.float64)
    return offsets, indices, values, TruncationCounts(n, int(over.sum()), items_dropped, events_dropped, capped)


def clip_sparse_rows(offsets, indices, values, cap: ItemCap, d: int):
    """Enforce the cap's bounds on records that did not come from :func:`cap_items`.

    Indices outside ``[0, d)`` and non-finite values are an
    :class:`~sparkpriv.errors.InputError`; values are clipped to
    ``[0, c]``; a row whose L1 norm exceeds ``L c`` or L2 norm exceeds
    ``c sqrt(L)`` is scaled down onto both balls. Records made by
    :func:`cap_items` are left unchanged. Returns ``(values, ClipCounts)``
    (``values`` is None when every record is binary and within the cap).
    """
    offsets = np.asarray(offsets, np.int64)
    n = offsets.size - 1
    if indices.size and (indices.min() < 0 or indices.max() >= d):
        raise InputError(f"Record item indices must lie in [0, {d}) (the vocabulary). "
                         f"Got {int(indices.min())}..{int(indices.max())}.")
    sizes = np.diff(offsets)
    if values is None:
        if not np.any(sizes > cap.max_items):
            return None, ClipCounts(n, 0, 0)
        values = np.ones(indices.size)
    v = np.asarray(values, np.float64)
    bad = ~np.isfinite(v)
    if bad.any():
        raise InputError("Record values must be finite numbers; replace NaN or infinite values with a "
                         "public value first.")
    vc = np.clip(v, 0.0, cap.value_cap)
    rows = _row_ids(offsets)
    box = int(np.unique(rows[vc != v]).size)
    l1 = np.bincount(rows, weights=vc, minlength=n)
    l2 = np.sqrt(np.bincount(rows, weights=vc * vc, minlength=n))
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.minimum(np.where(l1 > cap.l1_bound, cap.l1_bound / l1, 1.0),
                       np.where(l2 > cap.l2_bound, cap.l2_bound / l2, 1.0))
    normc = int(np.count_nonzero(s < 1.0))
    if normc:
        vc = vc * s[rows]
    return vc, ClipCounts(n, box, normc)


def _csr(offsets, indices, values, d):
    """scipy CSR of records whose ``offsets`` start at 0 (validated input)."""
    from scipy.sparse import csr_matrix

    offsets = np.asarray(offsets, np.int64)
    v = np.ones(int(offsets[-1])) if values is None else np.asarray(values, np.float64)
    return csr_matrix((v, np.asarray(indices), offsets), shape=(offsets.size - 1, d))


def project_sparse_rows(offsets, indices, values, P: np.ndarray, *, kern=_compiled.AUTO) -> np.ndarray:
    """``x P`` for every sparse record: the (weighted) sum of the rows of ``P``
    at the record's items, never densifying. Returns (n_people, k) float64.

    scipy's CSR product, or the compiled kernel (:mod:`sparkpriv.privacy._compiled`,
    ``kern``; the same sums in the same order, the same bits)."""
    P = np.asarray(P, np.float64)
    if np.asarray(offsets).size <= 1:
        return np.zeros((0, P.shape[1]))
    if kern is _compiled.AUTO:
        kern = _compiled.kernels()
    if kern is None:
        return np.asarray(_csr(offsets, indices, values, P.shape[0]) @ P)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    indices = np.ascontiguousarray(indices)
    weighted = values is not None
    vals = np.ascontiguousarray(values, dtype=np.float64) if weighted else np.empty(0)
    Y = np.empty((offsets.size - 1, P.shape[1]))
    if not kern.project(offsets, indices, vals, weighted, np.ascontiguousarray(P), Y):
        raise ParameterError("project_sparse_rows: the records are malformed (offsets not starting at 0 or "
                             f"decreasing, or an item index outside [0, {P.shape[0]})).")
    return Y


def densify_rows(offsets, indices, values, d: int) -> np.ndarray:
    """The dense (n_people, d) table of sparse records (small data and tests only)."""
    return _csr(offsets, indices, values, d).toarray()


def take_rows(block, rows) -> "SparseRows":
    """The records of ``block`` (a :class:`~sparkpriv.mechanisms.protocol.SparseRows`) at the
    positions ``rows`` (int array, in that order), as a new block; vectorised, no loop over rows."""
    from sparkpriv.mechanisms.protocol import SparseRows

    off = np.asarray(block.offsets, np.int64)
    rows = np.asarray(rows, np.int64)
    lengths = off[rows + 1] - off[rows]
    new_off = np.zeros(rows.size + 1, np.int64)
    np.cumsum(lengths, out=new_off[1:])
    pos = np.repeat(off[rows] - new_off[:-1], lengths) + np.arange(int(new_off[-1]), dtype=np.int64)
    idx = np.asarray(block.indices)[pos]
    vals = None if block.values is None else np.asarray(block.values, np.float64)[pos]
    return SparseRows(new_off, idx, vals, int(block.d))


_ROWS_MAGIC = 0x53505231  # "SPR1": the byte layout of rows_to_bytes


def rows_to_bytes(block) -> bytes:
    """A block of sparse records as bytes (an engine caches or ships it; :func:`rows_from_bytes`):
    int64 header ``[magic, rows, stored items, has values, d]``, the ``rows + 1`` int64 offsets
    (from 0), the int32 item indices, then the float64 values if any."""
    off = np.asarray(block.offsets, np.int64)
    off = off - off[0]
    nnz = int(off[-1])
    idx = np.asarray(block.indices)[int(block.offsets[0]):int(block.offsets[0]) + nnz]
    vals = block.values
    head = np.array([_ROWS_MAGIC, off.size - 1, nnz, 0 if vals is None else 1, int(block.d)], np.int64)
    parts = [head.tobytes(), off.tobytes(), np.ascontiguousarray(idx, dtype=np.int32).tobytes()]
    if vals is not None:
        start = int(block.offsets[0])
        parts.append(np.ascontiguousarray(np.asarray(vals, np.float64)[start:start + nnz]).tobytes())
    return b"".join(parts)


def _rows_header(buf) -> np.ndarray:
    head = np.frombuffer(buf, dtype=np.int64, count=5)
    if int(head[0]) != _ROWS_MAGIC:
        raise ValueError("not a block of sparse records (rows_to_bytes)")
    return head


def rows_count_of_bytes(buf) -> int:
    """The number of records in a :func:`rows_to_bytes` buffer (its header only)."""
    return int(_rows_header(buf)[1])


def rows_from_bytes(buf) -> "SparseRows":
    """The block of :func:`rows_to_bytes` (arrays are views of ``buf``: read-only)."""
    from sparkpriv.mechanisms.protocol import SparseRows

    _, n, nnz, has_values, d = (int(v) for v in _rows_header(buf))
    at = 40
    off = np.frombuffer(buf, dtype=np.int64, count=n + 1, offset=at)
    at += 8 * (n + 1)
    idx = np.frombuffer(buf, dtype=np.int32, count=nnz, offset=at)
    at += 4 * nnz
    vals = np.frombuffer(buf, dtype=np.float64, count=nnz, offset=at) if has_values else None
    return SparseRows(off, idx, vals, d)


def stack_csr(blocks, d: int):
    """One scipy CSR matrix ``(rows, d)`` float64 of the blocks' records, in order."""
    from scipy.sparse import csr_matrix

    blocks = list(blocks)
    sizes = [int(np.asarray(b.offsets)[-1] - np.asarray(b.offsets)[0]) for b in blocks]
    n = sum(b.n for b in blocks)
    off = np.zeros(n + 1, np.int64)
    idx = np.empty(sum(sizes), np.int32)
    vals = np.ones(sum(sizes), np.float64)
    r = at = 0
    for b, m in zip(blocks, sizes):
        o = np.asarray(b.offsets, np.int64)
        off[r + 1:r + b.n + 1] = o[1:] - o[0] + at
        idx[at:at + m] = np.asarray(b.indices)[o[0]:o[0] + m]
        if b.values is not None:
            vals[at:at + m] = np.asarray(b.values, np.float64)[o[0]:o[0] + m]
        r += b.n
        at += m
    return csr_matrix((vals, idx, off), shape=(n, int(d)))


# --------------------------------------------------------------------------- calibration

def plan_sparse_projection(P: np.ndarray, cap: ItemCap, *, epsilon: float, delta: float = 0.0,
                           noise: str = "laplace", neighbors: str = "replace-one",
                           caller: str = "release_projection"):
    """Calibrate a projection of capped records: both norm bounds of the cap hold,
    so each gives a valid sensitivity of the realized ``P``; the smaller is used.

    Returns the :class:`~sparkpriv.mechanisms.projection.ProjectionPlan`.
    """
    from sparkpriv.mechanisms.projection import plan_projection

    if neighbors == "element":
        raise ParameterError(
            f"The 'neighbors' parameter of {caller} cannot be 'element' for event tables: the record "
            "is a person's items, and the release protects the whole person (replace-one or add-remove)."
        )
    d = P.shape[0]
    plans = [plan_projection(P, cap.bounds(d, norm), epsilon=epsilon, delta=delta, noise=noise,
                             neighbors=neighbors, caller=caller) for norm in ("l1", "l2")]
    return min(plans, key=lambda p: p.sensitivity)


def sparse_rows_from_lists(lists: Sequence[Sequence[int]]):
    """``(offsets, indices)`` from Python lists of item indices (tests, small data)."""
    sizes = [len(x) for x in lists]
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    flat = np.fromiter((i for x in lists for i in x), dtype=np.int32, count=int(offsets[-1]))
    return offsets, flat
