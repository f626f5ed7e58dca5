"""The ledger's journal: every change, appended to a hash chain, and its verification (docs/ledger.md).

Every write of the ledger appends one record to ``sparkpriv_journal`` in the
same transaction as the change itself: a budget set or changed, a privacy unit
set or changed, a reservation (the whole entry as inserted), a commit, an
abort, a refused attempt. A record is ``(seq, kind, at, body, prev, hash)``:
``seq`` counts from 1 without gaps, ``body`` is canonical JSON, ``prev`` is
the previous record's ``hash`` (the first record's is ``sparkpriv-ledger:`` +
the ledger's id), and

    hash = "sha256:" + SHA-256(message)                                  (no key)
    hash = "hmac-sha256:" + key id + ":" + HMAC-SHA-256(key, message)    (with a key)
    message = "sparkpriv.ledger.chain/1\\n" + seq + "\\n" + kind + "\\n" + at + "\\n" + prev + "\\n" + body

:func:`verify` recomputes the chain, replays the records into the budgets,
units and entries they imply, and compares those with the tables the ledger
admits from (``sparkpriv_budgets``, ``sparkpriv_units``,
``sparkpriv_releases``). An edit of either, a deleted, inserted or reordered
record, is found and the first broken record or entry is named.

What the chain cannot do by itself: anyone who can write to the database can
also recompute every hash after an edit (SHA-256 has no secret). Two things
close that: a **key** held outside the database (``SPARKPRIV_LEDGER_KEY_FILE``
on every writer and on the verifier: then the hashes are HMACs that only the
key's holders can compute), and a **pinned head** (the last record's
``seq:hash``, which every write logs and every receipt carries): a copy kept
elsewhere that a recomputed chain no longer matches.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

from sparkpriv.errors import LedgerError

__all__ = ["KEY_FILE_ENV", "ChainKey", "Record", "VerifyReport", "Problem", "canonical", "record_hash",
           "genesis_prev", "load_key", "verify"]

KEY_FILE_ENV = "SPARKPRIV_LEDGER_KEY_FILE"
CHAIN_FORMAT = "sparkpriv.ledger.chain/1"
KINDS = ("genesis", "upgrade", "key", "budget", "unit", "reserve", "import", "commit", "abort", "refuse")

#: The columns of sparkpriv_releases, in order (schema version 2).
RELEASE_COLUMNS = ("id", "table_id", "state", "mechanism", "parameters", "events", "epsilon", "epsilon_delta",
                   "output_path", "receipt_summary", "created_at", "published_at", "aborted_at", "abort_reason",
                   "host", "pid", "user_name", "job_id", "sparkpriv_version")
BUDGET_COLUMNS = ("table_id", "epsilon", "delta", "updated_at", "time_window", "updated_by", "reason")
UNIT_COLUMNS = ("unit", "patterns", "epsilon", "delta", "time_window", "updated_at", "updated_by", "reason")


# -- encoding ----------------------------------------------------------------------------


def value(v: Any) -> Any:
    """A stored column value in a JSON body (non-finite floats as ``{"float": "nan"}``)."""
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}
    if isinstance(v, (bytes, memoryview)):
        return {"bytes": bytes(v).hex()}
    return v


def canonical(body: dict) -> str:
    """The body's text as hashed and stored: sorted keys, no spaces, ASCII, strict JSON."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def genesis_prev(ledger_id: str) -> str:
    return f"sparkpriv-ledger:{ledger_id}"


@dataclass(frozen=True)
class ChainKey:
    """A secret key for the chain's HMACs; ``id`` names it (it reveals nothing about the key)."""

    secret: bytes = field(repr=False)

    @property
    def id(self) -> str:
        return "k" + hmac.new(self.secret, b"sparkpriv ledger key id", hashlib.sha256).hexdigest()[:16]


def load_key(path: str | None = None) -> ChainKey | None:
    """The key in ``path`` (default ``$SPARKPRIV_LEDGER_KEY_FILE``), or None if neither is set.

    The file holds at least 16 bytes of secret material (e.g. ``openssl rand
    -hex 32``); surrounding whitespace is ignored. Errors name the file, never
    its content.
    """
    path = path or os.environ.get(KEY_FILE_ENV) or None
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            secret = f.read().strip()
    except OSError as exc:
        raise LedgerError(f"Cannot read the ledger key file {path!r} ({KEY_FILE_ENV}): {exc.strerror}. "
                          "Check the path and its permissions.") from None
    if len(secret) < 16:
        raise LedgerError(f"The ledger key file {path!r} ({KEY_FILE_ENV}) must hold at least 16 bytes of "
                          "secret material, e.g. made with `openssl rand -hex 32`.")
    return ChainKey(secret)


def record_hash(seq: int, kind: str, at: str, prev: str, body: str, key: ChainKey | None) -> str:
    message = "\n".join((CHAIN_FORMAT, str(seq), kind, at, prev, body)).encode("utf-8", "surrogatepass")
    if key is None:
        return "sha256:" + hashlib.sha256(message).hexdigest()
    return f"hmac-sha256:{key.id}:" + hmac.new(key.secret, message, hashlib.sha256).hexdigest()


def key_id_of(hash_text: str) -> str | None:
    """The key id of a keyed record's hash, None for an unkeyed one."""
    if isinstance(hash_text, str) and hash_text.startswith("hmac-sha256:"):
        return hash_text.split(":")[1]
    return None


@dataclass(frozen=True)
class Record:
    seq: int
    kind: str
    at: str
    body: str
    prev: str
    hash: str

    @property
    def head(self) -> str:
        """``seq:hash``, the form in which a head is pinned."""
        return f"{self.seq}:{self.hash}"


# -- verification -------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One thing verification found: the journal record (``seq``, None if none) and/or the entry it is about."""

    what: str
    seq: int | None = None
    entry: str | None = None
    #: "chain" (the journal itself), "pin" (a head copied elsewhere), "state" (the tables admission reads
    #: differ from the journal's replay), "key" (the key is missing or another)
    kind: str = "chain"

    def to_dict(self) -> dict:
        return {"what": self.what, "seq": self.seq, "entry": self.entry, "kind": self.kind}


@dataclass
class VerifyReport:
    """What :func:`verify` found. ``ok`` when nothing is wrong; ``problems`` in chain order."""

    records: int = 0
    head: str | None = None
    head_at: str | None = None
    keyed_from: int | None = None  # first keyed record
    key_id: str | None = None
    key_checked: bool = False
    pins_checked: int = 0
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first(self) -> Problem | None:
        """The first broken journal record (lowest seq); else the first pinned head that differs; else the
        entry, budget or unit whose journal record is the earliest; else the first problem found."""
        for kind in ("chain", "pin", "state"):
            found = [p for p in self.problems if p.kind == kind]
            if found:
                return min(found, key=lambda p: (p.seq is None, p.seq or 0))
        return self.problems[0] if self.problems else None

    def to_dict(self) -> dict:
        return {"ok": self.ok, "records": self.records, "head": self.head, "head_at": self.head_at,
                "keyed_from": self.keyed_from, "key_id": self.key_id, "key_checked": self.key_checked,
                "pins_checked": self.pins_checked,
                "first_problem": None if self.first is None else self.first.to_dict(),
                "problems": [p.to_dict() for p in self.problems], "notes": list(self.notes)}


def _describe(r: Record, body: dict | None) -> str:
    what = {"reserve": "reservation", "import": "imported entry", "commit": "commit", "abort": "abort",
            "refuse": "refused attempt", "budget": "budget change", "unit": "privacy-unit change",
            "genesis": "creation of the ledger", "upgrade": "upgrade of the ledger", "key": "keying of the chain"}
    text = f"journal record #{r.seq} ({what.get(r.kind, repr(r.kind)[:40])}"
    if isinstance(body, dict):
        row = body.get("row")
        target = ((row.get("id") if isinstance(row, dict) else None) or body.get("id") or body.get("table_id")
                  or body.get("unit"))
        if isinstance(target, str):
            text += f" of {target[:80]}"
    return text + f", {str(r.at)[:19].replace('T', ' ')})"


def verify(ledger_id: str | None, records: Iterable[Record], state: dict, *, key: ChainKey | None,
           pins: Iterable[str] = ()) -> VerifyReport:
    """Check the chain of ``records`` (in seq order) and compare its replay with ``state``.

    ``state`` holds the rows of the tables admission reads: ``{"releases": {id: row dict},
    "budgets": {table_id: row dict}, "units": {unit: row dict}}``. ``pins`` are
    heads (``seq:hash``) copied from elsewhere (receipts, logs) that the chain
    must still hold.
    """
    rep = VerifyReport()
    records = list(records)
    rep.records = len(records)
    prev_hash = genesis_prev(ledger_id) if ledger_id else None
    if ledger_id is None:
        rep.problems.append(Problem("the ledger's id (sparkpriv_meta 'ledger_id') is missing: the chain's start "
                                    "cannot be checked", 1))
    expected_seq = 1
    replay = _Replay()
    keyed_id = None
    for r in records:
        body = None
        try:
            body = json.loads(r.body)
        except (TypeError, ValueError, RecursionError):
            pass
        where = _describe(r, body)
        if r.seq != expected_seq:
            rep.problems.append(Problem(
                f"{where}: expected record #{expected_seq} here; records were deleted, inserted or renumbered",
                r.seq))
            expected_seq = r.seq
        if prev_hash is not None and r.prev != prev_hash:
            rep.problems.append(Problem(
                f"{where} does not follow the record before it (its recorded predecessor differs): records "
                "were deleted, inserted or reordered before it", r.seq))
        rid = key_id_of(r.hash)
        if keyed_id is not None and rid != keyed_id:
            rep.problems.append(Problem(
                f"{where} is not keyed with the chain's key ({keyed_id}) although an earlier record is: it was "
                "written or rewritten without the key", r.seq))
        if rid is not None:
            if keyed_id is None:
                keyed_id = rid
                rep.keyed_from, rep.key_id = r.seq, rid
            if key is not None and rid == key.id:
                if not hmac.compare_digest(record_hash(r.seq, r.kind, r.at, r.prev, r.body, key), r.hash):
                    rep.problems.append(Problem(f"{where} was changed after it was written (its HMAC does not "
                                                "match its content)", r.seq))
            elif key is not None:
                rep.problems.append(Problem(f"{where} is keyed with key {rid}, not with the key given ({key.id})",
                                            r.seq, kind="key"))
        elif not hmac.compare_digest(record_hash(r.seq, r.kind, r.at, r.prev, r.body, None), str(r.hash)):
            rep.problems.append(Problem(f"{where} was changed after it was written (its hash does not match its "
                                        "content)", r.seq))
        if body is None or not isinstance(body, dict):
            rep.problems.append(Problem(f"{where}: its body is not a JSON object", r.seq))
        else:
            try:
                replay.apply(r, body)
            except _Invalid as exc:
                rep.problems.append(Problem(f"{where}: {exc}", r.seq, exc.entry))
        prev_hash = r.hash
        expected_seq += 1
    if records:
        rep.head, rep.head_at = records[-1].head, records[-1].at
    else:
        rep.problems.append(Problem("the journal is empty: a ledger's first record is its creation"))
    if key is not None:
        rep.key_checked = True
        if keyed_id is None:
            rep.problems.append(Problem(
                f"a key was given ({key.id}) but no record is keyed: the chain was written, or rewritten, "
                "without it", kind="key"))
        elif records and key_id_of(records[-1].hash) != key.id:
            rep.problems.append(Problem(f"the last record is not keyed with the key given ({key.id})",
                                        records[-1].seq, kind="key"))
    elif keyed_id is not None:
        rep.problems.append(Problem(
            f"the chain is keyed (key {keyed_id}) from record #{rep.keyed_from} on; without the key the keyed "
            f"records' content cannot be checked. Give the key file ({KEY_FILE_ENV} or --key-file)", kind="key"))
    by_seq = {r.seq: r for r in records}
    for pin in pins:
        rep.pins_checked += 1
        seq_text, _, want = str(pin).partition(":")
        try:
            seq = int(seq_text)
        except ValueError:
            rep.problems.append(Problem(f"the pinned head {str(pin)[:100]!r} is not of the form SEQ:HASH",
                                        kind="pin"))
            continue
        have = by_seq.get(seq)
        if have is None:
            rep.problems.append(Problem(
                f"a copy of the head at record #{seq} was pinned, but the chain has {len(records)} record(s): "
                "records were deleted from its end", len(records) + 1, kind="pin"))
        elif have.hash != want:
            rep.problems.append(Problem(
                f"{_describe(have, None)} differs from the copy pinned elsewhere ({want[:40]}...): the chain "
                "was rewritten up to there", seq, kind="pin"))
    replay.compare(state, rep)
    return rep


class _Invalid(Exception):
    def __init__(self, what: str, entry: str | None = None):
        super().__init__(what)
        self.entry = entry


class _Replay:
    """The budgets, units and entries the journal implies, with the record that last wrote each."""

    def __init__(self):
        self.releases: dict = {}
        self.budgets: dict = {}
        self.units: dict = {}
        self.writer: dict = {}  # ("release", id) / ("budget", t) / ("unit", u) -> seq

    def apply(self, r: Record, body: dict) -> None:
        kind = r.kind
        if kind in ("genesis", "upgrade", "key", "refuse"):
            return
        if kind in ("reserve", "import"):
            row = body.get("row")
            if not isinstance(row, dict) or set(row) != set(RELEASE_COLUMNS):
                raise _Invalid("its entry does not have the columns of an entry")
            rid = row["id"]
            if not isinstance(rid, str) or rid in self.releases:
                raise _Invalid(f"entry {str(rid)[:64]} is recorded twice", rid if isinstance(rid, str) else None)
            if kind == "reserve" and row["state"] != "reserved":
                raise _Invalid(f"a reservation must start 'reserved', not {str(row['state'])[:20]!r}", rid)
            self.releases[rid] = dict(row)
            self.writer[("release", rid)] = r.seq
        elif kind in ("commit", "abort"):
            rid = body.get("id")
            row = self.releases.get(rid)
            if row is None:
                raise _Invalid(f"it {kind}s entry {str(rid)[:64]}, which no earlier record reserved",
                               rid if isinstance(rid, str) else None)
            if kind == "commit":
                if row["state"] not in ("reserved", "committed"):
                    raise _Invalid(f"it commits entry {rid}, which was {row['state']}", rid)
                row.update(state="committed", published_at=body.get("published_at"),
                           output_path=body.get("output_path"), receipt_summary=body.get("receipt_summary"))
            else:
                if row["state"] != "reserved":
                    raise _Invalid(f"it aborts entry {rid}, which was {row['state']}", rid)
                row.update(state="aborted", aborted_at=body.get("aborted_at"), abort_reason=body.get("reason"))
            self.writer[("release", rid)] = r.seq
        elif kind == "budget":
            row = {c: body.get(c) for c in BUDGET_COLUMNS}
            self.budgets[row["table_id"]] = row
            self.writer[("budget", row["table_id"])] = r.seq
        elif kind == "unit":
            row = {c: body.get(c) for c in UNIT_COLUMNS}
            self.units[row["unit"]] = row
            self.writer[("unit", row["unit"])] = r.seq
        else:
            raise _Invalid(f"unknown record kind {kind[:40]!r}")

    def compare(self, state: dict, rep: VerifyReport) -> None:
        for what, mine, table, names in (("release", self.releases, state.get("releases", {}), "entry"),
                                         ("budget", self.budgets, state.get("budgets", {}), "budget of table"),
                                         ("unit", self.units, state.get("units", {}), "privacy unit")):
            for name in sorted(set(mine) | set(table), key=lambda n: (self.writer.get((what, n), 1 << 62), str(n))):
                seq = self.writer.get((what, name))
                shown = str(name)[:80]
                entry = name if what == "release" else None
                if name not in table:
                    rep.problems.append(Problem(
                        f"the {names} {shown} that journal record #{seq} wrote is missing from the ledger's "
                        "tables (deleted)", seq, entry, "state"))
                elif name not in mine:
                    rep.problems.append(Problem(
                        f"the {names} {shown} is in the ledger's tables but no journal record wrote it (inserted "
                        "by hand)", None, entry, "state"))
                else:
                    changed = [c for c in mine[name] if value(table[name].get(c)) != mine[name][c]]
                    if changed:
                        rep.problems.append(Problem(
                            f"the {names} {shown} differs from what journal record #{seq} wrote: "
                            f"{', '.join(changed)} changed", seq, entry, "state"))
