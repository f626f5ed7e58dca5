"""Publishing a release: complete or absent.

Where a release goes
--------------------

* Local paths (``file:``), HDFS and every other filesystem Spark's Hadoop layer
  knows (``s3a://``, ``abfs://``, ...).
* Object stores through pyarrow's filesystems (``s3://``, ``gs://``/``gcs://``,
  and ``hdfs://`` with ``writer='arrow'``): the Arrow writer's Python tasks write
  there directly (:func:`pyarrow.fs.FileSystem.from_uri`). Credentials and
  endpoints come from the usual pyarrow/AWS settings on the driver and on every
  executor (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``
  or a profile or instance role; ``AWS_ENDPOINT_URL`` or the URI's query, e.g.
  ``s3://bucket/prefix?endpoint_override=host:9000&scheme=http``). Credentials
  in the URI itself (``s3://key:secret@bucket``) are refused: the output path
  is written to the receipt, the ledger and the log.

What is written
---------------

The private table's part files, and beside them

* ``_privacy_receipt.json``: the receipt, pretty-printed JSON;
* ``_common_metadata``: a Parquet metadata-only file (the standard summary file
  that pyarrow, Dask and Hive understand) whose key-value metadata holds the
  receipt under ``sparkpriv.receipt``;
* ``_SUCCESS``, last. Spark's writer leaves its own (empty) marker; the Arrow
  writer's is a JSON manifest ``{"writer": "sparkpriv-arrow", "files": [...],
  "receipt": "_privacy_receipt.json"}`` naming every part file.

With the Arrow writer every part file also carries the receipt in its own
Parquet footer (key-value metadata ``sparkpriv.receipt``), so a part file
copied alone still says what it is:
``pyarrow.parquet.read_metadata(part).metadata[b"sparkpriv.receipt"]``.
Spark's Parquet writer offers no hook for that: its releases have the receipt
in ``_common_metadata`` only. Spark itself ignores files starting with ``_``
when it reads the table.

Atomic publishing
-----------------

Everything is first written to a hidden staging directory beside the
destination (``.<name>.sparkpriv-staging-<token>``). Any failure deletes it, so
a failed job leaves nothing at the destination. Then:

* Filesystems with a rename (local, HDFS; and whatever Hadoop filesystem Spark's
  writer uses): the staging directory, complete with receipt and ``_SUCCESS``,
  is renamed to the destination (an existing destination is first moved aside
  when ``overwrite`` is set, and deleted after the rename). Readers see nothing,
  then the whole release. (On s3a a Hadoop "rename" is a copy: readers should
  rely on ``_privacy_receipt.json`` being present there.)
* Object stores without a rename (S3, GCS; the Arrow writer): after every task
  has succeeded the driver copies the part files (server-side copies) from the
  staging prefix to their final names under the destination, then writes the
  receipt, ``_common_metadata`` and extra files, and ``_SUCCESS`` LAST; then it
  deletes the staging prefix. What a reader of the destination sees: nothing
  while the tasks run; during the copy some ``part-*`` files and no
  ``_SUCCESS``; then ``_SUCCESS``, whose manifest lists exactly the release's
  part files. A reader that waits for ``_SUCCESS`` (and reads the files it
  lists) never sees a partial release. If the copy fails, every object written
  under the destination is deleted. With ``overwrite`` the previous release's
  ``_SUCCESS`` is deleted first, then the rest of it, before the new files are
  copied in: a failure at that point leaves nothing (the previous release is
  gone, not restored). pyarrow may leave an empty "directory" marker object for
  the destination's parent prefix when it deletes the staging prefix; nothing
  is left under the destination or the staging prefix. Incomplete multipart
  uploads of tasks that were killed are invisible; a bucket lifecycle rule that
  aborts them after a day keeps them from being billed.

The writers
-----------

Two writers produce the part files. ``spark`` is ``DataFrame.write.parquet``
through Hadoop's FileSystem API of the running JVM (every scheme Spark can
write; without a JVM, under Spark Connect, only local paths). ``arrow`` applies
to row-level releases whose DataFrame is a
:class:`~sparkpriv.spark.batches.BatchMap` (a numpy function over Arrow
batches): the Python tasks that compute the batches write them with pyarrow's
Parquet writer, one file per partition, instead of sending them back to the
JVM to be turned into rows and encoded again (about 7 s per million rows of 64
doubles on the development machine, docs/research/cdr-figures.md). A task writes to a file of
its own; on a filesystem with a rename it renames it to
``part-<partition>-...`` when it is complete, so a retried or speculative task
(which recomputes the same noise) replaces the file with the same content; on
an object store it keeps its attempt's own name and the driver copies only the
file of the attempt Spark reported as successful (a failed attempt's file is
deleted by the task, or with the staging prefix). Only the driver creates the
staging directory and its job marker (``_temporary/_job``): a task still
running after its job failed finds the marker gone and fails, deleting what it
wrote, instead of bringing the staging directory back (the driver's clean-up
retries while such a task finishes). The driver checks that every partition
reported and that every reported file is visible to it.

``auto`` (the default) uses ``arrow`` for such releases on classic Spark when
the output is a local path (a path shared by the driver and the executors), and
for ``s3://`` and ``gs://`` outputs; ``spark`` otherwise (HDFS, ``s3a://``,
Spark Connect to local paths). A release that is not row-level (k-means
centres) is written by Spark's writer; to an object store it needs Spark's
Hadoop connector (``s3a://`` with hadoop-aws), and an ``s3://`` output Spark
cannot write is refused before anything is written, with that fix.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

from sparkpriv.errors import OutputExistsError, ParameterError
from sparkpriv.spark.batches import spark_errors
from sparkpriv.io.stores import ARROW_SCHEMES, _scheme, _ArrowStore, _pyarrow_output, filesystem_for, _store_for_check

__all__ = [
    "publish",
    "check_output_path",
    "choose_writer",
    "check_writer",
    "RECEIPT_FILE",
    "RECEIPT_KEY",
    "SUCCESS_FILE",
    "filesystem_for",
    "receipt_metadata_bytes",
    "WRITERS",
    "ARROW_SCHEMES",
]

RECEIPT_FILE = "_privacy_receipt.json"
RECEIPT_KEY = "sparkpriv.receipt"
SUCCESS_FILE = "_SUCCESS"
WRITERS = ("auto", "spark", "arrow")
_JOB_MARKER = "_temporary/_job"
_COPY_THREADS = 16
_log = logging.getLogger(__name__)


def _arrow_schema_with_receipt(spark_schema, receipt: dict):
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema).with_metadata({RECEIPT_KEY: json.dumps(receipt, sort_keys=True)})


def receipt_metadata_bytes(spark_schema, receipt: dict) -> bytes:
    """A Parquet ``_common_metadata`` file: the schema plus ``sparkpriv.receipt``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_metadata(_arrow_schema_with_receipt(spark_schema, receipt), sink)
    return sink.getvalue().to_pybytes()


def _split(path: str) -> tuple[str, str]:
    p = path.rstrip("/")
    i = p.rfind("/")
    if i < 0:
        return ".", p
    return p[:i] or "/", p[i + 1:]


def check_output_path(spark, output: str, overwrite: bool) -> str:
    """Qualify ``output`` and refuse it if it exists and ``overwrite`` is false."""
    fs = _store_for_check(spark, output)
    output = fs.qualify(output)
    if _pyarrow_output(output) and "/" not in output.split("://", 1)[1]:
        raise ParameterError(
            f"The output {output!r} is a whole bucket: name a prefix inside it ({output}/releases/name); "
            "the release is staged beside its destination.")
    if fs.exists(output) and not overwrite:
        raise OutputExistsError(
            f"The output {output!r} already exists. Choose another path or pass overwrite=True "
            "(--overwrite) to replace it."
        )
    return output


def _local_path(qualified: str) -> str | None:
    return qualified[len("file:"):] if qualified.startswith("file:") else None


def _hadoop_has_scheme(spark, scheme: str) -> bool | None:
    """Whether Spark's Hadoop layer has a filesystem for ``scheme`` (None: cannot tell)."""
    try:
        jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()
    except AttributeError:
        return None  # Spark Connect: the server decides
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, conf)
        return True
    except Exception:  # UnsupportedFileSystemException
        return False


def _refuse_unwritable_for_spark(spark, output: str, reason: str) -> None:
    scheme = _scheme(output)
    if scheme in ARROW_SCHEMES and _hadoop_has_scheme(spark, scheme) is False:
        fix = ("write to s3a://" + output.split("://", 1)[1] + " instead, with Spark's S3 connector "
               "(spark.jars.packages=org.apache.hadoop:hadoop-aws:<the Hadoop version of your Spark>, "
               "credentials in the usual AWS variables)") if scheme == "s3" else (
               "write through the Google Cloud Storage connector for Hadoop (gcs-connector on Spark's "
               "classpath)")
        raise ParameterError(
            f"Spark cannot write the output {output!r}: {reason}, and this Spark has no Hadoop filesystem "
            f"for {scheme}://. Fix: {fix}.")


def choose_writer(spark, output: str, rows, writer: str = "auto") -> str:
    """``"arrow"`` or ``"spark"`` for ``output`` (qualified) and a release's ``rows``.

    Refuses (:class:`ParameterError`) an ``s3://``/``gs://`` output that only
    Spark's writer could write when this Spark has no Hadoop filesystem for it.
    """
    if writer not in WRITERS:
        raise ParameterError(f"writer must be one of {', '.join(WRITERS)}; got {writer!r}.")
    scheme = _scheme(output)
    if writer == "spark":
        _refuse_unwritable_for_spark(spark, output, "writer='spark' (--writer spark) was asked for")
        return "spark"
    why = None
    if rows is None:
        why = "this release is not a row-level table computed in Python (nothing to write from the workers)"
        if writer == "auto":
            _refuse_unwritable_for_spark(spark, output, "this release's table is not row-level (an aggregate "
                                         "computed by Spark), so Spark's writer writes it")
    elif scheme in ARROW_SCHEMES:
        pass  # the tasks write through pyarrow's filesystem, on classic Spark and Spark Connect alike
    elif scheme == "hdfs" and writer == "arrow":
        pass  # pyarrow's HadoopFileSystem (libhdfs on every executor); auto keeps Spark's writer
    elif _local_path(output) is None:
        why = (f"it writes local (file:) paths and, through pyarrow, s3:// and gs:// (and hdfs:// when asked "
               f"for); {output!r} is not one (for S3 through pyarrow write s3://, not s3a://)")
    elif not hasattr(spark, "_jsc"):
        why = "it needs classic Spark for local paths (under Spark Connect the server's Spark writer is used)"
    if why is None:
        return "arrow"
    if writer == "arrow":
        raise ParameterError(f"writer='arrow' cannot be used here: {why}. Use writer='auto' or 'spark'.")
    return "spark"


def check_writer(spark, output: str, row_level: bool, writer: str = "auto") -> str:
    """:func:`choose_writer` before the release is made (the command line, before any
    data is read): ``row_level`` says whether it will be a table computed in Python."""
    return choose_writer(spark, output, _ROW_LEVEL if row_level else None, writer)


_ROW_LEVEL = object()  # stands for a release's rows in check_writer


def _part_writer(fn, schema, fs, staging: str, token: str, rename: bool):
    """The task function of the Arrow writer: run ``fn`` over a partition's batches and
    write them to one Parquet file under ``staging`` (a path of ``fs``).

    It yields one summary row: partition id, rows written, the file's path relative
    to ``staging`` and its final name ("" for both when it wrote no rows).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow.fs import FileType

    marker = f"{staging}/{_JOB_MARKER}"

    def staging_open() -> bool:
        return fs.get_file_info(marker).type == FileType.File

    def gone():
        return OSError(
            f"the staging directory {staging!r} is not there: the release job was aborted, or the output "
            "path is not on a filesystem shared by the driver and every executor (write to HDFS or an "
            "object store, or pass writer='spark')")

    def sparkpriv_write_parquet(batches, pid):
        name = f"part-{pid:05d}-{token}-c000.snappy.parquet"
        # on an object store the attempt's own file is the one the driver copies, if Spark
        # reports this attempt as the partition's result
        rel = f"_temporary/{pid:05d}-{uuid.uuid4().hex}.parquet" if rename else \
            f"_attempts/part-{pid:05d}-{token}-{uuid.uuid4().hex}.snappy.parquet"
        tmp = f"{staging}/{rel}"
        writer, n, opened, done = None, 0, False, False
        try:
            for b in fn(batches, pid):
                if b.num_rows == 0:
                    continue
                t = pa.Table.from_batches([b])
                if not t.schema.equals(schema):  # nullability, or large_string from Spark's Arrow
                    t = t.cast(schema)
                if writer is None:
                    # The driver made the staging directory; a task never creates it: a task still
                    # running after its job failed must not bring back what the driver deleted.
                    if not staging_open():
                        raise gone()
                    opened = True
                    writer = pq.ParquetWriter(tmp, schema, filesystem=fs, compression="snappy",
                                              use_dictionary=False)
                writer.write_table(t)
                n += t.num_rows
            if writer is not None:
                writer.close()
                writer = None
                if rename:
                    fs.move(tmp, f"{staging}/{name}")
                    rel = name
                elif not staging_open():  # the job was aborted while this file was written
                    raise gone()
            done = True
        finally:
            if writer is not None:
                writer.close()  # an object store completes the upload: the file is deleted below
            if not done and opened and fs.get_file_info(tmp).type == FileType.File:
                fs.delete_file(tmp)
        yield pa.RecordBatch.from_arrays(
            [pa.array([pid], pa.int32()), pa.array([n], pa.int64()), pa.array([rel if n else ""]),
             pa.array([name if n else ""])], ["pid", "rows", "file", "name"])

    return sparkpriv_write_parquet


def _missing_files(store: _ArrowStore, paths: list[str]) -> list[str]:
    """The ``paths`` (qualified) that the driver does not see as files."""
    return [p for p in paths if not store.is_file(p)]


def _write_parts_with_arrow(rows, store: _ArrowStore, staging: str, receipt: dict,
                            if_no_rows=None) -> list[tuple[str, str]]:
    """Run ``rows.fn`` and write its batches from the Python tasks (module docstring).

    ``staging`` (qualified) holds the job marker. Returns ``(file, name)`` per part
    file: its path relative to ``staging`` and its final name.
    """
    import pyarrow.parquet as pq
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    from sparkpriv.spark.batches import map_batches

    schema = _arrow_schema_with_receipt(rows.schema, receipt)  # the receipt in every footer
    token = uuid.uuid4().hex
    task = _part_writer(rows.fn, schema, store.fs, store.path(staging), token, store.has_rename)
    out_schema = StructType([StructField("pid", IntegerType(), False), StructField("rows", LongType(), False),
                             StructField("file", StringType(), False), StructField("name", StringType(), False)])
    with spark_errors():
        done = map_batches(rows.source, task, out_schema).collect()
    store.delete(f"{staging}/_temporary")  # the job marker: a task still running now fails
    # One summary row per partition (a job's collect has exactly one result per partition;
    # asking the plan for its partition count instead would run an adaptive plan's shuffle again).
    if sorted(r["pid"] for r in done) != list(range(len(done))):
        raise OSError("the Arrow writer's task summaries do not cover the partitions 0..n-1 once each")
    parts = [(r["file"], r["name"]) for r in sorted(done, key=lambda r: r["pid"]) if r["rows"]]
    missing = _missing_files(store, [f"{staging}/{f}" for f, _ in parts])
    if missing:
        where = "a local output path must be on a filesystem shared by the driver and every executor" \
            if store.scheme == "file" else "the executors may be writing to another store or endpoint"
        raise OSError(
            f"{len(missing)} part files written by the executors are not visible on the driver under "
            f"{staging!r}: {where}. Write to HDFS or an object store, or pass writer='spark' (--writer spark)."
        )
    if not parts:
        if if_no_rows is not None:
            if_no_rows()  # may refuse (raise): the caller deletes the staging directory
        # as Spark: one empty file keeps the schema readable
        name = f"part-00000-{token}-c000.snappy.parquet"
        pq.write_table(schema.empty_table(), store.path(f"{staging}/{name}"), filesystem=store.fs)
        parts = [(name, name)]
    return parts


def _delete_staging(fs, staging: str, attempts: int = 20) -> None:
    """Delete a failed release's staging directory. A task of the failed job can
    still be finishing a part file (a rename into the directory, or an upload,
    while it is being removed): try again for a few seconds. Tasks never re-create
    the directory once its job marker is gone (``_part_writer``)."""
    for _ in range(attempts):
        fs.delete(staging)
        if not fs.exists(staging):
            return
        time.sleep(0.25)
    _log.warning("could not delete the staging directory %s of a failed release", staging)


def _manifest(parts: list[tuple[str, str]]) -> bytes:
    return json.dumps({"writer": "sparkpriv-arrow", "files": sorted(n for _, n in parts),
                       "receipt": RECEIPT_FILE}, indent=2).encode()


def _rename_into_place(fs, staging: str, output: str, trash: str, overwrite: bool) -> None:
    """The last step on a filesystem with a rename; the caller restores ``trash`` on failure."""
    if fs.exists(output):
        if not overwrite:
            raise OutputExistsError(f"The output {output!r} appeared while the release was written.")
        if not fs.rename(output, trash):
            raise OSError(f"could not move the existing output {output!r} aside")
    if not fs.rename(staging, output):
        raise OSError(f"could not rename the staged release to {output!r}")


def _copy_into_place(store: _ArrowStore, staging: str, output: str, parts, files: dict[str, bytes],
                     overwrite: bool) -> None:
    """The last step on an object store (no rename): copy, write, ``_SUCCESS`` last."""
    from concurrent.futures import ThreadPoolExecutor

    if store.exists(output):
        if not overwrite:
            raise OutputExistsError(f"The output {output!r} appeared while the release was written.")
        store.delete(f"{output}/{SUCCESS_FILE}")  # first: no reader takes the old release as complete
        store.delete(output)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(_COPY_THREADS, len(parts)))) as pool:
            list(pool.map(lambda p: store.copy(f"{staging}/{p[0]}", f"{output}/{p[1]}"), parts))
        for fname, data in files.items():
            store.write_bytes(f"{output}/{fname}", data)
        store.write_bytes(f"{output}/{SUCCESS_FILE}", _manifest(parts))
    except BaseException:
        store.delete(output)  # nothing at the destination
        raise


def _publish_with_arrow(rows, store: _ArrowStore, output: str, receipt: dict, files: dict[str, bytes],
                        overwrite: bool, if_no_rows) -> None:
    parent, name = _split(output)
    token = uuid.uuid4().hex[:12]
    staging = f"{parent}/.{name}.sparkpriv-staging-{token}"
    trash = f"{parent}/.{name}.sparkpriv-replaced-{token}"
    try:
        store.mkdirs(f"{staging}/_temporary")
        store.write_bytes(f"{staging}/{_JOB_MARKER}", b"")
        parts = _write_parts_with_arrow(rows, store, staging, receipt, if_no_rows)
        if store.has_rename:
            for fname, data in files.items():
                store.write_bytes(f"{staging}/{fname}", data)
            store.write_bytes(f"{staging}/{SUCCESS_FILE}", _manifest(parts))
            _rename_into_place(store, staging, output, trash, overwrite)
        else:
            _copy_into_place(store, staging, output, parts, files, overwrite)
            store.delete(staging)
    except BaseException:
        _delete_staging(store, staging)
        if store.has_rename and store.exists(trash) and not store.exists(output):
            store.rename(trash, output)  # put the previous release back
        raise
    if store.has_rename and store.exists(trash):
        store.delete(trash)


def publish(df, output: str, *, receipt: dict, overwrite: bool = False, rows=None, writer: str = "auto",
            extra_files: dict[str, bytes] | None = None, if_no_rows=None) -> str:
    """Write ``df``, its receipt and ``extra_files`` (name -> bytes, e.g. a model) to
    ``output``, atomically; return the qualified path.

    ``rows`` is the :class:`~sparkpriv.spark.batches.BatchMap` that ``df`` was
    built from, if it was; ``writer`` chooses who writes the part files
    (``auto``, ``spark``, ``arrow``; module docstring). With the Arrow writer
    ``receipt`` also goes into every part file's footer: it must be complete
    when this is called. ``if_no_rows`` is called when the Arrow writer's tasks
    wrote no rows at all; if it raises, nothing is published.

    Raises :class:`OutputExistsError` before writing anything when ``output``
    exists and ``overwrite`` is false.
    """
    spark = df.sparkSession
    raw = output
    output = check_output_path(spark, output, overwrite)
    how = choose_writer(spark, output, rows, writer)
    files = {RECEIPT_FILE: json.dumps(receipt, indent=2, sort_keys=True).encode(),
             "_common_metadata": receipt_metadata_bytes(df.schema, receipt), **(extra_files or {})}
    if how == "arrow":
        # the given URI when it is one (its query may hold options: endpoint_override=...);
        # else the qualified path (a plain path may be on Hadoop's default filesystem, e.g. HDFS)
        store = _ArrowStore(raw if _scheme(raw) == _scheme(output) else output)
        _publish_with_arrow(rows, store, output, receipt, files, overwrite, if_no_rows)
        _log.info("published the release to %s (arrow writer)", output)
        return output
    fs = filesystem_for(spark, output)
    parent, name = _split(output)
    token = uuid.uuid4().hex[:12]
    staging = f"{parent}/.{name}.sparkpriv-staging-{token}"
    trash = f"{parent}/.{name}.sparkpriv-replaced-{token}"
    try:
        with spark_errors():
            # noisy doubles never repeat: Parquet's dictionary attempt is wasted work
            # (measured 1.26x less CPU for the projection release, docs/benchmarks.md)
            df.write.mode("error").option("parquet.enable.dictionary", "false").parquet(staging)
        for fname, data in files.items():
            fs.write_bytes(f"{staging}/{fname}", data)
        _rename_into_place(fs, staging, output, trash, overwrite)
    except BaseException:
        _delete_staging(fs, staging)
        if fs.exists(trash) and not fs.exists(output):
            fs.rename(trash, output)  # put the previous release back
        raise
    if fs.exists(trash):
        fs.delete(trash)
    _log.info("published the release to %s (spark writer)", output)
    return output
