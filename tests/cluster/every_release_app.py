"""Test app, NOT a sparkpriv job: several job configs released in one application.

``spark-submit ... tests/cluster/every_release_app.py RESULT.json CONFIG.toml [CONFIG.toml ...]``

``test_release_every_mechanism`` releases every registered mechanism on the
standalone cluster. One spark-submit per mechanism spent most of its time
starting a driver JVM, two executor JVMs and their Python workers, so this app
runs all the configs in one application: for each, the entry point of
``jobs/release.py`` (``sparkpriv.cli.main_job(["--config", CONFIG])``, which
refuses fixed seeds and reads the ledger exactly as the job does; the release
commands leave the session open, so the configs share it). The job script
itself is submitted by the other tests in test_cluster.py.

It also asks the executors where they import sparkpriv from (the shipped zip,
``test_executors_import_the_shipped_package``). Everything goes to RESULT.json:
stdout and Spark's stderr log share the submit log, and a buffered print can
be split by a log line written in the middle of it.
"""

import json
import os
import sys

from sparkpriv.cli import main_job
from sparkpriv.spark.session import get_spark


def _where(_):
    import sparkpriv

    yield (sparkpriv.__file__, sys.executable, os.getcwd())


def main(result: str, configs: list[str]) -> None:
    spark = get_spark({})  # the session the job opens for a config without a [spark] section
    import sparkpriv

    out = {"driver": sparkpriv.__file__,
           "executors": spark.sparkContext.parallelize(range(8), 8).mapPartitions(_where).collect(),
           "exit_codes": {}}
    for cfg in configs:
        out["exit_codes"][cfg] = main_job(["--config", cfg])
    with open(result, "w") as f:
        json.dump(out, f)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
