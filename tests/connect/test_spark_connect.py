"""Releases under Spark Connect (issue 7).

The test suite starts a local Spark Connect server (the ``SparkConnectServer``
class of the connect jar that the pyspark package ships) bound to 127.0.0.1
on a free port, and drives it from a ``SparkSession.builder.remote(...)``
client in this process. A Connect client has no SparkContext, no RDDs and no
JVM: the library must work through DataFrame operations only, and publishes to
local paths (see docs/running.md, "Spark Connect").

Skipped, with the reason, when the Connect client's dependencies (grpcio,
grpcio-status, googleapis-common-protos, zstandard: ``pip install
'pyspark[connect]'``, part of the ``test`` extra) are missing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = [pytest.mark.cluster]

LOCALHOST = "127.0.0.1"
START_TIMEOUT = 180.0
TABLE_ID = "test.connect_blobs"
COLS = ["f0", "f1", "f2", "f3"]

# Options per mechanism for a release under Connect (mechanisms without an entry are skipped).
MECHANISM_OPTIONS = {
    "projection": {"k": 2, "epsilon": 1.0, "row_bound": 8.0, "keep_columns": ["id"]},
    "dprp": {"epsilon": 2.0, "delta": 1e-5, "lower": [-6.0], "upper": [6.0], "keep_columns": ["id"]},
    "kmeans": {"k": 2, "epsilon": 2.0, "delta": 1e-5, "iterations": 2, "variant": "linear", "row_bound": 8.0},
    "dpgm": {"epsilon": 4.0, "delta": 1e-5, "k": 2, "sampling_rate": 0.2, "epochs": 1, "hidden": 3, "chains": 10,
             "kmeans_iterations": 2},
    "regression": {"columns": ["f0", "f1", "f2"], "target": "f3", "row_bound": 8.0, "epsilon": 1.0,
                   "target_lower": -8.0, "target_upper": 8.0,
                   "delta": 1e-5},
    # event-table releases: each row an event of person ``id`` at key ``label``
    "counts": {"epsilon": 1.0, "events": True, "person_col": "id", "item_col": "label", "vocabulary": "0..1",
               "max_items": 1},
    "synthetic": {"epsilon": 2.0, "delta": 1e-5, "events": True, "person_col": "id", "item_col": "label",
                  "vocabulary": "0..1", "max_items": "auto"},
    "aggregates": {"epsilon": 1.0, "person": "id", "by": "label", "domain": "label=0..1",
                   "aggregates": "count_distinct, count, mean(f0), median(f0)", "bounds": "f0=-10:10", "max_keys": 1,
                   "max_events_per_key": 1},
}


def _registered():
    from sparkpriv.runner import MECHANISMS

    return sorted(MECHANISMS)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((LOCALHOST, port)) == 0


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    try:
        import inspect

        from pyspark.sql.connect.utils import check_dependencies

        # PySpark 3.5 takes the calling module's name, 4.x nothing
        check_dependencies(*[__name__][:len(inspect.signature(check_dependencies).parameters)])
    except Exception as exc:  # ImportError or PySparkImportError
        pytest.skip(f"Spark Connect client dependencies missing ({exc}); pip install 'pyspark[connect]'")
    import pyspark

    home = os.path.dirname(os.path.abspath(pyspark.__file__))
    jars = os.listdir(os.path.join(home, "jars"))
    if not any(j.startswith("spark-connect_") for j in jars):
        pytest.skip("this pyspark installation has no spark-connect jar: cannot start a Connect server")
    port = _free_port()
    work = tmp_path_factory.mktemp("connect-server")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_CONNECT_MODE_ENABLED",
                                                             "SPARK_REMOTE", "SPARK_CONF_DIR")}
    env.update(SPARK_HOME=home, SPARK_LOCAL_IP=LOCALHOST, SPARK_CONNECT_MODE="0")
    cmd = [os.path.join(home, "bin", "spark-submit"),
           "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
           "--master", "local[2]", "--name", "sparkpriv-connect-test",
           "--conf", f"spark.connect.grpc.binding.address={LOCALHOST}",
           "--conf", f"spark.connect.grpc.binding.port={port}",
           "--conf", f"spark.driver.host={LOCALHOST}", "--conf", f"spark.driver.bindAddress={LOCALHOST}",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
           "--conf", "spark.driver.memory=1g", "--conf", "spark.sql.session.timeZone=UTC"]
    log = work / "server.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=work, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Spark Connect server did not start:\n{log.read_text(errors='replace')[-4000:]}")
            time.sleep(0.5)
        yield f"sc://{LOCALHOST}:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the process group we started, by id
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


@pytest.fixture(scope="module")
def remote(connect_url):
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    s = RemoteSession.builder.remote(connect_url).getOrCreate()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("connect-input") / "blobs"
    path.mkdir()
    rng = np.random.default_rng(3)
    for i in range(3):
        ids = np.arange(i * 200, (i + 1) * 200, dtype=np.int64)
        lab = rng.integers(0, 2, ids.size)
        X = np.where(lab[:, None] == 1, 2.0, -2.0) + rng.standard_normal((ids.size, 4))
        pq.write_table(pa.table({"id": ids, **{c: X[:, j] for j, c in enumerate(COLS)},
                                 "label": lab.astype(np.int32)}),  # the key of the event-table releases
                       path / f"part-{i}.parquet")
    return path


def test_the_session_is_a_connect_session(remote):
    assert type(remote).__module__.startswith("pyspark.sql.connect")
    with pytest.raises(Exception):
        remote.sparkContext  # noqa: B018 - Connect has no SparkContext


def test_release_projection_and_write_under_connect(remote, table, tmp_path):
    from sparkpriv import release_projection
    from sparkpriv.ledger import open_ledger

    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    with open_ledger(ledger) as led:
        led.set_budget(TABLE_ID, epsilon=10.0, delta=0.0)
    df = remote.read.parquet(str(table))
    # row_bound_quantile exercises sum_partials (tree aggregation without df.rdd)
    rel = release_projection(df, columns=COLS, k=2, epsilon=1.0, row_bound_quantile=0.9,
                             keep_columns=["id"], ledger=ledger, table_id=TABLE_ID, source=str(table))
    out = tmp_path / "release"
    path = rel.write(str(out))
    assert path == "file:" + str(out)
    receipt = json.loads((out / "_privacy_receipt.json").read_text())
    assert receipt["mechanism"] == "projection" and receipt["guarantee"]["epsilon"] == pytest.approx(1.0)
    assert receipt["mechanism_details"]["row_bound_estimation"]["chosen_row_bound"] > 0
    got = pq.read_table(str(out))
    assert sorted(got.column_names) == ["id", "z0", "z1"]
    np.testing.assert_array_equal(np.sort(got.column("id").to_numpy()), np.arange(600))
    md = pq.read_metadata(str(out / "_common_metadata")).metadata
    assert json.loads(md[b"sparkpriv.receipt"])["ledger"]["entry_id"] == receipt["ledger"]["entry_id"]
    with open_ledger(ledger) as led:
        (entry,) = led.status(TABLE_ID).entries
    assert entry["state"] == "committed"


def test_failed_write_under_connect_keeps_the_reservation(remote, tmp_path):
    from sparkpriv import release_projection
    from sparkpriv.ledger import open_ledger

    path = tmp_path / "corrupt"
    path.mkdir()
    X = np.ones((50, 4))
    pq.write_table(pa.table({"id": np.arange(50), **{c: X[:, j] for j, c in enumerate(COLS)}}),
                   path / "part-0.parquet", compression="none")
    raw = (path / "part-0.parquet").read_bytes()  # every data page corrupted, footer intact: the task fails
    footer = int.from_bytes(raw[-8:-4], "little")
    (path / "part-0.parquet").write_bytes(raw[:4] + b"\xff" * (len(raw) - 12 - footer) + raw[-8 - footer:])
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    with open_ledger(ledger) as led:
        led.set_budget(TABLE_ID, epsilon=10.0, delta=0.0)
    rel = release_projection(remote.read.parquet(str(path)), columns=COLS, k=2, epsilon=1.0, row_bound=2.0,
                             ledger=ledger, table_id=TABLE_ID)
    out = tmp_path / "release"
    with pytest.raises(Exception):
        rel.write(str(out))
    assert not out.exists() and not [p for p in tmp_path.iterdir() if "sparkpriv-staging" in p.name]
    with open_ledger(ledger) as led:
        (entry,) = led.status(TABLE_ID).entries
    assert entry["state"] == "reserved"  # counted: a failed publish never gives the budget back


@pytest.mark.parametrize("mechanism", _registered())
def test_every_mechanism_runs_under_connect(remote, table, tmp_path, mechanism, monkeypatch):
    """The same run_release the CLI and jobs/release.py use, on a Connect session."""
    if mechanism not in MECHANISM_OPTIONS:
        pytest.skip(f"no Connect config for mechanism {mechanism!r}: add it to MECHANISM_OPTIONS in "
                    "tests/connect/test_spark_connect.py")
    # as in a Connect client process (SparkSession.builder.remote sets it): pyspark.sql.functions then
    # build Connect columns; this test process also runs a classic session, so the fixture cannot set it
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    from sparkpriv.config import build_config
    from sparkpriv.runner import options_for, run_release

    out = tmp_path / "release"
    values = {"input": str(table), "output": str(out), "columns": ",".join(COLS)}
    for k, v in MECHANISM_OPTIONS[mechanism].items():
        values[k] = ",".join(map(str, v)) if isinstance(v, list) else str(v)
    cfg = build_config(mechanism, options_for(mechanism), None, values, source="test")
    res = run_release(cfg, spark=remote)
    assert res.output == "file:" + str(out)
    receipt = json.loads(Path(out, "_privacy_receipt.json").read_text())
    assert receipt["mechanism"] == mechanism
    assert 0 < receipt["guarantee"]["epsilon"] <= MECHANISM_OPTIONS[mechanism]["epsilon"] * (1 + 1e-3)
    assert pq.read_table(str(out)).num_rows > 0
