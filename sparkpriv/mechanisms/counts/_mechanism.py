"""DP counts as a mechanism of the release protocol (:class:`Counts`), on any engine."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkpriv._validation import Interval, Options
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.privacy.random import new_secret_seed, stream
from sparkpriv.mechanisms.counts._keys import (BLOCK_KEYS, CountsParams, DRIVER_KEYS, KeyDomain, MAX_DRIVER_KEYS,
                                               NOISE_KINDS, _POS)
from sparkpriv.mechanisms.counts._plan import CountsPlan, finalize_counts, noisy_values, plan_counts


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
    engines = ("local", "spark")
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


def check_key_columns(names, person: str, domain) -> None:
    """Refuse (before any data is read) a person or key column missing from an event table's columns
    ``names``, a person column that is also a key, or a key named like an output column."""
    from sparkpriv.errors import SchemaError

    names = list(names)
    for role, c in [("person", person)] + [("key", k) for k in domain.columns]:
        if not isinstance(c, str) or c not in names:
            raise SchemaError(f"The {role} column {c!r} is not in the event table. Available columns: "
                              f"{', '.join(names)}.")
    if person in domain.columns:
        raise ParameterError(f"The person column {person!r} cannot also be a key column.")
    clash = set(domain.columns) & set(OUTPUT_COLUMNS)
    if clash:
        raise ParameterError(f"Key columns cannot be named like an output column: {sorted(clash)}; rename them.")


def _key_type(c: np.ndarray) -> str:
    return "long" if np.asarray(c).dtype.kind in "iu" else "string"


COUNTS = _p.register(Counts())
