"""spark-submit entry point: ``spark-submit jobs/release.py --config nightly.toml``.

The config file names the mechanism (``mechanism = "projection"``) and holds
the same options as ``sparkpriv release <mechanism>``; extra command-line
options after ``--config`` override it. Exit codes as the CLI: 0 ok, 2 bad
arguments or input, 3 budget refused, 1 other failure.

The job refuses to run (exit 2, before Spark starts) while the environment
variable ``SPARKPRIV_INSECURE_TEST_SEED`` is set: unset it. Fixed seeds are for
tests only and make a release NOT private.
"""

import sys

from sparkpriv.cli import main_job

if __name__ == "__main__":
    sys.exit(main_job(sys.argv[1:]))
