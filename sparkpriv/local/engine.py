"""The local engine (layer 1): the engine interface over data held in memory.

It runs a mechanism's per-block functions (:mod:`sparkpriv.mechanisms.protocol`)
over blocks of at most ``block_rows`` rows of a numpy array, a pandas
DataFrame or a pyarrow Table, in this process. The arithmetic is the same
numpy the Spark engine runs in its tasks, so a release made here and one made
on Spark from the same rows differ only by floating-point summation order and
the noise draws. Output tables are pyarrow Tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from sparkpriv.errors import InputError, ParameterError, SchemaError
from sparkpriv.mechanisms.protocol import InputFacts, SparseRows, TableRows

__all__ = ["LocalEngine", "LocalSource", "accepts", "coerce_classes", "label_codes", "sql_type_name"]

BLOCK_ROWS = 65_536
# private keys (aggregates' key selection): the keys are spread over this PUBLIC number of partitions
# by Spark's hash partitioning of the key id, each with its own noise stream, as the Spark engine does
# over spark.sql.shuffle.partitions (whose default this is): with the same number and the same secret
# seed both engines release the same values
KEY_PARTITIONS = 200


def accepts(data: Any) -> bool:
    """True for the in-memory inputs this engine takes."""
    if isinstance(data, (np.ndarray, list)):
        return True
    from sparkpriv.local.records import LocalRecords

    if isinstance(data, LocalRecords):
        return True
    mod = type(data).__module__
    return mod.startswith("pandas.") or mod.startswith("pyarrow.")


class _Counter:
    def __init__(self) -> None:
        self.value = 0

    def add(self, v) -> None:
        self.value += int(v)


@dataclass
class LocalSource:
    """In-memory rows and their public description (schema only; values are read per block).

    ``data`` is a 2-D numpy array or a pyarrow Table (pandas is converted);
    :meth:`blocks` yields float64 ``(rows, d)`` blocks, replacing nulls, NaN and
    infinities with the public ``fill`` (0.0 when none; counted for the owner), as
    the Spark engine's :func:`~sparkpriv.spark.batches.batch_matrix` does inside
    its tasks. With ``missing`` they are marked in the null mask instead.
    """

    data: Any = field(repr=False)
    columns: tuple
    kind: str = "table"
    fill: float | None = None
    labels: tuple | None = None  # (label column, declared classes coerced to its type)
    missing: bool = False  # blocks are TableRows with the null mask (nulls 0.0)
    keep: tuple = ()
    replaced: "_Counter" = field(default_factory=lambda: _Counter(), repr=False)  # nulls, NaN, inf replaced
    _counted: set = field(default_factory=set, repr=False)  # blocks whose replacements were counted
    source_df = None  # no Spark input to check for emptiness

    @property
    def facts(self) -> InputFacts:
        names = () if isinstance(self.data, np.ndarray) else tuple(self.data.column_names)
        return InputFacts("table", len(self.columns), self.columns, integer_columns=self.integer_columns,
                          classes=self.labels[1] if self.labels else (), names=names, types=self.types)

    @property
    def types(self) -> tuple:
        """The SQL type name of each declared column (``InputFacts.types``): the schema only."""
        if isinstance(self.data, np.ndarray):
            return (sql_type_name(self.data.dtype),) * len(self.columns)
        return tuple(sql_type_name(self.data.schema.field(c).type) for c in self.columns)

    @property
    def integer_columns(self) -> tuple:
        if isinstance(self.data, np.ndarray):
            ints = np.issubdtype(self.data.dtype, np.integer) or self.data.dtype == bool
            return tuple(range(len(self.columns))) if ints else ()
        import pyarrow as pa

        return tuple(j for j, c in enumerate(self.columns) if pa.types.is_integer(self.data.schema.field(c).type))

    def public_params(self) -> dict:
        return {"columns": list(self.columns)}

    def input_info(self, source: str | None) -> dict:
        info = {"source": source or "in-memory data", "columns": list(self.columns), "fill_for_nulls": self.fill,
                "missing_values": missing_values_rule(self.fill, self.missing)}
        if self.labels is not None:
            info["label"] = self.labels[0]
        if self.keep:
            info["kept_public_columns"] = list(self.keep)
        return info

    def diagnostics(self) -> dict:
        return {"missing_values_replaced": self.replaced.value} if self.replaced.value else {}

    @property
    def rows(self) -> int:
        return int(self.data.shape[0]) if isinstance(self.data, np.ndarray) else self.data.num_rows

    def blocks(self, block_rows: int = BLOCK_ROWS):
        for i in range(0, self.rows, block_rows):
            yield self._block(i, block_rows)
            self._counted.add((i, block_rows))  # a block's replacements are counted on its first read

    def _count(self, start: int, size: int, n: int) -> None:
        if (start, size) not in self._counted:
            self.replaced.add(n)

    def _block(self, start: int, size: int):
        if self.labels is None and not self.missing:
            return self._matrix(start, size)
        if isinstance(self.data, np.ndarray):  # no label column in a numpy array (open refuses labels)
            X = np.array(self.data[start:start + size], dtype=np.float64)
            miss = ~np.isfinite(X)  # NaN and infinities are missing values (docs/privacy.md, "Failures")
            self._count(start, size, int(miss.sum()))
            if self.missing:
                X[miss] = 0.0
                return TableRows(X, None, miss)
            return TableRows(_filled(X, miss, self.fill), None, None)
        import pyarrow as pa

        part = self.data.slice(start, size)
        X = np.empty((part.num_rows, len(self.columns)), dtype=np.float64)
        miss = np.zeros(X.shape, dtype=bool)
        for j, c in enumerate(self.columns):
            arr = part.column(c)
            if arr.null_count:
                miss[:, j] = arr.is_null().to_numpy(zero_copy_only=False)
                arr = arr.cast(pa.float64()).fill_null(0.0)
            X[:, j] = arr.to_numpy().astype(np.float64)
        miss |= ~np.isfinite(X)
        self._count(start, size, int(miss.sum()))
        X[miss] = 0.0
        codes = None
        if self.labels is not None:
            col, classes = self.labels
            codes = label_codes(part.column(col), classes, col, InputError)
        if self.missing:
            return TableRows(X, codes, miss)
        return TableRows(_filled(X, miss, self.fill), codes, None)

    def _matrix(self, start: int, size: int) -> np.ndarray:
        if isinstance(self.data, np.ndarray):
            X = self.data[start:start + size]
            if X.dtype == np.float64 and np.isfinite(X).all():
                X = X.view()  # no copy of the user's rows: a read-only view of them
                X.flags.writeable = False
                return X
            X = np.array(X, dtype=np.float64)
            bad = ~np.isfinite(X)
            self._count(start, size, int(bad.sum()))
            return _filled(X, bad, self.fill)
        import pyarrow as pa

        part = self.data.slice(start, size)
        out = np.empty((part.num_rows, len(self.columns)), dtype=np.float64)
        for j, c in enumerate(self.columns):
            arr = part.column(c)
            if arr.null_count:
                arr = arr.cast(pa.float64())  # nulls read as NaN, replaced below with the others
                arr = arr.fill_null(float("nan"))
            out[:, j] = arr.to_numpy().astype(np.float64)
        bad = ~np.isfinite(out)
        self._count(start, size, int(bad.sum()))
        return _filled(out, bad, self.fill)


def missing_values_rule(fill, missing: bool) -> str:
    """The public rule for nulls, NaN and infinities, as receipts state it."""
    if missing:
        return "nulls, NaN and infinite values are missing values, filled by the mechanism (fill)"
    if fill is not None and np.size(fill) > 8:  # a long vector is in the receipt once, as input.fill_for_nulls
        f = f"their column's value of input.fill_for_nulls ({np.size(fill)} values)"
    else:
        f = "0.0" if fill is None else repr(fill if np.ndim(fill) == 0 else [float(v) for v in np.ravel(fill)])
    return f"nulls, NaN and infinite values are replaced by {f} before clipping (a public rule; never an error)"


def fill_vector(fill, d: int) -> np.ndarray:
    """The ``(d,)`` public replacement of nulls, NaN and infinities: the declared or the
    mechanism's ``fill`` (one value, or one per column), 0.0 where none is given."""
    if fill is None:
        return np.zeros(d)
    f = np.asarray(fill, dtype=np.float64).reshape(-1)
    if f.size not in (1, d) or not np.isfinite(f).all():
        raise ParameterError(f"The fill for missing values must be one finite number or one per column ({d}). "
                             f"Got {fill!r}.")
    return np.array(np.broadcast_to(f, (d,)), dtype=np.float64)


def _filled(X: np.ndarray, bad: np.ndarray, fill) -> np.ndarray:
    """``X`` with the entries marked ``bad`` (nulls, NaN, infinities) replaced by the public fill.

    A public rule applied to every record alike: no value of the data makes a release fail or
    changes its cost (docs/privacy.md, "Failures"); the replacements are counted for the owner.
    """
    if bad.any():
        X[bad] = np.broadcast_to(fill_vector(fill, X.shape[1]), X.shape)[bad]
    return X


_SQL_INTS = {1: "tinyint", 2: "smallint", 4: "int", 8: "bigint"}


def sql_type_name(t) -> str:
    """Spark's simple string of the type a numpy dtype or an Arrow type reads as (``int``,
    ``bigint``, ``boolean``, ``double``, ...; unsigned integers: the signed type that holds them,
    ``bigint`` at most; ``float16``: ``float``), as ``InputFacts.types`` states it."""
    import pyarrow as pa

    if isinstance(t, pa.DataType):
        if pa.types.is_boolean(t):
            return "boolean"
        if pa.types.is_integer(t):
            width = t.bit_width // 8
            return _SQL_INTS[min(8, 2 * width if pa.types.is_unsigned_integer(t) else width)]
        if pa.types.is_floating(t):
            return "double" if pa.types.is_float64(t) else "float"
        if pa.types.is_decimal(t):
            return f"decimal({t.precision},{t.scale})"
        return str(t)
    dt = np.dtype(t)
    if dt == bool:
        return "boolean"
    if np.issubdtype(dt, np.signedinteger):
        return _SQL_INTS[dt.itemsize]
    if np.issubdtype(dt, np.unsignedinteger):
        return _SQL_INTS[min(8, 2 * dt.itemsize)]
    if np.issubdtype(dt, np.floating):
        return "double" if dt.itemsize >= 8 else "float"
    return str(dt)


def _type_kind(t) -> str:
    """``integer``, ``fractional``, ``string``, ``boolean`` or ``other`` for an Arrow type."""
    import pyarrow as pa

    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "fractional"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_boolean(t):
        return "boolean"
    return "other"


def coerce_classes(classes, kind: str, column: str, type_name: str) -> tuple:
    """The declared ``classes`` as values of the label column's type (``kind`` from the schema).

    Public parameters and the schema only: ``--classes 0,1`` against an
    integer column gives ``(0, 1)``. A mismatch is a ParameterError naming the
    column; a label column of another type is a SchemaError.
    """
    if kind == "other":
        raise SchemaError(f"The label column {column!r} has type {type_name}; use an integer, string or "
                          "boolean label column.")
    try:
        if kind == "integer":
            out = []
            for c in classes:
                f = float(c)
                if not f.is_integer():
                    raise ValueError
                out.append(int(f))
        elif kind == "fractional":
            out = [float(c) for c in classes]
        elif kind == "string":
            out = [str(c) for c in classes]
        else:
            out = [c if isinstance(c, bool) else str(c).lower() in ("true", "1") for c in classes]
    except (TypeError, ValueError):
        raise ParameterError(
            f"The declared classes {list(classes)!r} do not match the type {type_name} of the label "
            f"column {column!r}."
        ) from None
    return tuple(out)


def label_codes(col, classes: tuple, label: str, error) -> np.ndarray:
    """The class index (int64) of each value of the Arrow array ``col`` of the label column.

    A null or a value that is not a declared class raises ``error(message)``
    naming the column (values of the data are never in the message, except
    the first undeclared one, which the data owner needs to fix the call).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if col.null_count:
        raise error(f"the label column {label!r} has null values; remove those rows or give them a class")
    idx = pc.index_in(col, value_set=pa.array(list(classes)).cast(col.type))
    if idx.null_count:
        bad = col.filter(pc.is_null(idx))[0].as_py()
        raise error(f"the label column {label!r} holds a value that is not a declared class "
                    f"(e.g. {bad!r}); declare every class (classes / --classes)")
    return idx.to_numpy(zero_copy_only=False).astype(np.int64)


def _open(data, columns, caller) -> tuple[Any, tuple]:
    """Check the schema (shape, types, names) only: no value is read here."""
    if isinstance(data, (np.ndarray, list)):
        X = np.asarray(data)
        if X.ndim != 2:
            raise ParameterError(f"X must be a 2-D array (n_samples, n_features). Got shape {X.shape}.")
        if not (np.issubdtype(X.dtype, np.number) or X.dtype == bool) or np.iscomplexobj(X):
            raise InputError(f"X must be real and numeric. Got dtype {X.dtype}: release the real and imaginary "
                             "parts as separate columns if both are meant.")
        names = tuple(columns) if columns is not None else tuple(f"x{j}" for j in range(X.shape[1]))
        if len(names) != X.shape[1]:
            raise ParameterError(f"The 'columns' parameter of {caller} names {len(names)} columns; X has "
                                 f"{X.shape[1]}.")
        return X, names
    import pyarrow as pa

    if type(data).__module__.startswith("pandas."):
        data = pa.Table.from_pandas(data, preserve_index=False)
    if columns is None:
        raise ParameterError(f"The 'columns' parameter of {caller} is required for a table input: the "
                             "numeric feature columns.")
    for c in columns:
        if c not in data.column_names:
            raise ParameterError(f"Column {c!r} is not in the input table. Columns: "
                                 f"{', '.join(data.column_names)}.")
        t = data.schema.field(c).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                or pa.types.is_decimal(t)):
            raise ParameterError(f"The feature column {c!r} has type {t}, not a number: cast it or "
                                 "leave it out of columns.")
    return data, tuple(columns)


def _as_type(v: np.ndarray, t):
    """Float64 values as an Arrow array of the input column's type: integer and float types
    kept (integer values are already rounded), others double."""
    import pyarrow as pa

    if pa.types.is_integer(t):
        return pa.array(v.astype(np.int64)).cast(t)
    if pa.types.is_float32(t):
        return pa.array(v).cast(t)
    return pa.array(v, pa.float64())


class _Cache:
    def __init__(self, blocks: list):
        self.blocks = blocks  # (rows, dim) float64 matrices, or SparseRows (``cache(..., sparse=True)``)
        self.rows = int(sum(b.n if isinstance(b, SparseRows) else b.shape[0] for b in blocks))

    def aggregate(self, fn: Callable[[np.ndarray], np.ndarray], size: int) -> np.ndarray:
        acc = np.zeros(size, dtype=np.float64)
        for Z in self.blocks:
            acc += fn(Z)
        return acc

    def release(self) -> None:
        self.blocks = []


class _Indexed:
    def __init__(self, source: LocalSource, block_rows: int):
        self.source, self.block_rows, self.rows = source, block_rows, source.rows

    def aggregate(self, fn, size: int) -> np.ndarray:
        acc = np.zeros(size, dtype=np.float64)
        start = 0
        for X in self.source.blocks(self.block_rows):
            acc += fn(X, start)
            start += X.shape[0]
        return acc


class LocalEngine:
    """The engine interface (docs/architecture.md) over data in memory."""

    name = "local"

    def __init__(self, block_rows: int = BLOCK_ROWS, key_partitions: int = KEY_PARTITIONS):
        self.block_rows = int(block_rows)
        if not isinstance(key_partitions, int) or isinstance(key_partitions, bool) or key_partitions < 1:
            raise ParameterError(f"The 'key_partitions' parameter of LocalEngine must be a positive integer. Got "
                                 f"{key_partitions!r}.")
        self.key_partitions = key_partitions

    def open(self, data, *, columns: Sequence[str] | None, fill: float | None, caller: str,
             labels: tuple | None = None, missing: bool = False, keep: Sequence[str] = (), events=None):
        """A source (schema checked, no value read).

        ``labels=(column, classes)``: blocks are :class:`TableRows` with the
        class code of each row (the classes coerced to the column's type, in
        ``facts.classes``). ``missing=True``: blocks are :class:`TableRows`
        with the null mask (nulls read as 0.0) instead of nulls filled or
        refused. ``keep``: columns a row-level output copies (checked present).
        ``events``: an :class:`~sparkpriv.mechanisms.aggregates.EventSpec`: the table is an event
        table, grouped by person into :class:`~sparkpriv.mechanisms.protocol.EventRows` blocks
        (:mod:`sparkpriv.local.events`).
        """
        from sparkpriv.local.records import LocalRecords

        if events is not None:
            from sparkpriv.local.events import open_events

            if isinstance(data, (LocalRecords, np.ndarray, list)):
                raise ParameterError(f"{caller} takes the event table itself (a pandas DataFrame or pyarrow Table "
                                     f"of events), not {type(data).__name__}.")
            return open_events(data, events, caller)
        if isinstance(data, LocalRecords):  # bounded person records in memory (sparkpriv.local.records)
            return data
        data, names = _open(data, columns, caller)
        if (labels is not None or keep) and isinstance(data, np.ndarray):
            what = "a label column" if labels is not None else "kept columns (keep_columns)"
            raise ParameterError(f"{caller}: {what} need a pandas or Arrow table input (a numpy array has no "
                                 "other columns).")
        for c in keep:
            if c not in data.column_names:
                raise ParameterError(f"The kept (public) column {c!r} is not in the input table. Columns: "
                                     f"{', '.join(data.column_names)}.")
        if labels is not None:
            col, classes = labels
            if col not in data.column_names:
                raise ParameterError(f"The label column {col!r} is not in the input table. Columns: "
                                     f"{', '.join(data.column_names)}.")
            t = data.schema.field(col).type
            labels = (col, coerce_classes(classes, _type_kind(t), col, str(t)))
        return LocalSource(data, names, fill=fill, labels=labels, missing=missing, keep=tuple(keep))

    def counters(self, names: Sequence[str]) -> list:
        return [_Counter() for _ in names]

    def aggregate(self, source: LocalSource, fn, size: int, *, count: bool = False) -> np.ndarray:
        acc = np.zeros(size, dtype=np.float64)
        blocks = source.blocks(self.block_rows, count=count) if source.kind == "records" else \
            source.blocks(self.block_rows)  # events: blocks of whole people
        for X in blocks:
            acc += fn(X)
        return acc

    def index(self, source: LocalSource) -> "_Indexed":
        """Rows numbered in table order (the Spark engine's ``index``): ``.rows`` and
        ``.aggregate(fn, size)`` summing ``fn(block, start)``."""
        return _Indexed(source, self.block_rows)

    def cache(self, source: LocalSource, fn, dim: int, *, sparse: bool = False) -> _Cache:
        """``fn(block)`` of every block, kept for every pass: ``(rows, dim)`` float64 matrices, or
        with ``sparse`` the :class:`SparseRows` blocks ``fn`` returns (event records, as they are)."""
        if sparse:
            return _Cache([fn(X) for X in source.blocks(self.block_rows)])
        return _Cache([np.ascontiguousarray(fn(X), dtype=np.float64) for X in source.blocks(self.block_rows)])

    def train_groups(self, source: LocalSource, group_fn, train_fn, k: int, dim: int, width: int, *,
                     on_train=None, what: str = "training", order=None) -> np.ndarray:
        """``(k, dim)``: row ``j`` is ``train_fn(j, rows of group j)`` (the Spark engine's ``train_groups``).
        ``order`` (the Spark engine's task order) changes nothing here: each group's result
        depends on its own rows and streams only.

        ``group_fn(block) -> (groups, rows)`` gives each row's group in ``[0, k)`` and the
        ``(n, width)`` rows to train on; group ``j`` gets its rows in source order (an empty
        ``(0, width)`` matrix when it has none). Only the ``k`` vectors are returned.
        ``on_train(j, t, steps)``: the groups train here, one after another, so
        ``train_fn(j, rows, report=...)`` is given a ``report(t, steps)`` that calls it
        (progress; ``what`` names the pass on the Spark engine).
        """
        groups, rows = [], []
        for block in source.blocks(self.block_rows):
            g, X = group_fn(block)
            groups.append(np.asarray(g, dtype=np.int64))
            rows.append(X if isinstance(X, SparseRows) else np.asarray(X, dtype=np.float64).reshape(-1, width))
        g = np.concatenate(groups) if groups else np.zeros(0, np.int64)
        sparse = bool(rows) and isinstance(rows[0], SparseRows)
        if sparse:  # event records: one CSR matrix; a group trains on its rows of it
            from sparkpriv.mechanisms.sparse import stack_csr

            X = stack_csr(rows, width)
        else:
            X = np.concatenate(rows) if rows else np.zeros((0, width))
        out = np.zeros((int(k), int(dim)))
        for j in range(int(k)):
            rows_j = X[g == j] if sparse else np.ascontiguousarray(X[g == j])
            if on_train is None:
                out[j] = train_fn(j, rows_j)
            else:
                out[j] = train_fn(j, rows_j, report=lambda t, steps, j=j: on_train(j, t, steps))
        return out

    def map_rows(self, source: LocalSource, row_map, columns: Sequence[tuple], *, keep: Sequence[str] = (),
                 count: bool = True):
        """A row-level output (the Spark engine's ``map_rows``): the whole input is partition 0.

        ``keep`` copies declared public input columns (Arrow inputs only).
        Column type ``"as-input"``: the type of the input column of that name
        (integer and float types kept, others double); ``"label"``: the row
        map gives class codes, the output holds the declared classes in the
        label column's type. Returns ``(table, None)``.
        """
        import pyarrow as pa

        keep = list(keep)
        if keep and isinstance(source.data, np.ndarray):
            raise ParameterError("keep_columns needs a pandas or Arrow table input (a numpy array has no "
                                 "other columns to keep).")
        outs = [list(cols) for cols in row_map(0, source.blocks(self.block_rows))]
        types = self._types()
        out = {c: source.data.column(c) for c in keep}
        for j, (name, t, _) in enumerate(columns):
            pieces = [o[j] for o in outs]
            if pieces and isinstance(pieces[0], pa.Array):
                out[name] = pa.concat_arrays(pieces)
            elif t == "label":
                col, classes = source.labels
                codes = np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, np.int64)
                out[name] = pa.array(list(classes)).cast(source.data.schema.field(col).type).take(pa.array(codes))
            elif t == "as-input":
                v = np.concatenate(pieces) if pieces else np.zeros(0)
                out[name] = pa.array(v, pa.float64()) if isinstance(source.data, np.ndarray) else \
                    _as_type(v, source.data.schema.field(name).type)
            else:
                out[name] = pa.array(np.concatenate(pieces) if pieces else np.zeros(0), types[t])
        return pa.table(out), None

    @staticmethod
    def _types():
        import pyarrow as pa

        return {"int": pa.int32(), "long": pa.int64(), "double": pa.float64(), "bool": pa.bool_(),
                "array<double>": pa.list_(pa.float64()), "array<int>": pa.list_(pa.int32()),
                "string": pa.string()}

    def key_table(self, source, partial_fn, width: int, finish_fn, columns: Sequence[tuple]):
        """A table over keys found in the data (private key selection; an ``events`` source), as the
        Spark engine's ``key_table`` builds it: ``partial_fn(block) -> (key ids (u,), totals (u, width))``
        per block of people, summed per key id; the keys spread over :attr:`key_partitions` (PUBLIC)
        partitions by Spark's hash partitioning of the key id, each partition's keys in key-id order;
        ``finish_fn(pid, totals (k, width)) -> (released (k,) bool, columns of the released keys)`` once
        per partition that has keys (its noise stream opened from ``pid``). ``columns``: the output
        columns after the key columns, ``(name, type)``. Returns a pyarrow Table (partitions in order)."""
        import pyarrow as pa

        from sparkpriv.local.spark_hash import spark_partition

        if source.kind != "events":
            raise TypeError("key_table needs an event table source")
        W = int(width)
        ids, tots = [], []
        for block in source.blocks(self.block_rows):
            i, t = partial_fn(block)
            if len(i):
                ids.append(np.asarray(i, np.int64))
                tots.append(np.asarray(t, np.float64).reshape(-1, W))
        types = self._types()
        key_fields = [source.table.schema.field(c) for c in source.spec.by]
        fields = [pa.field(f.name, f.type, True) for f in key_fields] + \
            [pa.field(n, types[t], False) for n, t in columns]
        if not ids:
            return pa.table([pa.array([], f.type) for f in fields], schema=pa.schema(fields))
        kid = np.concatenate(ids)
        tot = np.concatenate(tots)
        uniq, inv = np.unique(kid, return_inverse=True)
        inv = inv.reshape(-1)
        totals = np.column_stack([np.bincount(inv, weights=tot[:, j], minlength=uniq.size) for j in range(W)]) \
            if W else np.zeros((uniq.size, 0))
        pid = spark_partition(uniq, self.key_partitions)
        order = np.lexsort((uniq, pid))
        uniq, pid, totals = uniq[order], pid[order], totals[order]
        cuts = np.flatnonzero(np.diff(pid)) + 1
        released, outs = [], []
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, pid.size]):
            keep, cols = finish_fn(int(pid[lo]), totals[lo:hi])
            keep = np.asarray(keep, bool)
            released.append(uniq[lo:hi][keep])
            outs.append([np.asarray(v, np.float64) for v in cols])
        rel = np.concatenate(released)
        arrays = [k.cast(f.type) for k, f in zip(source.key_values(rel), key_fields)]
        arrays += [pa.array(np.concatenate([o[j] for o in outs]), types[t]) for j, (_, t) in enumerate(columns)]
        return pa.table(arrays, schema=pa.schema(fields))

    def key_blocks(self, source, block_fn, d: int, block: int, columns: Sequence[tuple]):
        """A table over the PUBLIC index domain ``0..d-1`` of bounded event records (the Spark engine's
        ``key_blocks``): the records' per-index totals, ``block_fn(b, totals)`` once per block ``b`` of
        ``block`` consecutive indices (int64 totals, zeros where no record reaches; it opens its noise
        stream from ``b``), the blocks' columns one after another. ``columns``: ``(name, type)``."""
        import pyarrow as pa

        if source.kind != "records":
            raise TypeError("key_blocks needs bounded event records")
        idx, vals = [], []
        for X in source.blocks(self.block_rows, count=True):
            i = np.asarray(X.indices, np.int64)
            idx.append(i)
            vals.append(np.ones(i.size, np.int64) if X.values is None
                        else np.rint(np.asarray(X.values, np.float64)).astype(np.int64))
        i = np.concatenate(idx) if idx else np.zeros(0, np.int64)
        v = np.concatenate(vals) if vals else np.zeros(0, np.int64)
        uniq, inv = np.unique(i, return_inverse=True)
        sums = np.zeros(uniq.size, np.int64)
        np.add.at(sums, inv.reshape(-1), v)
        d, block = int(d), int(block)
        types = self._types()
        outs = [[] for _ in columns]
        for b in range(-(-d // block)):
            start = b * block
            dense = np.zeros(min(block, d - start), np.int64)
            lo, hi = np.searchsorted(uniq, [start, start + dense.size])
            dense[uniq[lo:hi] - start] = sums[lo:hi]
            for j, c in enumerate(block_fn(b, dense)):
                outs[j].append(np.asarray(c))
        return pa.table({n: pa.array(np.concatenate(o) if o else np.zeros(0), types[t])
                         for (n, t), o in zip(columns, outs)})

    def columns_table(self, columns: Sequence[tuple]):
        """A pyarrow Table from ``(name, type, values)`` numpy columns (the Spark engine's ``columns_table``)."""
        import pyarrow as pa

        types = self._types()
        return pa.table({n: pa.array(np.asarray(v), types[t]) for n, t, v in columns})

    def table(self, rows: list[tuple], schema: Sequence[tuple]):
        import pyarrow as pa

        types = self._types()
        fields = [pa.field(name, types[t], nullable) for name, t, nullable in schema]
        cols = list(zip(*rows)) if rows else [[] for _ in fields]
        return pa.table([pa.array(list(c), f.type) for c, f in zip(cols, fields)], schema=pa.schema(fields))

    @staticmethod
    def schema_of(table) -> list[dict]:
        return [{"name": f.name, "type": str(f.type)} for f in table.schema]
