"""Spark's Python daemon with sparkpriv's worker modules imported before it forks.

Spark starts one daemon per executor (``pyspark.daemon``) and forks a Python
worker from it for each task that finds no idle worker (idle workers are
ended after a minute). A fresh worker then imports sparkpriv's release
modules and loads and self-checks the compiled noise kernels
(:mod:`sparkpriv.privacy._compiled`): about 2 CPU seconds on the development
machine, paid again by every worker of every job after a pause. With

    spark.python.daemon.module = sparkpriv.spark.daemon

the daemon does that once, and every forked worker starts with it done. Only
public code is loaded (no secret, no data); a failure to preload is logged to
the daemon's stderr and the daemon runs as usual.
"""

from __future__ import annotations

import sys


def preload() -> None:
    """Import the modules a release's Python tasks use, and load the compiled kernels."""
    try:
        import pyarrow.parquet  # noqa: F401

        import sparkpriv.mechanisms.dprp  # noqa: F401
        import sparkpriv.mechanisms.kmeans  # noqa: F401
        import sparkpriv.mechanisms.projection  # noqa: F401
        import sparkpriv.spark.engine  # noqa: F401
        import sparkpriv.spark.parquet_scan  # noqa: F401
        from sparkpriv.privacy import _compiled

        _compiled.kernels()
    except Exception as exc:  # never stop Spark's daemon: workers import what they need themselves
        print(f"sparkpriv.spark.daemon: preloading failed ({type(exc).__name__}: {exc})", file=sys.stderr)


if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager

    manager()
