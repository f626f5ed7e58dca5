"""A release's receipt checked against the ledger that recorded it (``sparkpriv receipt verify``).

The receipt (``_privacy_receipt.json``, published with the table) names its
ledger entry and states the release's events and guarantee. :func:`check_receipt`
looks the entry up and checks that the ledger counts what the receipt says was
spent: the entry exists for the same table, is not aborted (an aborted entry
is not counted), its stored events and those its journal record holds are the
receipt's, their figure at the receipt's delta is not above the receipt's
epsilon (a receipt never states less than was spent), and the chain head the
receipt carries is still in the journal. The whole journal is checked by
``sparkpriv ledger verify``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from sparkpriv.errors import LedgerError, ParameterError
from sparkpriv.ledger.checks import _printable
from sparkpriv.ledger.events import InvalidEvent, spend_of_dict

__all__ = ["RECEIPT_FILE", "ReceiptCheck", "check_receipt", "load_receipt"]

#: The receipt's file name in a published release (sparkpriv.io.writer.RECEIPT_FILE; a test keeps them equal).
RECEIPT_FILE = "_privacy_receipt.json"
#: Relative slack between the receipt's epsilon (PLD of the release's event) and the ledger's figure.
_SLACK = 1e-3


@dataclass
class ReceiptCheck:
    """What :func:`check_receipt` found: ``ok`` when there are no ``problems``; ``notes`` inform only."""

    path: str
    entry_id: str | None = None
    table_id: str | None = None
    state: str | None = None
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"path": self.path, "ok": self.ok, "entry_id": self.entry_id, "table_id": self.table_id,
                "state": self.state, "problems": list(self.problems), "notes": list(self.notes)}


def load_receipt(path: str) -> tuple[str, dict]:
    """The receipt at ``path`` (the file, or a published release's directory holding it)."""
    if "://" in path and not path.startswith("file:"):
        raise ParameterError(f"receipt verify reads local or mounted paths; copy the {RECEIPT_FILE} of "
                             f"{path!r} here first.")
    path = path[len("file:"):] if path.startswith("file:") else path
    file = os.path.join(path, RECEIPT_FILE) if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as f:
            receipt = json.load(f)
    except FileNotFoundError:
        raise ParameterError(f"There is no receipt at {file!r}: give a published release's directory or its "
                             f"{RECEIPT_FILE}.") from None
    except (OSError, ValueError) as exc:
        raise ParameterError(f"Cannot read the receipt {file!r}: {exc}.") from None
    if not isinstance(receipt, dict):
        raise ParameterError(f"The receipt {file!r} is not a JSON object.")
    return file, receipt


def _figure(event: Any, delta: float) -> float:
    return spend_of_dict(event).epsilon(delta)


def check_receipt(ledger, receipt: dict, path: str = "") -> ReceiptCheck:
    """Check ``receipt`` (a parsed receipt) against ``ledger`` (an open :class:`~sparkpriv.ledger.Ledger`)."""
    out = ReceiptCheck(path)
    if receipt.get("insecure_test_seed"):
        out.problems.append("the receipt says it was made with a fixed test seed: the release has no privacy "
                            "guarantee")
    info = receipt.get("ledger")
    if not isinstance(info, dict) or not isinstance(info.get("entry_id"), str):
        out.problems.append("the receipt names no ledger entry: the release was not recorded in a ledger "
                            "(made without a table id)")
        return out
    out.entry_id, out.table_id = info["entry_id"], info.get("table_id")
    if info.get("ledger") and info.get("ledger") != ledger.public_url:
        out.notes.append(f"the receipt was recorded in ledger {_printable(info.get('ledger'))}; checked against "
                         f"{ledger.public_url}")
    try:
        entry = ledger.entry(out.entry_id)
    except (LedgerError, ParameterError) as exc:
        out.problems.append(f"{exc} (a wrong ledger, or the entry was deleted: run `sparkpriv ledger verify`)")
        return out
    out.state = entry["state"]
    if entry["table_id"] != out.table_id:
        out.problems.append(f"the receipt says table {_printable(out.table_id)!s}, the ledger's entry is of table "
                            f"{_printable(entry['table_id'])}")
    if entry["state"] == "aborted":
        out.problems.append(f"the ledger aborted this entry ({_printable(entry['abort_reason'])}): its spend is not "
                            "counted, yet the receipt was published")
    elif entry["state"] == "reserved":
        out.notes.append("the entry is still 'reserved' (counted, but the ledger never recorded the publication: "
                         "the job may have died after publishing)")
    events = receipt.get("events")
    stored = json.loads(entry["events"])
    if events != stored:
        out.problems.append("the receipt's events differ from those the ledger stores for its entry")
    journalled = ledger._journalled_events(out.entry_id)
    if journalled is None:
        out.problems.append("no journal record holds the entry's reservation (the journal was edited: run "
                            "`sparkpriv ledger verify`)")
    elif json.loads(journalled) != stored and _inner(journalled) != stored:
        out.problems.append("the entry's events differ from those its journal record holds (edited after it was "
                            "written: run `sparkpriv ledger verify`)")
    guarantee = receipt.get("guarantee") or {}
    eps, delta = guarantee.get("epsilon"), guarantee.get("delta")
    if isinstance(eps, (int, float)) and isinstance(delta, (int, float)) and 0 <= delta < 1:
        try:
            counted = _figure(stored, float(delta))
            stated = float(eps)
            if math.isfinite(counted) and stated < counted * (1 - _SLACK) - 1e-12:
                out.problems.append(f"the receipt states epsilon {stated:.6g} at delta {delta:g}, less than the "
                                    f"ledger's events spend ({counted:.6g})")
        except InvalidEvent as exc:
            out.problems.append(f"the ledger's events for the entry cannot be accounted: {exc}")
    else:
        out.problems.append("the receipt states no guarantee (epsilon and delta)")
    receipt_path = (receipt.get("output") or {}).get("path")
    if receipt_path and entry["state"] == "committed" and receipt_path != entry["output_path"]:
        out.notes.append(f"the receipt's output path {_printable(receipt_path)} differs from the ledger's "
                         f"{_printable(entry['output_path'])}")
    head = info.get("chain_head")
    if isinstance(head, str):
        seq, _, want = head.partition(":")
        have = ledger._record_hash(int(seq)) if seq.isdigit() else None
        if have != want:
            out.problems.append(f"the journal no longer holds the head this receipt pinned (record #{seq}): the "
                                "journal was rewritten or cut (run `sparkpriv ledger verify --pin "
                                f"{_printable(head)}`)")
    else:
        out.notes.append("the receipt carries no journal head (made before the journal existed)")
    return out


def _inner(text: str):
    """A stored event's dict without its format envelope."""
    obj = json.loads(text)
    return obj.get("event") if isinstance(obj, dict) and "event_format" in obj else obj
