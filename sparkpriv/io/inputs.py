"""Reading a source table and checking its schema.

Sources are Parquet or CSV paths (any Hadoop filesystem Spark can read:
``file:``, ``hdfs:``, ``s3a:``, ...) or catalog table names (``db.table``).
"""

from __future__ import annotations

import os

from sparkpriv.errors import InputError
from sparkpriv.spark.schema import check_numeric_columns, schema_fingerprint

__all__ = ["read_table", "check_numeric_columns", "schema_fingerprint", "FORMATS", "READERS"]

READERS = ("spark", "arrow", "auto")

FORMATS = ("parquet", "csv", "table")


def _guess_format(source: str) -> str:
    s = source.rstrip("/").lower()
    if s.endswith(".csv") or s.endswith(".csv.gz"):
        return "csv"
    if "/" in source or ":" in source or s.endswith(".parquet") or os.path.exists(source):
        return "parquet"  # a path that exists is a path, even a bare relative name
    return "table"


def read_table(spark, source: str, fmt: str | None = None, *, null_value: str | None = None,
               format_option: str = "--input-format", reader: str = "spark", filesystem=None):
    """Read ``source`` as a DataFrame (lazily; only the schema is read), or as a
    :class:`~sparkpriv.spark.parquet_scan.ParquetInput` for the direct Parquet reader.

    ``format_option`` names the option that sets ``fmt`` in error messages.
    ``null_value`` (CSV only) is the string that marks a missing value (``"?"``
    in the UCI tables): such cells are nulls, so the columns keep numeric types.
    ``fmt`` is ``"parquet"``, ``"csv"`` (header row, inferred types) or
    ``"table"`` (a catalog table name); by default it is guessed from the
    source (``*.csv`` -> CSV, a path -> Parquet, a bare name -> catalog table).

    ``reader`` chooses who reads the rows of a Parquet table in a release:

    * ``"spark"`` (default): a DataFrame; Spark reads every row and hands it to
      Python as Arrow. Transform it as you like.
    * ``"arrow"``: a :class:`~sparkpriv.spark.parquet_scan.ParquetInput`. The
      releases (projection, DPRP, k-means) read its row groups in Spark's
      Python workers with pyarrow, skipping the JVM's conversion of every row;
      a row-level release written by the Arrow writer never sends a row
      through the JVM. It cannot be transformed (``input.df`` is the
      DataFrame of the same read, read by Spark), so no filter is ever
      skipped. Columns the direct reader cannot read are an error, raised
      by the release, that names the column. Parquet only, classic Spark.
    * ``"auto"``: ``"arrow"`` for a Parquet source on classic Spark, falling
      back to Spark's reader (with a log line) where the direct reader does
      not apply; a DataFrame for other sources. The command line's default.

    ``filesystem`` (a ``pyarrow.fs.FileSystem``): where the Python workers open
    the files of the direct reader; default the local filesystem for ``file:``
    paths, else (``"arrow"`` only) the one pyarrow derives from the URI.
    See :mod:`sparkpriv.spark.parquet_scan`.
    """
    if reader not in READERS:
        raise InputError(f"Unknown reader {reader!r}; use one of {', '.join(READERS)} (--reader).")
    if fmt is None:
        fmt = _guess_format(source)
    if fmt != "table" and ":" not in source and os.path.exists(source):
        source = os.path.abspath(source)  # the JVM's working directory may differ from ours
    if fmt not in FORMATS:
        raise InputError(f"Unknown input format {fmt!r}; use one of {', '.join(FORMATS)}.")
    if null_value is not None and fmt != "csv":
        raise InputError(f"null_value (--null-value) applies to CSV input only; the input {source!r} is read "
                         f"as {fmt}.")
    if reader == "arrow" and fmt != "parquet":
        raise InputError(f"reader='arrow' (the direct Parquet reader) reads Parquet files; the input {source!r} "
                         f"is read as {fmt}. Use reader='spark' (--reader spark).")
    try:
        if fmt == "parquet":
            df = spark.read.parquet(source)
        elif fmt == "csv":
            csv = spark.read.option("header", "true").option("inferSchema", "true")
            if null_value is not None:
                csv = csv.option("nullValue", null_value)
            return csv.csv(source)
        else:
            return spark.table(source)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"Cannot read the input {source!r} as {fmt}: {first[:300]}. Check the path or table "
            f"name and the format ({format_option} parquet|csv|table)."
        ) from None
    return _parquet_input(spark, df, source, reader, filesystem)


def _parquet_input(spark, df, source: str, reader: str, filesystem):
    """``df``, or the direct reader's input for it (``read_table``'s ``reader``)."""
    from sparkpriv.spark.parquet_scan import ParquetInput

    if reader == "spark":
        return df
    if getattr(df, "_jdf", None) is None:  # Spark Connect: no JVM plan
        if reader == "arrow":
            raise InputError("reader='arrow' (the direct Parquet reader) needs classic Spark: under Spark "
                             "Connect there is no plan to take the file splits from. Use reader='spark'.")
        return df
    return ParquetInput(df, source, filesystem=filesystem, fallback=reader == "auto")


