"""Exact sensitivities against brute force on small matrices."""

import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

from sparkpriv.privacy.sensitivity import (
    box_l1_sensitivity,
    l1_sensitivity,
    l2_sensitivity,
    norm_2_to_1,
)


def _brute_2_to_1(P):
    k = P.shape[1]
    return max(np.linalg.norm(P @ np.array(s)) for s in itertools.product([-1.0, 1.0], repeat=k))


@pytest.mark.parametrize("d,k", [(3, 2), (10, 3), (7, 7), (20, 5)])
def test_2_to_1_norm_matches_brute_force_and_sampled_sup(d, k):
    rng = np.random.default_rng(d * 100 + k)
    P = rng.standard_normal((d, k)) / np.sqrt(k)
    val, exact = norm_2_to_1(P)
    assert exact
    assert val == pytest.approx(_brute_2_to_1(P), rel=1e-12)
    # it is the sup over the unit L2 ball: no sampled unit vector exceeds it,
    # and the maximizing direction attains it
    V = rng.standard_normal((20000, d))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    assert np.abs(V @ P).sum(axis=1).max() <= val * (1 + 1e-12)
    best_s = max(itertools.product([-1.0, 1.0], repeat=k), key=lambda s: np.linalg.norm(P @ np.array(s)))
    v = P @ np.array(best_s)
    v /= np.linalg.norm(v)
    assert np.abs(v @ P).sum() == pytest.approx(val, rel=1e-12)


def test_2_to_1_bound_above_20():
    rng = np.random.default_rng(0)
    P = rng.standard_normal((30, 24)) / np.sqrt(24)
    val, exact = norm_2_to_1(P)
    assert not exact
    assert val == pytest.approx(np.sqrt(24) * np.linalg.norm(P, 2))


def test_l1_radius_is_max_row_l1():
    rng = np.random.default_rng(1)
    P = rng.standard_normal((6, 4))
    s, _ = l1_sensitivity(P, l1_radius=2.0)
    # brute force: vertices of the cross-polytope +-2 e_i
    assert s == pytest.approx(max(np.abs(2.0 * P[i]).sum() for i in range(6)))


def test_box_sensitivity_is_exact_lp_sup():
    rng = np.random.default_rng(2)
    d, k = 5, 3
    P = rng.standard_normal((d, k))
    w = rng.uniform(0.5, 2.0, size=d)
    val, exact = box_l1_sensitivity(P, w)
    assert exact
    # independent: for each sign pattern s of the output, maximize <v, P s> over the box by LP
    best = 0.0
    for s in itertools.product([-1.0, 1.0], repeat=k):
        c = -(P @ np.array(s))
        r = linprog(c, bounds=list(zip(-w, w)))
        best = max(best, -r.fun)
    assert val == pytest.approx(best, rel=1e-9)


def test_combined_constraints_take_the_smaller():
    rng = np.random.default_rng(3)
    P = rng.standard_normal((4, 3))
    a, _ = l1_sensitivity(P, l2_radius=1.0)
    b, _ = l1_sensitivity(P, box_widths=np.full(4, 10.0))
    c, _ = l1_sensitivity(P, l2_radius=1.0, box_widths=np.full(4, 10.0))
    assert c == min(a, b)


def test_l2_sensitivities():
    rng = np.random.default_rng(4)
    P = rng.standard_normal((8, 3))
    s, _ = l2_sensitivity(P, l2_radius=2.0)
    assert s == pytest.approx(2.0 * np.linalg.svd(P, compute_uv=False)[0])
    e, _ = l2_sensitivity(P, element_widths=np.full(8, 0.5))
    assert e == pytest.approx(0.5 * np.linalg.norm(P, axis=1).max())


def test_element_wise_is_max_row_l1_times_bound():
    rng = np.random.default_rng(5)
    P = rng.standard_normal((5, 2))
    s, label = l1_sensitivity(P, element_widths=np.full(5, 3.0))
    assert s == pytest.approx(3.0 * np.abs(P).sum(axis=1).max())
    assert "element" in label
