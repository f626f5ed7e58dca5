"""Public parameters of an aggregates release (:class:`AggregatesParams`) and what the engine opens
(:class:`EventSpec`): all checked before any data is read."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from sparkpriv._validation import Interval, Options
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.mechanisms.aggregates._query import (groups_of, parse_aggregates, parse_clamps, parse_split)
from sparkpriv.mechanisms.counts import KeyDomain
from sparkpriv.mechanisms.sparse import Vocabulary

__all__ = ["NOISE_KINDS", "AggregatesParams", "EventSpec", "resolve_domain", "DEFAULT_MAX_DOMAIN",
           "MAX_DRIVER_CELLS", "Query", "table_specs"]

NOISE_KINDS = ("laplace", "gaussian")
DEFAULT_MAX_DOMAIN = 1 << 20
MAX_DRIVER_CELLS = 1 << 24  # keys x statistics summed per partition and noised on the driver
_POS = Interval("real", 0, None, "neither")


@dataclass(frozen=True)
class EventSpec:
    """What the engine opens: an event table grouped by ``person``, each event's key (its index in
    ``domain``, or a 64-bit id of the ``by`` columns' values when ``domain`` is None: private keys)
    and the ``values`` columns as float64 (public names only)."""

    person: str
    by: tuple
    domain: KeyDomain | None
    values: tuple

    def public_params(self) -> dict:
        """The input's public description in a release's parameters (both engines)."""
        return {"input": "event table", "person_column": self.person, "key_columns": list(self.by),
                "value_columns": list(self.values)}

    def input_info(self, source: str) -> dict:
        """The receipt's input section (both engines; an engine adds its schema fingerprint)."""
        return {"source": source,
                "event_table": {"person_column": self.person, "key_columns": list(self.by),
                                "value_columns": list(self.values)},
                "person_key": "used only to group events; never copied to the output",
                "missing_values": "a null, NaN, infinite or malformed value takes its column's public fill, the "
                                  "centre of its clamp; an event whose key is outside the domain, malformed or null "
                                  "is dropped (owner diagnostics)"}


@dataclass(frozen=True)
class Query:
    """The parsed query: aggregates, declared clamps (``"auto"`` for a DP choice) and key domain."""

    aggregates: tuple
    bounds: dict
    domain: KeyDomain | None
    columns: tuple  # value columns, in order of first use

    @property
    def private(self) -> bool:
        return self.domain is None


def _auto_or_int(name: str, value, caller: str, high: int | None = None):
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    v = value
    if isinstance(value, str):
        try:
            v = int(value.strip())
        except ValueError:
            v = None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or (high is not None and v > high):
        rng = f"[1, {high}]" if high else "[1, inf)"
        raise ParameterError(f"The {name!r} parameter of {caller} must be an int in the range {rng} or 'auto'. "
                             f"Got {value!r} instead.")
    return v


def table_specs(domain) -> dict:
    """``{column: (path, source column)}`` of the ``col=table:PATH[:column]`` specs of a domain (the
    public tables the release reads when it starts; none in a KeyDomain or a mapping of vocabularies)."""
    if domain is None or isinstance(domain, (KeyDomain, Mapping)):
        items = list(domain.items()) if isinstance(domain, Mapping) else []
    else:
        items = [tuple(s.strip() for s in part.split("=", 1)) for part in
                 ([domain] if isinstance(domain, str) else list(domain)) if isinstance(part, str) and "=" in part]
    out = {}
    for col, spec in items:
        if isinstance(spec, str) and spec.startswith("table:"):
            rest = spec[len("table:"):]
            path, _, source_col = rest.rpartition(":") if ":" in rest and not rest.endswith(":") else (rest, "", "")
            if not path or (":" in rest and "/" in source_col):
                path, source_col = rest, ""
            out[col] = (path, source_col or col)
    return out


def resolve_domain(by: tuple, domain, caller: str) -> KeyDomain | None:
    """The public :class:`KeyDomain` of the key columns ``by``, or None (private key selection).

    ``domain``: None (private keys), a :class:`KeyDomain`, a mapping ``{column: vocabulary}`` (a
    range, ``"0..23"``, a list of ids, a file of ids, a :class:`Vocabulary`), or ``"column=spec"``
    strings (the command line). Either every key column has a public domain, or none has.
    """
    if domain is None or (isinstance(domain, (tuple, list)) and not domain):
        return None
    if isinstance(domain, KeyDomain):
        if tuple(domain.columns) != tuple(by):
            raise ParameterError(f"The 'domain' of {caller} is over the columns {list(domain.columns)}, but the keys "
                                 f"are {list(by)} (--by): give the domain of the key columns, in that order.")
        return domain
    if isinstance(domain, Mapping):
        items = dict(domain)
    else:
        items = {}
        for part in ([domain] if isinstance(domain, str) else list(domain)):
            if not isinstance(part, str) or "=" not in part:
                raise ParameterError(f"The 'domain' parameter of {caller} is written column=spec (e.g. "
                                     f"tower_id=0..1302 or tower_id=towers.txt). Got {part!r}.")
            col, spec = (s.strip() for s in part.split("=", 1))
            if col in items:
                raise ParameterError(f"The 'domain' parameter of {caller} declares {col!r} twice.")
            items[col] = spec
    unknown = sorted(set(items) - set(by))
    if unknown:
        raise ParameterError(f"The 'domain' parameter of {caller} declares {unknown[0]!r}, which is not a key "
                             f"column (--by {','.join(by)}).")
    missing = [c for c in by if c not in items]
    if missing:
        raise ParameterError(
            f"The 'domain' parameter of {caller} declares {', '.join(sorted(items))} but not {', '.join(missing)}: "
            "declare a public domain for every key column, or for none (private key selection, with delta).")
    vocs = []
    for c in by:
        spec = items[c]
        if isinstance(spec, str) and spec.startswith("table:"):
            raise ParameterError(f"The domain of {c!r} ({spec!r}) is a public table: it is read when the release "
                                 "starts (sparkpriv.spark.aggregates.public_column_vocabulary), not here.")
        vocs.append(Vocabulary.parse(spec))
    return KeyDomain.product(tuple(by), vocs)


@dataclass(frozen=True, kw_only=True)
class AggregatesParams(_p.Params):
    """Public parameters of an aggregates release of an event table (docs/aggregates.md)."""

    person: str = _p.option(help="the person-key column: a person's events are bounded together (never copied "
                            "to the output)", kind="str")
    by: tuple = _p.option(help="the key columns, e.g. tower_id,hour", kind="strs")
    aggregates: Any = _p.option(help="the aggregates per key, any of count, count_distinct, sum(col), mean(col), "
                                "variance(col), median(col), quantile(col, p, ...), e.g. "
                                "'count_distinct, mean(duration), median(duration)'", kind="str")
    epsilon: float = _p.option(help="epsilon of the release (the accounted epsilon never exceeds it)",
                               constraints=[_POS])
    max_keys: Any = _p.option(help="L: at most this many keys per person (a keyed uniform choice among more), "
                              "or 'auto' (a DP quantile of the keys per person)", kind="str")
    max_events_per_key: Any = _p.option(help="c: each person's events at a key count with weight min(n, c) / n, "
                                        "or 'auto' (a DP quantile of the events per key and person)", kind="str")
    bounds: Any = _p.option(None, help="the value clamp of each value column: col=lo:hi, or col=auto (a DP "
                            "quantile of the column); values outside are clamped and counted for the owner",
                            kind="strs", metavar="COL=LO:HI")
    domain: Any = _p.option(None, help="the PUBLIC domain of each key column: col=a..b (inclusive range), "
                            "col=FILE (ids, one per line), col=table:PATH[:column] (a column of a public "
                            "table); omitted: private key selection (needs delta)", kind="strs",
                            metavar="COL=SPEC", recorded=False)
    delta: float = _p.option(0.0, help="delta: 0 for laplace noise over a public domain; with private keys the "
                             "key selection's delta (laplace) or the total (gaussian)",
                             constraints=[Interval("real", 0, 1, "left")])
    noise: str = _p.option("laplace", help="laplace (pure epsilon, discrete Laplace) or gaussian (discrete "
                           "Gaussian, zCDP/PLD composition; needs delta)", constraints=[Options(NOISE_KINDS)])
    neighbors: str = _p.option("add-remove", help="add-remove (a person added or removed) or replace-one",
                               kind="neighbors")
    split: Any = _p.option(None, help="budget weights of the measured statistics, e.g. "
                           "'count_distinct=1,sum(duration)=2' (default: equal); the receipt states the split",
                           kind="strs")
    selection_delta: float | None = _p.option(None, help="private keys: the delta of the key selection",
                                              constraints=[None, Interval("real", 0, 1, "neither")],
                                              doc_default="delta (laplace), delta / 2 (gaussian)")
    quantile_buckets: int = _p.option(64, help="quantiles: equal buckets of [lo, hi] of the noisy histogram",
                                      constraints=[Interval("integer", 2, 4096, "both")])
    confidence: float = _p.option(0.95, help="coverage of every stated interval",
                                  constraints=[Interval("real", 0, 1, "neither")])
    clamp: bool = _p.option(True, help="post-processing: counts at least 0, means and variances in their feasible "
                            "range", constraints=[bool])
    round: bool = _p.option(False, help="post-processing: counts rounded to integers", constraints=[bool])
    max_domain: int = _p.option(DEFAULT_MAX_DOMAIN, help="a public key domain of more keys (the product of the "
                                "columns' domains) is refused before any data is read",
                                constraints=[Interval("integer", 1, 1 << 31, "both")])
    auto_share: float = _p.option(0.1, help="with auto bounds: the share of epsilon their DP choice spends "
                                  "(split equally among them)", constraints=[Interval("real", 0, 0.5, "right")])
    auto_quantile: float = _p.option(0.95, help="with auto: the share of people (keys) whose keys (events) all "
                                     "fit", constraints=[Interval("real", 0, 1, "neither")])
    max_keys_limit: int = _p.option(256, help="with max_keys auto: the largest L that may be chosen",
                                    constraints=[Interval("integer", 1, 1 << 16, "both")])
    max_events_limit: int = _p.option(64, help="with max_events_per_key auto: the largest c that may be chosen",
                                      constraints=[Interval("integer", 1, 1 << 16, "both")])
    bounds_quantile: float = _p.option(0.99, help="with col=auto: the clamp holds this share of each person's "
                                       "values in the middle (each tail gets half the rest)",
                                       constraints=[Interval("real", 0, 1, "neither")])
    bounding_key: Any = _p.option(None, help="secret bytes (>= 16) of the keyed choice of kept keys, to repeat the "
                                  "same choice in later releases", kind="object", recorded=False)

    def input_columns(self):
        return None

    def query(self, caller: str) -> Query:
        aggs = parse_aggregates(self.aggregates, caller)
        bounds = parse_clamps(self.bounds, caller)
        cols = []
        for a in aggs:
            if a.column is not None and a.column not in cols:
                cols.append(a.column)
        missing = [c for c in cols if c not in bounds]
        if missing:
            raise ParameterError(f"The value column {missing[0]!r} of {caller} has no declared clamp: give "
                                 f"bounds={missing[0]}=lo:hi (--bounds {missing[0]}=0:3600) or {missing[0]}=auto. "
                                 "Values outside are clamped; the noise is calibrated from the clamp.")
        extra = sorted(set(bounds) - set(cols))
        if extra:
            raise ParameterError(f"The 'bounds' parameter of {caller} clamps {extra[0]!r}, which no aggregate uses.")
        for c, v in bounds.items():
            if v == "auto":
                continue
            lo, hi = v
            if max(abs(lo), abs(hi)) > _p.MAX_PUBLIC_MAGNITUDE or hi - lo < _p.MIN_PUBLIC_SCALE:
                raise ParameterError(
                    f"The clamp of {c!r} ({caller}) must lie within +-{_p.MAX_PUBLIC_MAGNITUDE:g} and be at least "
                    f"{_p.MIN_PUBLIC_SCALE:g} wide. Got [{lo!r}, {hi!r}]: rescale the column and declare the clamp "
                    "in those units.")
        return Query(aggs, bounds, resolve_domain(tuple(self.by), self.domain, caller), tuple(cols))

    def check(self, caller: str) -> None:
        by = tuple(self.by) if self.by is not None else ()
        if not by or not all(isinstance(c, str) and c for c in by) or len(set(by)) != len(by):
            raise ParameterError(f"The 'by' parameter of {caller} must name one or more distinct key columns. "
                                 f"Got {self.by!r}.")
        if not isinstance(self.person, str) or not self.person:
            raise ParameterError(f"The 'person' parameter of {caller} must name the person-key column.")
        if self.person in by:
            raise ParameterError(f"The person column {self.person!r} cannot also be a key column ({caller}).")
        _auto_or_int("max_keys", self.max_keys, caller)
        _auto_or_int("max_events_per_key", self.max_events_per_key, caller, high=1 << 20)
        if table_specs(self.domain):  # read from the public table when the release starts, checked then
            return
        q = self.query(caller)
        clash = (set(by) | {self.person}) & set(_output_names(q.aggregates))
        if clash:
            raise ParameterError(f"The column {sorted(clash)[0]!r} of {caller} is named like an output column; "
                                 "rename it.")
        if self.person in q.columns or set(by) & set(q.columns):
            raise ParameterError(f"{caller}: a value column cannot be the person or a key column.")
        if self.noise == "gaussian" and not self.delta > 0:
            raise ParameterError(f"The 'delta' parameter of {caller} must be > 0 with noise='gaussian'. Give e.g. "
                                 "delta=1e-6, or use noise='laplace' (pure epsilon).")
        if q.private:
            if not self.delta > 0:
                raise ParameterError(
                    f"{caller} has no public key domain (--domain), so its keys are selected privately: a key only "
                    "one person holds is released with a small probability, which needs delta > 0 (e.g. "
                    "delta=1e-6). Or declare every key column's domain.")
        else:
            if self.noise == "laplace" and self.delta != 0:
                raise ParameterError(f"The 'delta' parameter of {caller} must be 0 with noise='laplace' over a public "
                                     f"key domain (pure epsilon). Got {self.delta!r}.")
            if self.selection_delta is not None:
                raise ParameterError(f"The 'selection_delta' parameter of {caller} applies to private keys only (no "
                                     "--domain).")
            size = q.domain.size
            if size > self.max_domain:
                sizes = (" x ".join(f"{c} ({v.size:,})" for c, v in zip(q.domain.columns, q.domain.vocabularies))
                         if q.domain.vocabularies is not None else "declared keys")
                raise ParameterError(
                    f"The key domain of {caller} has {sizes} = {size:,} keys, more than max_domain "
                    f"({self.max_domain:,}): refused before reading any data. Declare fewer keys, split the release "
                    "(e.g. one per day), raise max_domain, or leave the domain out (private key selection).")
            width = sum(g.width for g in groups_of(q.aggregates, private_keys=False, buckets=self.quantile_buckets))
            if size * width > MAX_DRIVER_CELLS:
                raise ParameterError(
                    f"The release of {caller} measures {width} statistics for each of {size:,} keys = "
                    f"{size * width:,} cells, more than {MAX_DRIVER_CELLS:,} that are summed per partition and noised "
                    "on the driver: refused before reading any data. Use fewer quantile_buckets, fewer keys or "
                    "private key selection.")
        if self.split is not None:
            split = parse_split(self.split, caller)
            groups = groups_of(q.aggregates, private_keys=q.private, buckets=self.quantile_buckets)
            names = {g.name for g in groups}
            unknown = sorted(set(split) - names)
            if unknown:
                raise ParameterError(f"The 'split' parameter of {caller} names {unknown[0]!r}, which this query does "
                                     f"not measure. Its statistics: {', '.join(sorted(names))}.")
        if self.bounding_key is not None and not (isinstance(self.bounding_key, (bytes, bytearray))
                                                  and len(self.bounding_key) >= 16):
            raise ParameterError(f"The 'bounding_key' parameter of {caller} must be at least 16 bytes of secret "
                                 "material.")
        for name in ("auto_quantile", "bounds_quantile"):
            v = getattr(self, name)
            if not 0 < v < 1 or math.isnan(v):  # pragma: no cover - constraints
                raise ParameterError(f"The {name!r} parameter of {caller} must be in (0, 1).")


def _output_names(aggregates) -> list:
    out = []
    for a in aggregates:
        for n in a.output_names():
            out += [n, f"{n}_std", f"{n}_ci_low", f"{n}_ci_high"]
    return out
