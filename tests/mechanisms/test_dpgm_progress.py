"""The spend-so-far of the in-process training's progress steps (docs/research/dpgm.md, "Progress")."""
import math
import re
from types import SimpleNamespace

import pytest
from dp_accounting import dp_event as ev

from sparkpriv.mechanisms import dpgm
from sparkpriv.privacy.accounting import compose, epsilon_of

DELTA = 1e-6
STEPS = 300
STEP = ev.PoissonSampledDpEvent(0.02, ev.GaussianDpEvent(1.2))


class _Steps:
    def __init__(self):
        self.messages = []

    def step(self, what, i, n, message):
        self.messages.append(message)


def _plan(kmeans_event, others=()):
    return SimpleNamespace(
        params=SimpleNamespace(k=2, delta=DELTA), steps=STEPS,
        kmeans=SimpleNamespace(dp_event=lambda: kmeans_event), base_events=lambda: [kmeans_event, *others],
        training_event=lambda t=None: ev.SelfComposedDpEvent(STEP, STEPS if t is None else int(t)))


def _spends(kmeans_event, reserved, others=()):
    sink = _Steps()
    on_train = dpgm._training_progress(sink, _plan(kmeans_event, others), reserved)
    for j in (0, 1):
        for t in range(1, STEPS + 1):
            on_train(j, t, STEPS)
    values = [float(re.search(r"at most (\S+) of", m).group(1)) for m in sink.messages]
    chunks = [int(math.ceil(c * STEPS / dpgm.TRAINING_CHUNKS)) for c in range(1, dpgm.TRAINING_CHUNKS + 1)]
    return values, chunks


@pytest.mark.parametrize("kmeans_event", [
    ev.SelfComposedDpEvent(ev.GaussianDpEvent(8.0), 8),            # composed step by step
    ev.DiscreteLaplaceDpEvent(noise_parameter=0.05, sensitivity=1),  # not built by RunningEpsilon
], ids=["gaussian", "other-leaf"])
def test_each_step_states_an_upper_bound_on_the_prefix_and_the_rest_the_reservation(kmeans_event):
    reserved = epsilon_of(compose([kmeans_event, ev.SelfComposedDpEvent(STEP, STEPS)]), DELTA)
    values, chunks = _spends(kmeans_event, reserved)
    assert len(values) == 2 * len(chunks)
    for got, t in zip(values, chunks):  # the first cluster: k-means plus the t steps made
        ref = epsilon_of(compose([kmeans_event, ev.SelfComposedDpEvent(STEP, t)]), DELTA)
        assert ref * (1 - 1e-3) <= got <= ref * 1.01, (t, got, ref)  # the message rounds to 4 digits
        assert got <= reserved * (1 + 1e-3)
    assert values[len(chunks) - 1] == pytest.approx(reserved, rel=1e-3)
    assert all(v == pytest.approx(reserved, rel=1e-3) for v in values[len(chunks):])  # later clusters
    assert values[0] < values[len(chunks) // 2] < values[len(chunks) - 2]


def test_the_events_released_before_training_count_from_the_first_step():
    """The length histograms and the item counts are released before training: every step's
    statement includes them (a statement of the k-means and the steps alone would be below the
    spend)."""
    km = ev.SelfComposedDpEvent(ev.GaussianDpEvent(8.0), 8)
    others = (ev.GaussianDpEvent(3.0), ev.GaussianDpEvent(5.0))  # lengths, item counts
    reserved = epsilon_of(compose([km, *others, ev.SelfComposedDpEvent(STEP, STEPS)]), DELTA)
    values, chunks = _spends(km, reserved, others)
    for got, t in zip(values, chunks):
        ref = epsilon_of(compose([km, *others, ev.SelfComposedDpEvent(STEP, t)]), DELTA)
        without = epsilon_of(compose([km, ev.SelfComposedDpEvent(STEP, t)]), DELTA)
        assert ref * (1 - 1e-3) <= got <= ref * 1.01, (t, got, ref)
        assert got > without * 1.01  # the released histograms and counts are in it
