"""Person x item tables held in memory as bounded records (the local engine's event records).

:func:`bound_items` is the in-memory twin of
:func:`sparkpriv.spark.events.bound_contributions`: a 0/1 person x item matrix
(a ``scipy.sparse`` matrix, or a dense numpy array) or a list of each person's
items becomes one record per person of at most ``L`` distinct items, chosen
uniformly at random (keyed) when a person holds more, with the same numpy
function (:func:`sparkpriv.mechanisms.sparse.cap_items`) the Spark tasks run.
``max_items="auto"`` leaves ``L`` to the release (a DP quantile,
:mod:`sparkpriv.mechanisms.auto_bound`). Releases that take event records
(``inputs`` holding ``"records"``) accept the result on the local engine.

Columns are the vocabulary: column ``j`` is item ``j`` (a public range), unless
``vocabulary`` names them. Nothing here reads a value before a release asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkpriv.errors import InputError, ParameterError
from sparkpriv.mechanisms.protocol import InputFacts, SparseRows
from sparkpriv.mechanisms.sparse import ItemCap, Vocabulary, cap_items

__all__ = ["LocalRecords", "bound_items"]

BLOCK_PEOPLE = 65_536


@dataclass
class LocalRecords:
    """Bounded person records in memory (see the module docstring): CSR ``offsets`` and distinct
    ``indices`` of every person, the public ``cap`` and ``vocabulary``, the secret key of the choice."""

    offsets: np.ndarray = field(repr=False)
    indices: np.ndarray = field(repr=False)
    cap: ItemCap
    vocabulary: Vocabulary
    _key: int = field(repr=False)
    auto: Any = None
    source: str = "in-memory person x item table"
    kind: str = "records"
    counters: dict = field(default_factory=dict, repr=False)
    _counted: set = field(default_factory=set, repr=False)

    @property
    def d(self) -> int:
        return self.vocabulary.size

    @property
    def rows(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def facts(self) -> InputFacts:
        return InputFacts("records", self.d, (), self.cap.value_cap, self.cap.l2_bound,
                          length_histogram=self.auto is not None)

    @property
    def auto_cap(self):
        return self.auto

    def set_max_items(self, max_items: int) -> None:
        self.cap = ItemCap(int(max_items), self.cap.weights, self.cap.max_events_per_item, _caller=self.cap._caller)

    @property
    def source_df(self):
        return None

    def public_params(self) -> dict:
        cap = self.cap.to_public_dict()
        if self.auto is not None:
            cap = {"max_items": "auto", **self.auto.to_public_dict(), "weights": cap["weights"],
                   "max_events_per_item": cap["max_events_per_item"]}
        return {"input": "person x item table (bounded person records)", "contribution_bound": cap,
                "vocabulary": self.vocabulary.to_public_dict()}

    def input_info(self, source: str | None) -> dict:
        return {"source": source or self.source, "records": "one per person, at most max_items distinct items"}

    def diagnostics(self) -> dict:
        return dict(self.counters)

    def blocks(self, block_rows: int = BLOCK_PEOPLE, *, count: bool = True):
        """The capped records in blocks of ``block_rows`` people (:class:`SparseRows`, binary)."""
        for s in range(0, self.rows, block_rows):
            e = min(self.rows, s + block_rows)
            off = self.offsets[s:e + 1] - self.offsets[s]
            idx = self.indices[self.offsets[s]:self.offsets[e]]
            ph = np.arange(s, e, dtype=np.int64)  # the row number: public, only the keyed choice reads it
            o, i, _, t = cap_items(off, idx, None, ph, self.cap, self._key)
            key = (s, block_rows, self.cap.max_items)
            if count and key not in self._counted:
                self._counted.add(key)
                for name, v in zip(("people", "people_truncated", "items_dropped"), t._t()[:3]):
                    self.counters[name] = self.counters.get(name, 0) + int(v)
            yield SparseRows(np.asarray(o, np.int64), np.asarray(i, np.int32), None, self.d)


def _csr_parts(X):
    """``(offsets, distinct sorted indices, d)`` of a 0/1 person x item matrix or a list of item lists."""
    try:
        from scipy import sparse
    except ImportError:  # pragma: no cover - scikit-learn needs scipy
        sparse = None
    if sparse is not None and sparse.issparse(X):
        X = sparse.csr_matrix(X)
        X.sum_duplicates()
        if X.nnz and (not np.all(np.isfinite(X.data))):
            X = X.copy()
            X.data[~np.isfinite(X.data)] = 0.0  # a public rule: a non-finite cell is no visit
            X.eliminate_zeros()
        X.data = (X.data != 0).astype(np.float64)
        X.eliminate_zeros()
        X.sort_indices()
        return np.asarray(X.indptr, np.int64), np.asarray(X.indices, np.int32), int(X.shape[1])
    if isinstance(X, np.ndarray):
        if X.ndim != 2:
            raise ParameterError(f"A person x item matrix must be 2-D (people, items). Got shape {X.shape}.")
        nz = np.isfinite(X) & (X != 0)
        r, c = np.nonzero(nz)
        off = np.zeros(X.shape[0] + 1, np.int64)
        np.cumsum(np.bincount(r, minlength=X.shape[0]), out=off[1:])
        return off, c.astype(np.int32), int(X.shape[1])
    if isinstance(X, (list, tuple)):
        raise ParameterError("A list of item lists needs its vocabulary: give vocabulary= (the public items).")
    raise ParameterError(f"bound_items takes a scipy.sparse or numpy person x item matrix; got {type(X).__name__}.")


def bound_items(X, *, max_items, vocabulary=None, auto=None, seed: int | bytes | None = None,
                source: str | None = None) -> LocalRecords:
    """In-memory person x item records bounded to at most ``max_items`` distinct items per person.

    Parameters
    ----------
    X : scipy.sparse matrix or ndarray of shape (n_people, n_items), or a list of item lists
        A nonzero (finite) cell is a visit; column ``j`` is item ``j`` of the vocabulary. A list
        holds each person's item ids, which ``vocabulary`` (required then) maps to columns; ids
        outside it are dropped like events outside a declared vocabulary.
    max_items : int >= 1 or "auto"
        ``L`` (module docstring); ``"auto"``: chosen by the release (``auto``: an ``AutoCap``).
    vocabulary : optional
        The PUBLIC items (as :func:`~sparkpriv.spark.events.bound_contributions`); default
        ``0 .. n_items - 1``.
    seed : int or bytes, optional
        Secret key of the choice (default: fresh OS entropy).

    Privacy
    -------
    Not a release. After it one person changes one record of at most ``L`` items: the bound a
    release's sensitivity uses (docs/math.md section 8).
    """
    from sparkpriv.privacy.random import derive_seed, new_secret_seed

    caller = "bound_items"
    if isinstance(X, (list, tuple)):
        if vocabulary is None:
            raise ParameterError(f"{caller}: a list of item lists needs vocabulary= (the public item ids).")
        voc = Vocabulary.parse(vocabulary)
        pos = {v: j for j, v in enumerate(voc.ids)} if not voc.is_range else None
        rows = []
        for items in X:
            js = set()
            for it in items:
                if voc.is_range:
                    try:
                        j = int(it) - voc.start
                    except (TypeError, ValueError):
                        continue  # a malformed id: outside the vocabulary, dropped
                    if 0 <= j < voc.size:
                        js.add(j)
                else:
                    j = pos.get(it if not voc.integer_ids else _as_int(it))
                    if j is not None:
                        js.add(j)
            rows.append(sorted(js))
        off = np.zeros(len(rows) + 1, np.int64)
        np.cumsum([len(r) for r in rows], out=off[1:])
        idx = np.asarray([j for r in rows for j in r], np.int32)
        d = voc.size
    else:
        off, idx, d = _csr_parts(X)
        voc = Vocabulary.from_range(0, d) if vocabulary is None else Vocabulary.parse(vocabulary)
        if voc.size != d:
            raise ParameterError(f"{caller}: the vocabulary has {voc.size} items but the matrix {d} columns.")
    if isinstance(max_items, str) and max_items == "auto":
        import dataclasses

        from sparkpriv.mechanisms.auto_bound import DEFAULT_LIMIT, AutoCap

        auto = auto if auto is not None else AutoCap(limit=DEFAULT_LIMIT, _caller=caller)
        if auto.limit > d:
            auto = dataclasses.replace(auto, limit=max(1, d))
        max_items = auto.limit
    elif auto is not None:
        raise ParameterError(f"{caller}: 'auto' applies to max_items='auto' only (got max_items={max_items!r}).")
    if isinstance(max_items, str):
        raise ParameterError(f"The 'max_items' parameter of {caller} must be an int in the range [1, inf) or "
                             f"'auto'. Got {max_items!r} instead.")
    cap = ItemCap(max_items, "binary", None, _caller=caller)
    key = new_secret_seed("contribution-bounding") if seed is None else derive_seed(seed, "contribution-bounding")
    return LocalRecords(off, idx, cap, voc, key, auto, source or "in-memory person x item table")


def _as_int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
