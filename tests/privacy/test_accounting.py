import math

import pytest
from dp_accounting import dp_event as ev

from sparkpriv.errors import ParameterError
from sparkpriv.privacy.accounting import (
    compose,
    epsilon_of,
    event_from_dict,
    event_to_dict,
    events_from_json,
    events_to_json,
)
from sparkpriv.privacy.calibration import gaussian_delta


def test_roundtrip_serialization():
    e = compose([ev.LaplaceDpEvent(2.0), ev.SelfComposedDpEvent(ev.GaussianDpEvent(3.0), 4)])
    assert events_from_json(events_to_json(e)) == e
    assert event_from_dict(event_to_dict(e)) == e


def test_disallowed_class_is_refused():
    with pytest.raises(ParameterError, match="disallowed"):
        event_from_dict({"class_name": "os.system"})


def test_pure_laplace_sums_exactly():
    e = compose([ev.LaplaceDpEvent(2.0), ev.LaplaceDpEvent(4.0)])
    assert epsilon_of(e, 0.0) == pytest.approx(0.5 + 0.25)


def test_gaussian_pld_matches_closed_form():
    z = 3.0
    eps = epsilon_of(ev.GaussianDpEvent(z), 1e-5)
    # closed form delta at that epsilon equals the target (PLD is pessimistic by <1%)
    assert gaussian_delta(z, eps) <= 1e-5 * 1.001
    assert gaussian_delta(z, eps * 0.99) > 1e-5
    # two Gaussians compose like one with z / sqrt(2)
    two = epsilon_of(compose([ev.GaussianDpEvent(z), ev.GaussianDpEvent(z)]), 1e-5)
    one = epsilon_of(ev.GaussianDpEvent(z / math.sqrt(2)), 1e-5)
    assert two == pytest.approx(one, rel=5e-3)
    assert two < 2 * eps


def test_delta_zero_needs_pure_events():
    with pytest.raises(ParameterError, match="delta"):
        epsilon_of(ev.GaussianDpEvent(1.0), 0.0)


def test_repeated_questions_are_answered_from_the_memo_and_stay_exact():
    # the memo keys on the event's repr and delta: an asked-again event gives the fresh
    # accountant's answer, and events that differ in any field (the last digit of a float,
    # a count, the nesting) or another delta are never mixed up
    from sparkpriv.privacy import accounting as acc_mod

    def fresh(event, delta):
        saved = dict(acc_mod._PLD_MEMO)
        acc_mod._PLD_MEMO.clear()
        try:
            return epsilon_of(event, delta)
        finally:
            acc_mod._PLD_MEMO.clear()
            acc_mod._PLD_MEMO.update(saved)

    z = 1.7
    sampled = ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(0.01, ev.GaussianDpEvent(z)), 50)
    events = [ev.GaussianDpEvent(z), ev.GaussianDpEvent(math.nextafter(z, 0.0)),
              ev.GaussianDpEvent(z * 1.01), sampled,
              ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(0.01, ev.GaussianDpEvent(z)), 51),
              compose([ev.GaussianDpEvent(z), sampled])]
    answers = {}
    for e in events:
        for delta in (1e-5, 1e-6):
            first = epsilon_of(e, delta)
            assert epsilon_of(e, delta) == first == fresh(e, delta)
            answers[(repr(e), delta)] = first
    assert len(set(answers.values())) >= len(answers) - 2  # z and nextafter(z) may round alike
    assert answers[(repr(events[2]), 1e-5)] < answers[(repr(events[0]), 1e-5)]
    assert answers[(repr(events[4]), 1e-5)] > answers[(repr(events[3]), 1e-5)]
    assert answers[(repr(events[0]), 1e-6)] > answers[(repr(events[0]), 1e-5)]


def test_running_epsilon_bounds_every_prefix_and_meets_the_whole():
    # DP-SGD progress: k-means Gaussians, then chunks of Poisson-sampled Gaussian steps. Every
    # prefix's running value is an upper bound on the accountant's epsilon of that prefix (a
    # coarser grid, pessimistic), and close to it; the whole sequence meets epsilon_of of the whole.
    from sparkpriv.privacy.accounting import RunningEpsilon

    delta = 1e-6
    kmeans = ev.SelfComposedDpEvent(ev.GaussianDpEvent(9.0), 8)
    step = ev.PoissonSampledDpEvent(0.01, ev.GaussianDpEvent(1.1))
    steps = 1000
    whole = compose([kmeans, ev.SelfComposedDpEvent(step, steps)])
    run = RunningEpsilon(whole, delta)
    assert run.epsilon() == 0.0
    run.add(kmeans)
    km_eps = run.epsilon()
    assert km_eps >= epsilon_of(kmeans, delta) * (1 - 1e-9)
    # closed form: 8 Gaussians of multiplier 9 are one of 9 / sqrt(8)
    from sparkpriv.privacy.calibration import gdp_epsilon_delta
    exact = gdp_epsilon_delta(math.sqrt(8) / 9.0, delta)
    assert exact <= km_eps <= exact * 1.01
    done, previous = 0, km_eps
    for c in range(1, 11):
        t = int(math.ceil(c * steps / 10))
        run.add(ev.SelfComposedDpEvent(step, t - done))
        done = t
        prefix = compose([kmeans, ev.SelfComposedDpEvent(step, t)])
        got, ref = run.epsilon(), epsilon_of(prefix, delta)
        # both pessimistic PLDs on the same grid; composing in chunks truncates the tails at other
        # points than one self-composition, which moves the value by ~1e-9
        assert ref * (1 - 1e-6) <= got <= ref * 1.01 + 1e-3, (t, got, ref)
        assert got > previous
        previous = got
    assert run.epsilon() == pytest.approx(epsilon_of(whole, delta), rel=2e-3)
    with pytest.raises(ValueError, match="Gaussian, Laplace and Poisson-sampled"):
        RunningEpsilon(whole, delta).add(ev.PoissonSampledDpEvent(0.1, ev.LaplaceDpEvent(1.0)))
