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

:func:`bound_keys` is the in-memory twin of :func:`sparkpriv.spark.counts.bound_keys`: an event
table (pandas or Arrow) over a public :class:`~sparkpriv.mechanisms.counts.KeyDomain` becomes the
same records, each person identified by Spark's ``xxhash64`` of their key
(:mod:`sparkpriv.local.spark_hash`), so with the same ``seed`` both engines keep the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.protocol import InputFacts, SparseRows
from sparkpriv.mechanisms.sparse import ItemCap, Vocabulary, cap_items

__all__ = ["LocalRecords", "bound_items", "bound_keys"]

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
    # an event table's records (bound_keys): each person's public hash (Spark's xxhash64 of the
    # person key; default the row number), events per (person, item) (weights 'counts'), and per
    # person the events in and outside the vocabulary (owner diagnostics)
    person_hash: np.ndarray | None = field(default=None, repr=False)
    counts: np.ndarray | None = field(default=None, repr=False)
    events: np.ndarray | None = field(default=None, repr=False)
    outside: np.ndarray | None = field(default=None, repr=False)
    event_table: dict | None = None  # bound_keys: the person and key columns (public names)

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
        what = "event table" if self.event_table is not None else "person x item table"
        return {"input": f"{what} (bounded person records)", "contribution_bound": cap,
                "vocabulary": self.vocabulary.to_public_dict()}

    def input_info(self, source: str | None) -> dict:
        info = {"source": source or self.source, "records": "one per person, at most max_items distinct items"}
        if self.event_table is not None:
            info["event_table"] = dict(self.event_table)
            info["person_key"] = "used only to group events; never copied to the output"
        return info

    def diagnostics(self) -> dict:
        return dict(self.counters)

    def blocks(self, block_rows: int = BLOCK_PEOPLE, *, count: bool = True):
        """The capped records in blocks of ``block_rows`` people (:class:`SparseRows`, binary)."""
        for s in range(0, self.rows, block_rows):
            e = min(self.rows, s + block_rows)
            off = self.offsets[s:e + 1] - self.offsets[s]
            idx = self.indices[self.offsets[s]:self.offsets[e]]
            ph = np.arange(s, e, dtype=np.int64) if self.person_hash is None else self.person_hash[s:e]
            cnt = self.counts[self.offsets[s]:self.offsets[e]] if self.counts is not None else None
            o, i, vals, t = cap_items(off, idx, cnt if self.cap.weights == "counts" else None, ph, self.cap,
                                      self._key)
            key = (s, block_rows, self.cap.max_items)
            if count and key not in self._counted:
                self._counted.add(key)
                names = ("people", "people_truncated", "items_dropped", "events_dropped", "events_capped")
                diag = list(zip(names, t._t() if self.counts is not None else t._t()[:3]))
                if self.events is not None:  # the Spark engine's event diagnostics (bound_keys)
                    diag += [("events", int(self.events[s:e].sum())),
                             ("events_out_of_vocabulary", int(self.outside[s:e].sum())),
                             ("people_without_vocabulary_items", int(np.count_nonzero(np.diff(o) == 0)))]
                for name, v in diag:
                    self.counters[name] = self.counters.get(name, 0) + int(v)
            yield SparseRows(np.asarray(o, np.int64), np.asarray(i, np.int32), vals, self.d)


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
    from sparkpriv.privacy.random import bounding_key

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
    key = bounding_key(seed)
    return LocalRecords(off, idx, cap, voc, key, auto, source or "in-memory person x item table")


def _as_int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def bound_keys(events, *, person: str, domain, max_keys, max_events_per_key: int | None = None, seed=None,
               source: str | None = None, auto=None) -> LocalRecords:
    """The bounded records of an in-memory event table over a public key domain (the local engine's
    :func:`sparkpriv.spark.counts.bound_keys`, same parameters and the same records).

    Parameters
    ----------
    events : pandas.DataFrame or pyarrow.Table
        One row per event; ``person`` its person-key column, the domain's key columns its keys.
    domain : KeyDomain
        The PUBLIC keys; an event at a key outside it (or null, or malformed) is dropped and counted for
        the owner (``events_out_of_vocabulary``).
    max_keys : int >= 1 or "auto"
        ``L``: at most this many keys per person, a keyed uniform choice among more (Spark's choice:
        the person's ``xxhash64`` and the key index, under the secret key).
    max_events_per_key : int, optional
        ``c``: release the person's events per key capped at ``c`` instead of distinct people.
    seed : bytes, optional
        Secret key of the choice (>= 16 bytes; default fresh OS entropy); the same bytes give Spark's
        ``bound_keys`` the same choice.

    Pass the result and the same ``domain`` to ``release_counts``. Reads no data (refusals first).

    Privacy
    -------
    Not a release. After it one person changes one record of at most ``L`` keys, each at most ``c``.
    """
    from sparkpriv._validation import Interval, check_param
    from sparkpriv.local.events import _column, _table, group_people, key_index
    from sparkpriv.mechanisms.counts import MAX_DRIVER_KEYS, MAX_KEYS, KeyDomain
    from sparkpriv.privacy.random import bounding_key

    caller = "bound_keys"
    if not isinstance(domain, KeyDomain):
        raise ParameterError(f"bound_keys needs a KeyDomain for 'domain'. Got {type(domain).__name__}; "
                             "build one with KeyDomain.product(...) or KeyDomain.pairs(...).")
    if domain.size > MAX_KEYS:
        raise ParameterError(f"The key domain has {domain.size} keys, more than {MAX_KEYS} (key indices are 32-bit "
                             "integers): declare a smaller domain or split it into several releases.")
    if domain.tuples is not None and domain.size > MAX_DRIVER_KEYS:
        raise ParameterError(f"The declared key list has {domain.size} keys, more than {MAX_DRIVER_KEYS}: declare "
                             "the domain as a product of per-column vocabularies, or split it.")
    if not (isinstance(max_keys, str) and max_keys == "auto"):
        check_param("max_keys", max_keys, [Interval("integer", 1, None, "left")], caller)
    check_param("max_events_per_key", max_events_per_key, [None, Interval("integer", 1, 2**20, "both")], caller)
    table = _table(events, caller)
    from sparkpriv.mechanisms.counts._mechanism import check_key_columns

    check_key_columns(table.column_names, person, domain)
    d = domain.size
    if isinstance(max_keys, str):
        import dataclasses

        from sparkpriv.mechanisms.auto_bound import DEFAULT_LIMIT, AutoCap

        auto = auto if auto is not None else AutoCap(limit=DEFAULT_LIMIT, _caller=caller)
        if auto.limit > d:
            auto = dataclasses.replace(auto, limit=d)
        max_keys = auto.limit
    elif auto is not None:
        raise ParameterError(f"{caller}: 'auto' applies to max_keys='auto' only (got max_keys={max_keys!r}).")
    weights = "binary" if max_events_per_key is None else "counts"
    cap = ItemCap(max_keys, weights, max_events_per_key, _caller=caller)
    key = bounding_key(seed)
    # group the events by person (in memory; a malformed key is dropped, never an error): per person its
    # distinct key indices and their events
    idx = key_index(table, domain)
    code, ph = group_people(_column(table, person))
    n = ph.size
    inside = idx >= 0
    events_in = np.bincount(code[inside], minlength=n).astype(np.int64)
    outside = np.bincount(code[~inside], minlength=n).astype(np.int64)
    comb = np.unique(code[inside] * np.int64(d) + idx[inside], return_counts=True)
    pair, cnt = comb
    rows, items = pair // d, (pair % d).astype(np.int32)
    off = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=off[1:])
    return LocalRecords(off, items, cap, Vocabulary.from_range(0, d), key, auto, source or "in-memory event table",
                        person_hash=ph, counts=cnt.astype(np.int64), events=events_in + outside, outside=outside,
                        event_table={"person_column": person, "key_columns": list(domain.columns)})
