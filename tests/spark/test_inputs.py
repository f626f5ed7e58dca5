"""Inputs: Parquet, CSV, catalog tables, unreadable sources."""

import pytest

from sparkpriv.errors import InputError, SchemaError
from sparkpriv.io.inputs import check_numeric_columns, read_table, schema_fingerprint

pytestmark = pytest.mark.spark


def test_csv_parquet_and_table(spark, tmp_path):
    df = spark.createDataFrame([(1.0, 2, "a"), (3.0, 4, "b")], "x double, y int, s string")
    df.write.parquet(str(tmp_path / "p"))
    df.write.option("header", "true").csv(str(tmp_path / "c.csv"))
    df.createOrReplaceTempView("sparkpriv_test_input")
    for src, fmt in ((str(tmp_path / "p"), None), (str(tmp_path / "c.csv"), None),
                     ("sparkpriv_test_input", None), (str(tmp_path / "c.csv"), "csv")):
        got = read_table(spark, src, fmt)
        assert sorted(got.columns) == ["s", "x", "y"]
        check_numeric_columns(got, ["x", "y"])
        assert got.count() == 2


def test_unreadable_input_names_the_source(spark, tmp_path):
    with pytest.raises(InputError, match="Cannot read the input .*nope.* as parquet"):
        read_table(spark, str(tmp_path / "nope"))
    with pytest.raises(InputError, match="no_such_table"):
        read_table(spark, "no_such_table")
    with pytest.raises(InputError, match="Unknown input format"):
        read_table(spark, "x", "json")


def test_schema_fingerprint_changes_with_schema(spark):
    a = spark.createDataFrame([(1.0,)], "x double").schema
    b = spark.createDataFrame([(1,)], "x int").schema
    assert schema_fingerprint(a) != schema_fingerprint(b)
    assert schema_fingerprint(a) == schema_fingerprint(spark.createDataFrame([(2.0,)], "x double").schema)


def test_duplicate_and_empty_column_lists(spark):
    df = spark.createDataFrame([(1.0,)], "x double")
    with pytest.raises(SchemaError, match="twice"):
        check_numeric_columns(df, ["x", "x"])
    with pytest.raises(SchemaError, match="No feature columns"):
        check_numeric_columns(df, [])
