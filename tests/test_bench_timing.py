"""The benchmarks' own-process CPU-seconds (sparkpriv.bench._timing.TreeCpu) count processes that
end during the measured block, also when no process of the tree waits for them.

PySpark's worker daemon ignores SIGCHLD, so the kernel reaps its Python workers without adding
their times to any parent; the JVM stops workers idle for a minute. A helper process here does the
same: one worker burns CPU before the block and more inside it, then ends; a second worker starts
and ends inside the block. The reference is each worker's own ``time.process_time()``. Summing the
live tree at both ends of the block (the former method) gives about 0.7 - 1.3 < 0 here.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from sparkpriv.bench._timing import TreeCpu

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")

_HELPER = r'''
import os, signal, sys, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # as PySpark's daemon: ended children reaped unseen
go = []
signal.signal(signal.SIGUSR1, lambda *a: go.append(1))

def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass

def wait_go():
    while not go:
        time.sleep(0.005)

def child(before, inside):
    pid = os.fork()
    if pid:
        return pid
    burn(before)
    print("ready", os.getpid(), flush=True)
    if before:
        wait_go()
    c0 = time.process_time()
    burn(inside)
    print("done", time.process_time() - c0, flush=True)
    os._exit(0)

child(0.6, 0.4)          # works before the block, then inside it, then ends
wait_go()
child(0.0, 0.3)          # starts and ends inside the block
while True:
    time.sleep(1)
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_tree_cpu_counts_workers_that_end_unwaited():
    helper = subprocess.Popen([sys.executable, "-c", _HELPER], stdout=subprocess.PIPE, text=True)
    try:
        first = helper.stdout.readline().split()
        assert first[0] == "ready"
        worker = int(first[1])
        with TreeCpu(root=helper.pid, interval=0.02) as own:
            os.kill(helper.pid, signal.SIGUSR1)
            os.kill(worker, signal.SIGUSR1)
            lines = [helper.stdout.readline().split() for _ in range(3)]  # ready (2nd), done, done
            done = [float(x[1]) for x in lines if x[0] == "done"]
            second = next(int(x[1]) for x in lines if x[0] == "ready")
            deadline = time.monotonic() + 30
            while (_alive(worker) or _alive(second)) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not _alive(worker) and not _alive(second)
        assert len(done) == 2
        # the workers' work inside the block (about 0.7 s), within /proc's 10 ms ticks and the last
        # sampling interval of each ended worker; the idle helper adds next to nothing
        assert own.seconds == pytest.approx(sum(done), abs=0.1)
    finally:
        helper.kill()
        helper.wait()


def test_tree_cpu_counts_this_process():
    with TreeCpu(interval=0.05) as own:
        c0 = time.process_time()
        while time.process_time() - c0 < 0.3:
            pass
        mine = time.process_time() - c0
    assert mine - 0.03 <= own.seconds <= mine + 0.2  # the sampling thread's own work counts too


def test_the_meter_runs_alone_as_a_peer_script_runs_it():
    """A peer's script (another virtual environment, no sparkpriv) gets bench/_treecpu.py's text as it
    is: it must need nothing but the standard library, and measure there as here."""
    from pathlib import Path

    from sparkpriv.bench import _timing, _treecpu

    text = Path(_treecpu.__file__).read_text()
    ns = {"__name__": "peer"}
    exec(compile(text, "peer-meter", "exec"), ns)  # noqa: S102 - the benchmark's own file
    with ns["TreeCpu"](interval=0.05) as own:
        c0 = time.process_time()
        while time.process_time() - c0 < 0.2:
            pass
        mine = time.process_time() - c0
    assert mine - 0.03 <= own.seconds <= mine + 0.2
    head, tail = _timing.PEER_COMMON.split("\nquery(args", 1)
    compile(head + text + "\ndef query(src, out):\n    pass\n" + "\nquery(args" + tail, "peer", "exec")
    imports = [ln for ln in text.splitlines() if ln.startswith(("import ", "from "))]
    assert imports == ["import os", "import threading"]
