"""Fixtures of the ledger tests: a throwaway PostgreSQL server, a fresh ledger per test.

``postgres_url`` (session) starts a real PostgreSQL server from Debian's
binaries (``/usr/lib/postgresql/*/bin``, else ``pg_ctl`` on PATH) in a temp
dir, on a free 127.0.0.1 port, and stops it by its pid at the end, even when
a test or the start-up failed. initdb and postgres refuse to run as root, so
as root they run as the ``postgres`` user (``runuser -u postgres --``). With
``SPARKPRIV_TEST_POSTGRES_URL`` set, that server is used instead. Without
binaries the PostgreSQL tests are skipped, or fail when ``CI=true``
(``.ci/postgres.sh`` installs them).

``ledger_url`` gives each test an empty ledger: a SQLite file in its tmp dir,
or a fresh schema of the PostgreSQL database (through the URL's
``options=-c search_path=...``).
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from urllib.parse import quote

import pytest

POSTGRES_URL_ENV = "SPARKPRIV_TEST_POSTGRES_URL"
_DATABASE = "sparkpriv_test"


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def _postgres_bindir() -> str | None:
    def version(path: str) -> tuple:
        return tuple(int(x) for x in re.findall(r"\d+", path.split("/")[-3]))

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=version)
    if found:
        return os.path.dirname(found[-1])
    on_path = shutil.which("pg_ctl")
    if on_path and os.path.exists(os.path.join(os.path.dirname(on_path), "initdb")):
        return os.path.dirname(on_path)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _stop_server(data_dir: str) -> None:
    """Stop the postmaster of ``data_dir`` by the pid in its postmaster.pid."""
    try:
        with open(os.path.join(data_dir, "postmaster.pid")) as f:
            pid = int(f.readline())
    except (OSError, ValueError):
        return  # never started, or already stopped cleanly
    for sig, wait_s in ((signal.SIGINT, 30.0), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)  # SIGINT: fast shutdown; SIGQUIT: immediate
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.05)


def _server_log(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()[-3000:]
    except OSError:
        return "(no server log)"


@pytest.fixture(scope="session")
def postgres_url(request) -> str:
    """URL of a database on a real PostgreSQL server for this test session."""
    url = os.environ.get(POSTGRES_URL_ENV)
    if url:
        return url
    try:
        import psycopg
    except ImportError:
        _missing("psycopg 3 is not installed (pip install 'sparkpriv[postgres]')")
    bindir = _postgres_bindir()
    if bindir is None:
        _missing(
            "PostgreSQL server binaries not found (no /usr/lib/postgresql/*/bin/pg_ctl and no pg_ctl on "
            f"PATH); run .ci/postgres.sh or set {POSTGRES_URL_ENV}"
        )
    as_user: list[str] = []
    owner = None
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        runuser = shutil.which("runuser")
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            owner = None
        if owner is None or runuser is None:
            _missing("running as root, but there is no 'postgres' user or no runuser to start PostgreSQL as")
        as_user = [runuser, "-u", "postgres", "--"]

    base = tempfile.mkdtemp(prefix="sparkpriv-pg-")
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))  # runs after the stop below
    if owner is not None:
        os.chown(base, owner.pw_uid, owner.pw_gid)
    data, log = os.path.join(base, "data"), os.path.join(base, "server.log")

    def run(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run([*as_user, *cmd], cwd=base, capture_output=True, text=True, timeout=120)

    r = run(os.path.join(bindir, "initdb"), "-D", data, "-U", "sparkpriv", "--auth=trust",
            "--no-locale", "-E", "UTF8", "--no-sync")
    if r.returncode != 0:
        pytest.fail(f"initdb failed ({r.returncode}):\n{r.stdout}\n{r.stderr}", pytrace=False)
    request.addfinalizer(lambda: _stop_server(data))

    for _ in range(3):  # another process may take the free port before the server binds it
        port = _free_port()
        options = (
            f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={base} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        r = run(os.path.join(bindir, "pg_ctl"), "-D", data, "-l", log, "-o", options, "-w", "-t", "60", "start")
        if r.returncode == 0:
            break
        _stop_server(data)
    else:
        pytest.fail(f"PostgreSQL did not start:\n{r.stdout}\n{r.stderr}\n{_server_log(log)}", pytrace=False)

    with psycopg.connect(f"postgresql://sparkpriv@127.0.0.1:{port}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {_DATABASE}")
    return f"postgresql://sparkpriv@127.0.0.1:{port}/{_DATABASE}"


def _with_search_path(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-c search_path={schema}', safe='')}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request, tmp_path) -> str:
    """URL of an empty ledger: a SQLite file, or a fresh schema on the PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.sqlite"
    import psycopg

    base = request.getfixturevalue("postgres_url")
    schema = f"ledger_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")

    def drop() -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f"DROP SCHEMA {schema} CASCADE")

    request.addfinalizer(drop)
    return _with_search_path(base, schema)


#: Processes of the session's racing pool (the races of test_ledger.py and test_stress.py).
RACERS = 16


@pytest.fixture(scope="session")
def racers():
    """16 processes (multiprocessing, forkserver), started once for every race, and a barrier maker.

    The workers are forked from a fresh server process, not from this one, so
    they share no connection or lock with the tests; the server imports the
    ledger and dp_accounting once, before forking, instead of 16 times.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["sparkpriv.ledger", "sparkpriv.ledger.sqlite", "sparkpriv.ledger.events",
                                "sparkpriv.ledger.postgres", "psycopg", "dp_accounting", "tests.ledger.test_stress"])
    with ctx.Manager() as manager, ctx.Pool(RACERS) as pool:
        yield pool, manager
