"""``sparkpriv bench utility``: tables, workloads and scores against independent numpy references; a small
slice of the suite end to end (the real tables skip without ../shared/datasets)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from scipy import sparse

from sparkpriv.bench import utility
from sparkpriv.bench.utility_data import README_FACTS, cap_rows, load_table
from sparkpriv.bench.utility_methods import ProductMixture, empty_release, real_sample
from sparkpriv.bench.utility_workloads import WORKLOADS, answers, errors, make_workload
from tests.conftest import shared_dataset


def _random_table(n=600, d=40, seed=0) -> sparse.csr_matrix:
    rng = np.random.default_rng(seed)
    p = rng.beta(0.3, 3.0, size=d)
    D = (rng.random((n, d)) < p).astype(np.float64)
    D[np.arange(n), rng.integers(0, d, n)] = 1.0  # nobody empty
    return sparse.csr_matrix(D)


def _dense_truth(X, wl):
    D = X.toarray() > 0
    unions = {w: ((D.astype(float) @ wl.queries(w).matrix) > 0).sum(axis=0) for w in ("uniform", "popular")}
    pairs = (D[:, wl.pairs[:, 0]] & D[:, wl.pairs[:, 1]]).sum(axis=0)
    return {**unions, "pairs": pairs}


@pytest.mark.parametrize("name", sorted(README_FACTS))
def test_real_tables_have_the_readme_sizes(name):
    shared_dataset()
    t = load_table(name)
    assert (t.n, t.d) == README_FACTS[name][:2]
    assert t.X.nnz <= README_FACTS[name][2]  # a person's repeated item counts once
    assert t.X.max() == 1.0 and np.all(np.diff(t.X.indptr) >= 1)


def test_workload_truth_is_the_dense_count():
    X = _random_table()
    wl = make_workload(X, seed=3, n_queries=100, n_pairs=50)
    ref = _dense_truth(X, wl)
    for w in WORKLOADS:
        np.testing.assert_array_equal(wl.truth[w], ref[w])
    assert wl.pairs.shape == (50, 2) and np.all(wl.pairs[:, 0] < wl.pairs[:, 1])
    assert len({tuple(p) for p in wl.pairs}) == 50


def test_yardsticks_score_their_closed_forms():
    X = _random_table(seed=1)
    n = X.shape[0]
    wl = make_workload(X, seed=4, n_queries=100, n_pairs=40)
    e = errors(answers(empty_release(X, epsilon=1.0, delta=0.0, seed=0), wl), wl)
    for w in WORKLOADS:  # an empty release answers 0: error truth / max(truth, 0.001 n)
        t = np.asarray(wl.truth[w], float)
        assert e[w]["mean"] == pytest.approx(np.mean(t / np.maximum(t, 0.001 * n)))
    whole = errors(answers(real_sample(1.0)(X, epsilon=1.0, delta=0.0, seed=0), wl), wl)
    assert all(whole[w]["mean"] == 0.0 for w in WORKLOADS)


def test_product_mixture_answers_are_the_expectations_of_its_samples():
    rng = np.random.default_rng(5)
    P = rng.uniform(0.0, 0.5, size=(3, 12))
    P[0, 0] = 1.0  # a certain item stays exact (no log of zero)
    w = np.array([0.5, 0.3, 0.2])
    mix = ProductMixture(w, P, 1000)
    Q = (rng.random((12, 20)) < 0.3).astype(float)
    pairs = np.array([[0, 1], [2, 7], [3, 11]])
    # closed forms, term by term
    ref_u = 1000 * sum(w[j] * (1 - np.prod(np.where(Q > 0, 1 - P[j][:, None], 1.0), axis=0)) for j in range(3))
    ref_p = 1000 * sum(w[j] * P[j, pairs[:, 0]] * P[j, pairs[:, 1]] for j in range(3))
    np.testing.assert_allclose(mix.unions(Q), ref_u, rtol=1e-12)
    np.testing.assert_allclose(mix.pairs(pairs), ref_p, rtol=1e-12)
    S = mix.sample(200_000, np.random.default_rng(6)).toarray()  # and the samples agree (4 std)
    emp = ((S @ Q) > 0).mean(axis=0) * 1000
    assert np.all(np.abs(emp - ref_u) <= 4 * np.sqrt(ref_u / 1000 * (1 - ref_u / 1000) / 200_000) * 1000 + 1e-9)


def test_capping_keeps_at_most_L_of_each_persons_own_items():
    X = _random_table(seed=2)
    C = cap_rows(X, 3, np.random.default_rng(0))
    assert np.diff(C.indptr).max() <= 3
    assert np.all(np.diff(C.indptr) == np.minimum(np.diff(X.indptr), 3))
    assert (C.multiply(X) != C).nnz == 0  # only items the person holds


def test_synthetic_method_expected_answers_are_the_mean_of_its_tables():
    """The 'expected' variant is the sampled table without the sampling noise."""
    from sparkpriv.bench.utility_methods import synthetic_defaults

    X = _random_table(n=3000, d=30, seed=7)
    wl = make_workload(X, seed=8, n_queries=60, n_pairs=20)
    out = synthetic_defaults()(X, epsilon=4.0, delta=1e-6, seed=11)
    exp = answers(out["expected"], wl)
    big = out["expected"].model.sample(200_000, 12)
    got = answers(big, wl)  # scaled to n people
    for w in WORKLOADS:
        np.testing.assert_allclose(got[w], exp[w], rtol=0.05, atol=0.002 * X.shape[0])


def test_verdicts_need_two_standard_deviations():
    def cell(m, s, family="private"):
        return {"family": family, "sweep": None, **{w: (m, s) for w in WORKLOADS}}

    summary = {("t", 1.0): {"synthetic[table]": cell(0.10, 0.01), "independence (best)": cell(0.13, 0.01),
                            "sample 10%": cell(0.05, 0.0, "yardstick")},
               ("t", 2.0): {"synthetic[table]": cell(0.10, 0.01), "independence (best)": cell(0.11, 0.01)},
               ("t", 4.0): {"synthetic[table]": cell(0.20, 0.01), "MST": cell(0.10, 0.02, "peer")}}
    v = utility.verdicts(summary)
    assert v[("t", 1.0, "uniform")]["verdict"] == "win"  # 0.03 below, 2 std = 0.02
    assert v[("t", 2.0, "uniform")]["verdict"] == "level"
    assert v[("t", 4.0, "pairs")]["verdict"] == "loss" and v[("t", 4.0, "pairs")]["best_rival"] == "MST"
    assert v[("t", 1.0, "popular")]["sample_10"] == 0.05
    # a model's expected answers are not a table a user gets: they do not count
    summary[("t", 2.0)]["synthetic[expected]"] = cell(0.01, 0.001)
    assert utility.verdicts(summary)[("t", 2.0, "uniform")]["verdict"] == "level"


def test_a_slice_of_the_suite_end_to_end(tmp_path, capsys):
    shared_dataset("groceries")
    parser = argparse.ArgumentParser()
    utility.add_arguments(parser)
    args = parser.parse_args(["--tables", "groceries", "--subsample", "1500", "--epsilons", "1", "--draws", "2",
                              "--queries", "100", "--methods", "empty,sample 10%,independence[gaussian,L=4],synthetic",
                              "--out", str(tmp_path)])
    doc = utility.run_from_args(args)
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["benchmark"] == "utility" and last["cells"] == 3
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(doc["rows"]))
    names = {r["method"] for r in saved["rows"]}
    assert names == {"empty", "sample 10%", "independence[gaussian,L=4][clamp]",
                     "independence[gaussian,L=4][zero<2sd]", "synthetic[table]", "synthetic[expected]"}
    assert sum(r["method"] == "synthetic[table]" for r in saved["rows"]) == 2  # every draw recorded
    # each recorded score is the error of that output: re-score the 10 % sample of draw 0 by hand
    t = load_table("groceries", people=1500, seed=0)
    wl = make_workload(t.X, seed=utility._seed("workload", "groceries") % 2**31, n_queries=100, n_pairs=100)
    S = real_sample(0.10)(t.X, epsilon=1.0, delta=0.0, seed=utility._seed("groceries", 1.0, "sample 10%", 0))
    ref = _dense_truth(S, wl)
    row = next(r for r in saved["rows"] if r["method"] == "sample 10%" and r["draw"] == 0)
    for w in WORKLOADS:
        ans = ref[w] * t.n / S.shape[0]
        truth = np.asarray(wl.truth[w], float)
        assert row[w] == pytest.approx(np.mean(np.abs(ans - truth) / np.maximum(truth, 0.001 * t.n)))
    md = (tmp_path / "results.md").read_text()
    assert "sparkpriv against the best DP rival" in md and "synthetic[table]" in md
    pytest.importorskip("matplotlib")
    assert (tmp_path / "utility.png").stat().st_size > 10_000


def test_the_command_line_names_the_benchmark():
    from sparkpriv.cli import build_parser

    args = build_parser(["bench", "utility"]).parse_args(["bench", "utility", "--quick", "--out", "x"])
    assert args.quick and args.out == "x"
    with pytest.raises(SystemExit, match="unknown table"):
        utility.run_from_args(argparse.Namespace(tables="nope", quick=False, epsilons=None, draws=None))


def test_a_run_of_a_registered_method_alone_writes_its_plot(tmp_path, capsys):
    """A study's own method (``--plugin``) run alone: its ``[table]`` rows are drawn, and a run with
    nothing to draw still writes its results (the plot once failed on an empty legend)."""
    from sparkpriv.bench import utility_methods as um

    shared_dataset("groceries")
    um.default_methods()
    um.register("study[x]", lambda X, *, epsilon, delta, seed: {"table": X[: X.shape[0] // 2], "expected": X},
                replace=True)
    try:
        for methods, legend in (("study[x]", True), ("empty", False)):
            out = tmp_path / methods.replace("[", "_").replace("]", "_")
            parser = argparse.ArgumentParser()
            utility.add_arguments(parser)
            utility.run_from_args(parser.parse_args(["--tables", "groceries", "--subsample", "600", "--epsilons",
                                                     "1", "--draws", "2", "--queries", "50", "--methods", methods,
                                                     "--out", str(out)]))
            capsys.readouterr()
            assert (out / "results.json").exists() and (out / "results.md").exists()
            pytest.importorskip("matplotlib")
            assert (out / "utility.png").stat().st_size > 5_000
    finally:
        um.REGISTRY.pop("study[x]", None)
