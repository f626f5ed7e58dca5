"""Time one reservation on a table with N recorded releases of distinct Gaussian events.

Not part of the test run (no ``test_`` prefix). Usage::

    PYTHONPATH=$PWD python tests/ledger/measure_reserve.py [N ...]

The history is written straight into a fresh SQLite ledger (one committed
entry per event, noise multipliers drawn uniformly in [200, 400) with a fixed
seed, so that 10,000 of them still fit a budget of 10 at delta 1e-6). Prints,
per N: the wall and CPU time of ``reserve`` (the first one in the process, so
every stored event is parsed), the longest time a write transaction
(the database's write lock on SQLite) was held during it, and the time of a
second reserve in the same process (events parsed before are memoized). Works against older
sparkpriv versions too (it uses only ``open_ledger``, ``reserve`` and
``_transaction``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time

import numpy as np
from dp_accounting import dp_event as ev

from sparkpriv.ledger import open_ledger
from sparkpriv.privacy.accounting import events_to_json

TABLE = "bench.distinct"


def measure(url: str, n: int) -> tuple[float, ...]:
    zs = np.random.default_rng(n).uniform(200.0, 400.0, size=n)
    with open_ledger(url) as ledger:
        ledger.set_budget(TABLE, epsilon=10.0, delta=1e-6)
        with ledger._transaction(write=True) as tx:
            for i, z in enumerate(zs):
                tx.execute(
                    "INSERT INTO sparkpriv_releases (id, table_id, state, mechanism, parameters, events, epsilon, "
                    "epsilon_delta, output_path, created_at, host, pid) VALUES (?, ?, 'committed', 'm', '{}', ?, "
                    "0.01, 1e-6, '/o', ?, 'h', 1)",
                    (f"e{i:06d}", TABLE, events_to_json(ev.GaussianDpEvent(float(z))), f"2024-{i:06d}"))
        ledger._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # not the bulk load's checkpoint in the timing
        held = []
        original = ledger._transaction

        @contextlib.contextmanager
        def timed(*, write):
            t0 = time.perf_counter()
            try:
                with original(write=write) as tx:
                    yield tx
            finally:
                if write:
                    held.append(time.perf_counter() - t0)

        ledger._transaction = timed
        t0, c0 = time.perf_counter(), time.process_time()
        res = ledger.reserve(TABLE, event=ev.GaussianDpEvent(300.0), mechanism="m", parameters={}, output_path="/o")
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        t0, c0 = time.perf_counter(), time.process_time()  # a second one: parsed events are memoized
        ledger.reserve(TABLE, event=ev.GaussianDpEvent(301.0), mechanism="m", parameters={}, output_path="/o")
        wall2, cpu2 = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, max(held), res.epsilon_spent_after, wall2, cpu2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[10, 1000, 10000])
    args = parser.parse_args()
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{os.path.join(tmp, 'ledger.sqlite')}"
            wall, cpu, held, spent, wall2, cpu2 = measure(url, n)
        print(f"N={n:6d}  reserve {wall:8.3f} s (CPU {cpu:8.3f} s)  longest write transaction {held:8.3f} s  "
              f"spent after {spent:.6f}  next reserve {wall2:8.3f} s (CPU {cpu2:8.3f} s)  "
              f"(load average {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
