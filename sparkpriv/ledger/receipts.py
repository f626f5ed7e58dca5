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
from sparkpriv.receipt_form import DETAILS_FILE, public_ledger, public_path, restore_lists

__all__ = ["RECEIPT_FILE", "ReceiptCheck", "check_receipt", "describe_receipt", "load_details", "load_receipt",
           "restore_lists"]

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


def load_receipt(path: str, command: str = "receipt verify") -> tuple[str, dict]:
    """The receipt at ``path`` (the file, or a published release's directory holding it)."""
    if "://" in path and not path.startswith("file:"):
        raise ParameterError(f"{command} reads local or mounted paths; copy the {RECEIPT_FILE} of "
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
    if not isinstance(receipt, dict) or "guarantee" not in receipt or "events" not in receipt:
        raise ParameterError(f"{file!r} is not a sparkpriv privacy receipt (a JSON object with its guarantee and "
                             f"events): give a published release's directory or its {RECEIPT_FILE}.")
    return file, receipt


def load_details(receipt_file: str) -> dict | None:
    """The lists of the side file beside ``receipt_file`` (key -> list), or None when it has none."""
    file = os.path.join(os.path.dirname(receipt_file), DETAILS_FILE)
    try:
        with open(file, encoding="utf-8") as f:
            lists = json.load(f).get("lists")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as exc:
        raise ParameterError(f"Cannot read the receipt's side file {file!r}: {exc}.") from None
    return lists if isinstance(lists, dict) else None


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
    if info.get("ledger") and info.get("ledger") not in (ledger.public_url, public_ledger(ledger.public_url)):
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
    output = receipt.get("output") or {}
    receipt_path, ledger_path = output.get("path"), entry["output_path"]
    if output.get("local") and ledger_path:  # the receipt shows a local path without its directories
        ledger_path = public_path(ledger_path)[0]
        if receipt_path != ledger_path and os.path.basename(str(receipt_path)) == os.path.basename(ledger_path):
            ledger_path = receipt_path  # shown relative to another directory: the same output
    if receipt_path and entry["state"] == "committed" and receipt_path != ledger_path:
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


def describe_receipt(receipt: dict) -> str:
    """The short readable account ``sparkpriv receipt show`` prints: the summary, then the facts."""
    g = receipt.get("guarantee") or {}
    ledger = receipt.get("ledger") or {}
    output = receipt.get("output") or {}
    lines = []
    if not g.get("holds", False) or receipt.get("insecure_test_seed"):
        lines.append("*** NO PRIVACY GUARANTEE: made with a fixed test seed (insecure_fixed_seed). NOT PRIVATE. ***")
    if receipt.get("summary"):
        lines.append(str(receipt["summary"]))
    lines.append("")
    holds = "yes" if g.get("holds", False) and not receipt.get("insecure_test_seed") else "NO (fixed test seed)"
    lines += [
        f"  mechanism    {receipt.get('mechanism')}",
        f"  guarantee    epsilon = {g.get('epsilon')}, delta = {g.get('delta')}, neighbours: {g.get('neighbors')}",
        f"  protects     {g.get('protects')}",
        f"  holds        {holds}",
        f"  accountant   {g.get('accountant')}",
        f"  events       {receipt.get('events_summary')}",
    ]
    if ledger.get("entry_id"):
        lines.append(f"  ledger       entry {ledger.get('entry_id')} of table {ledger.get('table_id')}"
                     + (f" in {ledger.get('ledger')}" if ledger.get("ledger") else ""))
    else:
        lines.append("  ledger       none (made without a table id: not recorded in any budget ledger)")
    schema = output.get("schema") or []
    names = [str(c.get("name")) + ":" + str(c.get("type")) for c in schema if isinstance(c, dict)]
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} columns)" if len(names) > 8 else "")
    lines += [
        f"  output       {output.get('path')}",
        f"  schema       {shown or '-'}",
        f"  library      sparkpriv {(receipt.get('library') or {}).get('version')}",
        f"  created_at   {receipt.get('created_at')}",
    ]
    return "\n".join(_printable(line) for line in lines) + "\n"

