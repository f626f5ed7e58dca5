"""A DP-SGD test model whose per-example gradient is the record itself.

The auditor (and the tests of the clip) then control every gradient norm
directly; shared by tests/audit/test_dpsgd*.py and tests/mechanisms/test_quantile_clip.py.
"""

import numpy as np

from sparkpriv.mechanisms import dpsgd


class Identity:
    """Loss ``-<theta, x>`` up to sign: the per-example gradient is the record (``dim`` columns)."""

    def __init__(self, dim: int):
        self.dim = dim

    def clipped_sum(self, X, theta, clip, rng=None):
        sq = np.einsum("ij,ij->i", X, X)
        f = dpsgd.clip_factors(sq, clip)
        return f @ X, sq

    def init_state(self, rng, theta=None):
        return None

    def model_term(self, theta, state, rng, clip=None):
        return 0.0, state
