"""Per-cluster sampling rates of the DPGM (``min_batch``; docs/research/dpgm.md, "Per-cluster sampling rates").

A cluster of noisy size ``n_j`` makes ``m_j = min(max(ceil(min_batch / (q n_j)), 1), T)`` of the
``T`` base steps at once. Each base step keeps its own batch and noise, so the release's event
is the same as without ``min_batch``; the per-update arithmetic is checked against plain loops in
test_dpsgd.py and audited in tests/audit/test_dpsgd.py.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import dpgm, dpsgd

P = dpgm.DPGMParams(epsilon=2.0, delta=1e-5, k=2, sampling_rate=0.05, epochs=20, hidden=4, accountant="rdp",
                    kmeans_iterations=3, min_batch=100)  # T = 400


@pytest.fixture(scope="module")
def plan():
    return dpgm.plan_dpgm(P, n=400, d=10)


def test_batches_per_cluster_closed_form(plan):
    assert plan.steps == 400
    # q n = 500, 50, 1.5, 0.05 (an empty cluster trains as n = 1)
    assert plan.batches([10_000.0, 1_000.0, 30.0, 0.0, 2_000.0]) == [1, 2, 67, 400, 1]
    assert plan.batches_for(1999.0) == 2 and plan.batches_for(2000.0) == 1  # ceil(100 / 99.95) = 2
    one = dpgm.plan_dpgm(dataclasses.replace(P, min_batch=None), n=400, d=10)
    assert one.batches([1e6, 10.0, 0.0]) == [1, 1, 1]


def test_the_release_event_does_not_depend_on_min_batch(plan):
    one = dpgm.plan_dpgm(dataclasses.replace(P, min_batch=None), n=400, d=10)
    assert plan.noise_multiplier == one.noise_multiplier
    assert plan.dp_event() == one.dp_event()
    kplan, sigma = dpgm.calibrate_dpgm(P, 10)
    assert dpgm.requested_event(P, kplan, sigma, 10) == dpgm.requested_event(
        dataclasses.replace(P, min_batch=None), kplan, sigma, 10)
    note = dpgm.accounting_note(P)
    assert "m_j of its T steps at once" in note and "m_j" not in dpgm.accounting_note(one.params)
    pub = plan.to_public_dict()
    assert "ceil(100 / (q n_j))" in pub["batches_per_update"]
    assert one.to_public_dict()["batches_per_update"] == "1 for every cluster"


def test_learning_rate_follows_the_noise_of_an_update(plan):
    """``tau = sigma C / (sqrt(m) q n)``: the averaged gradient of ``m`` base steps."""
    sigma, C, q = plan.noise_multiplier, P.clip, P.sampling_rate
    for n in (1.0, 30.0, 1_000.0, 1e5):
        m = plan.batches_for(n)
        tau = sigma * C / (math.sqrt(m) * q * n)
        assert plan.learning_rate_for(n) == pytest.approx(0.002 * min(max(tau / 0.03, 1.0), 5.0), rel=1e-12)


def test_each_cluster_trains_with_its_own_batches(monkeypatch, plan):
    seen = {}
    real = dpsgd.train

    def spy(*args, **kw):
        seen[kw["cluster"]] = (kw["batches"], kw["steps"], kw["lr"])
        return real(*args, **kw)

    monkeypatch.setattr(dpsgd, "train", spy)
    X = (np.random.default_rng(0).random((400, 10)) < 0.3).astype(float)
    sizes = np.array([390.0, 10.0])
    dpgm.train_clusters(X, (np.arange(400) >= 390).astype(int), sizes, np.full((2, 10), 0.3), plan, seed=7)
    # q n = 19.5 and 0.5: m = 6 and 200
    assert seen == {0: (6, 400, plan.learning_rate_for(390.0)), 1: (200, 400, plan.learning_rate_for(10.0))}


def test_a_release_records_batches_and_updates_and_the_file_keeps_min_batch(tmp_path):
    rng = np.random.default_rng(3)
    X = (rng.random((600, 10)) < 0.2).astype(float)
    model, plan = dpgm.fit_dpgm_array(X, P, seed=5)
    want = [plan.batches_for(max(float(s), 1.0)) for s in model.sizes]
    assert model.plan_public["batches"] == want
    assert model.plan_public["updates"] == [math.ceil(400 / m) for m in want]
    model.save(tmp_path / "m.npz")
    assert dpgm.DPGMModel.load(tmp_path / "m.npz").params.min_batch == 100


def test_min_batch_must_be_a_positive_integer():
    for bad in (0, -3, 2.5):
        with pytest.raises(ParameterError, match="min_batch"):
            dpgm.plan_dpgm(dataclasses.replace(P, min_batch=bad), n=400, d=10)


def test_progress_counts_every_chunk_a_cluster_passes_at_once():
    """A cluster with ``m_j`` base steps per update reports base steps ``m_j, 2 m_j, ...``: every
    chunk boundary passed counts, and the spend stated is that of the base steps made."""
    from dp_accounting import dp_event as ev

    from sparkpriv.privacy.accounting import compose, epsilon_of
    from types import SimpleNamespace

    steps, step = 300, ev.PoissonSampledDpEvent(0.02, ev.GaussianDpEvent(1.2))
    km = ev.SelfComposedDpEvent(ev.GaussianDpEvent(8.0), 8)
    plan = SimpleNamespace(params=SimpleNamespace(k=2, delta=1e-6), steps=steps,
                           kmeans=SimpleNamespace(dp_event=lambda: km), base_events=lambda: [km],
                           training_event=lambda t=None: ev.SelfComposedDpEvent(step, steps if t is None else int(t)))
    reserved = epsilon_of(compose([km, plan.training_event()]), 1e-6)
    got = []

    class Sink:
        def step(self, what, i, n, message):
            got.append((i, n, message))

    on_train = dpgm._training_progress(Sink(), plan, reserved)
    for u in list(range(70, steps, 70)) + [steps]:  # cluster 0: m = 70 (70, 140, 210, 280, 300)
        on_train(0, u, steps)
    on_train(1, steps, steps)  # cluster 1: all 300 at once
    done = [i for i, _, _ in got]
    assert done == [2, 4, 7, 9, 10, 20] and {n for _, n, _ in got} == {20}
    for (i, _, message), u in zip(got, (70, 140, 210, 280)):
        stated = float(re.search(r"at most (\S+) of", message).group(1))
        ref = epsilon_of(compose([km, ev.SelfComposedDpEvent(step, u)]), 1e-6)
        assert ref * (1 - 1e-3) <= stated <= ref * 1.01
