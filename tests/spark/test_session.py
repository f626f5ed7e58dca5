"""Sessions started by sparkpriv run their Python workers on sparkpriv's interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sparkpriv.spark.session import _runs_on_this_machine

_PROBE = r"""
import json, os, sys
from sparkpriv.spark.session import get_spark
spark = get_spark(master="local[1]")
exe = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable).collect()[0]
print(json.dumps({"driver": sys.executable, "worker": exe, "env": os.environ.get("PYSPARK_PYTHON")}))
spark.stop()
"""


def _probe(extra_env):
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    # no virtual environment on PATH: a bare `python3` would be the system one
    env["PATH"] = "/usr/bin:/bin"
    env.update(extra_env)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_local_session_workers_use_this_interpreter():
    got = _probe({})
    assert os.path.realpath(got["worker"]) == os.path.realpath(got["driver"])
    assert got["env"] == got["driver"]


@pytest.mark.slow
def test_the_users_choice_of_worker_python_is_kept():
    chosen = os.path.realpath(sys.executable)  # another spelling of this interpreter
    got = _probe({"PYSPARK_PYTHON": chosen})
    assert got["env"] == chosen  # kept as the user set it


def test_which_masters_run_here():
    assert _runs_on_this_machine("local[2]") and _runs_on_this_machine("local-cluster[2,1,1024]")
    assert _runs_on_this_machine("spark://127.0.0.1:7077")
    assert not _runs_on_this_machine("spark://spark-master:7077") and not _runs_on_this_machine("yarn")


_MEMORY_PROBE = r"""
import json
from sparkpriv.spark.session import get_spark
spark = get_spark(master="local[1]")  # the default sizes a local driver, as the command line does
print(json.dumps({"memory": spark.sparkContext.getConf().get("spark.driver.memory"),
                  "max_heap": spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()}))
spark.stop()
"""


def test_local_driver_memory_is_half_the_machine_within_bounds():
    from sparkpriv.spark.session import local_driver_memory

    total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    got = local_driver_memory()
    assert got.endswith("g") and int(got[:-1]) == max(1, min(8, int(total_gib / 2)))


@pytest.mark.slow
def test_the_command_lines_local_session_gets_that_memory():
    """Spark's own 1g default ran out of heap caching k-means features of 300,000 rows."""
    from sparkpriv.spark.session import local_driver_memory

    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_DRIVER_MEMORY",)}
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE], env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["memory"] == local_driver_memory()
    assert got["max_heap"] > 0.8 * int(got["memory"][:-1]) * 2**30  # the JVM was started with it


class _Conf(dict):
    def get(self, k, default=None):
        return dict.get(self, k, default)


class _FakeSpark:
    """What driver_memory_report reads of a session: the context's conf and the JVM's max heap."""

    def __init__(self, conf, heap):
        runtime = type("R", (), {"maxMemory": lambda self: heap})()
        jvm = type("J", (), {})()
        jvm.java = type("j", (), {})()
        jvm.java.lang = type("l", (), {})()
        jvm.java.lang.Runtime = type("RT", (), {"getRuntime": staticmethod(lambda: runtime)})
        self.sparkContext = type("SC", (), {"_jvm": jvm, "getConf": lambda self: _Conf(conf)})()


@pytest.mark.parametrize("submit", [False, True])
def test_the_memory_message_says_what_the_jvm_has(monkeypatch, submit):
    import logging

    from sparkpriv.spark.session import driver_memory_report

    if submit:
        monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    else:
        monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    level, msg = driver_memory_report(_FakeSpark({"spark.master": "local[*]"}, 1 << 30))
    assert level == logging.WARNING and "max heap 1.0 GiB" in msg and "spark.driver.memory unset" in msg
    assert ("spark-submit --driver-memory" in msg) == submit
    level, msg = driver_memory_report(_FakeSpark({"spark.master": "local[2]", "spark.driver.memory": "8g"}, 8 << 30))
    assert level == logging.INFO and "max heap 8.0 GiB (spark.driver.memory 8g" in msg
    level, msg = driver_memory_report(_FakeSpark({"spark.master": "yarn"}, 1 << 30))
    assert level == logging.INFO  # executors elsewhere: their memory is theirs


def test_a_memory_setting_under_spark_submit_is_not_claimed(monkeypatch, caplog):
    """Under spark-submit the JVM is already running: a spark.driver.memory in the config is ignored
    with a WARNING naming --driver-memory, and never logged as if it applied."""
    import pyspark.sql

    from sparkpriv.spark import session

    class Builder:
        def appName(self, n):
            return self

        def master(self, m):
            return self

        def config(self, k, v):
            assert k != "spark.driver.memory", "a memory setting was passed to a running JVM"
            return self

        def getOrCreate(self):
            return _FakeSpark({"spark.master": "local[*]"}, 1 << 30)

    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    monkeypatch.setattr(pyspark.sql.SparkSession, "builder", Builder())
    monkeypatch.setattr(pyspark.sql.SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.setattr(_FakeSpark, "sparkContext", None, raising=False)
    fake = _FakeSpark({"spark.master": "local[*]"}, 1 << 30)
    fake.sparkContext.setLogLevel = lambda level: None
    Builder.getOrCreate = lambda self: fake
    caplog.set_level("INFO", logger="sparkpriv.spark.session")
    session.get_spark({"spark.driver.memory": "8g"})
    text = caplog.text
    assert "spark.driver.memory 8g is ignored" in text and "--driver-memory 8g" in text
    assert "max heap 1.0 GiB" in text
