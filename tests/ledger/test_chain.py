"""Tamper evidence: every kind of edit is found by `ledger verify`, which names the first broken record.

Each case edits the database with SQL, as someone with write access to it
would (the tables admission reads, or the journal itself), on both backends,
and checks that verification fails and names the record (or entry) the case
broke, whose sequence number is read from the journal before the edit. Every
case is an edit that changes what a privacy officer is told or what is
admitted (most free budget silently on a ledger without the journal). The
limit is tested too: someone who recomputes the whole chain after an edit is
found only with the key (HMAC) or with a head pinned elsewhere.
"""

from __future__ import annotations

import json

import pytest
from dp_accounting import dp_event as ev

from sparkpriv.errors import BudgetExceededError
from sparkpriv.ledger import open_ledger
from sparkpriv.ledger import chain as ledger_chain
from tests.ledger.test_hardening import raw_sql
from tests.ledger.test_ledger import cli


def make(url: str, key_file=None) -> dict:
    """A small ledger with entries in every state, a unit and a refusal; the ids and their journal records."""
    ids: dict = {}
    with open_ledger(url, key_file=key_file) as ledger:
        ledger.set_budget("cdr.calls", epsilon=3.0, delta=1e-6, window="30d", reason="policy 12")
        ledger.set_budget("census.adult", epsilon=2.0, delta=0.0, reason="lifetime")
        ledger.set_unit("subscribers", tables="cdr.*,billing.*", epsilon=4.0, delta=1e-6, window="month",
                        reason="same people")
        r = ledger.reserve("cdr.calls", event=ev.GaussianDpEvent(4.0), mechanism="projection",
                           parameters={"k": 64}, output_path="/staging/a")
        ledger.commit(r.id, output_path="/published/a", receipt_summary={"epsilon": 1.1, "delta": 1e-7})
        ids["gauss"] = r.id
        r = ledger.reserve("census.adult", event=ev.SelfComposedDpEvent(ev.LaplaceDpEvent(8.0), 4),
                           mechanism="counts", parameters={"items": 10}, output_path="/published/b")
        ledger.commit(r.id)
        ids["laplace"] = r.id
        r = ledger.reserve("cdr.calls", event=ev.GaussianDpEvent(6.0), mechanism="projection", parameters={},
                           output_path="/staging/c")
        ledger.abort(r.id, reason="executor lost")
        ids["aborted"] = r.id
        with pytest.raises(BudgetExceededError):  # a refused attempt, journalled
            ledger.reserve("census.adult", event=ev.LaplaceDpEvent(0.1), mechanism="counts", parameters={},
                           output_path="/o")
        r = ledger.reserve("cdr.sms", event=ev.GaussianDpEvent(5.0), mechanism="kmeans", parameters={},
                           output_path="/staging/d")
        ids["reserved"] = r.id
        history = ledger.history()
        assert ledger.verify().ok
    ids["last"] = {}  # the record that last wrote each entry, budget and unit
    for h in history:
        subject = (h.get("row") or {}).get("id") or h.get("id") or h.get("table_id") or h.get("unit")
        if h["kind"] != "refuse":
            ids["last"][subject] = h["seq"]
        ids.setdefault("seq", {})[(h["kind"], subject)] = h["seq"]
    ids["records"] = len(history)
    return ids


def event_text(event) -> str:
    from sparkpriv.ledger.events import encode_event

    return encode_event(event)[0]


def _set(url, table, column, value, where, params=()):
    with open_ledger(url) as ledger:
        raw_sql(ledger, f"UPDATE {table} SET {column} = ? WHERE {where}", (value, *params))


def _sql(url, sql, params=()):
    with open_ledger(url) as ledger:
        return raw_sql(ledger, sql, params)


def _entry(column, value, which="gauss"):
    return lambda url, ids: (_set(url, "sparkpriv_releases", column, value, "id = ?", (ids[which],)),
                             ids["last"][ids[which]])


def _budget(column, value, table="cdr.calls"):
    return lambda url, ids: (_set(url, "sparkpriv_budgets", column, value, "table_id = ?", (table,)),
                             ids["last"][table])


def _unit(column, value):
    return lambda url, ids: (_set(url, "sparkpriv_units", column, value, "unit = ?", ("subscribers",)),
                             ids["last"]["subscribers"])


def _delete_entry(which):
    return lambda url, ids: (_sql(url, "DELETE FROM sparkpriv_releases WHERE id = ?", (ids[which],)),
                             ids["last"][ids[which]])


def _journal_body(kind_subject, old, new):
    def run(url, ids):
        seq = ids["seq"][kind_subject(ids)]
        (body,) = _sql(url, "SELECT body FROM sparkpriv_journal WHERE seq = ?", (seq,))[0]
        assert old in body, body
        _sql(url, "UPDATE sparkpriv_journal SET body = ? WHERE seq = ?", (body.replace(old, new), seq))
        return seq
    return run


def _delete_record(kind_subject):
    def run(url, ids):
        seq = ids["seq"][kind_subject(ids)]
        _sql(url, "DELETE FROM sparkpriv_journal WHERE seq = ?", (seq,))
        return seq + 1  # the record after it no longer follows its predecessor
    return run


def _swap_records(url, ids):
    a, b = ids["seq"][("commit", ids["gauss"])], ids["seq"][("commit", ids["laplace"])]
    _sql(url, "UPDATE sparkpriv_journal SET seq = -1 WHERE seq = ?", (a,))
    _sql(url, "UPDATE sparkpriv_journal SET seq = ? WHERE seq = ?", (a, b))
    _sql(url, "UPDATE sparkpriv_journal SET seq = ? WHERE seq = -1", (b,))
    return min(a, b)


def _swap_times(url, ids):
    rows = dict(_sql(url, "SELECT id, created_at FROM sparkpriv_releases"))
    g, a = ids["gauss"], ids["aborted"]
    _set(url, "sparkpriv_releases", "created_at", rows[a], "id = ?", (g,))
    _set(url, "sparkpriv_releases", "created_at", rows[g], "id = ?", (a,))
    return min(ids["last"][g], ids["last"][a])


def _forged_entry(url, ids):
    cols = ", ".join(ledger_chain.RELEASE_COLUMNS)
    row = _sql(url, f"SELECT {cols} FROM sparkpriv_releases WHERE id = ?", (ids["aborted"],))[0]
    forged = ("00000000-0000-4000-8000-000000000000",) + tuple(row[1:])
    _sql(url, f"INSERT INTO sparkpriv_releases ({cols}) VALUES ({', '.join('?' for _ in forged)})", forged)
    return None  # written by no record


def _truncate_tail_and_revert(url, ids):
    """Delete the last records (the refusal and the reserve of 'reserved') and the entry they wrote."""
    _sql(url, "DELETE FROM sparkpriv_journal WHERE seq >= ?", (ids["seq"][("reserve", ids["reserved"])],))
    _sql(url, "DELETE FROM sparkpriv_releases WHERE id = ?", (ids["reserved"],))
    return None


GAUSS_EVENTS = json.dumps({"event": {"class_name": "GaussianDpEvent", "noise_multiplier": 4.0}})

#: name -> edit(url, ids) -> the seq of the record verification must name first (None: a stated limit).
CASES = {
    # entries: states
    "flip committed to aborted": _entry("state", "aborted"),
    "flip reserved to aborted": _entry("state", "aborted", "reserved"),
    "flip committed to reserved": _entry("state", "reserved"),
    "flip aborted to committed": _entry("state", "committed", "aborted"),
    # entries: deleted, inserted, reordered
    "delete a committed entry": _delete_entry("gauss"),
    "delete a reserved entry": _delete_entry("reserved"),
    "insert a forged entry": _forged_entry,
    "reorder: swap two entries' times": _swap_times,
    # entries: the events
    "replace an event with a no-op": lambda url, ids: _entry("events", event_text(ev.NoOpDpEvent()))(url, ids),
    "raise a Gaussian noise scale": lambda url, ids: _entry("events", event_text(ev.GaussianDpEvent(400.0)))(url, ids),
    "raise a Laplace noise scale": lambda url, ids: _entry(
        "events", event_text(ev.SelfComposedDpEvent(ev.LaplaceDpEvent(80.0), 4)), "laplace")(url, ids),
    "lower a composition count": lambda url, ids: _entry(
        "events", event_text(ev.SelfComposedDpEvent(ev.LaplaceDpEvent(8.0), 1)), "laplace")(url, ids),
    "rewrite the event in the old format, scaled": lambda url, ids: _entry(
        "events", json.dumps({"class_name": "GaussianDpEvent", "noise_multiplier": 40.0}))(url, ids),
    # entries: other fields
    "move an entry to another table": _entry("table_id", "cdr.archive"),
    "move an entry out of the window (backdate it)": _entry("created_at", "2020-01-01T00:00:00.000000+00:00"),
    "lower the recorded own epsilon": _entry("epsilon", 0.001),
    "change the recorded delta": _entry("epsilon_delta", 0.5),
    "change the output path": _entry("output_path", "/elsewhere"),
    "change the recorded parameters": _entry("parameters", "{}"),
    "change the mechanism": _entry("mechanism", "noop"),
    "change the receipt summary": _entry("receipt_summary", json.dumps({"epsilon": 0.01, "delta": 1e-7})),
    "change the abort reason": _entry("abort_reason", "never ran", "aborted"),
    "change who ran it": _entry("user_name", "someone-else"),
    "change the publication time": _entry("published_at", "2020-01-01T00:00:00.000000+00:00"),
    # budgets and units
    "raise a table budget": _budget("epsilon", 30.0),
    "raise a budget's delta": _budget("delta", 0.5, "census.adult"),
    "shorten a budget's window": _budget("time_window", "1d"),
    "delete a budget": lambda url, ids: (_sql(url, "DELETE FROM sparkpriv_budgets WHERE table_id = ?",
                                               ("census.adult",)), ids["last"]["census.adult"]),
    "insert a forged budget": lambda url, ids: (_sql(url, "INSERT INTO sparkpriv_budgets (table_id, epsilon, delta, "
                                                          "updated_at) VALUES ('billing.x', 9, 0, '2026')"), None),
    "drop a table from a unit": _unit("patterns", json.dumps(["billing.*"])),
    "raise a unit's budget": _unit("epsilon", 40.0),
    "delete a unit": lambda url, ids: (_sql(url, "DELETE FROM sparkpriv_units"), ids["last"]["subscribers"]),
    # the journal itself
    "raise a noise scale in the journal": _journal_body(lambda ids: ("reserve", ids["gauss"]),
                                                        '\\"noise_multiplier\\": 4.0', '\\"noise_multiplier\\": 40.0'),
    "raise a budget in the journal": _journal_body(lambda ids: ("budget", "cdr.calls"), '"epsilon":3.0',
                                                   '"epsilon":30.0'),
    "delete a commit record": _delete_record(lambda ids: ("commit", ids["gauss"])),
    "delete a refusal record": _delete_record(lambda ids: ("refuse", "census.adult")),
    "reorder journal records": _swap_records,
    "change a record's time": lambda url, ids: (
        _sql(url, "UPDATE sparkpriv_journal SET at = '2020-01-01T00:00:00.000000+00:00' WHERE seq = ?",
             (ids["seq"][("reserve", ids["gauss"])],)), ids["seq"][("reserve", ids["gauss"])])[1],
    "change the ledger's id": lambda url, ids: (
        _sql(url, "UPDATE sparkpriv_meta SET value = 'other' WHERE key = 'ledger_id'"), 1)[1],
}


def _seq_of(result):
    return result[1] if isinstance(result, tuple) else result


@pytest.mark.parametrize("case", list(CASES))
def test_verify_finds_each_kind_of_edit_and_names_the_first_broken_record(ledger_url, case, capsys):
    ids = make(ledger_url)
    want = _seq_of(CASES[case](ledger_url, ids))
    with open_ledger(ledger_url, read_only=True) as ledger:
        report = ledger.verify()
    assert not report.ok, case
    first = report.first
    assert first.seq == want, (case, report.problems)
    if want is not None:
        assert f"#{want}" in first.what
    capsys.readouterr()
    assert cli("ledger", "verify", "--ledger", ledger_url) == 1
    out = capsys.readouterr().out
    assert "BROKEN: " in out and first.what in out and "Traceback" not in out


def test_an_intact_ledger_verifies_and_the_head_moves_with_every_change(ledger_url, capsys):
    ids = make(ledger_url)
    with open_ledger(ledger_url) as ledger:
        before = ledger.head()
        assert before.startswith(f"{ids['records']}:sha256:")
        ledger.commit(ids["reserved"])
        after = ledger.head()
        report = ledger.verify(pins=[before, after])
    assert report.ok and report.pins_checked == 2 and report.records == ids["records"] + 1
    assert after.startswith(f"{ids['records'] + 1}:sha256:")
    assert cli("ledger", "verify", "--ledger", ledger_url, "--pin", before, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["head"] == after and doc["problems"] == []


def _recompute(url, ids, *, from_seq=1, edit=None):
    """What someone with write access and no key can do: edit, then recompute every hash after it."""
    with open_ledger(url) as ledger:
        meta = dict(raw_sql(ledger, "SELECT key, value FROM sparkpriv_meta"))
        rows = raw_sql(ledger, "SELECT seq, kind, at, body, prev, hash FROM sparkpriv_journal ORDER BY seq")
        prev = ledger_chain.genesis_prev(meta["ledger_id"])
        for seq, kind, at, body, _, old in rows:
            if edit is not None:
                body = edit(seq, kind, body)
            new = ledger_chain.record_hash(seq, kind, at, prev, body, None) if seq >= from_seq else old
            raw_sql(ledger, "UPDATE sparkpriv_journal SET body = ?, prev = ?, hash = ? WHERE seq = ?",
                    (body, prev, new, seq))
            prev = new


def test_a_recomputed_chain_is_found_only_with_a_pinned_head_or_the_key(ledger_url, tmp_path):
    """The stated limit: flip a committed entry to aborted, and rewrite its commit record as an abort and
    every hash after it. Without a key or a copy of the head the chain is consistent again; a head
    pinned before (a receipt, a log) shows it, and so does the key of a keyed journal."""
    ids = make(ledger_url)
    with open_ledger(ledger_url) as ledger:
        pinned = ledger.head()
    commit_seq = ids["seq"][("commit", ids["gauss"])]

    def as_abort(seq, kind, body):
        return body if seq != commit_seq else ledger_chain.canonical(
            {"id": ids["gauss"], "aborted_at": json.loads(body)["published_at"], "reason": "never ran"})

    _set(ledger_url, "sparkpriv_releases", "state", "aborted", "id = ?", (ids["gauss"],))
    _set(ledger_url, "sparkpriv_releases", "abort_reason", "never ran", "id = ?", (ids["gauss"],))
    _sql(ledger_url, "UPDATE sparkpriv_releases SET aborted_at = published_at, published_at = NULL, "
                     "output_path = '/staging/a', receipt_summary = NULL WHERE id = ?", (ids["gauss"],))
    _sql(ledger_url, "UPDATE sparkpriv_journal SET kind = 'abort' WHERE seq = ?", (commit_seq,))
    _recompute(ledger_url, ids, from_seq=commit_seq, edit=as_abort)
    with open_ledger(ledger_url, read_only=True) as ledger:
        assert ledger.verify().ok  # the limit of a plain hash chain
        pinned_report = ledger.verify(pins=[pinned])
    assert not pinned_report.ok and pinned_report.first.kind == "pin"
    assert pinned_report.first.seq == int(pinned.split(":")[0])

    # the same rewrite of a keyed journal: without the key it cannot be recomputed
    key = tmp_path / "ledger.key"
    key.write_text("a" * 64)
    url2 = ledger_url.replace("ledger.sqlite", "keyed.sqlite") if ledger_url.startswith("sqlite") else None
    if url2 is None:
        return  # one keyed ledger per test run is enough: the SQLite half covers it
    ids2 = make(url2, key_file=str(key))
    with open_ledger(url2, key_file=str(key), read_only=True) as ledger:
        assert ledger.verify().ok and ledger.verify().keyed_from == 1
    commit2 = ids2["seq"][("commit", ids2["gauss"])]
    _recompute(url2, ids2, from_seq=commit2)  # rewritten with SHA-256: the attacker has no key
    with open_ledger(url2, key_file=str(key), read_only=True) as ledger:
        report = ledger.verify()
    assert not report.ok and report.first.seq == commit2
    assert "not keyed with the chain's key" in report.first.what
    with open_ledger(url2, read_only=True) as ledger:  # verified without the key: it cannot tell, and fails
        assert not ledger.verify().ok


def test_a_keyed_journal_needs_the_key_to_write_and_to_verify(tmp_path, monkeypatch):
    from sparkpriv.errors import LedgerError

    url = f"sqlite:///{tmp_path}/l.sqlite"
    key, other = tmp_path / "k", tmp_path / "other"
    key.write_text("0123456789abcdef0123456789abcdef\n")
    other.write_text("fedcba9876543210fedcba9876543210")
    (tmp_path / "short").write_text("short")
    with open_ledger(url) as ledger:  # unkeyed at first
        ledger.set_budget("t", epsilon=1.0, delta=0.0)
    monkeypatch.setenv(ledger_chain.KEY_FILE_ENV, str(key))
    with open_ledger(url) as ledger:  # a writer with a key keys the journal from here on
        ledger.set_budget("t", epsilon=2.0, delta=0.0)
        report = ledger.verify()
    assert report.ok and report.keyed_from == 3 and report.key_checked
    assert [h["kind"] for h in open_ledger(url, read_only=True).history()][-2:] == ["key", "budget"]
    monkeypatch.delenv(ledger_chain.KEY_FILE_ENV)
    with open_ledger(url) as ledger:
        with pytest.raises(LedgerError, match="is keyed .key k[0-9a-f]{16}.; this process has no key"):
            ledger.set_budget("t", epsilon=3.0, delta=0.0)
        assert not ledger.verify().ok  # cannot be checked without the key, and says so
        assert "without the key" in ledger.verify().first.what
    with open_ledger(url, key_file=str(other)) as ledger:
        with pytest.raises(LedgerError, match="this process's key is k"):
            ledger.set_budget("t", epsilon=3.0, delta=0.0)
    with pytest.raises(LedgerError, match="at least 16 bytes") as short:
        open_ledger(url, key_file=str(tmp_path / "short"))
    assert "short" not in str(short.value).split("'")[-1]  # the file's content never appears
    with pytest.raises(LedgerError, match="Cannot read the ledger key file"):
        open_ledger(url, key_file=str(tmp_path / "missing"))
    with open_ledger(url, key_file=str(key), read_only=True) as ledger:
        assert ledger.status("t").budget_epsilon == 2.0 and ledger.verify().ok


def test_a_truncated_tail_is_found_with_a_pinned_head(ledger_url):
    ids = make(ledger_url)
    with open_ledger(ledger_url) as ledger:
        pinned = ledger.head()
    _truncate_tail_and_revert(ledger_url, ids)
    with open_ledger(ledger_url, read_only=True) as ledger:
        assert ledger.verify().ok  # consistent without a copy of the head: the stated limit
        report = ledger.verify(pins=[pinned])
    assert not report.ok and "deleted from its end" in report.first.what
