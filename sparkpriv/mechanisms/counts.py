"""DP counts per public key for event tables (docs/math.md section 9; docs/counts.md).

The question asked most often of call-detail and transit data: how many
distinct people used each tower (per hour), how many trips between two
stations. The release is one noisy value for EVERY key of a declared public
domain, including keys no one visited:

* a **key** is one or more declared columns (:class:`KeyDomain`): the product
  of per-column vocabularies (towers; towers x hours of the day) or an explicit
  list of key tuples (declared origin-destination pairs). Events at keys
  outside the domain are dropped and counted for the owner only;
* **person-level bounding** (:mod:`sparkpriv.mechanisms.sparse`): at most
  ``L = max_keys`` keys per person (the keyed uniform choice) and, optionally,
  the person's events per key capped at ``c = max_events_per_key``; the value
  counted at a key is then the capped event count (1 per person without ``c``:
  distinct people);
* **noise**: discrete Laplace (pure epsilon, L1 sensitivity) or discrete
  Gaussian (L2 sensitivity), from :mod:`sparkpriv.privacy.noise`, drawn once
  on the driver for the whole domain.

Sensitivity (``d`` keys, ``m`` = the most keys one neighbour changes)::

    add-remove:  m = min(L, d)        replace-one:  m = min(2 L, d)
    L1 = m c                          L2 = c sqrt(m)        (c = 1 without a cap)

(records are non-negative, so replace-one moves a record by ``c sqrt(2L)`` in
L2, not ``2 c sqrt(L)``; ``tests/mechanisms/test_counts.py`` checks every
bound by brute force over all records of small domains).

Exact lattice output. The noise is integer noise ``N`` on the power-of-two
grid ``g`` of the calibration; the exact mechanism output is the lattice value
``v = count + g N``. A count can need 33 bits and ``g N`` 56 bits below the
point, more than an int64 or a double holds, so ``v`` is kept as the pair
``(A, r)`` with ``A = count + floor(g N)`` and ``r = N mod 2^s`` (``g =
2^-s``), computed in int64 without rounding; ``(A, r)`` determines ``v`` and
back, so the float ``A + r g`` written to the table (and the rounded integer,
the clamp, the interval) is post-processing of ``v``.

This module is the numpy core: no pyspark, no I/O.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, fields
from typing import Sequence

import numpy as np
from dp_accounting import dp_event
from scipy import stats

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.sparse import Vocabulary
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import epsilon_of

__all__ = [
    "NOISE_KINDS",
    "NEIGHBORS",
    "MAX_COUNT",
    "DRIVER_KEYS",
    "BLOCK_KEYS",
    "MAX_DRIVER_KEYS",
    "MAX_KEYS",
    "KeyDomain",
    "CountsParams",
    "CountsPlan",
    "plan_counts",
    "sensitivities",
    "count_keys",
    "noise_integers",
    "lattice_values",
    "finalize_counts",
    "noisy_values",
    "CountsResult",
]

NOISE_KINDS = ("discrete_laplace", "discrete_gaussian")
NEIGHBORS = ("add-remove", "replace-one")
# A public cap on the value counted at one key (people or capped events): counts are
# clamped to it before the noise (a clamp per coordinate never increases a sensitivity);
# 2^33 is more than every person alive, and a c-capped event count of 2^33 / c people.
MAX_COUNT = 2**33
# Domains up to DRIVER_KEYS keys (the default of the release's ``driver_domain_limit``) are summed
# into one vector, noised by one stream and turned into the table on the driver; larger
# product domains are totalled in the JVM and noised in the Spark tasks, one keyed stream
# per block of BLOCK_KEYS consecutive keys (docs/counts.md "Large domains"), up to MAX_KEYS
# (the int32 key index). Declared key tuples are held by the driver whatever the path,
# and are limited to MAX_DRIVER_KEYS.
DRIVER_KEYS = 1 << 21
BLOCK_KEYS = 1 << 20
MAX_DRIVER_KEYS = 1 << 24
MAX_KEYS = (1 << 31) - 1
_POS = Interval("real", 0, None, "neither")


# --------------------------------------------------------------------------- the public domain

@dataclass(frozen=True)
class KeyDomain:
    """The PUBLIC domain of keys: every key gets a noisy value, others are dropped.

    Either the product of one declared :class:`~sparkpriv.mechanisms.sparse.Vocabulary`
    per key column (index = row-major position: the first column varies
    slowest), or an explicit list of distinct key tuples (``tuples``; index =
    position in the list), e.g. declared origin-destination pairs.
    """

    columns: tuple
    vocabularies: tuple | None = None
    tuples: tuple | None = None
    source: str = "declared"

    def __post_init__(self):
        cols = self.columns
        if not isinstance(cols, tuple) or not cols or not all(isinstance(c, str) and c for c in cols):
            raise ParameterError("A key domain needs one or more key column names (strings). "
                                 f"Got {self.columns!r}.")
        if len(set(cols)) != len(cols):
            raise ParameterError(f"The key columns must be distinct. Got {list(cols)!r}.")
        if (self.vocabularies is None) == (self.tuples is None):
            raise ParameterError("A key domain is either a product of per-column vocabularies or a "
                                 "list of key tuples (exactly one of the two).")
        if self.vocabularies is not None and len(self.vocabularies) != len(cols):
            raise ParameterError(f"One vocabulary per key column is needed: {len(cols)} columns, "
                                 f"{len(self.vocabularies)} vocabularies.")

    @classmethod
    def product(cls, columns: Sequence[str] | str, vocabularies) -> "KeyDomain":
        """Every combination of the declared values of each column.

        ``vocabularies``: one vocabulary spec per column (anything
        :meth:`Vocabulary.parse` accepts: ``range(0, 1303)``, ``"0..23"``, a list of
        ids, a file of ids); a single spec when there is one column.
        """
        if isinstance(columns, str):
            columns, vocabularies = (columns,), (vocabularies,)
        columns = tuple(columns)
        vocs = tuple(Vocabulary.parse(v) for v in vocabularies)
        return cls(columns, vocabularies=vocs,
                   source=" x ".join(f"{c}: {v.source}" for c, v in zip(columns, vocs)))

    @classmethod
    def pairs(cls, columns: Sequence[str], tuples, source: str = "declared key tuples") -> "KeyDomain":
        """An explicit list of distinct key tuples (e.g. declared origin-destination pairs)."""
        columns = tuple(columns)
        out = []
        for t in tuples:
            t = tuple(x.item() if isinstance(x, np.generic) else x for x in t)
            if len(t) != len(columns):
                raise ParameterError(f"Every declared key must have {len(columns)} values (one per key column "
                                     f"{list(columns)!r}). Got {t!r}.")
            out.append(t)
        for j, c in enumerate(columns):
            kinds = {type(t[j]) for t in out}
            if not (kinds <= {int} or kinds <= {str}):
                raise ParameterError(f"The declared values of key column {c!r} must be all integers or all strings.")
        if len(set(out)) != len(out):
            seen = set()
            dup = next(t for t in out if t in seen or seen.add(t))
            raise ParameterError(f"The declared key {dup!r} is listed twice; keys must be distinct.")
        return cls(columns, tuples=tuple(out), source=source)

    @classmethod
    def pairs_from_file(cls, columns: Sequence[str], path: str) -> "KeyDomain":
        """Key tuples from a CSV file, one per line (``#`` comments and a header line skipped)."""
        columns = tuple(columns)
        try:
            with open(path, encoding="utf-8") as f:
                lines = [ln.split("#", 1)[0].strip() for ln in f]
        except OSError as exc:
            raise ParameterError(f"Cannot read the key file {path!r}: {exc.strerror}.") from None
        rows = [[v.strip() for v in ln.split(",")] for ln in lines if ln]
        if rows and [r.lower() for r in rows[0]] == [c.lower() for c in columns]:
            rows = rows[1:]
        ints = [all(_is_int(r[j]) for r in rows) for j in range(len(columns))] if rows else []
        tuples = [tuple(int(v) if ints[j] else v for j, v in enumerate(r)) for r in rows]
        import os

        return cls.pairs(columns, tuples, source=f"file {os.path.basename(path)}")

    @property
    def size(self) -> int:
        if self.tuples is not None:
            return len(self.tuples)
        return int(np.prod([v.size for v in self.vocabularies], dtype=object))

    @property
    def strides(self) -> tuple:
        """Row-major strides of the product domain (index = sum of column index x stride)."""
        sizes = [v.size for v in self.vocabularies]
        out, s = [], 1
        for n in reversed(sizes):
            out.append(s)
            s *= n
        return tuple(reversed(out))

    def column_values(self) -> list[np.ndarray]:
        """The key values of every index ``0..size-1``, one array per key column (public)."""
        if self.tuples is not None:
            return [np.asarray([t[j] for t in self.tuples]) for j in range(len(self.columns))]
        vals = [np.arange(v.start, v.stop, dtype=np.int64) if v.is_range else np.asarray(v.ids)
                for v in self.vocabularies]
        grids = np.meshgrid(*[np.arange(len(v)) for v in vals], indexing="ij")
        return [v[g.reshape(-1)] for v, g in zip(vals, grids)]

    def values_range(self, start: int, stop: int) -> list[np.ndarray]:
        """The key values of the indices ``start..stop-1`` (one array per key column), computed
        without the whole domain: ``column_values()`` sliced, for a block of a large domain."""
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.size:
            raise ParameterError(f"values_range needs 0 <= start <= stop <= {self.size}. Got {start}, {stop}.")
        if self.tuples is not None:
            return [np.asarray([t[j] for t in self.tuples[start:stop]]) for j in range(len(self.columns))]
        idx = np.arange(start, stop, dtype=np.int64)
        out = []
        for v, s in zip(self.vocabularies, self.strides):
            i = (idx // s) % v.size
            out.append(i + v.start if v.is_range else np.asarray(v.ids)[i])
        return out

    def index(self, *columns) -> np.ndarray:
        """Domain index (int64) of each key given as one array per column; -1 outside."""
        if len(columns) != len(self.columns):
            raise ParameterError(f"index needs {len(self.columns)} key arrays, got {len(columns)}.")
        cols = [np.asarray(c) for c in columns]
        n = cols[0].shape[0] if cols else 0
        if self.vocabularies is not None:
            out = np.zeros(n, np.int64)
            ok = np.ones(n, bool)
            for c, v, s in zip(cols, self.vocabularies, self.strides):
                i = v.index(c)
                ok &= i >= 0
                out += i.astype(np.int64) * s
            return np.where(ok, out, -1)
        lookup = {t: i for i, t in enumerate(self.tuples)}
        return np.fromiter((lookup.get(tuple(x.item() if isinstance(x, np.generic) else x for x in row), -1)
                            for row in zip(*cols)), dtype=np.int64, count=n)

    def to_public_dict(self) -> dict:
        out = {"columns": list(self.columns), "size": self.size, "source": self.source}
        if self.vocabularies is not None:
            out["kind"] = "product"
            out["vocabularies"] = [v.to_public_dict() for v in self.vocabularies]
        else:
            out["kind"] = "declared keys"
            out["keys_sha256"] = hashlib.sha256("\n".join(",".join(map(str, t)) for t in self.tuples)
                                                .encode()).hexdigest()
        return out


def _is_int(s: str) -> bool:
    s = s.strip()
    return bool(s) and (s.isdigit() or (s[0] in "+-" and s[1:].isdigit()))


# --------------------------------------------------------------------------- parameters

@dataclass(frozen=True)
class CountsParams:
    """Public parameters of a DP counts release (validated on construction)."""

    epsilon: float = field(metadata={
        "help": "epsilon of the release (the accounted epsilon never exceeds it)",
        "constraints": [_POS]})
    max_keys: int = field(metadata={
        "help": "L: at most this many keys per person are counted (a keyed uniform choice among more)",
        "constraints": [Interval("integer", 1, None, "left")]})
    max_events_per_key: int | None = field(default=None, metadata={
        "help": "c: count each person's events per key, capped at c (default: distinct people per key)",
        "constraints": [None, Interval("integer", 1, 2**20, "both")]})
    noise: str = field(default="discrete_laplace", metadata={
        "help": "discrete_laplace (pure epsilon, L1 sensitivity) or discrete_gaussian (L2, needs delta > 0)",
        "constraints": [Options(NOISE_KINDS)]})
    delta: float = field(default=0.0, metadata={
        "help": "delta (discrete_gaussian: required > 0; discrete_laplace: 0, the guarantee is pure)",
        "constraints": [Interval("real", 0, 1, "left")]})
    neighbors: str = field(default="add-remove", metadata={
        "help": "add-remove (a person added or removed) or replace-one (one person replaced)",
        "constraints": [Options(NEIGHBORS)]})
    clamp: bool = field(default=False, metadata={
        "help": "post-processing: negative noisy counts (and interval ends) become 0",
        "constraints": [bool]})
    round: bool = field(default=False, metadata={
        "help": "post-processing: noisy counts rounded to integers (interval and std of the rounded value)",
        "constraints": [bool]})
    confidence: float = field(default=0.95, metadata={
        "help": "coverage of the stated interval per key",
        "constraints": [Interval("real", 0, 1, "neither")]})

    def __post_init__(self):
        caller = "release_counts"
        for f in fields(self):
            check_param(f.name, getattr(self, f.name), f.metadata["constraints"], caller)
        if self.noise == "discrete_gaussian" and not self.delta > 0:
            raise ParameterError(f"The 'delta' parameter of {caller} must be > 0 with noise='discrete_gaussian' "
                                 "(an (epsilon, delta) guarantee). Give e.g. delta=1e-6, or use "
                                 "noise='discrete_laplace' (pure epsilon).")
        if self.noise == "discrete_laplace" and self.delta != 0:
            raise ParameterError(f"The 'delta' parameter of {caller} must be 0 with noise='discrete_laplace': "
                                 f"its guarantee is pure epsilon. Got {self.delta!r}; use "
                                 "noise='discrete_gaussian' for an (epsilon, delta) release.")

    @property
    def value_cap(self) -> int:
        return 1 if self.max_events_per_key is None else int(self.max_events_per_key)

    @property
    def counted(self) -> str:
        if self.max_events_per_key is None:
            return "distinct people per key"
        return f"events per key, each person's events at a key capped at {self.max_events_per_key}"

    def to_public_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def sensitivities(max_keys: int, value_cap: int, domain_size: int, neighbors: str) -> dict:
    """``{"changed": m, "l1": m c, "l2": c sqrt(m)}`` (module docstring)."""
    L, c, d = int(max_keys), int(value_cap), int(domain_size)
    m = min(L if neighbors == "add-remove" else 2 * L, d)
    return {"changed": m, "l1": float(m * c), "l2": float(c) * math.sqrt(m)}


# --------------------------------------------------------------------------- plan

@dataclass(frozen=True)
class CountsPlan:
    """Everything public about a calibrated counts release (it holds no secret)."""

    params: CountsParams
    domain_size: int
    sensitivity: dict
    noise: object  # LaplaceNoise or GaussianNoise (grid g, scale in grid units)
    epsilon: float  # the accountant's epsilon of the recorded event at delta
    std: float  # per key, of the released value (the rounded one with round=True)
    half_width: float  # the stated interval is value -+ half_width (before the clamp)
    coverage: float  # the exact probability that the interval holds the true count

    def dp_event(self) -> dp_event.DpEvent:
        return self.noise.dp_event()

    @property
    def delta(self) -> float:
        return float(self.params.delta)

    def to_public_dict(self) -> dict:
        p = self.params
        return {
            "mechanism": "counts",
            "counted": p.counted,
            "params": p.to_public_dict(),
            "domain_size": self.domain_size,
            "neighbors": p.neighbors,
            "protects": ("one person added or removed" if p.neighbors == "add-remove"
                         else "one person replaced by another (the number of people is public)"),
            "sensitivity": {**self.sensitivity, "norm": "l1" if p.noise == "discrete_laplace" else "l2"},
            "noise": self.noise.to_public_dict(),
            "epsilon_accounted": self.epsilon,
            "delta": self.delta,
            "uncertainty": {"std": self.std, "half_width": self.half_width, "confidence": p.confidence,
                            "coverage_exact": self.coverage,
                            "note": "the same for every key; the interval is value -+ half_width "
                                    "(intersected with [0, inf) under clamp)"},
            "post_processing": {"clamp_at_zero": p.clamp, "round": p.round},
            "max_count_clamp": MAX_COUNT * p.value_cap,
        }


def plan_counts(params: CountsParams, domain_size: int, *, caller: str = "release_counts") -> CountsPlan:
    """Calibrate the noise of a counts release (reads no data, draws nothing)."""
    if not isinstance(params, CountsParams):
        raise ParameterError(f"{caller} needs CountsParams. Got {type(params).__name__}.")
    check_param("domain_size", domain_size, [Interval("integer", 1, None, "left")], caller)
    if domain_size > MAX_KEYS:
        raise ParameterError(
            f"The key domain of {caller} has {domain_size} keys, more than {MAX_KEYS} (key indices are "
            "32-bit integers): declare a smaller domain or split it into several releases.")
    sens = sensitivities(params.max_keys, params.value_cap, domain_size, params.neighbors)
    dim = sens["changed"]  # the coordinates one neighbour changes (grid rounding, samplers' slack)
    max_abs = None
    if params.noise == "discrete_laplace":
        nz = _noise.calibrate_laplace_noise(sensitivity=sens["l1"], epsilon=params.epsilon, dim=dim,
                                            max_abs=max_abs)
    else:
        nz = _noise.calibrate_gaussian_noise(sensitivity=sens["l2"], epsilon=params.epsilon, delta=params.delta,
                                             dim=dim, max_abs=max_abs)
    _check_grid(nz, caller)
    eps = float(epsilon_of(nz.dp_event(), float(params.delta)))
    std, hw, cov = uncertainty(nz, rounded=params.round, confidence=params.confidence)
    return CountsPlan(params, int(domain_size), sens, nz, eps, std, hw, cov)


def _check_grid(nz, caller: str) -> None:
    g = float(nz.grid)
    if g > 1.0 and float(nz.scale) * g > 2.0**40:
        raise ParameterError(f"The noise of {caller} has a scale of {float(nz.scale) * g:.3g} per key: "
                             "epsilon is too small for a useful release.")


# --------------------------------------------------------------------------- uncertainty

def _grid_shift(g: float) -> int:
    """``s`` with ``g = 2^-s`` (negative for grids above 1)."""
    m, e = math.frexp(g)
    if m != 0.5:
        raise ParameterError(f"The noise grid must be a power of two. Got {g!r}.")
    return 1 - e


def _outside_prob(nz, lo: int, hi: int) -> float:
    """``P(N < lo or N > hi)`` for the integer noise ``N`` (lo <= 0 <= hi)."""
    if isinstance(nz, _noise.LaplaceNoise):
        # pmf (1-q)/(1+q) q^|x|: P(N >= m) = P(N <= -m) = q^m / (1+q) for m >= 1
        lq = -1.0 / float(nz.scale)
        l1q = math.log1p(math.exp(lq))
        return math.exp((hi + 1) * lq - l1q) + math.exp((-lo + 1) * lq - l1q)
    # discrete Gaussian at sigma >= 2^55 grid steps: its cdf is the continuous one at
    # half-integers up to a relative 1/sigma^2 (Euler-Maclaurin; e^{-2 pi^2 sigma^2} normaliser)
    s = float(nz.sigma)
    return float(stats.norm.sf((hi + 0.5) / s) + stats.norm.cdf((lo - 0.5) / s))


def uncertainty(nz, *, rounded: bool, confidence: float = 0.95) -> tuple[float, float, float]:
    """``(std, half_width, coverage)`` of one released value (data units).

    Unrounded: the value is ``count + g N``; ``std`` is the noise's exact std
    and ``half_width = g k`` with the smallest integer ``k`` such that
    ``P(|N| <= k) >= confidence``. Rounded (``floor(count + g N + 1/2)``,
    noise ``Z = floor(g N + 1/2)``): ``half_width`` is the smallest integer
    ``K`` with ``P(|Z| <= K) >= confidence`` (``|Z| <= K`` iff ``N`` lies in
    ``[(-K - 1/2)/g, (K + 1/2)/g - 1]``), and ``std`` is Z's std (Sheppard:
    ``Var(gN) + 1/12`` up to a relative ``1e-10`` at the calibrated scales;
    summed exactly over Z's pmf when the noise is small). ``coverage`` is the
    exact probability of the stated interval.
    """
    g = float(nz.grid)
    alpha = 1.0 - float(confidence)
    std_n = float(nz.std)
    scale = float(nz.scale) if isinstance(nz, _noise.LaplaceNoise) else float(nz.sigma)
    if not rounded or g >= 1.0:
        # smallest k (grid units) with P(|N| > k) <= alpha: bisection on the monotone tail
        lo, hi = 0, 1
        while _outside_prob(nz, -hi, hi) > alpha:
            hi *= 2
        while lo < hi:
            mid = (lo + hi) // 2
            if _outside_prob(nz, -mid, mid) <= alpha:
                hi = mid
            else:
                lo = mid + 1
        k = lo
        return std_n, k * g, 1.0 - _outside_prob(nz, -k, k)
    s = _grid_shift(g)  # g = 2^-s, s >= 1: (K + 1/2)/g = (2K + 1) 2^(s-1) is an integer

    def out(K: int) -> float:
        h = (2 * K + 1) << (s - 1)
        return _outside_prob(nz, -h, h - 1)

    lo, hi = 0, 1
    while out(hi) > alpha:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if out(mid) <= alpha:
            hi = mid
        else:
            lo = mid + 1
    K = lo
    data_scale = scale * g
    if data_scale < 1000.0:  # Z's pmf summed exactly
        span = int(60 * data_scale) + 60
        ks = np.arange(-span, span + 1)
        cdf = 1.0 - _upper_tail(nz, (2.0 * ks + 1.0) * 2.0 ** (s - 1))  # P(Z <= k) = P(N < (k + 1/2)/g)
        pmf = np.diff(np.concatenate(([0.0], cdf)))
        std = math.sqrt(float(np.sum(pmf * ks.astype(float) ** 2)))
    else:  # Sheppard's correction, relative error below 1e-12 at these scales
        std = math.sqrt(std_n**2 + 1.0 / 12.0)
    return std, float(K), 1.0 - out(K)


def _upper_tail(nz, m) -> np.ndarray:
    """``P(N >= m)`` for integer-valued ``m`` (array), noise ``N`` of ``nz``."""
    m = np.asarray(m, np.float64)
    pos = m >= 1
    mm = np.where(pos, m, 1.0 - m)  # P(N >= m) = 1 - P(N >= 1 - m) for m <= 0 (symmetry)
    if isinstance(nz, _noise.LaplaceNoise):
        lq = -1.0 / float(nz.scale)
        t = np.exp(mm * lq - math.log1p(math.exp(lq)))
    else:
        t = stats.norm.sf((mm - 0.5) / float(nz.sigma))
    return np.where(pos, t, 1.0 - t)


# --------------------------------------------------------------------------- partial / finalize

def count_keys(offsets, indices, values, d: int) -> np.ndarray:
    """Per-key totals of bounded records (the reference of the Spark aggregation).

    ``values`` None: each record counts 1 at each of its keys (distinct
    people); else the (capped) values. Returns int64 (d,).
    """
    idx = np.asarray(indices, np.int64)
    if values is None:
        return np.bincount(idx, minlength=d).astype(np.int64)
    return np.rint(np.bincount(idx, weights=np.asarray(values, np.float64), minlength=d)).astype(np.int64)


def noise_integers(plan: CountsPlan, rng: np.random.Generator, size: int | None = None,
                   *, exact: bool = False) -> np.ndarray:
    """The integer noise ``N`` of every key (int64; one draw per key, on the driver)."""
    nz = plan.noise
    n = plan.domain_size if size is None else size
    if isinstance(nz, _noise.LaplaceNoise):
        return _noise.sample_discrete_laplace(rng, nz.scale, n, exact=exact)
    return _noise.sample_discrete_gaussian(rng, nz.sigma, n, exact=exact)


def lattice_values(counts: np.ndarray, N: np.ndarray, grid: float) -> tuple[np.ndarray, np.ndarray, int]:
    """The exact lattice output ``count + g N`` as ``(A, r, s)``: ``A + r 2^-s`` with
    ``A`` int64 and ``0 <= r < 2^s`` (``s <= 0``: ``r = 0``). No rounding anywhere."""
    c = np.asarray(counts, np.int64)
    N = np.asarray(N, np.int64)
    s = _grid_shift(float(grid))
    if s <= 0:
        return c + (N << (-s)), np.zeros_like(N), s
    return c + (N >> s), N & ((1 << s) - 1), s


@dataclass(frozen=True)
class CountsResult:
    """The released columns of every key (domain order): value, std, ci_low, ci_high."""

    value: np.ndarray
    std: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray


def finalize_counts(counts: np.ndarray, plan: CountsPlan, rng: np.random.Generator, *,
                    exact: bool = False) -> CountsResult:
    """Noise the per-key totals of the whole domain once and post-process (driver).

    ``counts``: int64 (domain_size,) exact totals after bounding (every key,
    zeros for keys no one visited). Values above the public ``MAX_COUNT c``
    are clamped to it first (never reached by real data; a per-coordinate
    clamp cannot raise a sensitivity).
    """
    c = np.asarray(counts)
    if c.shape != (plan.domain_size,):
        raise ParameterError(f"finalize_counts needs one total per key of the domain ({plan.domain_size}). "
                             f"Got shape {c.shape}.")
    return noisy_values(c, plan, rng, exact=exact)


def noisy_values(counts: np.ndarray, plan: CountsPlan, rng: np.random.Generator, *,
                 exact: bool = False) -> CountsResult:
    """The released columns of consecutive keys (all of them, or one block of a large domain):
    one noise draw per key from ``rng``, in order, then the post-processing."""
    p = plan.params
    c = np.asarray(counts)
    if c.ndim != 1:
        raise ParameterError(f"noisy_values needs a 1-d array of totals. Got shape {c.shape}.")
    c = np.clip(c.astype(np.int64), 0, MAX_COUNT * p.value_cap)
    N = noise_integers(plan, rng, c.shape[0], exact=exact)
    A, r, s = lattice_values(c, N, plan.noise.grid)
    if p.round and s > 0:
        value = (A + (r >> (s - 1))).astype(np.float64)  # floor(v + 1/2): r g >= 1/2 iff r >= 2^(s-1)
    elif s > 0:
        value = A.astype(np.float64) + r.astype(np.float64) * plan.noise.grid
    else:
        value = A.astype(np.float64)
    lo = value - plan.half_width
    hi = value + plan.half_width
    if p.clamp:
        value = np.maximum(value, 0.0)
        lo = np.maximum(lo, 0.0)
        hi = np.maximum(hi, 0.0)
    return CountsResult(value, np.full(value.shape, plan.std), lo, hi)


# --------------------------------------------------------------------------- the mechanism (protocol)

from sparkpriv.mechanisms import protocol as _p  # noqa: E402
from sparkpriv.privacy.random import new_secret_seed, stream  # noqa: E402


@dataclass(frozen=True, kw_only=True)
class CountsReleaseParams(_p.Params):
    """Public parameters of a counts release of bounded event records (the bound ``L``, ``c``
    comes from the records: ``max_items`` and ``max_events_per_item`` of the bounding)."""

    epsilon: float = _p.option(help="epsilon of the release (the accounted epsilon never exceeds it)",
                               constraints=[_POS])
    delta: float = _p.option(0.0, help="delta: 0 with discrete_laplace (pure epsilon), > 0 with "
                             "discrete_gaussian", constraints=[Interval("real", 0, 1, "left")])
    noise: str = _p.option("discrete_laplace", help="discrete_laplace (L1 sensitivity L c) or "
                           "discrete_gaussian (L2 sensitivity c sqrt(L))", constraints=[Options(NOISE_KINDS)])
    neighbors: str = _p.option("add-remove", help="neighbour relation: add-remove (a person added or "
                               "removed) or replace-one (twice the L1 sensitivity)", kind="neighbors")
    clamp: bool = _p.option(False, help="post-processing: negative noisy counts (and interval ends) become 0",
                            constraints=[bool])
    round: bool = _p.option(False, help="post-processing: noisy counts rounded to integers",
                            constraints=[bool])
    confidence: float = _p.option(0.95, help="coverage of the stated interval per key",
                                  constraints=[Interval("real", 0, 1, "neither")])
    driver_domain_limit: int = _p.option(DRIVER_KEYS, help="domains of at most this many keys are noised on the "
                                 "driver (one stream); larger product domains are totalled in the JVM and "
                                 f"noised in the tasks, one keyed stream per block of {BLOCK_KEYS} keys",
                                 constraints=[Interval("integer", 1, MAX_DRIVER_KEYS, "both")])
    domain: object = _p.option(None, help="the PUBLIC KeyDomain of the records' item indices (its key "
                               "columns name the output; default: the vocabulary index as 'item_index')",
                               kind="object", recorded=False)

    def check(self, caller: str) -> None:
        if self.noise == "discrete_gaussian" and not self.delta > 0:
            raise ParameterError(f"The 'delta' parameter of {caller} must be > 0 with noise='discrete_gaussian'. "
                                 "Give e.g. delta=1e-6, or use noise='discrete_laplace' (pure epsilon).")
        if self.noise == "discrete_laplace" and self.delta != 0:
            raise ParameterError(f"The 'delta' parameter of {caller} must be 0 with noise='discrete_laplace' "
                                 f"(pure epsilon). Got {self.delta!r}; use noise='discrete_gaussian' for "
                                 "an (epsilon, delta) release.")
        if self.domain is not None and not isinstance(self.domain, KeyDomain):
            raise ParameterError(f"The 'domain' parameter of {caller} must be a KeyDomain. "
                                 f"Got {type(self.domain).__name__}.")


@dataclass
class _CountsState:
    plan: CountsPlan
    domain: KeyDomain | None
    blocks: bool = False


def _totals_fn(d: int):
    """Block of bounded records -> per-key totals (float64, exact for integers below 2^53)."""

    def totals(block):
        idx = np.asarray(block.indices, np.int64)
        if block.values is None:
            return np.bincount(idx, minlength=d).astype(np.float64)
        return np.bincount(idx, weights=np.asarray(block.values, np.float64), minlength=d)

    return totals


class Counts(_p.Mechanism):
    """DP counts per public key of bounded event records: every key of the domain, noised once."""

    name = "counts"
    title = "DP counts per key"
    summary = ("DP counts per public key of an event table (distinct people, or capped events, per "
               "tower / station / pair); every key of the domain gets a noisy value and its interval")
    Params = CountsReleaseParams
    neighbors = (_p.ADD_REMOVE, _p.REPLACE_ONE)
    refused_neighbors = {"element": "it protects whole people, not single attributes"}
    inputs = ("records",)
    engines = ("spark",)
    # under add-remove whether the table is empty is not public: an empty input is released
    # as noisy zeros for every key, like any other input
    refuses_empty_input = False

    def plan(self, params: CountsReleaseParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        c = float(facts.value_cap)
        if c != int(c):
            raise ParameterError(f"{caller} needs integer-valued records (binary, or counts capped at c).")
        L = int(round((float(facts.l2_bound) / c) ** 2))
        dom = params.domain
        if dom is not None and dom.size != facts.d:
            raise ParameterError(f"The 'domain' parameter of {caller} has {dom.size} keys, but the records "
                                 f"have {facts.d} items: give the KeyDomain the records were bounded over.")
        rel = _p.resolve_neighbors(params.neighbors, self, caller)
        cp = CountsParams(epsilon=params.epsilon, max_keys=L, max_events_per_key=None if c == 1 else int(c),
                          noise=params.noise, delta=params.delta, neighbors=rel.name, clamp=params.clamp,
                          round=params.round, confidence=params.confidence)
        cplan = plan_counts(cp, facts.d, caller=caller)
        blocks = facts.d > params.driver_domain_limit
        if blocks and dom is not None and dom.tuples is not None:
            blocks = False  # declared key tuples are held by the driver anyway (at most MAX_DRIVER_KEYS)
        if not blocks and facts.d > MAX_DRIVER_KEYS:
            raise ParameterError(f"The key domain of {caller} has {facts.d} keys, more than {MAX_DRIVER_KEYS} "
                                 "that can be noised on the driver: declare it as a product of per-column "
                                 "vocabularies (noised in the tasks) or split it.")
        public = cplan.to_public_dict()
        public["noise_drawn"] = (
            f"in the Spark tasks: keys in blocks of {BLOCK_KEYS} consecutive indices, one keyed stream per "
            "block (a retried task redraws the same noise); every key is noised exactly once"
            if blocks else "on the driver, one stream for the whole domain, in key order")
        public["key_domain"] = dom.to_public_dict() if dom is not None else {"columns": ["item_index"],
                                                                             "size": facts.d}
        public["uncertainty"] = dict(public["uncertainty"], intervals="ci_low, ci_high per key")
        return _p.Plan(events=cplan.dp_event(), epsilon=cplan.epsilon, delta=cplan.delta, public=public,
                       neighbors=rel, state=_CountsState(cplan, dom, blocks), secrets=new_secret_seed("counts-noise"))

    def run(self, engine, source, plan: _p.Plan, progress) -> _p.Outcome:
        st: _CountsState = plan.state
        d = st.plan.domain_size
        names = list(st.domain.columns) if st.domain is not None else ["item_index"]
        if st.blocks:
            return _p.Outcome(table=self._run_blocks(engine, source, plan, names, progress))
        totals = engine.aggregate(source, _totals_fn(d), d, count=True)
        res = finalize_counts(np.rint(totals).astype(np.int64), st.plan, stream(plan.secrets, 0))
        cols = st.domain.column_values() if st.domain is not None else [np.arange(d, dtype=np.int64)]
        types = [_key_type(c) for c in cols]
        out = [(n, t, c) for n, t, c in zip(names, types, cols)]
        out += [(n, "double", v) for n, v in zip(OUTPUT_COLUMNS, (res.value, res.std, res.ci_low, res.ci_high))]
        progress.log("counts: %d keys noised once on the driver (std %.4g per key)", d, st.plan.std)
        return _p.Outcome(table=engine.columns_table(out))

    @staticmethod
    def _run_blocks(engine, source, plan: _p.Plan, names: list, progress):
        st: _CountsState = plan.state
        cplan, domain, seed = st.plan, st.domain, plan.secrets
        d = cplan.domain_size
        key_types = [_key_type(c) for c in (domain.values_range(0, 1) if domain is not None
                                            else [np.zeros(1, np.int64)])]

        def block_fn(b: int, totals: np.ndarray) -> list:
            """Block ``b`` (keys ``b B .. b B + len(totals) - 1``): its own keyed stream."""
            start = b * BLOCK_KEYS
            keys = (domain.values_range(start, start + totals.shape[0]) if domain is not None
                    else [np.arange(start, start + totals.shape[0], dtype=np.int64)])
            res = noisy_values(totals, cplan, stream(seed, 1, b))
            return keys + [res.value, res.std, res.ci_low, res.ci_high]

        columns = [(n, t) for n, t in zip(names, key_types)] + [(n, "double") for n in OUTPUT_COLUMNS]
        progress.log("counts: %d keys noised in the tasks, %d blocks of %d keys (std %.4g per key)", d,
                     -(-d // BLOCK_KEYS), BLOCK_KEYS, cplan.std)
        return engine.key_blocks(source, block_fn, d, BLOCK_KEYS, columns)


OUTPUT_COLUMNS = ("noisy_count", "std", "ci_low", "ci_high")


def _key_type(c: np.ndarray) -> str:
    return "long" if np.asarray(c).dtype.kind in "iu" else "string"


COUNTS = _p.register(Counts())
