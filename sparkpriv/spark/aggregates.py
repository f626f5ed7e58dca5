"""Aggregates per key of an event table on Spark: the event table grouped by person, as blocks of
:class:`~sparkpriv.mechanisms.protocol.EventRows` (docs/aggregates.md; the mathematics and the
bounding are the numpy core's, :mod:`sparkpriv.mechanisms.aggregates`).

1. Each event's key is mapped in the JVM: to its index in the PUBLIC key domain (range arithmetic or
   a broadcast join with the declared ids, :func:`sparkpriv.spark.counts.key_index_events`; a key
   outside the domain, malformed or null is dropped and counted for the owner), or, for private
   keys, to ``xxhash64`` of the key columns (an event with a null key value is dropped). Value
   columns are read as doubles (``try_cast``: a malformed value is a null, which the core fills).
2. One shuffle: ``groupBy(person)`` collecting each person's ``(key, values)`` events; the person key
   is replaced by its public ``xxhash64`` right after (used only by the keyed choice of kept keys).
3. Per Arrow batch the core bounds each person and adds the per-key totals
   (:func:`~sparkpriv.mechanisms.aggregates.key_totals`): summed per partition and merged by tree
   aggregation (public domain), or emitted per key and totalled in the JVM (private keys:
   :meth:`SparkEngine.key_table`).

:func:`public_column_vocabulary` reads a key column's domain from a PUBLIC table (``col=table:PATH``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from sparkpriv.errors import ParameterError, SchemaError
from sparkpriv.mechanisms.protocol import EventRows, InputFacts
from sparkpriv.spark.schema import schema_fingerprint

__all__ = ["EventsSource", "grouped_events", "event_rows", "public_column_vocabulary", "KEY_ID"]

KEY_ID = "_kid"
_OOV = 1 << 32  # packed event counts (sparkpriv.spark.events.unpack_event_counts)


def _check(df, spec) -> None:
    from pyspark.sql.types import BooleanType, NumericType, StringType

    names = [f.name for f in df.schema.fields]
    for role, cols in (("person", [spec.person]), ("key", list(spec.by)), ("value", list(spec.values))):
        for c in cols:
            if c not in names:
                raise SchemaError(f"The {role} column {c!r} is not in the event table. Available columns: "
                                  f"{', '.join(names)}.")
    for c in spec.values:
        t = df.schema[c].dataType
        if not isinstance(t, (NumericType, StringType, BooleanType)):
            raise SchemaError(f"The value column {c!r} has type {t.simpleString()}; give a numeric column "
                              "(numbers in a string column are read too).")


def grouped_events(df, spec):
    """``(_ph, _e, _n)`` per person (lazy): the public person hash, the list of the person's in-domain
    events ``struct<k: bigint, v0: double, ...>``, and the packed count of their events (in the domain
    + 2^32 x outside it)."""
    from pyspark.sql import functions as F

    _check(df, spec)
    values = list(spec.values)
    if spec.domain is not None:
        from sparkpriv.spark.counts import key_index_events

        ev = key_index_events(df, person=spec.person, domain=spec.domain, extra=values)
        ev = ev.select("_p", F.col("_kidx").cast("long").alias("_k"), *[f"_x{j}" for j in range(len(values))])
    else:
        keys = [F.col(c) for c in spec.by]
        present = keys[0].isNotNull()
        for k in keys[1:]:
            present = present & k.isNotNull()
        ev = df.select(F.col(spec.person).alias("_p"), F.when(present, F.xxhash64(*keys)).alias("_k"),
                       *[F.col(c).alias(f"_x{j}") for j, c in enumerate(values)])
    xs = [F.expr(f"try_cast(`_x{j}` AS DOUBLE)").alias(f"v{j}") for j in range(len(values))]
    elem = F.when(F.col("_k").isNotNull(), F.struct(F.col("_k").alias("k"), *xs))
    packed = F.when(F.col("_k").isNull(), F.lit(_OOV)).otherwise(F.lit(1))
    return (ev.groupBy("_p").agg(F.collect_list(elem).alias("_e"), F.sum(packed).alias("_n"))
            .select(F.xxhash64("_p").alias("_ph"), "_e", "_n"))


def event_rows(batch: pa.RecordBatch, n_values: int) -> EventRows:
    """The :class:`EventRows` block of one Arrow batch of :func:`grouped_events`."""
    from sparkpriv.spark.events import unpack_event_counts

    e = batch.column("_e")
    if isinstance(e, pa.ChunkedArray):
        e = e.combine_chunks()
    if e.null_count:
        e = e.fill_null(pa.scalar([], e.type))
    offs = e.offsets.to_numpy().astype(np.int64)
    offs = offs - offs[0]
    fields = e.flatten().flatten()  # the struct's fields, with the list's and the struct's offsets applied
    keys = fields[0].to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    vals = np.empty((keys.size, n_values), np.float64)
    for j in range(n_values):
        col = fields[1 + j]
        vals[:, j] = col.to_numpy(zero_copy_only=False) if col.null_count == 0 else \
            col.fill_null(float("nan")).to_numpy(zero_copy_only=False)
    ph = batch.column("_ph").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    _, oov = unpack_event_counts(batch.column("_n"))
    return EventRows(offs, keys, vals, ph, dropped=oov)


@dataclass
class EventsSource:
    """An event table grouped by person for an aggregates release (kind ``"events"``)."""

    df: Any = field(repr=False)
    spec: Any
    kind: str = "events"

    def __post_init__(self):
        self.grouped = grouped_events(self.df, self.spec)

    @property
    def facts(self) -> InputFacts:
        d = self.spec.domain.size if self.spec.domain is not None else 0
        return InputFacts("events", d, tuple(self.spec.values), names=tuple(self.df.columns))

    @property
    def spark(self):
        return self.df.sparkSession

    @property
    def source_df(self):
        return self.df

    @property
    def key_values(self):
        """``(_kid, key columns...)``: one row per private key id (lazy; its values for the output)."""
        from pyspark.sql import functions as F

        keys = [F.col(c) for c in self.spec.by]
        present = keys[0].isNotNull()
        for k in keys[1:]:
            present = present & k.isNotNull()
        return (self.df.where(present).select(F.xxhash64(*keys).alias(KEY_ID), *self.spec.by)
                .groupBy(KEY_ID).agg(*[F.first(c).alias(c) for c in self.spec.by]))

    def key_types(self) -> list:
        return [self.df.schema[c].dataType for c in self.spec.by]

    def public_params(self) -> dict:
        return self.spec.public_params()

    def input_info(self, source: str | None) -> dict:
        return {**self.spec.input_info(source), "schema_fingerprint": schema_fingerprint(self.df.schema)}

    def diagnostics(self) -> dict:
        return {}

    def batch_fn(self, fn):
        nv = len(self.spec.values)

        def blocks(batches):
            for batch in batches:
                if batch.num_rows:
                    yield fn(event_rows(batch, nv))

        return blocks


def public_column_vocabulary(table, column: str, *, limit: int = 1 << 24):
    """The distinct values of ``column`` of a PUBLIC table (a DataFrame) as a
    :class:`~sparkpriv.mechanisms.sparse.Vocabulary`, sorted (a key column's declared domain: e.g.
    the towers of a public map). Never call it on the private event table: a domain read off the
    private data is not private."""
    from pyspark.sql import functions as F

    from sparkpriv.mechanisms.sparse import Vocabulary

    if column not in table.columns:
        raise SchemaError(f"The public domain table has no column {column!r}. Columns: {', '.join(table.columns)}.")
    vals = table.select(F.col(column)).where(F.col(column).isNotNull()).distinct().limit(limit + 1).collect()
    if len(vals) > limit:
        raise ParameterError(f"The public domain column {column!r} has more than {limit:,} values.")
    ids = sorted(r[0] for r in vals)
    if not ids:
        raise ParameterError(f"The public domain column {column!r} is empty.")
    ids = [int(i) if isinstance(i, (int, np.integer)) else str(i) for i in ids]
    return Vocabulary.from_ids(ids, source=f"public table column {column}")
