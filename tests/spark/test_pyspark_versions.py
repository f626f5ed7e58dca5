"""The same code on PySpark 3.5 and 4.x (docs/running.md, "Supported versions").

CI runs this directory on both (``.ci/run``, ``.ci/pyspark35.sh``). The test
here is about a difference between them that sparkpriv must absorb: in
PySpark 3.5 (Spark without SPARK-54217), when a job fails while other tasks of it still run
(which a release's input error does: one partition has an undeclared label, the
others are being read), the Python worker of a killed task can go
back to the pool of reusable workers and be destroyed
``spark.python.task.killTimeout`` later by the killed task's monitor. The
next job's task that picked it up fails with ``java.net.SocketException:
Socket is closed``; a cluster retries the task, a local session (no task
retries) fails the job. So a user who fixes the input and runs the release
again in the same session saw a second, unrelated failure. Sessions started
by sparkpriv (``get_spark``) give the monitor more time than a killed task of
theirs needs to end (``LOCAL_DEFAULTS``), so it does not destroy a released
worker unless a killed task takes longer than that. (The shared test session
also allows two attempts per task, as a cluster does; this test starts its
own session without them.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import sys
from sparkpriv import get_spark, release_dprp
from sparkpriv.errors import InputError

out = sys.argv[1]
spark = get_spark(master="local[2]")
spark.sparkContext.setLogLevel("FATAL")
df = spark.createDataFrame([(1.0, 2.0, 0), (0.5, 3.0, 7)], "a double, b double, y int").repartition(2)
kw = dict(columns=["a", "b"], label="y", labels="private", epsilon=1.0, delta=1e-5, lower=0.0, upper=3.0)
try:
    release_dprp(df, classes=[0, 1], **kw).write(out + "/first")
except InputError as exc:
    print("first release refused:", exc)
else:
    sys.exit("the undeclared class was not refused")
# the user declares every class and runs the release again, in the same session
release_dprp(df, classes=[0, 1, 7], **kw).write(out + "/second")
print("second release written")
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.slow
def test_release_after_a_failed_release_in_the_same_local_session(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    r = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "first release refused: the label column 'y' holds a value that is not a declared class" in r.stdout
    assert "second release written" in r.stdout
    assert (tmp_path / "second" / "_SUCCESS").is_file()
    assert not (tmp_path / "first").exists()
