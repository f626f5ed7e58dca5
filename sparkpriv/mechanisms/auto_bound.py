"""``max_items="auto"``: the contribution bound ``L`` of an event table chosen by a DP quantile.

Declaring ``L`` (at most ``L`` distinct items, keys or stations per person) trades
truncation against noise: the noise of every release of bounded records grows
with ``L`` (counts: ``L`` in L1, ``sqrt(L)`` in L2), while people with more than
``L`` items lose the rest (their counts are then too low, and an interval
covers the count of the bounded contributions only). A user who does not
know the distribution can ask for ``auto`` (docs/math.md section 8,
"Automatic contribution bound"):

1. Each person's number ``m`` of distinct items (inside the vocabulary) is
   put in the bin of ``min(m, limit)`` of a histogram over ``0 .. limit``
   (``limit`` public: the largest ``L`` that may be chosen). The bins
   (:func:`length_edges`) are single lengths up to 8, then grow by a factor
   1.25 (about 25 bins up to 256): every bin gets the same noise, so few bins
   over the long, thin tail keep its noise from adding up.
2. The histogram gets Laplace noise (discrete, on a grid) of scale
   ``s / epsilon_q``: one person moves between two buckets under replace-one
   (L1 sensitivity ``s = 2``), or appears in one bucket under add-remove
   (``s = 1``). Pure ``epsilon_q``-DP, one ``LaplaceDpEvent``.
3. ``L`` is the largest length of the first bin at which the noisy
   cumulative count reaches ``quantile`` times the noisy total (at least 1):
   post-processing.
   The noisy counts are summed as they are, negative ones included: each
   cumulative sum is then unbiased for the true one (clamping every empty
   bucket's noise at 0 would add about ``0.8 s / epsilon_q`` per bucket and,
   over a few hundred empty buckets, push ``L`` far beyond what people hold).
   A mechanism with a rule of its own (``choose_max_items``; the synthetic
   release's error estimate) uses it instead when no quantile is given: also
   post-processing of the same noisy histogram.

``epsilon_q = share * epsilon`` (default 0.1 of it); the release runs with the
rest, and the two events are composed into the one event the ledger reserves
before any data is read. This works because a release's events do not depend
on ``L``: every mechanism calibrates its noise as a multiple of its
sensitivity, so only the noise scale, not the event, changes with ``L``
(checked for every mechanism that takes records in the tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sparkpriv._validation import Interval, check_param

__all__ = ["AutoCap", "items_histogram_fn", "choose_max_items", "histogram_noise_for", "length_edges"]

EXACT_LENGTHS = 8  # single-length bins up to here
GROWTH = 1.25  # then each bin this much wider

DEFAULT_QUANTILE = 0.95
DEFAULT_SHARE = 0.1
DEFAULT_LIMIT = 256
MAX_LIMIT = 1 << 16


@dataclass(frozen=True)
class AutoCap:
    """The public parameters of an automatic contribution bound (see the module docstring).

    ``quantile``: the share of people whose items all fit; None (the default): the mechanism's own
    rule where it has one (the synthetic release's error estimate), else 0.95.
    ``share``: the share of the release's epsilon the choice spends (default 0.1).
    ``limit``: the largest bound that may be chosen (default 256, at most the vocabulary).
    """

    quantile: float | None = None
    share: float = DEFAULT_SHARE
    limit: int = DEFAULT_LIMIT
    _caller: str = "max_items='auto'"

    def __post_init__(self):
        c = self._caller
        if self.quantile is not None:
            check_param("max_items_quantile", self.quantile, [Interval("real", 0, 1, "neither")], c)
        check_param("max_items_share", self.share, [Interval("real", 0, 0.5, "right")], c)
        check_param("max_items_limit", self.limit, [Interval("integer", 1, MAX_LIMIT, "both")], c)

    @property
    def effective_quantile(self) -> float:
        """The quantile a mechanism without a rule of its own uses (or any, when one is given)."""
        return DEFAULT_QUANTILE if self.quantile is None else float(self.quantile)

    def to_public_dict(self, rule: str | None = None, *, resolved: bool = False) -> dict:
        """``rule``: the public description of the mechanism's own rule, when it chose the bound;
        ``resolved``: the release knows which rule chooses (it says so without the caveat)."""
        if rule:
            return {"method": f"{rule} (post-processing of a Laplace histogram of the number of distinct items "
                              "per person over 0 .. limit)", "epsilon_share": self.share, "limit": self.limit}
        how = "DP quantile of the number of distinct items per person (Laplace histogram over 0 .. limit)"
        if self.quantile is None and not resolved:
            how += ("; a mechanism with a rule of its own uses that instead (contribution_bound_estimation says "
                    "which)")
        return {"method": how, "quantile": self.effective_quantile, "epsilon_share": self.share, "limit": self.limit}


def length_edges(limit: int) -> np.ndarray:
    """The first length of each bin of the histogram over ``0 .. limit`` (public, from ``limit`` alone):
    ``0, 1, ..., 8``, then each start ``ceil(1.25`` times the previous``)``; the last bin is ``limit``
    (that many items or more)."""
    limit = int(limit)
    e = list(range(0, min(EXACT_LENGTHS, limit) + 1))
    while e[-1] < limit:
        e.append(min(limit, max(e[-1] + 1, int(math.ceil(e[-1] * GROWTH)))))
    return np.asarray(e, dtype=np.int64)


def histogram_noise_for(*, epsilon: float, neighbors: str, limit: int):
    """The Laplace noise of the histogram over the bins of ``0 .. limit`` (one event; module docstring)."""
    from sparkpriv.privacy.quantile import histogram_noise, wide_histogram_noise

    return wide_histogram_noise(histogram_noise(epsilon=epsilon, neighbors=neighbors,
                                                buckets=int(length_edges(limit).size)))


def items_histogram_fn(limit: int):
    """Block of records bounded at ``limit`` items -> the number of people in each bin of
    :func:`length_edges` (``(len(length_edges(limit)),)``)."""
    edges = length_edges(limit)
    size = edges.size

    def items_histogram(block):
        m = np.minimum(np.diff(np.asarray(block.offsets, dtype=np.int64)), edges[-1])
        return np.bincount(np.searchsorted(edges, m, side="right") - 1, minlength=size).astype(np.float64)

    return items_histogram


def choose_max_items(noisy: np.ndarray, quantile: float, limit: int | None = None) -> int:
    """The largest length of the first bin whose noisy cumulative count reaches ``quantile`` of the
    noisy total (at least 1).

    ``noisy[j]``: the noisy number of people in bin ``j`` of :func:`length_edges` ``(limit)`` (the
    last: ``limit`` or more), summed as they are (unbiased cumulative sums; module docstring).
    ``limit`` defaults to the histogram of single lengths ``0 .. len(noisy) - 1``. Post-processing
    of the noisy histogram only; ``limit`` when the total is not positive or no bin reaches it.
    """
    c = np.asarray(noisy, dtype=np.float64)
    edges = np.arange(c.size) if limit is None else length_edges(limit)
    if edges.size != c.size:
        raise ValueError(f"a histogram of {c.size} bins for {edges.size} bins of 0..{limit}")
    top = int(edges[-1])
    total = c.sum()
    if total <= 0:
        return max(1, top)
    cum = np.cumsum(c)
    hit = np.flatnonzero(cum >= quantile * total)
    if not hit.size or hit[0] == edges.size - 1:
        return max(1, top)
    return max(1, int(edges[hit[0] + 1]) - 1)


# The events of a release do not depend on L mathematically, but its discrete noise is calibrated on
# a power-of-two grid relative to the sensitivity, so a noise multiplier can move in its last bits
# (relative 1e-13 seen) with L. The reservation therefore uses the events planned at the limit with
# every noise multiplier lowered by MULTIPLIER_MARGIN (a slightly larger spend), and the release run at
# the chosen L must add at least that much noise (``dominates``): the receipt and the ledger never
# state less than was spent. The release is planned at ``(1 - EPSILON_MARGIN)`` of its share so the
# reserved total stays within the request.
MULTIPLIER_MARGIN = 1e-9
EPSILON_MARGIN = 1e-6


def discount_event(event, margin: float = MULTIPLIER_MARGIN):
    """``event`` with every noise multiplier lowered by the relative ``margin`` (a larger spend)."""
    import dp_accounting as dpa

    if isinstance(event, dpa.LaplaceDpEvent):
        return dpa.LaplaceDpEvent(event.noise_multiplier * (1.0 - margin))
    if isinstance(event, dpa.GaussianDpEvent):
        return dpa.GaussianDpEvent(event.noise_multiplier * (1.0 - margin))
    if isinstance(event, dpa.PoissonSampledDpEvent):
        return dpa.PoissonSampledDpEvent(event.sampling_probability, discount_event(event.event, margin))
    if isinstance(event, dpa.SelfComposedDpEvent):
        return dpa.SelfComposedDpEvent(discount_event(event.event, margin), event.count)
    if isinstance(event, dpa.ComposedDpEvent):
        return dpa.ComposedDpEvent([discount_event(e, margin) for e in event.events])
    from sparkpriv.privacy.accounting import DeltaDpEvent

    if isinstance(event, (dpa.NoOpDpEvent, DeltaDpEvent)):  # nothing to discount: no noise multiplier
        return event
    raise TypeError(f"an event of type {type(event).__name__} cannot be discounted")


def dominates(actual, reserved) -> bool:
    """True when ``actual`` spends at most ``reserved``: the same events, each noise multiplier at least
    the reserved one (the same sampling rates and counts)."""
    import dp_accounting as dpa

    if type(actual) is not type(reserved):
        return False
    if isinstance(actual, (dpa.LaplaceDpEvent, dpa.GaussianDpEvent)):
        return actual.noise_multiplier >= reserved.noise_multiplier
    if isinstance(actual, dpa.PoissonSampledDpEvent):
        return (actual.sampling_probability == reserved.sampling_probability
                and dominates(actual.event, reserved.event))
    if isinstance(actual, dpa.SelfComposedDpEvent):
        return actual.count == reserved.count and dominates(actual.event, reserved.event)
    if isinstance(actual, dpa.ComposedDpEvent):
        return len(actual.events) == len(reserved.events) and all(
            dominates(a, r) for a, r in zip(actual.events, reserved.events))
    return actual == reserved
