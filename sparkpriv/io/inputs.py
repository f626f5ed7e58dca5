"""Reading a source table and checking its schema.

Sources are Parquet or CSV paths (any Hadoop filesystem Spark can read:
``file:``, ``hdfs:``, ``s3a:``, ...) or catalog table names (``db.table``).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Sequence

from sparkpriv.errors import InputError, SchemaError
from sparkpriv.spark.schema import check_numeric_columns, check_present_columns, schema_fingerprint

__all__ = ["read_table", "check_numeric_columns", "schema_fingerprint", "FORMATS"]

FORMATS = ("parquet", "csv", "table")


def _guess_format(source: str) -> str:
    s = source.rstrip("/").lower()
    if s.endswith(".csv") or s.endswith(".csv.gz"):
        return "csv"
    if "/" in source or ":" in source or s.endswith(".parquet") or os.path.exists(source):
        return "parquet"  # a path that exists is a path, even a bare relative name
    return "table"


def read_table(spark, source: str, fmt: str | None = None, *, null_value: str | None = None,
               format_option: str = "--input-format"):
    """Read ``source`` as a DataFrame (lazily; only the schema is read).

    ``format_option`` names the option that sets ``fmt`` in error messages.
    ``null_value`` (CSV only) is the string that marks a missing value (``"?"``
    in the UCI tables): such cells are nulls, so the columns keep numeric types.
    ``fmt`` is ``"parquet"``, ``"csv"`` (header row, inferred types) or
    ``"table"`` (a catalog table name); by default it is guessed from the
    source (``*.csv`` -> CSV, a path -> Parquet, a bare name -> catalog table).
    A Parquet DataFrame returned here, used untransformed, lets the aggregate
    passes of DPRP and k-means read local Parquet files directly
    (:mod:`sparkpriv.spark.parquet_scan`).
    """
    if fmt is None:
        fmt = _guess_format(source)
    if fmt != "table" and ":" not in source and os.path.exists(source):
        source = os.path.abspath(source)  # the JVM's working directory may differ from ours
    if fmt not in FORMATS:
        raise InputError(f"Unknown input format {fmt!r}; use one of {', '.join(FORMATS)}.")
    if null_value is not None and fmt != "csv":
        raise InputError(f"null_value (--null-value) applies to CSV input only; the input {source!r} is read "
                         f"as {fmt}.")
    try:
        if fmt == "parquet":
            from sparkpriv.spark.parquet_scan import register_parquet_source

            df = spark.read.parquet(source)
            register_parquet_source(df, source)  # aggregate passes may scan it directly
            return df
        if fmt == "csv":
            reader = spark.read.option("header", "true").option("inferSchema", "true")
            if null_value is not None:
                reader = reader.option("nullValue", null_value)
            return reader.csv(source)
        return spark.table(source)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"Cannot read the input {source!r} as {fmt}: {first[:300]}. Check the path or table "
            f"name and the format ({format_option} parquet|csv|table)."
        ) from None


