"""Audit of DP counts per key (sparkpriv.mechanisms.counts).

The release is the vector of per-key totals of the whole domain plus integer
noise on the calibration's grid (``noise_integers``, drawn once on the driver
as ``finalize_counts`` draws it; the float table is post-processing of the
lattice value ``count + g N``, checked exactly in
tests/mechanisms/test_counts.py). The totals of both inputs are made by the
core itself: each person's raw events go through the bounding
(``sparse.cap_items``: at most ``L`` keys, keyed choice; events capped at
``c``) and ``count_keys``.

Worst-case neighbours (the auditor's own choice; the brute-force search of
test_counts.py shows nothing larger exists):

* add-remove: ``D'`` = ``D`` plus one person with MORE than ``L`` keys and
  more than ``c`` events at each, which the bounding reduces to ``L`` keys at
  ``c``: the totals move by ``c`` on ``L`` keys (L1 ``L c``, L2 ``c sqrt(L)``);
* replace-one: one person with ``L`` keys at ``c`` events replaced by one
  with ``L`` other keys (L1 ``2 L c``, L2 ``c sqrt(2 L)``).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparkpriv.mechanisms import counts as C
from sparkpriv.mechanisms.sparse import ItemCap, cap_items, dedupe_rows, sparse_rows_from_lists
from sparkpriv.privacy.random import stream

from ._audit import (N_GAUSS, N_LAPLACE, check, gaussian_game, gaussian_step_claim, laplace_game,
                     weaken_noise)

pytestmark = pytest.mark.audit

D_KEYS = 8
L = 2
EPS = 1.0
DELTA = 1e-3
KEY = 0x0A0D17  # the keyed choice's key (any key: the guarantee holds for every key)
BASE = [[0, 1], [1, 2, 2, 2], [5], [0, 5, 6], []]  # other people's raw events (key indices)


def totals(people: list[list[int]], cap: ItemCap) -> np.ndarray:
    """Per-key totals of people's raw events through the core's bounding and count_keys."""
    off, idx = sparse_rows_from_lists(people)
    off, idx, cnt = dedupe_rows(off, idx)
    ph = np.arange(len(people), dtype=np.int64) * 7919 + 1  # public person hashes
    off, idx, vals, _ = cap_items(off, idx, cnt if cap.weights == "counts" else None, ph, cap, KEY)
    return C.count_keys(off, idx, vals, D_KEYS)


def neighbours(relation: str, c: int | None):
    cap = ItemCap(L, "binary" if c is None else "counts", c)
    many = (c or 1) + 3  # events at each key, above the cap
    if relation == "add-remove":
        added = [k for k in (3, 4, 7) for _ in range(many)]  # 3 keys > L: the bounding keeps 2
        return totals(BASE, cap), totals(BASE + [added], cap)
    x = [k for k in (3, 4) for _ in range(many)]
    xp = [k for k in (6, 7) for _ in range(many)]
    return totals(BASE + [x], cap), totals(BASE + [xp], cap)


def released_integers(plan, t: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` trials of the released lattice integers ``t / g + N`` (one noise draw per key and trial)."""
    g = plan.noise.grid
    u = np.rint(t / g).astype(np.int64)
    assert np.array_equal(u * g, t)  # integer totals sit on the grid
    N = C.noise_integers(plan, stream(seed, 0), size=n * D_KEYS).reshape(n, D_KEYS)
    return u + N


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("c", [None, 3], ids=["people", "events-capped"])
@pytest.mark.parametrize("relation", C.NEIGHBORS)
def test_counts_laplace(relation, c, control, monkeypatch):
    if control:
        weaken_noise(monkeypatch)
    plan = C.plan_counts(C.CountsParams(epsilon=EPS, max_keys=L, max_events_per_key=c, neighbors=relation),
                         D_KEYS)
    t_d, t_dp = neighbours(relation, c)
    diff = np.abs(t_d - t_dp)
    assert diff.sum() == plan.sensitivity["l1"]  # the pair attains the sensitivity
    g = plan.noise.grid
    u, up = np.rint(t_d / g).astype(np.int64), np.rint(t_dp / g).astype(np.int64)
    I_d = released_integers(plan, t_d, N_LAPLACE, 101)
    I_dp = released_integers(plan, t_dp, N_LAPLACE, 102)
    res = laplace_game(f"counts, discrete Laplace, {relation}, {'c=3' if c else 'people'}", I_d, I_dp, u, up, EPS,
                       control=control)
    if not control:
        assert plan.epsilon <= EPS
    check(res)


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("c", [None, 3], ids=["people", "events-capped"])
@pytest.mark.parametrize("relation", C.NEIGHBORS)
def test_counts_gaussian(relation, c, control, monkeypatch):
    params = C.CountsParams(epsilon=EPS, max_keys=L, max_events_per_key=c, neighbors=relation,
                            noise="discrete_gaussian", delta=DELTA)
    eps_claim, mu_claim = gaussian_step_claim(C.plan_counts(params, D_KEYS).dp_event(), DELTA)
    if control:  # the claim stays the real mechanism's; the noise is cut
        weaken_noise(monkeypatch)
    plan = C.plan_counts(params, D_KEYS)
    t_d, t_dp = neighbours(relation, c)
    assert np.linalg.norm(t_d - t_dp) == pytest.approx(plan.sensitivity["l2"])
    g = plan.noise.grid
    u, up = np.rint(t_d / g).astype(np.int64), np.rint(t_dp / g).astype(np.int64)
    I_d = released_integers(plan, t_d, N_GAUSS, 201)
    I_dp = released_integers(plan, t_dp, N_GAUSS, 202)
    res = gaussian_game(f"counts, discrete Gaussian, {relation}, {'c=3' if c else 'people'}", I_d, I_dp, u, up,
                        plan.noise.sigma, eps_claim, DELTA, mu_claim, control=control)
    if not control:
        assert eps_claim <= EPS
    check(res)
