"""Test app, NOT a sparkpriv job: the release a config file describes, made with a fixed seed.

``spark-submit ... tests/cluster/fixed_seed_app.py CONFIG.toml SEED``

The fault tests in test_cluster.py compare a release disturbed by killed
workers with an undisturbed one, so both runs must draw the same secrets. Only
a fixed seed set explicitly in code gives that (``jobs/release.py`` and the
CLI refuse fixed seeds), so this app opens
``sparkpriv.privacy.random.insecure_fixed_seed`` around the same steps the job
runs: read the input, call the mechanism's registered release function,
publish. Secrets are drawn on the driver (this process); the executors'
Python workers only receive them inside the pickled task functions. The
release is NOT private and its config must not name a ledger or table id (the
ledger refuses a fixed-seed release).
"""

import sys

from sparkpriv.config import build_config, load_toml
from sparkpriv.io.inputs import read_table
from sparkpriv.privacy.random import insecure_fixed_seed
from sparkpriv.runner import MECHANISMS, options_for
from sparkpriv.spark.session import get_spark


def main(config: str, seed: int) -> None:
    values = load_toml(config)
    mechanism = values.pop("mechanism")
    cfg = build_config(mechanism, options_for(mechanism), values, {})
    spark = get_spark(cfg.spark)
    try:
        df = read_table(spark, cfg.get("input"), cfg.get("input_format"))
        with insecure_fixed_seed(seed):
            release = MECHANISMS[mechanism].release(df, cfg, cfg.get("input"))
            release.write(cfg.get("output"), overwrite=bool(cfg.get("overwrite")), writer=cfg.get("writer"))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
