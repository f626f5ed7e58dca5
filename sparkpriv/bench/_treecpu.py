"""The benchmarks' meter of their own processes' CPU-seconds (:class:`TreeCpu`).

Standard library only, and self-contained: a peer's script in another virtual environment runs this
file's text as it is (:func:`sparkpriv.bench._timing.run_peer`).
"""

import os
import threading

__all__ = ["TreeCpu"]


def _proc_stats() -> dict | None:
    """``{pid: (ppid, start time, own CPU ticks)}`` of every process, from ``/proc/<pid>/stat``: the
    user + system time of the process itself (its ended threads included, its children not)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    out = {}
    for n in names:
        if not n.isdigit():
            continue
        try:
            with open(f"/proc/{n}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # the process ended meanwhile
            continue
        # fields after the name: state ppid ... utime(11) stime(12) ... starttime(19)
        out[int(n)] = (int(rest[1]), int(rest[19]), int(rest[11]) + int(rest[12]))
    return out


class TreeCpu:
    """CPU-seconds (user + system) of process ``root`` (default: this one) and its descendants
    during a ``with`` block, processes that end inside it included: here the driver, its JVM and
    the JVM's Python workers; other processes on the machine are not counted.

    Summing the live tree's cumulative times (own and reaped children's) at both ends of the block
    loses a process that ends without a parent in the tree waiting for it, with all the CPU it ever
    used: PySpark's worker daemon ignores SIGCHLD, so the kernel reaps its Python workers without
    adding their times to any parent (getrusage(2)), and the JVM stops workers idle for a minute
    (at 10 M people the non-private query runs for minutes without them). So a thread samples the
    tree every ``interval`` seconds, and each process, keyed by (pid, start time), counts its own
    time from its first sample (0 for a process started inside the block) to its last: only what
    a process spends in its last ``interval`` before it ends is lost (an idle worker stopped by the
    JVM spends nothing then). ``seconds``: the figure after the block; None where ``/proc`` cannot
    be read. Stdlib only: the peers' processes run the same code (:func:`run_peer`).
    """

    def __init__(self, root=None, interval=1.0):
        self.root = os.getpid() if root is None else root
        self.interval = interval
        self.seconds = None
        self._first, self._last = {}, {}
        self._readable = True
        self._stop = threading.Event()
        self._thread = None

    def _sample(self, initial=False):
        stats = _proc_stats()
        if stats is None:
            self._readable = False
            return
        kids = {}
        for pid, (ppid, _, _) in stats.items():
            kids.setdefault(ppid, []).append(pid)
        todo = [self.root]
        while todo:
            pid = todo.pop()
            if pid in stats:
                _, start, ticks = stats[pid]
                key = (pid, start)
                if key not in self._first:
                    self._first[key] = ticks if initial else 0
                self._last[key] = ticks
            todo.extend(kids.get(pid, ()))

    def _run(self):
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self):
        self._sample(initial=True)
        self._thread = threading.Thread(target=self._run, name="tree-cpu", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()
        if self._readable:
            ticks = sum(self._last[k] - self._first[k] for k in self._last)
            self.seconds = ticks / os.sysconf("SC_CLK_TCK")
        return False
