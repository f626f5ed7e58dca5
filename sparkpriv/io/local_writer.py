"""Publishing a release of the local engine (a pyarrow Table): complete or absent.

The same layout as a Spark release (:mod:`sparkpriv.io.writer`), written by
this process to a local path: one part file whose Parquet footer carries the
receipt under ``sparkpriv.receipt``, ``_privacy_receipt.json``,
``_common_metadata``, the mechanism's extra files and ``_SUCCESS``, in a hidden
staging directory beside the destination that is renamed to it when
everything is written (an existing destination is moved aside first when
``overwrite`` is set, and put back if the rename fails). A failure deletes the
staging directory: nothing appears at the destination.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from typing import Callable

from sparkpriv.errors import OutputExistsError, ParameterError
from sparkpriv.io.writer import RECEIPT_FILE, RECEIPT_KEY

__all__ = ["publish_local"]

_log = logging.getLogger(__name__)


def _local(path: str) -> str:
    if "://" in path and not path.startswith("file://"):
        raise ParameterError(f"An in-memory release writes local paths only; {path!r} is not one. Write "
                             "it locally, or release a Spark DataFrame to write to other filesystems.")
    return os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)


def publish_local(table, path: str, *, receipt_for: Callable[[str], tuple[dict, dict[str, bytes]]],
                  overwrite: bool = False) -> str:
    """Write ``table``, its receipt and files (``receipt_for(qualified_path)`` gives both: the
    receipt's side file and the mechanism's files, name -> bytes) to ``path`` atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = _local(path)
    if os.path.exists(out) and not overwrite:
        raise OutputExistsError(f"The output {out!r} already exists. Choose another path or pass "
                                "overwrite=True to replace it.")
    qualified = "file:" + out
    receipt, extra_files = receipt_for(qualified)
    text = json.dumps(receipt, sort_keys=True)
    parent, name = os.path.split(out.rstrip("/"))
    os.makedirs(parent or ".", exist_ok=True)
    token = uuid.uuid4().hex[:12]
    staging = os.path.join(parent, f".{name}.sparkpriv-staging-{token}")
    trash = os.path.join(parent, f".{name}.sparkpriv-replaced-{token}")
    try:
        os.mkdir(staging)
        schema = table.schema.with_metadata({RECEIPT_KEY: text})
        pq.write_table(table.replace_schema_metadata(schema.metadata), os.path.join(staging, "part-00000.parquet"))
        sink = pa.BufferOutputStream()
        pq.write_metadata(schema, sink)
        with open(os.path.join(staging, "_common_metadata"), "wb") as f:
            f.write(sink.getvalue().to_pybytes())
        with open(os.path.join(staging, RECEIPT_FILE), "w") as f:
            json.dump(receipt, f, indent=2, sort_keys=True)
        for fname, data in (extra_files or {}).items():
            with open(os.path.join(staging, fname), "wb") as f:
                f.write(data)
        open(os.path.join(staging, "_SUCCESS"), "wb").close()
        if os.path.exists(out):
            if not overwrite:
                raise OutputExistsError(f"The output {out!r} appeared while the release was written.")
            os.rename(out, trash)
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if os.path.exists(trash) and not os.path.exists(out):
            os.rename(trash, out)
        raise
    shutil.rmtree(trash, ignore_errors=True)
    _log.info("published the release to %s (local engine)", qualified)
    return qualified
