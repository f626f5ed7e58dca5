"""Spark's hash functions in numpy (sparkpriv.local.spark_hash): XXH64's published test vectors, and
equality with Spark's own ``xxhash64`` and ``hash`` (the session-scoped local Spark) on random longs,
ints, doubles, floats, strings of every length up to past four 32-byte stripes, several columns with
nulls, and the other types the person column may have."""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pyarrow as pa
import pytest

from sparkpriv.local.spark_hash import (murmur3_long, spark_partition, xxhash64, xxhash64_bytes, xxhash64_columns,
                                        xxhash64_long)


def _u64(h) -> int:
    return int(np.asarray(h).view(np.uint64)[0])


def test_xxh64_reference_vectors():
    """The XXH64 reference implementation's values (xxhash's own sanity list), independent of Spark."""
    for text, seed, want in [(b"", 0, 0xEF46DB3751D8E999), (b"a", 0, 0xD24EC4F1A98C6E5B),
                             (b"abc", 0, 0x44BC2CF5AD770999),
                             (b"Nobody inspects the spammish repetition", 0, 0xFBCEA83C8A378BF1)]:
        h = xxhash64_bytes(np.frombuffer(text, np.uint8) if text else np.zeros(0, np.uint8), [0, len(text)], seed)
        assert _u64(h) == want, text


def _spark_column(spark, table: pa.Table, expr: str) -> np.ndarray:
    return spark.createDataFrame(table).selectExpr(f"{expr} AS h").toArrow().column("h").to_numpy()


def test_long_int_and_murmur3_equal_spark(spark):
    rng = np.random.default_rng(1)
    longs = np.concatenate([rng.integers(-2**63, 2**63 - 1, 2000, dtype=np.int64), [0, -1, 2**63 - 1, -2**63]])
    ints = np.concatenate([rng.integers(-2**31, 2**31 - 1, 2000).astype(np.int32), np.array([0, -1], np.int32)])
    t = pa.table({"l": longs})
    assert np.array_equal(_spark_column(spark, t, "xxhash64(l)"), xxhash64(t.column("l")))
    assert np.array_equal(_spark_column(spark, t, "hash(l)"), murmur3_long(longs))
    assert np.array_equal(_spark_column(spark, t, "pmod(hash(l), 7)"), spark_partition(longs, 7))
    ti = pa.table({"i": pa.array(ints, pa.int32())})
    assert np.array_equal(_spark_column(spark, ti, "xxhash64(i)"), xxhash64(ti.column("i")))


def test_strings_of_every_length_equal_spark(spark):
    rng = np.random.default_rng(2)
    strs = ["", "a", "é日本", "x" * 31, "y" * 32, "z" * 33, "w" * 1000]
    strs += ["".join(chr(c) for c in rng.integers(32, 0x2FF, int(n))) for n in rng.integers(0, 140, 600)]
    t = pa.table({"s": pa.array(strs), "ls": pa.array(strs, pa.large_string())})
    want = _spark_column(spark, t.select(["s"]), "xxhash64(s)")
    assert np.array_equal(want, xxhash64(t.column("s")))
    assert np.array_equal(want, xxhash64(t.column("ls")))
    sliced = t.column("s").combine_chunks().slice(5, 100)  # an Arrow array with an offset
    assert np.array_equal(want[5:105], xxhash64(sliced))


def test_doubles_floats_and_several_columns_with_nulls_equal_spark(spark):
    rng = np.random.default_rng(3)
    dbl = np.concatenate([rng.normal(size=300) * 1e6, [0.0, -0.0, np.nan, np.inf, -np.inf, 1.5]])
    t = pa.table({"d": pa.array(dbl), "f": pa.array(dbl.astype(np.float32))})
    assert np.array_equal(_spark_column(spark, t, "xxhash64(d)"), xxhash64(t.column("d")))
    assert np.array_equal(_spark_column(spark, t, "xxhash64(f)"), xxhash64(t.column("f")))
    n = 400
    a = pa.array([None if v % 5 == 0 else int(v) for v in rng.integers(0, 50, n)], pa.int64())
    b = pa.array([None if v % 7 == 0 else f"k{v}" for v in rng.integers(0, 50, n)])
    c = pa.array([None if v % 3 == 0 else int(v) for v in rng.integers(0, 50, n)], pa.int32())
    tm = pa.table({"a": a, "b": b, "c": c})
    assert np.array_equal(_spark_column(spark, tm, "xxhash64(a, b, c)"), xxhash64_columns([a, b, c]))
    assert np.array_equal(_spark_column(spark, tm, "xxhash64(a)"), xxhash64(a))  # a null hashes to the seed


def test_other_person_types_equal_spark(spark):
    t = pa.table({
        "bo": pa.array([True, False, None]),
        "sh": pa.array([1, -5, 300], pa.int16()),
        "by": pa.array([1, -5, 100], pa.int8()),
        "dt": pa.array([datetime.date(2020, 1, 1), datetime.date(1969, 5, 3), None]),
        "ts": pa.array([datetime.datetime(2020, 1, 1, 3, 4, 5, 123456), datetime.datetime(1960, 1, 1), None],
                       pa.timestamp("us", "UTC")),
        "dec": pa.array([decimal.Decimal("1.23"), decimal.Decimal("-0.50"), decimal.Decimal("0")],
                        pa.decimal128(10, 2)),
        "bin": pa.array([b"", b"\x00\xff", b"abcdefghij"]),
    })
    for c in t.column_names:
        assert np.array_equal(_spark_column(spark, t.select([c]), f"xxhash64({c})"), xxhash64(t.column(c))), c


def test_one_seed_per_value_chains():
    v = np.arange(10, dtype=np.int64)
    seeds = np.arange(100, 110, dtype=np.int64)
    assert np.array_equal(xxhash64_long(v, seeds), [xxhash64_long(v[i:i + 1], int(seeds[i]))[0] for i in range(10)])
    with pytest.raises(ValueError):
        xxhash64_long(v, seeds[:3])
