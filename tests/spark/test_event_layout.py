"""The output layout of row-level releases of event tables (docs/cdr.md "Output layout").

Which file a person's row lands in, and where in it, must not be a public
function of which person keys are present: it is a secret keyed function of
the person (SipHash-2-4 of the public person hash, then Spark's hash
partitioning into a public number of partitions, then ``_pk`` order).
"""

from __future__ import annotations

import glob
import os
import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from sparkpriv.mechanisms.projection import secret_matrix_and_seed
from sparkpriv.privacy.prf import siphash24_u64, split_key
from sparkpriv.privacy.random import derive_seed
from sparkpriv.api import release_dprp
from sparkpriv.spark.events import LAYOUT_LABEL, bound_contributions
from sparkpriv.api import release_projection

# SipHash-2-4 reference vectors (Aumasson & Bernstein 2012, appendix / reference
# implementation): key 00 01 .. 0f, message 00 01 .. (len-1), for len = 0 .. 16;
# each output as its 8 little-endian bytes.
SIPHASH_VECTORS = [
    "310e0edd47db6f72", "fd67dc93c539f874", "5a4fa9d909806c0d", "2d7efbd796666785",
    "b7877127e09427cf", "8da699cd64557618", "cee3fe586e46c9cb", "37d1018bf50002ab",
    "6224939a79f5f593", "b0e4a90bdf82009e", "f3b9dd94c5bb5d7a", "a7ad6b22462fb3f4",
    "fbe50e86bc8f1e75", "903d84c02756ea14", "eef27a8e90ca23f7", "e545be4961ca29a1",
    "db9bc2577fcc2a3f",
]
M64 = (1 << 64) - 1


def _rotl(x, b):
    return ((x << b) | (x >> (64 - b))) & M64


def siphash24_ref(key: bytes, msg: bytes) -> int:
    """A scalar SipHash-2-4 of any message, straight from the paper (the test's oracle)."""
    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def rnd():
        v[0] = (v[0] + v[1]) & M64; v[1] = _rotl(v[1], 13) ^ v[0]; v[0] = _rotl(v[0], 32)  # noqa: E702
        v[2] = (v[2] + v[3]) & M64; v[3] = _rotl(v[3], 16) ^ v[2]  # noqa: E702
        v[0] = (v[0] + v[3]) & M64; v[3] = _rotl(v[3], 21) ^ v[0]  # noqa: E702
        v[2] = (v[2] + v[1]) & M64; v[1] = _rotl(v[1], 17) ^ v[2]; v[2] = _rotl(v[2], 32)  # noqa: E702

    n = len(msg)
    blocks = [int.from_bytes(msg[i:i + 8], "little") for i in range(0, n - n % 8, 8)]
    blocks.append(int.from_bytes(msg[n - n % 8:], "little") | ((n & 0xFF) << 56))
    for m in blocks:
        v[3] ^= m
        rnd()
        rnd()
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        rnd()
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def test_siphash_reference_vectors():
    key = bytes(range(16))
    for n, want in enumerate(SIPHASH_VECTORS):
        assert siphash24_ref(key, bytes(range(n))).to_bytes(8, "little").hex() == want, n
    # the numpy PRF hashes one 64-bit word: the 8-byte vector
    word = np.array([int.from_bytes(bytes(range(8)), "little")], np.uint64)
    assert int(siphash24_u64(word, key)[0]).to_bytes(8, "little").hex() == SIPHASH_VECTORS[8]
    as_signed_int_key = siphash24_u64(word.view(np.int64), int.from_bytes(key, "little"))
    assert int(as_signed_int_key[0]) == int(siphash24_u64(word, key)[0])
    # ... and equals the scalar oracle on random words and keys (signed words as their bits)
    rng = np.random.default_rng(0)
    for _ in range(5):
        kb = rng.bytes(16)
        w = rng.integers(-2**63, 2**63 - 1, 300, dtype=np.int64, endpoint=True)
        got = siphash24_u64(w, kb)
        ref = [siphash24_ref(kb, int(x).to_bytes(8, "little", signed=True)) for x in w]
        assert got.dtype == np.uint64 and got.tolist() == ref
    assert split_key(bytes(range(16))) == (0x0706050403020100, 0x0F0E0D0C0B0A0908)
    with pytest.raises(TypeError):
        siphash24_u64(np.zeros(3, np.int32), key)


# Spark's hash partitioning, modelled in numpy: pmod(murmur3_x86_32(long, seed 42), P)

def _murmur3_long(x: np.ndarray, seed: int = 42) -> np.ndarray:
    x = np.asarray(x, np.int64).view(np.uint64)
    m32 = np.uint64(0xFFFFFFFF)

    def rotl32(v, b):
        return ((v << np.uint64(b)) | (v >> np.uint64(32 - b))) & m32

    def mix_k1(k):
        k = (k * np.uint64(0xCC9E2D51)) & m32
        k = rotl32(k, 15)
        return (k * np.uint64(0x1B873593)) & m32

    def mix_h1(h, k):
        h = rotl32(h ^ k, 13)
        return (h * np.uint64(5) + np.uint64(0xE6546B64)) & m32

    h = np.full(x.shape, seed, np.uint64)
    h = mix_h1(h, mix_k1(x & m32))
    h = mix_h1(h, mix_k1(x >> np.uint64(32)))
    h ^= np.uint64(8)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & m32
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & m32
    h ^= h >> np.uint64(16)
    return h.astype(np.uint32).view(np.int32)


def model_layout(ph: np.ndarray, layout_key: int, P: int) -> tuple[np.ndarray, np.ndarray]:
    """(partition, _pk) of each person hash under the layout key: the layout in numpy."""
    pk = siphash24_u64(np.asarray(ph, np.int64), layout_key).view(np.int64)
    return np.mod(_murmur3_long(pk).astype(np.int64), P), pk


def _layout_key(seed: bytes) -> int:
    return derive_seed(derive_seed(seed, "contribution-bounding"), LAYOUT_LABEL)


def test_numpy_partition_model_is_sparks(spark):
    from pyspark.sql import functions as F

    rng = np.random.default_rng(1)
    v = rng.integers(-2**63, 2**63 - 1, 500, dtype=np.int64).tolist() + [0, -1, 1, 2**63 - 1, -2**63]
    df = spark.createDataFrame([(int(x),) for x in v], "x long")
    got = [(r["x"], r["h"]) for r in df.select("x", F.hash("x").alias("h")).collect()]
    xs = np.array([g[0] for g in got], np.int64)
    assert _murmur3_long(xs).tolist() == [g[1] for g in got]


P_LAYOUT = 4


def _people_in_one_groupby_partition(spark, n_people, shuffle_partitions):
    """String person keys that Spark's groupBy shuffle sends to ONE partition (today's layout)."""
    from pyspark.sql import functions as F

    cand = spark.createDataFrame([(f"caller-{i}",) for i in range(20 * n_people)], "p string")
    part = cand.select("p", F.expr(f"pmod(hash(p), {shuffle_partitions})").alias("part"),
                       F.xxhash64("p").alias("ph"))
    rows = part.where("part = 0").limit(n_people).collect()
    assert len(rows) == n_people
    return [r["p"] for r in rows], np.array([r["ph"] for r in rows], np.int64)


def _files(out):
    """{partition id: [rows of that part file, in file order]} of a written release."""
    res = {}
    for f in sorted(glob.glob(os.path.join(out, "part-*.parquet"))):
        t = pq.read_table(f)
        if t.num_rows:
            pid = int(re.match(r"part-(\d+)", os.path.basename(f)).group(1))
            assert pid not in res
            res[pid] = np.column_stack([t.column(c).to_numpy() for c in t.column_names])
    return res


@pytest.mark.parametrize("writer", ["arrow", "spark"])
def test_projection_release_layout_is_the_keyed_layout(spark, tmp_path, writer):
    """People who all share one groupBy partition (one output file on the old code) are
    spread over the public number of files exactly as the numpy model of the keyed
    layout predicts: file = pmod(murmur3(SipHash_K(ph)), P), order = SipHash_K(ph)."""
    n = 120
    shuffle = int(spark.conf.get("spark.sql.shuffle.partitions"))
    people, ph = _people_in_one_groupby_partition(spark, n, shuffle)
    # person i has exactly one item, i: the release row identifies the person
    ev = spark.createDataFrame([(p, i) for i, p in enumerate(people) for _ in range(2)],
                               "person string, tower int")
    seed, mkey, k = b"layout-test-seed", b"layout-test-matrix", 8
    recs = bound_contributions(ev, person="person", item="tower", max_items=1, vocabulary=range(n),
                               seed=seed, layout_partitions=P_LAYOUT)
    rel = release_projection(recs, k=k, epsilon=1e4, matrix_key=mkey)
    out = str(tmp_path / "rel")
    rel.write(out, writer=writer)
    files = _files(out)
    assert sum(len(v) for v in files.values()) == n
    assert len(files) > 1, "every row landed in one file: the layout is the public groupBy partition"

    Pm, _ = secret_matrix_and_seed(n, k, mkey)
    part, pk = model_layout(ph, _layout_key(seed), P_LAYOUT)
    for pid in range(P_LAYOUT):
        want = [i for i in np.argsort(pk, kind="stable") if part[i] == pid]
        rows = files.get(pid, np.zeros((0, k)))
        # nearest row of P (epsilon 1e4: the noise is far below the spacing of P's rows)
        d2 = ((rows[:, None, :] - Pm[None, :, :]) ** 2).sum(-1)
        got = np.argmin(d2, axis=1).tolist() if len(rows) else []
        assert got == want, f"file {pid}"


def test_replace_one_layout_distribution_does_not_depend_on_who_is_present(spark):
    """Neighbours A -> B that today land in different groupBy partitions (so different
    files, deterministically): over 400 secret keys, the file and the rank of the
    changed person's row have the same distribution for A and for B."""
    from scipy.stats import chi2_contingency

    n_others = 60
    shuffle = int(spark.conf.get("spark.sql.shuffle.partitions"))
    from pyspark.sql import functions as F

    cand = spark.createDataFrame([(f"person-{i}",) for i in range(200)], "p string")
    rows = cand.select("p", F.expr(f"pmod(hash(p), {shuffle})").alias("part"),
                       F.xxhash64("p").alias("ph")).collect()
    a = next(r for r in rows if r["part"] == 0)
    b = next(r for r in rows if r["part"] == 1)
    others = np.array([r["ph"] for r in rows if r["p"] not in (a["p"], b["p"])][:n_others], np.int64)

    rng = np.random.default_rng(7)
    n_keys = 400

    def placement(ph_changed, key):
        ph = np.append(others, ph_changed)
        part, pk = model_layout(ph, key, P_LAYOUT)
        same = part == part[-1]
        rank = int(np.sum(pk[same] < pk[-1]))  # position inside its file
        return int(part[-1]), min(rank * 4 // max(int(same.sum()), 1), 3)

    fa, fb = np.zeros((P_LAYOUT, 4)), np.zeros((P_LAYOUT, 4))
    for _ in range(n_keys):
        key = int.from_bytes(rng.bytes(16), "little")
        fa[placement(a["ph"], key)] += 1
        fb[placement(b["ph"], key)] += 1
    for tab in (np.vstack([fa.sum(1), fb.sum(1)]), np.vstack([fa.sum(0), fb.sum(0)])):
        assert chi2_contingency(tab)[1] > 1e-3
    assert fa.sum(1).min() > 0.15 * n_keys  # all files used (uniform: 0.25 each)
    # positive control: the old layout (groupBy partition of the key) always tells A from B
    old = np.vstack([np.bincount([a["part"]] * n_keys, minlength=P_LAYOUT),
                     np.bincount([b["part"]] * n_keys, minlength=P_LAYOUT)])
    assert chi2_contingency(old[:, old.sum(0) > 0])[1] < 1e-6


def test_recomputed_release_is_identical(spark):
    """The same release recomputed, with the groupBy shuffle cut differently (so
    the grouped people arrive in other tasks and orders), gives the same rows, noise
    included, in the same partitions and order."""
    from pyspark.sql import functions as F

    rng = np.random.default_rng(3)
    ev = spark.createDataFrame([(f"c{int(p)}", int(t)) for p, t in zip(rng.integers(0, 400, 3000),
                                                                         rng.integers(0, 30, 3000))],
                               "person string, tower int")
    recs = bound_contributions(ev, person="person", item="tower", max_items=3, vocabulary=range(30),
                               seed=b"recompute-seed-1", layout_partitions=3)
    rel = release_projection(recs, k=4, epsilon=1.0)

    def run():
        df = rel.rows.to_df().withColumn("pid", F.spark_partition_id())
        return [tuple(r) for r in df.collect()]

    first = run()
    old = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        spark.conf.set("spark.sql.shuffle.partitions", "7")
        second = run()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", old)
    assert len(first) == len({r[0] for r in first}) > 300  # noisy rows, one per person
    assert first == second
    assert {r[-1] for r in first} == {0, 1, 2}


def test_layout_key_is_not_in_the_plan(spark, capsys):
    ev = spark.createDataFrame([("a", 1), ("b", 2), ("c", 1)], "person string, tower int")
    seed = b"plan-secret-seed"
    recs = bound_contributions(ev, person="person", item="tower", max_items=2, vocabulary=range(5),
                               seed=seed, layout_partitions=5)
    lkey = _layout_key(seed)
    k0, k1 = split_key(lkey)
    rel = release_projection(recs, k=2, epsilon=1.0)
    rel2 = release_dprp(recs, epsilon=1.0, delta=1e-5, k1=4, k2=2)  # its row pass
    for df in (recs.layout, rel.df, rel2.df):
        df.collect()
        df.explain(True)
        plan = capsys.readouterr().out
        assert "sparkpriv_keyed_layout" in plan and "REPARTITION_BY_NUM" in plan
        # adaptive execution may coalesce the groupBy shuffle, never the layout's: the final
        # plan reads the layout exchange without an AQEShuffleRead coalescing it
        assert "hashpartitioning(_pk" in plan
        assert not re.search(r"AQEShuffleRead coalesced\s*\n\s*\+- ShuffleQueryStage \d+\s*\n"
                             r"\s*\+- Exchange hashpartitioning\(_pk", plan)
        for secret in (lkey, k0, k1, recs._key):
            for s in (str(secret), hex(secret)[2:], str(secret - (1 << 64) if secret >= 1 << 63 else secret)):
                assert s not in plan
    # aggregate consumers do not pay the layout shuffle
    recs.grouped.explain(True)
    assert "sparkpriv_keyed_layout" not in capsys.readouterr().out
