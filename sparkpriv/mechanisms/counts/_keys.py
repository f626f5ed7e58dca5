"""DP counts' public key domain, parameters and sensitivities (docs/math.md section 9)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, fields
from typing import Sequence

import numpy as np

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.sparse import Vocabulary


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
