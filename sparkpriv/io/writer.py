"""Publishing a release: complete or absent.

The private DataFrame is written to a hidden staging directory beside the
destination (same filesystem, so the final step is a rename), together with

* ``_privacy_receipt.json``: the receipt, pretty-printed JSON;
* ``_common_metadata``: a Parquet metadata-only file (the standard summary file
  that pyarrow, Dask and Hive understand) whose key-value metadata holds the
  receipt under ``sparkpriv.receipt``. Spark's Parquet writer offers no hook to
  add key-value pairs to each part file's footer, so the summary file is where
  Parquet readers find it: ``pyarrow.parquet.read_metadata(path +
  "/_common_metadata").metadata[b"sparkpriv.receipt"]``. Spark itself ignores
  files starting with ``_`` when it reads the table.

Only when everything is written is the staging directory renamed to the
destination (an existing destination is first moved aside when ``overwrite``
is set, and deleted after the rename). Any failure deletes the staging
directory, so a failed job leaves nothing at the destination. On HDFS and local
filesystems the rename is atomic; on object stores (s3a) a directory rename is
a copy, so readers should rely on ``_privacy_receipt.json`` being present (it
is written before the rename and Spark's ``_SUCCESS`` marker is kept).

Filesystem access goes through Hadoop's FileSystem API of the running JVM, so
every scheme Spark can write is supported; without a JVM (Spark Connect) only
local paths are supported.

Two writers produce the part files. ``spark`` is ``DataFrame.write.parquet``.
``arrow`` applies to row-level releases whose DataFrame is a
:class:`~sparkpriv.spark.batches.BatchMap` (a numpy function over Arrow
batches): the Python tasks that compute the batches write them with pyarrow's
Parquet writer, one file per partition, instead of sending them back to the
JVM to be turned into rows and encoded again (about 7 s per million rows of 64
doubles on the development machine, docs/cdr.md). A task writes to a file of
its own under ``_temporary`` and renames it to ``part-<partition>-...`` when it
is complete, so a retried or speculative task (which recomputes the same
noise) replaces the file with the same content. Only the driver creates the
staging directories: a task still running after its job failed finds the
staging directory gone and fails, instead of bringing it back (the driver's
clean-up retries while such a task finishes a rename). The driver checks that every
partition reported and that every reported file is visible to it. ``auto``
(the default) uses ``arrow`` for such releases on classic Spark when the
output is a local path (``file:``; a path shared by the driver and the
executors), and ``spark`` otherwise (HDFS, object stores, Spark Connect).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid

from sparkpriv.errors import OutputExistsError, ParameterError
from sparkpriv.spark.batches import spark_errors

__all__ = [
    "publish",
    "check_output_path",
    "RECEIPT_FILE",
    "RECEIPT_KEY",
    "filesystem_for",
    "receipt_metadata_bytes",
    "WRITERS",
]

RECEIPT_FILE = "_privacy_receipt.json"
RECEIPT_KEY = "sparkpriv.receipt"
WRITERS = ("auto", "spark", "arrow")
_log = logging.getLogger(__name__)


class _HadoopFS:
    def __init__(self, spark, path: str):
        jvm = spark._jvm
        self._jvm = jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        conf = spark._jsc.hadoopConfiguration()
        self._fs = self._Path(path).getFileSystem(conf)

    def qualify(self, path: str) -> str:
        return str(self._fs.makeQualified(self._Path(path)).toString())

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._Path(path)))

    def rename(self, src: str, dst: str) -> bool:
        return bool(self._fs.rename(self._Path(src), self._Path(dst)))

    def delete(self, path: str) -> None:
        self._fs.delete(self._Path(path), True)

    def mkdirs(self, path: str) -> None:
        self._fs.mkdirs(self._Path(path))

    def write_bytes(self, path: str, data: bytes) -> None:
        out = self._fs.create(self._Path(path), True)
        try:
            out.write(bytearray(data))
        finally:
            out.close()

    def read_bytes(self, path: str) -> bytes:
        p = self._Path(path)
        status = self._fs.getFileStatus(p)
        buf = self._jvm.java.io.ByteArrayOutputStream()
        inp = self._fs.open(p)
        try:
            self._jvm.org.apache.hadoop.io.IOUtils.copyBytes(inp, buf, 65536, False)
        finally:
            inp.close()
        data = bytes(buf.toByteArray())
        assert len(data) == status.getLen()
        return data


class _LocalFS:
    @staticmethod
    def _p(path: str) -> str:
        if path.startswith("file://"):
            return path[len("file://"):]
        if path.startswith("file:"):
            return path[len("file:"):]
        if "://" in path:
            raise ParameterError(
                f"Without a Spark JVM (Spark Connect) only local output paths are supported; got {path!r}."
            )
        return path

    def qualify(self, path: str) -> str:
        return "file:" + os.path.abspath(self._p(path))

    def exists(self, path):
        return os.path.exists(self._p(path))

    def rename(self, src, dst):
        try:
            os.rename(self._p(src), self._p(dst))
            return True
        except OSError:
            return False

    def delete(self, path):
        p = self._p(path)
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.exists(p):
            os.remove(p)

    def mkdirs(self, path):
        os.makedirs(self._p(path), exist_ok=True)

    def write_bytes(self, path, data):
        with open(self._p(path), "wb") as f:
            f.write(data)

    def read_bytes(self, path):
        with open(self._p(path), "rb") as f:
            return f.read()


def filesystem_for(spark, path: str):
    """The Hadoop filesystem of ``path`` (or the local one without a JVM)."""
    try:
        spark._jsc  # noqa: B018 - absent under Spark Connect
        return _HadoopFS(spark, path)
    except AttributeError:
        return _LocalFS()


def receipt_metadata_bytes(spark_schema, receipt: dict) -> bytes:
    """A Parquet ``_common_metadata`` file: the schema plus ``sparkpriv.receipt``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(spark_schema)
    schema = schema.with_metadata({RECEIPT_KEY: json.dumps(receipt, sort_keys=True)})
    sink = pa.BufferOutputStream()
    pq.write_metadata(schema, sink)
    return sink.getvalue().to_pybytes()


def _split(path: str) -> tuple[str, str]:
    p = path.rstrip("/")
    i = p.rfind("/")
    if i < 0:
        return ".", p
    return p[:i] or "/", p[i + 1:]


def check_output_path(spark, output: str, overwrite: bool) -> str:
    """Qualify ``output`` and refuse it if it exists and ``overwrite`` is false."""
    fs = filesystem_for(spark, output)
    output = fs.qualify(output)
    if fs.exists(output) and not overwrite:
        raise OutputExistsError(
            f"The output {output!r} already exists. Choose another path or pass overwrite=True "
            "(--overwrite) to replace it."
        )
    return output


def _local_path(qualified: str) -> str | None:
    return qualified[len("file:"):] if qualified.startswith("file:") else None


def choose_writer(spark, output: str, rows, writer: str = "auto") -> str:
    """``"arrow"`` or ``"spark"`` for ``output`` (qualified) and a release's ``rows``."""
    if writer not in WRITERS:
        raise ParameterError(f"writer must be one of {', '.join(WRITERS)}; got {writer!r}.")
    if writer == "spark":
        return "spark"
    why = None
    if rows is None:
        why = "this release is not a row-level table computed in Python (nothing to write from the workers)"
    elif _local_path(output) is None:
        why = f"it writes local (file:) paths only; {output!r} is not one"
    elif not hasattr(spark, "_jsc"):
        why = "it needs classic Spark (under Spark Connect the server's Spark writer is used)"
    if why is None:
        return "arrow"
    if writer == "arrow":
        raise ParameterError(f"writer='arrow' cannot be used here: {why}. Use writer='auto' or 'spark'.")
    return "spark"


def _write_parts_with_arrow(rows, staging: str, if_no_rows=None) -> None:
    """Run ``rows.fn`` and write its batches from the Python tasks (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    from sparkpriv.spark.batches import map_batches

    local = _local_path(staging)
    schema = to_arrow_schema(rows.schema)
    token = uuid.uuid4().hex
    fn = rows.fn
    out_schema = StructType([StructField("pid", IntegerType(), False), StructField("rows", LongType(), False),
                             StructField("file", StringType(), False)])

    def sparkpriv_write_parquet(batches, pid):
        name = f"part-{pid:05d}-{token}-c000.snappy.parquet"
        tmpdir = os.path.join(local, "_temporary")
        tmp = os.path.join(tmpdir, f"{pid:05d}-{uuid.uuid4().hex}.parquet")
        writer, n = None, 0
        try:
            for b in fn(batches, pid):
                if b.num_rows == 0:
                    continue
                t = pa.Table.from_batches([b])
                if not t.schema.equals(schema):  # nullability, or large_string from Spark's Arrow
                    t = t.cast(schema)
                if writer is None:
                    # The driver made the directory; a task never creates it: a task still running
                    # after its job failed must not bring back a staging directory the driver deleted.
                    if not os.path.isdir(tmpdir):
                        raise OSError(
                            f"the staging directory {local!r} is not there: the release job was aborted, or "
                            "the output path is not on a filesystem shared by the driver and every executor "
                            "(write to HDFS or an object store, or pass writer='spark')")
                    writer = pq.ParquetWriter(tmp, schema, compression="snappy", use_dictionary=False)
                writer.write_table(t)
                n += t.num_rows
            if writer is not None:
                writer.close()
                writer = None
                os.replace(tmp, os.path.join(local, name))
        finally:
            if writer is not None:
                writer.close()
            if os.path.exists(tmp):
                os.remove(tmp)
        yield pa.RecordBatch.from_arrays([pa.array([pid], pa.int32()), pa.array([n], pa.int64()),
                                          pa.array([name if n else ""])], ["pid", "rows", "file"])

    os.makedirs(os.path.join(local, "_temporary"))
    with spark_errors():
        done = map_batches(rows.source, sparkpriv_write_parquet, out_schema).collect()
    shutil.rmtree(os.path.join(local, "_temporary"), ignore_errors=True)
    # One summary row per partition (a job's collect has exactly one result per partition;
    # asking the plan for its partition count instead would run an adaptive plan's shuffle again).
    if sorted(r["pid"] for r in done) != list(range(len(done))):
        raise OSError("the Arrow writer's task summaries do not cover the partitions 0..n-1 once each")
    missing = [r["file"] for r in done if r["rows"] and not os.path.isfile(os.path.join(local, r["file"]))]
    if missing:
        raise OSError(
            f"{len(missing)} part files written by the executors are not visible on the driver under "
            f"{local!r}: a local output path must be on a filesystem shared by the driver and every "
            "executor. Write to HDFS or an object store, or pass writer='spark' (--writer spark)."
        )
    if not any(r["rows"] for r in done):
        if if_no_rows is not None:
            if_no_rows()  # may refuse (raise): the caller deletes the staging directory
        # as Spark: one empty file keeps the schema readable
        pq.write_table(schema.empty_table(), os.path.join(local, f"part-00000-{token}-c000.snappy.parquet"))
    open(os.path.join(local, "_SUCCESS"), "wb").close()


def _delete_staging(fs, staging: str, attempts: int = 20) -> None:
    """Delete a failed release's staging directory. A task of the failed job can
    still be finishing a part file (its ``os.replace`` into the directory while it
    is being removed makes the removal fail): try again for a few seconds. Tasks
    never re-create the directory once it is gone (``_write_parts_with_arrow``)."""
    for _ in range(attempts):
        fs.delete(staging)
        if not fs.exists(staging):
            return
        time.sleep(0.25)
    _log.warning("could not delete the staging directory %s of a failed release", staging)


def publish(df, output: str, *, receipt: dict, overwrite: bool = False, rows=None, writer: str = "auto",
            extra_files: dict[str, bytes] | None = None, if_no_rows=None) -> str:
    """Write ``df``, its receipt and ``extra_files`` (name -> bytes, e.g. a model) to
    ``output``, atomically; return the qualified path.

    ``rows`` is the :class:`~sparkpriv.spark.batches.BatchMap` that ``df`` was
    built from, if it was; ``writer`` chooses who writes the part files
    (``auto``, ``spark``, ``arrow``; module docstring). ``if_no_rows`` is
    called when the Arrow writer's tasks wrote no rows at all; if it raises,
    nothing is published.

    Raises :class:`OutputExistsError` before writing anything when ``output``
    exists and ``overwrite`` is false.
    """
    spark = df.sparkSession
    fs = filesystem_for(spark, output)
    output = check_output_path(spark, output, overwrite)
    how = choose_writer(spark, output, rows, writer)
    parent, name = _split(output)
    token = uuid.uuid4().hex[:12]
    staging = f"{parent}/.{name}.sparkpriv-staging-{token}"
    trash = f"{parent}/.{name}.sparkpriv-replaced-{token}"
    try:
        if how == "arrow":
            _write_parts_with_arrow(rows, staging, if_no_rows)
        else:
            with spark_errors():
                # noisy doubles never repeat: Parquet's dictionary attempt is wasted work
                # (measured 1.26x less CPU for the projection release, docs/benchmarks.md)
                df.write.mode("error").option("parquet.enable.dictionary", "false").parquet(staging)
        fs.write_bytes(f"{staging}/{RECEIPT_FILE}", json.dumps(receipt, indent=2, sort_keys=True).encode())
        fs.write_bytes(f"{staging}/_common_metadata", receipt_metadata_bytes(df.schema, receipt))
        for fname, data in (extra_files or {}).items():
            fs.write_bytes(f"{staging}/{fname}", data)
        if fs.exists(output):
            if not overwrite:
                raise OutputExistsError(f"The output {output!r} appeared while the release was written.")
            if not fs.rename(output, trash):
                raise OSError(f"could not move the existing output {output!r} aside")
        if not fs.rename(staging, output):
            raise OSError(f"could not rename the staged release to {output!r}")
    except BaseException:
        _delete_staging(fs, staging)
        if fs.exists(trash) and not fs.exists(output):
            fs.rename(trash, output)  # put the previous release back
        raise
    if fs.exists(trash):
        fs.delete(trash)
    _log.info("published the release to %s (%s writer)", output, how)
    return output
