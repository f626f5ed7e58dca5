"""History (who, when, why), the on-call engineer's commands, receipts against the ledger; both backends."""

from __future__ import annotations

import getpass
import json
import os

import numpy as np
import pytest
from dp_accounting import dp_event as ev

import sparkpriv
from sparkpriv.errors import BudgetExceededError, LedgerError
from sparkpriv.ledger import job_context, open_ledger
from tests.ledger.test_hardening import raw_sql
from tests.ledger.test_ledger import KILLED_JOB, TABLE, cli, laplace, reserve, run_python

AIRFLOW = {"AIRFLOW_CTX_DAG_ID": "sparkpriv_nightly_unit", "AIRFLOW_CTX_DAG_RUN_ID": "scheduled__2026-05-01T03:00",
           "AIRFLOW_CTX_TASK_ID": "release", "AIRFLOW_CTX_TRY_NUMBER": "2"}


def _user() -> str:
    """The operating-system user, or ``uid N`` where the uid has no name (CI containers)."""
    try:
        return getpass.getuser()
    except Exception:
        return f"uid {os.getuid()}"


@pytest.fixture
def no_scheduler(monkeypatch):
    """No scheduler's job id: neither the variables nor the test session's own SparkContext (whose
    application id the ledger would record when the suite's Spark fixture runs in this process)."""
    import sparkpriv.ledger.checks as checks

    for name in ("SPARKPRIV_JOB_ID", "SPARK_APPLICATION_ID", *AIRFLOW):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(checks, "_spark_application_id", lambda: None)
    return monkeypatch


def test_budget_changes_are_appended_with_who_when_and_why(ledger_url, no_scheduler, capsys):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0, reason="DPIA 2026-17 approved")
        ledger.set_budget(TABLE, epsilon=2.0, delta=0.0, window="30d", reason="raised after review",
                          job_id="CHG-4411")
        status = ledger.status(TABLE)
        changes = ledger.history(kinds=["budget"])
    assert [(c["epsilon"], c["time_window"], c["reason"], c["by"], c["job"]) for c in changes] == [
        (1.0, "lifetime", "DPIA 2026-17 approved", _user(), None),
        (2.0, "30d", "raised after review", _user(), "CHG-4411")]
    assert changes[0]["at"] < changes[1]["at"] == status.budget_updated_at
    assert changes[1]["version"] == sparkpriv.__version__
    assert (status.budget_updated_by, status.budget_reason, status.window) == (_user(),
                                                                              "raised after review", "30d")
    assert cli("ledger", "set-budget", "--ledger", ledger_url, "--unit", "subscribers", "--tables", "cdr.*",
               "--epsilon", "3", "--delta", "0", "--window", "month", "--reason", "one budget for the subscribers") == 0
    assert "privacy unit subscribers (tables cdr.*)" in capsys.readouterr().out
    assert cli("ledger", "history", "--ledger", ledger_url, "--table-id", TABLE) == 0
    out = capsys.readouterr().out
    assert "DPIA 2026-17 approved" in out and "raised after review" in out and "CHG-4411" in out
    assert cli("ledger", "history", "--ledger", ledger_url, "--unit", "subscribers", "--json") == 0
    (unit,) = json.loads(capsys.readouterr().out)["records"]
    assert (unit["kind"], unit["reason"], unit["patterns"]) == ("unit", "one budget for the subscribers",
                                                                '["cdr.*"]')
    assert cli("ledger", "set-budget", "--ledger", ledger_url, "--table-id", TABLE, "--tables", "x.*",
               "--epsilon", "1", "--delta", "0") == 2  # --tables belongs to a unit


def test_refused_attempts_are_journalled_with_their_reason_and_a_dry_run_is_not(ledger_url, no_scheduler):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
        reserve(ledger, laplace(0.75))
        with pytest.raises(BudgetExceededError):
            ledger.check_admission(TABLE, laplace(0.5))
        assert ledger.history(kinds=["refuse"]) == []
        with pytest.raises(BudgetExceededError) as refused:
            reserve(ledger, laplace(0.5), mechanism="dprp", output_path="/out/refused", job_id="nightly-7")
        with pytest.raises(BudgetExceededError) as no_budget:
            reserve(ledger, laplace(0.5), table_id="no.budget")
        (first, second) = ledger.history(kinds=["refuse"])
        assert len(ledger.status(TABLE).entries) == 1  # a refusal is no entry
    assert (first["table_id"], first["mechanism"], first["output_path"], first["job"]) == (
        TABLE, "dprp", "/out/refused", "nightly-7")
    assert first["reason"] == str(refused.value) and second["reason"] == str(no_budget.value)
    assert json.loads(first["events"])["event"] == {"class_name": "LaplaceDpEvent", "noise_multiplier": 2.0}
    assert first["by"] == _user() and first["version"] == sparkpriv.__version__


def test_entries_record_the_user_the_job_and_the_version(ledger_url, no_scheduler):
    from sparkpriv.ledger.checks import current_job

    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=10.0, delta=0.0)
        jobs = []
        jobs.append(reserve(ledger, laplace(0.1)).id)  # no job known
        jobs.append(reserve(ledger, laplace(0.1), job_id="explicit-1").id)
        with job_context("from-the-command-line"):
            jobs.append(reserve(ledger, laplace(0.1)).id)
            jobs.append(reserve(ledger, laplace(0.1), job_id="explicit-2").id)  # the call's own wins
        no_scheduler.setenv("SPARKPRIV_JOB_ID", "env-job")
        jobs.append(reserve(ledger, laplace(0.1)).id)
        no_scheduler.delenv("SPARKPRIV_JOB_ID")
        for k, v in AIRFLOW.items():
            no_scheduler.setenv(k, v)
        no_scheduler.setenv("SPARK_APPLICATION_ID", "spark-application-1746068400")
        jobs.append(reserve(ledger, laplace(0.1)).id)
        entries = {e["id"]: e for e in ledger.status(TABLE).entries}
    assert [entries[j]["job_id"] for j in jobs] == [
        None, "explicit-1", "from-the-command-line", "explicit-2", "env-job",
        "airflow:sparkpriv_nightly_unit/scheduled__2026-05-01T03:00/release try 2 "
        "spark:spark-application-1746068400"]
    assert {(e["user_name"], e["sparkpriv_version"]) for e in entries.values()} == {(_user(),
                                                                                     sparkpriv.__version__)}
    assert current_job() is not None  # the Airflow variables are still set here
    with pytest.raises(sparkpriv.errors.ParameterError, match="'job_id'"):
        with job_context("bad\x00id"):
            pass


def test_the_on_call_engineer_finds_and_aborts_an_unfinished_reservation(ledger_url, no_scheduler, capsys):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
        published = reserve(ledger, laplace(0.25))
        ledger.commit(published.id)
    job = run_python(KILLED_JOB, ledger_url)
    assert job.returncode == 9, job.stderr
    killed = job.stdout.strip()
    capsys.readouterr()
    assert cli("ledger", "show", "--ledger", ledger_url, "--unfinished") == 0
    out = capsys.readouterr().out
    assert "1 reservation(s) still counted" in out and killed in out and "unfinished" in out
    assert published.id not in out and "sparkpriv ledger abort" in out
    assert cli("ledger", "show", "--ledger", ledger_url, "--unfinished", "--json") == 0
    (shown,) = json.loads(capsys.readouterr().out)["unfinished"]
    assert (shown["id"], shown["label"], shown["output_path"]) == (killed, "unfinished", "/staging/killed")
    assert cli("ledger", "abort", "--ledger", ledger_url, killed, "--reason", "OOM-killed, nothing published",
               "--job-id", "INC-311") == 0
    assert "no longer counts" in capsys.readouterr().out
    assert cli("ledger", "abort", "--ledger", ledger_url, killed, "--reason", "again") == 0  # idempotent
    assert "already aborted" in capsys.readouterr().out
    assert cli("ledger", "abort", "--ledger", ledger_url, published.id, "--reason", "x") == 1
    assert "is committed" in capsys.readouterr().err
    assert cli("ledger", "abort", "--ledger", ledger_url, "no-such-id", "--reason", "x") == 1
    with pytest.raises(SystemExit) as usage:  # --reason is required
        cli("ledger", "abort", "--ledger", ledger_url, killed)
    assert usage.value.code == 2
    capsys.readouterr()
    with open_ledger(ledger_url) as ledger:
        assert ledger.status(TABLE).spent_epsilon == 0.25 and ledger.unfinished() == []
        (abort,) = ledger.history(kinds=["abort"])
        assert ledger.verify().ok
    assert (abort["id"], abort["reason"], abort["job"], abort["by"]) == (killed, "OOM-killed, nothing published",
                                                                         "INC-311", _user())


def _local_release(url: str, out: str, table_id: str = TABLE):
    from sparkpriv.api import release_projection

    X = np.random.default_rng(3).uniform(-1.0, 1.0, size=(200, 3))
    rel = release_projection(X, k=2, epsilon=0.5, lower=-1.0, upper=1.0, ledger=url, table_id=table_id)
    return rel.write(out)


def test_receipt_verify_checks_a_published_receipt_against_the_ledger(ledger_url, tmp_path, capsys):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=5.0, delta=0.0)
    out = _local_release(ledger_url, str(tmp_path / "release"))
    receipt_file = tmp_path / "release" / "_privacy_receipt.json"
    receipt = json.loads(receipt_file.read_text())
    assert receipt["ledger"]["chain_head"].split(":")[1] == "sha256"  # the receipt pins the journal
    capsys.readouterr()
    assert cli_main("receipt", "verify", out, "--ledger", ledger_url) == 0
    text = capsys.readouterr().out
    assert text.startswith("OK: ") and receipt["ledger"]["entry_id"] in text

    # the ledger's entry edited (a raised noise scale): the receipt no longer matches it
    entry_id = receipt["ledger"]["entry_id"]
    with open_ledger(ledger_url) as ledger:
        (events,) = raw_sql(ledger, "SELECT events FROM sparkpriv_releases WHERE id = ?", (entry_id,))[0]
        raw_sql(ledger, "UPDATE sparkpriv_releases SET events = ? WHERE id = ?",
                (events.replace('"noise_multiplier": ', '"noise_multiplier": 1'), entry_id))
    assert cli_main("receipt", "verify", str(receipt_file), "--ledger", ledger_url, "--json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert not doc["ok"] and any("differ from those the ledger stores" in p for p in doc["receipts"][0]["problems"])
    assert any("journal record holds" in p for p in doc["receipts"][0]["problems"])

    # aborted (freed) after publication: the spend of a published release is not counted
    with open_ledger(ledger_url) as ledger:
        raw_sql(ledger, "UPDATE sparkpriv_releases SET events = ?, state = 'aborted', abort_reason = 'x' WHERE id = ?",
                (events, entry_id))
    assert cli_main("receipt", "verify", out, "--ledger", ledger_url) == 1
    assert "its spend is not counted, yet the receipt was published" in capsys.readouterr().out

    # a receipt that states less than its events spend
    with open_ledger(ledger_url) as ledger:
        raw_sql(ledger, "UPDATE sparkpriv_releases SET state = 'committed', abort_reason = NULL WHERE id = ?",
                (entry_id,))
    receipt["guarantee"]["epsilon"] = 0.1
    receipt_file.write_text(json.dumps(receipt))
    assert cli_main("receipt", "verify", out, "--ledger", ledger_url) == 1
    assert "less than the ledger's events spend" in capsys.readouterr().out

    # a receipt of another ledger, and no receipt at all
    with open_ledger(ledger_url.replace("ledger.sqlite", "other.sqlite") if ledger_url.startswith("sqlite")
                     else ledger_url) as ledger:
        ledger.set_budget("x.y", epsilon=1.0, delta=0.0)
        url2 = ledger.url
    if url2 != ledger_url:
        assert cli_main("receipt", "verify", out, "--ledger", url2) == 1
        assert "There is no entry with id" in capsys.readouterr().out
    assert cli_main("receipt", "verify", str(tmp_path / "nothing"), "--ledger", ledger_url) == 2
    assert "There is no receipt" in capsys.readouterr().err


def cli_main(*argv: str) -> int:
    """``sparkpriv ...`` through the real command line (sparkpriv/cli.py wires the receipt command)."""
    from sparkpriv.cli import main

    return main(list(argv))


def test_the_receipt_file_name_is_the_writers():
    from sparkpriv.io.writer import RECEIPT_FILE
    from sparkpriv.ledger.receipts import RECEIPT_FILE as checked

    assert checked == RECEIPT_FILE


def test_a_corrupt_budget_or_unit_row_blocks_what_it_covers(ledger_url):
    with open_ledger(ledger_url) as ledger:
        ledger.set_unit("subscribers", tables="cdr.*", epsilon=2.0, delta=0.0, window="30d")
        raw_sql(ledger, "UPDATE sparkpriv_units SET patterns = 'not json'")
        with pytest.raises(LedgerError, match="privacy unit 'subscribers'.* is corrupt: its tables"):
            reserve(ledger, laplace(0.1), table_id="cdr.calls")
        raw_sql(ledger, "UPDATE sparkpriv_units SET patterns = '[\"cdr.*\"]', time_window = 'weekly'")
        with pytest.raises(LedgerError, match="is corrupt: its window is 'weekly'"):
            reserve(ledger, laplace(0.1), table_id="cdr.calls")
