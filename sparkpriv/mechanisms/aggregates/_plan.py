"""The plan of an aggregates release, made from public parameters before any data is read: the budget
split over the measured groups, each group's noise, the partition-selection threshold, the stated
uncertainty, and the one dp_accounting event (docs/math.md section 11).

* **Split.** Each group ``g`` gets a weight ``w_g`` (default 1). Laplace: ``epsilon_g = w_g / sum w
  epsilon`` (rounded down: the parts never exceed the whole), pure epsilon, one ``LaplaceDpEvent``
  per group; their sum is the release's epsilon. Gaussian: the Gaussian-DP ``mu`` of the whole
  (analytic Gaussian at ``(epsilon, delta)``) is split as ``mu_g = sqrt(w_g / sum w) mu``
  (``sum mu_g^2 = mu^2``: exact composition, zCDP / GDP), one ``GaussianDpEvent`` per group, the
  composition checked by dp_accounting's PLD (and shrunk until it is at most ``epsilon``).
* **Private keys.** Without a public key domain a key is released only if its noisy number of
  people reaches ``tau``: the smallest ``1 + m g`` (``g`` the noise grid, ``m`` integer) with
  ``P(N >= m) <= delta_sel / L`` for the integer noise ``N`` of the people group. A key one person
  alone holds (exact count 1) is then released with probability at most ``delta_sel / L``; one
  person holds at most ``L`` keys, so the whole selection adds ``delta_sel`` (Laplace
  thresholding, Korolova et al. 2009, Wilson et al. 2020). It is recorded as a
  :class:`~sparkpriv.privacy.accounting.DeltaDpEvent` beside the noise events. Keys present on both
  sides are covered by the groups' noise.
* **Public caps.** Each group's per-key total is clamped to ``[-cap_g, cap_g]`` before the noise
  (``cap_g = min(2^33 a_g, 2^31 s_g)``, ``s_g`` the noise scale in data units): the noise grid then
  holds every value (no data-dependent failure), and a per-coordinate clamp never raises a
  sensitivity. ``2^33`` people per key is never reached; the second term binds only at epsilons
  far beyond any budget and is stated in the receipt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sparkpriv.errors import ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import DeltaDpEvent, compose, epsilon_of
from sparkpriv.mechanisms.aggregates._query import Group, group_sensitivity, groups_of

__all__ = ["MAX_PEOPLE_PER_KEY", "Calibration", "Selection", "AggregatesPlan", "plan_aggregates",
           "split_weights", "quantile_band"]

MAX_PEOPLE_PER_KEY = 2.0**33
UNBOUNDED_KEYS = 1 << 62  # the "domain size" of private keys in the sensitivities (K = L)
_BAND_DRAWS = 20_000
_BAND_SEED = 20261205  # public: the band is a function of public parameters only
_BAND_CACHE: dict = {}


@dataclass(frozen=True)
class Calibration:
    """One group's noise and its public facts (no secret)."""

    group: Group
    sensitivity: dict
    noise: object  # LaplaceNoise or GaussianNoise
    cap: float
    share: float  # epsilon (Laplace) or mu (Gaussian) of this group
    std: float
    half_width: float  # at the release's confidence
    half_width_pair: float  # at sqrt(confidence): two noises in one interval (sum, mean)
    half_width_triple: float  # at confidence^(1/3): three noises (variance)
    rounded_std: float | None = None
    rounded_half_width: float | None = None

    def to_public_dict(self) -> dict:
        return {"group": self.group.name, "sensitivity": self.sensitivity, "cap_per_key": self.cap,
                ("epsilon" if isinstance(self.noise, _noise.LaplaceNoise) else "mu"): self.share,
                "noise": self.noise.to_public_dict(), "std": self.std}


@dataclass(frozen=True)
class Selection:
    """Private key selection: released iff the noisy people count reaches ``threshold``."""

    delta: float
    per_key_delta: float
    threshold: float
    tail_at_threshold: float  # P(a key one person alone holds is released), exact for the noise

    def to_public_dict(self) -> dict:
        return {"method": "noisy distinct-people count above a threshold (Laplace/Gaussian thresholding)",
                "delta": self.delta, "per_key_delta": self.per_key_delta, "threshold": self.threshold,
                "release_probability_of_a_key_one_person_holds": self.tail_at_threshold,
                "statement": "a key that one person alone holds is released with probability at most "
                             "per_key_delta; one person holds at most max_keys keys, so the selection adds "
                             "at most delta to the guarantee"}


@dataclass(frozen=True)
class AggregatesPlan:
    """Everything public about a calibrated aggregates release."""

    aggregates: tuple
    groups: tuple
    max_keys: int
    max_events_per_key: int
    clamps: dict  # column -> (lo, hi)
    buckets: int
    domain_size: int | None  # None: private keys
    neighbors: str
    noise_kind: str
    confidence: float
    clamp: bool
    round: bool
    calibrations: tuple
    selection: Selection | None
    events: object
    epsilon: float
    delta: float
    bands: dict = field(default_factory=dict)  # (column, p) -> simultaneous band constant z
    fit: float = 1.0  # the factor on every group's epsilon / mu that met the request

    @property
    def width(self) -> int:
        return sum(g.width for g in self.groups)

    def offsets(self) -> dict:
        out, o = {}, 0
        for g in self.groups:
            out[g.name] = o
            o += g.width
        return out

    def calibration(self, name: str) -> Calibration:
        return next(c for c in self.calibrations if c.group.name == name)

    def to_public_dict(self) -> dict:
        return {
            "aggregates": [str(a) for a in self.aggregates],
            "contribution_bound": {"max_keys": self.max_keys, "max_events_per_key": self.max_events_per_key,
                                   "events_beyond_the_cap": "each person's events at a kept key are weighted "
                                   "min(n, c) / n (the expectation of keeping a uniformly random c of them)"},
            "value_clamps": {c: list(v) for c, v in self.clamps.items()},
            "quantile_buckets": self.buckets,
            "neighbors": self.neighbors,
            "noise_kind": self.noise_kind,
            "groups": [c.to_public_dict() for c in self.calibrations],
            "budget_split": {c.group.name: c.share for c in self.calibrations},
            "key_selection": self.selection.to_public_dict() if self.selection is not None else "public domain",
            "epsilon_accounted": self.epsilon,
            "delta": self.delta,
        }


def split_weights(groups, split: dict, caller: str) -> list[float]:
    names = [g.name for g in groups]
    unknown = sorted(set(split) - set(names))
    if unknown:
        raise ParameterError(f"The 'split' parameter of {caller} names {unknown[0]!r}, which this query does not "
                             f"measure. Its groups: {', '.join(names)}.")
    w = np.array([float(split.get(n, 1.0)) for n in names])
    return list(w / w.sum())


def _laplace_parts(epsilon: float, shares: list[float]) -> list[float]:
    parts = [float(epsilon) * s for s in shares]
    while math.fsum(parts) > epsilon * (1.0 - 1e-12):
        parts = [math.nextafter(p, 0.0) * (1.0 - 1e-15) for p in parts]
    return parts


def _calibrate(group, sens, *, kind, share, caller):
    """The group's noise with the public cap of its per-key totals (module docstring)."""
    if kind == "laplace":
        nz0 = _noise.calibrate_laplace_noise(sensitivity=sens["l1"], epsilon=share, dim=sens["changed"])
        scale = nz0.scale * nz0.grid
    else:
        nz0 = _noise.gaussian_noise_from_multiplier(sensitivity=sens["l2"], noise_multiplier=1.0 / share,
                                                    dim=sens["changed"])
        scale = nz0.sigma * nz0.grid
    cap = float(min(MAX_PEOPLE_PER_KEY * sens["a"], 2.0**31 * scale))
    try:
        if kind == "laplace":
            nz = _noise.calibrate_laplace_noise(sensitivity=sens["l1"], epsilon=share, dim=sens["changed"],
                                                max_abs=cap)
        else:
            nz = _noise.gaussian_noise_from_multiplier(sensitivity=sens["l2"], noise_multiplier=1.0 / share,
                                                       dim=sens["changed"], max_abs=cap)
    except ParameterError as exc:
        raise ParameterError(f"{caller}: the noise of {group.name} cannot be calibrated: {exc}") from None
    return nz, cap


def _half_widths(nz, confidence: float, rounded: bool):
    from sparkpriv.mechanisms.counts import uncertainty

    std, hw, _ = uncertainty(nz, rounded=False, confidence=confidence)
    _, hw2, _ = uncertainty(nz, rounded=False, confidence=math.sqrt(confidence))
    _, hw3, _ = uncertainty(nz, rounded=False, confidence=confidence ** (1.0 / 3.0))
    rs = rh = None
    if rounded:
        rs, rh, _ = uncertainty(nz, rounded=True, confidence=confidence)
    return std, hw, hw2, hw3, rs, rh


def _selection(nz, L: int, delta_sel: float) -> Selection:
    """The threshold ``1 + m g`` with ``P(N >= m) <= delta_sel / L`` (``N`` the integer noise)."""
    from sparkpriv.mechanisms.counts._plan import _upper_tail

    per_key = float(delta_sel) / float(L)

    def tail(m: int) -> float:
        return float(_upper_tail(nz, np.array([float(m)]))[0])

    lo, hi = 1, 2
    while tail(hi) > per_key:
        hi *= 2
        if hi > 2**62:
            raise ParameterError("the key-selection threshold is beyond the noise grid")
    while lo < hi:
        mid = (lo + hi) // 2
        if tail(mid) <= per_key:
            hi = mid
        else:
            lo = mid + 1
    g = float(nz.grid)
    return Selection(float(delta_sel), per_key, 1.0 + lo * g, tail(lo))


def quantile_band(buckets: int, p: float, kind: str, confidence: float) -> float:
    """``z`` with ``P(max_j |W_j| / s_j <= z) >= confidence`` for ``W_j = E_j - p E_{B-1}`` (``E_j`` the
    sum of the first ``j + 1`` of ``B`` i.i.d. noises, ``s_j`` its std): the simultaneous band of a
    noisy cumulative histogram (docs/math.md section 11). Computed from public parameters only, by
    simulation with a fixed public seed (standardised Laplace or Gaussian draws; at the calibrated
    scales of 2^30+ grid steps the discrete noises are these up to a relative 2^-30), rounded up
    by 2 % for the simulation's error."""
    key = (int(buckets), round(float(p), 12), kind, round(float(confidence), 12))
    z = _BAND_CACHE.get(key)
    if z is None:
        B = int(buckets)
        rng = np.random.default_rng(_BAND_SEED)
        if kind == "laplace":
            e = rng.laplace(0.0, 1.0 / math.sqrt(2.0), size=(_BAND_DRAWS, B))
        else:
            e = rng.standard_normal(size=(_BAND_DRAWS, B))
        E = np.cumsum(e, axis=1)
        W = E - p * E[:, -1:]
        j = np.arange(B)
        s = np.sqrt((j + 1) * (1 - p) ** 2 + (B - 1 - j) * p**2)
        z = float(np.quantile(np.max(np.abs(W) / s, axis=1), confidence)) * 1.02
        _BAND_CACHE[key] = z
    return z


def plan_aggregates(*, aggregates, max_keys: int, max_events_per_key: int, clamps: dict, buckets: int,
                    domain_size: int | None, epsilon: float, delta: float, noise: str, neighbors: str,
                    split: dict | None = None, selection_delta: float | None = None, confidence: float = 0.95,
                    clamp: bool = True, round: bool = False, fit: float = 1.0,
                    caller: str = "release_aggregates") -> AggregatesPlan:
    """Calibrate an aggregates release (reads no data, draws nothing). ``domain_size`` None: private
    keys (partition selection). ``fit``: the factor on every group's epsilon (Laplace) or mu (Gaussian)
    to start from (a plan at other bounds reuses the first plan's, so it adds at least that noise); it
    is lowered until dp_accounting's epsilon of the composition meets ``epsilon``."""
    private = domain_size is None
    groups = groups_of(aggregates, private_keys=private, buckets=buckets)
    d = UNBOUNDED_KEYS if private else int(domain_size)
    L, c = int(max_keys), int(max_events_per_key)
    shares = split_weights(groups, split or {}, caller)
    kind = "laplace" if noise == "laplace" else "gaussian"
    delta = float(delta)
    delta_sel = 0.0
    if private:
        delta_sel = float(selection_delta) if selection_delta is not None else (delta if kind == "laplace"
                                                                                else delta / 2.0)
        if not 0.0 < delta_sel <= delta or (kind == "gaussian" and delta_sel >= delta):
            raise ParameterError(f"The 'selection_delta' parameter of {caller} must be in (0, delta]"
                                 f"{' and below delta (the Gaussian noise needs the rest)' if kind == 'gaussian' else ''}"
                                 f". Got {delta_sel!r} with delta={delta!r}.")
    sens = [group_sensitivity(g, L=L, c=c, half=_half(clamps, g), d=d, neighbors=neighbors) for g in groups]

    def build(r: float):
        cals, evs = [], []
        if kind == "laplace":
            parts = _laplace_parts(epsilon * r, shares)
        else:
            from sparkpriv.privacy.calibration import gdp_mu_for, split_mu

            gdelta = (delta - delta_sel) / (1.0 - delta_sel)
            parts = split_mu(gdp_mu_for(epsilon, gdelta) * r, shares)
        for g, s, part in zip(groups, sens, parts):
            nz, cap = _calibrate(g, s, kind=kind, share=part, caller=caller)
            evs.append(nz.dp_event())
            cals.append((g, s, nz, cap, part))
        if private:
            evs.append(DeltaDpEvent(delta_sel))
        return cals, compose(evs)

    r, cals, events = float(fit), None, None
    for _ in range(12):  # the accountant's epsilon of the composition must meet the request
        cals, events = build(r)
        stated = epsilon_of(events, delta)
        if stated <= epsilon:
            break
        r *= min(epsilon / stated, 1.0) * (1.0 - 1e-9)
    else:  # pragma: no cover - the first or second step always fits
        raise ParameterError(f"{caller} could not calibrate its noise within epsilon={epsilon!r}.")
    calibrations = []
    for g, s, nz, cap, part in cals:
        rounded = round and g.kind in ("people", "events")
        std, hw, hw2, hw3, rs, rh = _half_widths(nz, confidence, rounded)
        calibrations.append(Calibration(g, s, nz, cap, float(part), std, hw, hw2, hw3, rs, rh))
    selection = None
    if private:
        people = next(c for c in calibrations if c.group.kind == "people")
        selection = _selection(people.noise, L, delta_sel)
    bands = {}
    for a in aggregates:
        if a.kind == "quantile":
            for p in a.ps:
                bands[(a.column, p)] = quantile_band(buckets, p, kind, confidence)
    return AggregatesPlan(tuple(aggregates), groups, L, c, {k: tuple(v) for k, v in clamps.items()}, int(buckets),
                          None if private else int(domain_size), neighbors, kind, float(confidence), bool(clamp),
                          bool(round), tuple(calibrations), selection, events, float(epsilon_of(events, delta)),
                          delta, bands, r)


def _half(clamps: dict, g: Group) -> float | None:
    if g.column is None:
        return None
    lo, hi = clamps[g.column]
    return (float(hi) - float(lo)) / 2.0
