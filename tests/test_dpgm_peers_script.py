"""docs/research/scripts/dpgm_peers.py: argument parsing and the protocol helpers, without the
peer packages (smartnoise-synth, mbi); the peer runs themselves are skipped
unless those are installed (docs/research/dpgm.md, "Peers: MST, AIM, MWEM")."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tests.scripts import load_script


@pytest.fixture(scope="module")
def peers():
    return load_script("dpgm_peers")


def test_arguments(peers):
    a = peers.parse_args([])
    assert (a.people, a.max_items, a.delta, a.queries, a.seed) == (20000, 32, 1e-5, 1000, 7)
    assert a.epsilons == [0.5, 1.0, 2.0, 4.0] and a.peers == ["mst", "aim", "mwem"]
    a = peers.parse_args(["--people", "300", "--epsilons", "1", "--peers", "mst", "aim"])
    assert (a.people, a.epsilons, a.peers) == (300, [1.0], ["mst", "aim"])
    for bad in (["--peers", "gan"], ["--epsilons", "0"], ["--delta", "1"], ["--people", "1"], ["--mwem-split", "0"]):
        with pytest.raises(SystemExit):
            peers.parse_args(bad)


def test_protocol_is_dpgm_utility_protocol(peers):
    from sparkpriv.mechanisms.counting_queries import draw_queries

    src, X, qs, true = peers.protocol(300, 4, 7, 50)
    assert X.shape == src.shape == (300, 1303)
    assert X.sum(1).max() <= 4 and np.all(X <= src)
    ref = draw_queries(1303, max_length=int(src.sum(1).max()), n_queries=50, groups=5, seed=7)
    np.testing.assert_array_equal(qs.matrix, ref.matrix)
    # truth: people of the UNCAPPED table who visited any tower of each query, counted directly
    direct = np.array([np.sum(src[:, qs.matrix[:, j] > 0].any(1)) for j in range(qs.size)])
    np.testing.assert_array_equal(true, direct)
    exact = peers.score(true, src, qs, 300)
    assert exact["all"] == 0.0
    empty = peers.score(true, np.zeros((150, 1303)), qs, 300)
    # the empty release answers 0: error 1 wherever q(D) >= 0.001 n (always here but for q(D) = 0)
    assert empty["all"] == pytest.approx(np.mean(true > 0))
    assert sorted(k for k in exact if k != "all") == [1, 2, 3, 4, 5]


def test_towers_keep_the_public_maps_most_popular_columns(peers):
    """``--towers N``: the same people, each holding the N most popular towers (by the public
    map's popularity, not by any count of the table) of their full record, then capped."""
    from sparkpriv.spark.generate_events import CDR_MODEL, event_map

    utility = load_script("dpgm_utility")
    _, pop, _ = event_map(CDR_MODEL, 7)
    top = utility.popular_towers(20, 7)
    assert top.size == 20 and np.all(np.diff(pop[top]) <= 0) and pop[top].min() >= np.delete(pop, top).max()
    full, _ = utility.cdr_table(400, 32, 7)
    src, X = utility.cdr_table(400, 3, 7, towers=20)
    np.testing.assert_array_equal(src, full[:, top])
    # the cap keeps min(L, items) of each person's own towers
    assert np.all(X <= src)
    np.testing.assert_array_equal(X.sum(1), np.minimum(src.sum(1), 3))
    assert (src.sum(1) > 3).any()
    _, X2, qs, true = peers.protocol(400, 3, 7, 50, towers=20)
    np.testing.assert_array_equal(X2, X)
    assert qs.matrix.shape == (20, 50)
    direct = np.array([np.sum(src[:, qs.matrix[:, j] > 0].any(1)) for j in range(qs.size)])
    np.testing.assert_array_equal(true, direct)
    assert peers.parse_args(["--towers", "32"]).towers == 32
    for bad in (["--towers", "0"], ["--towers", "1304"], ["--kind", "cdr", "--towers", "32"]):
        with pytest.raises(SystemExit):
            peers.parse_args(bad)
    with pytest.raises(ValueError, match="towers"):
        utility.popular_towers(0, 7)


def test_pair_scores_against_brute_force(peers):
    rng = np.random.default_rng(3)
    X = (rng.random((40, 6)) < 0.3).astype(float)
    p1 = rng.uniform(0.05, 0.95, 6)
    p = np.stack([1 - p1, p1], 1)
    a, b, s = peers.pair_l1_scores(X, p)
    pairs = list(itertools.combinations(range(6), 2))
    assert list(zip(a.tolist(), b.tolist())) == pairs
    for (i, j), got in zip(pairs, s):
        table = np.zeros((2, 2))
        for r in range(40):
            table[int(X[r, i]), int(X[r, j])] += 1
        want = np.abs(table - 40 * np.outer(p[i], p[j])).sum()
        assert got == pytest.approx(want, rel=1e-12)


def test_zcdp_epsilon_closed_form(peers):
    assert peers.zcdp_epsilon(0.5, 1e-5) == pytest.approx(0.5 + 2 * math.sqrt(0.5 * math.log(1e5)))


def test_mst_runs_on_a_small_table(peers):
    pytest.importorskip("snsynth")
    pytest.importorskip("mbi")
    X = (np.random.default_rng(0).random((200, 5)) < 0.4).astype(float)
    S = peers.run_mst(X, 1.0, 1e-5, 7, 150, iters=50, log=lambda *_: None)
    assert S.shape == (150, 5) and set(np.unique(S)) <= {0.0, 1.0}
