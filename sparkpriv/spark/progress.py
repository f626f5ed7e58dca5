"""Progress of a long Spark pass: completed / total tasks, polled from the driver.

:class:`TaskProgress` is a context manager around any code that runs Spark jobs
(the event bounding pass, DP-SGD training, synthesis): while it is open, the
jobs started from this thread carry a job tag, and a daemon thread on the
driver polls ``SparkContext.statusTracker()`` for the tagged jobs' stages and
reports ``report(what, i, n, message)`` at most once per ``interval`` seconds,
when the count changed.

The total ``n`` never moves within a line of progress. A pass is several
Spark jobs and stages whose task counts are only known as each starts (the
adaptive planner splits a query into jobs at run time), so a sum over the
stages seen so far would grow as it goes (``3/16``, then ``11/37``): instead
each step reports the tasks of the stage that runs now (``Spark stage 2 of
the pass``), whose count is fixed when it starts. A caller that knows the
pass's units declares them (``units=("clusters trained", k)``, with a counter
its tasks add 1 to per unit done, e.g. a Spark accumulator): the steps are
then ``i/k`` of those units from start to end. When nothing changes for
``heartbeat`` seconds (one long task), the step is repeated with the time
since the pass started, so a log never goes quiet for long.

On a normal exit it makes a final ``i == n`` step; when the body raises, no
final step is made and the error goes through unchanged. The thread is
stopped and joined on exit in both cases, and a failure of the polling itself
(a stopped context, a lost gateway) only ends the polling.

Only task counts are read (public: the plan's shape, not the data); the tag
names the pass, never a secret. Under Spark Connect (no ``SparkContext``) it
does nothing.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Callable

__all__ = ["TaskProgress"]

_log = logging.getLogger(__name__)
_tags = itertools.count(1)


class TaskProgress:
    """Report the task progress of the Spark jobs run inside the ``with`` block.

    Parameters
    ----------
    spark : SparkSession
        The session running the jobs (Spark Connect: the context does nothing).
    what : str
        The pass, as the steps name it (``"event bounding"``).
    report : callable or None
        ``report(what, i, n, message)``: a :class:`~sparkpriv.mechanisms.protocol.Progress`'s
        ``step`` or a progress bar; None: the context does nothing.
    interval : float
        Seconds between polls (and so at most one step per interval).
    units : (str, int, counter) or None
        ``(label, total, counter)``: report ``counter.value`` (clamped to
        ``total``) out of ``total`` units named ``label`` instead of tasks;
        ``counter`` is anything with a ``value`` the driver can read (a Spark
        accumulator the tasks add to).
    heartbeat : float
        Seconds without a change after which the last step is repeated with
        the time elapsed.
    """

    def __init__(self, spark, what: str, report: Callable | None, *, interval: float = 1.0,
                 units: tuple | None = None, heartbeat: float = 60.0):
        self.what, self.report, self.interval = what, report, float(interval)
        self.sc = _context(spark) if report is not None else None
        self.tag = f"sparkpriv-progress-{next(_tags)}"
        self.units = units
        self.heartbeat = float(heartbeat)
        self.done = self.total = 0
        self.stage = 0  # ordinal of the running stage in this pass (1, 2, ...)
        self._stage_ids: list[int] = []
        self.steps = 0
        self._stop = threading.Event()
        self._thread = None
        self._last = None
        self._start = self._changed_at = time.monotonic()

    def __enter__(self) -> "TaskProgress":
        if self.sc is None:
            return self
        try:
            self.sc.addJobTag(self.tag)
        except Exception:  # an older API or a stopped context: no progress
            _log.debug("no Spark job tag; progress off", exc_info=True)
            self.sc = None
            return self
        self._thread = threading.Thread(target=self._poll, name=f"sparkpriv {self.what} progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.sc is None:
            return False
        self._stop.set()
        self._thread.join()
        try:
            self.sc.removeJobTag(self.tag)
        except Exception:
            _log.debug("could not remove the Spark job tag", exc_info=True)
        if exc_type is None:
            try:
                self._poll_once()
            except Exception:
                _log.debug("Spark status polling failed", exc_info=True)
            n = max(self.total, 1)
            self._step(n, n)
        return False

    # ------------------------------------------------------------------ the driver thread

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                changed = self._poll_once()
            except Exception:  # the context went away: stop polling, the body reports its own error
                _log.debug("Spark status polling stopped", exc_info=True)
                return
            now = time.monotonic()
            if changed and self.total:
                self._changed_at = now
                self._step(min(self.done, self.total), self.total)
            elif self._last is not None and now - self._changed_at >= self.heartbeat:
                self._changed_at = now
                self._step(*self._last, again=f"still running, {now - self._start:.0f} s since the pass started")

    def _poll_once(self) -> bool:
        """Read the counts; True when the reported ``(done, total)`` changed."""
        if self.units is not None:
            _, total, counter = self.units
            done, total = min(int(counter.value), int(total)), int(total)
        else:
            done, total = self._running_stage()
        changed = (done, total) != (self.done, self.total)
        self.done, self.total = done, total
        return changed

    def _running_stage(self) -> tuple[int, int]:
        """``(completed, tasks)`` of the newest stage of the tagged jobs that has tasks (the one that
        runs now, or the last one that ran): its task count is fixed when it starts."""
        tracker = self.sc.statusTracker()
        stages = {}
        for job in self._job_ids():
            info = tracker.getJobInfo(job)
            if info is None:
                continue
            for sid in info.stageIds:
                st = tracker.getStageInfo(sid)
                if st is not None and st.numTasks > 0 and (st.numActiveTasks or st.numCompletedTasks):
                    stages[int(sid)] = (int(st.numCompletedTasks), int(st.numTasks))
        if not stages:
            return self.done, self.total
        sid = max(stages)
        if sid not in self._stage_ids:
            self._stage_ids.append(sid)
            self.stage = len(self._stage_ids)
        return stages[sid]

    def _job_ids(self):
        # the Scala tracker has getJobIdsForTag (3.5+); PySpark's wrapper only the group one
        return list(self.sc._jsc.sc().statusTracker().getJobIdsForTag(self.tag))

    def _message(self) -> str:
        if self.units is not None:
            return self.units[0]
        return f"Spark tasks of stage {max(self.stage, 1)} of the pass"

    def _step(self, i: int, n: int, again: str | None = None) -> None:
        if again is None and self._last == (i, n):
            return
        self._last = (i, n)
        self.steps += 1
        message = self._message() + (f" ({again})" if again else "")
        try:
            self.report(self.what, int(i), int(n), message)
        except Exception:  # a broken progress display must not fail the release
            _log.debug("progress report failed", exc_info=True)


def _context(spark):
    """The session's SparkContext, or None (Spark Connect)."""
    try:
        return spark.sparkContext
    except Exception:
        return None
