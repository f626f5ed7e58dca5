"""The ledger accounts Poisson-sampled Gaussian events (DP-SGD of the DPGM release)."""

from __future__ import annotations

import pytest
from dp_accounting import dp_event as ev

from sparkpriv.ledger.events import InvalidEvent, decode_stored, encode_event
from sparkpriv.privacy.accounting import compose, epsilon_of


def _dpgm_like(q=0.1, z=0.8, steps=50):
    return compose([ev.SelfComposedDpEvent(ev.GaussianDpEvent(3.0), 4),
                    ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(q, ev.GaussianDpEvent(z)), steps)])


def test_sampled_gaussian_is_accounted_with_amplification():
    event = _dpgm_like()
    text, spend = encode_event(event)
    want = epsilon_of(event, 1e-5)
    got = spend.epsilon(1e-5)
    assert got == pytest.approx(want, rel=1e-2)
    # amplification by sampling is used: the same steps unsampled state far more
    unsampled = compose([ev.SelfComposedDpEvent(ev.GaussianDpEvent(3.0), 4),
                         ev.SelfComposedDpEvent(ev.GaussianDpEvent(0.8), 50)])
    assert got < 0.5 * encode_event(unsampled)[1].epsilon(1e-5)
    # stored and read back: the same spend
    assert decode_stored(text).spend == spend
    # two releases compose: more than one alone
    assert (spend + spend).epsilon(1e-5) > got


@pytest.mark.parametrize("event,match", [
    (ev.PoissonSampledDpEvent(0.1, ev.LaplaceDpEvent(1.0)), "GaussianDpEvent"),
    (ev.PoissonSampledDpEvent(1.5, ev.GaussianDpEvent(1.0)), r"\(0, 1\]"),
    (ev.PoissonSampledDpEvent(0.0, ev.GaussianDpEvent(1.0)), "sampling_probability"),
])
def test_other_sampled_events_are_refused(event, match):
    with pytest.raises(InvalidEvent, match=match):
        encode_event(event)


def test_sampled_at_delta_zero_is_infinite():
    assert encode_event(_dpgm_like())[1].epsilon(0.0) == float("inf")
