"""Uncertainty of DPRP releases: the stated std of each released column and of DP fill values.

The claims (docs/dprp.md, "Uncertainty"): a released cell is the noise-free reconstruction
``x R M`` of its prepared row plus Gaussian row noise ``(e M)_j`` of the stated std (given the
realized ``R`` and the noisy Gram, which fix ``M``), then clipped and mapped back; so
``value +- 1.96 std`` covers the clipped noise-free reconstruction with probability at least
95% (exactly 95% when nothing is clipped). The simulation redraws the row noise only, on the
code path of a release (``prepare_rows``, ``reconstruct_rows``, ``decode_rows``); the truth is
the reconstruction without noise, computed by the same functions with ``noise=None``.
"""

import math

import numpy as np

from sparkpriv.api import release_dprp
from sparkpriv.mechanisms import dprp as core
from sparkpriv.mechanisms.projection import draw_projection_matrix
from sparkpriv.privacy.random import stream


def _plan(d, epsilon, fill=None, lower=0.0, upper=10.0):
    v = core.validate_params(d=d, epsilon=epsilon, delta=1e-5, lower=[lower] * d, upper=[upper] * d, k1=None,
                             k2=None, row_bound=None, budget_split=(0.8, 0.2), labels=None, classes=None,
                             label_scale=1.0, fill=fill, impute_share=0.05, neighbors="replace-one", caller="t")
    R = draw_projection_matrix(d, v["k1"], 3)
    plan = core.plan_dprp(R, d=d, epsilon=epsilon, delta=1e-5, lower=v["lower"], upper=v["upper"], k2=v["k2"],
                          row_bound=v["row_bound"], budget_split=v["budget_split"], labels=None, classes=None,
                          label_scale=1.0, fill=fill, impute_share=0.05)
    return plan, R


def test_value_interval_covers_the_noise_free_reconstruction_95_percent():
    d, n = 5, 400
    plan, R = _plan(d, epsilon=400.0)  # small noise: few values reach the clip, where coverage is higher
    rng = np.random.default_rng(1)
    X = 2.0 + 6.0 * rng.random((n, d))  # inside the box, away from its edges
    Xp, _ = core.prepare_rows(X.copy(), plan)
    gnoise = plan.gram_noise(n)
    (C,) = core.noisy_grams([Xp.T @ Xp], gnoise, stream(5, 2))
    (M,) = core.solve([C], R, plan.k2)
    std = core.released_value_std(M, plan.projection_noise, plan)
    truth, _ = core.decode_rows(core.reconstruct_rows(Xp, R, [M], None, None, None), plan)
    raw_truth = core.reconstruct_rows(Xp, R, [M], None, None, None)[:, :d] * 10.0
    hits, clipped, errs = 0, 0, []
    trials = 40  # 40 x 400 x 5 = 80,000 cells, independent noise per row (binomial sd 0.0008)
    for t in range(trials):
        Xr = core.reconstruct_rows(Xp, R, [M], None, plan.projection_noise, stream(100 + t, 1))
        out, _ = core.decode_rows(Xr, plan)
        hits += np.sum(np.abs(out - truth) <= 1.96 * std)
        clipped += np.sum((Xr[:, :d] < 0) | (Xr[:, :d] > 1))
        errs.append(Xr[:, :d] * 10.0 - raw_truth)
    cov = hits / (trials * n * d)
    assert clipped / (trials * n * d) < 0.05
    assert 0.93 <= cov <= 0.97, cov
    # the std of the raw (unclipped) noise per column, against the stated one (independent estimate)
    np.testing.assert_allclose(np.concatenate(errs).std(axis=0), std, rtol=0.03)


def test_fill_value_std_by_simulation():
    d, n = 3, 2000
    plan, _ = _plan(d, epsilon=1.0, fill="dp-mean", lower=0.0, upper=1.0)
    rng = np.random.default_rng(2)
    X = rng.random((n, d))
    miss = rng.random((n, d)) < 0.3
    tot = core.impute_partial(np.where(miss, 0.0, X), miss, plan)
    true_means = core.dp_column_means(tot, None, None, plan)
    nz = plan.impute_noise(n)
    draws, stds = [], []
    for s in range(400):
        m, sd = core.dp_column_means(tot, nz, stream(s, 3), plan, with_std=True)
        draws.append(m)
        stds.append(sd)
    draws, stds = np.array(draws), np.array(stds)
    # delta method against the empirical spread; and the stated 95% interval's coverage
    np.testing.assert_allclose(draws.std(axis=0), stds.mean(axis=0), rtol=0.12)
    cov = np.mean(np.abs(draws - true_means) <= 1.96 * stds)
    assert 0.93 <= cov <= 0.97, cov


def test_release_states_uncertainty_per_column_and_per_class(test_seed):
    import pandas as pd

    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.random((300, 3)) * 10, columns=["a", "b", "c"])
    df["y"] = np.arange(300) % 2
    df.loc[::9, "b"] = np.nan
    rel = release_dprp(df, columns=["a", "b", "c"], epsilon=5.0, delta=1e-6, lower=0.0, upper=10.0,
                       fill="dp-mean", label="y", labels="public", classes=(0, 1))
    u = rel.uncertainty()
    assert u == rel.receipt()["mechanism_details"]["uncertainty"]
    assert set(u["value_std"]) == {"0", "1"} and set(u["value_std"]["0"]) == {"a", "b", "c"}
    assert all(v > 0 and math.isfinite(v) for c in u["value_std"].values() for v in c.values())
    assert set(u["fill_value_std"]) == {"a", "b", "c"}
    rel2 = release_dprp(rng.random((200, 4)), epsilon=5.0, delta=1e-6, lower=0.0, upper=1.0)
    u2 = rel2.uncertainty()
    assert set(u2["value_std"]) == {"x0", "x1", "x2", "x3"} and "fill_value_std" not in u2
