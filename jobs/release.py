"""spark-submit entry point: ``spark-submit jobs/release.py --config nightly.toml``.

The config file names the mechanism (``mechanism = "projection"``) and holds
the same options as ``sparkpriv release <mechanism>``; extra command-line
options after ``--config`` override it. Exit codes as the CLI: 0 ok, 2 bad
arguments or input, 3 budget refused, 1 other failure.
"""

import sys

from sparkpriv.cli import main_job

if __name__ == "__main__":
    sys.exit(main_job(sys.argv[1:]))
