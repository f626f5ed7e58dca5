"""The file systems a release is written to (local, Hadoop through the JVM, object stores through
pyarrow), behind one small interface the writer uses (:func:`filesystem_for`)."""

from __future__ import annotations

import os
import shutil
from urllib.parse import urlsplit

from sparkpriv.errors import ParameterError


# object stores the Arrow writer reaches through pyarrow (``auto`` picks it for row-level releases)
ARROW_SCHEMES = ("s3", "gs", "gcs")
_RENAME_TYPES = ("local", "hdfs")  # pyarrow filesystems whose directory rename is a rename


def _scheme(path: str) -> str:
    """The URI scheme of ``path`` in lower case ("" for a plain local path)."""
    i = path.find("://")
    if i > 0:
        return path[:i].lower()
    if path.lower().startswith("file:"):
        return "file"
    return ""


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


def _with_delayed_open(uri: str, scheme: str) -> str:
    """``uri`` with ``allow_delayed_open=true`` added for S3 unless the query sets it.

    pyarrow's S3 output streams otherwise start a multipart upload when opened, so
    every marker, receipt and small part file costs three requests, and an empty
    file is a multipart upload of one empty part (which some S3-compatible servers
    refuse). With delayed opening an object smaller than one part is a single
    PutObject; larger ones still go up in parts.
    """
    if scheme != "s3" or "allow_delayed_open=" in urlsplit(uri).query:
        return uri
    return uri + ("&" if urlsplit(uri).query else "?") + "allow_delayed_open=true"


class _ArrowStore:
    """A pyarrow filesystem, addressed by the same qualified paths as the Hadoop one
    (``file:/abs/path``, ``s3://bucket/key``). The Arrow writer's driver side uses it,
    and its tasks get ``fs`` (pickled: options such as the endpoint, never credentials
    that came from the environment, which each executor resolves itself)."""

    def __init__(self, uri: str):
        from pyarrow import fs as pafs

        self.scheme = _scheme(uri) or "file"
        if self.scheme == "file":
            self.fs = pafs.LocalFileSystem()
        else:
            if "@" in urlsplit(uri).netloc:
                # never echo the URI: it holds a secret
                raise ParameterError(
                    f"The {self.scheme}:// output names credentials in the URI; give them to pyarrow "
                    "through the environment instead (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, an "
                    "AWS profile or an instance role): the output path is written to the receipt and "
                    "the log.")
            try:
                self.fs, _ = pafs.FileSystem.from_uri(_with_delayed_open(uri, self.scheme))
            except Exception as exc:  # ArrowInvalid, ArrowNotImplementedError, OSError
                raise ParameterError(
                    f"pyarrow cannot open the {self.scheme}:// output {self.qualify(uri)!r}: {exc}") from None
        self.has_rename = self.fs.type_name in _RENAME_TYPES

    def path(self, uri: str) -> str:
        """The filesystem's own path for a qualified (or plain) ``uri``."""
        if self.scheme == "file":
            p = uri[len("file://"):] if uri.startswith("file://") else uri[len("file:"):] \
                if uri.startswith("file:") else uri
            return os.path.abspath(p)
        u = urlsplit(uri)
        if self.fs.type_name == "hdfs":
            return u.path.rstrip("/") or "/"
        return (u.netloc + u.path).rstrip("/")

    def qualify(self, uri: str) -> str:
        if self.scheme == "file":
            return "file:" + self.path(uri)
        u = urlsplit(uri)
        return f"{self.scheme}://{u.hostname or ''}{':' + str(u.port) if u.port else ''}{u.path}".rstrip("/")

    def _info(self, uri: str):
        return self.fs.get_file_info(self.path(uri))

    def exists(self, uri: str) -> bool:
        from pyarrow.fs import FileType

        return self._info(uri).type != FileType.NotFound

    def is_file(self, uri: str) -> bool:
        from pyarrow.fs import FileType

        return self._info(uri).type == FileType.File

    def rename(self, src: str, dst: str) -> bool:
        try:
            self.fs.move(self.path(src), self.path(dst))
            return True
        except OSError:
            return False

    def delete(self, uri: str) -> None:
        from pyarrow.fs import FileType

        p = self.path(uri)
        t = self.fs.get_file_info(p).type
        try:
            if t == FileType.Directory:
                self.fs.delete_dir(p)
            elif t == FileType.File:
                self.fs.delete_file(p)
        except FileNotFoundError:
            pass

    def mkdirs(self, uri: str) -> None:
        if self.has_rename:  # object stores have no directories (pyarrow would write marker objects)
            self.fs.create_dir(self.path(uri), recursive=True)

    def write_bytes(self, uri: str, data: bytes) -> None:
        with self.fs.open_output_stream(self.path(uri)) as out:
            out.write(data)

    def read_bytes(self, uri: str) -> bytes:
        with self.fs.open_input_stream(self.path(uri)) as inp:
            return inp.read()

    def copy(self, src: str, dst: str) -> None:
        self.fs.copy_file(self.path(src), self.path(dst))


def _pyarrow_output(path: str) -> bool:
    return _scheme(path) in ARROW_SCHEMES


def filesystem_for(spark, path: str):
    """The Hadoop filesystem of ``path`` (or the local one without a JVM): Spark's writer's."""
    try:
        spark._jsc  # noqa: B018 - absent under Spark Connect
        return _HadoopFS(spark, path)
    except AttributeError:
        return _LocalFS()


def _store_for_check(spark, path: str):
    """pyarrow's filesystem for ``s3://`` and ``gs://`` outputs, else :func:`filesystem_for`."""
    return _ArrowStore(path) if _pyarrow_output(path) else filesystem_for(spark, path)
