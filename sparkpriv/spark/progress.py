"""Progress of a long Spark pass: completed / total tasks, polled from the driver.

:class:`TaskProgress` is a context manager around any code that runs Spark jobs
(the event bounding pass, DP-SGD training, synthesis): while it is open, the
jobs started from this thread carry a job tag, and a daemon thread on the
driver polls ``SparkContext.statusTracker()`` for the tagged jobs' stages and
reports ``report(what, completed tasks, total tasks, message)`` at most once
per ``interval`` seconds, when the count changed. On a normal exit it makes a
final ``i == n`` step; when the body raises, no final step is made and the
error goes through unchanged. The thread is stopped and joined on exit in
both cases, and a failure of the polling itself (a stopped context, a lost
gateway) only ends the polling.

Only task counts are read (public: the plan's shape, not the data); the tag
names the pass, never a secret. Under Spark Connect (no ``SparkContext``) it
does nothing.
"""

from __future__ import annotations

import itertools
import logging
import threading
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
    """

    def __init__(self, spark, what: str, report: Callable | None, *, interval: float = 1.0):
        self.what, self.report, self.interval = what, report, float(interval)
        self.sc = _context(spark) if report is not None else None
        self.tag = f"sparkpriv-progress-{next(_tags)}"
        self.done = self.total = 0
        self.steps = 0
        self._stop = threading.Event()
        self._thread = None
        self._last = None

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
            self._poll_once()
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
            if changed and self.total:
                self._step(min(self.done, self.total), self.total)

    def _poll_once(self) -> bool:
        tracker = self.sc.statusTracker()
        done = total = 0
        for job in self._job_ids():
            info = tracker.getJobInfo(job)
            if info is None:
                continue
            for stage in info.stageIds:
                s = tracker.getStageInfo(stage)
                if s is not None:
                    done += s.numCompletedTasks
                    total += s.numTasks
        changed = (done, total) != (self.done, self.total)
        self.done, self.total = done, max(total, self.total)
        return changed

    def _job_ids(self):
        # the Scala tracker has getJobIdsForTag (3.5+); PySpark's wrapper only the group one
        return list(self.sc._jsc.sc().statusTracker().getJobIdsForTag(self.tag))

    def _step(self, i: int, n: int) -> None:
        if self._last == (i, n):
            return
        self._last = (i, n)
        self.steps += 1
        try:
            self.report(self.what, int(i), int(n), "Spark tasks")
        except Exception:  # a broken progress display must not fail the release
            _log.debug("progress report failed", exc_info=True)


def _context(spark):
    """The session's SparkContext, or None (Spark Connect)."""
    try:
        return spark.sparkContext
    except Exception:
        return None
