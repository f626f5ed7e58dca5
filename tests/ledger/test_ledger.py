"""The budget ledger, on both backends (``ledger_url``: SQLite file, PostgreSQL server).

Expected epsilons come from closed forms, never from the ledger itself: a
Laplace event with noise multiplier ``z`` is pure ``1/z``-DP, and the
composition of Gaussians with multipliers ``z`` and ``z`` is one Gaussian with
``z / sqrt(2)``, whose exact epsilon at ``delta`` solves Balle & Wang's
``gaussian_delta(s, epsilon) = delta``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from dp_accounting import dp_event as ev
from scipy.optimize import brentq

import sparkpriv.ledger
from sparkpriv.errors import BudgetExceededError, LedgerError, ParameterError
from sparkpriv.ledger import DEFAULT_LEDGER_ENV, Reservation, TableStatus, open_ledger
from sparkpriv.ledger.cli import add_ledger_subparsers
from sparkpriv.privacy.accounting import event_from_dict, events_from_json
from sparkpriv.privacy.calibration import gaussian_delta
from tests.ledger.conftest import RACERS

ROOT = Path(sparkpriv.ledger.__file__).resolve().parents[2]
TABLE = "cdr.daily_towers"


def laplace(epsilon: float) -> ev.LaplaceDpEvent:
    """A Laplace event of pure epsilon ``epsilon`` (exactly so for powers of two)."""
    return ev.LaplaceDpEvent(1.0 / epsilon)


def reserve(ledger, event, table_id=TABLE, **kw) -> Reservation:
    kw.setdefault("mechanism", "jl_laplace")
    kw.setdefault("parameters", {"k": 64, "row_bound": 1.0})
    kw.setdefault("output_path", "/staging/out")
    return ledger.reserve(table_id, event=event, **kw)


def gaussian_epsilon(s: float, delta: float) -> float:
    """Exact epsilon of the Gaussian mechanism with sigma / sensitivity ``s``."""
    return brentq(lambda e: gaussian_delta(s, e) - delta, 1e-9, 200.0, xtol=1e-12)


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True, text=True, timeout=120
    )


def cli(*argv: str) -> int:
    """Run ``sparkpriv ledger ...`` as sparkpriv/cli.py wires it (``add_ledger_subparsers(led)``)."""
    parser = argparse.ArgumentParser(prog="sparkpriv")
    ledger = parser.add_subparsers(dest="command", required=True).add_parser("ledger")
    add_ledger_subparsers(ledger.add_subparsers(dest="ledger_command", required=True))
    args = parser.parse_args(argv)
    return args._handler(args)


def test_set_budget_and_status(ledger_url):
    with open_ledger(ledger_url) as ledger:
        assert ledger.tables() == []
        ledger.set_budget(TABLE, epsilon=2.5, delta=1e-6)
        ledger.set_budget("other/table:v1", epsilon=1.0, delta=0.0)
        status = ledger.status(TABLE)
        assert isinstance(status, TableStatus)
        assert (status.budget_epsilon, status.budget_delta) == (2.5, 1e-6)
        assert (status.spent_epsilon, status.remaining_epsilon, status.entries) == (0.0, 2.5, [])
        ledger.set_budget(TABLE, epsilon=4.0, delta=1e-7)  # change
        assert (ledger.status(TABLE).budget_epsilon, ledger.status(TABLE).budget_delta) == (4.0, 1e-7)
        assert ledger.tables() == [TABLE, "other/table:v1"]
        for bad in ({"epsilon": 0.0, "delta": 0.0}, {"epsilon": math.inf, "delta": 0.0},
                    {"epsilon": math.nan, "delta": 0.0}, {"epsilon": -1.0, "delta": 0.0},
                    {"epsilon": 1.0, "delta": 1.0}, {"epsilon": 1.0, "delta": -1e-9}):
            with pytest.raises(ParameterError, match="parameter of Ledger.set_budget"):
                ledger.set_budget(TABLE, **bad)
        for bad_id in ("", "cdr daily", "cdr;drop", None):
            with pytest.raises(ParameterError, match="table_id"):
                ledger.set_budget(bad_id, epsilon=1.0, delta=0.0)
        assert ledger.status(TABLE).budget_epsilon == 4.0


def test_reserve_within_budget(ledger_url):
    event = laplace(0.5)
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
        res = reserve(ledger, event, parameters={"k": 64, "clip": [0.0, 1.0]}, receipt_summary={"rows": 10})
        assert res == Reservation(res.id, TABLE, 0.5, 0.0, 0.5, 1.0, 0.0)
        (entry,) = ledger.status(TABLE).entries
    assert entry["id"] == res.id
    assert (entry["state"], entry["label"], entry["epsilon"]) == ("reserved", "reserved", 0.5)
    assert entry["parameters"] == {"k": 64, "clip": [0.0, 1.0]}
    assert entry["receipt_summary"] == {"rows": 10}
    assert entry["pid"] == os.getpid() and entry["published_at"] is None
    assert events_from_json(entry["events"]) == event


def test_refusal_exit_code_and_message(ledger_url):
    with open_ledger(ledger_url) as ledger:
        with pytest.raises(BudgetExceededError, match="sparkpriv ledger set-budget") as no_budget:
            reserve(ledger, laplace(0.1))
        assert no_budget.value.exit_code == 3

        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
        reserve(ledger, laplace(0.7))
        with pytest.raises(BudgetExceededError) as refused:
            reserve(ledger, laplace(0.5))
        assert refused.value.exit_code == 3
        msg = str(refused.value)
        assert TABLE in msg and "set-budget" in msg
        assert "spent:     epsilon = 0.7 " in msg
        assert "requested: epsilon = 0.5 " in msg
        assert "remaining: epsilon = 0.3 at delta = 0" in msg
        assert len(ledger.status(TABLE).entries) == 1  # nothing recorded for a refusal

        reserve(ledger, laplace(0.3))  # exactly the rest fits
        ledger.set_budget(TABLE, epsilon=0.5, delta=0.0)  # below what is spent: allowed ...
        with pytest.raises(BudgetExceededError, match="remaining: epsilon = 0 "):
            reserve(ledger, laplace(0.01))  # ... but then everything is refused


def test_composition_is_pld_not_sum(ledger_url):
    z, delta = 2.0, 1e-5
    one = gaussian_epsilon(z, delta)
    two = gaussian_epsilon(z / math.sqrt(2.0), delta)  # the composition, exactly
    assert two < 2 * one - 0.9  # the test separates composition from the sum
    with open_ledger(ledger_url) as ledger:
        # admits the composed total, not the sum of the two epsilons
        ledger.set_budget(TABLE, epsilon=(two + 2 * one) / 2, delta=delta)
        first = reserve(ledger, ev.GaussianDpEvent(z), mechanism="kmeans")
        second = reserve(ledger, ev.GaussianDpEvent(z), mechanism="kmeans")
        status = ledger.status(TABLE)
    assert first.epsilon_requested == pytest.approx(one, abs=1e-3)
    assert second.epsilon_requested == pytest.approx(one, abs=1e-3)
    assert second.epsilon_spent_before == pytest.approx(one, abs=1e-3)
    assert two - 1e-6 <= second.epsilon_spent_after <= two + 1e-3  # PLD is a (tight) upper bound
    assert two - 1e-6 <= status.spent_epsilon <= two + 1e-3
    assert status.spent_epsilon < first.epsilon_requested + second.epsilon_requested
    assert status.remaining_epsilon == pytest.approx(status.budget_epsilon - status.spent_epsilon)


def test_pure_laplace_budget_adds_exactly_and_refuses_gaussian(ledger_url):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
        reserve(ledger, ev.LaplaceDpEvent(4.0))
        res = reserve(ledger, ev.LaplaceDpEvent(2.0))
        assert (res.epsilon_spent_before, res.epsilon_requested, res.epsilon_spent_after) == (0.25, 0.5, 0.75)
        assert ledger.status(TABLE).spent_epsilon == 0.75
        with pytest.raises(BudgetExceededError, match="requested: epsilon = inf"):
            reserve(ledger, ev.GaussianDpEvent(100.0))  # approximate DP cannot fit delta = 0


def test_abort_frees_budget(ledger_url):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
        failed = reserve(ledger, laplace(1.0))
        with pytest.raises(BudgetExceededError):
            reserve(ledger, laplace(1.0))
        ledger.abort(failed.id, reason="job failed before publishing")
        ledger.abort(failed.id, reason="again")  # idempotent
        assert ledger.status(TABLE).spent_epsilon == 0.0
        retry = reserve(ledger, laplace(1.0))
        assert retry.epsilon_spent_before == 0.0
        ledger.commit(retry.id)
        entries = {e["id"]: e for e in ledger.status(TABLE).entries}
        assert entries[failed.id]["state"] == "aborted"
        assert entries[failed.id]["abort_reason"] == "job failed before publishing"
        with pytest.raises(LedgerError, match="aborted"):
            ledger.commit(failed.id)
        with pytest.raises(LedgerError, match="committed"):
            ledger.abort(retry.id, reason="too late")
        with pytest.raises(LedgerError, match="no reservation"):
            ledger.commit("00000000-0000-0000-0000-000000000000")


def test_commit_records_output_path(ledger_url):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
        res = reserve(ledger, laplace(0.5), output_path="/staging/run-1")
        ledger.commit(res.id, output_path="/published/2024-05-01", receipt_summary={"sha256": "ab12"})
        ledger.commit(res.id)  # idempotent
        status = ledger.status(TABLE)
    (entry,) = status.entries
    assert (entry["state"], entry["label"]) == ("committed", "committed")
    assert entry["output_path"] == "/published/2024-05-01"
    assert entry["receipt_summary"] == {"sha256": "ab12"}
    assert entry["published_at"] is not None and entry["published_at"] >= entry["created_at"]
    assert status.spent_epsilon == 0.5  # still counted


KILLED_JOB = """
    import os, sys
    from dp_accounting import dp_event as ev
    from sparkpriv.ledger import open_ledger
    ledger = open_ledger(sys.argv[1])
    res = ledger.reserve("cdr.daily_towers", event=ev.LaplaceDpEvent(1 / 0.6), mechanism="jl_laplace",
                         parameters={}, output_path="/staging/killed")
    print(res.id, flush=True)
    os._exit(9)  # killed hard: no commit, no abort, no close
"""


def test_killed_job_stays_counted_and_is_shown_unfinished(ledger_url, capsys):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
    job = run_python(KILLED_JOB, ledger_url)
    assert job.returncode == 9, job.stderr
    killed_id = job.stdout.strip()
    with open_ledger(ledger_url) as ledger:
        status = ledger.status(TABLE)
        (entry,) = status.entries
        assert (entry["id"], entry["state"], entry["label"]) == (killed_id, "reserved", "unfinished")
        assert status.spent_epsilon == pytest.approx(0.6, abs=1e-12) and status.unfinished == 1
        with pytest.raises(BudgetExceededError, match="Counted but not published: 1 reservation"):
            reserve(ledger, laplace(0.6))  # fits only if the killed job's spend were dropped
    assert cli("ledger", "show", "--ledger", ledger_url, "--table-id", TABLE) == 0
    out = capsys.readouterr().out
    assert killed_id in out and "unfinished" in out and "/staging/killed" in out


def test_reopening_from_another_process_sees_everything(ledger_url):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=2.0, delta=0.0)
        published = reserve(ledger, laplace(0.5))
        ledger.commit(published.id, output_path="/published/a")
        failed = reserve(ledger, laplace(0.25))
        ledger.abort(failed.id, reason="boom")
        running = reserve(ledger, laplace(0.125))
    reader = run_python(
        """
        import json, sys
        from sparkpriv.ledger import open_ledger
        with open_ledger(sys.argv[1]) as ledger:
            print(json.dumps({"tables": ledger.tables(), "status": ledger.status(sys.argv[2]).to_dict()}))
        """,
        ledger_url,
        TABLE,
    )
    assert reader.returncode == 0, reader.stderr
    seen = json.loads(reader.stdout)
    assert seen["tables"] == [TABLE]
    status = seen["status"]
    assert status["budget"]["epsilon"] == 2.0 and status["spent_epsilon"] == 0.625
    states = {e["id"]: (e["state"], e["output_path"]) for e in status["entries"]}
    assert states == {
        published.id: ("committed", "/published/a"),
        failed.id: ("aborted", "/staging/out"),
        running.id: ("reserved", "/staging/out"),
    }


def _race_to_reserve(url: str, barrier) -> tuple:
    """One racing job: open the ledger, wait for all the others, reserve epsilon 1."""
    try:
        with open_ledger(url) as ledger:
            barrier.wait(timeout=120)
            try:
                res = ledger.reserve(TABLE, event=laplace(1.0), mechanism="race", parameters={}, output_path="/o")
                return ("ok", res.epsilon_spent_before, os.getpid())
            except BudgetExceededError as exc:
                return ("refused", exc.exit_code, os.getpid())
    except Exception as exc:  # reported to the parent, which fails the test
        return ("error", repr(exc), os.getpid())


def test_concurrent_reservations_never_exceed_budget(ledger_url, racers):
    pool, manager = racers
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=3.0, delta=0.0)  # admits exactly 3 releases of epsilon 1
    barrier = manager.Barrier(RACERS)  # every racer holds its ledger open before anyone reserves
    jobs = [pool.apply_async(_race_to_reserve, (ledger_url, barrier)) for _ in range(RACERS)]
    outcomes = [job.get(timeout=300) for job in jobs]
    assert len({pid for *_, pid in outcomes}) == RACERS  # 16 distinct processes raced
    assert sorted(o[:2] for o in outcomes if o[0] != "ok") == [("refused", 3)] * (RACERS - 3), outcomes
    # serialized: the three winners saw 0, 1 and 2 already spent
    assert sorted(o[1] for o in outcomes if o[0] == "ok") == [0.0, 1.0, 2.0]
    with open_ledger(ledger_url) as ledger:
        status = ledger.status(TABLE)
    assert len(status.entries) == 3
    assert status.spent_epsilon == 3.0 <= status.budget_epsilon


def test_cli_set_budget_and_show_json(ledger_url, capsys):
    assert cli("ledger", "set-budget", "--ledger", ledger_url, "--table-id", TABLE,
               "--epsilon", "2", "--delta", "0", "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    (table,) = shown["tables"]
    assert table["table_id"] == TABLE
    assert table["budget"]["epsilon"] == 2.0 and table["budget"]["delta"] == 0.0
    assert (table["spent_epsilon"], table["remaining_epsilon"], table["entries"]) == (0.0, 2.0, [])

    with open_ledger(ledger_url) as ledger:
        done = reserve(ledger, laplace(0.5), mechanism="dprp")
        ledger.commit(done.id, output_path="/published/x")
        pending = reserve(ledger, ev.LaplaceDpEvent(4.0), mechanism="dprp")
    assert cli("ledger", "show", "--ledger", ledger_url, "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    (table,) = shown["tables"]
    assert (table["spent_epsilon"], table["remaining_epsilon"]) == (0.75, 1.25)
    assert table["counted"] == 2 and table["unfinished"] == 0
    got = {e["id"]: (e["state"], e["epsilon"], e["output_path"]) for e in table["entries"]}
    assert got == {done.id: ("committed", 0.5, "/published/x"), pending.id: ("reserved", 0.25, "/staging/out")}
    assert event_from_dict(table["entries"][1]["events"]) == ev.LaplaceDpEvent(4.0)

    assert cli("ledger", "show", "--ledger", ledger_url) == 0
    text = capsys.readouterr().out
    for expected in (TABLE, "epsilon = 2, delta = 0", "spent      epsilon = 0.75", "remaining  epsilon = 1.25",
                     done.id, "committed", "/published/x", pending.id, "dprp"):
        assert expected in text

    assert cli("ledger", "show", "--ledger", ledger_url, "--table-id", "no.such.table") == 1
    assert "set-budget" in capsys.readouterr().err
    assert cli("ledger", "set-budget", "--ledger", ledger_url, "--table-id", TABLE,
               "--epsilon", "-1", "--delta", "0") == 2


def test_parameters_that_look_secret_are_refused(ledger_url):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
        for params in ({"seed": 42}, {"noise": {"secret_key": "x"}}, {"steps": [{"projection_matrix": []}]}):
            with pytest.raises(LedgerError, match="secret"):
                reserve(ledger, laplace(0.1), parameters=params)
        assert ledger.status(TABLE).entries == []


def test_schema_version_is_checked(ledger_url):
    with open_ledger(ledger_url) as ledger:
        with ledger._transaction(write=True) as tx:
            tx.execute("UPDATE sparkpriv_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(LedgerError, match="schema version 99"):
        open_ledger(ledger_url)


def test_default_location_honours_env(tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path}/nested/dir/ledger.sqlite"
    monkeypatch.setenv(DEFAULT_LEDGER_ENV, url)
    with open_ledger() as ledger:
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
    assert (tmp_path / "nested" / "dir" / "ledger.sqlite").is_file()
    assert cli("ledger", "show", "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["ledger"] == url and [t["table_id"] for t in shown["tables"]] == [TABLE]

    monkeypatch.delenv(DEFAULT_LEDGER_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with open_ledger() as ledger:
        assert ledger.tables() == []
    assert (tmp_path / "home" / ".sparkpriv" / "ledger.sqlite").is_file()


def test_bad_urls_and_missing_psycopg(monkeypatch):
    with pytest.raises(LedgerError, match="Unsupported ledger URL"):
        open_ledger("mysql://u:secret@h/db")
    with pytest.raises(LedgerError) as unsupported:
        open_ledger("mysql://u:hunter2@h/db")
    assert "hunter2" not in str(unsupported.value)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # makes `import psycopg` fail
    with pytest.raises(LedgerError, match=r"pip install 'sparkpriv\[postgres\]'"):
        open_ledger("postgresql://u@127.0.0.1:1/db")


def test_no_public_option_of_a_mechanism_is_refused_as_a_secret_by_the_ledger():
    """Every recorded public option of every registered mechanism can be stored in the ledger: its
    name must not contain a word the ledger takes for a secret (a 'driver_keys' option of the
    counts release failed every ledger-backed counts release)."""
    import sparkpriv.api  # noqa: F401  (registers every mechanism)
    from sparkpriv.mechanisms.protocol import registered

    import dataclasses

    from sparkpriv.ledger.checks import _walk_plain

    # the positive control: the check does take these names for secrets
    assert sorted(_walk_plain({"seed": 1, "matrix_key": 2}, "parameters", "test")) == [
        "parameters.matrix_key", "parameters.seed"]
    for name, mech in registered().items():
        recorded = {f.name: 0 for f in dataclasses.fields(mech.Params)
                    if "help" in f.metadata and f.metadata.get("recorded", True)}
        assert _walk_plain(recorded, "parameters", "test") == [], name


def test_a_short_history_reserves_in_one_transaction_a_long_one_composes_outside_the_lock(ledger_url, monkeypatch):
    """A process that last saw the table's history short composes under the write lock at once (no
    snapshot read first); a longer history is composed on a snapshot outside the lock, then checked
    under it. The spend is exact either way."""
    from sparkpriv.ledger import base

    monkeypatch.setattr(base, "_SMALL_HISTORY", 3)
    with open_ledger(ledger_url) as led:
        led.set_budget("t.short", epsilon=100.0, delta=0.0)
        calls: list = []
        cls = type(led)
        orig = cls._transaction

        def counting(self, *, write):
            calls.append(write)
            return orig(self, write=write)

        monkeypatch.setattr(cls, "_transaction", counting)

        def cycle():
            calls.clear()
            r = led.reserve("t.short", event=laplace(0.25), mechanism="m", parameters={}, output_path="/o")
            led.commit(r.id)
            return list(calls)

        assert cycle() == [False, True, True]  # not seen before: a snapshot read, the reserve, the commit
        for _ in range(4):  # it saw 0, 1, 2, 3 entries: each reserve is one write transaction
            assert cycle() == [True, True]
        assert cycle() == [False, True, True]  # it saw 4 > 3 entries: the snapshot comes back
        assert led.status("t.short").spent_epsilon == pytest.approx(6 * 0.25)
