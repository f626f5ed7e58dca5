"""Releases submitted with spark-submit to a real standalone cluster (issue 7).

Jobs are submitted with ``spark-submit --master spark://127.0.0.1:PORT ...
jobs/release.py --config CFG``, with the package shipped as a zip on
``--py-files`` to executors whose Python does not have sparkpriv installed (see
conftest.py). Every registered mechanism is released on the cluster through the
job's entry point, all in one application (``every_release_app.py``: starting
the JVMs and Python workers once, not once per mechanism). Fault tests kill a
Python worker and then an executor JVM in the middle of a release (the job must
finish through task retry with output identical to an undisturbed run with the
same test seed), kill the driver before publishing, and make a job fail before
publishing.

Tests marked ``main_leg`` exercise Spark's process handling, not a PySpark
API: CI runs them in its PySpark 4 leg only (``.ci/pyspark35.sh``).

The retry tests need two runs that draw the same secrets: they submit the test
app ``fixed_seed_app.py``, which sets a fixed seed explicitly in its own code
(``jobs/release.py`` refuses fixed seeds, and refuses to run at all while the
former test-seed environment variable is set: tested here too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cluster.conftest import LOCALHOST, REPO, base_env, spark_home

pytestmark = pytest.mark.cluster

SUBMIT_TIMEOUT = 420  # seconds per spark-submit (2 shared cores; a release takes well under a minute)
TABLE_ID = "test.cluster_blobs"
COLS = ["f0", "f1", "f2", "f3"]

# Per-mechanism options of the cluster release (the rest of each config is common:
# input, output, columns, ledger, table_id). A mechanism registered in
# sparkpriv.runner.MECHANISMS without an entry here is SKIPPED with a reason:
# add its options here (None drops a common key). ``per_row``: the output has one
# row per input row and keeps the public ``id`` column.
MECHANISM_OPTIONS = {
    "projection": {"options": {"k": 2, "epsilon": 1.0, "row_bound": 8.0, "keep_columns": ["id"]},
                   "per_row": True},
    "dprp": {"options": {"epsilon": 2.0, "delta": 1e-5, "lower": [-6.0], "upper": [6.0],
                         "keep_columns": ["id"]},
             "per_row": True},
    "kmeans": {"options": {"k": 2, "epsilon": 2.0, "delta": 1e-5, "iterations": 2, "variant": "linear",
                           "row_bound": 8.0},
               "per_row": False},
    "regression": {"options": {"columns": COLS[:-1], "target": COLS[-1], "row_bound": 8.0, "epsilon": 2.0,
                               "target_lower": -8.0, "target_upper": 8.0,
                               "delta": 1e-5},
                   "per_row": False},
    "dpgm": {"options": {"k": 2, "epsilon": 5.0, "delta": 1e-5, "model": "vae", "kmeans_iterations": 2,
                         "sampling_rate": 0.2, "epochs": 1.0, "hidden": 3},
             "per_row": False},
    # an event table: the person is the id, the item its label (one event each)
    "counts": {"options": {"columns": None, "epsilon": 1.0, "events": True, "person_col": "id",
                           "item_col": "label", "vocabulary": "0..1", "max_items": 1},
               "per_row": False},
    "synthetic": {"options": {"columns": None, "epsilon": 2.0, "delta": 1e-5, "events": True, "person_col": "id",
                              "item_col": "label", "vocabulary": "0..1", "max_items": "auto"},
                  "per_row": False},
    "aggregates": {"options": {"columns": None, "epsilon": 1.0, "person": "id", "by": "label", "domain": "label=0..1",
                               "aggregates": "count_distinct, count, mean(f0), median(f0)", "bounds": "f0=-10:10",
                               "max_keys": 1, "max_events_per_key": 1},
                   "per_row": False},
}


def registered_mechanisms() -> list[str]:
    from sparkpriv.runner import MECHANISMS

    return sorted(MECHANISMS)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(v)


def write_config(path: Path, mechanism: str, values: dict, spark: dict | None = None) -> Path:
    lines = [f"mechanism = {_toml_value(mechanism)}"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    if spark:
        lines.append("\n[spark]")
        lines += [f"{json.dumps(k)} = {json.dumps(str(v))}" for k, v in spark.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_blobs(path: Path, *, files: int, rows_per_file: int, cols: int = 4, seed: int = 0,
                corrupt: int | None = None) -> Path:
    """A Parquet table of ``files`` files (one Spark partition each): id, f0.., label. ``corrupt``:
    the index of a file whose data pages are overwritten (its footer intact: its task fails)."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    centres = np.array([[2.0] * cols, [-2.0] * cols])
    for i in range(files):
        ids = np.arange(i * rows_per_file, (i + 1) * rows_per_file, dtype=np.int64)
        lab = rng.integers(0, 2, ids.size).astype(np.int32)
        X = centres[lab] + rng.standard_normal((ids.size, cols))
        t = pa.table({"id": ids, **{f"f{j}": X[:, j] for j in range(cols)}, "label": lab})
        pq.write_table(t, path / f"part-{i:05d}.parquet", compression="none")
        if corrupt == i:  # every data page overwritten, the footer kept
            f = path / f"part-{i:05d}.parquet"
            raw = f.read_bytes()
            footer = int.from_bytes(raw[-8:-4], "little")
            f.write_bytes(raw[:4] + b"\xff" * (len(raw) - 12 - footer) + raw[-8 - footer:])
    return path


def submit_cmd(cluster, shipped, app: str | Path, *args: str, conf: dict | None = None) -> list[str]:
    """spark-submit as a user runs it (deploy/standalone/README.md), bound to 127.0.0.1."""
    settings = {
        "spark.pyspark.python": str(shipped.executor_python),
        "spark.pyspark.driver.python": str(shipped.executor_python),
        "spark.driver.host": LOCALHOST,
        "spark.driver.bindAddress": LOCALHOST,
        "spark.ui.enabled": "false",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        # one input file per partition, so partition ids (and the keyed noise) are stable
        "spark.sql.files.maxPartitionBytes": "1m",
        "spark.sql.files.openCostInBytes": "1m",
        **(conf or {}),
    }
    cmd = [os.path.join(spark_home(), "bin", "spark-submit"), "--master", cluster.master_url,
           "--deploy-mode", "client", "--name", "sparkpriv-cluster-test",
           "--properties-file", str(REPO / "deploy" / "standalone" / "spark-defaults.conf"),
           "--py-files", str(shipped.pyfiles)]
    for k, v in settings.items():
        cmd += ["--conf", f"{k}={v}"]
    return cmd + [str(app), *args]


def start_submit(cmd, log: Path, env_extra: dict | None = None) -> subprocess.Popen:
    env = base_env()
    env.update(env_extra or {})
    env["SPARKPRIV_SPARK_LOG_LEVEL"] = "WARN"  # keep TaskSetManager's "Lost task" warnings
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=log.parent, start_new_session=True)


def wait(proc: subprocess.Popen, log: Path, timeout: float = SUBMIT_TIMEOUT) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"spark-submit did not finish in {timeout} s; log tail:\n{tail(log)}")


def tail(log: Path, n: int = 6000) -> str:
    return log.read_text(errors="replace")[-n:]


def run_release(cluster, shipped, cfg: Path, log: Path, env_extra=None, conf=None) -> int:
    proc = start_submit(submit_cmd(cluster, shipped, REPO / "jobs" / "release.py", "--config", str(cfg),
                                   conf=conf), log, env_extra)
    return wait(proc, log)


def wait_for_idle_cluster(cluster, timeout: float = 90.0) -> None:
    """No executor of an earlier application is still running (they exit after their app)."""
    deadline = time.monotonic() + timeout
    while cluster.executor_pids():
        if time.monotonic() > deadline:
            pytest.fail("executors of an earlier application are still running")
        time.sleep(0.3)


def ledger_status(ledger_url: str, table_id: str = TABLE_ID):
    from sparkpriv.ledger import open_ledger

    with open_ledger(ledger_url) as led:
        return led.status(table_id)


def ledger_entries(ledger_url: str, table_id: str = TABLE_ID) -> list[dict]:
    return list(ledger_status(ledger_url, table_id).entries)


def set_budget(ledger_url: str, epsilon: float = 50.0, delta: float = 1e-3) -> None:
    from sparkpriv.ledger import open_ledger

    with open_ledger(ledger_url) as led:
        led.set_budget(TABLE_ID, epsilon=epsilon, delta=delta)


def read_sorted(path: str | Path):
    return pq.read_table(str(path)).to_pandas().sort_values("id").reset_index(drop=True)


# --------------------------------------------------------------------------- shipping


def test_executor_python_has_no_sparkpriv_of_its_own(shipped, tmp_path):
    """Without the shipped zip the executors' interpreter cannot import sparkpriv at all."""
    r = subprocess.run([str(shipped.executor_python), "-c", "import numpy, pyarrow, pyspark; import sparkpriv"],
                       cwd=tmp_path, env=base_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "No module named 'sparkpriv'" in r.stderr, r.stderr


# --------------------------------------------------------------------------- every mechanism

EVERY_RELEASE_APP = Path(__file__).resolve().parent / "every_release_app.py"


@pytest.fixture(scope="module")
def small_table(tmp_path_factory):
    return write_blobs(tmp_path_factory.mktemp("input") / "blobs", files=4, rows_per_file=250)


@dataclass
class EveryRelease:
    root: Path  # one directory per mechanism: nightly.toml, ledger.sqlite, release/
    result: dict  # every_release_app.py's RESULT.json
    log: Path


@pytest.fixture(scope="module")
def every_release(cluster, shipped, small_table, tmp_path_factory) -> EveryRelease:
    """Every mechanism of MECHANISM_OPTIONS released by the job's entry point, in ONE
    spark-submit application of every_release_app.py (its docstring says why), each with its
    own ledger and output directory."""
    root = tmp_path_factory.mktemp("every")
    configs = []
    for mechanism, spec in MECHANISM_OPTIONS.items():
        d = root / mechanism
        d.mkdir()
        ledger = f"sqlite:///{d / 'ledger.sqlite'}"
        set_budget(ledger)
        values = {"input": str(small_table), "output": str(d / "release"), "columns": COLS,
                  "ledger": ledger, "table_id": TABLE_ID, **spec["options"]}
        configs.append(str(write_config(d / "nightly.toml", mechanism,
                                        {k: v for k, v in values.items() if v is not None})))  # None: not its own
    result, log = root / "result.json", root / "submit.log"
    rc = wait(start_submit(submit_cmd(cluster, shipped, EVERY_RELEASE_APP, str(result), *configs), log), log,
              timeout=SUBMIT_TIMEOUT * 3)
    assert rc == 0, tail(log)
    return EveryRelease(root=root, result=json.loads(result.read_text()), log=log)


def test_executors_import_the_shipped_package(cluster, shipped, every_release):
    res = every_release.result
    for file, exe, cwd in res["executors"]:
        # the copy Spark fetched into the executor's working directory, not the repository
        file = os.path.normpath(os.path.join(cwd, file))  # sys.path holds the zip relative to the cwd
        assert file == os.path.join(cwd, "sparkpriv.zip", "sparkpriv", "__init__.py"), file
        assert str(cluster.workdir) in cwd and exe == str(shipped.executor_python)
        assert not file.startswith(str(REPO))
    assert res["driver"].endswith(os.path.join("sparkpriv.zip", "sparkpriv", "__init__.py"))


@pytest.mark.parametrize("mechanism", registered_mechanisms())
def test_release_every_mechanism(every_release, mechanism):
    if mechanism not in MECHANISM_OPTIONS:
        pytest.skip(f"no cluster config for mechanism {mechanism!r}: add its options to "
                    "MECHANISM_OPTIONS in tests/cluster/test_cluster.py")
    spec = MECHANISM_OPTIONS[mechanism]
    d = every_release.root / mechanism
    rc = every_release.result["exit_codes"][str(d / "nightly.toml")]
    assert rc == 0, f"the {mechanism} release exited {rc}; log tail:\n{tail(every_release.log)}"
    ledger = f"sqlite:///{d / 'ledger.sqlite'}"
    out = d / "release"

    receipt = json.loads((out / "_privacy_receipt.json").read_text())
    opts = spec["options"]
    assert receipt["mechanism"] == mechanism
    g = receipt["guarantee"]
    assert 0 < g["epsilon"] <= opts["epsilon"] * (1 + 1e-3)
    assert g["delta"] == opts.get("delta", 0.0)
    events = receipt["events"]
    assert events and "DpEvent" in json.dumps(events)
    assert receipt["insecure_test_seed"] is False

    table = pq.read_table(str(out))
    assert table.num_rows > 0
    if spec["per_row"]:
        ids = np.sort(table.column("id").to_numpy())
        np.testing.assert_array_equal(ids, np.arange(1000))
        assert not set(COLS) & set(table.column_names) or mechanism == "dprp"
        assert "label" not in table.column_names  # never copied unless declared public

    (entry,) = ledger_entries(ledger)
    assert entry["state"] == "committed" and entry["mechanism"] == mechanism
    assert receipt["ledger"]["entry_id"] == entry["id"]
    assert entry["output_path"].rstrip("/").endswith(str(out))


# --------------------------------------------------------------------------- fault tolerance


@pytest.fixture(scope="module")
def big_table(tmp_path_factory):
    # many partitions, so the write job runs long enough to kill something in the middle of it
    return write_blobs(tmp_path_factory.mktemp("input") / "many", files=160, rows_per_file=2000, cols=8,
                       seed=1)


def _fault_config(path: Path, table: Path, out: Path, ledger: str | None) -> Path:
    budget = {"ledger": ledger, "table_id": TABLE_ID} if ledger else {}
    return write_config(path, "projection", {
        "input": str(table), "output": str(out), "columns": [f"f{j}" for j in range(8)], "k": 4,
        "epsilon": 1.0, "row_bound": 10.0, "keep_columns": ["id"], **budget,
    })


SEED = 20261122
FIXED_SEED_APP = Path(__file__).resolve().parent / "fixed_seed_app.py"


def start_fixed_seed_release(cluster, shipped, cfg: Path, log: Path) -> subprocess.Popen:
    """The test app: the release ``cfg`` describes, under insecure_fixed_seed(SEED) (NOT private)."""
    return start_submit(submit_cmd(cluster, shipped, FIXED_SEED_APP, str(cfg), str(SEED)), log)


def assert_not_private(out: Path) -> None:
    receipt = json.loads((out / "_privacy_receipt.json").read_text())
    assert receipt["insecure_test_seed"] is True and receipt["guarantee"]["holds"] is False
    assert receipt["ledger"] is None


@pytest.fixture(scope="module")
def undisturbed(cluster, shipped, big_table, tmp_path_factory):
    d = tmp_path_factory.mktemp("undisturbed")
    cfg = _fault_config(d / "cfg.toml", big_table, d / "release", None)
    log = d / "submit.log"
    rc = wait(start_fixed_seed_release(cluster, shipped, cfg, log), log)
    assert rc == 0, tail(log)
    assert_not_private(d / "release")
    return read_sorted(d / "release")


@pytest.mark.main_leg
def test_killed_python_worker_and_executor_are_retried_with_identical_output(cluster, shipped, big_table,
                                                                            undisturbed, tmp_path):
    """One release, two faults in turn: a Python worker killed in the middle of a task, then an
    executor JVM. The job finishes through task retry with the undisturbed run's output."""
    wait_for_idle_cluster(cluster)
    out = tmp_path / "release"
    cfg = _fault_config(tmp_path / "cfg.toml", big_table, out, None)
    log = tmp_path / "submit.log"
    proc = start_fixed_seed_release(cluster, shipped, cfg, log)
    deadline = time.monotonic() + SUBMIT_TIMEOUT
    killed = {}
    for victim, marker in [("python-worker", "Lost task"), ("executor-jvm", "Lost executor")]:
        killed[victim] = []
        # kill until the driver reports a lost task/executor (a Python worker killed while idle is
        # replaced silently, without a task failure); the write job has 160 tasks, so there is time
        while proc.poll() is None and marker not in log.read_text(errors="replace") and len(killed[victim]) < 5:
            if time.monotonic() > deadline:
                break
            targets = cluster.python_workers()  # the write job is running
            if targets and victim == "executor-jvm":
                targets = cluster.executor_pids()
            if targets:
                os.kill(targets[0], signal.SIGKILL)
                killed[victim].append(targets[0])
                t0 = time.monotonic()
                while proc.poll() is None and marker not in log.read_text(errors="replace") \
                        and time.monotonic() - t0 < 5:
                    time.sleep(0.2)
            else:
                time.sleep(0.1)
        assert killed[victim], f"no {victim} was killed: the job finished first; log tail:\n{tail(log)}"
        assert marker in log.read_text(errors="replace"), \
            f"killing a {victim} caused no {marker!r}; log tail:\n{tail(log)}"
    rc = wait(proc, log)
    assert rc == 0, tail(log)
    got = read_sorted(out)
    assert got.shape == undisturbed.shape
    assert got.equals(undisturbed), "a retried task must redraw exactly the same noise"
    assert_not_private(out)


def test_job_refuses_the_test_seed_variable(cluster, shipped, small_table, tmp_path):
    """A job that inherits SPARKPRIV_INSECURE_TEST_SEED fails before Spark starts; nothing is spent."""
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    set_budget(ledger)
    out = tmp_path / "release"
    cfg = write_config(tmp_path / "nightly.toml", "projection", {
        "input": str(small_table), "output": str(out), "columns": COLS, "ledger": ledger,
        "table_id": TABLE_ID, **MECHANISM_OPTIONS["projection"]["options"],
    })
    log = tmp_path / "submit.log"
    rc = run_release(cluster, shipped, cfg, log, env_extra={"SPARKPRIV_INSECURE_TEST_SEED": str(SEED)})
    text = log.read_text(errors="replace")
    assert rc == 2, tail(log)
    assert "the environment variable SPARKPRIV_INSECURE_TEST_SEED is set" in text
    assert "unset SPARKPRIV_INSECURE_TEST_SEED" in text
    assert "SparkContext" not in text  # refused before a session started
    assert not out.exists()
    assert ledger_entries(ledger) == []


@pytest.mark.main_leg
def test_driver_killed_before_publishing(cluster, shipped, big_table, tmp_path):
    wait_for_idle_cluster(cluster)
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    set_budget(ledger)
    out = tmp_path / "release"
    cfg = _fault_config(tmp_path / "cfg.toml", big_table, out, ledger)
    log = tmp_path / "submit.log"
    proc = start_submit(submit_cmd(cluster, shipped, REPO / "jobs" / "release.py", "--config", str(cfg)), log)
    deadline = time.monotonic() + SUBMIT_TIMEOUT
    # the reservation is made before any data is read; Python workers exist only once the
    # write job runs, which is before the atomic publish (a rename after the job)
    while not cluster.python_workers():
        assert proc.poll() is None, f"the job ended before it could be killed:\n{tail(log)}"
        assert time.monotonic() < deadline, "the write job never started"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # spark-submit and the driver's Python: SIGKILL, no cleanup
    proc.wait(timeout=60)
    assert not out.exists(), "a killed driver must leave nothing at the destination"
    status = ledger_status(ledger)
    (entry,) = status.entries
    assert entry["state"] == "reserved"  # still counted (conservative) ...
    # counted: the spend is this entry's (epsilon 1 at the budget's delta 1e-3, via PLD)
    assert status.spent_epsilon == pytest.approx(entry["epsilon"])
    assert 0.99 < status.spent_epsilon <= 1.0
    assert entry["label"] == "unfinished" and status.unfinished == 1  # ... and shown as unfinished
    # a hard-killed driver cannot delete its staging directory (documented in docs/running.md)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".release.sparkpriv-staging-")]
    assert len(leftovers) <= 1


def test_failed_job_publishes_nothing_and_is_charged(cluster, shipped, tmp_path):
    """A job that fails after its reservation (here a corrupted file) publishes nothing, and its
    reservation stays spent: whether a job fails may depend on the data (docs/privacy.md)."""
    wait_for_idle_cluster(cluster)
    table = write_blobs(tmp_path / "corrupt", files=4, rows_per_file=250, corrupt=3)
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    set_budget(ledger)
    out = tmp_path / "release"
    cfg = write_config(tmp_path / "cfg.toml", "projection", {
        "input": str(table), "output": str(out), "columns": COLS, "k": 2, "epsilon": 1.0,
        "row_bound": 8.0, "ledger": ledger, "table_id": TABLE_ID,
    })
    log = tmp_path / "submit.log"
    rc = run_release(cluster, shipped, cfg, log, conf={"spark.task.maxFailures": "2"})
    text = log.read_text(errors="replace")
    assert rc != 0, tail(log)
    assert "publishing failed" in text or "failed" in text
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".sparkpriv-staging-" in p.name]
    status = ledger_status(ledger)
    (entry,) = status.entries
    assert entry["state"] == "committed" and "failed" in entry["receipt_summary"]  # charged, no output
    assert status.spent_epsilon > 0.0
