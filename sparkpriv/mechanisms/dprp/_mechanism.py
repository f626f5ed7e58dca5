"""DPRP as a mechanism of the release protocol (sparkpriv.mechanisms.protocol): parameters,
plan and the engine passes for tables and event records (docs/dprp.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.bounds import ClipCounts
from sparkpriv.privacy.random import stream
from sparkpriv.mechanisms.dprp._plan import (DEFAULT_BUDGET_SPLIT, DEFAULT_IMPUTE_SHARE, DPRPPlan,
                                             GRAM_NOISE_STAGE, IMPUTE_NOISE_STAGE, LABEL_MODES,
                                             ROW_NOISE_STAGE, _check_split, _jsonable, draw_secrets, plan_dprp,
                                             validate_params)
from sparkpriv.mechanisms.dprp._rows import (check_noise_multiplier, decode_rows, dp_column_means,
                                             fill_missing, gram_from_partial, gram_partial, impute_partial,
                                             noisy_grams, prepare_rows, reconstruct_rows, solve,
                                             uncertainty_public)


# ----------------------------------------------------------------------------- the mechanism (protocol)

DEFAULT_THRESHOLD = 0.5  # event records: a released person visited an item when X'_j >= this
_POS = Interval("real", 0, None, "neither")
_EMPTY = "The input table is empty: there is nothing to release."


@dataclass(frozen=True, kw_only=True)
class DPRPParams(_p.Params):
    """Public parameters of the DPRP release (docs/dprp.md; docs/math.md section 3)."""

    epsilon: float = _p.option(help="the total epsilon of the release", constraints=[_POS])
    delta: float = _p.option(help="the total delta of the release, in (0, 1): DPRP adds Gaussian noise and "
                             "needs a delta (e.g. 1e-6, at most 1/n)", kind="float")
    columns: tuple = _p.option(None, help="numeric feature columns (one row per person); integer columns "
                               "are rounded back to integers; not with event records", kind="strs")
    lower: tuple | None = _p.option(None, help="declared per-column lower bounds (one value for all columns, "
                                    "or one per column); features are mapped to [0, 1] by them",
                                    kind="floats", required_unless="events")
    upper: tuple | None = _p.option(None, help="declared per-column upper bounds (one value for all columns, "
                                    "or one per column)", kind="floats", required_unless="events")
    label: str | None = _p.option(None, help="label column (integer, string or boolean)", kind="str")
    labels: str | None = _p.option(None, help="how the label is treated: public (released as is, one run per "
                                   "class, class sizes released) or private (protected, decoded by argmax)",
                                   constraints=[Options(LABEL_MODES)])
    classes: tuple | None = _p.option(None, help="the declared label values, comma-separated (required with "
                                      "--label)", kind="strs")
    k1: int | None = _p.option(None, help="projection dimension", doc_default="4 k2",
                               constraints=[Interval("integer", 1, None, "left")])
    k2: int | None = _p.option(None, help="eigenvectors kept", doc_default="round(0.6 d); with --events "
                               "min(d, 64)", constraints=[Interval("integer", 1, None, "left")])
    row_bound: float | None = _p.option(None, help="L2 bound of a row on the [0, 1] scale (rows are clipped "
                                        "to it)", doc_default="the largest norm the bounds allow: no clipping",
                                        constraints=[_POS])
    budget_split: tuple = _p.option(DEFAULT_BUDGET_SPLIT, help="shares of the Gaussian-DP budget for "
                                    "projection,Gram (sum 1)", kind="floats", doc_default="0.8,0.2")
    fill: float | str | None = _p.option(None, help="public value that replaces nulls in the feature "
                                         "columns, or 'dp-mean': DP column means (spends impute_share of "
                                         "the budget; one more read of the input)", kind="float")
    impute_share: float = _p.option(DEFAULT_IMPUTE_SHARE, help="share of the Gaussian-DP budget (mu^2) for "
                                    "--fill-dp-mean", doc_default="0.05",
                                    constraints=[Interval("real", 0, 1, "neither")])
    label_scale: float = _p.option(1.0, help="value of the one-hot label entry with private labels",
                                   doc_default="1.0", constraints=[_POS])
    keep_columns: tuple = _p.option((), help="input columns declared PUBLIC, copied to the output "
                                    "unchanged", kind="strs")
    threshold: float | None = _p.option(None, help="event tables: a released person visited an item when "
                                        "its reconstructed value (events; 1 for binary) is at least this; "
                                        "the output is items array<int>", doc_default="0.5",
                                        constraints=[_POS])
    neighbors: str = _p.option("replace-one", help="neighbour relation: replace-one (a person; n is "
                               "public). add-remove cannot hold for a row-level release and is refused",
                               kind="neighbors")
    integer_columns: object = _p.option((), help="indices of columns rounded back to integers besides those "
                                        "of an integer type (in-memory float arrays)", kind="object",
                                        cli=False)

    def check(self, caller: str) -> None:
        """The rules that need no schema; the others are in :meth:`DPRP.plan` (public only)."""
        if isinstance(self.delta, (int, float)) and not isinstance(self.delta, bool) and self.delta == 0:
            raise ParameterError(
                f"The 'delta' parameter of {caller} must be in (0, 1): DPRP adds Gaussian noise and "
                "gives (epsilon, delta)-DP. Got 0 instead: give e.g. delta=1e-6 (at most 1/n)."
            )
        check_param("delta", self.delta, [Interval("real", 0, 1, "neither")], caller)
        if self.label is not None and self.labels is None:
            raise ParameterError(
                f"{caller} got label={self.label!r}: declare labels='public' (released as they are, one run "
                "per class, class sizes released) or labels='private' (protected, decoded by argmax)."
            )
        if self.labels is not None and self.label is None:
            raise ParameterError(f"The 'labels' parameter of {caller} is {self.labels!r} but no label column "
                                 "was given.")
        if self.classes is not None and (len(self.classes) < 2 or len(set(self.classes)) != len(self.classes)):
            raise ParameterError(
                f"The 'classes' parameter of {caller} must list at least two distinct declared label "
                f"values. Got {list(self.classes)!r} instead: a label column with one class cannot be "
                "released with labels."
            )
        if self.k1 is not None and self.k2 is not None and self.k1 < self.k2:
            raise ParameterError(
                f"The 'k1' parameter of {caller} must be at least k2 = {self.k2} (the reconstruction inverts "
                f"the k2 x k1 matrix V'^T R). Got {self.k1} instead; the default is 4 * k2 = {4 * self.k2}."
            )
        _check_split(self.budget_split, caller)
        if isinstance(self.fill, str):
            if self.fill != "dp-mean":
                raise ParameterError(
                    f"The 'fill' parameter of {caller} must be a number (a public constant, in the "
                    f"columns' units) or 'dp-mean'. Got {self.fill!r} instead."
                )
        else:
            check_param("fill", self.fill, [None, Interval("real", None, None, "neither")], caller)


@dataclass
class _DPRPState:
    """What :meth:`DPRP.run` needs besides the secrets (all public)."""

    plan: DPRPPlan
    kind: str
    label: str | None = None
    keep: tuple = ()
    threshold: float = DEFAULT_THRESHOLD
    cap: object = None  # ItemCap of event records
    noise_free: bool = False  # tests only (set on a plan's state by hand): the passes without noise


class DPRP(_p.Mechanism):
    """DPRP: noisy random projection + noisy Gram; the same columns on the same scale."""

    name = "dprp"
    title = "DPRP (a row-level release)"
    summary = "DPRP private table release: noisy random projection + noisy Gram, same columns and scale"
    Params = DPRPParams
    neighbors = (_p.REPLACE_ONE,)
    refused_neighbors = {"element": "it protects whole records (people), not single attributes"}
    row_level = True
    inputs = ("table", "records")

    def open_args(self, params: DPRPParams) -> dict:
        # fill (a constant or "dp-mean") is applied by the mechanism on the null mask, so that
        # the same values are filled on every engine; the label is decoded to class codes
        labels = None
        if params.label is not None and params.classes is not None:
            labels = (params.label, tuple(params.classes))
        fill = params.fill if params.fill is not None else _p.missing_value_fill(params)
        return {"columns": params.columns, "fill": fill, "labels": labels,
                "missing": params.fill is not None, "keep": tuple(params.keep_columns)}

    def plan(self, params: DPRPParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        if facts.kind == "records":
            return self._plan_records(params, facts, caller)
        if params.threshold is not None:
            raise ParameterError(
                f"The 'threshold' parameter of {caller} applies to bounded event records only: a table "
                "release keeps its columns and scale (threshold the released columns afterwards)."
            )
        columns, keep = list(facts.columns), list(params.keep_columns)
        label, labels = params.label, params.labels
        classes = facts.classes if label is not None else None
        if label is not None:
            if classes is None or not classes:
                raise ParameterError(
                    f"The 'classes' parameter of {caller} is required with a label column: declare the "
                    "label values (e.g. classes=[0, 1] / --classes 0,1)."
                )
            if label in columns or label in keep:
                raise ParameterError(f"The label column {label!r} must not also be a feature or kept column.")
        overlap = set(columns) & set(keep)
        if overlap:
            raise ParameterError(
                f"Column {sorted(overlap)[0]!r} is both a feature column and a kept public column; "
                "a released column cannot be both private input and public output."
            )
        d = facts.d
        lower = None if params.lower is None else _per_column(params.lower, d, "lower", caller)
        upper = None if params.upper is None else _per_column(params.upper, d, "upper", caller)
        v = validate_params(d=d, epsilon=params.epsilon, delta=params.delta, lower=lower, upper=upper,
                            k1=params.k1, k2=params.k2, row_bound=params.row_bound,
                            budget_split=params.budget_split, labels=labels, classes=classes,
                            label_scale=params.label_scale, fill=params.fill, impute_share=params.impute_share,
                            neighbors="replace-one", caller=caller)
        ints = sorted(set(facts.integer_columns) | {int(i) for i in params.integer_columns})
        if ints and not (0 <= ints[0] and ints[-1] < d):
            raise ParameterError(f"The 'integer_columns' parameter of {caller} must hold column indices in "
                                 f"[0, {d}). Got {list(params.integer_columns)!r}.")
        R, seed = draw_secrets(d + v["n_label_columns"], v["k1"])
        dplan = plan_dprp(R, d=d, epsilon=params.epsilon, delta=params.delta, lower=v["lower"],
                          upper=v["upper"], k2=v["k2"], row_bound=v["row_bound"], budget_split=v["budget_split"],
                          labels=labels, classes=classes, label_scale=params.label_scale, integer_columns=ints,
                          fill=params.fill, impute_share=params.impute_share)
        event = dplan.dp_event()
        public = dict(dplan.to_public_dict(), matrix_source="OS entropy, discarded after the job",
                      events_note="GaussianDpEvent(1/mu_i) per step; the noise objects' own multipliers "
                                  "are at least these (checked)")
        resolved = {"columns": columns, "classes": [_jsonable(c) for c in dplan.classes], "k1": dplan.k1,
                    "k2": dplan.k2, "row_bound": dplan.row_bound, "budget_split": list(dplan.budget_split),
                    "impute_share": dplan.impute_share, "label_scale": dplan.label_scale,
                    "lower": list(dplan.lower), "upper": list(dplan.upper), "keep_columns": keep,
                    "bounds": {"lower": list(dplan.lower), "upper": list(dplan.upper)}}
        state = _DPRPState(dplan, "table", label=label, keep=tuple(keep))
        return _p.Plan(events=event, epsilon=epsilon_of(event, dplan.delta), delta=dplan.delta, public=public,
                       neighbors=_p.REPLACE_ONE, state=state, secrets=(R, seed), parameters=resolved)

    def _plan_records(self, params: DPRPParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        from sparkpriv.mechanisms.dprp_records import default_k2_records
        from sparkpriv.mechanisms.sparse import ItemCap

        given = [n for n, val in (("columns", params.columns), ("lower", params.lower), ("upper", params.upper),
                                  ("row_bound", params.row_bound), ("label", params.label),
                                  ("labels", params.labels), ("classes", params.classes), ("fill", params.fill),
                                  ("keep_columns", list(params.keep_columns) or None),
                                  ("label_scale", None if params.label_scale == 1.0 else params.label_scale),
                                  ("impute_share", None if params.impute_share == DEFAULT_IMPUTE_SHARE
                                   else params.impute_share),
                                  ("integer_columns", list(params.integer_columns) or None)) if val is not None]
        if given:
            raise ParameterError(
                f"The {', '.join(repr(g) for g in given)} parameter(s) of {caller} do not apply to "
                "bounded event records: the items are the vocabulary, the bounds come from the item "
                "cap (max_items, weights), and an event table has no label or public columns. "
                "Remove them."
            )
        d, c = facts.d, float(facts.value_cap)
        z = facts.l2_bound / c  # sqrt(L): the row bound on the [0, 1] scale
        max_items = int(round(z * z))
        cap = ItemCap(max_items) if c == 1.0 else ItemCap(max_items, "counts", int(round(c)))
        threshold = DEFAULT_THRESHOLD if params.threshold is None else float(params.threshold)
        v = validate_params(d=d, epsilon=params.epsilon, delta=params.delta, lower=(0.0,) * d, upper=(c,) * d,
                            k1=params.k1, k2=default_k2_records(d) if params.k2 is None else params.k2,
                            row_bound=z, budget_split=params.budget_split, labels=None, classes=None,
                            label_scale=1.0, fill=None, impute_share=DEFAULT_IMPUTE_SHARE,
                            neighbors="replace-one", caller=caller)
        R, seed = draw_secrets(d, v["k1"])
        dplan = plan_dprp(R, d=d, epsilon=params.epsilon, delta=params.delta, lower=v["lower"], upper=v["upper"],
                          k2=v["k2"], row_bound=v["row_bound"], budget_split=v["budget_split"], labels=None,
                          classes=None, label_scale=1.0)
        event = dplan.dp_event()
        public = dplan.to_public_dict()
        public["feature_bounds"] = {"per_item": [0.0, c], "scaled_to": [0.0, 1.0],
                                    "row_bound_formula": "sqrt(max_items) on the [0, 1] scale"}
        for key in ("integer_columns_rounded", "labels", "classes", "label_scale", "fill_for_nulls"):
            public.pop(key, None)
        public.update(input_kind="event table (sparse person records)",
                      output="items array<int>: vocabulary indices where the reconstructed value >= threshold",
                      matrix_source="OS entropy, discarded after the job",
                      events_note="GaussianDpEvent(1/mu_i) per step; the noise objects' own multipliers "
                                  "are at least these (checked)")
        resolved = {"k1": dplan.k1, "k2": dplan.k2, "budget_split": list(dplan.budget_split),
                    "threshold": threshold, "bounds": public["feature_bounds"]}
        state = _DPRPState(dplan, "records", threshold=threshold, cap=cap)
        return _p.Plan(events=event, epsilon=epsilon_of(event, dplan.delta), delta=dplan.delta, public=public,
                       neighbors=_p.REPLACE_ONE, state=state, secrets=(R, seed), parameters=resolved)

    def run(self, engine, source, plan: _p.Plan, progress) -> _p.Outcome:
        st: _DPRPState = plan.state
        if st.kind == "records":
            return _run_records(engine, source, st, plan.secrets, progress)
        return _run_table(engine, source, st, plan.secrets, progress)


def _per_column(values, d: int, name: str, caller: str) -> tuple:
    values = tuple(float(v) for v in np.atleast_1d(np.asarray(values, float)))
    if len(values) == 1:
        return values * d
    if len(values) != d:
        raise ParameterError(f"The {name!r} parameter of {caller} must have one value, or one per "
                             f"column ({d}). Got {len(values)}.")
    return values


def _run_table(engine, source, st: _DPRPState, secrets, progress) -> _p.Outcome:
    from sparkpriv.errors import InputError

    dplan = st.plan
    R, seed = secrets
    d = dplan.d
    public: dict = {}
    fill_values = fill_std = None
    if dplan.fill == "dp-mean":  # pass 0: DP column means, noise added once here
        tot = engine.aggregate(source, _impute_fn(dplan), 2 * d + 1)
        n = int(tot[-1])
        if n == 0:
            raise InputError(_EMPTY)
        noise = dplan.impute_noise(n)
        check_noise_multiplier(noise, dplan.mu["impute"])
        fill_values, fill_std = dp_column_means(tot, None if st.noise_free else noise,
                                                stream(seed, IMPUTE_NOISE_STAGE), dplan, with_std=True)
        public["impute_noise"] = noise.to_public_dict()
        public["dp_fill_values"] = [float(x) for x in fill_values]
    elif dplan.fill is not None:
        fill_values = np.full(d, float(dplan.fill))
    size = dplan.n_groups * (1 + dplan.d_aug * (dplan.d_aug + 1) // 2)
    total = engine.aggregate(source, _gram_fn(dplan, fill_values), size)  # pass 1: the Gram matrices
    sizes, grams = gram_from_partial(total, dplan.d_aug, dplan.n_groups)
    if sizes.sum() == 0:
        raise InputError(_EMPTY)
    if dplan.label_mode == "public":
        if np.count_nonzero(sizes) < 2:
            raise InputError(
                f"The label column {st.label!r} has one class only in the data: there is nothing to "
                "separate; release without a label column."
            )
        public["class_sizes"] = {str(_jsonable(c)): int(s) for c, s in zip(dplan.classes, sizes)}
        public["class_sizes_note"] = ("labels are declared public: every row's label is released as it "
                                      "is, the classes are released by separate runs (parallel "
                                      "composition), and these class sizes are released")
    gnoise = dplan.gram_noise(int(sizes.max()))
    check_noise_multiplier(gnoise, dplan.mu["gram"])
    check_noise_multiplier(dplan.projection_noise, dplan.mu["projection"])
    public["gram_noise"] = gnoise.to_public_dict()
    Cs = noisy_grams(grams, None if st.noise_free else gnoise, stream(seed, GRAM_NOISE_STAGE))
    Ms = solve(Cs, R, dplan.k2, caller=progress.caller)
    public["uncertainty"] = uncertainty_public(dplan, Ms, source.facts.columns, fill_std=fill_std)
    progress.log("dprp: Gram solved (d = %d, k1 = %d, k2 = %d, %d run(s)); rows pass", d, dplan.k1, dplan.k2,
                 dplan.n_groups)
    counters = engine.counters(("rows", "rows_box_clipped", "rows_norm_clipped"))
    row_noise = None if st.noise_free else dplan.projection_noise
    columns = [(c, "as-input", True) for c in source.facts.columns]
    if st.label is not None:
        columns.append((st.label, "label", True))
    table, rows = engine.map_rows(source, _rows_fn(dplan, R, Ms, row_noise, seed, fill_values, counters,
                                                   st.label is not None),
                                  columns, keep=st.keep)

    def diagnostics() -> dict:
        if counters is None:
            return {}
        return {"rows": counters[0].value, "rows_box_clipped": counters[1].value,
                "rows_norm_clipped": counters[2].value}

    return _p.Outcome(table=table, rows=rows, public=public, extras={"diagnostics": diagnostics})


def _run_records(engine, source, st: _DPRPState, secrets, progress) -> _p.Outcome:
    from sparkpriv.errors import InputError

    dplan = st.plan
    R, seed = secrets
    d = dplan.d
    total = engine.aggregate(source, _records_gram_fn(st.cap, d), 1 + d * (d + 1) // 2, count=True)
    sizes, grams = gram_from_partial(total, d, 1)
    if sizes.sum() == 0:
        raise InputError(_EMPTY)
    gnoise = dplan.gram_noise(int(sizes.max()))
    check_noise_multiplier(gnoise, dplan.mu["gram"])
    check_noise_multiplier(dplan.projection_noise, dplan.mu["projection"])
    Cs = noisy_grams(grams, None if st.noise_free else gnoise, stream(seed, GRAM_NOISE_STAGE))
    (M,) = solve(Cs, R, dplan.k2, caller=progress.caller)
    progress.log("dprp of event records: Gram of %d people, d = %d, k1 = %d, k2 = %d",
                 int(sizes[0]), d, dplan.k1, dplan.k2)
    row_noise = None if st.noise_free else dplan.projection_noise
    table, rows = engine.map_rows(source, _records_rows_fn(R, M, row_noise, seed, st.cap, d, st.threshold),
                                  [("items", "array<int>", False)], count=False)
    unc = uncertainty_public(dplan, [M], (), kind="records")
    return _p.Outcome(table=table, rows=rows, public={"gram_noise": gnoise.to_public_dict(), "uncertainty": unc})


# per-block functions: built from plain values (numpy arrays, numbers), pickled into Spark's tasks


def _parts(block):
    """``(X, codes, missing)`` of a dense block (a matrix, or TableRows)."""
    if isinstance(block, _p.TableRows):
        return block.X, block.codes, block.missing
    return block, None, None


def _impute_fn(dplan: DPRPPlan):
    """Block -> per-column sums and counts of non-missing values, and the rows (DP means pass)."""

    def means(block):
        X, _, missing = _parts(block)
        if missing is None:
            missing = np.zeros(X.shape, dtype=bool)
        return impute_partial(X, missing, dplan)

    return means


def _gram_fn(dplan: DPRPPlan, fill_values):
    """Block -> per group ``[count, upper triangle of Xp^T Xp]`` of the prepared rows."""
    fill_values = None if fill_values is None else np.array(fill_values, dtype=np.float64)
    public = dplan.label_mode == "public"
    size = dplan.n_groups * (1 + dplan.d_aug * (dplan.d_aug + 1) // 2)

    def gram(block):
        X, codes, missing = _parts(block)
        if X.shape[0] == 0:
            return np.zeros(size)
        fill_missing(X, missing, fill_values)
        Xp, _ = prepare_rows(X, dplan, codes)
        return gram_partial(Xp, codes if public else None, dplan.n_groups)

    return gram


def _rows_fn(dplan: DPRPPlan, R, Ms, noise, seed, fill_values, counters, with_label: bool):
    """The row map: ``P' = Xp R + keyed noise``, ``X' = P' M_g``, decoded (``noise=None``: without noise).

    One noise stream per partition, ``stream(seed, ROW_NOISE_STAGE, pid)``, drawn block after block in
    order, so a retried task reproduces the same noise.
    """
    R = np.ascontiguousarray(R)
    Ms = [np.ascontiguousarray(M) for M in Ms]
    fill_values = None if fill_values is None else np.array(fill_values, dtype=np.float64)
    public = dplan.label_mode == "public"

    def rows(pid, blocks):
        rng = stream(seed, ROW_NOISE_STAGE, pid)
        tot = ClipCounts()
        for block in blocks:
            X, codes, missing = _parts(block)
            fill_missing(X, missing, fill_values)
            Xp, counts = prepare_rows(X, dplan, codes)
            tot = tot + counts
            Xr = reconstruct_rows(Xp, R, Ms, codes if public else None, noise, rng)
            Xo, out_codes = decode_rows(Xr, dplan)
            cols = list(np.ascontiguousarray(Xo.T))
            if with_label:
                cols.append(codes if public else out_codes)
            yield cols
        if counters is not None:
            counters[0].add(tot.rows)
            counters[1].add(tot.box_clipped)
            counters[2].add(tot.norm_clipped)

    return rows


def _records_gram_fn(cap, d: int):
    """Sparse block -> ``[n, upper triangle of (X / c)^T (X / c)]`` (the records' Gram partial)."""
    from sparkpriv.mechanisms.dprp_records import gram_partial_sparse
    from sparkpriv.mechanisms.sparse import clip_sparse_rows

    c = cap.value_cap
    size = 1 + d * (d + 1) // 2

    def gram(block):
        if block.n == 0:
            return np.zeros(size)
        vals, _ = clip_sparse_rows(block.offsets, block.indices, block.values, cap, d)  # a no-op on capped records
        return gram_partial_sparse(block.offsets, block.indices, vals, d, c)

    return gram


def _records_rows_fn(R, M, noise, seed, cap, d: int, threshold: float):
    """The row map of event records: thresholded reconstruction as ``items array<int>``."""
    import pyarrow as pa

    from sparkpriv.mechanisms.dprp_records import reconstruct_sparse_items
    from sparkpriv.mechanisms.sparse import clip_sparse_rows

    R = np.ascontiguousarray(R)
    M = np.ascontiguousarray(M)
    c = cap.value_cap

    def rows(pid, blocks):
        rng = stream(seed, ROW_NOISE_STAGE, pid)
        for block in blocks:
            vals, _ = clip_sparse_rows(block.offsets, block.indices, block.values, cap, d)
            o, items = reconstruct_sparse_items(block.offsets, block.indices, vals, R, M, noise, rng,
                                                value_cap=c, threshold=threshold)
            yield [pa.ListArray.from_arrays(pa.array(o.astype(np.int32)), pa.array(items, pa.int32()))]

    return rows


DPRP_MECHANISM = _p.register(DPRP())
