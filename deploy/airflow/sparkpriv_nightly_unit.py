"""Airflow DAG: a nightly release of each day's table, budgeted by a privacy unit with a 30-day window.

Each night's calls are a new table (``cdr.calls.<yyyymmdd>``); the same
subscribers appear in every one of them and in the billing tables. One budget,
set once for the privacy unit that covers them all (README.md, "A nightly job
on a windowed unit")::

    sparkpriv ledger set-budget --unit subscribers --tables 'cdr.*,billing.*' \
        --epsilon 2 --delta 1e-6 --window 30d --reason 'DPIA 2026-17: one budget per subscriber per 30 days'

admits a night's release only if every release of a covered table in any 30
consecutive days composes to at most epsilon 2 at delta 1e-6; older releases
stop counting, so the pipeline runs for good without leaking without bound.

Tasks: ``verify_ledger`` runs ``sparkpriv ledger verify``, pinning the head
that the previous run saw (kept in Airflow's metadata database, outside the
ledger's: a rewritten journal no longer holds it), and fails the run if the
journal is broken; ``release`` runs ``spark-submit jobs/release.py --config
nightly.toml --table-id cdr.calls.<ds_nodash> --job-id <run_id> --output
<root>/<ds>`` (exit codes as in sparkpriv_nightly.py: 2 and 3 are final, others
retried); ``check_receipt`` runs ``sparkpriv receipt verify`` on the output.

Settings as in sparkpriv_nightly.py (Airflow Variables ``sparkpriv_config``,
``sparkpriv_input_template`` (the night's input, ``{ds}`` replaced, as ``--input``), ``sparkpriv_output_root``, ``sparkpriv_job``, ``sparkpriv_spark_submit_args``;
the Connection ``sparkpriv_ledger`` becomes ``SPARKPRIV_LEDGER`` in the
environment, never a command-line argument).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import subprocess

from airflow import DAG
from airflow.exceptions import AirflowException, AirflowFailException

try:  # Airflow 3
    from airflow.providers.standard.operators.python import PythonOperator
except ImportError:  # Airflow 2
    from airflow.operators.python import PythonOperator

FINAL_EXIT_CODES = {2: "bad arguments or input", 3: "privacy budget refused by the ledger"}
SPARKPRIV = ("sparkpriv",)


def _setting(name: str, default: str | None = None) -> str:
    from airflow.models import Variable

    value = Variable.get(name, default_var=default)
    if value is None:
        raise AirflowFailException(f"Set the Airflow Variable {name!r} (see deploy/airflow/README.md).")
    return value


def _env(ledger_url: str | None) -> dict:
    if ledger_url is None:
        from airflow.hooks.base import BaseHook

        ledger_url = BaseHook.get_connection("sparkpriv_ledger").get_uri()
    return dict(os.environ, SPARKPRIV_LEDGER=ledger_url)


def verify_ledger(previous_head: str | None = None, *, ledger_url: str | None = None,
                  sparkpriv: tuple = SPARKPRIV) -> str:
    """Fail unless the ledger's journal verifies (and still holds the head the previous run saw); its head."""
    pin = ["--pin", previous_head] if previous_head and previous_head != "None" else []
    r = subprocess.run([*sparkpriv, "ledger", "verify", "--json", *pin], env=_env(ledger_url),
                       capture_output=True, text=True)
    try:
        report = json.loads(r.stdout)
    except ValueError:
        raise AirflowException(f"sparkpriv ledger verify exited with {r.returncode}: {r.stderr[-2000:]}") from None
    if not report["ok"]:
        raise AirflowFailException(f"the ledger's journal is broken: {report['first_problem']['what']}")
    return report["head"]  # to XCom: the next run pins it


def run_release(output: str, table_id: str, job_id: str, input: str | None = None, *, config: str | None = None, job: str | None = None,
                submit_args: str | None = None, ledger_url: str | None = None,
                spark_submit: str = "spark-submit") -> str:
    """Release the night's table on the unit's budget; map the exit code to Airflow's retries."""
    config = config or _setting("sparkpriv_config")
    job = job or _setting("sparkpriv_job", "/opt/sparkpriv/jobs/release.py")
    submit_args = submit_args if submit_args is not None else _setting("sparkpriv_spark_submit_args", "")
    cmd = [spark_submit, *shlex.split(submit_args), job, "--config", config, "--table-id", table_id,
           "--job-id", job_id, "--output", output]
    if input:  # the night's input (overrides the config's ``input``)
        cmd += ["--input", input]
    code = subprocess.run(cmd, env=_env(ledger_url)).returncode
    if code == 0:
        return output
    if code in FINAL_EXIT_CODES:
        raise AirflowFailException(f"sparkpriv release exited with {code}: {FINAL_EXIT_CODES[code]}; not retried.")
    raise AirflowException(f"sparkpriv release exited with {code}; Airflow may retry it.")


def check_receipt(output: str, *, ledger_url: str | None = None, sparkpriv: tuple = SPARKPRIV) -> None:
    """Fail unless the published receipt matches the ledger's entry. Local paths are verified in
    place; s3a/s3/gs/hdfs receipts are read through pyarrow (as in sparkpriv_nightly.py) into a
    temporary file that ``sparkpriv receipt verify`` then checks."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        target = output
        if "://" in output and not output.startswith("file:"):
            from pyarrow import fs

            uri = "s3://" + output.split("://", 1)[1] if output.startswith(("s3a://", "s3n://")) else output
            filesystem, path = fs.FileSystem.from_uri(uri)
            try:
                with filesystem.open_input_stream(path.rstrip("/") + "/_privacy_receipt.json") as f:
                    data = f.read()
            except OSError as e:
                raise AirflowFailException(f"no readable privacy receipt at {output}/_privacy_receipt.json "
                                           f"({type(e).__name__}): check the release task's log.") from None
            target = os.path.join(tmp, "_privacy_receipt.json")
            with open(target, "wb") as f:
                f.write(data)
        r = subprocess.run([*sparkpriv, "receipt", "verify", target], env=_env(ledger_url), capture_output=True,
                           text=True)
    if r.returncode != 0:
        raise AirflowFailException(f"the receipt of {output} does not match the ledger:\n{r.stdout}{r.stderr}")


with DAG(
    dag_id="sparkpriv_nightly_unit",
    description="Nightly release of each day's calls table on the 'subscribers' privacy unit (30-day window)",
    schedule="0 3 * * *",
    start_date=dt.datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=15), "retry_exponential_backoff": True},
    tags=["sparkpriv", "privacy"],
) as dag:
    verify = PythonOperator(
        task_id="verify_ledger",
        python_callable=verify_ledger,
        op_kwargs={"previous_head": "{{ ti.xcom_pull(task_ids='verify_ledger', include_prior_dates=True) }}"},
        retries=0,
    )
    release = PythonOperator(
        task_id="release",
        python_callable=run_release,
        op_kwargs={"output": "{{ var.value.get('sparkpriv_output_root', 'releases/calls') }}/{{ ds }}",
                   "table_id": "cdr.calls.{{ ds_nodash }}", "job_id": "{{ run_id }}",
                   "input": "{{ var.value.get('sparkpriv_input_template', '') | replace('{ds}', ds) }}"},
        execution_timeout=dt.timedelta(hours=4),
    )
    receipt = PythonOperator(
        task_id="check_receipt",
        python_callable=check_receipt,
        op_kwargs={"output": "{{ ti.xcom_pull(task_ids='release') }}"},
        retries=0,
    )
    verify >> release >> receipt
