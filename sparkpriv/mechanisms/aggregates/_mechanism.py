"""Aggregates per key as a mechanism of the release protocol (:class:`Aggregates`).

``plan`` (public parameters only): the query, the key domain (refused above ``max_domain`` keys,
the product shown), the noise of every measured group, the key-selection threshold, and, with
``auto`` bounds, the Laplace histograms that choose them: everything composed into the one event
the ledger reserves before any data is read. ``run``: with auto bounds one pass of histograms first
(noised once on the driver, the bounds chosen, the release re-planned at them and checked to spend
no more than was reserved), then one pass of per-key totals: summed per partition and noised once
on the driver over a public domain, or totalled in the JVM and noised in the tasks (keyed by
partition) for private keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.mechanisms.aggregates._estimate import add_group_noise, cells, selected
from sparkpriv.mechanisms.aggregates._params import AggregatesParams, EventSpec, _auto_or_int
from sparkpriv.mechanisms.aggregates._plan import AggregatesPlan, plan_aggregates
from sparkpriv.mechanisms.aggregates._query import output_columns, parse_split
from sparkpriv.mechanisms.aggregates._stats import (DIAGNOSTICS, Bounding, auto_histograms, clamp_candidates,
                                                    key_totals)
from sparkpriv.privacy.random import derive_seed, new_secret_seed, stream

__all__ = ["Aggregates", "AGGREGATES"]



@dataclass
class _Auto:
    """The automatic bounds of a release: which, their limits, noises and epsilons (public)."""

    keys: bool
    events: bool
    columns: tuple  # value columns with an auto clamp
    key_limit: int
    event_limit: int
    noises: dict  # "keys" / "events" / column -> LaplaceNoise
    epsilons: dict
    reserved: object  # the main events at the limits, discounted (auto_bound.discount_event)
    quantile: float
    bounds_quantile: float


@dataclass
class _State:
    spec: EventSpec
    query: object
    params: AggregatesParams
    plan: AggregatesPlan  # at the declared bounds, or at the limits (auto)
    auto: _Auto | None
    split: dict


def _plan_at(st_params, query, *, L, c, clamps, epsilon, caller, fit: float = 1.0) -> AggregatesPlan:
    p = st_params
    return plan_aggregates(aggregates=query.aggregates, max_keys=L, max_events_per_key=c, clamps=clamps,
                           buckets=p.quantile_buckets, domain_size=None if query.private else query.domain.size,
                           epsilon=epsilon, delta=p.delta, noise=p.noise, neighbors=p.neighbors,
                           split=parse_split(p.split, caller), selection_delta=p.selection_delta,
                           confidence=p.confidence, clamp=p.clamp, round=p.round, fit=fit, caller=caller)


class Aggregates(_p.Mechanism):
    """DP aggregates per key of an event table: count, count_distinct, sum, mean, variance, quantiles."""

    name = "aggregates"
    title = "DP aggregates per key"
    summary = ("DP aggregates per key of an event table (count, count_distinct, sum, mean, variance, "
               "quantiles), every cell with its std and interval; public key domains or private key selection")
    Params = AggregatesParams
    neighbors = (_p.ADD_REMOVE, _p.REPLACE_ONE)
    refused_neighbors = {"element": "it protects whole people, not single attributes"}
    inputs = ("events",)
    engines = ("local", "spark")
    # under add-remove whether the table is empty is not public: released like any other input
    refuses_empty_input = False

    def open_args(self, params: AggregatesParams) -> dict:
        q = params.query(f"release_{self.name}")
        return {"columns": None, "fill": None,
                "events": EventSpec(params.person, tuple(params.by), q.domain, q.columns)}

    def check_input(self, params, facts, caller):
        if facts.kind != "events":
            raise ParameterError(f"{caller} takes an event table (a Spark DataFrame, or a pandas DataFrame or pyarrow "
                                 f"Table in memory, with the person, key and value columns). Got {facts.kind} input.")

    def plan(self, params: AggregatesParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        from sparkpriv.mechanisms.auto_bound import EPSILON_MARGIN, discount_event
        from sparkpriv.privacy.accounting import compose, epsilon_of
        from sparkpriv.privacy.calibration import split_epsilon
        from sparkpriv.privacy.quantile import histogram_noise, wide_histogram_noise

        rel = _p.resolve_neighbors(params.neighbors, self, caller)
        q = params.query(caller)
        L = _auto_or_int("max_keys", params.max_keys, caller)
        c = _auto_or_int("max_events_per_key", params.max_events_per_key, caller, high=1 << 20)
        auto_cols = tuple(col for col in q.columns if q.bounds[col] == "auto")
        n_auto = (L == "auto") + (c == "auto") + len(auto_cols)
        spec = EventSpec(params.person, tuple(params.by), q.domain, q.columns)
        secrets = {"noise": new_secret_seed("aggregates-noise"),
                   "choice": (derive_seed(bytes(params.bounding_key), "contribution-bounding")
                              if params.bounding_key is not None else new_secret_seed("aggregates-bounding")),
                   "auto": new_secret_seed("aggregates-auto-bounds")}
        split = parse_split(params.split, caller)
        if n_auto == 0:
            aplan = _plan_at(params, q, L=L, c=c, clamps=q.bounds, epsilon=params.epsilon, caller=caller)
            events, auto = aplan.events, None
        else:
            eps_auto, eps_main = split_epsilon(params.epsilon, params.auto_share)
            key_limit = min(params.max_keys_limit, q.domain.size) if (L == "auto" and not q.private) \
                else params.max_keys_limit
            limits = {col: (-2.0**30, 2.0**30) for col in auto_cols}
            aplan = _plan_at(params, q, L=key_limit if L == "auto" else L,
                             c=params.max_events_limit if c == "auto" else c,
                             clamps={**q.bounds, **limits}, epsilon=eps_main * (1.0 - EPSILON_MARGIN), caller=caller)
            reserved = discount_event(aplan.events)
            each = eps_auto / n_auto * (1.0 - 1e-12)
            cands = clamp_candidates()
            noises, eps = {}, {}
            if L == "auto":
                noises["keys"] = wide_histogram_noise(histogram_noise(epsilon=each, neighbors=rel.name,
                                                                      buckets=key_limit + 1))
            if c == "auto":
                noises["events"] = wide_histogram_noise(histogram_noise(epsilon=each, neighbors=rel.name,
                                                                        buckets=params.max_events_limit + 1))
            for col in auto_cols:
                noises[col] = wide_histogram_noise(histogram_noise(epsilon=each, neighbors=rel.name,
                                                                   buckets=cands.size + 1))
            for k, nz in noises.items():
                eps[k] = each
            events = compose([nz.dp_event() for nz in noises.values()] + [reserved])
            auto = _Auto(L == "auto", c == "auto", auto_cols, key_limit, params.max_events_limit, noises, eps,
                         reserved, params.auto_quantile, params.bounds_quantile)
            if epsilon_of(events, params.delta) > params.epsilon:  # pragma: no cover - margins make room
                raise ParameterError(f"{caller}: the automatic bounds do not fit in epsilon={params.epsilon!r}.")
        epsilon = float(epsilon_of(events, params.delta))
        public = aplan.to_public_dict()
        public["mechanism"] = "aggregates"
        public["protects"] = rel.protects
        public["key_domain"] = q.domain.to_public_dict() if q.domain is not None else {
            "columns": list(params.by), "kind": "private key selection"}
        public["uncertainty"] = _uncertainty_statement(aplan)
        public["post_processing"] = _post_processing(aplan)
        public["epsilon_accounted"] = epsilon
        if auto is not None:
            public["automatic_bounds"] = {
                "method": "DP quantiles from Laplace histograms (one pass, noised once on the driver), composed "
                          "into the reserved event; the release is planned at the limits and run at the chosen "
                          "bounds with at least the reserved noise",
                "epsilon": float(sum(auto.epsilons.values())), "quantile": auto.quantile,
                "bounds_quantile": auto.bounds_quantile, "max_keys_limit": auto.key_limit if auto.keys else None,
                "max_events_limit": auto.event_limit if auto.events else None,
                "auto_columns": list(auto.columns)}
        parameters = {"aggregates": ", ".join(str(a) for a in q.aggregates),
                      "bounds": ", ".join(f"{k}={'auto' if v == 'auto' else f'{v[0]:g}:{v[1]:g}'}"
                                          for k, v in q.bounds.items()),
                      "domain": public["key_domain"], "by": list(params.by)}
        state = _State(spec, q, params, aplan, auto, split)
        return _p.Plan(events=events, epsilon=epsilon, delta=float(params.delta), public=public, neighbors=rel,
                       state=state, secrets=secrets, parameters=parameters)

    # ------------------------------------------------------------------ run

    def run(self, engine, source, plan: _p.Plan, progress) -> _p.Outcome:
        st: _State = plan.state
        aplan = st.plan
        extra_public = {}
        if st.auto is not None:
            aplan, extra_public = self._resolve_auto(engine, source, plan, progress)
        lo = tuple(float(aplan.clamps[c][0]) for c in st.query.columns)
        hi = tuple(float(aplan.clamps[c][1]) for c in st.query.columns)
        bounding = Bounding(aplan.max_keys, aplan.max_events_per_key, tuple(st.query.columns), lo, hi,
                            aplan.buckets, aplan.groups)
        counters = engine.counters(DIAGNOSTICS)
        choice, seed = plan.secrets["choice"], plan.secrets["noise"]
        W = bounding.width
        out_names = output_columns(aplan.aggregates)
        if not st.query.private:
            d = st.query.domain.size
            fn = _totals_fn(bounding, choice, d, counters)
            totals = engine.aggregate(source, fn, d * W).reshape(d, W)
            noisy = add_group_noise(totals, aplan, stream(seed, 0))
            cols = cells(noisy, aplan)
            keys = st.query.domain.column_values()
            from sparkpriv.mechanisms.counts import _key_type

            table = engine.columns_table([(n, _key_type(v), v) for n, v in zip(st.query.domain.columns, keys)]
                                         + [(n, "double", v) for n, v in cols])
            progress.log("aggregates: %d keys x %d statistics noised once on the driver", d, W)
        else:
            partial = _private_fn(bounding, choice, counters)
            finish = _finish_fn(aplan, seed)
            table = engine.key_table(source, partial, W, finish, [(n, "double") for n in out_names])
            progress.log("aggregates: private keys, %d statistics per key noised in the tasks (threshold %.6g)", W,
                         aplan.selection.threshold)
        public = dict(aplan.to_public_dict(), **extra_public)
        public["uncertainty"] = _uncertainty_statement(aplan)
        public["post_processing"] = _post_processing(aplan)
        public["epsilon_accounted"] = plan.epsilon

        def diagnostics():
            if counters is None:
                return {}
            # the owner warnings on truncation are Release.owner_warnings' (logged once per release)
            return {n: int(a.value) for n, a in zip(DIAGNOSTICS, counters)}

        return _p.Outcome(table=table, public=public, extras={"diagnostics": diagnostics})

    def _resolve_auto(self, engine, source, plan, progress):
        """One pass of histograms, noised once; the bounds chosen; the release planned at them."""
        from sparkpriv.mechanisms.auto_bound import EPSILON_MARGIN, choose_max_items, dominates
        from sparkpriv.privacy import noise as _noise
        from sparkpriv.privacy.calibration import split_epsilon

        st: _State = plan.state
        a = st.auto
        q = st.query
        cands = clamp_candidates()
        idx = tuple(q.columns.index(c) for c in a.columns)
        size = (a.key_limit + 1 if a.keys else 0) + (a.event_limit + 1 if a.events else 0) \
            + len(idx) * (cands.size + 1)
        fn = _auto_fn(a.key_limit if a.keys else None, a.event_limit if a.events else None, idx, cands,
                      None if q.private else q.domain.size)
        hist = engine.aggregate(source, fn, size)
        rng = stream(plan.secrets["auto"], 0)
        o = 0
        chosen = {}
        L = st.plan.max_keys
        c = st.plan.max_events_per_key
        clamps = dict(st.plan.clamps)
        if a.keys:
            h = _noisy(hist[o:o + a.key_limit + 1], a.noises["keys"], rng)
            L = choose_max_items(h, a.quantile)
            o += a.key_limit + 1
            chosen["max_keys"] = int(L)
        if a.events:
            h = _noisy(hist[o:o + a.event_limit + 1], a.noises["events"], rng)
            c = choose_max_items(h, a.quantile)
            o += a.event_limit + 1
            chosen["max_events_per_key"] = int(c)
        for col in a.columns:
            h = _noisy(hist[o:o + cands.size + 1], a.noises[col], rng)
            clamps[col] = choose_clamp(h, cands, a.bounds_quantile)
            o += cands.size + 1
            chosen[f"bounds({col})"] = list(clamps[col])
        _, eps_main = split_epsilon(st.params.epsilon, st.params.auto_share)
        aplan = _plan_at(st.params, q, L=L, c=c, clamps=clamps, epsilon=eps_main * (1.0 - EPSILON_MARGIN),
                         caller=progress.caller, fit=st.plan.fit)
        if not dominates(aplan.events, a.reserved):  # pragma: no cover - tested in tests/mechanisms
            raise RuntimeError(f"{progress.caller}: the release at the chosen bounds would spend more than was "
                               "reserved")
        progress.log("aggregates: automatic bounds chosen by DP quantiles: %s", chosen)
        return aplan, {"automatic_bounds_chosen": chosen,
                       "automatic_bounds_noise": {k: nz.to_public_dict() for k, nz in a.noises.items()}}


def _noisy(h, nz, rng):
    from sparkpriv.privacy import noise as _noise

    clamp = nz.max_abs_value  # a public range: never increases the sensitivity
    return _noise.add_noise(np.clip(np.asarray(h, np.float64), -clamp, clamp), nz, rng)


def choose_clamp(noisy: np.ndarray, candidates: np.ndarray, quantile: float) -> tuple:
    """``(lo, hi)`` from the noisy histogram of values over the candidates (post-processing):
    ``hi`` the smallest candidate whose noisy cumulative weight reaches ``(1 + quantile) / 2`` of the
    total, ``lo`` the largest candidate below which at most ``(1 - quantile) / 2`` lies (buckets
    summed as they are: unbiased cumulative sums). A degenerate choice widens to the next candidate."""
    h = np.asarray(noisy, np.float64)
    total = h.sum()
    m = candidates.size
    if total <= 0:
        return (float(candidates[0]), float(candidates[-1]))
    cum = np.cumsum(h)  # cum[i]: weight of values <= candidates[i] (bucket i: (c[i-1], c[i]])
    tail = (1.0 - quantile) / 2.0
    up = np.flatnonzero(cum[:m] >= (1.0 - tail) * total)
    hi_i = int(up[0]) if up.size else m - 1
    below = np.concatenate(([0.0], cum[:m - 1]))  # weight of values < candidates[i] (at most)
    ok = np.flatnonzero(below <= tail * total)
    lo_i = int(ok[-1]) if ok.size else 0
    lo_i = min(lo_i, hi_i)
    if lo_i == hi_i:
        hi_i = min(hi_i + 1, m - 1)
        if lo_i == hi_i:
            lo_i -= 1
    return (float(candidates[lo_i]), float(candidates[hi_i]))


def _totals_fn(bounding: Bounding, choice: int, d: int, counters):
    def aggregates_totals(block):
        totals, diag = key_totals(block, bounding, choice, d)
        if counters is not None:
            for acc, v in zip(counters, diag):
                if v:
                    acc.add(v)
        return totals.reshape(-1)

    return aggregates_totals


def _private_fn(bounding: Bounding, choice: int, counters):
    def aggregates_key_partials(block):
        ids, totals, diag = key_totals(block, bounding, choice, None)
        if counters is not None:
            for acc, v in zip(counters, diag):
                if v:
                    acc.add(v)
        return ids, totals

    return aggregates_key_partials


def _finish_fn(aplan: AggregatesPlan, seed: int):
    """``(pid, totals (k, W)) -> (released mask, columns of the released keys)``: the partition's noise
    from its keyed stream ``stream(seed, 1, pid)`` (the engine gives each partition its keys in a fixed
    order, so a retried task redraws the same noise)."""

    def aggregates_finish(pid: int, totals: np.ndarray):
        noisy = add_group_noise(totals, aplan, stream(seed, 1, pid))
        keep = selected(noisy, aplan)
        cols = cells(noisy[keep], aplan)
        return keep, [v for _, v in cols]

    return aggregates_finish


def _auto_fn(key_limit, event_limit, idx, cands, domain_size):
    def aggregates_auto_histograms(block):
        return auto_histograms(block, key_limit=key_limit, event_limit=event_limit, auto_columns=idx,
                               candidates=cands, domain_size=domain_size)

    return aggregates_auto_histograms


def _uncertainty_statement(aplan: AggregatesPlan) -> dict:
    out = {"confidence": aplan.confidence,
           "covers": "the value of the bounded data: at most max_keys keys per person, each person's events at a "
                     "key weighted min(n, c) / n, values clamped to their bounds",
           "intervals": "<aggregate>_ci_low, <aggregate>_ci_high per key; <aggregate>_std",
           "count, count_distinct": "value -+ half_width of the noise (exact coverage)",
           "sum": "the box of the noisy centred sum and events, each at sqrt(confidence)",
           "mean": "the range of the centred sum / events over that box (the clamp range when events may be 0); "
                   "std first-order",
           "variance": "the range of sumsq / events - (sum / events)^2 over the box of the three, each at "
                       "confidence^(1/3); std first-order",
           "quantile": "a simultaneous band of the noisy cumulative histogram; std = interval width / 3.92"}
    per = {}
    for cal in aplan.calibrations:
        per[cal.group.name] = {"std": cal.std, "half_width": cal.half_width}
    out["per_statistic"] = per
    ranks = {}
    for (col, p), z in aplan.bands.items():
        cal = aplan.calibration(f"histogram({col})")
        B = aplan.buckets
        j = np.arange(B)
        s = float(np.max(cal.std * np.sqrt((j + 1) * (1 - p) ** 2 + (B - 1 - j) * p**2)))
        ranks[f"quantile({col}, {p:g})"] = {"rank_error_std": s, "rank_error_bound": z * s, "band_z": z,
                                            "bucket_width": (aplan.clamps[col][1] - aplan.clamps[col][0]) / B,
                                            "unit": "weighted events"}
    if ranks:
        out["quantile_rank_error"] = ranks
    return out


def _post_processing(aplan: AggregatesPlan) -> dict:
    return {"clamp": ("counts and count interval ends at least 0; sums of one-signed clamps keep their sign; means "
                      "in [lo, hi]; variances in [0, ((hi - lo) / 2)^2]" if aplan.clamp else "none"),
            "intervals": "every interval intersected with the range its true value lies in",
            "round": "count and count_distinct rounded to integers (their std and interval are the rounded "
                     "value's)" if aplan.round else "none",
            "consistency": "mean = mid + centred sum / events; a released sum of a column whose mean is released too "
                           "is mean x events (the noisy events, unrounded)",
            "quantiles": "interpolated linearly inside the bucket where the noisy cumulative histogram crosses p"}


AGGREGATES = _p.register(Aggregates())
