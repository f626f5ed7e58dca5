"""The Arrow writer on an object store without a rename (a real S3 API: moto's server on
127.0.0.1, tests/io/conftest.py), and the receipt in every part file's footer."""

from __future__ import annotations

import io
import json
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkpriv.errors import InputError, OutputExistsError, ParameterError
from sparkpriv.io import stores as S
from sparkpriv.io import writer as W
from sparkpriv.privacy.random import reset_test_counter
from sparkpriv.spark.batches import BatchMap
from sparkpriv.api import release_projection

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def table_path(spark, tmp_path_factory):
    rng = np.random.default_rng(5)
    rows = [(f"p{i:04d}", *map(float, rng.normal(0, 1, 3))) for i in range(300)]
    path = str(tmp_path_factory.mktemp("s3t") / "t.parquet")
    spark.createDataFrame(rows, "person string, a double, b double, c double").repartition(3) \
        .write.parquet(path)
    return path


@pytest.fixture(scope="module")
def table(spark, table_path):
    return spark.read.parquet(table_path)


def _release(table):
    return release_projection(table, columns=["a", "b", "c"], k=2, epsilon=1.0, row_bound=2.0,
                              keep_columns=["person"], matrix_key=b"k" * 32)


def _z0(schema):
    from pyspark.sql.types import DoubleType, StructField, StructType

    return StructType([StructField("z0", DoubleType(), False)])


def _copy(batches, pid):
    for b in batches:
        yield pa.RecordBatch.from_arrays([b.column(0)], ["z0"])


def _left_behind(bucket, prefix="rel/"):
    """Objects in the bucket other than pyarrow's empty marker of the parent prefix."""
    return [k for k in bucket.keys() if k != prefix]


def test_row_release_to_s3_equals_the_local_release(spark, table, bucket, tmp_path, test_seed):
    reset_test_counter()  # the same secrets for both releases
    local = _release(table).write(str(tmp_path / "local"), writer="spark")  # the other writer: a reference
    reset_test_counter()
    out = _release(table).write(bucket.uri("rel/towers"))  # auto: the Arrow writer
    assert out == f"s3://{bucket.name}/rel/towers"

    keys = bucket.keys()
    names = [k[len("rel/towers/"):] for k in keys if k.startswith("rel/towers/")]
    parts = sorted(n for n in names if n.startswith("part-"))
    assert len(parts) == table.rdd.getNumPartitions() and all(n.endswith(".snappy.parquet") and "/" not in n for n in parts)
    assert set(names) - set(parts) == {"_SUCCESS", "_common_metadata", W.RECEIPT_FILE}
    assert set(keys) - {f"rel/towers/{n}" for n in names} <= {"rel/"}  # no staging prefix is left
    assert json.loads(bucket.get("rel/towers/_SUCCESS"))["files"] == parts

    got = pa.concat_tables([pq.read_table(io.BytesIO(bucket.get(f"rel/towers/{p}"))) for p in parts])
    got = got.to_pandas().sort_values("person").reset_index(drop=True)
    want = spark.read.parquet(local).toPandas().sort_values("person").reset_index(drop=True)
    assert list(got.columns) == ["person", "z0", "z1"] and len(got) == 300
    np.testing.assert_array_equal(got.to_numpy(), want.to_numpy())

    receipt = json.loads(bucket.get(f"rel/towers/{W.RECEIPT_FILE}"))
    assert receipt["output"]["path"] == out and receipt["mechanism"] == "projection"
    for p in parts:  # every part file carries the whole receipt in its footer
        meta = pq.read_metadata(io.BytesIO(bucket.get(f"rel/towers/{p}"))).metadata
        assert json.loads(meta[b"sparkpriv.receipt"]) == receipt
    summary = pq.read_metadata(io.BytesIO(bucket.get("rel/towers/_common_metadata"))).metadata
    assert json.loads(summary[b"sparkpriv.receipt"]) == receipt


@pytest.mark.parametrize("how", ["arrow", "spark"])
def test_a_part_file_copied_alone_says_what_it_is(spark, table, tmp_path, how):
    out = _release(table).write(str(tmp_path / "out"), writer=how)
    receipt = json.loads((tmp_path / "out" / W.RECEIPT_FILE).read_text())
    part = next(p for p in sorted((tmp_path / "out").iterdir()) if p.name.startswith("part-"))
    alone = tmp_path / "alone.parquet"
    alone.write_bytes(part.read_bytes())
    meta = pq.read_metadata(str(alone)).metadata or {}
    if how == "spark":  # Spark's writer: the summary file only (no hook for footer metadata)
        assert b"sparkpriv.receipt" not in meta
        common = pq.read_metadata(str(tmp_path / "out" / "_common_metadata")).metadata
        assert json.loads(common[b"sparkpriv.receipt"]) == receipt
        return
    assert json.loads(meta[b"sparkpriv.receipt"]) == receipt
    assert receipt["output"]["path"] == "out" and out.endswith(f"{tmp_path}/out")  # no local absolute path
    duckdb = pytest.importorskip("duckdb")
    rows = duckdb.sql(f"SELECT key, value FROM parquet_kv_metadata('{alone}')").fetchall()
    kv = {bytes(k): bytes(v) for k, v in rows}
    assert json.loads(kv[b"sparkpriv.receipt"]) == receipt
    assert duckdb.sql(f"SELECT count(*) FROM '{alone}'").fetchall()[0][0] > 0


def test_failed_task_leaves_nothing_on_s3(spark, table, bucket):
    def half_then_fail(batches, pid):
        from sparkpriv.spark.batches import ERROR_MARK

        for b in batches:
            yield pa.RecordBatch.from_arrays([b.column(0)], ["z0"])
            if pid == 1:  # the other partitions may already be complete
                raise InputError(f"{ERROR_MARK}<<column 'a' is bad>>")

    rows = BatchMap(table.select("a"), half_then_fail, _z0(None))
    with pytest.raises(InputError, match="column 'a' is bad"):
        W.publish(rows.to_df(), bucket.uri("rel/out"), receipt={}, rows=rows, writer="arrow")
    assert _left_behind(bucket) == []


def test_a_task_after_the_staging_was_deleted_leaves_nothing_on_s3(spark, table, bucket, s3_endpoint):
    """A task of a failed job can still run when the driver deletes the staging prefix: it must
    fail and leave no object behind. Here the task deletes the staging prefix itself first."""
    name = bucket.name

    def late(batches, pid):
        from pyarrow import fs

        s3 = fs.S3FileSystem(endpoint_override=s3_endpoint, scheme="http", region="us-east-1")
        for info in s3.get_file_info(fs.FileSelector(f"{name}/rel", recursive=False)):
            if ".sparkpriv-staging-" in info.path:
                s3.delete_dir(info.path)
        for b in batches:
            yield pa.RecordBatch.from_arrays([b.column(0)], ["z0"])

    rows = BatchMap(table.select("a").coalesce(1), late, _z0(None))
    with pytest.raises(Exception, match="staging directory .* is not there"):
        W.publish(rows.to_df(), bucket.uri("rel/out"), receipt={}, rows=rows, writer="arrow")
    assert _left_behind(bucket) == []


def test_refused_empty_input_leaves_nothing_on_s3(spark, bucket):
    from sparkpriv.spark.events import bound_contributions

    events = spark.createDataFrame([], "person string, tower long")
    recs = bound_contributions(events, person="person", item="tower", max_items=2, vocabulary=range(10))
    rel = release_projection(recs, k=3, epsilon=1.0)
    with pytest.raises(InputError, match="empty"):
        rel.write(bucket.uri("rel/out"))
    assert _left_behind(bucket) == []


def test_publish_order_and_a_failed_copy(spark, table, bucket, monkeypatch):
    """What a reader of the destination sees: nothing until every task is done, then part
    files, then the receipt files, then _SUCCESS last; a failed copy leaves nothing."""
    rows = BatchMap(table.select("a"), _copy, _z0(None))
    dest = f"s3://{bucket.name}/rel/out"
    seen, real_copy, real_write = [], S._ArrowStore.copy, S._ArrowStore.write_bytes

    def under_dest():
        return [k[len("rel/out/"):] for k in bucket.keys() if k.startswith("rel/out/")]

    lock = threading.Lock()  # the copies run on a thread pool: check and record atomically

    def copy(self, src, dst):
        with lock:
            if not seen:
                assert under_dest() == []  # all tasks have finished: still nothing at the destination
            seen.append(("copy", dst[len(dest) + 1:]))
            n = len(seen)
        if fail and n == 2:
            raise OSError("injected copy failure")
        real_copy(self, src, dst)

    def write_bytes(self, path, data):
        if path.startswith(dest + "/"):
            name = path[len(dest) + 1:]
            if name == "_SUCCESS":  # the last write: everything else is there already
                assert sorted(under_dest()) == sorted(n for _, n in seen)
            seen.append(("write", name))
        real_write(self, path, data)

    monkeypatch.setattr(S._ArrowStore, "copy", copy)
    monkeypatch.setattr(S._ArrowStore, "write_bytes", write_bytes)
    fail = True
    with pytest.raises(OSError, match="injected copy failure"):
        W.publish(rows.to_df(), bucket.uri("rel/out"), receipt={"r": 1}, rows=rows, writer="arrow")
    assert _left_behind(bucket) == []

    seen.clear()
    fail = False
    W.publish(rows.to_df(), bucket.uri("rel/out"), receipt={"r": 1}, rows=rows, writer="arrow")
    ops = [op for op, _ in seen]
    k = table.rdd.getNumPartitions()
    assert ops == ["copy"] * k + ["write"] * 3
    assert [name for _, name in seen[k:]] == ["_privacy_receipt.json", "_common_metadata", "_SUCCESS"]
    assert json.loads(bucket.get("rel/out/_SUCCESS"))["files"] == sorted(n for _, n in seen[:-3])


def test_overwrite_on_s3(spark, table, bucket):
    rows = BatchMap(table.select("a"), _copy, _z0(None))
    uri = bucket.uri("rel/out")
    W.publish(rows.to_df(), uri, receipt={"n": 1}, rows=rows, writer="arrow")
    first = set(bucket.keys())
    with pytest.raises(OutputExistsError, match="already exists"):
        W.publish(rows.to_df(), uri, receipt={"n": 2}, rows=rows, writer="arrow")
    assert set(bucket.keys()) == first
    W.publish(rows.to_df(), uri, receipt={"n": 2}, rows=rows, writer="arrow", overwrite=True)
    keys = [k for k in bucket.keys() if k.startswith("rel/out/")]
    parts = sorted(k for k in keys if "/part-" in k)
    assert len(parts) == table.rdd.getNumPartitions() and not set(parts) & first  # the old part files are gone
    assert json.loads(bucket.get(f"rel/out/{W.RECEIPT_FILE}")) == {"n": 2}
    assert sum(pq.read_metadata(io.BytesIO(bucket.get(p))).num_rows for p in parts) == 300


def test_object_store_paths_that_are_refused(spark, bucket):
    with pytest.raises(ParameterError) as e:
        W.check_output_path(spark, f"s3://AKIDKEY:S3CR3T@{bucket.name}/x", False)
    assert "S3CR3T" not in str(e.value) and "AKIDKEY" not in str(e.value) and "environment" in str(e.value)
    with pytest.raises(ParameterError, match="whole bucket"):
        W.check_output_path(spark, f"s3://{bucket.name}?{bucket.query}", False)
    # an aggregate release (no rows computed in Python) would go to Spark's writer: this Spark
    # (no hadoop-aws) has no filesystem for s3://, and the error names the fix
    with pytest.raises(ParameterError, match=r"s3a://b/x instead.*hadoop-aws"):
        W.choose_writer(spark, "s3://b/x", None)
    with pytest.raises(ParameterError, match=r"s3a://b/x instead.*hadoop-aws"):
        W.choose_writer(spark, "s3://b/x", object(), "spark")


def test_cli_output_s3_uses_the_arrow_writer(spark, table_path, bucket, s3_endpoint, monkeypatch, capsys):
    from sparkpriv.cli import main

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3_endpoint}")  # the usual variable: no query string
    dest = f"s3://{bucket.name}/rel/cli"
    rc = main(["release", "projection", "--input", table_path, "--output", dest, "--columns", "a,b,c",
               "--k", "2", "--epsilon", "1", "--row-bound", "2"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"private table: {dest}" in out and f"receipt:       {dest}/{W.RECEIPT_FILE}" in out
    manifest = json.loads(bucket.get("rel/cli/_SUCCESS"))
    assert manifest["writer"] == "sparkpriv-arrow"  # Spark's writer leaves an empty _SUCCESS
    receipt = json.loads(bucket.get(f"rel/cli/{W.RECEIPT_FILE}"))
    assert receipt["output"]["path"] == dest
    n = 0
    for p in manifest["files"]:
        f = pq.read_table(io.BytesIO(bucket.get(f"rel/cli/{p}")))
        assert json.loads(f.schema.metadata[b"sparkpriv.receipt"]) == receipt
        n += f.num_rows
    assert n == 300


def test_cli_aggregate_release_to_s3_is_refused_before_reading(spark, bucket, s3_endpoint, tmp_path,
                                                              monkeypatch, capsys):
    """k-means centres are written by Spark's writer: this Spark has no s3:// filesystem; the
    refusal names the fix and comes before the input (which does not exist) is read."""
    from sparkpriv.cli import main

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3_endpoint}")
    rc = main(["release", "kmeans", "--input", str(tmp_path / "missing.parquet"), "--output",
               f"s3://{bucket.name}/rel/km", "--columns", "a,b", "--k", "2", "--epsilon", "1",
               "--delta", "1e-6", "--row-bound", "1", "--variant", "linear"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"s3a://{bucket.name}/rel/km instead" in err and "hadoop-aws" in err
    assert "missing.parquet" not in err
    assert bucket.keys() == []


def _s3_options(store) -> dict:
    return store.fs.__reduce__()[1][0]  # pyarrow's pickled S3Options, as the tasks receive them


def test_small_s3_objects_are_single_puts(bucket):
    """Markers, receipts and small part files go up as one PutObject (delayed opening), not as a
    multipart upload of one part (three requests, and an empty part some S3 servers refuse);
    the user's own setting wins."""
    store = S._ArrowStore(bucket.uri("rel/x"))
    assert _s3_options(store)["allow_delayed_open"] is True
    store.write_bytes(bucket.uri("rel/x/_marker"), b"")
    assert bucket.get("rel/x/_marker") == b""
    own = S._ArrowStore(bucket.uri("rel/x") + "&allow_delayed_open=false")
    assert _s3_options(own)["allow_delayed_open"] is False
    assert S._with_delayed_open("file:/tmp/x", "file") == "file:/tmp/x"
    assert S._with_delayed_open("s3://b/k", "s3") == "s3://b/k?allow_delayed_open=true"
