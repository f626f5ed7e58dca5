"""Reading inputs: a CSV's missing-value marker."""

from __future__ import annotations

import pytest
from pyspark.sql.types import NumericType, StringType

from sparkpriv.errors import InputError
from sparkpriv.io.inputs import read_table


@pytest.fixture
def uci_like_csv(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("a,b\n1,2.5\n?,3.0\n4,?\n")  # '?' marks a missing value, as in the UCI tables
    return str(p)


def test_csv_null_value_marker(spark, uci_like_csv):
    plain = read_table(spark, uci_like_csv)
    assert isinstance(plain.schema["a"].dataType, StringType)  # '?' makes the column text
    df = read_table(spark, uci_like_csv, null_value="?")
    assert all(isinstance(df.schema[c].dataType, NumericType) for c in ("a", "b"))
    rows = {(r.a, r.b) for r in df.collect()}
    assert rows == {(1, 2.5), (None, 3.0), (4, None)}


def test_null_value_is_csv_only(spark, tmp_path):
    with pytest.raises(InputError, match="applies to CSV input only"):
        read_table(spark, str(tmp_path / "x.parquet"), null_value="?")


def test_null_value_is_a_command_line_option():
    from sparkpriv.config import COMMON_OPTIONS

    assert "null_value" in {o.name for o in COMMON_OPTIONS}  # --null-value / null_value in TOML


def test_an_existing_bare_relative_name_is_a_path(spark, tmp_path, monkeypatch):
    """`--release rel_dir` (a directory in the working directory) is read as Parquet, not looked
    up as a catalog table, and no spark-warehouse/ is left in the working directory."""
    import pandas as pd

    monkeypatch.chdir(tmp_path)
    spark.createDataFrame(pd.DataFrame({"z0": [1.0, 2.0]})).write.parquet(str(tmp_path / "rel_dir"))
    df = read_table(spark, "rel_dir")
    assert df.count() == 2
    assert not (tmp_path / "spark-warehouse").exists()


def test_read_error_names_the_callers_format_option(spark, tmp_path):
    with pytest.raises(InputError, match="--release-format parquet"):
        read_table(spark, str(tmp_path / "nope.parquet"), format_option="--release-format")
