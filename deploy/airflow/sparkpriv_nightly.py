"""Airflow DAG: the nightly sparkpriv release, recorded in the budget ledger.

Tasks: ``release`` runs ``spark-submit jobs/release.py --config nightly.toml
--output <dated path>``; ``check_receipt`` then reads the published receipt and
fails unless it names the ledger entry. The exit code of the release decides
what Airflow does:

* 0: success.
* 3 (the ledger refused the budget) and 2 (bad arguments or input): the task
  fails at once with :class:`AirflowFailException`, which Airflow never
  retries: another attempt cannot succeed until someone raises the budget or
  fixes the input, and a budget refusal is an expected, final outcome.
* anything else (1: a crashed job, a lost cluster, ...): :class:`AirflowException`,
  retried ``retries`` times. A retry is safe: the failed attempt released its
  ledger reservation (or, if its driver was killed, left it counted as
  unfinished, so the retry can never overspend), and it published nothing.

Settings come from Airflow Variables at run time (never at parse time):
``sparkpriv_config`` (path of nightly.toml on the worker), ``sparkpriv_input_template``
(the night's input, ``{ds}`` replaced by the date, e.g. ``s3a://lake/cdr/date={ds}``;
passed as ``--input``), ``sparkpriv_output_root``
(the release for day ``ds`` goes to ``<root>/<ds>``), ``sparkpriv_job`` (path of
jobs/release.py), ``sparkpriv_spark_submit_args`` (master, --py-files/--archives,
--properties-file ...). The ledger URL is read from the Airflow connection
``sparkpriv_ledger`` (its URI; a password stays in Airflow's secret backend) and
passed to the job as the environment variable ``SPARKPRIV_LEDGER``, never on a
command line.
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

EXIT_OK, EXIT_BAD_INPUT, EXIT_BUDGET_REFUSED = 0, 2, 3
FINAL_EXIT_CODES = {EXIT_BAD_INPUT: "bad arguments or input", EXIT_BUDGET_REFUSED: "privacy budget refused by the ledger"}


def _setting(name: str, default: str | None = None) -> str:
    from airflow.models import Variable

    value = Variable.get(name, default_var=default)
    if value is None:
        raise AirflowFailException(f"Set the Airflow Variable {name!r} (see deploy/airflow/README.md).")
    return value


def _ledger_url() -> str:
    from airflow.hooks.base import BaseHook

    return BaseHook.get_connection("sparkpriv_ledger").get_uri()


def run_release(output: str, input: str | None = None, *, config: str | None = None, job: str | None = None,
                submit_args: str | None = None, ledger_url: str | None = None,
                spark_submit: str = "spark-submit") -> str:
    """Run the release; map its exit code to Airflow's retry semantics. Returns the output path."""
    config = config or _setting("sparkpriv_config")
    job = job or _setting("sparkpriv_job", "/opt/sparkpriv/jobs/release.py")
    submit_args = submit_args if submit_args is not None else _setting("sparkpriv_spark_submit_args", "")
    env = dict(os.environ, SPARKPRIV_LEDGER=ledger_url or _ledger_url())
    cmd = [spark_submit, *shlex.split(submit_args), job, "--config", config, "--output", output]
    if input:  # the night's input (overrides the config's ``input``)
        cmd += ["--input", input]
    code = subprocess.run(cmd, env=env).returncode
    if code == EXIT_OK:
        return output
    if code in FINAL_EXIT_CODES:
        # AirflowFailException: the task fails now, without using its retries
        raise AirflowFailException(f"sparkpriv release exited with {code}: {FINAL_EXIT_CODES[code]}; not retried.")
    raise AirflowException(f"sparkpriv release exited with {code}; Airflow may retry it.")


def _filesystem(output: str):
    """The pyarrow filesystem and path of ``output``: s3a:// and s3n:// are read as s3://
    (endpoint and credentials from the environment, e.g. AWS_ENDPOINT_URL), gs://, hdfs://
    and local paths as pyarrow reads them."""
    from pyarrow import fs

    uri = output
    for scheme in ("s3a://", "s3n://"):
        if uri.startswith(scheme):
            uri = "s3://" + uri[len(scheme):]
    if "://" not in uri:
        uri = os.path.abspath(uri[len("file:"):] if uri.startswith("file:") else uri)
    return fs.FileSystem.from_uri(uri)


def check_receipt(output: str) -> None:
    """Fail unless the published receipt exists and names its ledger entry (local, s3a/s3/gs/hdfs)."""
    if not output or output == "None":
        raise AirflowFailException("check_receipt got no output path: the release task pushed none to XCom.")
    filesystem, path = _filesystem(output)
    receipt_path = path.rstrip("/") + "/_privacy_receipt.json"
    try:
        with filesystem.open_input_stream(receipt_path) as f:
            receipt = json.loads(f.read())
    except (FileNotFoundError, OSError) as e:
        raise AirflowFailException(f"no readable privacy receipt at {output}/_privacy_receipt.json ({type(e).__name__}); "
                                   "the release published nothing there: check the release task's log.") from None
    if not isinstance(receipt, dict) or not (receipt.get("ledger") or {}).get("entry_id"):
        raise AirflowFailException(f"the receipt of {output} names no ledger entry")


with DAG(
    dag_id="sparkpriv_nightly_release",
    description="Nightly differentially private release of cdr.daily_towers, budgeted by the sparkpriv ledger",
    schedule="0 3 * * *",
    start_date=dt.datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # releases of one table run one at a time (the ledger is safe anyway)
    default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=15), "retry_exponential_backoff": True},
    tags=["sparkpriv", "privacy"],
) as dag:
    release = PythonOperator(
        task_id="release",
        python_callable=run_release,
        op_kwargs={"output": "{{ var.value.get('sparkpriv_output_root', 'releases/towers') }}/{{ ds }}",
                   # the night's input, e.g. s3a://lake/cdr/date={{ ds }}: without it every night re-releases the config's input
                   "input": "{{ var.value.get('sparkpriv_input_template', '') | replace('{ds}', ds) }}"},
        execution_timeout=dt.timedelta(hours=4),
    )
    receipt = PythonOperator(
        task_id="check_receipt",
        python_callable=check_receipt,
        op_kwargs={"output": "{{ ti.xcom_pull(task_ids='release') }}"},
        retries=0,
    )
    release >> receipt
