"""Shared fixtures: one session-scoped local[2,2] Spark session for every Spark test."""

from __future__ import annotations

import os

from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
# The driver JVMs of the tests (this session's, and every `sparkpriv` command and spark-submit a
# test starts, which inherit the environment) compile with C1 only and collect with the serial
# collector: they are short-lived and work on small tables, where C2's compiler threads and the
# parallel collector's threads cost more CPU than they save (measured on 2 cores: a quarter less
# CPU time for test_cli.py, two files of tests/spark and tests/contract). Tests never assert timings; a value set by the
# user is kept. Not used outside the tests.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    from sparkpriv.spark.session import LOCAL_DEFAULTS

    s = (
        # two attempts per task, as on a cluster (spark.task.maxFailures): on PySpark 3.5 a task
        # can fail once with "Socket is closed" after an earlier job failed (Spark's SPARK-54217)
        SparkSession.builder.master("local[2,2]")
        .appName("sparkpriv-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.python.task.killTimeout", LOCAL_DEFAULTS["spark.python.task.killTimeout"])
        .getOrCreate()
    )
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


@pytest.fixture
def test_seed():
    """Make secrets deterministic for one test (insecure_fixed_seed: NOT private, tests only).

    The n-th secret drawn for ``purpose`` is ``derive_seed(12345, f"{purpose}#{n}")``.
    """
    from sparkpriv.privacy.random import insecure_fixed_seed

    with insecure_fixed_seed(12345) as seed:
        yield seed


SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def shared_dataset(*parts: str) -> Path:
    """The path of a real dataset of ``../shared/datasets`` (beside the repository), or skip the test
    with a message naming the folder: a fresh clone has no ``../shared``; CI, which has it, runs them all."""
    path = SHARED_DATASETS.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs the real datasets folder ../shared/datasets ({path} is absent): CI has it beside "
                    "the clone; see README.md, 'Tests'")
    return path
