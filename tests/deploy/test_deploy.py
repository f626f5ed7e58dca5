"""Keep deploy/ honest without the clusters it targets (issue 7).

* Kubernetes: the SparkApplication has what the Spark operator requires, its
  secrets come from Kubernetes secrets only, its ConfigMap holds a config that
  sparkpriv accepts, and the Dockerfile's COPY sources exist.
* Airflow: the DAG is checked with ``ast`` (Airflow itself is not a test
  dependency: it pins hundreds of packages and takes minutes to install), and
  its exit-code handling is run against a stand-in ``airflow`` package:
  exit 3 must raise ``AirflowFailException`` (never retried).
* Standalone: spark-defaults.conf parses and allows task retries; the build
  script is valid bash.
"""

from __future__ import annotations

import ast
import json
import importlib.util
import os
import re
import stat
import subprocess
import sys
import types
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
DAG_FILE = DEPLOY / "airflow" / "sparkpriv_nightly.py"


# --------------------------------------------------------------------------- kubernetes


def _docs():
    with open(K8S / "sparkapplication.yaml") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def _scheduled():
    (app,) = [d for d in _docs() if d.get("kind") == "ScheduledSparkApplication"]
    return app


def _app():
    """The SparkApplication that the schedule creates each night (its ``spec.template``)."""
    app = _scheduled()
    return {"apiVersion": app["apiVersion"], "metadata": app["metadata"], "spec": app["spec"]["template"]}


def _strings(node):
    if isinstance(node, dict):
        for k, v in node.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif node is not None:
        yield str(node)


def _dockerfile_arg(name: str) -> str:
    m = re.search(rf"^ARG {name}=(\S+)$", (K8S / "Dockerfile").read_text(), re.M)
    assert m, f"Dockerfile has no ARG {name}=..."
    return m.group(1)


def test_sparkapplication_has_the_fields_the_operator_requires():
    app = _app()
    assert app["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    assert app["metadata"]["name"] and app["metadata"]["namespace"]
    spec = app["spec"]
    assert spec["type"] == "Python" and spec["mode"] == "cluster"
    assert spec["image"]
    assert spec["mainApplicationFile"] == "local:///opt/sparkpriv/jobs/release.py"
    assert str(spec["sparkVersion"]) == _dockerfile_arg("SPARK_VERSION")
    for role in ("driver", "executor"):
        assert spec[role]["cores"] >= 1 and re.fullmatch(r"\d+[mg]", spec[role]["memory"])
    assert spec["executor"]["instances"] >= 1
    assert spec["restartPolicy"]["type"] == "Never"  # a refused budget (exit 3) is never retried
    assert int(spec["sparkConf"]["spark.task.maxFailures"]) >= 2


def _cron_field_ok(field: str, lo: int, hi: int) -> bool:
    for part in field.split(","):
        m = re.fullmatch(r"(\*|(\d+)(?:-(\d+))?)(?:/(\d+))?", part)
        if not m:
            return False
        for n in (m.group(2), m.group(3)):
            if n is not None and not lo <= int(n) <= hi:
                return False
    return True


def test_scheduled_application_runs_nightly_one_at_a_time_on_dated_paths(monkeypatch):
    from sparkpriv.config import build_config
    from sparkpriv.runner import options_for

    app = _scheduled()
    assert not [d for d in _docs() if d.get("kind") == "SparkApplication"], "a one-shot app would run once"
    spec = app["spec"]
    fields = spec["schedule"].split()
    assert len(fields) == 5, spec["schedule"]
    assert all(_cron_field_ok(f, lo, hi) for f, (lo, hi) in
               zip(fields, [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)])), spec["schedule"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert isinstance(spec["template"], dict) and spec["template"]["type"] == "Python"
    (cm,) = [d for d in _docs() if d.get("kind") == "ConfigMap"]
    values = tomllib.loads(cm["data"]["nightly.toml"])
    mech = values.pop("mechanism")
    values.pop("spark")
    nights = {}
    for day in ("2026-03-04", "2026-03-05"):
        cfg = build_config(mech, options_for(mech), values, {"run_date": day}, source="ConfigMap nightly.toml")
        assert day in cfg.get("input") and day in cfg.get("output")
        nights[day] = (cfg.get("input"), cfg.get("output"))
    assert nights["2026-03-04"][1] != nights["2026-03-05"][1]  # a second night is not refused as existing


def test_kubernetes_readme_documents_the_s3a_connector():
    text = (K8S / "README.md").read_text()
    assert "hadoop-aws" in text and "bundle" in text
    assert "spark.jars.packages" in text


def test_secrets_come_from_kubernetes_secrets_never_the_manifest():
    docs = _docs()
    assert not [d for d in docs if d.get("kind") == "Secret"], "no Secret objects (with data) in the manifest"
    spec = _app()["spec"]
    env = {e["name"]: e for e in spec["driver"]["env"]}
    assert set(env["SPARKPRIV_LEDGER"]) == {"name", "valueFrom"}
    assert env["SPARKPRIV_LEDGER"]["valueFrom"]["secretKeyRef"]["name"]
    for role in ("driver", "executor"):
        for e in spec[role].get("env", []):
            assert "value" not in e, f"{role} env {e['name']} is a literal; use valueFrom.secretKeyRef"
    (key,) = [s for s in spec["driver"]["secrets"] if s["name"] == "sparkpriv-matrix-key"]
    args = spec["arguments"]
    key_file = args[args.index("--matrix-key-file") + 1]
    assert key_file.startswith(key["path"].rstrip("/") + "/")
    # no literal secrets anywhere in the parsed documents (comments may show how to create them)
    for s in _strings(docs):
        assert not re.search(r"(postgres(ql)?|sqlite)://", s), f"ledger URL literal in the manifest: {s!r}"
        assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", s), f"credentials in a URL: {s!r}"
        assert not re.search(r"(?i)(password|passwd|secret_key|token)\s*[=:]", s), s
        assert not re.fullmatch(r"[A-Za-z0-9+/=]{40,}|[0-9a-f]{32,}", s.strip()), f"key-like literal {s[:12]}..."


def test_configmap_holds_a_config_sparkpriv_accepts():
    from sparkpriv.config import build_config
    from sparkpriv.runner import options_for

    (cm,) = [d for d in _docs() if d.get("kind") == "ConfigMap"]
    spec = _app()["spec"]
    assert cm["metadata"]["name"] in [c["name"] for c in spec["driver"]["configMaps"]]
    values = tomllib.loads(cm["data"]["nightly.toml"])
    args = spec["arguments"]
    assert args[args.index("--config") + 1].endswith("/nightly.toml")
    assert "ledger" not in values and "matrix_key_file" not in values  # both come from secrets
    mech = values.pop("mechanism")
    values.pop("spark")
    cfg = build_config(mech, options_for(mech), values, {}, source="ConfigMap nightly.toml")
    assert cfg.get("table_id")  # the release is recorded in the ledger


def _copy_sources(text: str):
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in ("COPY", "ADD") and not any(p.startswith("--from") for p in parts):
            yield from (p for p in parts[1:-1] if not p.startswith("--"))


def test_dockerfile_copies_files_that_exist():
    text = (K8S / "Dockerfile").read_text()
    sources = list(_copy_sources(text))
    assert "jobs/release.py" in sources and "sparkpriv" in sources and "pyproject.toml" in sources
    for src in sources:
        assert (REPO / src).exists(), f"Dockerfile copies {src}, which does not exist (context: repo root)"
    assert "/opt/sparkpriv/jobs/release.py" in text  # what mainApplicationFile points to


def test_image_requirements_are_the_package_dependencies_without_pyspark_plus_fast():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["fast"]
    wanted = {d.replace(" ", "") for d in deps if not d.startswith(("pyspark", "tomli"))}
    lines = (K8S / "requirements.txt").read_text().splitlines()
    have = {ln.split("#")[0].replace(" ", "") for ln in lines if ln.split("#")[0].strip()}
    assert have == {w.split("#")[0] for w in wanted}


# --------------------------------------------------------------------------- airflow


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _kw(node: ast.Call, name: str):
    for k in node.keywords:
        if k.arg == name:
            return k.value
    return None


def test_dag_parses_and_defines_the_expected_tasks():
    tree = ast.parse(DAG_FILE.read_text(), filename=str(DAG_FILE))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    (dag,) = [c for c in calls if _call_name(c) == "DAG"]
    assert ast.literal_eval(_kw(dag, "dag_id")) == "sparkpriv_nightly_release"
    assert _kw(dag, "schedule") is not None and ast.literal_eval(_kw(dag, "catchup")) is False
    tasks = {ast.literal_eval(_kw(c, "task_id")): c for c in calls if _kw(c, "task_id") is not None}
    assert set(tasks) == {"release", "check_receipt"}
    assert ast.unparse(_kw(tasks["release"], "python_callable")) == "run_release"
    shifts = [n for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.RShift)]
    assert [(ast.unparse(s.left), ast.unparse(s.right)) for s in shifts] == [("release", "receipt")]


@pytest.fixture
def dag_module(monkeypatch):
    """Import the DAG file against a minimal stand-in ``airflow`` package (or the real one)."""
    return _import_dag(monkeypatch, DAG_FILE)


def _import_dag(monkeypatch, path):
    try:
        import airflow  # noqa: F401

        real = True
    except ImportError:
        real = False
    if not real:
        class AirflowException(Exception):
            pass

        class AirflowFailException(AirflowException):
            pass

        class DAG:
            def __init__(self, **kw):
                self.kw, self.tasks = kw, []

            def __enter__(self):
                DAG.current = self
                return self

            def __exit__(self, *exc):
                DAG.current = None

        class PythonOperator:
            def __init__(self, *, task_id, python_callable, **kw):
                self.task_id, self.python_callable, self.kw, self.downstream = task_id, python_callable, kw, []
                DAG.current.tasks.append(self)

            def __rshift__(self, other):
                self.downstream.append(other)
                return other

        mods = {name: types.ModuleType(name) for name in
                ("airflow", "airflow.exceptions", "airflow.operators", "airflow.operators.python")}
        mods["airflow"].DAG = DAG
        mods["airflow.exceptions"].AirflowException = AirflowException
        mods["airflow.exceptions"].AirflowFailException = AirflowFailException
        mods["airflow.operators.python"].PythonOperator = PythonOperator
        for name, mod in mods.items():
            monkeypatch.setitem(sys.modules, name, mod)
    spec = importlib.util.spec_from_file_location(f"dag_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_submit(tmp_path: Path, code: int) -> str:
    script = tmp_path / "spark-submit"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\necho \"$SPARKPRIV_LEDGER\" > {tmp_path}/ledger\n"
                      f"exit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def _run(mod, tmp_path, code):
    return mod.run_release(str(tmp_path / "out"), config="/etc/nightly.toml", job="/opt/jobs/release.py",
                           submit_args="--master spark://m:7077", ledger_url="sqlite:////l.sqlite",
                           spark_submit=_fake_submit(tmp_path, code))


def test_dag_fails_without_retry_when_the_budget_is_refused(dag_module, tmp_path):
    from airflow.exceptions import AirflowException, AirflowFailException

    kw = getattr(dag_module.dag, "kw", None)  # the stand-in DAG keeps its arguments
    default_args = kw["default_args"] if kw is not None else dag_module.dag.default_args
    assert default_args["retries"] >= 1  # other failures are retried ...
    with pytest.raises(AirflowFailException, match="budget refused"):
        _run(dag_module, tmp_path, 3)
    with pytest.raises(AirflowFailException, match="bad arguments"):
        _run(dag_module, tmp_path, 2)
    with pytest.raises(AirflowException) as exc:  # retried by Airflow
        _run(dag_module, tmp_path, 1)
    assert not isinstance(exc.value, AirflowFailException)
    assert _run(dag_module, tmp_path, 0) == str(tmp_path / "out")
    args = (tmp_path / "args").read_text().split()
    assert args == ["--master", "spark://m:7077", "/opt/jobs/release.py", "--config", "/etc/nightly.toml",
                    "--output", str(tmp_path / "out")]
    assert "sqlite" not in " ".join(args)  # the ledger URL travels in the environment only
    assert (tmp_path / "ledger").read_text().strip() == "sqlite:////l.sqlite"


def test_jobs_release_exit_codes_match_the_dag():
    from sparkpriv.errors import EXIT_BAD_INPUT, EXIT_BUDGET_REFUSED, BudgetExceededError

    tree = ast.parse(DAG_FILE.read_text())
    consts = {t.id: v for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple)
              for t, v in zip(n.targets[0].elts if isinstance(n.targets[0], ast.Tuple) else [], n.value.elts)}
    assert ast.literal_eval(consts["EXIT_BUDGET_REFUSED"]) == BudgetExceededError.exit_code == EXIT_BUDGET_REFUSED
    assert ast.literal_eval(consts["EXIT_BAD_INPUT"]) == EXIT_BAD_INPUT == 2


UNIT_DAG_FILE = DEPLOY / "airflow" / "sparkpriv_nightly_unit.py"


def test_unit_dag_parses_and_defines_verify_release_and_receipt():
    tree = ast.parse(UNIT_DAG_FILE.read_text(), filename=str(UNIT_DAG_FILE))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    (dag,) = [c for c in calls if _call_name(c) == "DAG"]
    assert ast.literal_eval(_kw(dag, "dag_id")) == "sparkpriv_nightly_unit"
    assert ast.literal_eval(_kw(dag, "catchup")) is False
    tasks = {ast.literal_eval(_kw(c, "task_id")): c for c in calls if _kw(c, "task_id") is not None}
    assert set(tasks) == {"verify_ledger", "release", "check_receipt"}
    op_kwargs = ast.literal_eval(_kw(tasks["release"], "op_kwargs"))
    assert op_kwargs["table_id"] == "cdr.calls.{{ ds_nodash }}" and op_kwargs["job_id"] == "{{ run_id }}"
    chain = [n for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.RShift)]
    assert ast.unparse(chain[0]) == "verify >> release >> receipt"


def _unit_setup_command() -> list:
    """The set-budget command of the README's section on the windowed unit, as its words."""
    import shlex

    text = (DEPLOY / "airflow" / "README.md").read_text()
    section = text[text.index("## A nightly job on a windowed unit"):]
    block = section[section.index("```") + 3:]
    block = block[:block.index("```")].replace("\\\n", " ")
    words = shlex.split(block)
    assert words[:3] == ["sparkpriv", "ledger", "set-budget"]
    return words[1:]


def test_unit_dag_runs_its_tasks_against_a_real_ledger(monkeypatch, tmp_path):
    """The README's unit, then the DAG's three tasks (a stand-in spark-submit that reserves and publishes like
    jobs/release.py would): a night within the 30-day budget passes; a night over it is refused without
    retries; a tampered ledger fails the verification, and a rewritten one fails on the pinned head."""
    from sparkpriv.cli import main
    from sparkpriv.ledger import open_ledger

    mod = _import_dag(monkeypatch, UNIT_DAG_FILE)
    from airflow.exceptions import AirflowException, AirflowFailException

    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    assert main([*_unit_setup_command(), "--ledger", url]) == 0
    with open_ledger(url) as ledger:
        (unit,) = [ledger.unit_status(u) for u in ledger.units()]
    assert (unit.unit, unit.patterns, unit.window, unit.budget_epsilon) == ("subscribers", ("cdr.*", "billing.*"),
                                                                           "30d", 2.0)
    cli = (sys.executable, "-m", "sparkpriv.cli")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    head = mod.verify_ledger(None, ledger_url=url, sparkpriv=cli)
    assert head.startswith("2:sha256:")

    # a stand-in spark-submit: a local release with the ledger of the environment, written to --output
    submit = tmp_path / "spark-submit"
    submit.write_text(f"""#!{sys.executable}
import os, sys
import numpy as np
from sparkpriv.api import release_projection
from sparkpriv.errors import BudgetExceededError
from sparkpriv.ledger import job_context
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
X = np.random.default_rng(1).uniform(-1, 1, size=(100, 3))
with job_context(value("--job-id")):
    try:
        rel = release_projection(X, k=2, epsilon=float(os.environ["NIGHT_EPSILON"]), lower=-1.0, upper=1.0,
                                 ledger=os.environ["SPARKPRIV_LEDGER"], table_id=value("--table-id"))
    except BudgetExceededError:
        sys.exit(3)
    rel.write(value("--output"))
""")
    submit.chmod(submit.stat().st_mode | stat.S_IEXEC)

    def night(day: str, epsilon: float) -> str:
        monkeypatch.setenv("NIGHT_EPSILON", str(epsilon))
        out = mod.run_release(str(tmp_path / day), f"cdr.calls.{day}", f"scheduled__{day}", config="/etc/n.toml",
                              job="jobs/release.py", submit_args="", ledger_url=url, spark_submit=str(submit))
        mod.check_receipt(out, ledger_url=url, sparkpriv=cli)
        return out

    night("20260501", 1.5)
    with pytest.raises(AirflowFailException, match="budget refused"):  # 1.5 + 1.5 > 2 within 30 days
        night("20260502", 1.5)
    with open_ledger(url) as ledger:
        (entry,) = ledger.unit_status("subscribers").entries
        assert (entry["table_id"], entry["job_id"]) == ("cdr.calls.20260501", "scheduled__20260501")
    head = mod.verify_ledger(head, ledger_url=url, sparkpriv=cli)  # pins the previous run's head

    with open_ledger(url) as ledger:  # a freed spend: the journal shows it
        with ledger._transaction(write=True) as tx:
            tx.execute("UPDATE sparkpriv_releases SET state = 'aborted'")
    with pytest.raises(AirflowFailException, match="journal is broken: the entry .* differs from what journal"):
        mod.verify_ledger(head, ledger_url=url, sparkpriv=cli)
    with pytest.raises(AirflowFailException, match="does not match the ledger"):
        mod.check_receipt(str(tmp_path / "20260501"), ledger_url=url, sparkpriv=cli)
    with open_ledger(url) as ledger:  # put back, then cut the journal's tail: only the pinned head shows it
        with ledger._transaction(write=True) as tx:
            tx.execute("UPDATE sparkpriv_releases SET state = 'committed'")
            n = tx.execute("SELECT MAX(seq) FROM sparkpriv_journal")[0][0]
            tx.execute("DELETE FROM sparkpriv_journal WHERE seq = ?", (n,))  # the refusal: no state to revert
    assert mod.verify_ledger(None, ledger_url=url, sparkpriv=cli)
    with pytest.raises(AirflowFailException, match="deleted from its end"):
        mod.verify_ledger(head, ledger_url=url, sparkpriv=cli)
    with pytest.raises(AirflowException):
        mod.verify_ledger(None, ledger_url=f"sqlite:///{tmp_path}/missing.sqlite", sparkpriv=cli)


# --------------------------------------------------------------------------- standalone


def test_spark_defaults_parse_and_allow_retries():
    conf = {}
    for line in (DEPLOY / "standalone" / "spark-defaults.conf").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, value = line.split(None, 1)
            assert key.startswith("spark."), key
            conf[key] = value
    assert int(conf["spark.task.maxFailures"]) >= 2
    assert conf["spark.sql.execution.arrow.pyspark.enabled"] == "true"


def test_build_script_is_valid_bash_and_executable():
    script = DEPLOY / "standalone" / "build_package.sh"
    assert os.access(script, os.X_OK)
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("target", ["standalone", "kubernetes", "airflow"])
def test_every_target_has_a_readme(target):
    text = (DEPLOY / target / "README.md").read_text()
    assert len(text) > 500


# ------------------------------------------------ dated input and the receipt through pyarrow


def _render(template: str, ds: str, variables: dict) -> str:
    """Render an op_kwargs template as Airflow does (Jinja, ``var.value.get``, ``ds``)."""
    jinja2 = pytest.importorskip("jinja2")

    class _Value:
        def get(self, name, default=None):
            return variables.get(name, default)

    return jinja2.Environment().from_string(template).render(ds=ds, var=types.SimpleNamespace(value=_Value()))


def _release_kwargs(dag_module):
    task = next(t for t in dag_module.dag.tasks if t.task_id == "release")
    return getattr(task, "kw", {}).get("op_kwargs") or task.op_kwargs


def test_dag_dates_both_the_input_and_the_output(dag_module):
    kw = _release_kwargs(dag_module)
    variables = {"sparkpriv_input_template": "s3a://lake/cdr/date={ds}", "sparkpriv_output_root": "s3a://out/towers"}
    assert _render(kw["input"], "2026-03-04", variables) == "s3a://lake/cdr/date=2026-03-04"
    assert _render(kw["output"], "2026-03-04", variables) == "s3a://out/towers/2026-03-04"
    assert _render(kw["input"], "2026-03-05", variables) == "s3a://lake/cdr/date=2026-03-05"


def test_the_dated_input_reaches_the_job_as_input(dag_module, tmp_path):
    dag_module.run_release(str(tmp_path / "out"), "s3a://lake/cdr/date=2026-03-04", config="/etc/n.toml",
                           job="/opt/jobs/release.py", submit_args="", ledger_url="sqlite:////l.sqlite",
                           spark_submit=_fake_submit(tmp_path, 0))
    args = (tmp_path / "args").read_text().split()
    assert args[args.index("--input") + 1] == "s3a://lake/cdr/date=2026-03-04"


def _receipt(entry_id="e-123"):
    return json.dumps({"ledger": {"entry_id": entry_id}, "epsilon": 1.0}).encode()


def test_check_receipt_reads_a_local_release(dag_module, tmp_path):
    from airflow.exceptions import AirflowFailException

    out = tmp_path / "2026-03-04"
    out.mkdir()
    with pytest.raises(AirflowFailException, match="no readable privacy receipt"):
        dag_module.check_receipt(str(out))
    (out / "_privacy_receipt.json").write_bytes(_receipt())
    dag_module.check_receipt(str(out))
    dag_module.check_receipt(f"file:{out}")
    (out / "_privacy_receipt.json").write_bytes(json.dumps({"ledger": None}).encode())
    with pytest.raises(AirflowFailException, match="names no ledger entry"):
        dag_module.check_receipt(str(out))


@pytest.fixture
def s3_endpoint():
    pytest.importorskip("moto", reason="moto[server] is in the test extra")
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop()


def test_check_receipt_reads_an_s3a_release(dag_module, s3_endpoint, monkeypatch):
    import boto3
    from airflow.exceptions import AirflowFailException

    for k, v in {"AWS_ENDPOINT_URL": f"http://{s3_endpoint}", "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3", endpoint_url=f"http://{s3_endpoint}", region_name="us-east-1")
    client.create_bucket(Bucket="releases")
    with pytest.raises(AirflowFailException, match="no readable privacy receipt"):
        dag_module.check_receipt("s3a://releases/towers/2026-03-04")
    client.put_object(Bucket="releases", Key="towers/2026-03-04/_privacy_receipt.json", Body=_receipt())
    dag_module.check_receipt("s3a://releases/towers/2026-03-04")
    dag_module.check_receipt("s3://releases/towers/2026-03-04/")
    client.put_object(Bucket="releases", Key="towers/2026-03-05/_privacy_receipt.json", Body=b'{"ledger": {}}')
    with pytest.raises(AirflowFailException, match="names no ledger entry"):
        dag_module.check_receipt("s3a://releases/towers/2026-03-05")


def test_unit_dag_dates_the_input_and_output_but_not_the_unit(monkeypatch):
    mod = _import_dag(monkeypatch, UNIT_DAG_FILE)
    kw = _release_kwargs(mod)
    variables = {"sparkpriv_input_template": "s3a://lake/cdr/date={ds}", "sparkpriv_output_root": "s3a://out/calls"}
    assert _render(kw["input"], "2026-03-04", variables) == "s3a://lake/cdr/date=2026-03-04"
    assert _render(kw["output"], "2026-03-04", variables) == "s3a://out/calls/2026-03-04"
    assert _render(kw["input"], "2026-03-04", {}) == ""  # unset: the config's input (no --input)


def test_unit_dag_verifies_an_s3a_receipt_through_a_local_copy(monkeypatch, s3_endpoint, tmp_path):
    import boto3

    mod = _import_dag(monkeypatch, UNIT_DAG_FILE)
    from airflow.exceptions import AirflowFailException

    for k, v in {"AWS_ENDPOINT_URL": f"http://{s3_endpoint}", "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3", endpoint_url=f"http://{s3_endpoint}", region_name="us-east-1")
    client.create_bucket(Bucket="calls")
    fake = (sys.executable, "-c", f"import sys, shutil; shutil.copy(sys.argv[3], {str(tmp_path / 'seen')!r})")
    with pytest.raises(AirflowFailException, match="no readable privacy receipt"):
        mod.check_receipt("s3a://calls/2026-03-04", ledger_url="sqlite:////l.sqlite", sparkpriv=fake)
    client.put_object(Bucket="calls", Key="2026-03-04/_privacy_receipt.json", Body=_receipt("e-9"))
    mod.check_receipt("s3a://calls/2026-03-04", ledger_url="sqlite:////l.sqlite", sparkpriv=fake)
    assert json.loads((tmp_path / "seen").read_text())["ledger"]["entry_id"] == "e-9"
