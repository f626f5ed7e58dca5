"""DP counts per public key of an event table on Spark: the bounding by key
(docs/counts.md; numpy core and the mechanism :mod:`sparkpriv.mechanisms.counts`,
mathematics in docs/math.md section 9).

1. :func:`key_index_events`: each event's key (one or more declared columns)
   is mapped to its index in the PUBLIC key domain in the JVM (range
   arithmetic, or a broadcast join with the declared ids or key tuples);
   events outside the domain get a null index: the bounding drops them and
   counts them for the owner only (``events_out_of_vocabulary``);
2. :func:`bound_keys`: the bounding that exists
   (:func:`sparkpriv.spark.events.bound_contributions`) with the key index as
   the item: one ``groupBy(person)``, then per Arrow batch at most ``L`` keys
   per person (the keyed uniform choice) and, with ``c``, events per key
   capped at ``c``. The result goes to ``release_counts(records,
   domain=..., epsilon=...)`` (the one release path): per-partition totals
   over the domain, merged by tree aggregation, noised once on the driver,
   one output row per key of the domain.

:func:`key_totals` is the same totals by ONE aggregation in the JVM (the
bounded records exploded, ``groupBy(key)``): the owner-side reference of the
tests and the benchmark's coverage figure.

Every refusal (parameters, domain, columns) happens before any data is read;
the person key never leaves step 2 (it is replaced by a public hash there).
"""

from __future__ import annotations

import logging
import numpy as np

from sparkpriv.errors import ParameterError, SchemaError
from sparkpriv.mechanisms.counts import MAX_DRIVER_KEYS, MAX_KEYS, OUTPUT_COLUMNS, KeyDomain
from sparkpriv.mechanisms.counts._mechanism import check_key_columns
from sparkpriv.mechanisms.sparse import Vocabulary
from sparkpriv.spark.events import bound_contributions

__all__ = ["OUTPUT_COLUMNS", "key_index_events", "bound_keys", "key_totals"]

_log = logging.getLogger(__name__)
_KIDX = "_kidx"


def _check_columns(events_df, person: str, domain: KeyDomain) -> None:
    check_key_columns([f.name for f in events_df.schema.fields], person, domain)


def key_index_events(events_df, *, person: str, domain: KeyDomain, extra=()):
    """``(person, _kidx)`` per event, ``_kidx`` (int) the key's domain index or null outside (lazy);
    ``extra``: columns passed through as ``_x0, _x1, ...`` (the value columns of an aggregates release)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegralType, StringType

    _check_columns(events_df, person, domain)
    spark = events_df.sparkSession
    types = {f.name: f.dataType for f in events_df.schema.fields}
    ev = events_df.select(F.col(person).alias("_p"),
                          *[F.col(c).alias(f"_c{j}") for j, c in enumerate(domain.columns)],
                          *[F.col(c).alias(f"_x{j}") for j, c in enumerate(extra)])
    xs = [f"_x{j}" for j in range(len(extra))]
    if domain.vocabularies is not None:
        parts = []
        for j, (c, v, s) in enumerate(zip(domain.columns, domain.vocabularies, domain.strides)):
            col = f"_c{j}"
            if v.integer_ids and not isinstance(types[c], (IntegralType, StringType)):
                raise SchemaError(f"The key column {c!r} has type {types[c].simpleString()}; its declared values "
                                  "are integers: give an integer (or string) column.")
            # try_cast: a malformed key reads as null (outside the domain: dropped and counted),
            # never a failed job (docs/privacy.md, "Failures")
            if v.is_range:
                it = F.expr(f"try_cast(`{col}` AS BIGINT)")
                ev = ev.withColumn(f"_i{j}", F.when((it >= v.start) & (it < v.stop), it - F.lit(v.start)))
            else:
                kind = "long" if v.integer_ids else "string"
                vdf = spark.createDataFrame(list(zip(v.ids, range(v.size))), f"_v{j} {kind}, _i{j} long")
                ev = ev.withColumn(col, _try_cast(col, kind)).join(
                    F.broadcast(vdf), F.col(col) == F.col(f"_v{j}"), "left")
            parts.append(F.col(f"_i{j}") * F.lit(s) if s != 1 else F.col(f"_i{j}"))
        idx = parts[0]
        for p in parts[1:]:
            idx = idx + p
        return ev.select("_p", idx.cast("int").alias(_KIDX), *xs)
    # declared key tuples: one broadcast join on every key column
    kinds = []
    for j, c in enumerate(domain.columns):
        is_int = isinstance(domain.tuples[0][j], int) if domain.tuples else True
        kinds.append("long" if is_int else "string")
    schema = ", ".join(f"_v{j} {k}" for j, k in enumerate(kinds)) + f", {_KIDX} int"
    rows = [tuple(t) + (i,) for i, t in enumerate(domain.tuples)]
    vdf = spark.createDataFrame(rows, schema)
    for j, k in enumerate(kinds):
        ev = ev.withColumn(f"_c{j}", _try_cast(f"_c{j}", k))
    cond = None
    for j in range(len(kinds)):
        e = F.col(f"_c{j}") == F.col(f"_v{j}")
        cond = e if cond is None else cond & e
    return ev.join(F.broadcast(vdf), cond, "left").select("_p", _KIDX, *xs)


def _try_cast(col: str, kind: str):
    """``col`` as ``kind`` (long or string), null where a value does not parse."""
    from pyspark.sql import functions as F

    return F.expr(f"try_cast(`{col}` AS {'BIGINT' if kind == 'long' else 'STRING'})")


def bound_keys(events_df, *, person: str, domain: KeyDomain, max_keys, max_events_per_key: int | None = None,
               seed=None, source: str | None = None, auto=None):
    """The bounded records of the event table over the key domain (lazy :class:`BoundedRecords`).

    At most ``max_keys`` (``L``) keys per person, each counting 1 (distinct
    people) or, with ``max_events_per_key`` (``c``), the person's events there
    capped at ``c``; ``max_keys="auto"``: ``L`` chosen by the release as a DP
    quantile of the keys per person (``auto``: an ``AutoCap``; docs/counts.md).
    ``seed``: the secret key of the keyed choice (default: fresh entropy). Pass the result and the same ``domain`` to
    ``release_counts``. Reads no data (refusals come first).
    """
    if not isinstance(domain, KeyDomain):
        raise ParameterError(f"bound_keys needs a KeyDomain for 'domain'. Got {type(domain).__name__}; "
                             "build one with KeyDomain.product(...) or KeyDomain.pairs(...).")
    if domain.size > MAX_KEYS:
        raise ParameterError(f"The key domain has {domain.size} keys, more than {MAX_KEYS} (key indices are 32-bit "
                             "integers): declare a smaller domain or split it into several releases.")
    if domain.tuples is not None and domain.size > MAX_DRIVER_KEYS:
        raise ParameterError(f"The declared key list has {domain.size} keys, more than {MAX_DRIVER_KEYS}: the "
                             "driver holds declared keys whole. Declare the domain as a product of per-column "
                             "vocabularies (its noise is then drawn in the tasks), or split it.")
    from sparkpriv._validation import Interval, check_param

    if not (isinstance(max_keys, str) and max_keys == "auto"):
        check_param("max_keys", max_keys, [Interval("integer", 1, None, "left")], "bound_keys")
    check_param("max_events_per_key", max_events_per_key, [None, Interval("integer", 1, 2**20, "both")],
                "bound_keys")
    ev = key_index_events(events_df, person=person, domain=domain)
    weights = "binary" if max_events_per_key is None else "counts"
    rec = bound_contributions(ev, person="_p", item=_KIDX, max_items=max_keys,
                              vocabulary=Vocabulary.from_range(0, domain.size), weights=weights,
                              max_events_per_item=max_events_per_key, seed=seed, source=source, auto=auto)
    rec.input_info["event_table"] = {"person_column": person, "key_columns": list(domain.columns)}
    rec.events = events_df
    return rec


def key_totals(records, d: int) -> np.ndarray:
    """Exact per-key totals after bounding, int64 (d,): ONE JVM aggregation, at most ``d``
    rows to the driver, scattered over the whole domain (zeros for unvisited keys)."""
    from pyspark.sql import functions as F

    df = records.df
    if records.cap.weights == "binary":
        agg = df.select(F.explode("items").alias("_k")).groupBy("_k").agg(F.count(F.lit(1)).alias("_v"))
    else:
        z = df.select(F.explode(F.arrays_zip("items", "values")).alias("_z"))
        agg = z.groupBy(F.col("_z.items").alias("_k")).agg(F.sum(F.col("_z.values").cast("long")).alias("_v"))
    keys, vals = _collect_two(agg)
    out = np.zeros(d, np.int64)
    if keys.size:
        if keys.min() < 0 or keys.max() >= d:  # impossible after the bounding: an internal error
            raise RuntimeError("a bounded key index lies outside the domain")
        out[keys] = vals
    return out


def _collect_two(agg) -> tuple[np.ndarray, np.ndarray]:
    if hasattr(agg, "toArrow"):
        t = agg.toArrow()
        return (t.column("_k").to_numpy().astype(np.int64),
                t.column("_v").to_numpy().astype(np.int64))
    rows = agg.collect()
    return (np.array([r["_k"] for r in rows], np.int64), np.array([r["_v"] for r in rows], np.int64))
