"""The CLI and the spark-submit job end to end in local mode (subprocesses)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkpriv.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _env(tmp_path):
    env = dict(os.environ)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARKPRIV_LEDGER"] = f"sqlite:///{tmp_path}/default-ledger.sqlite"
    return env


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert main(["release", "projection", "--input", "x", "--output", "y", "--columns", "a",
                 "--k", "two", "--epsilon", "1", "--row-bound", "1"]) == 2
    assert "'k' option (command line) must be an integer" in capsys.readouterr().err


def test_missing_required_option_exit_2(capsys):
    assert main(["release", "projection", "--input", "x", "--columns", "a", "--k", "1",
                 "--epsilon", "1"]) == 2
    assert "'output' option is required" in capsys.readouterr().err


def test_unknown_config_key_exit_2(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('input = "x"\noutput = "y"\ncolumns = ["a"]\nk = 1\nepsilon = 1.0\nrowbound = 1.0\n')
    assert main(["release", "projection", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "Unknown key 'rowbound'" in err and "row_bound" in err


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.main_leg
def test_cli_generate_release_and_job_end_to_end(tmp_path):
    env = _env(tmp_path)
    data = tmp_path / "blobs"
    r = subprocess.run([sys.executable, "-m", "sparkpriv.cli", "generate", "blobs", "--rows", "5000",
                        "--cols", "8", "--output", str(data)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    led = f"sqlite:///{tmp_path}/ledger.sqlite"
    r = subprocess.run([sys.executable, "-m", "sparkpriv.cli", "ledger", "set-budget", "--ledger", led,
                        "--table-id", "t.blobs", "--epsilon", "1.5", "--delta", "0"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cols = ",".join(f"f{i}" for i in range(8))
    out = tmp_path / "release"
    cmd = [sys.executable, "-m", "sparkpriv.cli", "release", "projection", "--input", str(data),
           "--output", str(out), "--columns", cols, "--k", "4", "--epsilon", "1.0",
           "--row-bound", "6", "--ledger", led, "--table-id", "t.blobs"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"private table: file:{out}" in r.stdout
    receipt = json.loads((out / "_privacy_receipt.json").read_text())
    assert receipt["ledger"]["table_id"] == "t.blobs"
    # a second release would exceed the budget of 1.5: refused with exit 3, nothing written
    out2 = tmp_path / "release2"
    r = subprocess.run(cmd[:8] + [str(out2)] + cmd[9:], env=env, capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    assert not out2.exists()

    # the spark-submit job with a config file (local mode), output exists -> exit 2 without --overwrite
    cfg = tmp_path / "nightly.toml"
    cfg.write_text(
        'mechanism = "projection"\n'
        f'input = "{data}"\noutput = "{out}"\n'
        f'columns = [{", ".join(repr(f"f{i}").replace(chr(39), chr(34)) for i in range(8))}]\n'
        'k = 3\nepsilon = 0.5\nrow_bound = 6.0\nnoise = "laplace"\n'
        '[spark]\n"spark.sql.shuffle.partitions" = "4"\n'
    )
    submit = shutil.which("spark-submit") or str(Path(sys.executable).parent / "spark-submit")
    job = [submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
           str(ROOT / "jobs" / "release.py"), "--config", str(cfg)]
    r = subprocess.run(job, env=env, capture_output=True, text=True)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "already exists" in r.stderr + r.stdout, (r.stdout, [ln for ln in r.stderr.splitlines() if "INFO" not in ln])
    r = subprocess.run(job + ["--overwrite"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    receipt = json.loads((out / "_privacy_receipt.json").read_text())
    assert receipt["parameters" if "parameters" in receipt else "mechanism_details"]
    assert receipt["guarantee"]["epsilon"] == pytest.approx(0.5)
    assert receipt["ledger"] is None  # no table id in this config: not recorded
    assert receipt["insecure_test_seed"] is False and receipt["guarantee"]["holds"] is True

    # spark-submit of the job with the former test-seed variable set: refused, nothing replaced
    before = (out / "_privacy_receipt.json").read_text()
    r = subprocess.run(job + ["--overwrite"], env={**env, "SPARKPRIV_INSECURE_TEST_SEED": "1"},
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "unset SPARKPRIV_INSECURE_TEST_SEED" in r.stdout + r.stderr  # spark-submit: one stream
    assert (out / "_privacy_receipt.json").read_text() == before


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.main_leg
def test_demo_command(tmp_path):
    """The README's first command: the synthetic release of a generated call-detail table and its
    synthetic table as the private table, the DPGM and per-tower counts beside it, and the
    counting-query errors of each and of an empty release."""
    env = _env(tmp_path)
    r = subprocess.run([sys.executable, "-m", "sparkpriv.cli", "demo", "--workdir", str(tmp_path / "d"),
                        "--people", "3000", "--queries", "200"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert f"private table: file:{tmp_path / 'd' / 'synthetic-items'}" in out
    assert f"receipt:       {tmp_path / 'd' / 'synthetic-release' / '_privacy_receipt.json'}" in out
    assert "counting queries" in out
    assert out.index("synthetic release table") < out.index("DPGM synthetic table")  # the private table first
    for line in ("DPGM synthetic table", "synthetic release table", "independent Bernoullis", "empty release"):
        assert line in out
    empty = float(out.split("empty release")[1].split()[0])
    assert empty == pytest.approx(1.0, abs=0.01)  # answering 0 to every query: relative error 1
    assert "note:          3000 people is few for a private release" in out  # below the demo's FEW_PEOPLE
    # every stage says so, out of a fixed total (the demo was once silent for minutes after training)
    assert re.findall(r"demo step (\d)/5:", r.stdout + r.stderr) == ["1", "2", "3", "4", "5"]
    assert (tmp_path / "d" / "release" / "_privacy_receipt.json").exists()
    assert (tmp_path / "d" / "release" / "_dpgm_model.npz").exists()
    assert (tmp_path / "d" / "synthetic" / "_privacy_receipt.json").exists()
    assert (tmp_path / "d" / "synthetic-items" / "_privacy_receipt.json").exists()
    assert json.loads((tmp_path / "d" / "synthetic-release" / "_privacy_receipt.json").read_text())["mechanism"] == \
        "synthetic"
    led = json.loads((tmp_path / "d" / "release" / "_privacy_receipt.json").read_text())
    assert led["mechanism"] == "dpgm" and led["guarantee"]["epsilon"] <= 1.0


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.main_leg
def test_demo_projection_command(tmp_path):
    env = _env(tmp_path)
    r = subprocess.run([sys.executable, "-m", "sparkpriv.cli", "demo", "projection", "--workdir",
                        str(tmp_path / "d"), "--rows", "20000"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "private table: file:" in r.stdout and "receipt:" in r.stdout and "RMSE" in r.stdout
    assert (tmp_path / "d" / "release" / "_privacy_receipt.json").exists()


def test_columns_not_required_for_event_tables():
    from sparkpriv.config import build_config
    from sparkpriv.errors import ParameterError
    from sparkpriv.runner import options_for

    base = {"input": "ev", "output": "out", "k": "4", "epsilon": "1"}
    cfg = build_config("projection", options_for("projection"), None, dict(base, events=True))
    assert cfg.get("columns") is None and cfg.get("events") is True
    cfg = build_config("projection", options_for("projection"), {"events": True, "max_items": 8,
                       "vocabulary": "0..1302", "person_col": "caller_id", "item_col": "tower_id"}, base)
    assert cfg.get("max_items") == 8 and cfg.get("vocabulary") == "0..1302"
    import pytest

    with pytest.raises(ParameterError, match="'columns' option is required"):
        build_config("projection", options_for("projection"), None, base)
    with pytest.raises(ParameterError, match="'columns' option is required"):
        build_config("dprp", options_for("dprp"), None, dict(base, lower="0", upper="1", delta="1e-6"))


def test_help_says_which_options_events_lifts(capsys):
    with pytest.raises(SystemExit):
        main(["release", "dprp", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(required without --events; refused with it)" in out
    assert out.count("(required without --events") == 3  # --columns, --lower, --upper


# --------------------------------------------------------------------------- fixed seeds are refused

SEED_ENV = "SPARKPRIV_INSECURE_TEST_SEED"


def _release_args(tmp_path):
    return ["release", "projection", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
            "--columns", "a,b", "--k", "1", "--epsilon", "1", "--row-bound", "1"]


def _job_config(tmp_path):
    cfg = tmp_path / "job.toml"
    cfg.write_text(f'mechanism = "projection"\ninput = "{tmp_path / "in"}"\noutput = "{tmp_path / "out"}"\n'
                   'columns = ["a", "b"]\nk = 1\nepsilon = 1.0\nrow_bound = 1.0\n')
    return cfg


@pytest.mark.parametrize("value", ["20261122", ""])
def test_cli_and_job_refuse_the_seed_variable_before_spark_starts(tmp_path, value):
    env = _env(tmp_path)
    env[SEED_ENV] = value
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    runs = [
        [sys.executable, "-m", "sparkpriv.cli", *_release_args(tmp_path)],
        [sys.executable, "-m", "sparkpriv.cli", "generate", "blobs", "--rows", "10", "--cols", "2",
         "--output", str(tmp_path / "out")],  # every command, not only releases
        [sys.executable, str(ROOT / "jobs" / "release.py"), "--config", str(_job_config(tmp_path))],
    ]
    for cmd in runs:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert f"the environment variable {SEED_ENV} is set" in r.stderr, r.stderr
        assert f"unset {SEED_ENV}" in r.stderr and "NOT private" in r.stderr
        assert "SparkContext" not in r.stderr and "Ivy" not in r.stderr  # Spark never started
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "default-ledger.sqlite").exists()


def test_cli_and_job_refuse_inside_a_fixed_seed_block(tmp_path, capsys, monkeypatch):
    from sparkpriv.cli import main_job
    from sparkpriv.config import build_config
    from sparkpriv.errors import ParameterError
    from sparkpriv.privacy.random import insecure_fixed_seed
    from sparkpriv.runner import options_for, run_release

    monkeypatch.delenv(SEED_ENV, raising=False)
    cfg = build_config("projection", options_for("projection"), None,
                       {"input": "x", "output": str(tmp_path / "out"), "columns": "a", "k": "1",
                        "epsilon": "1", "row_bound": "1"})
    with insecure_fixed_seed(1):
        assert main(_release_args(tmp_path)) == 2
        assert "refuses to run inside sparkpriv.privacy.random.insecure_fixed_seed" in capsys.readouterr().err
        assert main_job(["--config", str(_job_config(tmp_path))]) == 2
        assert "refuses to run inside sparkpriv.privacy.random.insecure_fixed_seed" in capsys.readouterr().err
        with pytest.raises(ParameterError, match="insecure_fixed_seed"):
            run_release(cfg, spark=object())  # refused before the session is touched
    assert not (tmp_path / "out").exists()


def test_table_without_budget_is_refused_before_spark_starts(tmp_path, capsys):
    """The budget check needs only the ledger: the input (which does not exist) is never
    looked at and Spark never starts, so the budget error comes first (exit 3)."""
    from sparkpriv.ledger import open_ledger

    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    with open_ledger(url) as led:
        led.set_budget("other.table", epsilon=1.0, delta=0.0)
    args = ["release", "projection", "--input", str(tmp_path / "missing.parquet"), "--output",
            str(tmp_path / "out"), "--columns", "a,b", "--k", "1", "--epsilon", "1", "--row-bound", "1",
            "--ledger", url, "--table-id", "no.budget"]
    assert main(args) == 3
    err = capsys.readouterr().err
    assert "No privacy budget is set for table 'no.budget'" in err and "missing.parquet" not in err
    # no ledger file at all: the same refusal, and no file is created
    url2 = f"sqlite:///{tmp_path / 'none.sqlite'}"
    assert main(args[:-4] + ["--ledger", url2, "--table-id", "no.budget"]) == 3
    assert "No privacy budget" in capsys.readouterr().err
    assert not (tmp_path / "none.sqlite").exists()


def test_spark_log_noise_stays_out_of_the_terminal(tmp_path):
    """An undeclared label fails in the executors; the terminal shows sparkpriv's one-line
    error, not Spark's executor stack traces (they were 94 lines), unless --log-level DEBUG."""
    (tmp_path / "t.csv").write_text("a,b,y\n1.0,2.0,0\n0.5,,1\n0.1,0.3,7\n")
    env = _env(tmp_path)
    env.pop("SPARKPRIV_SPARK_LOG_LEVEL", None)
    args = [sys.executable, "-m", "sparkpriv.cli", "release", "dprp", "--input", "t.csv", "--output",
            "out", "--columns", "a,b", "--label", "y", "--labels", "private", "--classes", "0,1", "--epsilon", "1", "--delta", "1e-5",
            "--lower", "0", "--upper", "2"]
    out = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith("sparkpriv: error: the label column 'y' holds a value that is not a declared"), \
        lines[-3:]
    assert len(lines) < 15 and "Traceback" not in out.stderr and "Exception in task" not in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra,msg", [
    ([], "needs a delta"),
    (["--delta", "1e-6", "--threshold", "1"], "--threshold applies to --events only"),
    (["--delta", "1e-6", "--fill", "0", "--fill-dp-mean"], "either --fill .* or --fill-dp-mean, not both"),
    (["--delta", "1e-6", "--budget-split", "0.9,0.2"], "'budget_split' parameter of sparkpriv release dprp"),
    (["--delta", "1e-6", "--label", "y"], "declare labels='public'"),
])
def test_dprp_parameter_errors_before_spark_starts(tmp_path, capsys, monkeypatch, extra, msg):
    import re

    import sparkpriv.spark.session as session

    def no_spark(*a, **k):
        raise AssertionError("Spark must not start for a parameter error")

    monkeypatch.setattr(session, "get_spark", no_spark)
    rc = main(["release", "dprp", "--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "o"),
               "--columns", "a", "--lower", "0", "--upper", "1", "--epsilon", "1", *extra])
    assert rc == 2
    assert re.search(msg, capsys.readouterr().err)


@pytest.mark.parametrize("argv", [
    ["release", "projection", "--columns", "a,b", "--k", "1", "--epsilon", "1", "--row-bound", "1"],
    ["release", "counts", "--events", "--person-col", "p", "--item-col", "i", "--vocabulary", "0..9",
     "--max-items", "3", "--epsilon", "1"],
    ["release", "counts", "--events", "--person-col", "p", "--item-col", "i", "--vocabulary", "0..9",
     "--max-items", "auto", "--epsilon", "1"],
    ["release", "kmeans", "--columns", "a,b", "--k", "2", "--epsilon", "1", "--delta", "1e-6",
     "--variant", "linear", "--row-bound", "1"],
])
def test_over_budget_is_refused_before_spark_starts(tmp_path, monkeypatch, capsys, argv):
    """The ledger's dry run refuses an over-budget release before Spark starts (exit 3), on the command
    line and in spark-submit jobs (the same run_release)."""
    import sparkpriv.spark.session as session
    from sparkpriv.ledger import open_ledger

    def no_spark(*a, **k):
        raise AssertionError("Spark must not start for an over-budget release")

    url = f"sqlite:///{tmp_path}/l.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=0.5, delta=1e-5)
    monkeypatch.setattr(session, "get_spark", no_spark)
    rc = main([*argv, "--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "o"),
               "--ledger", url, "--table-id", "t"])
    assert rc == 3
    assert "budget" in capsys.readouterr().err
    with open_ledger(url) as led:
        assert led.status("t").entries == []  # nothing reserved
