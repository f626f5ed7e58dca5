"""The form of a privacy receipt: its one-paragraph summary, the paths it shows, and its side file.

Pure Python (no numpy, no pyspark, no I/O): :meth:`sparkpriv.release.Release.receipt`
builds the receipt with these, the writers publish :func:`split_long_lists`'
side file beside it, and ``sparkpriv receipt show`` reads both.

* :func:`public_path`: a receipt never shows a local absolute path (it names
  the owner's machine and home). A local path is shown relative to the
  current directory when under it, else by its last component, with
  ``"local": true``; a remote URI (``s3a://``, ``hdfs://``, ``gs://``) is kept
  without any ``user:password@`` in it. The ledger keeps the full path.
* :func:`split_long_lists`: a list of more than :data:`LONG_LIST` numbers or
  strings (1,303 bounds, column names) goes to :data:`DETAILS_FILE`, stored
  once however often the receipt repeats it; the receipt keeps a stub (length,
  min, max, the file and key). Events, the guarantee and every value named
  like a noise scale or a sensitivity stay in the receipt, however long.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["DETAILS_FILE", "LONG_LIST", "public_ledger", "public_path", "public_source", "restore_lists",
           "split_long_lists", "summary_of", "with_details"]

#: The side file of long lists, published beside ``_privacy_receipt.json``.
DETAILS_FILE = "_privacy_receipt_details.json"
#: Lists longer than this go to the side file.
LONG_LIST = 64
# top-level parts of the receipt that are never split (what the guarantee is, and its accounting)
_KEEP_TOP = ("events", "guarantee", "ledger", "format", "summary")
# values the guarantee depends on stay in the receipt (noise scales, sensitivities, budgets)
_KEEP_NAME = re.compile(r"noise|sigma|scale|sensitiv|std|epsilon|delta|bound_l2|row_bound", re.I)


def public_path(path: str | None) -> tuple[str | None, bool]:
    """``(shown, local)``: ``path`` as a receipt may show it (module docstring)."""
    if not path:
        return path, False
    if "://" in path and not path.startswith("file:"):
        parts = urlsplit(path)
        netloc = parts.netloc.rpartition("@")[2]  # drop user:password@
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), False
    local = path[len("file:"):] if path.startswith("file:") else path
    if local.startswith("//"):
        local = "/" + local.lstrip("/")
    if not os.path.isabs(local):
        return local, True
    here = os.path.abspath(os.curdir)
    local = os.path.normpath(local)
    if local == here or local.startswith(here.rstrip(os.sep) + os.sep):
        return os.path.relpath(local, here), True
    return os.path.basename(local.rstrip(os.sep)) or ".", True


def public_ledger(url: str | None) -> str | None:
    """A ledger's URL for the receipt: a SQLite file's path by :func:`public_path`, others as given
    (their public form, without a password)."""
    if isinstance(url, str) and url.startswith("sqlite:///"):
        return "sqlite:///" + str(public_path(url[len("sqlite:///"):])[0])
    return url


def public_source(source: str | None) -> str | None:
    """An input's ``source`` for the receipt: a path by :func:`public_path`, other names as given."""
    if not isinstance(source, str):
        return source
    if "://" in source or source.startswith("file:") or os.path.isabs(source):
        return public_path(source)[0]
    return source


def _long(value) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) > LONG_LIST
            and all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in value))


def split_long_lists(receipt: dict) -> tuple[dict, dict | None]:
    """``(receipt with stubs, side file's content or None)``; ``receipt`` is not changed."""
    lists: dict[str, list] = {}

    def walk(obj, name: str):
        if isinstance(obj, dict):
            return {k: (v if _KEEP_NAME.search(k) else walk(v, k)) for k, v in obj.items()}
        if _long(obj):
            obj = list(obj)
            key = hashlib.sha256(json.dumps(obj).encode()).hexdigest()[:16]
            lists[key] = obj
            stub = {"in_file": DETAILS_FILE, "key": key, "length": len(obj)}
            if all(isinstance(v, (int, float)) for v in obj):
                stub.update(min=min(obj), max=max(obj))
            else:
                stub["first"] = obj[:3]
            return stub
        if isinstance(obj, (list, tuple)):
            return [walk(v, name) for v in obj]
        return obj

    out = {k: (v if k in _KEEP_TOP else walk(v, k)) for k, v in receipt.items()}
    if not lists:
        return out, None
    return out, {"format": "sparkpriv.receipt_details/1", "receipt": "_privacy_receipt.json",
                 "mechanism": receipt.get("mechanism"), "lists": lists}


def restore_lists(receipt: dict, lists: dict | None) -> dict:
    """``receipt`` with every side-file stub replaced by its list (stubs kept when ``lists`` lacks it)."""
    def walk(obj):
        if isinstance(obj, dict):
            if obj.get("in_file") == DETAILS_FILE and lists and obj.get("key") in lists:
                return lists[obj["key"]]
            return {k: walk(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        return obj

    return walk(receipt)


def with_details(receipt_bytes: bytes, details_bytes: bytes | None) -> bytes:
    """A published receipt's bytes with its side file's lists put back (as readers of the whole receipt want)."""
    if not details_bytes:
        return receipt_bytes
    lists = json.loads(details_bytes.decode()).get("lists")
    return json.dumps(restore_lists(json.loads(receipt_bytes.decode()), lists)).encode()


def summary_of(receipt: dict) -> str:
    """One paragraph saying what the release is and what it guarantees."""
    g = receipt.get("guarantee") or {}
    ledger = receipt.get("ledger") or {}
    head = f"A {receipt.get('mechanism')} release made by sparkpriv {(receipt.get('library') or {}).get('version')}"
    if not g.get("holds", False):
        claim = ("made with a FIXED TEST SEED: it has NO privacy guarantee and must not be published as "
                 "private")
    else:
        claim = (f"({g.get('epsilon'):.6g}, {g.get('delta'):.3g})-differentially private for "
                 f"{g.get('neighbors')} neighbours, protecting {g.get('protects') or 'one record'}")
    where = (f"recorded in the ledger as entry {ledger.get('entry_id')} of table {ledger.get('table_id')}"
             if ledger.get("entry_id") else "not recorded in any budget ledger")
    cols = len((receipt.get("output") or {}).get("schema") or [])
    return f"{head}, {claim}; {where}; the table has {cols} column(s)."
