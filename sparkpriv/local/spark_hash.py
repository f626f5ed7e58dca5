"""Spark's SQL hash functions in numpy, so the local engine groups and chooses as Spark does.

The event engines replace a person's key by its public 64-bit hash, Spark's ``xxhash64(person)``
(seed 42), which the keyed choice of kept keys reads (:func:`~sparkpriv.mechanisms.sparse.kept_entries`);
private keys are identified by ``xxhash64(key columns...)`` and spread over the output partitions by
Spark's hash partitioning, ``pmod(murmur3(_kid), P)``. Computing the same values here makes the local
engine's bounded statistics (and, for the same secret seed, its noise) those of the Spark engine.

* :func:`xxhash64` of one Arrow column, ``seed`` a scalar or one seed per row (Spark hashes several
  columns by chaining: each non-null value's hash is the next column's seed; a null leaves the seed):
  Spark's ``XXH64.hashInt`` for ``tinyint``/``smallint``/``int``/``boolean``/``date`` (and
  ``float`` by its IEEE bits), ``hashLong`` for ``bigint``/``timestamp`` (microseconds) and
  ``double`` (its IEEE bits; ``-0.0`` hashed as ``0.0``, every NaN as Java's canonical NaN),
  ``hashUnsafeBytes`` (standard XXH64, little-endian words) of the UTF-8 bytes of a string and of
  binary values. Unsigned Arrow integers are hashed as the Spark type they convert to (``uint8``:
  ``smallint``, ``uint16``: ``int``, ``uint32``: ``bigint``; ``uint64``: the bits as ``bigint``).
  Decimals of precision at most 18 are ``hashLong`` of the unscaled value as Spark does; a wider
  decimal, and any other type, is hashed by the UTF-8 bytes of its string form: a documented LOCAL
  hash that Spark does not compute (its choice of kept keys then differs from Spark's, never its rule).
* :func:`murmur3_long`: Spark's ``Murmur3_x86_32.hashLong`` (the hash partitioner of a ``bigint``
  column), as int32.

All arithmetic is wrapping uint64 (uint32) on whole arrays; strings are hashed stripe by stripe over
the strings still that long (a few array operations per 32 bytes of the longest string).
Checked against Spark's ``xxhash64`` and ``hash`` in tests/local/test_spark_hash.py.
Layer: engines (numpy and pyarrow; no pyspark).
"""

from __future__ import annotations

import numpy as np

__all__ = ["SPARK_SEED", "xxhash64", "xxhash64_columns", "xxhash64_long", "xxhash64_int", "xxhash64_bytes",
           "murmur3_long", "spark_partition"]

SPARK_SEED = 42  # the seed of Spark's xxhash64 and hash functions (and of its hash partitioner)

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def _seeds(seed, n: int) -> np.ndarray:
    if np.ndim(seed) == 0:
        return np.full(n, np.int64(seed)).view(np.uint64)
    s = np.asarray(seed)
    if s.shape != (n,):
        raise ValueError(f"one seed per value is needed: {s.shape} seeds for {n} values")
    return s.astype(np.int64, copy=False).view(np.uint64)


def xxhash64_long(values, seed=SPARK_SEED) -> np.ndarray:
    """Spark's ``XXH64.hashLong`` of int64 ``values`` (int64 result, as Spark's ``xxhash64``)."""
    v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
    with np.errstate(over="ignore"):
        h = _seeds(seed, v.size) + _P5 + np.uint64(8)
        h = h ^ (_rotl(v * _P2, 31) * _P1)
        h = _rotl(h, 27) * _P1 + _P4
        return _fmix(h).view(np.int64)


def xxhash64_int(values, seed=SPARK_SEED) -> np.ndarray:
    """Spark's ``XXH64.hashInt`` of int32 ``values`` (its 32 bits, unsigned)."""
    v = np.asarray(values).astype(np.int32, copy=False).view(np.uint32).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = _seeds(seed, v.size) + _P5 + np.uint64(4)
        h = h ^ (v * _P1)
        h = _rotl(h, 23) * _P2 + _P3
        return _fmix(h).view(np.int64)


def _gather(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """The little-endian unsigned word of ``width`` bytes at each byte position of ``buf``."""
    b = buf[pos[:, None] + np.arange(width)]
    return np.ascontiguousarray(b).view(f"<u{width}").reshape(-1).astype(np.uint64)


def xxhash64_bytes(data, offsets, seed=SPARK_SEED) -> np.ndarray:
    """Spark's ``XXH64.hashUnsafeBytes`` (the standard XXH64) of each byte string
    ``data[offsets[i]:offsets[i+1]]``."""
    buf = np.frombuffer(memoryview(data), np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
    offsets = np.asarray(offsets, np.int64)
    n = offsets.size - 1
    buf = np.concatenate([buf, np.zeros(8, np.uint8)])  # every gather in bounds
    start, length = offsets[:-1], np.diff(offsets)
    seed = _seeds(seed, n)
    h = np.empty(n, np.uint64)
    with np.errstate(over="ignore"):
        long = length >= 32
        if long.any():
            idx = np.flatnonzero(long)
            s = seed[idx]
            v = [s + _P1 + _P2, s + _P2, s.copy(), s - _P1]
            stripes = length[idx] // 32
            pos = start[idx].copy()
            for j in range(int(stripes.max())):
                live = stripes > j
                li = np.flatnonzero(live)
                for w in range(4):
                    vw = v[w]
                    x = vw[li] + _gather(buf, pos[li] + 8 * w, 8) * _P2
                    vw[li] = _rotl(x, 31) * _P1
                pos[li] += 32
            acc = _rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)
            for w in range(4):
                x = _rotl(v[w] * _P2, 31) * _P1
                acc = (acc ^ x) * _P1 + _P4
            h[idx] = acc
        short = ~long
        h[short] = seed[short] + _P5
        h = h + length.astype(np.uint64)
        pos = start + (length // 32) * 32
        left = length - (length // 32) * 32
        for _ in range(3):  # at most three 8-byte words after the stripes
            live = np.flatnonzero(left >= 8)
            if not live.size:
                break
            k = _gather(buf, pos[live], 8)
            h[live] = _rotl(h[live] ^ (_rotl(k * _P2, 31) * _P1), 27) * _P1 + _P4
            pos[live] += 8
            left[live] -= 8
        live = np.flatnonzero(left >= 4)
        if live.size:
            k = _gather(buf, pos[live], 4)
            h[live] = _rotl(h[live] ^ (k * _P1), 23) * _P2 + _P3
            pos[live] += 4
            left[live] -= 4
        for _ in range(3):
            live = np.flatnonzero(left >= 1)
            if not live.size:
                break
            k = buf[pos[live]].astype(np.uint64)
            h[live] = _rotl(h[live] ^ (k * _P5), 11) * _P1
            pos[live] += 1
            left[live] -= 1
        return _fmix(h).view(np.int64)


def _string_parts(arr):
    """``(data buffer, offsets)`` of an Arrow string/binary array without nulls (large offsets kept)."""
    import pyarrow as pa

    t = arr.type
    large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], np.int64 if large else np.int32)[arr.offset: arr.offset + len(arr) + 1]
    data = bufs[2] if bufs[2] is not None else pa.py_buffer(b"")
    return np.frombuffer(data, np.uint8), off.astype(np.int64)


def _spark_kind(t) -> str:
    import pyarrow as pa

    if pa.types.is_boolean(t) or pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t) \
            or pa.types.is_uint8(t) or pa.types.is_uint16(t) or pa.types.is_date32(t):
        return "int"
    if pa.types.is_int64(t) or pa.types.is_uint32(t) or pa.types.is_uint64(t):
        return "long"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_float32(t) or pa.types.is_float16(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes"
    if pa.types.is_decimal(t) and t.precision <= 18:
        return "decimal"
    return "other"


def spark_exact(t) -> bool:
    """True when :func:`xxhash64` of an Arrow column of type ``t`` is Spark's ``xxhash64``."""
    return _spark_kind(t) != "other"


def xxhash64(arr, seed=SPARK_SEED) -> np.ndarray:
    """Spark's ``xxhash64`` of each value of the Arrow array ``arr`` (int64; see the module docstring
    for the types). ``seed``: a scalar or one per value; a null value's hash is its seed."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    seeds = _seeds(seed, n).view(np.int64)
    out = seeds.copy()
    if arr.null_count:
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)
        sub = arr.filter(pa.array(valid))
        out[valid] = xxhash64(sub, seeds[valid])
        return out
    kind = _spark_kind(arr.type)
    if kind == "int":
        v = arr.cast(pa.int32()) if not pa.types.is_date32(arr.type) else arr.view(pa.int32())
        return xxhash64_int(v.to_numpy(zero_copy_only=False), seeds)
    if kind == "long":
        v = arr.view(pa.int64()) if pa.types.is_uint64(arr.type) else arr.cast(pa.int64())
        return xxhash64_long(v.to_numpy(zero_copy_only=False), seeds)
    if kind == "timestamp":
        micros = arr.cast(pa.timestamp("us", arr.type.tz), safe=False)  # Spark keeps microseconds
        return xxhash64_long(micros.view(pa.int64()).to_numpy(zero_copy_only=False), seeds)
    if kind == "double":
        x = arr.to_numpy(zero_copy_only=False).astype(np.float64)
        x = np.where(x == 0.0, 0.0, x)  # -0.0 as 0.0
        bits = x.view(np.int64).copy()
        bits[np.isnan(x)] = 0x7FF8000000000000  # Java's doubleToLongBits: one NaN
        return xxhash64_long(bits, seeds)
    if kind == "float":
        x = arr.cast(pa.float32()).to_numpy(zero_copy_only=False).astype(np.float32)
        x = np.where(x == 0.0, np.float32(0.0), x)
        bits = x.view(np.int32).copy()
        bits[np.isnan(x)] = 0x7FC00000  # Java's floatToIntBits: one NaN
        return xxhash64_int(bits, seeds)
    if kind == "decimal":
        unscaled = np.array([int(d.scaleb(arr.type.scale)) for d in arr.to_pylist()], np.int64)  # fits a long
        return xxhash64_long(unscaled, seeds)
    if kind == "other":
        arr = pc.cast(arr, pa.string()) if not pa.types.is_dictionary(arr.type) else \
            pc.cast(arr.dictionary_decode(), pa.string())
    data, off = _string_parts(arr)
    return xxhash64_bytes(data, off, seeds)


def xxhash64_columns(columns, seed=SPARK_SEED) -> np.ndarray:
    """Spark's ``xxhash64(c1, c2, ...)`` of Arrow arrays of equal length (chained seeds)."""
    h = None
    for c in columns:
        h = xxhash64(c, seed if h is None else h)
    return h


def murmur3_long(values, seed=SPARK_SEED) -> np.ndarray:
    """Spark's ``Murmur3_x86_32.hashLong`` of int64 ``values`` (int32, as Spark's ``hash``)."""
    v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
    c1, c2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)

    def rotl32(x, r):
        return (x << np.uint32(r)) | (x >> np.uint32(32 - r))

    def mix_k1(k):
        return rotl32(k * c1, 15) * c2

    def mix_h1(h, k):
        h = rotl32(h ^ k, 13)
        return h * np.uint32(5) + np.uint32(0xE6546B64)

    with np.errstate(over="ignore"):
        low = (v & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        high = (v >> np.uint64(32)).astype(np.uint32)
        h = np.full(v.shape, np.uint32(seed & 0xFFFFFFFF), np.uint32)
        h = mix_h1(h, mix_k1(low))
        h = mix_h1(h, mix_k1(high))
        h = h ^ np.uint32(8)
        h = h ^ (h >> np.uint32(16))
        h = h * np.uint32(0x85EBCA6B)
        h = h ^ (h >> np.uint32(13))
        h = h * np.uint32(0xC2B2AE35)
        h = h ^ (h >> np.uint32(16))
    return h.view(np.int32)


def spark_partition(values, partitions: int) -> np.ndarray:
    """The partition Spark's ``repartition(partitions, col)`` gives each ``bigint`` value:
    ``pmod(murmur3(value), partitions)``."""
    return np.mod(murmur3_long(values).astype(np.int64), int(partitions))
