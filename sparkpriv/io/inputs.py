"""Reading a source table and checking its schema.

Sources are Parquet or CSV paths (any Hadoop filesystem Spark can read:
``file:``, ``hdfs:``, ``s3a:``, ...) or catalog table names (``db.table``).
"""

from __future__ import annotations

import logging
import os

from sparkpriv.errors import InputError
from sparkpriv.spark.schema import check_numeric_columns, schema_fingerprint

_log = logging.getLogger(__name__)

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
               format_option: str = "--input-format", reader: str = "spark", filesystem=None,
               columns=None):
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

    ``columns``: the columns the release uses, when known. A Parquet column
    Spark cannot read (nanosecond timestamps, as pandas writes them) that is
    not among them is read as a plain integer and left alone; one that is
    among them is an :class:`InputError` naming it and the fix.
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
            df = _read_parquet(spark, source, columns)
        elif fmt == "csv":
            csv = spark.read.option("header", "true").option("inferSchema", "true")
            if null_value is not None:
                csv = csv.option("nullValue", null_value)
            return csv.csv(source)
        else:
            return spark.table(source)
    except InputError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"Cannot read the input {source!r} as {fmt}: {first[:300]}. Check the path or table "
            f"name and the format ({format_option} parquet|csv|table)."
        ) from None
    return _parquet_input(spark, df, source, reader, filesystem)


_NANOS_CONF = "spark.sql.legacy.parquet.nanosAsLong"


def _read_parquet(spark, source: str, columns):
    """``spark.read.parquet(source)``; where Spark cannot read a column of nanosecond timestamps (as
    pandas writes them), such a column the release does not use is read as an integer, and one it
    uses is refused naming it and the fix."""
    fix = ("rewrite the file with microsecond timestamps (pandas: df.to_parquet(path, coerce_timestamps='us', "
           "allow_truncated_timestamps=True)) or drop the column")

    def refuse(named: str):
        raise InputError(f"Cannot read the input {source!r}: {named} nanosecond timestamps, which Spark cannot "
                         f"read as timestamps: {fix}.")

    as_long = str(spark.conf.get(_NANOS_CONF, "false")).lower() == "true"  # set by an earlier read
    failed = False
    try:
        df = spark.read.parquet(source)
    except Exception as exc:
        if "NANOS" not in str(exc) and "PARQUET_TYPE_ILLEGAL" not in str(exc):
            raise
        failed = True
    if not (failed or as_long):
        return df
    nanos = _nanosecond_columns(source)  # local files: from the footers
    used = [c for c in nanos if columns is None or c in columns]
    if used:
        refuse(f"column {used[0]!r}{' (used by this release)' if columns is not None else ''} holds")
    if not failed:
        return df
    if columns is None and not nanos:  # a remote file: which column it is, Spark does not say
        refuse("a column holds")
    _log.info("input %s: column(s) %s hold nanosecond timestamps; the release does not use them (read as "
              "integers)", source, ", ".join(nanos) or "(not named by Spark)")
    spark.conf.set(_NANOS_CONF, "true")
    return spark.read.parquet(source)


def _nanosecond_columns(source: str) -> list[str]:
    """The nanosecond timestamp columns of a local Parquet file or directory (its schema, by pyarrow);
    empty where pyarrow cannot see the files (a remote path)."""
    try:
        import pyarrow.dataset as ds
        import pyarrow.parquet as pq

        path = source[len("file:"):] if source.startswith("file:") else source
        if ":" in path or not os.path.exists(path):
            return []
        files = ds.dataset(path, format="parquet").files
        if not files:
            return []
        schema = pq.ParquetFile(files[0]).schema  # the Parquet types: INT96 (Spark's) is read fine
    except Exception:
        return []
    return [c.name for c in schema if c.physical_type == "INT64" and "NANOS" in str(c.logical_type).upper()]


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


