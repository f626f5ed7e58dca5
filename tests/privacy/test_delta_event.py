"""DeltaDpEvent: a (0, delta) mechanism (DP partition selection) in the accountant and the ledger.

The reference is dp_accounting's own PLD of an (epsilon = 0, delta) mechanism (an infinity mass
delta), composed with the other events: an independent computation of the same curve.
"""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting import dp_event as e
from dp_accounting.pld import common, privacy_loss_distribution as pld

from sparkpriv.errors import BudgetExceededError
from sparkpriv.ledger.events import encode_event, spend_of_stored
from sparkpriv.privacy.accounting import DeltaDpEvent, compose, epsilon_of, event_from_dict, event_to_dict


def _reference(events_pld, delta_sel: float, delta: float) -> float:
    d = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(0.0, delta_sel),
                                    value_discretization_interval=1e-4)
    return float(events_pld.compose(d).get_epsilon_for_delta(delta))


@pytest.mark.parametrize("delta", [2e-6, 1e-5, 1e-3])
def test_laplace_with_a_delta_event_matches_the_pld_reference(delta):
    got = epsilon_of(compose([e.LaplaceDpEvent(0.5), DeltaDpEvent(1e-6)]), delta)
    ref = _reference(pld.from_laplace_mechanism(0.5, value_discretization_interval=1e-4), 1e-6, delta)
    assert got == pytest.approx(ref, rel=2e-3, abs=2e-4)
    assert got <= 2.0 + 1e-12  # never above the pure epsilon


def test_gaussian_with_a_delta_event_matches_the_pld_reference():
    got = epsilon_of(compose([e.GaussianDpEvent(2.0), DeltaDpEvent(1e-6)]), 1e-5)
    ref = _reference(pld.from_gaussian_mechanism(2.0, value_discretization_interval=1e-4), 1e-6, 1e-5)
    assert got == pytest.approx(ref, rel=2e-3, abs=2e-4)


def test_delta_at_or_below_the_events_delta():
    ev = compose([e.LaplaceDpEvent(1.0), DeltaDpEvent(1e-6)])
    assert epsilon_of(ev, 1e-6) == 1.0  # all of delta goes to the selection: the rest is pure
    assert epsilon_of(ev, 5e-7) == math.inf
    assert epsilon_of(ev, 0.0) == math.inf
    assert epsilon_of(compose([e.GaussianDpEvent(2.0), DeltaDpEvent(1e-6)]), 1e-6) == math.inf


def test_round_trip_and_ledger_spend():
    ev = compose([e.LaplaceDpEvent(1.0), DeltaDpEvent(1e-6)])
    assert event_from_dict(event_to_dict(ev)) == ev
    text, spend = encode_event(ev)
    assert spend_of_stored(text).spend == spend
    assert spend.pure_epsilon_exact() is None  # not pure: compared as a float, at the budget's delta
    assert spend.epsilon(1e-5) == pytest.approx(epsilon_of(ev, 1e-5), rel=1e-9)
    two = spend + spend
    assert two.epsilon(1e-5) == pytest.approx(epsilon_of(compose([ev, ev]), 1e-5), rel=1e-6)
    assert two.epsilon(1.5e-6) == math.inf  # two selections of 1e-6 exceed a delta of 1.5e-6


def test_ledger_refuses_when_the_selection_deltas_exceed_the_budget(tmp_path):
    from sparkpriv.ledger import open_ledger

    ev = compose([e.LaplaceDpEvent(1.0), DeltaDpEvent(1e-6)])
    with open_ledger(f"sqlite:///{tmp_path}/l.sqlite") as led:
        led.set_budget("t", epsilon=10.0, delta=1.5e-6)
        r = led.reserve("t", event=ev, mechanism="aggregates", parameters={}, output_path="")
        assert r.epsilon_requested == pytest.approx(1.0)
        with pytest.raises(BudgetExceededError):
            led.reserve("t", event=ev, mechanism="aggregates", parameters={}, output_path="")


def test_invalid_delta_is_refused():
    from sparkpriv.ledger.events import InvalidEvent

    with pytest.raises(InvalidEvent):
        encode_event(DeltaDpEvent(1.0))
    assert dp_accounting  # imported for the reference PLDs
