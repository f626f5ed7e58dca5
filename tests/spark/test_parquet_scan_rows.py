"""The direct Parquet reader in row-level releases (reader='arrow'): the same table as the
release of the DataFrame of the same read, bit for bit, for any file, row-group and split
layout; an explicit choice that a transformation can never bypass; retries redraw the same
rows; a failed release leaves nothing behind."""

import contextlib
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkpriv.errors import InputError
from sparkpriv.io.inputs import read_table
from sparkpriv.privacy.random import reset_test_counter
from sparkpriv.api import release_dprp
from sparkpriv.spark.parquet_scan import ParquetInput, parquet_scan
from sparkpriv.api import release_projection

pytestmark = pytest.mark.spark

FEATURES = ["a", "b", "n"]


@contextlib.contextmanager
def spark_conf(spark, **settings):
    """Set SQL settings (dots as __) for the block; the session is shared by every test."""
    keys = {k.replace("__", "."): str(v) for k, v in settings.items()}
    old = {k: spark.conf.get(k, None) for k in keys}
    for k, v in keys.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def _frame(rng, n, start):
    return pd.DataFrame({
        "person": [f"p{i:05d}" for i in range(start, start + n)],
        "a": rng.random(n), "b": rng.normal(0, 2, n), "n": rng.integers(0, 60, n).astype("int32"),
        "y": rng.choice(["p", "q"], n),
    })


def _pyarrow_dataset(path, sizes, row_group_size, seed=8):
    rng = np.random.default_rng(seed)
    os.makedirs(path)
    start = 0
    for i, n in enumerate(sizes):
        pq.write_table(pa.Table.from_pandas(_frame(rng, n, start), preserve_index=False),
                       f"{path}/part-{i}.parquet", row_group_size=row_group_size)
        start += n
    return path


# Layouts: (files and row groups, Spark split size, Arrow batch rows). Small splits cut files
# into several tasks (and leave some tasks without a row group); batches cross row groups and files.
LAYOUTS = {
    "many-row-groups-split-files": dict(sizes=(1200, 500, 1, 0), row_group_size=300,
                                        max_partition_bytes=9000, batch_rows=700),
    "whole-files-one-batch-each": dict(sizes=(900, 1100), row_group_size=10_000,
                                       max_partition_bytes=None, batch_rows=None),
    "tiny-batches": dict(sizes=(1000, 700, 300), row_group_size=128, max_partition_bytes=20000,
                         batch_rows=97),
}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def layout(request, tmp_path_factory):
    lay = LAYOUTS[request.param]
    path = _pyarrow_dataset(str(tmp_path_factory.mktemp("rows") / "t"), lay["sizes"], lay["row_group_size"])
    return path, lay


def _conf(lay):
    s = {}
    if lay["max_partition_bytes"]:
        s["spark__sql__files__maxPartitionBytes"] = lay["max_partition_bytes"]
        s["spark__sql__files__openCostInBytes"] = 1
    if lay["batch_rows"]:
        s["spark__sql__execution__arrow__maxRecordsPerBatch"] = lay["batch_rows"]
    return s


def _parts(path):
    """{partition index: the rows of its part file, in order}."""
    out = {}
    for f in sorted(os.listdir(path)):
        if f.startswith("part-"):
            out[int(f.split("-")[1])] = pq.read_table(os.path.join(path, f)).to_pandas()
    return out


def _projection(inp):
    return release_projection(inp, columns=FEATURES, k=2, epsilon=1.0, lower=[0, -5, 0], upper=[1, 5, 60],
                              keep_columns=["person"])


def test_projection_direct_reader_equals_dataframe_reader(spark, layout, tmp_path, test_seed):
    path, lay = layout
    out, frames = {}, {}
    with spark_conf(spark, **_conf(lay)):
        for reader in ("spark", "arrow"):
            reset_test_counter()  # the same secrets (matrix, noise seed) for both releases
            inp = read_table(spark, path, reader=reader)
            assert isinstance(inp, ParquetInput) == (reader == "arrow")
            rel = _projection(inp)
            frames[reader] = rel.df.toPandas()
            out[reader] = _parts(rel.write(str(tmp_path / reader)).replace("file:", ""))
    # every task wrote the same rows, with the same noise, in the same order (Spark's reader writes
    # no file for a split without rows; the direct reader runs no task for it)
    spark_parts = [out["spark"][p] for p in sorted(out["spark"])]
    arrow_parts = [out["arrow"][p] for p in sorted(out["arrow"])]
    assert len(arrow_parts) == len(spark_parts) and sorted(out["arrow"]) == list(range(len(arrow_parts)))
    for a, s in zip(arrow_parts, spark_parts):
        pd.testing.assert_frame_equal(a, s, check_exact=True)
    total = sum(lay["sizes"])
    assert sum(len(f) for f in out["arrow"].values()) == total
    # release.df is the same table as the one written (the same tasks, evaluated again)
    pd.testing.assert_frame_equal(frames["arrow"], frames["spark"], check_exact=True)
    written = pd.concat([out["arrow"][p] for p in sorted(out["arrow"])], ignore_index=True)
    pd.testing.assert_frame_equal(frames["arrow"], written, check_exact=True, check_dtype=False)


def test_direct_reader_pre_noise_values_match_numpy(spark, layout, test_seed):
    """Independent reference: the noiseless batch function over the direct reader's rows is
    X_clipped @ P for the rows of the files (any order, every row once)."""
    from sparkpriv.mechanisms.projection import project_rows, secret_matrix_and_seed
    from sparkpriv.privacy.bounds import Bounds
    from sparkpriv.spark.engine import SparkEngine

    path, lay = layout
    inp = read_table(spark, path, reader="arrow")
    P, seed = secret_matrix_and_seed(3, 2, b"k" * 32)
    bounds = Bounds(3, (0.0, -5.0, 0.0), (1.0, 5.0, 60.0))

    def noiseless(pid, blocks):  # the projection's row map without its noise
        for X in blocks:
            Y, _ = project_rows(X, P, bounds)
            yield [Y[:, 0].copy(), Y[:, 1].copy()]

    with spark_conf(spark, **_conf(lay)):
        eng = SparkEngine()
        src = eng.open(inp, columns=FEATURES, fill=None, caller="t", keep=["person"])
        df, rows = eng.map_rows(src, noiseless, [("z0", "double", False), ("z1", "double", False)],
                                keep=["person"])
        assert rows.source is not inp.df  # the direct reader: tasks over spark.range, not the DataFrame
        got = df.toPandas().sort_values("person").reset_index(drop=True)
    pdf = pd.concat([pq.read_table(os.path.join(path, f)).to_pandas() for f in sorted(os.listdir(path))],
                    ignore_index=True).sort_values("person").reset_index(drop=True)
    X = np.clip(pdf[FEATURES].to_numpy(float), [0, -5, 0], [1, 5, 60])
    assert list(got["person"]) == list(pdf["person"])
    np.testing.assert_allclose(got[["z0", "z1"]].to_numpy(), X @ P, rtol=1e-12, atol=1e-12)


def test_dprp_row_pass_direct_equals_dataframe(spark, tmp_path, test_seed):
    path = _pyarrow_dataset(str(tmp_path / "t"), (1500, 600), 200)
    kw = dict(columns=["a", "b"], epsilon=2.0, delta=1e-5, lower=[0, -6], upper=[1, 6], keep_columns=["person"],
              label="y", classes=["p", "q"], labels="public")
    got = {}
    with spark_conf(spark, spark__sql__files__maxPartitionBytes=15000, spark__sql__files__openCostInBytes=1,
                    spark__sql__execution__arrow__maxRecordsPerBatch=333):
        for reader in ("spark", "arrow"):
            reset_test_counter()
            rel = release_dprp(read_table(spark, path, reader=reader), **kw)
            got[reader] = _parts(rel.write(str(tmp_path / reader)).replace("file:", ""))
    assert len(got["arrow"]) == len(got["spark"]) > 2
    for a, s in zip((got["arrow"][p] for p in sorted(got["arrow"])), (got["spark"][p] for p in sorted(got["spark"]))):
        assert list(a["person"]) == list(s["person"]) and list(a["y"]) == list(s["y"])
        # the same noise on the same rows; the Gram sums differ only in summation order
        np.testing.assert_allclose(a[["a", "b"]].to_numpy(), s[["a", "b"]].to_numpy(), rtol=1e-7, atol=1e-7)


def test_a_transformation_never_takes_the_direct_reader(spark, tmp_path, test_seed, caplog):
    path = _pyarrow_dataset(str(tmp_path / "t"), (800, 400), 100)
    inp = read_table(spark, path, reader="arrow")
    for name in ("filter", "where", "select", "limit", "join", "withColumn", "sample", "dropna"):
        with pytest.raises(AttributeError, match=r"cannot be transformed.*input\.df"):
            getattr(inp, name)
    # the default reader is Spark's: read_table's DataFrame is no longer silently scanned directly
    plain = read_table(spark, path)
    assert not isinstance(plain, ParquetInput)
    assert parquet_scan(plain, FEATURES) is None
    assert parquet_scan(inp.df, FEATURES) is None and parquet_scan(inp, FEATURES) is not None
    caplog.set_level("INFO", logger="sparkpriv.spark.parquet_scan")
    filtered = inp.df.filter("a > 0.5")
    rel = _projection(filtered)
    assert not any("direct Parquet reader" in r.getMessage() for r in caplog.records)
    n = sum(pq.read_table(f"{path}/part-{i}.parquet").to_pandas().eval("a > 0.5").sum() for i in range(2))
    assert rel.df.count() == n < 1200  # the filter holds
    out = rel.write(str(tmp_path / "out")).replace("file:", "")
    assert sum(len(f) for f in _parts(out).values()) == n
    _projection(inp)
    assert any("row pass: direct Parquet reader" in r.getMessage() for r in caplog.records)


def test_explicit_reader_refuses_what_it_cannot_read_auto_falls_back(spark, tmp_path, test_seed):
    path = str(tmp_path / "hive")
    rng = np.random.default_rng(1)
    pdf = _frame(rng, 600, 0).assign(k=rng.integers(0, 3, 600), s=lambda d: d["a"].astype(str))
    spark.createDataFrame(pdf).write.partitionBy("k").parquet(path)
    arrow = read_table(spark, path, reader="arrow")
    with pytest.raises(InputError, match=r"column 'k' is not a column of the Parquet files.*reader='spark'"):
        release_projection(arrow, columns=["a", "k"], k=1, epsilon=1.0, lower=[0, 0], upper=[1, 3])
    with pytest.raises(InputError, match="column 's' has the Parquet type string"):
        parquet_scan(arrow, ["a", "s"])
    with pytest.raises(InputError, match="reads Parquet files"):
        read_table(spark, str(tmp_path / "x.csv"), reader="arrow")
    with pytest.raises(InputError, match="Unknown reader"):
        read_table(spark, path, reader="jvm")
    reset_test_counter()
    auto = release_projection(read_table(spark, path, reader="auto"), columns=["a", "k"], k=1, epsilon=1.0,
                              lower=[0, 0], upper=[1, 3], keep_columns=["person"]).df.toPandas()
    reset_test_counter()
    plain = release_projection(read_table(spark, path), columns=["a", "k"], k=1, epsilon=1.0,
                               lower=[0, 0], upper=[1, 3], keep_columns=["person"]).df.toPandas()
    pd.testing.assert_frame_equal(auto, plain, check_exact=True)  # auto fell back to Spark's reader


def test_a_retried_task_writes_the_same_rows(spark, tmp_path, test_seed):
    """A task is a function of its index only: running task i again (as a retry or a
    speculative copy does) gives the rows of part file i again, noise included."""
    path = _pyarrow_dataset(str(tmp_path / "t"), (1200, 500), 150)
    with spark_conf(spark, spark__sql__files__maxPartitionBytes=12000, spark__sql__files__openCostInBytes=1,
                    spark__sql__execution__arrow__maxRecordsPerBatch=250):
        rel = _projection(read_table(spark, path, reader="arrow"))
        parts = _parts(rel.write(str(tmp_path / "out")).replace("file:", ""))
    assert len(parts) > 2
    for pid, written in parts.items():
        for _ in range(2):
            again = pa.Table.from_batches(list(rel.rows.fn(iter([]), pid))).to_pandas()
            pd.testing.assert_frame_equal(again, written, check_exact=True)


def test_failed_direct_release_leaves_nothing(spark, tmp_path, test_seed):
    path = _pyarrow_dataset(str(tmp_path / "t"), (900, 300), 100)
    bad = _frame(np.random.default_rng(3), 50, 5000)
    pq.write_table(pa.Table.from_pandas(bad, preserve_index=False), f"{path}/part-9.parquet", row_group_size=10)
    # one file's data pages corrupted (its footer intact): a task fails midway, after others wrote their files
    with open(f"{path}/part-9.parquet", "r+b") as f:
        f.seek(4)
        f.write(b"\xff" * 600)
    dest = tmp_path / "out"
    with spark_conf(spark, spark__sql__files__maxPartitionBytes=6000, spark__sql__files__openCostInBytes=1):
        rel = _projection(read_table(spark, path, reader="arrow"))
        with pytest.raises(Exception):
            rel.write(str(dest))
    assert not dest.exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".out")] == []  # no staging directory left


@pytest.mark.parametrize("reader, direct", [(None, True), ("arrow", True), ("spark", False)])
def test_command_line_reader_option(spark, tmp_path, caplog, reader, direct):
    """``--reader`` (default auto): the command line reads a Parquet input directly unless told not to."""
    from sparkpriv.config import build_config
    from sparkpriv.runner import options_for, run_release

    path = _pyarrow_dataset(str(tmp_path / "t"), (300, 200), 100)
    opts = {"input": path, "output": str(tmp_path / "out"), "columns": "a,b", "k": "1", "epsilon": "1",
            "row_bound": "2", "keep_columns": "person"}
    if reader:
        opts["reader"] = reader
    caplog.set_level("INFO", logger="sparkpriv.spark.parquet_scan")
    run_release(build_config("projection", options_for("projection"), None, opts), spark=spark)
    assert any("row pass: direct Parquet reader" in r.getMessage() for r in caplog.records) == direct
    assert sum(len(f) for f in _parts(str(tmp_path / "out")).values()) == 500


def test_command_line_refuses_the_direct_reader_for_event_tables(spark, tmp_path):
    from sparkpriv.config import build_config
    from sparkpriv.errors import ParameterError
    from sparkpriv.runner import options_for, run_release

    opts = {"input": str(tmp_path / "e.parquet"), "output": str(tmp_path / "out"), "events": "true",
            "person_col": "p", "item_col": "i", "max_items": "2", "vocabulary": "0..3", "k": "1",
            "epsilon": "1", "reader": "arrow"}
    with pytest.raises(ParameterError, match="--reader arrow does not apply to --events"):
        run_release(build_config("projection", options_for("projection"), None, opts), spark=spark)
    assert not (tmp_path / "out").exists()


def test_empty_table_is_refused_and_nothing_published(spark, tmp_path, test_seed):
    path = _pyarrow_dataset(str(tmp_path / "t"), (0,), 100)
    rel = _projection(read_table(spark, path, reader="arrow"))
    with pytest.raises(InputError, match="The input table is empty"):
        rel.write(str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_python_daemon_preloads_the_release_modules():
    """``spark.python.daemon.module = sparkpriv.spark.daemon``: the modules a task needs are loaded
    before Spark's daemon forks its workers (run in a fresh interpreter, as Spark does)."""
    import subprocess
    import sys

    code = ("import sys, sparkpriv.spark.daemon as d; d.preload(); "
            "print(all(m in sys.modules for m in ('sparkpriv.mechanisms.projection', 'sparkpriv.spark.engine', "
            "'sparkpriv.spark.parquet_scan', "
            "'pyarrow.parquet', 'sparkpriv.privacy._compiled')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0 and out.stdout.strip() == "True" and "preloading failed" not in out.stderr
