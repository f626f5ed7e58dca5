"""docs/utility.md's "Counting pairs you need" on the suite's pair workload: the recipe (a self-join,
declared pairs, ``bound_keys``, ``release_counts``) on local Spark, its mean relative error against
the true pair counts (docs/research/pairs.md, "The ceiling").

Run from the repository root (about a minute a table on 2 cores)::

    python docs/research/scripts/pairs_counts_recipe.py bms_webview_2 bms_webview_1

The declared pairs are the suite's (chosen by its own DP counts); epsilon 1, delta ``1 / (10 n)``,
replace-one, discrete Gaussian, ``max_keys=32``. A fresh release each run (not a fixed seed).
"""

from __future__ import annotations

import sys

import numpy as np


def main(name: str, max_keys: int = 32, epsilon: float = 1.0) -> float:
    from pyspark.sql import functions as F

    from sparkpriv import release_counts
    from sparkpriv.mechanisms.counts import KeyDomain
    from sparkpriv.spark.counts import bound_keys
    from sparkpriv.spark.session import get_spark
    from suite_tables import table_and_pairs

    X, wl, truth, den = table_and_pairs(name)
    X = X.tocoo()
    n = X.shape[0]
    spark = get_spark(None)
    events = spark.createDataFrame(np.column_stack([X.row, X.col]).astype(int).tolist(), "person long, item long")
    wanted = [(int(a), int(b)) for a, b in wl.pairs]
    domain = KeyDomain.pairs(("item_a", "item_b"), wanted)
    e = events.select("person", "item").distinct()
    pairs = (e.alias("a").join(e.alias("b"), "person").where(F.col("a.item") < F.col("b.item"))
             .select("person", F.col("a.item").alias("item_a"), F.col("b.item").alias("item_b")))
    records = bound_keys(pairs, person="person", domain=domain, max_keys=max_keys)
    rel = release_counts(records, domain=domain, epsilon=epsilon, noise="discrete_gaussian", delta=1 / (10 * n),
                         neighbors="replace-one", clamp=True)
    df = rel.df.toPandas()
    got = {(int(a), int(b)): float(v) for a, b, v in zip(df.item_a, df.item_b, df.noisy_count)}
    est = np.array([got[p] for p in wanted])
    err = float(np.mean(np.abs(est - truth) / den))
    print(f"{name}: {len(wanted)} pairs, epsilon {epsilon:g}, max_keys {max_keys}: noise std "
          f"{rel.uncertainty()['std']:.1f}, mean relative error {err:.3f}")
    return err


if __name__ == "__main__":
    for table in sys.argv[1:] or ["bms_webview_2", "bms_webview_1"]:
        main(table)
