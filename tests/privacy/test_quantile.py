import numpy as np
import pytest

from sparkpriv.errors import ParameterError
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.quantile import candidate_bounds, choose_bound, histogram_noise, norm_bucket_counts


def test_bucket_counts_against_loop():
    c = candidate_bounds((-2, 3))
    norms = np.array([0.1, 0.25, 0.26, 1.0, 7.9, 8.0, 8.01, 100.0])
    got = norm_bucket_counts(norms, c)
    want = np.zeros(c.size + 1)
    for v in norms:
        j = next((i for i, e in enumerate(c) if v <= e), c.size)
        want[j] += 1
    np.testing.assert_array_equal(got, want)


def test_choose_bound_quantiles():
    c = candidate_bounds((0, 4))  # 1, 2, 4, 8, 16
    counts = np.array([10.0, 0, 80, 9, 1, 0])
    assert choose_bound(counts, c, 0.5) == 4.0
    assert choose_bound(counts, c, 0.95) == 8.0
    assert choose_bound(counts, c, 1.0) == 16.0
    assert choose_bound(np.zeros(6), c, 0.5) == 16.0


def test_histogram_noise_is_pure_dp_with_histogram_sensitivity():
    n = histogram_noise(epsilon=0.2, neighbors="replace-one", buckets=42)
    assert n.sensitivity == 2.0
    assert epsilon_of(n.dp_event(), 0.0) == pytest.approx(0.2, rel=1e-9)
    assert histogram_noise(epsilon=0.2, neighbors="add-remove", buckets=42).sensitivity == 1.0


def test_bad_range():
    with pytest.raises(ParameterError):
        candidate_bounds((3, 1))
