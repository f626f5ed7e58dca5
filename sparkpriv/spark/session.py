"""Getting a SparkSession: the active one, spark-submit's, or a local one."""

from __future__ import annotations

import logging
import os
import sys
from typing import Mapping

__all__ = ["get_spark", "LOCAL_DEFAULTS", "paths_are_local", "local_driver_memory"]

_log = logging.getLogger(__name__)

LOCAL_DEFAULTS = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
    # PySpark 3.5 (Spark without SPARK-54217): a killed task's monitor may destroy a Python worker
    # already back in the reuse pool after this long, failing the next job of a local session
    # (tests/spark/test_pyspark_versions.py)
    "spark.python.task.killTimeout": "30s",
}


def local_driver_memory() -> str:
    """The driver memory of a local session the command line starts: half of this machine's
    memory, at least 1g and at most 8g (in local mode the executors run in the driver's JVM;
    Spark's own default, 1g, runs out on a few hundred thousand rows of k-means features)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "1g"
    return f"{max(1, min(8, int(total / 2**30 / 2)))}g"


def get_spark(conf: Mapping[str, str] | None = None, *, app_name: str = "sparkpriv", master: str | None = None,
              size_local_driver: bool = True):
    """Return the active SparkSession, or create one.

    Under spark-submit (or in a notebook with a running session) the existing
    session is used and ``conf`` is applied where Spark allows it at run time.
    Otherwise a local session (``local[*]`` unless ``master`` says otherwise)
    is created with Arrow enabled, bound to 127.0.0.1, and ``conf`` applied;
    with a local master its driver memory is :func:`local_driver_memory`
    unless ``spark.driver.memory`` or ``SPARK_DRIVER_MEMORY`` says otherwise
    (``size_local_driver=False``: Spark's default). Under spark-submit the
    driver JVM is already running, so no memory setting can change it: the
    log says what the JVM has (:func:`driver_memory_report`), and warns when a
    local driver has less than 2 GiB (``spark-submit --driver-memory``).
    """
    from pyspark.sql import SparkSession

    conf = dict(conf or {})
    active = SparkSession.getActiveSession()
    if active is None and master is None and os.environ.get("SPARK_CONNECT_MODE_ENABLED"):
        active = SparkSession.builder.getOrCreate()
    if active is not None:
        for k, v in conf.items():
            try:
                active.conf.set(k, str(v))
            except Exception:  # static confs cannot change at run time
                _log.warning("Spark setting %s cannot be changed in a running session; ignored", k)
        return active
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    # spark-submit sets spark.master in the JVM conf; only default it for plain python runs.
    if master is not None:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ and "spark.master" not in conf:
        builder = builder.master("local[*]")
    settings = dict(LOCAL_DEFAULTS)
    settings.update({k: str(v) for k, v in conf.items()})
    target = master or settings.get("spark.master") or ("local[*]" if "PYSPARK_GATEWAY_PORT" not in os.environ
                                                         else "")
    if (_runs_on_this_machine(target) and "spark.pyspark.python" not in settings
            and not os.environ.get("PYSPARK_PYTHON")):
        # Spark's Python workers would start whatever `python3` is first on PATH (e.g. the
        # system one, without pyarrow, when sparkpriv runs from an unactivated venv): run
        # them on this interpreter unless the user chose one (PYSPARK_PYTHON or the conf).
        # PySpark reads the worker interpreter from PYSPARK_PYTHON when the context starts.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    jvm_running = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the driver JVM already
    if jvm_running and "spark.driver.memory" in settings:
        _log.warning("spark.driver.memory %s is ignored: under spark-submit the driver JVM is already running; "
                     "give it as spark-submit --driver-memory %s", settings["spark.driver.memory"],
                     settings["spark.driver.memory"])
        del settings["spark.driver.memory"]
    elif (size_local_driver and not jvm_running and str(target).strip().lower().startswith("local")
            and "spark.driver.memory" not in settings and not os.environ.get("SPARK_DRIVER_MEMORY")):
        settings["spark.driver.memory"] = local_driver_memory()
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPARKPRIV_SPARK_LOG_LEVEL", "WARN"))
    level, message = driver_memory_report(spark)
    _log.log(level, "%s", message)
    return spark


MIN_LOCAL_HEAP = 2 << 30  # below this a local driver (which also runs the executors) is warned


def driver_memory_report(spark) -> tuple[int, str]:
    """``(log level, message)``: what the running driver JVM has, as the JVM says it (its max heap),
    and ``spark.driver.memory`` as the context holds it; a WARNING with the fix when a local driver
    (which runs the executors too) has less than 2 GiB."""
    try:
        heap = int(spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory())
        conf = spark.sparkContext.getConf()
        setting = conf.get("spark.driver.memory", None)
        master = conf.get("spark.master", "")
    except Exception:  # Spark Connect: no JVM here
        return logging.DEBUG, "driver memory: not visible from this client (Spark Connect)"
    said = f"spark.driver.memory {setting}" if setting else "spark.driver.memory unset (Spark's default 1g)"
    msg = f"Spark driver JVM: max heap {heap / 2**30:.1f} GiB ({said}; master {master})"
    if master.strip().lower().startswith("local") and heap < MIN_LOCAL_HEAP:
        how = ("spark-submit --driver-memory 8g" if "PYSPARK_GATEWAY_PORT" in os.environ
               else "spark.driver.memory in the [spark] section of the config, or get_spark(conf=...)")
        return logging.WARNING, (msg + f": a local driver runs the executors too and may run out of memory on "
                                 f"large tables; give it more with {how}")
    return logging.INFO, msg


def _runs_on_this_machine(master: str) -> bool:
    """Whether the executors of ``master`` run on this machine (local modes, a
    standalone master on the loopback address), where this interpreter exists."""
    m = master.strip().lower()
    if m.startswith("local"):
        return True
    return m.startswith(("spark://127.0.0.1", "spark://localhost"))


def paths_are_local(conf: Mapping[str, str] | None = None) -> bool:
    """Whether a path without a scheme names a file of this machine in the session that
    :func:`get_spark` ``(conf)`` would start, so that it can be checked before Spark starts.

    True only for a new local session (no running session, not under spark-submit or
    Spark Connect, a ``local`` master) whose default filesystem nothing can change: no
    ``spark.hadoop.fs.default*`` setting, no Hadoop, YARN or Spark configuration
    directory, no ``SPARK_HOME``. False when unsure: Spark then decides, after it starts.
    """
    conf = dict(conf or {})
    if "PYSPARK_GATEWAY_PORT" in os.environ or any(
            os.environ.get(v) for v in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "HADOOP_CONF_DIR",
                                        "YARN_CONF_DIR", "SPARK_CONF_DIR", "SPARK_HOME")):
        return False
    if any(k.startswith("spark.hadoop.fs.default") or k == "spark.remote" for k in conf):
        return False
    if not str(conf.get("spark.master", "local[*]")).strip().lower().startswith("local"):
        return False
    pyspark = sys.modules.get("pyspark.sql")
    if pyspark is not None and pyspark.SparkSession.getActiveSession() is not None:
        return False
    import importlib.util

    try:
        spec = importlib.util.find_spec("pyspark")  # its conf/ directory (spark-defaults.conf, core-site.xml)
    except (ImportError, ValueError):
        spec = None
    for where in (spec.submodule_search_locations or []) if spec is not None else []:
        if os.path.isdir(os.path.join(where, "conf")):
            return False
    return True
