"""Event tables on Spark: person-level contribution bounding (docs/math.md section 8;
layer 2 over :mod:`sparkpriv.mechanisms.sparse`).

:func:`bound_contributions` reduces an event table (one row per call, tap, ...)
to one bounded record per person, lazily:

1. each event's item is mapped to its index in the declared public
   vocabulary in the JVM (a range expression, or a broadcast join with the
   declared ids); events outside the vocabulary are kept as nulls so they can
   be counted, then ignored;
2. one shuffle: ``groupBy(person)`` collecting the person's item indices
   (``collect_set`` for binary records, ``collect_list`` for counts) and event
   counts; the person key is replaced by its public ``xxhash64`` right after
   the aggregation and never travels further;
3. per Arrow batch, in numpy (:func:`sparkpriv.mechanisms.sparse.cap_items`):
   dedupe, keep at most ``L`` items by the keyed uniform choice, cap counts.

The secret key of the choice reaches the executors in the task closure, never
as a literal in a query plan (``explain()`` shows only the function name).
Truncation statistics are owner diagnostics (accumulators, logged and written
to the owner report), never part of a release.

Records (:attr:`BoundedRecords.df`): ``items array<int>`` (sorted vocabulary
indices) and, for counts, ``values array<double>``. No person key.

Output layout of row-level releases (:attr:`BoundedRecords.layout`; docs/cdr.md
"Output layout"). A release with one row per person writes one file per
partition, rows in task order. After the ``groupBy`` that layout would be a
public function of WHICH person keys are present (Spark's murmur3 partition of
the key, the public ``xxhash64`` order): replacing one person would move a row
to another file or position whatever the noise. Row-level releases therefore
read :attr:`BoundedRecords.layout` instead of :attr:`BoundedRecords.grouped`:

4. per Arrow batch, ``_pk = SipHash-2-4_K(_ph)`` (:mod:`sparkpriv.privacy.prf`)
   with ``K`` a secret derived from the records' key (label ``"layout"``),
   shipped in the task closure only;
5. ``repartition(P, "_pk")`` into a PUBLIC number ``P`` of partitions
   (:attr:`BoundedRecords.layout_partitions`, default the session's
   ``spark.sql.shuffle.partitions``), and each task sorts its rows by ``_pk``
   (:func:`in_person_hash_order`).

Over the uniformly random ``K`` the ``_pk`` of distinct person hashes are
independent uniform 64-bit values, so the layout has the same distribution
whichever people are present, and reveals nothing beyond the rows. Aggregate
consumers (Gram, k-means, counting queries) read ``grouped`` and do not pay the
extra shuffle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from sparkpriv.errors import ParameterError, SchemaError
from sparkpriv.spark.schema import schema_fingerprint
from sparkpriv.mechanisms.sparse import (
    ItemCap,
    Vocabulary,
    cap_items,
    dedupe_rows,
)
from sparkpriv.privacy.prf import siphash24_u64
from sparkpriv.privacy.random import bounding_key, derive_seed
from sparkpriv.spark.batches import map_batches, owner_counters

__all__ = ["BoundedRecords", "bound_contributions", "records_schema", "read_item_lists", "in_person_hash_order",
           "keyed_layout", "LAYOUT_LABEL"]

_log = logging.getLogger(__name__)

_OOV_SHIFT = 32  # packed event counts: see unpack_event_counts
LAYOUT_LABEL = "layout"  # derive_seed label of the layout key (BoundedRecords.layout)
_DIAG = ("people", "people_truncated", "items_dropped", "events_dropped", "events_capped",
         "events", "events_out_of_vocabulary", "people_without_vocabulary_items")


def records_schema(weights: str):
    from pyspark.sql.types import ArrayType, DoubleType, IntegerType, StructField, StructType

    fields = [StructField("items", ArrayType(IntegerType(), False), False)]
    if weights == "counts":
        fields.append(StructField("values", ArrayType(DoubleType(), False), False))
    return StructType(fields)


def read_item_lists(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets from 0, int32 indices)`` of an Arrow list<int> column (nulls = empty)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        arr = arr.fill_null(pa.scalar([], arr.type))
    offs = arr.offsets.to_numpy().astype(np.int64)
    vals = arr.values.to_numpy(zero_copy_only=False)[offs[0]: offs[-1]]
    return offs - offs[0], vals.astype(np.int32, copy=False)


@dataclass
class BoundedRecords:
    """One bounded record per person, lazily (the result of :func:`bound_contributions`).

    Releases accept it directly (``release_projection(records, k=..., ...)``).

    Attributes
    ----------
    cap : ItemCap
        Public: the item cap and the norm bounds it implies.
    vocabulary : Vocabulary
        Public: the declared items; ``d = vocabulary.size``.
    events : DataFrame
        The source event table (owner side only).
    grouped : DataFrame
        One row per person after the ``groupBy``: ``_ph`` (public hash of the
        person key), ``_items``, ``_n``. Its partitioning and order are public
        functions of which keys are present: for aggregate consumers only.
    layout_partitions : int or None
        Public: the number of partitions (output files) of :attr:`layout`;
        None for the session's ``spark.sql.shuffle.partitions``. Must not be
        chosen from the data.
    """

    grouped: Any = field(repr=False)
    cap: ItemCap
    vocabulary: Vocabulary
    events: Any = field(repr=False)
    input_info: dict
    _key: int = field(repr=False)
    layout_partitions: int | None = None
    auto: Any = None  # AutoCap: max_items='auto', L chosen by a DP quantile in the release (cap: its limit)

    def set_max_items(self, max_items: int) -> None:
        """The cap at ``max_items`` (same weights and events cap): the release of an ``auto`` bound
        sets the limit for its histogram pass, then the chosen ``L``."""
        self.cap = ItemCap(int(max_items), self.cap.weights, self.cap.max_events_per_item, _caller=self.cap._caller)

    @property
    def d(self) -> int:
        return self.vocabulary.size

    @property
    def layout(self):
        """:attr:`grouped` in the keyed layout, for releases with one row per person.

        The same columns plus ``_pk`` (the keyed layout value), in
        :attr:`layout_partitions` partitions chosen by ``_pk``; a task must
        read its rows through :func:`in_person_hash_order` (``_pk`` order).
        See :func:`keyed_layout`. Costs one more shuffle of the grouped
        records, so aggregate consumers read :attr:`grouped`.
        """
        spark = self.grouped.sparkSession
        p = self.layout_partitions
        if p is None:
            p = int(spark.conf.get("spark.sql.shuffle.partitions"))
        return keyed_layout(self.grouped, derive_seed(self._key, LAYOUT_LABEL), p)

    def record_fn(self, counters=None, *, sort_items: bool = False) -> Callable:
        """``fn(batch) -> (offsets, indices, values)`` bounding one grouped Arrow batch.

        Built from plain values only (it is pickled into task closures); adds the
        truncation statistics to ``counters`` (a list of accumulators) if given.
        A person's items come out in no particular order unless ``sort_items``
        (binary records arrive distinct from ``collect_set`` and the keyed
        choice does not depend on their order, so the sort is skipped there).
        """
        cap, key = self.cap, self._key
        counts_mode = cap.weights == "counts"

        def bound(batch: pa.RecordBatch):
            off, idx = read_item_lists(batch.column("_items"))
            ph = batch.column("_ph").to_numpy(zero_copy_only=False)
            if counts_mode or sort_items:
                off, idx, cnt = dedupe_rows(off, idx)
            else:  # collect_set: already distinct
                cnt = None
            off, idx, vals, t = cap_items(off, idx, cnt if counts_mode else None, ph, cap, key)
            if counters is not None:
                ev, oov = unpack_event_counts(batch.column("_n"))
                empty = int(np.count_nonzero(np.diff(off) == 0))
                for acc, v in zip(counters, t._t() + (ev, oov, empty)):
                    if v:
                        acc.add(v)
            return off, idx, vals

        return bound

    @property
    def df(self):
        """The records as a DataFrame: ``items`` (and ``values`` for counts). No person key."""
        counters = make_counters(self.grouped.sparkSession)
        bound = self.record_fn(counters, sort_items=True)
        counts = self.cap.weights == "counts"
        names = records_schema(self.cap.weights).fieldNames()

        def sparkpriv_bound_contributions(batches, pid):
            for b in batches:
                off, idx, vals = bound(b)
                arrays = [pa.ListArray.from_arrays(pa.array(off.astype(np.int32)), pa.array(idx))]
                if counts:
                    arrays.append(pa.ListArray.from_arrays(pa.array(off.astype(np.int32)), pa.array(vals)))
                yield pa.RecordBatch.from_arrays(arrays, names)

        out = map_batches(self.grouped, sparkpriv_bound_contributions, records_schema(self.cap.weights))
        self._last_counters = counters
        return out

    def diagnostics(self, counters=None) -> dict:
        """Owner diagnostics from ``counters`` (default: those of the last :attr:`df`)."""
        counters = counters if counters is not None else getattr(self, "_last_counters", None)
        return counters_dict(counters)

    def to_public_dict(self) -> dict:
        cap = self.cap.to_public_dict()
        if self.auto is not None:
            cap = {"max_items": "auto", **self.auto.to_public_dict(), "weights": cap["weights"],
                   "max_events_per_item": cap["max_events_per_item"]}
        return {"contribution_bound": cap,
                "vocabulary": self.vocabulary.to_public_dict(),
                "record": "one per person: at most max_items distinct items, chosen uniformly at "
                          "random (keyed) when a person has more"}


def in_person_hash_order(batches, rows_per_batch: int = 8192):
    """A partition's grouped batches, re-cut in the order of the keyed layout value ``_pk``.

    Batches of :attr:`BoundedRecords.layout` carry ``_pk`` (secret keyed, so
    the order is a secret uniformly random one, docs/cdr.md "Output layout");
    ties, which need equal person hashes ``_ph``, are broken by ``_ph``.
    Batches without ``_pk`` (task functions run directly on
    :attr:`BoundedRecords.grouped`, in tests) are ordered by ``_ph``: a
    PUBLIC order, not for releases.

    The order in which a shuffle partition's groups arrive is not fixed (it
    depends on which map outputs are fetched first), so a keyed per-partition
    noise stream must not be consumed in arrival order. Sorting here, in the
    Python task, gives a recomputed or retried task the same people in the
    same order (only people with equal 64-bit hashes ``_ph``, probability
    about n^2 / 2^65 in a partition of n, could come out in either order). It
    replaces a JVM ``sortWithinPartitions``: the task holds its partition's
    item lists (about 50 bytes per person; a partition of the default size
    has a few hundred thousand people).
    """
    bs = [b for b in batches if b.num_rows]
    if not bs:
        return
    t = pa.Table.from_batches(bs)
    del bs
    ph = t.column("_ph").to_numpy()
    if "_pk" in t.column_names:
        order = np.lexsort((ph, t.column("_pk").to_numpy()))
    else:
        order = np.argsort(ph)
    t = t.take(pa.array(order))
    yield from t.to_batches(max_chunksize=rows_per_batch)


def keyed_layout(grouped, layout_key: int, partitions: int):
    """``grouped`` with ``_pk = SipHash-2-4(layout_key, _ph)``, repartitioned by ``_pk``.

    ``_pk`` is computed per Arrow batch in numpy
    (:func:`~sparkpriv.privacy.prf.siphash24_u64`, the int64 view of the
    64-bit output) by a vectorised UDF of ``_ph``; ``layout_key`` (secret, 128
    bits) reaches the executors in the task closure only, never as a literal
    in a query plan (plans show the function name). Then
    ``repartition(partitions, "_pk")``: Spark's hash partitioning,
    ``pmod(murmur3(_pk), partitions)``. ``partitions`` is PUBLIC; an explicit
    count makes a ``REPARTITION_BY_NUM`` shuffle, which adaptive query
    execution does not coalesce (its partition-coalescing rule only applies to
    shuffles it introduced or ``repartition`` by columns alone), so the
    number of partitions, and of output files, is ``partitions`` whatever
    the data size. Distinct people have distinct ``_ph`` except for 64-bit
    hash collisions (none among integer person keys, where ``xxhash64`` is
    injective; probability about n^2 / 2^65 among string keys), and then
    independent uniform ``_pk`` over the key.
    """
    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ParameterError(f"The number of layout partitions must be a positive integer. Got {partitions!r}.")
    key = int(layout_key)

    # A vectorised (Arrow) UDF of ``_ph`` alone: only 8 bytes a person go to Python
    # and back, the item lists stay in the JVM (a mapInArrow passing every column
    # through Python timed the same at 200k people: the extra shuffle dominates).
    def sparkpriv_keyed_layout(ph):
        return pd.Series(siphash24_u64(ph.to_numpy(dtype=np.int64), key).view(np.int64), index=ph.index)

    # real objects, not the strings of ``from __future__ import annotations``: Spark
    # reads the hints to choose a Series -> Series UDF
    sparkpriv_keyed_layout.__annotations__ = {"ph": pd.Series, "return": pd.Series}
    pk = pandas_udf(sparkpriv_keyed_layout, "long")
    return grouped.withColumn("_pk", pk("_ph")).repartition(partitions, "_pk")


def unpack_event_counts(arr) -> tuple[int, int]:
    """(events, events outside the vocabulary) of a batch's packed ``_n`` column.

    Per person ``_n`` = in-vocabulary events + 2^32 x out-of-vocabulary events:
    one sum aggregate per event instead of two counts (0.5-0.8 s less at 1 M
    people, in a comparison of the aggregations alone). Exact while a person has fewer than 2^32
    events inside the vocabulary and 2^31 outside (owner diagnostics only).
    """
    n = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)
    oov = int(np.sum(n >> _OOV_SHIFT))
    return int(np.sum(n & ((1 << _OOV_SHIFT) - 1))) + oov, oov


def make_counters(spark):
    """Accumulators for the truncation diagnostics (None under Spark Connect)."""
    return owner_counters(spark, len(_DIAG))


def counters_dict(counters) -> dict:
    if counters is None:
        return {}
    return {name: acc.value for name, acc in zip(_DIAG, counters)}


def bound_contributions(
    events_df,
    *,
    person: str,
    item: str,
    max_items,
    vocabulary,
    weights: str = "binary",
    max_events_per_item: int | None = None,
    seed: int | bytes | None = None,
    source: str | None = None,
    layout_partitions: int | None = None,
    auto=None,
) -> BoundedRecords:
    """Reduce an event table to one bounded record per person (lazy).

    Parameters
    ----------
    events_df : pyspark.sql.DataFrame
        One row per event (call, tap, ...).
    person, item : str
        The person-key column and the item column (tower, station id).
    max_items : int >= 1 or "auto"
        ``L``: at most this many distinct items per person are kept, chosen
        uniformly at random (keyed) when a person has more. ``"auto"``: the
        release chooses ``L`` as a DP quantile of the number of distinct items
        per person, spending a share of its epsilon in the same event
        (:mod:`sparkpriv.mechanisms.auto_bound`; ``auto`` an
        :class:`~sparkpriv.mechanisms.auto_bound.AutoCap` for its quantile,
        share and largest ``L``).
    vocabulary : Vocabulary, range, sequence of ids, ``"range:a:b"``, ``"a..b"`` or a file path
        The PUBLIC item vocabulary (``d`` items). Events at other items are
        dropped and counted (owner diagnostics).
    weights : {"binary", "counts"}
        Record value per kept item: 1, or the person's event count there
        capped at ``max_events_per_item`` (required for counts).
    seed : int or bytes, optional
        Secret key of the choice, to make the same choice in later runs;
        default: fresh OS entropy (the choice is still reproducible within
        the job: recomputing a partition gives the same records).
    source : str, optional
        Where the events came from (recorded in receipts).
    layout_partitions : int, optional
        PUBLIC number of partitions, hence output files, of a release with
        one row per person (:attr:`BoundedRecords.layout`); default the
        session's ``spark.sql.shuffle.partitions``. Do not choose it from the
        data.

    Returns
    -------
    BoundedRecords

    Privacy
    -------
    Not a release by itself. After it, one person changes one record, and
    every record satisfies ``||x||_1 <= L c`` and ``||x||_2 <= c sqrt(L)``
    (``c = 1`` for binary records): the bounds a release's sensitivity uses.
    The person key never leaves this step (replaced by a public hash used only
    for the keyed choice and the keyed output layout); truncation counts are
    owner diagnostics. Row-level releases place the rows by a secret keyed
    function of the person (:attr:`BoundedRecords.layout`), so which file and
    position a person's row takes is not a public function of the keys.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegralType, StringType

    caller = "bound_contributions"
    voc = Vocabulary.parse(vocabulary)
    if isinstance(max_items, str) and max_items == "auto":
        from sparkpriv.mechanisms.auto_bound import DEFAULT_LIMIT, AutoCap

        auto = auto if auto is not None else AutoCap(limit=DEFAULT_LIMIT, _caller=caller)
        if not isinstance(auto, AutoCap):
            raise ParameterError(f"{caller}: 'auto' must be an AutoCap (quantile, share, limit). Got "
                                 f"{type(auto).__name__}.")
        if auto.limit > voc.size:  # no person holds more items than the vocabulary has
            import dataclasses

            auto = dataclasses.replace(auto, limit=voc.size)
        max_items = auto.limit
    elif auto is not None:
        raise ParameterError(f"{caller}: 'auto' applies to max_items='auto' only (got max_items={max_items!r}).")
    if isinstance(max_items, str):
        raise ParameterError(f"The 'max_items' parameter of {caller} must be an int in the range [1, inf) or "
                             f"'auto'. Got {max_items!r} instead.")
    cap = ItemCap(max_items, weights, max_events_per_item, _caller=caller)
    fields = {f.name: f for f in events_df.schema.fields}
    for role, c in (("person", person), ("item", item)):
        if not isinstance(c, str) or c not in fields:
            raise SchemaError(f"The {role} column {c!r} is not in the event table. Available columns: "
                              f"{', '.join(fields)}.")
    if layout_partitions is not None and (not isinstance(layout_partitions, int) or
                                          isinstance(layout_partitions, bool) or layout_partitions < 1):
        raise ParameterError(f"{caller}: layout_partitions must be a positive integer (the number of output "
                             f"files of a row-level release). Got {layout_partitions!r}.")
    if person == item:
        raise ParameterError(f"{caller}: the person and item columns must differ (both are {person!r}).")
    itype = fields[item].dataType
    if voc.integer_ids and not isinstance(itype, (IntegralType, StringType)):
        raise SchemaError(f"The item column {item!r} has type {itype.simpleString()}; integer vocabulary "
                          "ids need an integer (or string) item column.")
    key = bounding_key(seed)

    ev = events_df.select(F.col(person).alias("_p"), F.col(item).alias("_it"))
    # try_cast: a malformed id ('x' in a string column of integer ids) reads as null, an event
    # outside the vocabulary, dropped and counted like any other: never a failed job (under ANSI
    # mode a plain cast raises, quoting the value, after the budget was reserved)
    if voc.is_range:
        it = F.expr("try_cast(`_it` AS BIGINT)")
        ev = ev.withColumn("_idx", F.when((it >= voc.start) & (it < voc.stop),
                                          (it - F.lit(voc.start)).cast("int")))
    else:
        spark = events_df.sparkSession
        vdf = spark.createDataFrame(list(zip(voc.ids, range(voc.size))),
                                    "_vid long, _vi int" if voc.integer_ids else "_vid string, _vi int")
        ev = (ev.withColumn("_it", F.expr(f"try_cast(`_it` AS {'BIGINT' if voc.integer_ids else 'STRING'})"))
              .join(F.broadcast(vdf), F.col("_it") == F.col("_vid"), "left")
              .select("_p", F.col("_vi").alias("_idx")))
    collect = F.collect_list if cap.weights == "counts" else F.collect_set
    packed = F.when(F.col("_idx").isNull(), F.lit(1 << _OOV_SHIFT)).otherwise(F.lit(1))  # unpack_event_counts
    grouped = (ev.groupBy("_p")
               .agg(collect("_idx").alias("_items"), F.sum(packed).alias("_n"))
               .select(F.xxhash64("_p").alias("_ph"), "_items", "_n"))
    info = {"source": source, "schema_fingerprint": schema_fingerprint(events_df.schema),
            "event_table": {"person_column": person, "item_column": item},
            "person_key": "used only to group events; never copied to the output"}
    return BoundedRecords(grouped=grouped, cap=cap, vocabulary=voc, events=events_df,
                          input_info=info, _key=key, layout_partitions=layout_partitions, auto=auto)
