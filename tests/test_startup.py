"""Start-up of the command line: what each command imports, and which errors come before Spark.

Each case runs the CLI's ``main`` in a fresh interpreter (imports are per
process) with ``pyspark`` made unimportable: starting Spark needs it, so a
command that tried would fail with a ``ModuleNotFoundError`` (exit 1) instead of
its own result. No test looks at a clock (docs/architecture.md, "Start-up time").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_RUN = """
import json, sys
sys.modules["pyspark"] = None  # starting Spark needs pyspark: any attempt now fails
from sparkpriv.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
loaded = sorted(m for m, v in sys.modules.items() if v is not None)
print("\\nSTARTUP " + json.dumps({"rc": rc, "modules": loaded}), file=sys.stderr)
"""

SPARK_ENV = ("HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_CONF_DIR", "SPARK_HOME", "SPARK_REMOTE",
             "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_GATEWAY_PORT")  # where a path's filesystem may differ
HEAVY = ("pyspark", "py4j", "numpy", "scipy", "pandas", "pyarrow", "dp_accounting", "randomgen")


def run_cli(*argv: str, cwd: Path, env: dict | None = None):
    """(exit code, modules imported, stdout, stderr) of ``sparkpriv ARGV`` in a new interpreter."""
    drop = ("SPARKPRIV_INSECURE_TEST_SEED", "SPARKPRIV_LEDGER", *SPARK_ENV)
    environ = {k: v for k, v in os.environ.items() if k not in drop}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    environ.update(env or {})
    p = subprocess.run([sys.executable, "-c", _RUN, *argv], cwd=cwd, env=environ, capture_output=True, text=True,
                       timeout=120)
    head, _, tail = p.stderr.rpartition("\nSTARTUP ")
    assert tail, f"the command did not finish: {p.stderr[-2000:]}"
    result = json.loads(tail)
    return result["rc"], set(result["modules"]), p.stdout, head


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["release", "--help"], ["bench", "--help"],
                                  ["generate", "blobs", "--help"]])
def test_help_and_version_import_neither_spark_nor_numpy_nor_a_mechanism(tmp_path, argv):
    rc, modules, out, err = run_cli(*argv, cwd=tmp_path)
    assert rc == 0, err
    assert out.strip(), "nothing printed"
    assert heavy(modules) == []
    assert not [m for m in modules if m.startswith(("sparkpriv.mechanisms.", "sparkpriv.bench.", "sparkpriv.ledger"))]


def test_release_help_lists_every_mechanism_without_importing_them(tmp_path):
    from sparkpriv.runner import MECHANISMS

    rc, modules, out, err = run_cli("release", "--help", cwd=tmp_path)
    assert rc == 0, err
    assert all(name in out for name in MECHANISMS)
    rc, modules, out, err = run_cli("release", "projection", "--help", cwd=tmp_path)
    assert rc == 0, err
    assert "--row-bound" in out and "--matrix-key-file" in out  # the mechanism's own options
    assert "--init-file" not in out  # k-means's option, not projection's
    assert heavy(modules) and not [m for m in modules if m.split(".")[0] in ("pyspark", "py4j")]


def test_ledger_commands_run_without_spark(tmp_path):
    led = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    rc, modules, out, err = run_cli("ledger", "set-budget", "--ledger", led, "--table-id", "t.a", "--epsilon", "2",
                                    "--delta", "0", cwd=tmp_path)
    assert rc == 0, err
    rc, modules, out, err = run_cli("ledger", "show", "--ledger", led, "--json", cwd=tmp_path)
    assert rc == 0, err
    assert json.loads(out)["tables"][0]["budget"]["epsilon"] == 2
    assert not [m for m in modules if m.split(".")[0] in ("pyspark", "py4j")]
    rc, modules, out, err = run_cli("ledger", "report", "--ledger", led, "--output", str(tmp_path / "r.html"),
                                    cwd=tmp_path)
    assert rc == 0, err
    assert (tmp_path / "r.html").exists()
    assert not [m for m in modules if m.split(".")[0] in ("pyspark", "py4j")]


CSV = "a,b\n1.0,2.0\n3.0,4.0\n"
RELEASE = ["release", "projection", "--columns", "a,b", "--k", "2", "--epsilon", "1"]


@pytest.fixture()
def table(tmp_path) -> Path:
    path = tmp_path / "in.csv"
    path.write_text(CSV)
    return path


def _refused_before_spark(argv, tmp_path, code: int, *needles: str) -> None:
    rc, modules, out, err = run_cli(*argv, cwd=tmp_path)
    assert rc == code, err
    assert "ModuleNotFoundError" not in err and "failed" not in err, err  # did not try to start Spark
    for needle in needles:
        assert needle in err, err
    assert not [m for m in modules if m.split(".")[0] in ("pyspark", "py4j")]
    assert not (tmp_path / "out").exists() or (tmp_path / "out" / "keep").exists()


def test_unknown_option_is_refused_before_spark(tmp_path, table):
    _refused_before_spark([*RELEASE, "--input", str(table), "--output", "out", "--row-bound", "1", "--bogus"],
                          tmp_path, 2, "unrecognized arguments: --bogus")


def test_bad_option_value_is_refused_before_spark(tmp_path, table):
    _refused_before_spark([*RELEASE[:-1], "-1", "--input", str(table), "--output", "out", "--row-bound", "1"],
                          tmp_path, 2, "'epsilon'")


def test_a_rule_between_parameters_is_refused_before_spark(tmp_path, table):
    """k-means' kernel variant needs a kernel width: a public rule, known before any data."""
    _refused_before_spark(["release", "kmeans", "--columns", "a,b", "--k", "2", "--epsilon", "1", "--delta",
                           "1e-5", "--row-bound", "10", "--input", str(table), "--output", "out"],
                          tmp_path, 2, "'kernel_width'", "--kernel-width")


@pytest.mark.parametrize("missing", ["missing.csv", "missing_dir/", "file:///nonexistent/sparkpriv/table"])
def test_missing_input_path_is_refused_before_spark(tmp_path, missing):
    _refused_before_spark([*RELEASE, "--input", missing, "--output", "out", "--row-bound", "1"],
                          tmp_path, 2, f"Cannot read the input {missing!r}", "--input-format")


def test_existing_output_is_refused_before_spark(tmp_path, table):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    _refused_before_spark([*RELEASE, "--input", str(table), "--output", "out", "--row-bound", "1"],
                          tmp_path, 2, "already exists", "--overwrite")
    assert (tmp_path / "out" / "keep").read_text() == "x"


def test_table_without_budget_is_refused_before_spark(tmp_path, table):
    led = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    _refused_before_spark([*RELEASE, "--input", str(table), "--output", "out", "--row-bound", "1", "--table-id",
                           "t.none", "--ledger", led], tmp_path, 3, "No privacy budget is set for table 't.none'")


@pytest.mark.parametrize("content, needle", [("column,lower,upper\na,5,1\nb,0,1\n", "needs lower < upper"),
                                             ("column,lower,upper\na,0,1\n", "no bounds for the column(s) b"),
                                             (None, "Cannot read the bounds file")])
def test_bad_bounds_file_is_refused_before_spark(tmp_path, table, content, needle):
    bounds = tmp_path / "bounds.csv"
    if content is not None:
        bounds.write_text(content)
    _refused_before_spark([*RELEASE, "--input", str(table), "--output", "out", "--bounds-file", str(bounds)],
                          tmp_path, 2, needle)


def test_remote_paths_are_left_to_spark(tmp_path, monkeypatch):
    """Where the paths may not be this machine's files, the check is Spark's, after it starts."""
    from sparkpriv.spark.session import paths_are_local

    for name in SPARK_ENV:
        monkeypatch.delenv(name, raising=False)
    assert paths_are_local({}) == paths_are_local({"spark.master": "local[2]"})
    for name in SPARK_ENV:
        with monkeypatch.context() as m:
            m.setenv(name, "/somewhere")
            assert not paths_are_local({}), name

    assert not paths_are_local({"spark.master": "spark://cluster:7077"})
    assert not paths_are_local({"spark.hadoop.fs.defaultFS": "hdfs://nn:8020"})
    config = tmp_path / "job.toml"
    config.write_text('[spark]\n"spark.master" = "spark://127.0.0.1:1"\n')
    rc, modules, out, err = run_cli(*RELEASE, "--config", str(config), "--input", "missing.csv", "--output", "out",
                                    "--row-bound", "1", cwd=tmp_path)
    assert rc == 1 and "ModuleNotFoundError" in err  # went on to start Spark (blocked here)


def test_a_closed_pipe_ends_quietly(tmp_path):
    """`sparkpriv ledger show --json | true`: no traceback when the reader has gone away."""
    import subprocess
    import sys

    led = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    rc, _, _, err = run_cli("ledger", "set-budget", "--ledger", led, "--table-id", "t.a", "--epsilon", "2",
                            "--delta", "1e-6", cwd=tmp_path)
    assert rc == 0, err
    cmd = f"{sys.executable} -m sparkpriv.cli ledger show --ledger {led} --json | true"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
