"""DP k-means' parameters and the mechanism of the release protocol (:class:`KMeans`), on any engine."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkpriv._validation import Interval, Options
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.privacy.bounds import Bounds
from sparkpriv.privacy.random import new_secret_seed, stream
from sparkpriv.mechanisms.kmeans._features import (DEFAULT_RELIABILITY_STDS, FeatureMap, VARIANTS, _POS,
                                                   _kernel_width_required, make_feature_map)
from sparkpriv.mechanisms.kmeans._plan import KMeansPlan, plan_kmeans
from sparkpriv.mechanisms.kmeans._lloyd import (_tuple, assign_nearest, check_k_for_n, cluster_input_sums_sparse,
                                                cluster_stats, fit_from_stats, initial_centres)


@dataclass(frozen=True, kw_only=True)
class KMeansParams(_p.Params):
    """Public parameters of DP k-means (docs/kmeans.md; docs/math.md section 4)."""

    epsilon: float = _p.option(help="the total epsilon of the release", constraints=[_POS])
    delta: float = _p.option(help="the total delta of the release, in (0, 1) (Gaussian noise)",
                             constraints=[Interval("real", 0, 1, "neither")])
    k: int = _p.option(help="number of clusters (2 .. floor(sqrt(rows)))",
                       constraints=[Interval("integer", 2, None, "left")])
    columns: tuple = _p.option(None, help="numeric feature columns (one row per person); not with "
                               "event records", kind="strs")
    iterations: int = _p.option(10, help="Lloyd iterations", constraints=[Interval("integer", 1, 10_000, "both")])
    variant: str = _p.option("kernel", help="kernel (RBF random Fourier features) or linear (DPLloyd)",
                             constraints=[Options(VARIANTS)])
    row_bound: float | None = _p.option(None, help="declared bound on each row's L2 norm (rows are "
                                        "clipped to it)", constraints=[_POS])
    lower: tuple | None = _p.option(None, help="declared per-column lower bounds (one value for all "
                                    "columns, or one per column)", kind="floats")
    upper: tuple | None = _p.option(None, help="declared per-column upper bounds (one value for all "
                                    "columns, or one per column)", kind="floats")
    kernel_width: float | None = _p.option(None, help="RBF kernel width s, exp(-||x-y||^2/(2 s^2)) "
                                           "(kernel variant)", constraints=[_POS])
    frequencies: int = _p.option(128, help="random Fourier frequencies D (2D features; kernel variant)",
                                 constraints=[Interval("integer", 1, 100_000, "both")])
    final_share: float | None = _p.option(None, help="kernel: share of the budget (mu^2) for the "
                                          "input-space centres", doc_default="0.1",
                                          constraints=[Interval("real", 0, 1, "neither")])
    fill: float | None = _p.option(None, help="public value that replaces nulls in the feature columns",
                                   constraints=[Interval("real", None, None, "neither")])
    reliability_stds: float = _p.option(DEFAULT_RELIABILITY_STDS, help="clusters whose noisy size is "
                                        "below this many noise standard deviations are marked unreliable",
                                        constraints=[Interval("real", 0, 1e6, "both")])
    neighbors: str = _p.option("replace-one", help="neighbour relation: replace-one (n is public: the "
                               "rule k <= floor(sqrt(n)) uses it)", kind="neighbors")
    init: object = _p.option(None, help="a PUBLIC sample of k initial centres, array (k, d) (default: "
                             "uniform points of the declared domain)", kind="object")
    feature_seed: int | None = _p.option(None, help="seed of the public frequencies W (default: fresh "
                                         "entropy); not recorded", kind="object", recorded=False)

    def check(self, caller: str) -> None:
        if self.variant == "linear" and self.final_share not in (None, 0, 0.0):
            raise ParameterError(
                f"The 'final_share' parameter of {caller} must be None for variant='linear': its "
                "features are the inputs, so the last iteration's centres are the release. "
                f"Got {self.final_share!r} instead."
            )
        if self.variant == "kernel" and self.kernel_width is None:  # a public rule: before Spark starts
            raise _kernel_width_required(caller)


@dataclass
class _KMeansState:
    fmap: FeatureMap
    kplan: KMeansPlan
    centres0: np.ndarray


def _per_column(values, d: int, name: str, caller: str):
    if values is None:
        return None
    values = _tuple(values)
    if len(values) == 1:
        return values * d
    if len(values) != d:
        raise ParameterError(f"The {name!r} parameter of {caller} must have one value, or one per "
                             f"column ({d}). Got {len(values)}.")
    return values


class KMeans(_p.Mechanism):
    """DP k-means (kernel or linear) with noisy per-cluster sums; releases the clusters."""

    name = "kmeans"
    title = "DP k-means"
    summary = "DP k-means (kernel: random Fourier features; linear: DPLloyd); releases noisy centres"
    Params = KMeansParams
    neighbors = (_p.REPLACE_ONE,)
    refused_neighbors = {
        "add-remove": "its public parameters include n (k <= floor(sqrt(n)) and the noise grid's cap)",
        "element": "it protects whole records (people), not single attributes",
    }
    inputs = ("table", "records")

    def plan(self, params: KMeansParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        if facts.kind == "records":
            given = [n for n in ("columns", "lower", "upper", "row_bound", "fill")
                     if getattr(params, n) is not None]
            if given:
                raise ParameterError(
                    f"The {', '.join(repr(g) for g in given)} parameter(s) of {caller} do not apply to "
                    "bounded event records: the items are the vocabulary and the bounds come from "
                    "the item cap (max_items, weights). Remove them."
                )
            if params.variant != "kernel":
                raise ParameterError(
                    f"The 'variant' parameter of {caller} must be 'kernel' for bounded event records. "
                    f"Got {params.variant!r}: the linear variant's features are the d = {facts.d}-wide "
                    "records themselves, which the iterations would cache densely (d floats per "
                    "person); the kernel variant's features are computed from the sparse records."
                )
            c = facts.value_cap
            bounds = Bounds(facts.d, (0.0,) * facts.d, (c,) * facts.d, facts.l2_bound, "l2", None,
                            _caller=caller)
        else:
            d = facts.d
            bounds = Bounds(d, _per_column(params.lower, d, "lower", caller),
                            _per_column(params.upper, d, "upper", caller), params.row_bound, "l2", None,
                            _caller=caller)
        fmap = make_feature_map(params.variant, bounds, kernel_width=params.kernel_width,
                                frequencies=params.frequencies, seed=params.feature_seed, caller=caller)
        kplan = plan_kmeans(fmap, k=params.k, epsilon=params.epsilon, delta=params.delta,
                            iterations=params.iterations, final_share=params.final_share, caller=caller)
        centres0 = initial_centres(fmap, params.k, stream(new_secret_seed("kmeans-init"), 0), params.init,
                                   caller)
        event = kplan.dp_event()
        public = dict(kplan.to_public_dict(), bounds=bounds.to_public_dict(),
                      init="public sample" if params.init is not None else "domain",
                      reliability_stds=float(params.reliability_stds),
                      feature_map="W is public: drawn independently of the data and released")
        return _p.Plan(events=event, epsilon=kplan.epsilon_spent(), delta=kplan.delta, public=public,
                       neighbors=_p.REPLACE_ONE, state=_KMeansState(fmap, kplan, centres0),
                       secrets=new_secret_seed("kmeans-noise"))

    def run(self, engine, source, plan: _p.Plan, progress) -> _p.Outcome:
        import time

        from sparkpriv.errors import InputError
        from sparkpriv.mechanisms.kmeans_model import MODEL_FILE, POSTPROCESSING

        st: _KMeansState = plan.state
        fmap, kplan = st.fmap, st.kplan
        k, dim, d = kplan.k, kplan.dim, fmap.d
        counters = engine.counters(("rows", "rows_box_clipped", "rows_norm_clipped")) \
            if source.kind == "table" else None
        cache = engine.cache(source, _features_fn(fmap, counters), dim)
        try:
            n = cache.rows
            if n == 0:
                raise InputError("The input table is empty: there is nothing to release.")
            check_k_for_n(k, n, progress.caller)
            progress.log("kmeans: %s variant, k=%d, %d feature dims, %d iterations; features cached",
                         kplan.variant, k, dim, kplan.iterations)
            seconds: list[float] = []
            clock = [time.perf_counter()]

            def log(t, counts):
                now = time.perf_counter()
                seconds.append(now - clock[0])
                clock[0] = now
                spent = kplan.epsilon_after(t)  # after the clock: not part of the iteration's time
                progress.step("kmeans iteration", t, kplan.iterations,
                              f"{seconds[-1]:.2f} s, {int(np.sum(counts < 1))} cluster(s) with noisy count < 1, "
                              f"epsilon spent so far {spent:.4g} of {plan.epsilon:.4g}")
                clock[0] = time.perf_counter()

            model, history = fit_from_stats(
                kplan, fmap, st.centres0,
                lambda c: cache.aggregate(_stats_fn(c), k * (dim + 1)),
                lambda c: engine.aggregate(source, _input_stats_fn(fmap, c), k * (d + 1)),
                plan.secrets, log, reliability_stds=plan.public["reliability_stds"])
        finally:
            cache.release()
        if model.unreliable:
            progress.warn("kmeans: %d of %d cluster(s) unreliable (noisy size below %g noise stds): %s; "
                          "predict/assign leave them out", len(model.unreliable), k,
                          plan.public["reliability_stds"], list(model.unreliable))
        fc = model.feature_centers
        ok = model.reliable
        rows = [(j, float(model.counts[j]), bool(ok[j]), [float(v) for v in model.centers[j]],
                 None if fc is None else [float(v) for v in fc[j]]) for j in range(model.k)]
        table = engine.table(rows, [("cluster", "int", False), ("count", "double", False),
                                    ("reliable", "bool", False), ("center", "array<double>", False),
                                    ("feature_center", "array<double>", True)])
        diagnostics = {}
        if counters is not None:
            diagnostics = {"rows": counters[0].value, "rows_box_clipped": counters[1].value,
                           "rows_norm_clipped": counters[2].value}
        unc = model.uncertainty()
        uncertainty = {
            "count_std": unc["count_std"], "sum_std": float(model.sum_std),
            "center_std": unc["center_std"].tolist(),
            "intervals": "95%: value +- 1.96 std. Sizes: exact (Gaussian noise). Centre coordinates: "
                         "first order in the size noise, before the projection onto the domain; "
                         "meaningful for reliable clusters only",
        }
        return _p.Outcome(table=table, model=model,
                          public={"model": model.to_dict(), "unreliable_clusters": list(model.unreliable),
                                  "postprocessing": POSTPROCESSING, "uncertainty": uncertainty},
                          files={MODEL_FILE: model.to_json().encode()},
                          extras={"iteration_seconds": seconds, "history": history,
                                  "diagnostics": diagnostics})


def _features_fn(fmap: FeatureMap, counters):
    """Block -> feature matrix (dense rows are clipped, and counted for the owner)."""

    def features(block):
        if isinstance(block, _p.SparseRows):
            return fmap.features_sparse(block.offsets, block.indices, block.values)
        Z, _, counts = fmap.features(block)
        if counters is not None:
            counters[0].add(counts.rows)
            counters[1].add(counts.box_clipped)
            counters[2].add(counts.norm_clipped)
        return Z

    return features


def _stats_fn(centres):
    """Feature block -> per-cluster counts and sums (one Lloyd iteration's partial)."""
    centres = np.array(centres, dtype=np.float64, copy=True)

    def stats(Z):
        return cluster_stats(Z, centres)

    return stats


def _input_stats_fn(fmap: FeatureMap, centres):
    """Block -> counts and sums of the clipped INPUTS by nearest feature centre (final step)."""
    centres = np.array(centres, dtype=np.float64, copy=True)
    k = centres.shape[0]

    def stats(block):
        if isinstance(block, _p.SparseRows):
            lab = assign_nearest(fmap.features_sparse(block.offsets, block.indices, block.values), centres)
            return cluster_input_sums_sparse(lab, block.offsets, block.indices, block.values, k, block.d)
        Z, Xc, _ = fmap.features(block)
        return cluster_stats(Z, centres, Xc)

    return stats


KMEANS = _p.register(KMeans())
