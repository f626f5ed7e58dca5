"""The JL projection's parameters and the mechanism of the release protocol (:class:`Projection`),
on any engine (docs/math.md section 2)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import InputError, ParameterError
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.noise_draws import transposed
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.bounds import (
    Bounds,
    ClipCounts,
    broadcast_box,
    clip_rows,
    row_norms,
)
from sparkpriv.privacy.calibration import split_epsilon
from sparkpriv.privacy.quantile import (
    DEFAULT_EXPONENTS,
    candidate_bounds,
    choose_bound,
    histogram_noise,
    wide_histogram_noise,
    norm_bucket_counts,
)
from sparkpriv.privacy.random import new_secret_seed, stream
from sparkpriv.mechanisms.projection._core import (NOISE_KINDS, NOISE_STAGE, ProjectionPlan, clamp_projected,
                                                   plan_projection, project_rows, secret_matrix_and_seed)


_POS = Interval("real", 0, None, "neither")
ROW_COUNTERS = ("rows", "rows_box_clipped", "rows_norm_clipped")
_RECORDS_REFUSED = ("columns", "row_bound", "lower", "upper", "element_bound", "row_bound_quantile", "fill")


@dataclass(frozen=True, kw_only=True)
class ProjectionParams(_p.Params):
    """Public parameters of the JL projection release (docs/math.md section 2; event records: section 8).

    ``matrix_key`` is a secret (never recorded, never shown): the key from
    which ``P`` is derived so later releases can reuse the same ``P``.
    """

    k: int = _p.option(help="output dimension (columns z0..z{k-1}), 1 .. number of columns",
                       constraints=[Interval("integer", 1, None, "left")])
    epsilon: float = _p.option(help="the total epsilon of the release", constraints=[_POS])
    delta: float = _p.option(0.0, help="0 for Laplace noise (pure epsilon-DP); in (0, 1) for Gaussian "
                             "noise", constraints=[Interval("real", 0, 1, "left")])
    columns: tuple | None = _p.option(None, help="numeric feature columns (one row per person); not with "
                                      "event records", kind="strs")
    noise: str = _p.option("laplace", help="laplace (pure epsilon-DP) or gaussian ((epsilon, delta)-DP)",
                           constraints=[Options(NOISE_KINDS)])
    neighbors: str = _p.option("replace-one", help="neighbour relation: replace-one (a person; n is public) "
                               "or element (ONE ATTRIBUTE only, not a person; needs --lower/--upper or "
                               "--element-bound, not --row-bound). add-remove cannot hold for a row-level "
                               "release and is refused", kind="neighbors")
    row_bound: float | None = _p.option(None, help="declared bound on each row's norm (rows are clipped to "
                                        "it)", constraints=[_POS])
    norm: str = _p.option("l2", help="norm of --row-bound", constraints=[Options(("l2", "l1"))])
    lower: tuple | None = _p.option(None, help="declared per-column lower bounds (one value for all "
                                    "columns, or one per column)", kind="floats")
    upper: tuple | None = _p.option(None, help="declared per-column upper bounds (one value for all "
                                    "columns, or one per column)", kind="floats")
    element_bound: float | None = _p.option(None, help="largest change of one attribute (element-wise "
                                            "relation)", constraints=[_POS])
    row_bound_quantile: float | None = _p.option(None, help="instead of --row-bound: estimate the row "
                                                 "bound as this DP quantile of the row norms (spends "
                                                 "--bound-epsilon-share of epsilon)",
                                                 constraints=[Interval("real", 0, 1, "right")])
    bound_epsilon_share: float = _p.option(0.1, help="share of epsilon spent on --row-bound-quantile",
                                           constraints=[Interval("real", 0, 1, "neither")])
    bound_search: tuple = _p.option(DEFAULT_EXPONENTS, help="with row_bound_quantile: the public "
                                    "candidates are 2^j for j in this (lo, hi) range of integers",
                                    kind="object")
    keep_columns: tuple = _p.option((), help="input columns declared PUBLIC and copied to the output "
                                    "unchanged (nothing else of the input, person keys included, is copied)",
                                    kind="strs")
    fill: float | None = _p.option(None, help="public value that replaces nulls in the feature columns",
                                   constraints=[Interval("real", None, None, "neither")])
    matrix_key: bytes | None = _p.option(None, help="SECRET key (>= 16 bytes) from which P is derived, to "
                                         "reuse the same P across releases (default: fresh OS entropy); "
                                         "never recorded", kind="object", recorded=False)

    def __repr__(self) -> str:  # the matrix key is a secret: never in a repr, log or message
        shown = ", ".join(f"{n}={v!r}" for n, v in self.public_dict().items())
        return f"ProjectionParams({shown}{', matrix_key=<secret>' if self.matrix_key is not None else ''})"

    def check(self, caller: str) -> None:
        if self.matrix_key is not None and (not isinstance(self.matrix_key, (bytes, bytearray))
                                            or len(self.matrix_key) < 16):
            raise ParameterError("The projection matrix key must be at least 16 bytes of secret material "
                                 f"(the 'matrix_key' parameter of {caller}, bytes).")
        if self.row_bound_quantile is not None:
            if self.row_bound is not None:
                raise ParameterError(
                    f"{caller}: row_bound_quantile estimates the row bound; it cannot be combined with a "
                    "declared row_bound. Give one or the other."
                )
            if self.neighbors == "element":
                raise ParameterError(
                    f"The 'row_bound_quantile' parameter of {caller} cannot be combined with "
                    "neighbors='element': clipping a row onto the norm ball rescales the whole row, so a "
                    "change of one attribute becomes a change of every coordinate and the element-wise "
                    "sensitivity no longer bounds it. Declare a per-column box (lower/upper) and/or "
                    "element_bound instead, or use neighbors='replace-one'."
                )
        overlap = set(self.columns or ()) & set(self.keep_columns)
        if overlap:
            raise ParameterError(
                f"Column {sorted(overlap)[0]!r} is both a feature column and a kept public column; "
                "a released column cannot be both private input and public output."
            )


@dataclass
class _State:
    """Public: what ``run`` needs besides the secrets."""

    kind: str
    k: int
    bounds: Bounds
    plan: ProjectionPlan
    keep: tuple = ()
    quantile: dict | None = None  # the DP row-bound pre-pass (public parameters)


@dataclass
class _Secrets:
    P: np.ndarray = field(repr=False)
    seed: int = field(repr=False)
    histogram_seed: int | None = field(default=None, repr=False)


class _Counts(Mapping):
    """Owner diagnostics read when asked (a lazy Spark output fills its counters when written)."""

    def __init__(self, counters, names=ROW_COUNTERS):
        self._c = counters
        self._names = names if counters is not None else ()

    def __getitem__(self, name):
        return self._c[self._names.index(name)].value

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _records_cap(facts: _p.InputFacts):
    """The item cap of bounded records from their public facts (value cap c, L2 bound c sqrt(L))."""
    from sparkpriv.mechanisms.sparse import ItemCap

    c = float(facts.value_cap)
    L = int(round((float(facts.l2_bound) / c) ** 2))
    if c == 1.0:
        return ItemCap(L)
    return ItemCap(L, "counts", int(round(c)))


class Projection(_p.Mechanism):
    """JL random projection + calibrated noise; one output row per input row (or person)."""

    name = "projection"
    title = "a projection release (of rows, or of event-table records)"
    summary = "JL random projection + calibrated noise (pairwise distances recoverable)"
    Params = ProjectionParams
    neighbors = (_p.REPLACE_ONE, _p.ELEMENT)
    row_level = True
    inputs = ("table", "records")

    def plan(self, params: ProjectionParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        from sparkpriv.privacy.accounting import compose

        d, k = facts.d, params.k
        matrix_source = ("secret key (held outside the output)" if params.matrix_key is not None
                         else "OS entropy, discarded after the job")
        if facts.kind == "records":
            given = {n for n in _RECORDS_REFUSED if getattr(params, n) is not None}
            if given or params.keep_columns:
                raise ParameterError(
                    f"{caller}: {', '.join(sorted(given) or ['keep_columns'])} cannot be given with "
                    "event-table records: their bounds come from the item cap (max_items) and they have "
                    "no public columns."
                )
            check_param("k", k, [Interval("integer", 1, d, "both")], caller)
            from sparkpriv.mechanisms.sparse import plan_sparse_projection

            cap = _records_cap(facts)
            P, seed = secret_matrix_and_seed(d, k, params.matrix_key)
            pplan = plan_sparse_projection(P, cap, epsilon=params.epsilon, delta=params.delta,
                                           noise=params.noise, neighbors=params.neighbors, caller=caller)
            event = pplan.dp_event()
            public = dict(pplan.to_public_dict(), input_kind="event table (sparse person records)",
                          matrix_source=matrix_source, reusable_projection=params.matrix_key is not None)
            return _p.Plan(events=event, epsilon=epsilon_of(event, pplan.delta), delta=pplan.delta,
                           public=public, neighbors=_p.REPLACE_ONE,
                           state=_State("records", k, pplan.bounds, pplan), secrets=_Secrets(P, seed))

        keep = tuple(params.keep_columns)
        if keep:
            if not facts.names:
                raise ParameterError("keep_columns needs a pandas or Arrow table input (a numpy array has "
                                     "no other columns to keep).")
            from sparkpriv.errors import SchemaError

            for c in keep:
                if c not in facts.names:
                    raise SchemaError(f"The kept (public) column {c!r} is not in the input. Available "
                                      f"columns: {', '.join(facts.names)}.")
        check_param("k", k, [Interval("integer", 1, d, "both")], caller)
        lower = broadcast_box(params.lower, d, "lower", caller)
        upper = broadcast_box(params.upper, d, "upper", caller)
        quantile = None
        if params.row_bound_quantile is not None:
            candidates = candidate_bounds(tuple(params.bound_search))
            eps_bound, eps_release = split_epsilon(params.epsilon, params.bound_epsilon_share)  # sum <= eps
            hist_noise = _wide_grid(histogram_noise(epsilon=eps_bound, neighbors=params.neighbors,
                                                    buckets=candidates.size + 1))
            bounds = Bounds(d, lower, upper, float(candidates[-1]), params.norm, None, _caller=caller)
            quantile = {"candidates": candidates, "noise": hist_noise, "q": float(params.row_bound_quantile),
                        "epsilon": params.epsilon * params.bound_epsilon_share, "eps_release": eps_release,
                        "delta": params.delta, "noise_kind": params.noise, "neighbors": params.neighbors,
                        "caller": caller}
        else:
            eps_release = params.epsilon
            bounds = Bounds(d, lower, upper, params.row_bound, params.norm, params.element_bound,
                            _caller=caller)
        P, seed = secret_matrix_and_seed(d, k, params.matrix_key)
        pplan = plan_projection(P, bounds, epsilon=eps_release, delta=params.delta, noise=params.noise,
                                neighbors=params.neighbors, caller=caller)
        public = dict(pplan.to_public_dict(), matrix_source=matrix_source,
                      reusable_projection=params.matrix_key is not None)
        # The events depend on epsilon (and delta) only, not on the bound: they are known (and
        # reserved) before the data is read, even when the bound itself comes from the data.
        if quantile is not None:
            event = compose([quantile["noise"].dp_event(), pplan.dp_event()])
            b = bounds.to_public_dict()
            public["bounds"] = {"lower": b["lower"], "upper": b["upper"],
                                "row_bound": f"DP quantile {params.row_bound_quantile}", "norm": params.norm}
            secrets = _Secrets(P, seed, new_secret_seed("bound-histogram-noise"))
        else:
            event = pplan.dp_event()
            secrets = _Secrets(P, seed)
        neighbors = _p.ELEMENT if params.neighbors == "element" else _p.REPLACE_ONE
        return _p.Plan(events=event, epsilon=epsilon_of(event, pplan.delta), delta=pplan.delta,
                       public=public, neighbors=neighbors,
                       state=_State("table", k, bounds, pplan, keep, quantile), secrets=secrets)

    def run(self, engine, source, plan: _p.Plan, progress) -> _p.Outcome:
        st: _State = plan.state
        sec: _Secrets = plan.secrets
        pplan, bounds = st.plan, st.bounds
        out_cols = [(f"z{i}", "double", False) for i in range(st.k)]
        public = {}
        if st.kind == "records":
            fn = _sparse_row_map(sec.P, pplan.noise, sec.seed, pplan.value_bound)
            table, rows = engine.map_rows(source, fn, out_cols)
            return _p.Outcome(table=table, rows=rows, extras={"plan": pplan})
        if getattr(source, "rows", None) == 0:  # in-memory input: its size is known without reading it
            raise InputError("The input table is empty: there is nothing to release.")
        if st.quantile is not None:
            q = st.quantile
            R = _dp_row_bound(engine, source, bounds, q, sec.histogram_seed)
            bounds = Bounds(bounds.dim, bounds.lower, bounds.upper, R, bounds.norm, None, _caller=q["caller"])
            pplan = plan_projection(sec.P, bounds, epsilon=q["eps_release"], delta=q["delta"],
                                    noise=q["noise_kind"], neighbors=q["neighbors"], caller=q["caller"])
            from sparkpriv.privacy.accounting import compose

            if compose([q["noise"].dp_event(), pplan.dp_event()]) != plan.events:  # pragma: no cover
                raise RuntimeError("the release's events changed with the estimated row bound")
            public = dict(pplan.to_public_dict(), row_bound_estimation={
                "method": "DP quantile of row norms (Laplace histogram over public power-of-two candidates)",
                "quantile": q["q"], "epsilon": q["epsilon"],
                "candidates": [float(q["candidates"][0]), float(q["candidates"][-1])],
                "histogram_noise": q["noise"].to_public_dict(), "chosen_row_bound": R,
            })
            progress.log("DP row bound: %.6g (quantile %g)", R, q["q"])
        counters = engine.counters(ROW_COUNTERS)
        fn = _dense_row_map(sec.P, bounds, pplan.noise, sec.seed, pplan.value_bound, counters)
        table, rows = engine.map_rows(source, fn, out_cols, keep=st.keep)
        return _p.Outcome(table=table, rows=rows, public=public,
                          extras={"plan": pplan, "diagnostics": _Counts(counters)})


def _dp_row_bound(engine, source, bounds: Bounds, q: dict, seed: int) -> float:
    """One pass: the noisy histogram of the (box-clipped) row norms; noise drawn once on the driver."""
    candidates = q["candidates"]
    counts = engine.aggregate(source, _norm_histogram_fn(Bounds(bounds.dim, bounds.lower, bounds.upper),
                                                         bounds.norm, candidates), candidates.size + 1)
    # clamping each count (a public range) never increases the sensitivity; the
    # grid holds 2^30 noise scales, so this only acts on astronomically large tables
    hist_noise = q["noise"]
    clamp = hist_noise.max_abs_value
    counts = np.clip(np.asarray(counts, dtype=np.float64), -clamp, clamp)
    noisy = _noise.add_noise(counts, hist_noise, stream(seed, 0))
    return choose_bound(noisy, candidates, q["q"])


def _norm_histogram_fn(box: Bounds, norm: str, candidates: np.ndarray):
    candidates = np.array(candidates, dtype=np.float64, copy=True)

    def norm_histogram(X):
        Xc, _ = clip_rows(X, box)
        return norm_bucket_counts(row_norms(Xc, norm), candidates)

    return norm_histogram


def _wide_grid(hist_noise):
    """:func:`sparkpriv.privacy.quantile.wide_histogram_noise` (the same event, a grid of 2^30 scales)."""
    return wide_histogram_noise(hist_noise)


def _dense_row_map(P, bounds: Bounds, noise, seed: int, value_bound=None, counters=None):
    """The engine's row map of dense blocks, built from plain values only (it is pickled).

    Per partition ``pid`` the noise comes from the keyed stream
    ``stream(seed, NOISE_STAGE, pid)``: a retried task reproduces it.
    ``noise=None`` gives the projection before noise (tests compare the
    engines with :func:`project_rows`). ``value_bound``: the plan's public range.
    """
    value_bound = None if value_bound is None else float(value_bound)
    P = np.ascontiguousarray(P)

    def projection_rows(pid, blocks):
        rng = stream(seed, NOISE_STAGE, pid)
        tot = ClipCounts()
        for X in blocks:
            Y, counts = project_rows(X, P, bounds, value_bound)
            tot = tot + counts
            yield list(transposed(Y) if noise is None else _noise.add_noise_transposed(Y, noise, rng))
        if counters is not None:
            counters[0].add(tot.rows)
            counters[1].add(tot.box_clipped)
            counters[2].add(tot.norm_clipped)

    return projection_rows


def _sparse_row_map(P, noise, seed: int, value_bound=None):
    """The engine's row map of bounded event records (:class:`~sparkpriv.mechanisms.protocol.SparseRows`,
    in the keyed person order), from plain values (pickled): the sum of the rows of ``P`` at a
    person's items, clamped, plus noise from ``stream(seed, NOISE_STAGE, pid)``."""
    from sparkpriv.mechanisms.sparse import project_sparse_rows

    P = np.ascontiguousarray(P)
    value_bound = None if value_bound is None else float(value_bound)

    def sparse_projection_rows(pid, blocks):
        rng = stream(seed, NOISE_STAGE, pid)
        for b in blocks:
            Y = project_sparse_rows(b.offsets, b.indices, b.values, P)
            if value_bound is not None:
                clamp_projected(Y, value_bound)
            yield list(transposed(Y) if noise is None else _noise.add_noise_transposed(Y, noise, rng))

    return sparse_projection_rows


PROJECTION = _p.register(Projection())
