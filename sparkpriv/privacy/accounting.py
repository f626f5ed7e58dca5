"""Privacy accounting with dp_accounting (docs/math.md section 1).

Mechanisms never compute epsilon themselves: they emit frozen
``dp_accounting`` events, and this module composes them.

Normalization. Every event we emit is normalized to the sensitivity of the
release's *declared* neighbour relation: a ``GaussianDpEvent(z)`` means "a
Gaussian mechanism whose noise standard deviation is ``z`` times the L2
sensitivity under that relation", a ``LaplaceDpEvent(z)`` likewise for the L1
sensitivity. Sensitivities for replace-one neighbours are computed as such
(e.g. ``r = 2R``), so the worst neighbouring pair is a shift of at most one
sensitivity in either case. dp_accounting's PLD accountant is therefore used in
its add/remove mode, whose Laplace and Gaussian privacy curves are exactly
"a shift by at most one sensitivity"; using its replace-one mode on top would
count the replacement twice.

The guarantee of a set of events at a target delta is PLD's epsilon. With
``delta == 0`` only pure mechanisms (Laplace) can be composed, and their
epsilon adds up exactly.

A mechanism whose only loss is a probability ``delta`` of revealing its
input (DP partition selection: a key that one person alone holds is released
with probability at most ``delta``) is the event :class:`DeltaDpEvent`
(dp_accounting has no event for it). Its privacy loss distribution puts mass
``delta`` at infinity and the rest at 0, so composed with any events of
privacy curve ``delta_r(epsilon)`` the curve is exactly
``delta_x + (1 - delta_x) delta_r(epsilon)`` (``delta_x = 1 - prod (1 -
delta_i)`` over the delta events): :func:`epsilon_of` states the other events'
epsilon at ``(delta - delta_x) / (1 - delta_x)``, and infinity when ``delta <=
delta_x``.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Callable, Iterable, Sequence

import attr
import dp_accounting
from dp_accounting import dp_event as _ev
from dp_accounting.pld import pld_privacy_accountant

from sparkpriv.errors import ParameterError

__all__ = [
    "DeltaDpEvent",
    "delta_part",
    "compose",
    "epsilon_of",
    "fit_to_epsilon",
    "pure_epsilon_of",
    "event_to_dict",
    "event_from_dict",
    "events_to_json",
    "events_from_json",
    "describe_event",
]

@attr.s(frozen=True, slots=True, auto_attribs=True)
class DeltaDpEvent(_ev.DpEvent):
    """A mechanism that is ``(0, delta)``-DP: with probability at most ``delta`` its output reveals the
    input, otherwise it reveals nothing (see the module docstring; DP partition selection)."""

    delta: float


# Only these classes may be rebuilt from a stored ledger or receipt: loading a
# class by name from stored text must never import arbitrary modules.
_ALLOWED = {
    name: getattr(_ev, name)
    for name in (
        "ComposedDpEvent",
        "SelfComposedDpEvent",
        "GaussianDpEvent",
        "LaplaceDpEvent",
        "DiscreteLaplaceDpEvent",
        "PoissonSampledDpEvent",
        "NoOpDpEvent",
        "NonPrivateDpEvent",
        "ZCDpEvent",
    )
}
_ALLOWED["DeltaDpEvent"] = DeltaDpEvent

_VALUE_DISCRETIZATION = 1e-4


def compose(events: Iterable[_ev.DpEvent]) -> _ev.DpEvent:
    """One ``ComposedDpEvent`` of ``events`` (flattened one level)."""
    flat: list[_ev.DpEvent] = []
    for e in events:
        if isinstance(e, _ev.ComposedDpEvent):
            flat.extend(e.events)
        else:
            flat.append(e)
    return _ev.ComposedDpEvent(flat)


def _leaves(event: _ev.DpEvent, count: int = 1):
    if isinstance(event, _ev.ComposedDpEvent):
        for e in event.events:
            yield from _leaves(e, count)
    elif isinstance(event, _ev.SelfComposedDpEvent):
        yield from _leaves(event.event, count * event.count)
    else:
        yield event, count


def _discretization_for(event: _ev.DpEvent, delta: float) -> float:
    """The PLD grid step: ``1e-4`` up to an epsilon of about 10, relative above it.

    The PLD's support grows with the privacy loss, so a fixed step makes the
    grid (memory and time) grow with epsilon: at epsilon 1e4 a fixed 1e-4 step
    took many GB. The pessimistic discretisation states an upper bound for any
    step, so a step proportional to a cheap upper estimate of epsilon keeps the
    grid's size bounded and the relative slack at about 1e-5 (plus the
    request-side check of :func:`fit_to_epsilon`, which uses the same rule).
    Estimate: the pure part summed, plus ``mu^2 / 2 + mu sqrt(2 log(1 / delta))``
    for the Gaussian part (``mu^2`` = sum of ``count / z^2``); other leaves
    (sampled events) count as 1.
    """
    pure, mu2, other = 0.0, 0.0, 0.0
    for leaf, count in _leaves(event):
        if isinstance(leaf, _ev.GaussianDpEvent):
            mu2 += count / max(leaf.noise_multiplier, 1e-300) ** 2
        elif isinstance(leaf, _ev.LaplaceDpEvent):
            pure += count / max(leaf.noise_multiplier, 1e-300)
        elif isinstance(leaf, _ev.DiscreteLaplaceDpEvent):
            pure += count * leaf.noise_parameter * leaf.sensitivity
        elif not isinstance(leaf, (_ev.NoOpDpEvent, DeltaDpEvent)):
            other += count
    mu = math.sqrt(mu2)
    estimate = pure + other + mu2 / 2.0 + mu * math.sqrt(2.0 * math.log(1.0 / max(delta, 1e-300)))
    if other > 0:
        # sampled events (DP-SGD: thousands of Poisson-sampled Gaussian steps): counting
        # each as 1 made the step 0.1 and the PLD's epsilon 8.4 where the truth is 1.98;
        # the RDP accountant's epsilon is a valid upper estimate and cheap
        estimate = min(estimate, _rdp_epsilon(event, delta))
    return _VALUE_DISCRETIZATION * max(1.0, estimate / 10.0)


def _rdp_epsilon(event: _ev.DpEvent, delta: float) -> float:
    """dp_accounting's RDP epsilon of ``event`` (add/remove mode), or inf if unsupported."""
    from dp_accounting.rdp import rdp_privacy_accountant

    # integer orders only: their sampled-Gaussian terms have a closed form (fractional
    # orders need a slow series that often fails to converge); any set of orders is valid
    acc = rdp_privacy_accountant.RdpAccountant(orders=[*range(2, 65), 96, 128, 256, 512, 1024])
    if not acc.supports(event):
        return math.inf
    acc.compose(event)
    return float(acc.get_epsilon(max(delta, 1e-300)))


def pure_epsilon_of(event: _ev.DpEvent) -> float | None:
    """Exact pure-DP epsilon when every leaf is a Laplace (or no-op) event, else None."""
    total = 0.0
    for leaf, count in _leaves(event):
        if isinstance(leaf, _ev.NoOpDpEvent):
            continue
        if isinstance(leaf, _ev.LaplaceDpEvent):
            if leaf.noise_multiplier <= 0:
                return math.inf
            total += count / leaf.noise_multiplier
        elif isinstance(leaf, _ev.DiscreteLaplaceDpEvent):
            total += count * leaf.noise_parameter * leaf.sensitivity
        else:
            return None
    return total


def delta_part(event: _ev.DpEvent) -> float:
    """``1 - prod (1 - delta_i)`` over the :class:`DeltaDpEvent` leaves of ``event`` (0 without any),
    rounded up."""
    parts = []
    for leaf, count in _leaves(event):
        if isinstance(leaf, DeltaDpEvent):
            d = float(leaf.delta)
            if not 0.0 <= d < 1.0:
                raise ParameterError(f"A DeltaDpEvent needs a delta in [0, 1). Got {d!r}.")
            if d > 0.0:
                parts.append((d, count))
    if not parts:
        return 0.0
    if len(parts) == 1 and parts[0][1] == 1:
        return parts[0][0]  # exact
    return math.nextafter(-math.expm1(math.fsum(n * math.log1p(-d) for d, n in parts)), math.inf)


def epsilon_of(event: _ev.DpEvent | Sequence[_ev.DpEvent], delta: float) -> float:
    """Epsilon of ``event`` at ``delta``, by dp_accounting's PLD accountant.

    For ``delta == 0`` the event must be pure (Laplace only); the exact sum of
    epsilons is returned. With ``delta > 0`` and a pure event, the smaller of
    PLD's epsilon and the exact pure epsilon is returned (both are valid).
    """
    if not isinstance(event, _ev.DpEvent):
        event = compose(event)
    if not (0.0 <= delta < 1.0):
        raise ParameterError(f"The 'delta' parameter must be in [0, 1). Got {delta!r} instead.")
    dx = delta_part(event)
    if dx > 0.0:  # the delta events take their share first (module docstring)
        if delta < dx:
            return math.inf
        rest = [leaf if count == 1 else _ev.SelfComposedDpEvent(leaf, count) for leaf, count in _leaves(event)
                if not isinstance(leaf, (DeltaDpEvent, _ev.NoOpDpEvent))]
        if not rest:
            return 0.0
        rest_delta = max(0.0, (delta - dx) / (1.0 - dx))
        if rest_delta == 0.0 and pure_epsilon_of(compose(rest)) is None:
            return math.inf  # approximate-DP events with no delta left
        return epsilon_of(compose(rest), rest_delta)
    pure = pure_epsilon_of(event)
    if delta == 0.0:
        if pure is None:
            raise ParameterError(
                "delta = 0 was asked for, but the events include approximate-DP mechanisms "
                "(Gaussian); give a delta > 0."
            )
        return pure
    key = (repr(event), float(delta))
    with _PLD_MEMO_LOCK:
        eps = _PLD_MEMO.get(key)
    if eps is None:
        acc = pld_privacy_accountant.PLDAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
            value_discretization_interval=_discretization_for(event, delta),
        )
        acc.compose(event)
        eps = float(acc.get_epsilon(delta))
        with _PLD_MEMO_LOCK:
            if len(_PLD_MEMO) >= _PLD_MEMO_SIZE:
                _PLD_MEMO.pop(next(iter(_PLD_MEMO)))
            _PLD_MEMO[key] = eps
    if pure is not None:
        eps = min(eps, pure)
    return eps


# epsilon_of's PLD answers by (repr(event), delta): a release asks for the same event's epsilon
# several times (calibration, the receipt, the log), each a fresh PLD of 0.1-1 s. The repr of a
# dp_accounting event names every field (attrs), floats exactly, so equal keys are equal events;
# a pure function of public parameters. Oldest entry out first.
_PLD_MEMO: dict = {}
_PLD_MEMO_SIZE = 512
_PLD_MEMO_LOCK = threading.Lock()  # releases may run in threads of one driver


class RunningEpsilon:
    """Epsilon of a sequence of events composed one after another, for progress reports.

    ``add(event)`` composes the next event, ``epsilon()`` states the epsilon of everything
    added so far at ``delta`` (PLD, add/remove mode, as :func:`epsilon_of`). The grid step is
    the one :func:`epsilon_of` uses for ``final`` (the whole sequence): coarser than that
    function would take for a prefix, and the pessimistic discretisation states an upper bound
    for any step, so every value is an upper bound on the prefix's epsilon. The PLD of one
    leaf (a Gaussian, a Laplace, a Poisson-sampled Gaussian of given parameters) is built once
    and self-composed as often as the events repeat it: reporting ``m`` points of ``T`` DP-SGD
    steps costs one single-step PLD, not ``m`` PLDs of everything from the start. The leaves
    are built as dp_accounting's PLD accountant builds them; another leaf is refused.
    """

    def __init__(self, final: _ev.DpEvent, delta: float):
        from dp_accounting.pld import privacy_loss_distribution as _pld

        if not (0.0 < delta < 1.0):
            raise ParameterError(f"The 'delta' parameter must be in (0, 1). Got {delta!r} instead.")
        self.delta = float(delta)
        self._grid = _discretization_for(final, delta)
        self._lib = _pld
        self._pld = _pld.identity(value_discretization_interval=self._grid)
        self._base: dict = {}
        self._empty = True

    def _leaf(self, leaf: _ev.DpEvent, count: int):
        grid, rel = self._grid, dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
        if isinstance(leaf, _ev.GaussianDpEvent) and leaf.noise_multiplier > 0:
            # as the accountant: count Gaussians are one Gaussian of std z / sqrt(count)
            return self._lib.from_gaussian_mechanism(
                standard_deviation=leaf.noise_multiplier / math.sqrt(count),
                value_discretization_interval=grid, neighboring_relation=rel)
        key = repr(leaf)
        base = self._base.get(key)
        if base is None:
            if isinstance(leaf, _ev.LaplaceDpEvent) and leaf.noise_multiplier > 0:
                base = self._lib.from_laplace_mechanism(parameter=leaf.noise_multiplier,
                                                        value_discretization_interval=grid)
            elif isinstance(leaf, _ev.PoissonSampledDpEvent) and isinstance(leaf.event, _ev.GaussianDpEvent) \
                    and leaf.event.noise_multiplier > 0 and leaf.sampling_probability > 0:
                base = self._lib.from_gaussian_mechanism(
                    standard_deviation=leaf.event.noise_multiplier, value_discretization_interval=grid,
                    sampling_prob=leaf.sampling_probability, neighboring_relation=rel)
            else:
                raise ValueError(f"RunningEpsilon composes Gaussian, Laplace and Poisson-sampled Gaussian "
                                 f"events only; got {type(leaf).__name__}")
            self._base[key] = base
        composed = self._base.get((key, int(count)))
        if composed is None:  # equal chunks of steps: one self-composition each
            composed = self._base[(key, int(count))] = base.self_compose(int(count))
        return composed

    def add(self, event: _ev.DpEvent) -> "RunningEpsilon":
        for leaf, count in _leaves(event):
            if not isinstance(leaf, _ev.NoOpDpEvent) and count > 0:
                self._pld = self._pld.compose(self._leaf(leaf, count))
                self._empty = False
        return self

    def epsilon(self) -> float:
        return 0.0 if self._empty else float(self._pld.get_epsilon_for_delta(self.delta))


def fit_to_epsilon(event_for: Callable[[float], _ev.DpEvent], *, epsilon: float, delta: float,
                   caller: str = "fit_to_epsilon", max_steps: int = 12) -> float:
    """A factor ``r`` in (0, 1] with ``epsilon_of(event_for(r), delta) <= epsilon``.

    For calibrations whose privacy parameter (a Gaussian-DP ``mu``, say) is
    computed analytically: ``event_for(r)`` builds the event with that parameter
    scaled by ``r``. The accountant (PLD, pessimistic discretisation) can state a
    little more than the analytic value; receipts and the ledger state the
    accountant's epsilon, so that is what must meet the request. ``r = 1`` is
    kept when it does; otherwise ``r`` is shrunk by the ratio ``epsilon / stated``
    and a margin that doubles at every step, until the accountant agrees
    (epsilon grows at least linearly with ``mu``, so one step is usually enough).
    """
    r = 1.0
    margin = 2.0**-40
    for _ in range(max_steps):
        stated = epsilon_of(event_for(r), delta)
        if stated <= epsilon:
            return r
        r *= min(epsilon / stated, 1.0) * (1.0 - margin)
        margin *= 4.0
    raise ParameterError(
        f"{caller} could not calibrate its noise so that the accounted epsilon is at most "
        f"{epsilon!r} at delta={delta!r}; try a larger epsilon or delta."
    )


def event_to_dict(event: _ev.DpEvent) -> dict:
    """A JSON-ready dict of ``event`` (dp_accounting's named-tuple form)."""

    def conv(v):
        if hasattr(v, "_asdict"):
            d = v._asdict()
            d.pop("module_name", None)
            return {k: conv(x) for k, x in d.items()}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        return v

    return conv(event.to_named_tuple())


def event_from_dict(d: dict) -> _ev.DpEvent:
    """Rebuild an event written by :func:`event_to_dict` (allow-listed classes only)."""
    if not isinstance(d, dict) or "class_name" not in d:
        raise ParameterError(f"Not a serialized dp_accounting event: {d!r}")
    name = d["class_name"]
    cls = _ALLOWED.get(name)
    if cls is None:
        raise ParameterError(f"Unknown or disallowed dp_accounting event class {name!r}.")
    kwargs = {}
    for k, v in d.items():
        if k == "class_name":
            continue
        if isinstance(v, dict) and "class_name" in v:
            v = event_from_dict(v)
        elif isinstance(v, list):
            v = [event_from_dict(x) if isinstance(x, dict) and "class_name" in x else x for x in v]
        kwargs[k] = v
    return cls(**kwargs)


def events_to_json(event: _ev.DpEvent) -> str:
    return json.dumps(event_to_dict(event), sort_keys=True)


def events_from_json(text: str) -> _ev.DpEvent:
    return event_from_dict(json.loads(text))


def describe_event(event: _ev.DpEvent) -> str:
    """A one-line human description, e.g. ``Laplace(z=1.23) x 1; Gaussian(z=3.7) x 20``."""
    parts = []
    for leaf, count in _leaves(event):
        if isinstance(leaf, _ev.LaplaceDpEvent):
            parts.append(f"Laplace(b/Delta={leaf.noise_multiplier:.6g}) x {count}")
        elif isinstance(leaf, _ev.GaussianDpEvent):
            parts.append(f"Gaussian(sigma/Delta={leaf.noise_multiplier:.6g}) x {count}")
        elif isinstance(leaf, DeltaDpEvent):
            parts.append(f"Delta(delta={leaf.delta:.6g}) x {count}")
        else:
            parts.append(f"{type(leaf).__name__} x {count}")
    return "; ".join(parts)
