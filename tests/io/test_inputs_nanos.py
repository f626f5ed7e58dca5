"""A Parquet file written by pandas with nanosecond timestamps (which Spark cannot read as timestamps):
released when the release does not use that column, refused naming it (and the fix) when it does."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sparkpriv.errors import InputError


@pytest.fixture()
def nanos_file(tmp_path):
    df = pd.DataFrame({"a": np.random.default_rng(0).random(50), "b": np.random.default_rng(1).random(50),
                       "ts": pd.date_range("2026-01-01", periods=50, freq="1ns")})
    path = tmp_path / "ns.parquet"
    df.to_parquet(path, coerce_timestamps=None)
    assert pq.read_schema(path).field("ts").type.unit == "ns"
    return str(path)


@pytest.mark.spark
def test_unused_nanosecond_column_is_left_alone(spark, nanos_file, tmp_path, monkeypatch, capsys):
    from sparkpriv.cli import main

    monkeypatch.setenv("SPARKPRIV_LEDGER", f"sqlite:///{tmp_path}/l.sqlite")
    rc = main(["release", "projection", "--input", nanos_file, "--output", str(tmp_path / "out"), "--columns", "a,b",
               "--k", "1", "--epsilon", "1", "--row-bound", "2"])
    assert rc == 0, capsys.readouterr().err
    assert pq.read_table(tmp_path / "out").num_rows == 50


@pytest.mark.spark
def test_used_nanosecond_column_is_refused_naming_it(spark, nanos_file):
    from sparkpriv.io.inputs import read_table

    with pytest.raises(InputError, match="column 'ts' \\(used by this release\\) holds nanosecond timestamps.*coerce_timestamps='us'"):
        read_table(spark, nanos_file, columns=["a", "ts"])


@pytest.mark.spark
def test_sparks_own_timestamps_are_read_after_a_nanosecond_file(spark, nanos_file, tmp_path):
    """Spark writes timestamps as INT96, which pyarrow shows as nanoseconds: such a file is read (with
    its timestamp column) even after a nanosecond file set the session's nanosAsLong."""
    from sparkpriv.io.inputs import read_table

    read_table(spark, nanos_file, columns=["a"])  # the unused nanosecond column: the session reads it as long
    path = str(tmp_path / "spark_ts")
    spark.sql("SELECT 1 AS a, TIMESTAMP '2026-01-01 00:00:00' AS ts").write.parquet(path)
    assert pq.read_schema(next(p for p in (tmp_path / "spark_ts").iterdir() if p.suffix == ".parquet")
                          ).field("ts").type.unit == "ns"  # INT96, seen by pyarrow as nanoseconds
    df = read_table(spark, path)
    assert df.count() == 1 and "timestamp" in dict(df.dtypes)["ts"]
