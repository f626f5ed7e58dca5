"""Publishing with the Arrow writer (part files written by the Python tasks) vs Spark's writer."""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkpriv.errors import InputError, ParameterError
from sparkpriv.io import writer as W
from sparkpriv.privacy.random import reset_test_counter
from sparkpriv.spark.batches import BatchMap
from sparkpriv.spark.events import bound_contributions
from sparkpriv.api import release_projection

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):
    rng = np.random.default_rng(3)
    rows = [(f"p{i:04d}", *map(float, rng.normal(0, 1, 4))) for i in range(2000)]
    path = str(tmp_path_factory.mktemp("w") / "t.parquet")
    spark.createDataFrame(rows, "person string, a double, b double, c double, e double") \
        .repartition(4).write.parquet(path)
    return spark.read.parquet(path)


def _files(path):
    return sorted(p for p in os.listdir(path) if not p.startswith("."))  # not Hadoop's .crc files


def _read_sorted(spark, path, key):
    return spark.read.parquet(path).toPandas().sort_values(key).reset_index(drop=True)


def test_arrow_and_spark_writers_publish_the_same_table(spark, table, tmp_path, test_seed):
    out = {}
    for how in ("spark", "arrow"):
        reset_test_counter()  # the same secrets (matrix, noise seed) for both releases
        rel = release_projection(table, columns=["a", "b", "c", "e"], k=3, epsilon=1.0, row_bound=2.0,
                                 keep_columns=["person"], matrix_key=b"k" * 32)
        out[how] = rel.write(str(tmp_path / how), writer=how)
    a, s = (_read_sorted(spark, out[h], "person") for h in ("arrow", "spark"))
    assert len(a) == 2000 and list(a.columns) == ["person", "z0", "z1", "z2"]
    np.testing.assert_array_equal(a.to_numpy(), s.to_numpy())
    arrow_files = _files(tmp_path / "arrow")
    parts = [f for f in arrow_files if f.startswith("part-")]
    assert len(parts) == table.rdd.getNumPartitions() == len(
        [f for f in _files(tmp_path / "spark") if f.startswith("part-")])  # one file per partition, as Spark
    assert all(f.endswith(".snappy.parquet") for f in parts)
    assert set(arrow_files) - set(parts) == {"_SUCCESS", "_common_metadata", W.RECEIPT_FILE}
    # the declared schema (non-nullable noisy columns) is the files' schema
    schema = pq.read_schema(str(tmp_path / "arrow" / parts[0]))
    assert [(f.name, str(f.type), f.nullable) for f in schema] == [
        ("person", "string", True), ("z0", "double", False), ("z1", "double", False), ("z2", "double", False)]
    rec = json.loads((tmp_path / "arrow" / W.RECEIPT_FILE).read_text())
    assert rec["output"]["path"] == "arrow" and out["arrow"].endswith(f"{tmp_path}/arrow")  # no absolute path


def test_auto_uses_arrow_for_local_row_releases_only(spark, table, tmp_path):
    rel = release_projection(table, columns=["a", "b"], k=1, epsilon=1.0, row_bound=1.0)
    local = W.check_output_path(spark, str(tmp_path / "x"), False)
    assert W.choose_writer(spark, local, rel.rows) == "arrow"
    assert W.choose_writer(spark, local, None) == "spark"
    assert W.choose_writer(spark, "hdfs://nn:8020/x", rel.rows) == "spark"
    assert W.choose_writer(spark, local, rel.rows, "spark") == "spark"
    with pytest.raises(ParameterError, match="not a row-level table"):
        W.choose_writer(spark, local, None, "arrow")
    with pytest.raises(ParameterError, match="local .file:. paths"):
        W.choose_writer(spark, "s3a://bucket/x", rel.rows, "arrow")  # Hadoop's S3: pyarrow's is s3://
    assert W.choose_writer(spark, "hdfs://nn:8020/x", rel.rows, "arrow") == "arrow"  # asked for: pyarrow's HDFS
    assert W.choose_writer(spark, "s3://bucket/x", rel.rows) == "arrow"
    with pytest.raises(ParameterError, match="writer must be one of auto, spark, arrow"):
        rel.write(str(tmp_path / "y"), writer="fast")
    assert not (tmp_path / "y").exists()


def test_event_release_with_arrow_writer_equals_spark_writer(spark, tmp_path, test_seed):
    rng = np.random.default_rng(8)
    ev = [(int(p), int(t)) for p in range(600) for t in rng.integers(0, 50, rng.integers(1, 40))]
    events = spark.createDataFrame(ev, "caller long, tower long").repartition(3)
    got = {}
    for how in ("spark", "arrow"):
        reset_test_counter()
        recs = bound_contributions(events, person="caller", item="tower", max_items=8,
                                   vocabulary=range(0, 50), seed=b"s" * 16)
        rel = release_projection(recs, k=4, epsilon=1.0, matrix_key=b"m" * 32)
        got[how] = spark.read.parquet(rel.write(str(tmp_path / how), writer=how)).toPandas()
    assert len(got["arrow"]) == 600
    # no person key in the output: compare as sorted rows
    a, s = (got[h].sort_values(list(got[h].columns)).to_numpy() for h in ("arrow", "spark"))
    np.testing.assert_array_equal(a, s)


def test_empty_output_keeps_the_schema(spark, table, tmp_path):
    from pyspark.sql.types import DoubleType, StructField, StructType

    schema = StructType([StructField("z0", DoubleType(), False)])

    def nothing(batches, pid):
        for _ in batches:
            pass
        return iter(())

    rows = BatchMap(table.select("a"), nothing, schema)
    out = W.publish(rows.to_df(), str(tmp_path / "out"), receipt={}, rows=rows, writer="arrow")
    back = spark.read.parquet(out)
    assert back.schema.fieldNames() == ["z0"] and back.count() == 0


def test_task_failure_and_invisible_files_leave_nothing(spark, table, tmp_path, monkeypatch):
    from pyspark.sql.types import DoubleType, StructField, StructType

    schema = StructType([StructField("z0", DoubleType(), False)])

    def half_then_fail(batches, pid):
        from sparkpriv.spark.batches import ERROR_MARK

        for b in batches:
            yield pa.RecordBatch.from_arrays([b.column(0)], ["z0"])
            if pid == 1:  # the other partition may already be complete
                raise InputError(f"{ERROR_MARK}<<column 'a' is bad>>")

    rows = BatchMap(table.select("a"), half_then_fail, schema)
    with pytest.raises(InputError, match="column 'a' is bad"):
        W.publish(rows.to_df(), str(tmp_path / "out"), receipt={}, rows=rows, writer="arrow")
    assert list(tmp_path.iterdir()) == []

    def copy(batches, pid):
        for b in batches:
            yield pa.RecordBatch.from_arrays([b.column(0)], ["z0"])

    rows = BatchMap(table.select("a"), copy, schema)
    monkeypatch.setattr(W, "_missing_files", lambda store, paths: paths)  # as if the executors wrote elsewhere
    with pytest.raises(OSError, match="not visible on the driver"):
        W.publish(rows.to_df(), str(tmp_path / "out"), receipt={}, rows=rows, writer="arrow")
    assert list(tmp_path.iterdir()) == []


def test_a_task_after_the_staging_was_deleted_does_not_bring_it_back(spark, table, tmp_path):
    """A task of a failed job can still be running when the driver deletes the staging
    directory; it must fail rather than re-create the directory and leave a part file
    behind (seen on the standalone cluster). Here the task itself deletes the staging
    directory before writing, as the driver's clean-up would."""
    from pyspark.sql.types import DoubleType, StructField, StructType

    schema = StructType([StructField("z0", DoubleType(), False)])
    where = str(tmp_path)

    def late(batches, pid):
        import glob
        import shutil

        for b in batches:
            for d in glob.glob(where + "/.out.sparkpriv-staging-*"):
                shutil.rmtree(d)
            yield pa.RecordBatch.from_arrays([b.column(0)], ["z0"])

    rows = BatchMap(table.select("a").coalesce(1), late, schema)
    with pytest.raises(Exception, match="staging directory .* is not there"):
        W.publish(rows.to_df(), str(tmp_path / "out"), receipt={}, rows=rows, writer="arrow")
    assert list(tmp_path.iterdir()) == []


def test_arrow_writer_takes_large_string_batches(spark, table, tmp_path):
    """With large Arrow var types Spark hands the tasks large_string columns; the files keep the schema."""
    spark.conf.set("spark.sql.execution.arrow.useLargeVarTypes", "true")
    try:
        rel = release_projection(table, columns=["a", "b"], k=1, epsilon=1.0, row_bound=1.0,
                                 keep_columns=["person"])
        out = rel.write(str(tmp_path / "out"), writer="arrow")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.useLargeVarTypes")
    back = spark.read.parquet(out)
    assert [(f.name, f.dataType.simpleString()) for f in back.schema] == [("person", "string"), ("z0", "double")]
    assert sorted(r["person"] for r in back.select("person").collect()) == [f"p{i:04d}" for i in range(2000)]


def test_dprp_table_with_both_writers_is_the_same(spark, tmp_path, test_seed):
    """DPRP output has typed columns (an integer column, private string labels, a kept key)."""
    from sparkpriv.api import release_dprp

    rng = np.random.default_rng(12)
    rows = [(f"p{i:04d}", int(rng.integers(0, 10)), float(rng.random()), ["u", "v"][i % 2]) for i in range(600)]
    df = spark.createDataFrame(rows, "person string, n int, x double, lab string").repartition(2)
    got = {}
    for how in ("spark", "arrow"):
        reset_test_counter()
        rel = release_dprp(df, columns=["n", "x"], label="lab", labels="private", classes=["u", "v"],
                           epsilon=1.0, delta=1e-5, lower=[0, 0], upper=[10, 1], keep_columns=["person"])
        got[how] = _read_sorted(spark, rel.write(str(tmp_path / how), writer=how), "person")
    assert list(got["arrow"].columns) == list(got["spark"].columns) and len(got["arrow"]) == 600
    assert got["arrow"].equals(got["spark"])
    back = spark.read.parquet(str(tmp_path / "arrow"))
    assert dict((f.name, f.dataType.simpleString()) for f in back.schema)["n"] == "int"


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 1000])
def test_matrix_columns_are_the_columns(n):
    from sparkpriv.spark.batches import matrix_columns

    Z = np.random.default_rng(n).normal(size=(n, 5))
    cols = matrix_columns(Z, block_rows=256)
    assert len(cols) == 5
    for j, c in enumerate(cols):
        assert c.type == pa.float64() and len(c) == n
        np.testing.assert_array_equal(c.to_numpy(), Z[:, j])


@pytest.mark.parametrize("writer", ["arrow", "spark"])
def test_empty_event_table_is_refused_by_both_writers(spark, tmp_path, writer):
    # the Arrow writer looks at the input only when its tasks wrote no rows; Spark's checks first
    events = spark.createDataFrame([], "person string, tower long")
    recs = bound_contributions(events, person="person", item="tower", max_items=2, vocabulary=range(10))
    rel = release_projection(recs, k=3, epsilon=1.0)
    with pytest.raises(InputError, match="empty"):
        rel.write(str(tmp_path / "out"), writer=writer)
    assert os.listdir(tmp_path) == []  # no output, no staging directory
