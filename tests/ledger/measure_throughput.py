"""Reserve + commit throughput of this sparkpriv against an earlier one, in one run (one writer).

Not part of the test run (no ``test_`` prefix). Usage::

    PYTHONPATH=$PWD python tests/ledger/measure_throughput.py [--before REF] [--cycles 200] [--repeats 5]

``--before`` is a git revision (default: the merge base with ``main``); its
``sparkpriv`` package is extracted with ``git archive`` into a temporary
directory. Each repeat runs, for each backend (SQLite; PostgreSQL, a
throwaway server started as tests/ledger/conftest.py does, or
``--postgres-url``) and each version (in alternating order), a fresh Python
process on a fresh ledger: it sets a budget, makes 5 warm-up cycles, then
times ``--cycles`` cycles of ``reserve`` (a Gaussian release with a distinct
noise multiplier) followed by ``commit``, through the public API only (so
that both versions run the same calls). Prints every repeat's cycles per
second (and, for a version with a journal, how long ``Ledger.verify`` then
took on it), then per backend the median of each version and their ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CYCLES = r"""
import os, sys, time
from dp_accounting import dp_event as ev
import sparkpriv
from sparkpriv.ledger import open_ledger
url, n, tree = sys.argv[1], int(sys.argv[2]), sys.argv[3]
assert os.path.dirname(os.path.dirname(os.path.abspath(sparkpriv.__file__))) == os.path.abspath(tree), sparkpriv.__file__
with open_ledger(url) as ledger:
    ledger.set_budget("bench.t", epsilon=1e6, delta=1e-6)
    def cycle(i):
        r = ledger.reserve("bench.t", event=ev.GaussianDpEvent(1000.0 + i), mechanism="m", parameters={"i": i},
                           output_path=f"/o/{i}")
        ledger.commit(r.id, output_path=f"/p/{i}", receipt_summary={"epsilon": 0.1, "delta": 1e-6})
    for i in range(5):
        cycle(i)
    t0 = time.perf_counter()
    for i in range(5, 5 + n):
        cycle(i)
    rate = n / (time.perf_counter() - t0)
    verify = getattr(ledger, "verify", None)  # this version's journal: how long checking it takes
    if verify is not None:
        t0 = time.perf_counter()
        report = verify()
        print("verify", report.records, report.ok, time.perf_counter() - t0)
    print(rate)
"""


def extract(ref: str, into: str) -> str:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "sparkpriv"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return into


def rate(tree: str, url: str, cycles: int, workdir: str) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=tree)
    env.pop("SPARKPRIV_LEDGER_KEY_FILE", None)
    # -P and a neutral working directory: `python -c` would otherwise import the sparkpriv of the current
    # directory before the one on PYTHONPATH
    r = subprocess.run([sys.executable, "-P", "-c", CYCLES, url, str(cycles), tree], env=env, cwd=workdir,
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"the benchmark process failed:\n{r.stderr[-3000:]}")
    lines = r.stdout.strip().splitlines()
    verify = [line.split() for line in lines if line.startswith("verify ")]
    note = f"  verify: {verify[0][1]} records in {float(verify[0][3]):.3f} s, ok={verify[0][2]}" if verify else ""
    return float(lines[-1]), note


def start_postgres(base: str) -> tuple[str, str]:
    """A throwaway server (the tests' way); returns its URL and data directory."""
    import psycopg

    from tests.ledger.conftest import _free_port, _postgres_bindir

    bindir = _postgres_bindir()
    if bindir is None:
        raise SystemExit("no PostgreSQL binaries (run .ci/postgres.sh) and no --postgres-url")
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(base, "postgres", "postgres")
    data = os.path.join(base, "data")
    subprocess.run([*as_user, os.path.join(bindir, "initdb"), "-D", data, "-U", "sparkpriv", "--auth=trust",
                    "--no-locale", "-E", "UTF8", "--no-sync"], check=True, capture_output=True, cwd=base)
    port = _free_port()
    options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={base}"
    subprocess.run([*as_user, os.path.join(bindir, "pg_ctl"), "-D", data, "-l", os.path.join(base, "log"), "-o",
                    options, "-w", "start"], check=True, capture_output=True, cwd=base)
    with psycopg.connect(f"postgresql://sparkpriv@127.0.0.1:{port}/postgres", autocommit=True) as conn:
        conn.execute("CREATE DATABASE bench")
    return f"postgresql://sparkpriv@127.0.0.1:{port}/bench", data


def fresh_schema(url: str) -> str:
    import psycopg
    from urllib.parse import quote

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{url}{'&' if '?' in url else '?'}options={quote(f'-c search_path={schema}', safe='')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="git revision to compare with (default: merge base with main)")
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--postgres-url")
    args = parser.parse_args()
    before = args.before or subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], check=True,
                                           capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    work = tempfile.mkdtemp(prefix="sparkpriv-throughput-")
    data = pg_base = None
    try:
        trees = {"before": extract(before, tempfile.mkdtemp(dir=work)), "after": str(ROOT)}
        backends = args.backends.split(",")
        pg = args.postgres_url
        if "postgres" in backends and pg is None:
            pg_base = tempfile.mkdtemp(prefix="sparkpriv-throughput-pg-")  # readable by the postgres user
            pg, data = start_postgres(pg_base)
        print(f"reserve + commit cycles per second, {args.cycles} cycles per process, one writer; before = "
              f"{before[:12]}, after = {head} (working tree); load average {os.getloadavg()[0]:.1f}", flush=True)
        results = {(b, v): [] for b in backends for v in trees}
        for rep in range(args.repeats):
            order = list(trees) if rep % 2 == 0 else list(reversed(trees))
            for backend in backends:
                for version in order:
                    url = (f"sqlite:///{tempfile.mkdtemp(dir=work)}/ledger.sqlite" if backend == "sqlite"
                           else fresh_schema(pg))
                    r, note = rate(trees[version], url, args.cycles, work)
                    results[(backend, version)].append(r)
                    print(f"repeat {rep + 1}  {backend:8s}  {version:6s}  {r:7.1f} /s  (load average "
                          f"{os.getloadavg()[0]:.1f}){note}", flush=True)
        for backend in backends:
            b, a = (statistics.median(results[(backend, v)]) for v in ("before", "after"))
            print(f"{backend:8s}  before median {b:7.1f} /s  after median {a:7.1f} /s  after / before {a / b:.3f}  "
                  f"(before: {', '.join(f'{x:.1f}' for x in results[(backend, 'before')])}; after: "
                  f"{', '.join(f'{x:.1f}' for x in results[(backend, 'after')])})", flush=True)
    finally:
        if data is not None:
            from tests.ledger.conftest import _stop_server

            _stop_server(data)
        shutil.rmtree(work, ignore_errors=True)
        if pg_base is not None:
            shutil.rmtree(pg_base, ignore_errors=True)


if __name__ == "__main__":
    main()
