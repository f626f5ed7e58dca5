"""The direct Parquet reader: Spark's Python workers read the row groups themselves.

A release over a Parquet table needs nothing from Spark SQL but the rows of a
few columns. Read through Spark (``mapInArrow``), every row is decoded by the
JVM, turned into a row, then into Arrow for Python, and back again for the
writer: the dominant cost of a release over a wide numeric table (docs/dprp.md,
docs/benchmarks.md). With the direct reader, each Spark task reads its row
groups with ``pyarrow.parquet`` from any pyarrow filesystem, runs the same
per-batch function as the DataFrame path, and (for a row-level release written
by the Arrow writer, :mod:`sparkpriv.io.writer`) writes its part file from the
same Python process: no row goes through the JVM.

**The reader is an explicit choice.** :func:`sparkpriv.io.inputs.read_table`
with ``reader="arrow"`` returns a :class:`ParquetInput` instead of a
DataFrame. A ParquetInput has the input's schema but no transformations:
``filter``, ``select``, ``join`` ... raise an error that says to transform
``input.df`` (the DataFrame of the same read) instead, and a DataFrame always
takes Spark's reader. So a filter can never be silently skipped. With
``reader="auto"`` (the command line's default) the input falls back to its
DataFrame, with a log line saying why, wherever the direct reader does not
apply; with ``reader="arrow"`` that is an error naming the column or path.

The direct reader applies when (else: error or fallback, above):

* classic Spark (the JVM plan gives the file splits; not Spark Connect);
* every file of the read can be opened with the pyarrow filesystem (``file:``
  paths by default; another filesystem is passed to ``read_table``);
* every requested column is a physical column of the files (of at least one;
  it reads as nulls where missing, as in Spark) spelled exactly as in the
  files -- not a partition directory column -- with an integer or floating
  type in each (columns copied unchanged, and DPRP's label, may also be
  boolean or string).

**The same rows, the same partitions, the same noise.** A row-level release
draws a row's noise from the stream keyed by its task's partition index and
its place in the task's batches. The direct reader reproduces Spark's reading
of the same DataFrame: the Spark file splits of its plan (the index of a
task's rows is their Spark partition's index), the row
groups Spark reads for a split (those whose midpoint lies in the split, as
parquet-mr decides), and Arrow batches of
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows running across row
groups and files within a task, with the values cast to the Arrow types Spark
gives Python. A release read directly is therefore the same table, bit for
bit, as the release of ``input.df``,
unless Spark ends a batch early at ``spark.sql.execution.arrow.maxBytesPerBatch``
(64 MiB by default: more than 10,000 rows of about 800 doubles), in which case
the two differ in which noise draw meets which value but not in distribution.
The tasks run over ``spark.range(n, numPartitions=n)``, one row per task,
which only tells each task its number ``j``; task ``j`` reads the ``j``-th
Spark partition that has row groups and passes that partition's index to the
batch function (splits without a row group get no task). Task ``j`` always
reads the same row groups with the same index, so a retried task redraws the
same noise.

The aggregate passes (DPRP's Gram matrix and DP means, k-means' feature cache
and final sums) need no partition semantics: they run one task per group of
row groups (:func:`scan_partials`, :func:`scan_rdd`), merged by tree
aggregation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import unquote, urlparse

import numpy as np

from sparkpriv.errors import InputError

__all__ = ["ParquetInput", "ParquetScan", "dataframe_of", "parquet_scan", "aggregate", "row_map",
           "scan_partials", "scan_rdd"]

_log = logging.getLogger(__name__)

_BATCH_ROWS = 65_536
_MAX_TASKS = 4096
_OBJECT_STORES = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gs", "gcs": "gs"}


class ParquetInput:
    """A Parquet table read by the Python workers (``read_table(..., reader="arrow")``).

    Pass it to a release in place of a DataFrame. It has the read's
    ``schema``, ``columns``, ``dtypes`` and ``sparkSession``; it cannot be
    transformed: ``input.df`` is the DataFrame of the same read, and a
    transformation of it is read by Spark (module docstring).

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        ``spark.read.parquet(source)``, untransformed.
    source : str
        The path that was read.
    filesystem : pyarrow.fs.FileSystem, optional
        Where the executors open the files. Default: the local filesystem for
        ``file:`` paths; for other schemes (``reader="arrow"`` only) the
        filesystem pyarrow derives from the URI (``s3a:`` read as ``s3:``).
    fallback : bool
        ``reader="auto"``: use ``df`` (Spark's reader) where the direct reader
        does not apply, instead of raising.
    """

    def __init__(self, df, source: str, *, filesystem=None, fallback: bool = False):
        object.__setattr__(self, "df", df)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "filesystem", filesystem)
        object.__setattr__(self, "fallback", bool(fallback))
        object.__setattr__(self, "_footers", {})  # file URI -> Parquet footer, read once per input

    @property
    def reader(self) -> str:
        return "auto" if self.fallback else "arrow"

    @property
    def schema(self):
        return self.df.schema

    @property
    def columns(self) -> list:
        return self.df.columns

    @property
    def dtypes(self):
        return self.df.dtypes

    @property
    def sparkSession(self):  # noqa: N802 - as in pyspark
        return self.df.sparkSession

    def __getattr__(self, name):
        from pyspark.sql import DataFrame

        if not name.startswith("_") and hasattr(DataFrame, name):
            raise AttributeError(
                f"A Parquet input read with reader={self.reader!r} (the direct reader) has no {name!r}: it "
                f"cannot be transformed, so that no filter or selection is ever skipped. Use "
                f"input.df.{name}(...) (the DataFrame of the same read; a release of it is read by Spark), "
                "or read the table with reader='spark'.")
        raise AttributeError(name)

    def __setattr__(self, name, value):
        raise AttributeError("a ParquetInput is immutable")

    def __repr__(self) -> str:
        return f"ParquetInput({self.source!r}, reader={self.reader!r})"

    def scan(self, columns: Sequence[str], *, passthrough: Sequence[str] = ()) -> "ParquetScan | None":
        """The direct scan of ``columns`` (plus ``passthrough`` columns), or None (fallback).

        Raises :class:`InputError` when the direct reader does not apply and
        the input was read with ``reader="arrow"``.
        """
        try:
            return _make_scan(self.df, list(columns), list(passthrough), self.filesystem,
                              object_stores=not self.fallback, footers=self._footers)
        except _NotApplicable as exc:
            if not self.fallback:
                raise InputError(
                    f"The direct Parquet reader (reader='arrow') cannot read {self.source!r}: {exc}. Read "
                    "the table with reader='spark' (--reader spark), or 'auto' to fall back to Spark's "
                    "reader where needed.") from None
            _log.info("direct Parquet reader not used, Spark reads the input: %s", exc)
            return None


class _NotApplicable(Exception):
    pass


@dataclass(frozen=True)
class ParquetScan:
    """What the tasks read: ``partitions[i]`` is the ``(path, row groups)`` list of task ``i``
    (Spark's file splits); ``pieces`` every ``(path, row group)`` in order; ``schema`` the
    Arrow types Spark gives Python for the columns; ``filesystem`` a pyarrow filesystem."""

    pieces: tuple
    partitions: tuple
    schema: object
    filesystem: object
    batch_rows: int


def dataframe_of(source):
    """The DataFrame of a release input: ``source`` itself, or a ParquetInput's ``df``."""
    return source.df if isinstance(source, ParquetInput) else source


def parquet_scan(source, columns: Sequence[str], *, strings: Sequence[str] = ()) -> ParquetScan | None:
    """The direct scan of ``columns`` when ``source`` is a :class:`ParquetInput`, else None.

    ``strings``: columns that may also be boolean or string (labels, copied columns).
    """
    if not isinstance(source, ParquetInput):
        return None
    strings = [c for c in strings if c in columns]
    return source.scan([c for c in columns if c not in strings], passthrough=strings)


def _fs_and_path(uri: str, filesystem, object_stores: bool):
    """The pyarrow filesystem and path of a file URI from Spark's plan."""
    from pyarrow import fs as pafs

    u = urlparse(uri)
    scheme = u.scheme.lower()
    if filesystem is not None:
        if scheme in ("", "file"):
            return filesystem, unquote(u.path)
        if scheme in _OBJECT_STORES:
            return filesystem, u.netloc + unquote(u.path)
        return filesystem, unquote(u.path)
    if scheme in ("", "file"):
        return pafs.LocalFileSystem(), unquote(u.path)
    if not object_stores:
        raise _NotApplicable(f"{uri!r} is not a local (file:) path; pass the pyarrow filesystem "
                             "(read_table(..., filesystem=...)) to read it directly")
    try:
        if scheme in _OBJECT_STORES:
            uri = _OBJECT_STORES[scheme] + uri[len(scheme):]
        return pafs.FileSystem.from_uri(uri)
    except Exception as exc:
        raise _NotApplicable(f"pyarrow cannot open {uri!r} ({type(exc).__name__}: {exc}); pass the pyarrow "
                             "filesystem (read_table(..., filesystem=...))") from None


def _spark_splits(frame):
    """Spark's file splits of ``frame``'s scan, per partition: ``[[(uri, start, length), ...], ...]``."""
    plan = frame._jdf.queryExecution().executedPlan()
    leaves = plan.collectLeaves()
    if leaves.size() != 1:
        raise _NotApplicable("the plan reads more than one source")
    leaf = leaves.apply(0)
    if not leaf.getClass().getName().endswith("FileSourceScanExec"):
        raise _NotApplicable(f"the plan's scan is a {leaf.getClass().getSimpleName()}, not a file scan")
    out = []
    for part in leaf.inputRDD().partitions():
        out.append([(str(f.filePath().urlEncoded()), int(f.start()), int(f.length())) for f in part.files()])
    return out


def _row_group_midpoints(meta) -> list[int]:
    """Where parquet-mr places each row group when it splits a file: first page offset
    plus half the compressed size (``ParquetMetadataConverter.filterFileMetaDataByMidpoint``)."""
    mids = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        c0 = rg.column(0)
        start = c0.data_page_offset
        if c0.has_dictionary_page and c0.dictionary_page_offset is not None:
            start = min(start, c0.dictionary_page_offset)
        size = sum(rg.column(j).total_compressed_size for j in range(rg.num_columns))
        mids.append(start + size // 2)
    return mids


def _make_scan(frame, columns, passthrough, filesystem, *, object_stores: bool, footers=None) -> ParquetScan:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema

    if getattr(frame, "_jdf", None) is None:
        raise _NotApplicable("it needs classic Spark (under Spark Connect Spark's reader is used)")
    wanted = [*columns, *passthrough]
    if len(set(wanted)) != len(wanted):
        raise _NotApplicable("a column is requested twice")
    selected = frame.select(*wanted)
    try:
        splits = _spark_splits(selected)
    except _NotApplicable:
        raise
    except Exception as exc:  # the plan's layout is an internal API: say so, never guess
        raise _NotApplicable(f"Spark's file splits could not be read from the plan ({type(exc).__name__})") \
            from None
    files: dict = {}
    types: dict = {}
    filesystems: dict = {}
    for part in splits:
        for uri, _, _ in part:
            if uri in files:
                continue
            fs, path = _fs_and_path(uri, filesystem, object_stores)
            u = urlparse(uri)
            fs = filesystems.setdefault((u.scheme, u.netloc), fs)
            try:
                meta = footers.get(uri) if footers is not None else None
                if meta is None:
                    meta = pq.read_metadata(path, filesystem=fs)
                    if footers is not None:
                        footers[uri] = meta
            except Exception as exc:
                raise _NotApplicable(f"cannot read the footer of {uri!r} ({type(exc).__name__}: {exc})") \
                    from None
            files[uri] = (fs, path, meta)
            for field in meta.schema.to_arrow_schema():
                types.setdefault(field.name, []).append(field.type)
    for c in wanted:
        if c not in types:
            raise _NotApplicable(f"column {c!r} is not a column of the Parquet files (a partition directory "
                                 "column, or spelled differently than in the files)")
        for t in types[c]:
            ok = pa.types.is_integer(t) or pa.types.is_floating(t)
            if c in passthrough:
                ok = ok or pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            if not ok:
                raise _NotApplicable(f"column {c!r} has the Parquet type {t} in a file; the direct reader reads "
                                     "integer and floating columns" + (" (and boolean or string columns "
                                                                       "copied unchanged)" if passthrough else ""))
    if len(filesystems) > 1:
        raise _NotApplicable("the files are on more than one filesystem")
    fs = next(iter(filesystems.values()), filesystem)
    mids = {uri: _row_group_midpoints(meta) for uri, (_, _, meta) in files.items()}
    partitions = []
    for part in splits:
        task = []
        for uri, start, length in part:
            groups = tuple(g for g, m in enumerate(mids[uri]) if start <= m < start + length)
            if groups:
                if task and task[-1][0] == files[uri][1]:
                    task[-1] = (task[-1][0], task[-1][1] + groups)
                else:
                    task.append((files[uri][1], groups))
        partitions.append(tuple(task))
    pieces = tuple((p, g) for task in partitions for p, groups in task for g in groups)
    expected = sum(meta.num_row_groups for _, _, meta in files.values())
    if len(pieces) != expected or len(set(pieces)) != expected:
        raise _NotApplicable("Spark's file splits do not cover every row group exactly once")
    arrow_schema = to_arrow_schema(selected.schema)
    conf = frame.sparkSession.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
    batch_rows = int(conf) if int(conf) > 0 else 2**62
    return ParquetScan(pieces=pieces, partitions=tuple(partitions), schema=arrow_schema, filesystem=fs,
                       batch_rows=batch_rows)


def _read_files(files, schema, filesystem, batch_rows: int):
    """Arrow batches of ``schema``'s columns from ``[(path, row groups), ...]``, cast to
    ``schema``'s types; a column missing from a file reads as nulls."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = schema.names
    for path, groups in files:
        f = pq.ParquetFile(path, filesystem=filesystem)
        have = set(f.schema_arrow.names)
        cols = [c for c in names if c in have]
        for b in f.iter_batches(batch_size=min(batch_rows, _BATCH_ROWS * 16), row_groups=list(groups),
                                columns=cols, use_threads=False):
            arrays = []
            for field in schema:
                if field.name in have:
                    a = b.column(field.name)
                    arrays.append(a if a.type == field.type else a.cast(field.type))
                else:
                    arrays.append(pa.nulls(b.num_rows, field.type))
            yield pa.RecordBatch.from_arrays(arrays, names)


def _rebatch(batches, size: int):
    """The rows of ``batches`` in batches of ``size`` rows (the last one shorter), as Spark
    cuts a task's rows into Arrow batches for Python."""
    import pyarrow as pa

    pending, n = [], 0
    for b in batches:
        while b.num_rows:
            take = min(size - n, b.num_rows)
            pending.append(b if take == b.num_rows else b.slice(0, take))
            n += take
            b = b.slice(take) if take < b.num_rows else b.slice(0, 0)
            if n == size:
                yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
                pending, n = [], 0
    if n:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


def row_map(source, columns: Sequence[str], fn, schema, *, passthrough: Sequence[str] = ()):
    """The :class:`~sparkpriv.spark.batches.BatchMap` of a row-level release: ``fn(batches,
    index)`` over ``columns`` of ``source`` (a DataFrame, or a :class:`ParquetInput`).

    ``passthrough``: those of ``columns`` that may be boolean or string (copied or label
    columns). A DataFrame, and a ParquetInput in ``auto`` mode where the direct reader does
    not apply, give ``fn`` over Spark's batches of ``source.select(*columns)``; otherwise the
    tasks read the row groups of Spark's file splits themselves (module docstring), with the
    same partition indices and batches.
    """
    from sparkpriv.spark.batches import BatchMap

    columns = list(columns)
    if isinstance(source, ParquetInput):
        keep = [c for c in columns if c in passthrough]
        scan = source.scan([c for c in columns if c not in keep], passthrough=keep)
        if scan is not None:
            if scan.schema.names != columns:  # the batches' column order is fn's business
                scan = ParquetScan(scan.pieces, scan.partitions, _reorder(scan.schema, columns),
                                   scan.filesystem, scan.batch_rows)
            # one task per Spark partition that has rows; fn sees Spark's partition index
            keys = [i for i, files in enumerate(scan.partitions) if files]
            _log.info("row pass: direct Parquet reader, %d task(s) over %d row group(s)", len(keys),
                      len(scan.pieces))
            tasks = source.sparkSession.range(0, len(keys), 1, max(len(keys), 1))
            return BatchMap(tasks, _row_task(fn, scan, keys), schema)
        source = source.df
    return BatchMap(source.select(*columns), fn, schema)


def _reorder(schema, columns):
    import pyarrow as pa

    return pa.schema([schema.field(c) for c in columns])


def _row_task(fn, scan: ParquetScan, keys):
    """``fn`` over the row groups of Spark's partition ``keys[task]``, with that index (the
    task is the ``task``-th partition of ``spark.range``)."""
    partitions, schema, fs, batch_rows = scan.partitions, scan.schema, scan.filesystem, scan.batch_rows
    keys = list(keys)

    def sparkpriv_parquet_rows(batches, task):
        for _ in batches:  # the task's one row of spark.range: its index only
            pass
        if task >= len(keys):  # an empty input: spark.range(0, 0, 1, 1) has one empty task
            yield from fn(iter(()), 0)
            return
        key = keys[task]
        yield from fn(_rebatch(_read_files(partitions[key], schema, fs, batch_rows), batch_rows), key)

    sparkpriv_parquet_rows.__name__ = getattr(fn, "__name__", "sparkpriv_parquet_rows")
    return sparkpriv_parquet_rows


def aggregate(source, columns: Sequence[str], partial, size: int, *, strings: Sequence[str] = ()) -> np.ndarray:
    """Sum a per-partition ``partial(batches, index)`` over ``columns`` of ``source``: a direct
    scan for a :class:`ParquetInput` (where it applies), else ``mapInArrow`` + tree
    aggregation (:func:`~sparkpriv.spark.batches.sum_partials`)."""
    from sparkpriv.spark.batches import sum_partials

    scan = parquet_scan(source, columns, strings=strings)
    if scan is not None:
        _log.info("aggregate pass: direct Arrow scan of %d Parquet row group(s)", len(scan.pieces))
        return scan_partials(source.sparkSession, scan, columns, partial, size)
    return sum_partials(dataframe_of(source).select(*columns), partial, size)


def _piece_reader(scan: ParquetScan, columns):
    schema = _reorder(scan.schema, list(columns))
    fs = scan.filesystem

    def read(items):
        files = []
        for path, g in items:
            if files and files[-1][0] == path:
                files[-1][1].append(g)
            else:
                files.append((path, [g]))
        return _read_files(files, schema, fs, _BATCH_ROWS)

    return read


def scan_rdd(spark, scan: ParquetScan, columns: Sequence[str], fn):
    """An RDD of whatever ``fn(batches, index)`` yields per task, over the scan's row groups."""
    read = _piece_reader(scan, columns)
    pieces = list(scan.pieces)

    def sparkpriv_scan(index, items):
        yield from fn(read(list(items)), index)

    return spark.sparkContext.parallelize(pieces, max(min(len(pieces), _MAX_TASKS), 1)).mapPartitionsWithIndex(
        sparkpriv_scan)


def scan_partials(spark, scan: ParquetScan, columns: Sequence[str], partial, size: int) -> np.ndarray:
    """Like :func:`~sparkpriv.spark.batches.sum_partials`, over the scan's row groups."""
    read = _piece_reader(scan, columns)
    pieces = list(scan.pieces)
    if not pieces:
        return partial(iter(()), 0)
    n_tasks = min(len(pieces), _MAX_TASKS)

    def sparkpriv_scan_partial(index, items):
        v = np.ascontiguousarray(partial(read(list(items)), index), dtype=np.float64)
        if v.shape != (size,):
            raise RuntimeError(f"partial has shape {v.shape}, expected ({size},)")
        yield v

    rdd = spark.sparkContext.parallelize(pieces, n_tasks)
    return rdd.mapPartitionsWithIndex(sparkpriv_scan_partial).treeReduce(_add, depth=2)


def _add(a, b):
    return a + b

