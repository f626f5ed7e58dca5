"""Synthetic event tables of a model released on bounded event records (DPGM; docs/research/dpgm.md
"Synthesizing a table").

A release on event records (:class:`~sparkpriv.spark.events.BoundedRecords`)
trains on each person's 0/1 row over the declared item vocabulary. The
:class:`EventColumns` of the release are the public facts needed to turn such
rows back into events: the source's person and item column names, the item
column's SQL type (its schema) and the declared vocabulary (column index ``j``
-> item id). All are declared or schema facts, never values read from the data.

A synthetic 0/1 row ``x`` (values in ``[0, 1]``) holds item ``j`` when
``x[j] >= 0.5`` (the RBM's values are 0/1 already); the person's items are the
ids of those columns, sorted by id. :func:`item_arrays` gives one row per
person (``person``, ``items``), :func:`exploded_arrays` one row per (person,
item) under the source's column names. Synthetic person ids are ``0 .. N-1``
(never the source's keys).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.sparse import Vocabulary

__all__ = ["EventColumns", "ITEM_TYPES", "THRESHOLD", "PERSON", "ITEMS", "item_matrix", "item_arrays",
           "exploded_arrays", "events_table", "synthesize_events"]

THRESHOLD = 0.5  # a synthetic value >= this is a visited item
PERSON, ITEMS = "person", "items"  # the columns of the one-row-per-person layout
# the item types of a synthetic event table (Spark's simple strings) and their numpy dtypes
ITEM_TYPES = {"tinyint": np.int8, "smallint": np.int16, "int": np.int32, "bigint": np.int64, "string": None}
_ALIASES = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint"}


@dataclass(frozen=True)
class EventColumns:
    """Public facts of the event table a model was released on.

    ``person`` and ``item``: the source's column names; ``item_type``: the item
    column's SQL type (Spark's simple string); ``vocabulary``: the declared
    items, column ``j`` of the model is ``vocabulary`` index ``j``.
    """

    person: str
    item: str
    item_type: str
    vocabulary: Vocabulary

    @property
    def d(self) -> int:
        return self.vocabulary.size

    @property
    def synthetic_item_type(self) -> str:
        """The type of the synthetic item column: the source's integer type when every declared
        id fits it (else ``bigint``), ``string`` for a string column or string ids."""
        t = str(self.item_type).strip().lower()
        t = _ALIASES.get(t, t)
        voc = self.vocabulary
        if not voc.integer_ids:
            return "string"
        if t == "string":
            return "string"
        if t in ITEM_TYPES:
            lo, hi = (voc.start, voc.stop - 1) if voc.is_range else (min(voc.ids), max(voc.ids))
            info = np.iinfo(ITEM_TYPES[t])
            if info.min <= lo and hi <= info.max:
                return t
        return "bigint"

    def item_values(self):
        """The ``d`` item ids in vocabulary order as an Arrow array of :attr:`synthetic_item_type`."""
        import pyarrow as pa

        voc, t = self.vocabulary, self.synthetic_item_type
        ids = np.arange(voc.start, voc.stop, dtype=np.int64) if voc.is_range else list(voc.ids)
        if t == "string":
            return pa.array([str(v) for v in ids], pa.string())
        return pa.array(np.asarray(ids, dtype=ITEM_TYPES[t]))

    def to_header(self) -> dict:
        """The model file's record of these facts (JSON; :meth:`from_header`)."""
        voc = self.vocabulary
        vocabulary = {"range": [voc.start, voc.stop]} if voc.is_range else {"ids": list(voc.ids)}
        return {"person_column": self.person, "item_column": self.item, "item_type": self.item_type,
                "vocabulary": dict(vocabulary, source=voc.source)}

    def to_public_dict(self) -> dict:
        """For receipts: the columns, types and the vocabulary's public summary (its ids' hash)."""
        return {"person_column": self.person, "item_column": self.item, "item_type": self.item_type,
                "synthetic_item_type": self.synthetic_item_type, "vocabulary": self.vocabulary.to_public_dict()}

    @classmethod
    def from_header(cls, header: dict, d: int, where: str = "the model") -> "EventColumns":
        try:
            voc = header["vocabulary"]
            if "range" in voc:
                vocabulary = Vocabulary.from_range(*(int(v) for v in voc["range"]))
            else:
                vocabulary = Vocabulary.from_ids(voc["ids"], source=str(voc.get("source", "declared list")))
            out = cls(str(header["person_column"]), str(header["item_column"]), str(header["item_type"]),
                      vocabulary)
        except (KeyError, TypeError, ValueError, ParameterError) as exc:
            raise ParameterError(f"{where}: the model's event columns cannot be read ({type(exc).__name__}): "
                                 "not a released model.") from None
        if out.d != int(d):
            raise ParameterError(f"{where}: the model's vocabulary has {out.d} items for {d} model columns: "
                                 "not a released model.")
        return out

    @classmethod
    def from_records(cls, records) -> "EventColumns | None":
        """The facts of :class:`~sparkpriv.spark.events.BoundedRecords` (its declared vocabulary and
        the event table's schema; no value is read); None when the records do not name their
        event table's columns."""
        table = (getattr(records, "input_info", None) or {}).get("event_table") or {}
        person, item = table.get("person_column"), table.get("item_column")
        names = getattr(getattr(records, "events", None), "schema", None)
        if not person or not item or names is None or item not in names.fieldNames():
            return None
        return cls(str(person), str(item), names[item].dataType.simpleString(), records.vocabulary)


def item_matrix(X: np.ndarray, events: EventColumns) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets (n + 1,), positions)`` of the visited items (``X >= 0.5``) of each row of the
    synthetic records ``X`` (n, d); ``positions`` index the vocabulary in id order
    (:func:`_value_order`), so each row's items come out sorted by id."""
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != events.d:
        raise ValueError(f"synthetic records of shape {X.shape} for a vocabulary of {events.d} items")
    Y = X if events.vocabulary.is_range else X[:, _value_order(events)]
    r, c = np.nonzero(Y >= THRESHOLD)
    off = np.zeros(X.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=X.shape[0]), out=off[1:])
    return off, c


def _value_order(events: EventColumns) -> np.ndarray:
    """Vocabulary indices in increasing item id (identity for a range)."""
    import pyarrow.compute as pc

    if events.vocabulary.is_range:
        return np.arange(events.d)
    return np.asarray(pc.sort_indices(events.item_values()).to_numpy(), np.int64)


def _sorted_items(X, events: EventColumns):
    """``(offsets, the visited items' ids as an Arrow array)``, each row's items sorted by id.

    ``X``: synthetic records ``(n, d)`` (dense), or ``(offsets, indices)`` of sparse ones
    (vocabulary indices; distinct within a row)."""
    import pyarrow as pa

    if isinstance(X, tuple):
        off, idx = np.asarray(X[0], np.int64), np.asarray(X[1], np.int64)
        if events.vocabulary.is_range:
            pos = idx
        else:
            rank = np.empty(events.d, np.int64)
            rank[_value_order(events)] = np.arange(events.d)
            pos = rank[idx]
        rows = np.repeat(np.arange(off.size - 1), np.diff(off))
        pos = pos[np.lexsort((pos, rows))]
    else:
        off, pos = item_matrix(X, events)
    values = events.item_values()
    if not events.vocabulary.is_range:
        values = values.take(pa.array(_value_order(events)))
    return off, values.take(pa.array(pos))


def item_arrays(X: np.ndarray, events: EventColumns, first_person: int = 0) -> list:
    """One row per synthetic person: ``[person (int64: first_person, first_person + 1, ...),
    items (list of the item ids, sorted)]`` as Arrow arrays."""
    import pyarrow as pa

    off, items = _sorted_items(X, events)
    n = off.shape[0] - 1
    person = pa.array(np.arange(int(first_person), int(first_person) + n, dtype=np.int64))
    if off[-1] > np.iinfo(np.int32).max:  # pyarrow's list offsets are int32
        raise ValueError("too many synthetic items in one batch (more than 2^31)")
    return [person, pa.ListArray.from_arrays(pa.array(off.astype(np.int32)), items)]


def exploded_arrays(X: np.ndarray, events: EventColumns, first_person: int = 0) -> list:
    """One row per (synthetic person, item): ``[person (int64), item]``, people in order, each
    person's items sorted; a person without items has no row."""
    import pyarrow as pa

    off, items = _sorted_items(X, events)
    n = off.shape[0] - 1
    person = np.repeat(np.arange(int(first_person), int(first_person) + n, dtype=np.int64), np.diff(off))
    return [pa.array(person), items]


def events_table(X: np.ndarray, events: EventColumns, *, explode: bool = False, first_person: int = 0):
    """The synthetic records ``X`` as a pyarrow Table: ``person``, ``items`` (one row per person),
    or one row per (person, item) under the source's column names (``explode``)."""
    import pyarrow as pa

    if explode:
        return pa.Table.from_arrays(exploded_arrays(X, events, first_person), names=[events.person, events.item])
    return pa.Table.from_arrays(item_arrays(X, events, first_person), names=[PERSON, ITEMS])


def synthesize_events(model, n: int, seed: int, *, explode: bool = False):
    """``n`` synthetic people of a model released on event records, in memory, as a pyarrow
    Table (:func:`events_table`): the records of
    :func:`~sparkpriv.mechanisms.dpgm.synthesize` for ``seed``, clipped to ``[0, 1]``
    (post-processing: no budget). Refused for a model released on a table."""
    from sparkpriv.mechanisms.dpgm import synthesize

    if getattr(model, "events", None) is None:
        raise ParameterError("synthesize_events: the model was released on a table, not on event records "
                             "(release_dpgm of bounded event records); use synthesize_table.")
    X = np.clip(synthesize(model, n, seed), 0.0, 1.0)
    return events_table(X, model.events, explode=explode)
