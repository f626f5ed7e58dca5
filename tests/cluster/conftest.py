"""A real Spark standalone cluster on 127.0.0.1, and the package shipped to it.

Session fixtures:

* ``shipped``: the sparkpriv wheel built once from the working tree by
  ``deploy/standalone/build_package.sh`` (``pip wheel --no-deps``), also as
  ``sparkpriv.zip`` for ``--py-files``
  (PySpark puts only ``.zip``/``.egg``/``.jar`` py-files on the executors'
  ``sys.path``), and an *executor interpreter* without sparkpriv: a virtual
  environment that sees the dependency stack (numpy, pyarrow, pyspark, ...) of
  the interpreter running the tests through a plain ``.pth`` path line, but
  not the editable install of sparkpriv (a ``.pth`` path line does not process
  the ``.pth`` files of the directory it adds, and the editable install is
  such a ``.pth`` import hook). This models a cluster node whose image has the
  dependencies but not our package; the only way executors get sparkpriv is
  the shipped zip, which ``test_executors_import_the_shipped_package`` proves.
* ``cluster``: one master and two workers (1 core, 1 GiB each), each a separate
  JVM started with ``spark-class`` from the pip-installed pyspark, bound to
  127.0.0.1 on free ports. The fixture waits until the master's JSON status
  lists both workers ALIVE and stops everything it started, by process id
  (process groups it created), in a finalizer that runs even when tests fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCALHOST = "127.0.0.1"
START_TIMEOUT = 120.0  # seconds for the master and both workers to come up (slow shared CI)


def spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


def base_env() -> dict:
    """Environment for every JVM and driver we start: loopback only, no PYTHONPATH leaks."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYSPARK_PYTHON",
                                                             "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR")}
    env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP=LOCALHOST, SPARK_LOCAL_HOSTNAME="localhost",
               PYTHONNOUSERSITE="1", PYARROW_IGNORE_TIMEZONE="1")
    return env


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        if ppid == pid:
            out.append(int(d))
    return out


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for c in children(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_group(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Stop a process we started in its own session: SIGTERM its group, then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=timeout)


@dataclass
class Shipped:
    wheel: Path
    pyfiles: Path  # the wheel as a .zip, for --py-files
    executor_python: Path  # an interpreter that has the dependencies but NOT sparkpriv


@dataclass
class Cluster:
    master_url: str
    webui: int
    workdir: Path
    procs: dict = field(default_factory=dict)  # name -> Popen (master, worker-0, worker-1)

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://{LOCALHOST}:{self.webui}/json/", timeout=5) as r:
            return json.load(r)

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")
        except OSError:
            return 0

    def worker_pids(self) -> list[int]:
        return [p.pid for n, p in sorted(self.procs.items()) if n.startswith("worker")]

    def executor_pids(self) -> list[int]:
        """Executor JVMs: children of the worker JVMs running CoarseGrainedExecutorBackend."""
        return [c for w in self.worker_pids() for c in descendants(w)
                if "CoarseGrainedExecutorBackend" in cmdline(c)]

    def python_workers(self) -> list[int]:
        """PySpark python workers forked by the executors' pyspark.daemon (not the daemons)."""
        out = []
        for e in self.executor_pids():
            for d in children(e):
                if "pyspark.daemon" in cmdline(d):
                    out.extend(c for c in children(d) if "pyspark.daemon" in cmdline(c))
        return out


@pytest.fixture(scope="session")
def shipped(tmp_path_factory) -> Shipped:
    """Build the wheel once from the working tree and an executor interpreter without sparkpriv."""
    root = tmp_path_factory.mktemp("shipped")
    dist = root / "dist"
    # the documented build (deploy/standalone/build_package.sh): wheel + the same wheel as a .zip
    r = subprocess.run(["bash", str(REPO / "deploy" / "standalone" / "build_package.sh"), str(dist)],
                       env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{r.stdout}\n{r.stderr}")
    (wheel,) = dist.glob("sparkpriv-*.whl")
    pyfiles = dist / "sparkpriv.zip"

    venv = root / "executor-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    import site as _site
    import sysconfig

    # the dependencies of this interpreter (its purelib, and the system site-packages a
    # --system-site-packages venv sees); .pth files there are not run, so an editable
    # sparkpriv install stays invisible to the executors
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], *_site.getsitepackages()])
    Path(site, "_cluster_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    return Shipped(wheel=wheel, pyfiles=pyfiles, executor_python=py)


def _master_ports(c: Cluster, log: Path) -> tuple[str, int]:
    """The master's URL and web UI port as its log states them once it has bound both."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        url = re.search(r"Starting Spark master at (spark://\S+)", text)
        ui = re.search(r"Successfully started service '?MasterUI'? on port (\d+)", text)
        if url and ui:
            return url.group(1), int(ui.group(1))
        if c.procs["master"].poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the standalone master did not start:\n{text[-3000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """A standalone master and two workers on 127.0.0.1; yields a :class:`Cluster`."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java: the cluster tests need Java 17+")
    work = tmp_path_factory.mktemp("standalone")
    home = spark_home()
    spark_class = os.path.join(home, "bin", "spark-class")
    port, webui = free_port(), free_port()
    c = Cluster(master_url=f"spark://{LOCALHOST}:{port}", webui=webui, workdir=work)
    env = base_env()
    env["SPARK_NO_DAEMONIZE"] = "1"
    env["SPARK_WORKER_DIR"] = str(work / "work")
    env["SPARK_DAEMON_MEMORY"] = "512m"

    def start(name, args):
        log = open(work / f"{name}.log", "wb")
        c.procs[name] = subprocess.Popen([spark_class, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=work)
        log.close()

    try:
        start("master", ["org.apache.spark.deploy.master.Master", "--host", LOCALHOST, "--port", str(port),
                         "--webui-port", str(webui)])
        # Spark moves a port that was taken meanwhile up by one: use the ports the master reports
        c.master_url, c.webui = _master_ports(c, work / "master.log")
        for i in range(2):
            (work / f"work-{i}").mkdir()
            start(f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", c.master_url, "--host", LOCALHOST,
                                  "--port", str(free_port()), "--cores", "1", "--memory", "1g",
                                  "--webui-port", str(free_port()), "--work-dir", str(work / f"work-{i}")])
        deadline = time.monotonic() + START_TIMEOUT
        while c.alive_workers() < 2:
            dead = [n for n, p in c.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {n}.log ---\n{(work / f'{n}.log').read_text(errors='replace')[-3000:]}"
                                 for n in c.procs)
                pytest.fail(f"the standalone cluster did not come up ({'exited: ' + ', '.join(dead) if dead else 'timeout'}):\n{logs}")
            time.sleep(0.5)
        yield c
    finally:
        # workers first (they stop their executors), then the master; by process group id
        for name in sorted(c.procs, reverse=True):
            stop_group(c.procs[name])
