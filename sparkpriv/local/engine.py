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

from sparkpriv.errors import InputError, ParameterError
from sparkpriv.mechanisms.protocol import InputFacts

__all__ = ["LocalEngine", "LocalSource", "accepts"]

BLOCK_ROWS = 65_536


def accepts(data: Any) -> bool:
    """True for the in-memory inputs this engine takes."""
    if isinstance(data, (np.ndarray, list)):
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
    :meth:`blocks` yields float64 ``(rows, d)`` blocks, filling nulls/NaN with
    ``fill`` or refusing them naming the column, as the Spark engine's
    :func:`~sparkpriv.spark.batches.batch_matrix` does inside its tasks.
    """

    data: Any = field(repr=False)
    columns: tuple
    kind: str = "table"
    fill: float | None = None
    source_df = None  # no Spark input to check for emptiness

    @property
    def facts(self) -> InputFacts:
        names = () if isinstance(self.data, np.ndarray) else tuple(self.data.column_names)
        return InputFacts("table", len(self.columns), self.columns, names=names)

    def public_params(self) -> dict:
        return {"columns": list(self.columns)}

    def input_info(self, source: str | None) -> dict:
        return {"source": source or "in-memory data", "columns": list(self.columns),
                "fill_for_nulls": self.fill}

    def diagnostics(self) -> dict:
        return {}

    @property
    def rows(self) -> int:
        return int(self.data.shape[0]) if isinstance(self.data, np.ndarray) else self.data.num_rows

    def blocks(self, block_rows: int = BLOCK_ROWS):
        for i in range(0, self.rows, block_rows):
            yield self._block(i, block_rows)

    def _block(self, start: int, size: int) -> np.ndarray:
        fill = self.fill
        if isinstance(self.data, np.ndarray):
            X = self.data[start:start + size]
            if X.dtype == np.float64 and (fill is None or not np.isnan(X).any()):
                X = X.view()  # no copy of the user's rows: a read-only view of them
                X.flags.writeable = False
            else:
                X = np.array(X, dtype=np.float64)
                if fill is not None:
                    X[np.isnan(X)] = fill
            bad = np.flatnonzero(~np.isfinite(X).all(axis=0))
            if bad.size:
                j = int(bad[0])
                raise InputError(f"column {self.columns[j]!r} (index {j}) has NaN or infinite values; "
                                 "declare a public fill value for NaN (fill=...), or remove them")
            return X
        import pyarrow as pa

        part = self.data.slice(start, size)
        out = np.empty((part.num_rows, len(self.columns)), dtype=np.float64)
        for j, c in enumerate(self.columns):
            arr = part.column(c)
            if arr.null_count:
                if fill is None:
                    raise InputError(f"column {c!r} has null values; declare a public fill value "
                                     "(fill=...) or remove them before the release")
                arr = arr.cast(pa.float64()).fill_null(float(fill))
            out[:, j] = arr.to_numpy().astype(np.float64) if isinstance(arr, pa.Array) else \
                arr.to_numpy().astype(np.float64)
            if not np.isfinite(out[:, j]).all():
                raise InputError(f"column {c!r} has NaN or infinite values; they have no place in a "
                                 "bounded domain: remove or replace them")
        return out


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


class _Cache:
    def __init__(self, blocks: list[np.ndarray]):
        self.blocks = blocks
        self.rows = int(sum(b.shape[0] for b in blocks))

    def aggregate(self, fn: Callable[[np.ndarray], np.ndarray], size: int) -> np.ndarray:
        acc = np.zeros(size, dtype=np.float64)
        for Z in self.blocks:
            acc += fn(Z)
        return acc

    def release(self) -> None:
        self.blocks = []


class LocalEngine:
    """The engine interface (docs/architecture.md) over data in memory."""

    name = "local"

    def __init__(self, block_rows: int = BLOCK_ROWS):
        self.block_rows = int(block_rows)

    def open(self, data, *, columns: Sequence[str] | None, fill: float | None, caller: str) -> LocalSource:
        data, names = _open(data, columns, caller)
        return LocalSource(data, names, fill=fill)

    def counters(self, names: Sequence[str]) -> list:
        return [_Counter() for _ in names]

    def aggregate(self, source: LocalSource, fn, size: int) -> np.ndarray:
        acc = np.zeros(size, dtype=np.float64)
        for X in source.blocks(self.block_rows):
            acc += fn(X)
        return acc

    def cache(self, source: LocalSource, fn, dim: int) -> _Cache:
        return _Cache([np.ascontiguousarray(fn(X), dtype=np.float64) for X in source.blocks(self.block_rows)])

    def map_rows(self, source: LocalSource, row_map, columns: Sequence[tuple], *, keep: Sequence[str] = ()):
        """A row-level output (the Spark engine's ``map_rows``): the whole input is partition 0.

        ``keep`` copies declared public input columns (Arrow inputs only).
        Returns ``(table, None)``.
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
            else:
                out[name] = pa.array(np.concatenate(pieces) if pieces else np.zeros(0), types[t])
        return pa.table(out), None

    @staticmethod
    def _types():
        import pyarrow as pa

        return {"int": pa.int32(), "long": pa.int64(), "double": pa.float64(), "bool": pa.bool_(),
                "array<double>": pa.list_(pa.float64()), "array<int>": pa.list_(pa.int32()),
                "string": pa.string()}

    def table(self, rows: list[tuple], schema: Sequence[tuple]):
        import pyarrow as pa

        types = self._types()
        fields = [pa.field(name, types[t], nullable) for name, t, nullable in schema]
        cols = list(zip(*rows)) if rows else [[] for _ in fields]
        return pa.table([pa.array(list(c), f.type) for c, f in zip(cols, fields)], schema=pa.schema(fields))

    @staticmethod
    def schema_of(table) -> list[dict]:
        return [{"name": f.name, "type": str(f.type)} for f in table.schema]
