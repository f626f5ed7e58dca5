"""Event tables held in memory (a pandas DataFrame or a pyarrow Table) for the local engine: the twin
of :mod:`sparkpriv.spark.aggregates` and of the key indexing of :mod:`sparkpriv.spark.counts`.

1. Each event's key is mapped to its index in the PUBLIC key domain (:func:`key_index`: range
   arithmetic, or a look-up of the declared ids or key tuples; a key outside the domain, malformed or
   null gets -1: the event is dropped and counted for the owner), or, for private keys, to Spark's
   ``xxhash64`` of the key columns (:mod:`sparkpriv.local.spark_hash`; an event with a null key value
   is dropped). Key values are read as Spark's ``try_cast`` reads them (a string key ``" 12 "`` is
   the integer 12, ``"12.5"`` is malformed); value columns as doubles (:func:`value_matrix`: a null
   or malformed value is NaN, which the core fills).
2. The events are grouped by person in memory (the person's value, nulls one person, as Spark's
   ``groupBy``), and each person is given Spark's public ``xxhash64`` of its key (used only by the
   keyed choice of kept keys).
3. Blocks of whole people (:class:`~sparkpriv.mechanisms.protocol.EventRows`) go to the core's
   bounding (:func:`~sparkpriv.mechanisms.aggregates.key_totals`) as on Spark: with the same key of
   the choice, both engines keep the same keys of every person.

Differences from Spark's casts, all in what counts as malformed (such values are dropped or
filled by the same public rule on both engines, never an error): a string value column is parsed
as decimal or scientific notation, ``NaN`` and ``inf`` (Spark also reads Java's ``1d``/``1f``
suffixes and hexadecimal floats); a float key column compared with string ids is written as
Python writes floats (``1e+10`` where Spark writes ``1.0E10``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkpriv.errors import ParameterError, SchemaError
from sparkpriv.mechanisms.protocol import EventRows, InputFacts

__all__ = ["LocalEvents", "open_events", "key_index", "as_long", "as_string", "value_matrix", "group_people",
           "BLOCK_PEOPLE"]

BLOCK_PEOPLE = 65_536


def _table(data, caller: str):
    import pyarrow as pa

    if type(data).__module__.startswith("pandas."):
        return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return data
    raise ParameterError(f"{caller} takes an event table: a pandas DataFrame or a pyarrow Table in memory (the "
                         f"local engine), or a Spark DataFrame. Got {type(data).__name__}.")


def _column(table, name: str):
    col = table.column(name)
    return col.combine_chunks() if hasattr(col, "combine_chunks") else col


def as_long(arr) -> tuple[np.ndarray, np.ndarray]:
    """``(int64 values, valid)`` of an Arrow array as Spark's ``try_cast(x AS BIGINT)`` reads it:
    integers as they are; strings trimmed, ``[+-]digits`` within the 64-bit range (others invalid);
    floats truncated toward zero when finite and in range; booleans 0 and 1; nulls invalid."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(arr)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool) if arr.null_count else np.ones(n, bool)
    t = arr.type
    if pa.types.is_dictionary(t):
        arr, t = arr.dictionary_decode(), t.value_type
    if pa.types.is_integer(t):
        if pa.types.is_uint64(t):
            u = arr.fill_null(0).to_numpy(zero_copy_only=False)
            valid &= u <= np.uint64(2**63 - 1)
            return np.where(valid, u, 0).astype(np.int64), valid
        return arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), valid
    if pa.types.is_boolean(t):
        return arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.int64), valid
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        x = arr.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
        ok = np.isfinite(x) & (np.abs(x) < 2.0**63)
        return np.where(ok, np.trunc(np.where(ok, x, 0.0)), 0).astype(np.int64), valid & ok
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        s = pc.utf8_trim_whitespace(arr)
        ok = pc.fill_null(pc.match_substring_regex(s, r"^[+-]?[0-9]+$"), False).to_numpy(zero_copy_only=False)
        ok = np.asarray(ok, bool)
        out = np.zeros(n, np.int64)
        if ok.any():
            sub = s.filter(pa.array(ok))
            try:
                out[ok] = pc.cast(sub, pa.int64()).to_numpy(zero_copy_only=False)
            except (pa.ArrowInvalid, OverflowError):  # digits beyond the 64-bit range: invalid, as in Spark
                vals = [int(v) for v in sub.to_pylist()]
                fits = np.array([-(2**63) <= v < 2**63 for v in vals], bool)
                idx = np.flatnonzero(ok)
                out[idx[fits]] = np.array([v for v, f in zip(vals, fits) if f], np.int64)
                ok[idx[~fits]] = False
        return out, valid & ok
    return np.zeros(n, np.int64), np.zeros(n, bool)


def as_string(arr) -> tuple[np.ndarray, np.ndarray]:
    """``(object array of str, valid)`` of an Arrow array as Spark's ``try_cast(x AS STRING)``."""
    import pyarrow as pa

    n = len(arr)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool) if arr.null_count else np.ones(n, bool)
    t = arr.type
    if pa.types.is_boolean(t):
        vals = np.where(arr.fill_null(False).to_numpy(zero_copy_only=False), "true", "false").astype(object)
    elif pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t) \
            or pa.types.is_dictionary(t):
        vals = np.asarray(arr.cast(pa.string()).to_numpy(zero_copy_only=False), dtype=object)
    else:
        vals = np.asarray([None if v is None else str(v) for v in arr.to_pylist()], dtype=object)
    return vals, valid


def _vocab_index(arr, voc, column: str) -> np.ndarray:
    """Index (int64, -1 outside) of each value of one key column in its vocabulary."""
    import pyarrow as pa

    t = arr.type.value_type if pa.types.is_dictionary(arr.type) else arr.type
    if voc.integer_ids:
        if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise SchemaError(f"The key column {column!r} has type {t}; its declared values are integers: give an "
                              "integer (or string) column.")
        v, ok = as_long(arr)
        if voc.is_range:
            i = v - voc.start
            ok &= (i >= 0) & (v < voc.stop)
            return np.where(ok, i, -1)
        return _lookup(np.asarray(voc.ids, np.int64), v, ok)
    v, ok = as_string(arr)
    return _lookup(np.asarray(voc.ids, dtype=object).astype(str), np.where(ok, v, "").astype(str), ok)


def _lookup(ids: np.ndarray, values: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Position of each value in ``ids`` (distinct), -1 where absent or not ``ok``."""
    order = np.argsort(ids, kind="stable")
    sids = ids[order]
    if not sids.size:
        return np.full(values.shape[0], -1, np.int64)
    pos = np.clip(np.searchsorted(sids, values), 0, sids.size - 1)
    hit = ok & (sids[pos] == values)
    return np.where(hit, order[pos], -1).astype(np.int64)


def key_index(table, domain) -> np.ndarray:
    """The domain index (int64) of each event's key, -1 outside the domain (or null, or malformed)."""
    cols = [_column(table, c) for c in domain.columns]
    n = table.num_rows
    if domain.vocabularies is not None:
        out = np.zeros(n, np.int64)
        ok = np.ones(n, bool)
        for c, arr, v, s in zip(domain.columns, cols, domain.vocabularies, domain.strides):
            i = _vocab_index(arr, v, c)
            ok &= i >= 0
            out += np.where(i >= 0, i, 0) * int(s)
        return np.where(ok, out, -1)
    # declared key tuples: each column's value coded among the column's declared values, the codes
    # combined in mixed radix and looked up among the declared tuples' codes
    code = np.zeros(n, np.int64)
    ok = np.ones(n, bool)
    tup_code = np.zeros(len(domain.tuples), np.int64)
    for j, arr in enumerate(cols):
        is_int = isinstance(domain.tuples[0][j], int)
        declared = [t[j] for t in domain.tuples]
        if is_int:
            uniq = np.unique(np.asarray(declared, np.int64))
            v, vok = as_long(arr)
        else:
            uniq = np.unique(np.asarray(declared, dtype=object).astype(str))
            v, vok = as_string(arr)
            v = np.where(vok, v, "").astype(str)
        i = _lookup(uniq, v, vok)
        ok &= i >= 0
        code = code * uniq.size + np.where(i >= 0, i, 0)
        tup_code = tup_code * uniq.size + np.searchsorted(uniq, np.asarray(declared, uniq.dtype))
    return np.where(ok, _lookup(tup_code, code, ok), -1)


def value_matrix(table, columns) -> np.ndarray:
    """``(events, V)`` float64 of the value columns as Spark's ``try_cast(x AS DOUBLE)`` (NaN for a null
    or malformed value; booleans 1.0 and 0.0)."""
    import pyarrow as pa

    out = np.empty((table.num_rows, len(columns)), np.float64)
    for j, c in enumerate(columns):
        arr = _column(table, c)
        t = arr.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            import pandas as pd

            s = pd.Series(arr.to_pandas(), dtype=object).str.strip()
            out[:, j] = pd.to_numeric(s, errors="coerce").to_numpy(np.float64, na_value=np.nan)
        else:
            out[:, j] = arr.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    return out


def group_people(person) -> tuple[np.ndarray, np.ndarray]:
    """``(person code of each event, Spark's xxhash64 of each person)``: people numbered in order of
    first appearance, the null person (if any) last."""
    import pyarrow as pa

    from sparkpriv.local.spark_hash import SPARK_SEED, xxhash64

    enc = person.dictionary_encode() if not pa.types.is_dictionary(person.type) else person
    codes = enc.indices.cast(pa.int64()).fill_null(len(enc.dictionary)).to_numpy(zero_copy_only=False)
    ph = xxhash64(enc.dictionary)
    if person.null_count:
        ph = np.append(ph, np.int64(SPARK_SEED))  # Spark: the null person's hash is the seed
    return np.asarray(codes, np.int64), ph


def _check(table, spec) -> None:
    import pyarrow as pa

    names = table.column_names
    for role, cols in (("person", [spec.person]), ("key", list(spec.by)), ("value", list(spec.values))):
        for c in cols:
            if c not in names:
                raise SchemaError(f"The {role} column {c!r} is not in the event table. Available columns: "
                                  f"{', '.join(names)}.")
    for c in spec.values:
        t = table.schema.field(c).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
                or pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise SchemaError(f"The value column {c!r} has type {t}; give a numeric column (numbers in a string "
                              "column are read too).")


@dataclass
class LocalEvents:
    """An in-memory event table grouped by person for an aggregates release (kind ``"events"``).

    Nothing is read when it is made (:func:`open_events`): the grouping is computed on the first pass.
    """

    table: Any = field(repr=False)
    spec: Any
    kind: str = "events"
    _grouped: Any = field(default=None, repr=False)

    source_df = None  # no Spark input

    @property
    def facts(self) -> InputFacts:
        d = self.spec.domain.size if self.spec.domain is not None else 0
        return InputFacts("events", d, tuple(self.spec.values), names=tuple(self.table.column_names))

    def public_params(self) -> dict:
        return self.spec.public_params()

    def input_info(self, source: str | None) -> dict:
        return self.spec.input_info(source or "in-memory event table")

    def diagnostics(self) -> dict:
        return {}

    def _group(self):
        """``(event order, person offsets, keys, values, person hashes, dropped per person, key ids of
        events (private keys) or None)``, computed once."""
        if self._grouped is not None:
            return self._grouped
        from sparkpriv.local.spark_hash import xxhash64_columns

        t, spec = self.table, self.spec
        if spec.domain is not None:
            keys = key_index(t, spec.domain)
            present = keys >= 0
        else:
            cols = [_column(t, c) for c in spec.by]
            present = np.ones(t.num_rows, bool)
            for c in cols:
                if c.null_count:
                    present &= np.asarray(c.is_valid().to_numpy(zero_copy_only=False), bool)
            keys = xxhash64_columns(cols) if cols and t.num_rows else np.zeros(t.num_rows, np.int64)
        code, ph = group_people(_column(t, spec.person))
        n_people = ph.size
        order = np.argsort(code, kind="stable")
        kept = order[present[order]]  # each person's in-domain events, people in code order
        off = np.zeros(n_people + 1, np.int64)
        np.cumsum(np.bincount(code[kept], minlength=n_people), out=off[1:])
        dropped = np.bincount(code[~present], minlength=n_people).astype(np.int64)
        values = value_matrix(t, spec.values)[kept] if spec.values else np.zeros((kept.size, 0))
        self._grouped = (off, keys[kept], values, ph, dropped, present, keys)
        return self._grouped

    def blocks(self, block_people: int = BLOCK_PEOPLE):
        """:class:`EventRows` blocks of at most ``block_people`` whole people."""
        off, keys, values, ph, dropped, _, _ = self._group()
        n = ph.size
        for s in range(0, n, block_people):
            e = min(n, s + block_people)
            a, b = off[s], off[e]
            yield EventRows(off[s:e + 1] - a, keys[a:b], values[a:b], ph[s:e], dropped=int(dropped[s:e].sum()))

    def key_values(self, ids: np.ndarray) -> list:
        """The key columns' values (Arrow arrays) of the private key ids ``ids``: the first event's
        values with that id (Spark's ``first``)."""
        import pyarrow as pa

        _, _, _, _, _, present, keys = self._group()
        rows = np.flatnonzero(present)
        kid = keys[rows]
        order = np.argsort(kid, kind="stable")
        skid = kid[order]
        pos = np.searchsorted(skid, ids)
        first = rows[order[pos]]
        take = pa.array(first)
        return [_column(self.table, c).take(take) for c in self.spec.by]


def open_events(data, spec, caller: str) -> LocalEvents:
    """The in-memory event table of an aggregates release: columns and types checked, no value read."""
    if not hasattr(spec, "person"):
        raise ParameterError(f"{caller}: an event table needs its person, key and value columns.")
    table = _table(data, caller)
    _check(table, spec)
    if spec.domain is not None:  # the key columns' types against the declared ids (schema only)
        import pyarrow as pa

        if spec.domain.vocabularies is not None:
            for c, v in zip(spec.domain.columns, spec.domain.vocabularies):
                t = table.schema.field(c).type
                t = t.value_type if pa.types.is_dictionary(t) else t
                if v.integer_ids and not (pa.types.is_integer(t) or pa.types.is_string(t)
                                          or pa.types.is_large_string(t)):
                    raise SchemaError(f"The key column {c!r} has type {t}; its declared values are integers: give "
                                      "an integer (or string) column.")
    return LocalEvents(table, spec)
