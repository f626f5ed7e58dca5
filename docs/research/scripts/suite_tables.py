"""The utility suite's real tables and pair workload, for the study scripts of this folder (run them
from the repository root: ``python docs/research/scripts/<script>.py``)."""

from __future__ import annotations

import numpy as np


def table_and_pairs(name: str):
    """``(X, workload, truth, den)``: the table's 0/1 csr matrix, the suite's workload for it (the same
    queries and pairs as ``sparkpriv bench utility``), the true pair counts and the error's
    denominators ``max(truth, 0.001 n)``."""
    from sparkpriv.bench.utility import _seed
    from sparkpriv.bench.utility_data import load_table
    from sparkpriv.bench.utility_workloads import make_workload

    X = load_table(name).X.tocsr()
    X.data[:] = 1
    wl = make_workload(X, seed=_seed("workload", name) % 2**31, n_queries=1000, n_pairs=1000)
    truth = wl.truth["pairs"].astype(float)
    return X, wl, truth, np.maximum(truth, 0.001 * X.shape[0])
