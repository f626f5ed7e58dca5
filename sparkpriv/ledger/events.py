"""Events as the ledger stores, validates and composes them (docs/ledger.md).

Every event is validated before it is composed or stored, and every stored
event is validated again, the same way, when it is read: only the classes the
ledger can account (Gaussian, Laplace, discrete Laplace, no-op, non-private,
a Poisson-sampled Gaussian ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``
(DP-SGD), sparkpriv's ``DeltaDpEvent(delta)`` (a ``(0, delta)`` mechanism: DP
partition selection), and their compositions ``ComposedDpEvent`` / ``SelfComposedDpEvent``), finite
positive parameters, positive integer counts, at most ``MAX_DEPTH`` levels and
``MAX_NODES`` events.

Stored form (event format 2)::

    {"event": {...event_to_dict form...}, "event_format": 2, "dp_accounting": "0.6.0"}

Entries written before the stamp existed hold the bare ``{...}`` dict and are
read as format 1 (same event encoding). A format this sparkpriv does not know
is refused, never guessed at.

Composition. A validated event reduces to a :class:`Spend`: the sum of
``count / z**2`` over its Gaussian leaves (the composition of Gaussian
mechanisms that each shift by at most one sensitivity is exactly one Gaussian
mechanism with ``1 / z_eq**2 = sum 1 / z_i**2``, docs/math.md section 1), and
the Laplace and discrete-Laplace leaves grouped by parameter with their counts,
and the Poisson-sampled Gaussians grouped by ``(q, z)`` with their counts.
Reducing a table's history is linear in its length and composing it costs the
same whatever the number of distinct Gaussian noise multipliers: see
:meth:`Spend.epsilon`.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import numbers
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping

import dp_accounting
from dp_accounting import dp_event as _ev
from scipy import special

from sparkpriv.errors import ParameterError
from sparkpriv.privacy.accounting import DeltaDpEvent, compose, epsilon_of

__all__ = ["EVENT_FORMAT", "DP_ACCOUNTING_VERSION", "Spend", "InvalidEvent", "encode_event", "decode_stored",
           "spend_of_stored", "event_from_checked_dict"]

#: The sparkpriv event-format version written with every stored event.
EVENT_FORMAT = 2
READABLE_FORMATS = (1, 2)


def _dp_accounting_version() -> str:
    try:
        return importlib.metadata.version("dp-accounting")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - e.g. a vendored copy
        return str(getattr(dp_accounting, "__version__", "unknown"))


DP_ACCOUNTING_VERSION = _dp_accounting_version()
MAX_DEPTH = 32
MAX_NODES = 10_000
MAX_COUNT = 10**9
#: Above this epsilon (of the Gaussian part, or the pure sum of the Laplace part) no PLD is built.
_PLD_LIMIT = 50.0

_LEAVES = {
    "GaussianDpEvent": ("noise_multiplier",),
    "LaplaceDpEvent": ("noise_multiplier",),
    "DiscreteLaplaceDpEvent": ("noise_parameter", "sensitivity"),
    "NoOpDpEvent": (),
    "NonPrivateDpEvent": (),
    "DeltaDpEvent": ("delta",),
}
_WRAPPERS = {"ComposedDpEvent": ("events",), "SelfComposedDpEvent": ("event", "count"),
             "PoissonSampledDpEvent": ("sampling_probability", "event")}  # of a GaussianDpEvent only
_CLASSES = {name: getattr(_ev, name, None) or DeltaDpEvent for name in (*_LEAVES, *_WRAPPERS)}
KNOWN_CLASSES = tuple(_CLASSES)


class InvalidEvent(ValueError):
    """An event (given or stored) that the ledger cannot account; the message says why."""


# -- from a DpEvent object to its checked dict ------------------------------------------


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidEvent(f"{where} must be a number; got a {type(value).__name__}")
    x = float(value)
    if not (math.isfinite(x) and x > 0.0):
        raise InvalidEvent(f"{where} must be finite and > 0; got {x!r}")
    return x


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidEvent(f"{where} must be a positive integer; got a {type(value).__name__} ({_short(value)})")
    n = int(value)
    if not 1 <= n <= MAX_COUNT:
        raise InvalidEvent(f"{where} must be an integer in [1, {MAX_COUNT}]; got {n}")
    return n


def _probability(value: Any) -> float:
    q = _number(value, "PoissonSampledDpEvent.sampling_probability")
    if q > 1.0:
        raise InvalidEvent(f"PoissonSampledDpEvent.sampling_probability must be in (0, 1]; got {q!r}")
    return q


def _delta(value: Any) -> float:
    d = _number(value, "DeltaDpEvent.delta")
    if d >= 1.0:
        raise InvalidEvent(f"DeltaDpEvent.delta must be in (0, 1); got {d!r}")
    return d


def _short(value: Any) -> str:
    if isinstance(value, (int, float)):
        return repr(value)
    return type(value).__name__


def event_to_checked_dict(event: Any) -> dict:
    """The stored dict of ``event`` (plain floats and ints), or :class:`InvalidEvent`."""
    nodes = [0]

    def walk(e: Any, depth: int) -> dict:
        if depth > MAX_DEPTH:
            raise InvalidEvent(f"events are nested more than {MAX_DEPTH} levels deep")
        nodes[0] += 1
        if nodes[0] > MAX_NODES:
            raise InvalidEvent(f"an event may hold at most {MAX_NODES} events")
        name = type(e).__name__
        if _CLASSES.get(name) is not type(e):
            raise InvalidEvent(f"{name} is not an event class the ledger accounts ({', '.join(KNOWN_CLASSES)})")
        d: dict = {"class_name": name}
        if name == "ComposedDpEvent":
            events = e.events
            if not isinstance(events, (list, tuple)):
                raise InvalidEvent("ComposedDpEvent.events must be a list of events")
            d["events"] = [walk(x, depth + 1) for x in events]
        elif name == "SelfComposedDpEvent":
            d["event"] = walk(e.event, depth + 1)
            d["count"] = _count(e.count, "SelfComposedDpEvent.count")
        elif name == "PoissonSampledDpEvent":
            d["sampling_probability"] = _probability(e.sampling_probability)
            if type(e.event) is not _ev.GaussianDpEvent:
                raise InvalidEvent("PoissonSampledDpEvent.event must be a GaussianDpEvent")
            d["event"] = walk(e.event, depth + 1)
        elif name == "DiscreteLaplaceDpEvent":
            d["noise_parameter"] = _number(e.noise_parameter, "DiscreteLaplaceDpEvent.noise_parameter")
            d["sensitivity"] = _count(e.sensitivity, "DiscreteLaplaceDpEvent.sensitivity")
        elif name == "DeltaDpEvent":
            d["delta"] = _delta(e.delta)
        else:
            for attr in _LEAVES[name]:
                d[attr] = _number(getattr(e, attr), f"{name}.{attr}")
        return d

    return walk(event, 0)


# -- the spend of a checked dict ---------------------------------------------------------


@dataclass(frozen=True)
class Spend:
    """What a set of events spends, reduced exactly (see the module docstring).

    ``mu2`` is ``sum count / z**2`` over Gaussian leaves (``gaussians`` of them),
    ``laplace`` holds ``(noise multiplier, total count)`` pairs of Laplace leaves,
    ``discrete`` holds ``((noise_parameter, sensitivity), total count)`` pairs,
    ``sampled`` ``((q, z), total count)`` pairs of Poisson-sampled Gaussians,
    ``deltas`` ``(delta, total count)`` pairs of :class:`DeltaDpEvent` leaves.
    """

    mu2: float = 0.0
    gaussians: int = 0
    laplace: tuple = ()
    discrete: tuple = ()
    nonprivate: bool = False
    sampled: tuple = ()
    deltas: tuple = ()

    def __add__(self, other: "Spend") -> "Spend":
        return Spend.total((self, other))

    @classmethod
    def total(cls, spends) -> "Spend":
        mu2, gaussians, nonprivate = [], 0, False
        laplace: Counter = Counter()
        discrete: Counter = Counter()
        sampled: Counter = Counter()
        deltas: Counter = Counter()
        for s in spends:
            if s.gaussians:
                mu2.append(s.mu2)
                gaussians += s.gaussians
            for k, n in s.laplace:
                laplace[k] += n
            for k, n in s.discrete:
                discrete[k] += n
            for k, n in s.sampled:
                sampled[k] += n
            for k, n in s.deltas:
                deltas[k] += n
            nonprivate = nonprivate or s.nonprivate
        return cls(math.fsum(mu2), gaussians, tuple(sorted(laplace.items())), tuple(sorted(discrete.items())),
                   nonprivate, tuple(sorted(sampled.items())), tuple(sorted(deltas.items())))

    def pure_epsilon_exact(self):
        """The exact epsilon (a :class:`fractions.Fraction`) of a spend of pure events only.

        ``sum count / b`` over Laplace leaves plus ``sum count * a * s`` over
        discrete-Laplace leaves, in rational arithmetic on the stored floats, so
        the budget comparison of a pure table has no rounding at all (a float sum
        such as ten times 0.1 rounds to exactly 1.0 although it exceeds 1).
        None when the spend has Gaussian or non-private events.
        """
        if self.gaussians or self.nonprivate or self.sampled or self.deltas:
            return None
        return (sum((Fraction(n) / Fraction(b) for b, n in self.laplace), Fraction(0))
                + sum((Fraction(n) * Fraction(a) * Fraction(s) for (a, s), n in self.discrete), Fraction(0)))

    @property
    def empty(self) -> bool:
        return not (self.gaussians or self.laplace or self.discrete or self.nonprivate or self.sampled
                    or self.deltas)

    def figure(self, delta: float) -> tuple[float, Fraction | None]:
        """The ledger's one figure for this spend at ``delta``: ``(epsilon, exact)``.

        ``epsilon`` is what the ledger states and compares with a budget;
        ``exact`` is the same figure as a :class:`fractions.Fraction` when it is
        the exact sum of pure epsilons (then the budget comparison is made on
        it, without rounding), else None. The rule (docs/ledger.md, "The
        composition rule"):

        * nothing: 0; a non-private event, or an approximate-DP event at
          ``delta = 0``: ``inf``;
        * pure events only (Laplace, discrete Laplace) at ``delta = 0``: the
          exact sum of their epsilons;
        * pure events only at ``delta > 0``: the smaller of dp_accounting's PLD
          epsilon at ``delta`` and the exact sum (both are valid bounds; when
          the sum is the smaller, it is the figure, compared exactly);
        * otherwise the composition (exact for Gaussian events only,
          dp_accounting's PLD for a mix; see :meth:`_compose`).

        ``epsilon`` never states less than ``exact`` (a float sum is rounded up).
        """
        exact = self.pure_epsilon_exact()
        if exact is None or self.empty:
            return self._compose(delta), (Fraction(0) if self.empty else None)
        if delta > 0.0:
            pld = self._compose(delta)  # min(PLD, the float sum of the pure epsilons)
            if pld < math.fsum([n / b for b, n in self.laplace] + [n * a * s for (a, s), n in self.discrete]):
                return pld, None
        return _float_up(exact), exact

    def epsilon(self, delta: float) -> float:
        """The epsilon the ledger states for this spend at ``delta``: ``figure(delta)[0]``."""
        return self.figure(delta)[0]

    def _compose(self, delta: float) -> float:
        """Epsilon at ``delta`` of the composition of every event in this spend.

        * nothing: 0; a non-private event: ``inf``; a Gaussian at ``delta = 0``: ``inf``;
        * Gaussian events only: the exact epsilon of the one equivalent Gaussian
          mechanism (Balle & Wang 2018, Thm 8), found by bisection and rounded up;
        * otherwise dp_accounting's PLD epsilon (``sparkpriv.privacy.accounting.epsilon_of``,
          the exact sum for pure events at ``delta = 0``) of the equivalent Gaussian
          composed with the grouped Laplace events;
        * with delta events (``deltas``): the rest's epsilon at ``(delta - delta_x) / (1 - delta_x)``,
          ``delta_x = 1 - prod (1 - delta_i)`` (``inf`` when ``delta < delta_x``; docs/math.md
          section 11).

        :meth:`figure` is what the ledger states and admits by; this is its
        composition step (for pure events it may state less than the exact sum
        by a rounding of the float sum; :meth:`figure` compares exactly).
        """
        if self.nonprivate:
            return math.inf
        if self.deltas:
            parts = [DeltaDpEvent(d) if n == 1 else _ev.SelfComposedDpEvent(DeltaDpEvent(d), n)
                     for d, n in self.deltas]
            from sparkpriv.privacy.accounting import delta_part

            dx = delta_part(compose(parts))
            if delta < dx:
                return math.inf
            rest = Spend(self.mu2, self.gaussians, self.laplace, self.discrete, False, self.sampled)
            if rest.empty:
                return 0.0
            rest_delta = max(0.0, (delta - dx) / (1.0 - dx))
            if rest_delta == 0.0 and (rest.gaussians or rest.sampled):
                return math.inf
            return rest.epsilon(rest_delta)
        if (self.gaussians or self.sampled) and delta == 0.0:
            return math.inf
        if self.empty:
            return 0.0
        if not math.isfinite(self.mu2):
            return math.inf
        z = _equivalent_multiplier(self.mu2) if self.gaussians else None
        if not (self.laplace or self.discrete or self.sampled):
            return gaussian_epsilon(z, delta)
        pure = math.fsum([n / b for b, n in self.laplace] + [n * a * s for (a, s), n in self.discrete])
        gauss = 0.0 if z is None else gaussian_epsilon(z, delta)
        if gauss > _PLD_LIMIT or pure > _PLD_LIMIT:
            # Far beyond any budget, where PLD grids get huge: basic composition (the Gaussian
            # part at delta, a Poisson-sampled Gaussian counted as the Gaussian itself (q = 1),
            # which dominates it; the Laplace parts pure) is a cheap upper bound.
            if self.sampled:
                unsampled = math.fsum([self.mu2 if self.gaussians else 0.0]
                                      + [n / zs**2 for (_, zs), n in self.sampled])
                gauss = gaussian_epsilon(_equivalent_multiplier(unsampled), delta)
            return gauss + pure
        parts: list = [] if z is None else [_ev.GaussianDpEvent(z)]
        for (q, zs), n in self.sampled:
            leaf = _ev.PoissonSampledDpEvent(q, _ev.GaussianDpEvent(zs))
            parts.append(leaf if n == 1 else _ev.SelfComposedDpEvent(leaf, n))
        for b, n in self.laplace:
            leaf = _ev.LaplaceDpEvent(b)
            parts.append(leaf if n == 1 else _ev.SelfComposedDpEvent(leaf, n))
        for (a, s), n in self.discrete:
            leaf = _ev.DiscreteLaplaceDpEvent(a, s)
            parts.append(leaf if n == 1 else _ev.SelfComposedDpEvent(leaf, n))
        try:
            return float(epsilon_of(compose(parts), delta))
        except dp_accounting.UnsupportedEventError as exc:  # pragma: no cover - classes are allow-listed
            raise ParameterError(f"dp_accounting's PLD accountant cannot account this event: {exc}") from exc


def _float_up(x: Fraction) -> float:
    """The smallest float not below ``x``."""
    f = float(x)
    return math.nextafter(f, math.inf) if Fraction(f) < x else f


def _equivalent_multiplier(mu2: float) -> float:
    """``1 / sqrt(mu2)``, rounded down (a smaller multiplier states more loss)."""
    mu2 = max(mu2, 1e-24)  # an underflowed sum of tiny terms must not read as "no Gaussian"
    return (1.0 / math.sqrt(mu2)) * (1.0 - 1e-12)


def _gaussian_delta(z: float, eps: float) -> float:
    a = -eps * z + 1.0 / (2.0 * z)
    b = -eps * z - 1.0 / (2.0 * z)
    return float(special.ndtr(a) - math.exp(eps + special.log_ndtr(b)))


def gaussian_epsilon(z: float, delta: float) -> float:
    """Smallest epsilon (up to 1e-9 relative, rounded up) with ``delta(epsilon) <= delta``.

    ``delta(epsilon)`` is the exact privacy curve of the Gaussian mechanism with
    noise multiplier ``z`` (sigma over sensitivity); it decreases in epsilon.
    The target is tightened by 1e-9 relative to absorb the rounding of ``ndtr``.
    """
    target = delta * (1.0 - 1e-9)
    if _gaussian_delta(z, 0.0) <= target:
        return 0.0
    hi = 1.0
    while _gaussian_delta(z, hi) > target:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    lo = 0.0
    while hi - lo > 1e-10 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if _gaussian_delta(z, mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def spend_of_dict(d: Any) -> Spend:
    """Validate a stored-form dict and reduce it; :class:`InvalidEvent` says what is wrong."""
    if type(d) is dict and len(d) == 2 and d.get("class_name") == "GaussianDpEvent" and "noise_multiplier" in d:
        z = _number(d["noise_multiplier"], "GaussianDpEvent.noise_multiplier")  # the common case, fast
        return Spend((1.0 / z) ** 2 if z > 1e-150 else math.inf, 1)
    mu2: list[float] = []
    gaussians = [0]
    nonprivate = [False]
    laplace: Counter = Counter()
    discrete: Counter = Counter()
    sampled: Counter = Counter()
    deltas: Counter = Counter()
    nodes = [0]

    def walk(x: Any, mult: int, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise InvalidEvent(f"events are nested more than {MAX_DEPTH} levels deep")
        nodes[0] += 1
        if nodes[0] > MAX_NODES:
            raise InvalidEvent(f"an event may hold at most {MAX_NODES} events")
        if not isinstance(x, dict) or not isinstance(x.get("class_name"), str):
            raise InvalidEvent("not a serialized dp_accounting event (no class_name)")
        name = x["class_name"]
        expected = _LEAVES.get(name, _WRAPPERS.get(name))
        if expected is None:
            raise InvalidEvent(f"{name[:80]!r} is not an event class the ledger accounts")
        if set(x) != {"class_name", *expected}:
            raise InvalidEvent(f"{name} must have exactly the fields {', '.join(expected) or '(none)'}")
        if name == "ComposedDpEvent":
            if not isinstance(x["events"], list):
                raise InvalidEvent("ComposedDpEvent.events must be a list")
            for e in x["events"]:
                walk(e, mult, depth + 1)
        elif name == "SelfComposedDpEvent":
            n = _count(x["count"], "SelfComposedDpEvent.count")
            if mult * n > MAX_COUNT:
                raise InvalidEvent(f"the total count of a leaf event must be at most {MAX_COUNT}")
            walk(x["event"], mult * n, depth + 1)
        elif name == "PoissonSampledDpEvent":
            q = _probability(x["sampling_probability"])
            inner = x["event"]
            if not (isinstance(inner, dict) and inner.get("class_name") == "GaussianDpEvent"
                    and set(inner) == {"class_name", "noise_multiplier"}):
                raise InvalidEvent("PoissonSampledDpEvent.event must be a GaussianDpEvent")
            nodes[0] += 1
            sampled[(q, _number(inner["noise_multiplier"], "GaussianDpEvent.noise_multiplier"))] += mult
        elif name == "GaussianDpEvent":
            z = _number(x["noise_multiplier"], "GaussianDpEvent.noise_multiplier")
            mu2.append(mult * ((1.0 / z) ** 2 if z > 1e-150 else math.inf))
            gaussians[0] += mult
        elif name == "LaplaceDpEvent":
            laplace[_number(x["noise_multiplier"], "LaplaceDpEvent.noise_multiplier")] += mult
        elif name == "DiscreteLaplaceDpEvent":
            key = (_number(x["noise_parameter"], "DiscreteLaplaceDpEvent.noise_parameter"),
                   _count(x["sensitivity"], "DiscreteLaplaceDpEvent.sensitivity"))
            discrete[key] += mult
        elif name == "NonPrivateDpEvent":
            nonprivate[0] = True
        elif name == "DeltaDpEvent":
            deltas[_delta(x["delta"])] += mult

    walk(d, 1, 0)
    return Spend(math.fsum(mu2), gaussians[0], tuple(sorted(laplace.items())), tuple(sorted(discrete.items())),
                 nonprivate[0], tuple(sorted(sampled.items())), tuple(sorted(deltas.items())))


def event_from_checked_dict(d: Mapping) -> _ev.DpEvent:
    """Rebuild the DpEvent of a dict that :func:`spend_of_dict` accepted."""
    cls = _CLASSES[d["class_name"]]
    kwargs = {}
    for k, v in d.items():
        if k == "class_name":
            continue
        if k == "event":
            v = event_from_checked_dict(v)
        elif k == "events":
            v = [event_from_checked_dict(e) for e in v]
        kwargs[k] = v
    return cls(**kwargs)


# -- stored text -------------------------------------------------------------------------


def encode_event(event: Any) -> tuple[str, Spend]:
    """Stored text (format ``EVENT_FORMAT``) and spend of a given event, or :class:`InvalidEvent`."""
    d = event_to_checked_dict(event)
    spend = spend_of_dict(d)
    text = json.dumps({"event": d, "event_format": EVENT_FORMAT, "dp_accounting": DP_ACCOUNTING_VERSION},
                      sort_keys=True, allow_nan=False)
    return text, spend


@dataclass(frozen=True)
class Stored:
    """A decoded stored event: its dict, format, dp_accounting version (None for format 1) and spend."""

    event: dict
    event_format: int
    dp_accounting: str | None
    spend: Spend

    @property
    def event_json(self) -> str:
        return json.dumps(self.event, sort_keys=True)


class UnknownFormat(InvalidEvent):
    """The stored event has a format this sparkpriv does not read."""


_NUM = r"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"
_LEAF = r'\{"class_name": "(GaussianDpEvent|LaplaceDpEvent)", "noise_multiplier": ' + _NUM + r"\}"
#: The two texts a single Gaussian or Laplace release is stored as (formats 2 and 1), exactly as
#: ``json.dumps(..., sort_keys=True)`` writes them; anything else takes the general path.
_FAST_2 = re.compile(r'\{"dp_accounting": "([0-9A-Za-z.+_-]{1,40})", "event": ' + _LEAF + r', "event_format": 2\}')
_FAST_1 = re.compile(_LEAF)


def _fast(text: str) -> Stored | None:
    m = _FAST_2.fullmatch(text)
    if m is not None:
        version, name, number = m.groups()
        fmt = 2
    else:
        m = _FAST_1.fullmatch(text)
        if m is None:
            return None
        (name, number), version, fmt = m.groups(), None, 1
    x = _number(float(number), f"{name}.noise_multiplier")  # the same check as the general path
    event = {"class_name": name, "noise_multiplier": x}
    if name == "GaussianDpEvent":
        spend = Spend((1.0 / x) ** 2 if x > 1e-150 else math.inf, 1)
    else:
        spend = Spend(laplace=((x, 1),))
    return Stored(event, fmt, version, spend)


def decode_stored(text: Any) -> Stored:
    """Parse and validate one stored event; :class:`InvalidEvent` (or :class:`UnknownFormat`) if it cannot be used."""
    if isinstance(text, str) and len(text) < 200:
        fast = _fast(text)
        if fast is not None:
            return fast
    if not isinstance(text, str):
        raise InvalidEvent(f"the stored events are a {type(text).__name__}, not JSON text")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidEvent(f"the stored events are not valid JSON ({type(exc).__name__})") from None
    if isinstance(obj, dict) and "event_format" in obj:
        fmt = obj["event_format"]
        if isinstance(fmt, bool) or not isinstance(fmt, int):
            raise InvalidEvent("its event_format is not an integer")
        if fmt != EVENT_FORMAT:
            raise UnknownFormat(
                f"it was written in event format {fmt} (dp_accounting {str(obj.get('dp_accounting'))[:40]}); "
                f"this sparkpriv reads event formats {', '.join(map(str, READABLE_FORMATS))}. Read this ledger "
                "with the sparkpriv version that wrote it, or a newer one"
            )
        if set(obj) != {"event", "event_format", "dp_accounting"} or not isinstance(obj["dp_accounting"], str):
            raise InvalidEvent("its format-2 envelope must have exactly event, event_format and dp_accounting")
        event, version = obj["event"], obj["dp_accounting"]
    elif isinstance(obj, dict) and "class_name" in obj:
        fmt, event, version = 1, obj, None  # written before the format stamp existed
    else:
        raise InvalidEvent("it is neither a stamped event nor a format-1 event")
    return Stored(event, fmt, version, spend_of_dict(event))


class _Cache:
    """Decoded stored events by their text (a pure function of it), bounded in size."""

    def __init__(self, size: int = 200_000):
        self._size = size
        self._map: dict[str, Stored] = {}

    def get(self, text: str) -> Stored:
        hit = self._map.get(text)
        if hit is None:
            hit = decode_stored(text)
            if len(self._map) >= self._size:
                self._map.clear()
            self._map[text] = hit
        return hit


_CACHE = _Cache()


def spend_of_stored(text: str) -> Stored:
    """:func:`decode_stored`, memoized by the stored text."""
    return _CACHE.get(text)
