"""A Python worker that cannot import pyarrow gives a one-line error, not a Java trace."""

from __future__ import annotations

import os
import stat
import subprocess
import sys


BLOCKER = '''
import importlib.abc, sys
class _NoPyarrow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ModuleNotFoundError("No module named 'pyarrow'", name="pyarrow")
        return None
sys.meta_path.insert(0, _NoPyarrow())
'''


def test_worker_without_pyarrow_gives_one_line(tmp_path):
    """The workers run an interpreter (PYSPARK_PYTHON, the user's choice) that lacks pyarrow:
    the CLI's last line says which module and what to do, and stderr has no Java trace."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    wrapper = tmp_path / "python-without-pyarrow"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={site}:$PYTHONPATH exec {sys.executable} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    data = tmp_path / "t.csv"
    data.write_text("a,b\n" + "".join(f"{i % 7},{i % 3}\n" for i in range(200)))
    env = dict(os.environ, PYSPARK_PYTHON=str(wrapper), SPARK_LOCAL_IP="127.0.0.1")
    env.pop("SPARKPRIV_SPARK_LOG_LEVEL", None)
    r = subprocess.run([sys.executable, "-m", "sparkpriv.cli", "release", "projection", "--input", str(data),
                        "--output", str(tmp_path / "out"), "--columns", "a,b", "--k", "2",
                        "--epsilon", "1", "--row-bound", "10"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("sparkpriv: error: Spark's Python workers cannot import 'pyarrow'"), r.stderr[-2000:]
    assert str(wrapper) in last
    assert "at org.apache" not in r.stderr and "Py4JJavaError" not in r.stderr
    assert not (tmp_path / "out").exists()
