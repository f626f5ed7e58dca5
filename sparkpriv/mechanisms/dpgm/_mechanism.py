"""The DPGM as a mechanism of the release protocol (sparkpriv.mechanisms.protocol): plan, the
k-means and the lengths on the engine, one training task per cluster (docs/research/dpgm.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import dpsgd
from sparkpriv.mechanisms import protocol as _proto
from sparkpriv.mechanisms.column_types import synthetic_type
from sparkpriv.mechanisms.event_columns import EventColumns
from sparkpriv.mechanisms.kmeans import fit_from_stats, initial_centres, make_feature_map, KMeansPlan
from sparkpriv.privacy.accounting import RunningEpsilon, compose, epsilon_of
from sparkpriv.privacy.random import new_secret_seed, stream
from sparkpriv.mechanisms.dpgm._params import DPGMParams, FORMAT_VERSION, MODEL_FILE, length_strata
from sparkpriv.mechanisms.dpgm._lengths import (LengthPlan, chain_lengths, cluster_size_std, cluster_sizes,
                                                reliable_clusters, last_round_centres,
                                                length_plan)
from sparkpriv.mechanisms.dpgm._plan import (DPGMPlan, _Relations, _bounds, _make_model, accounting_note,
                                             calibrate_dpgm, plan_for_rows, requested_event)
from sparkpriv.mechanisms.dpgm._released import uncertainty_public
from sparkpriv.mechanisms.dpgm._marginals import column_sums, marginal_plan
from sparkpriv.mechanisms.dpgm._train import (_model, assign_clusters, calibrate_marginals, marginal_sums,
                                              model_public, train_clusters, training_order, visible_masses)


# ----------------------------------------------------------------------------- the mechanism (protocol)


@dataclass
class _DPGMState:
    params: DPGMParams
    d: int
    kplan: KMeansPlan
    sigma: float
    column_types: tuple = ()
    events: "EventColumns | None" = None  # event records: the public EventColumns (the synthetic event tables)


def dense_rows(block) -> np.ndarray:
    """A block as a dense float64 matrix: a table block as it is, bounded event records
    (:class:`~sparkpriv.mechanisms.protocol.SparseRows`, binary) as their 0/1 rows over the
    vocabulary (a person's DPGM record)."""
    if isinstance(block, _proto.SparseRows):
        off = np.asarray(block.offsets, np.int64)
        n = off.shape[0] - 1
        X = np.zeros((n, int(block.d)), dtype=np.float64)
        rows = np.repeat(np.arange(n), np.diff(off))
        vals = 1.0 if block.values is None else np.asarray(block.values, np.float64)
        X[rows, np.asarray(block.indices, np.int64)] = vals
        return X
    return np.asarray(block, dtype=np.float64)


def _dense_features_fn(fmap, counters):
    """Block -> the linear k-means features (the clipped rows) of a table block."""
    from sparkpriv.mechanisms.kmeans import _features_fn

    inner = _features_fn(fmap, counters)

    def features(block):
        return inner(dense_rows(block))

    return features


def _records_fn(counters):
    """Bounded event records -> themselves (sparse; the engine caches them as they are). They
    already satisfy the k-means bounds: binary, at most ``L`` items, so inside the box and the row
    bound ``sqrt(L)`` (nothing is clipped); the rows are counted for the owner."""

    def records(block):
        if counters is not None:
            counters[0].add(int(block.n))
        return block

    return records


def assign_sparse(block, centers: np.ndarray) -> np.ndarray:
    """The nearest centre of each sparse record (:class:`~sparkpriv.mechanisms.protocol.SparseRows`
    within the box and the row bound, as bounded records are): ``argmin_j ||c_j||^2 - 2 x . c_j``,
    the dense :func:`~sparkpriv.mechanisms.kmeans.assign_nearest` without densifying (``x . c_j``
    is the sum of ``c_j`` at the record's items); internal, never released."""
    from sparkpriv.mechanisms.sparse import project_sparse_rows

    if block.n == 0:
        return np.zeros(0, dtype=np.int64)
    centers = np.asarray(centers, dtype=np.float64)
    cn = np.einsum("ij,ij->i", centers, centers)
    scores = project_sparse_rows(block.offsets, block.indices, block.values, np.ascontiguousarray(centers.T))
    return np.argmin(cn[None, :] - 2.0 * scores, axis=1)


def _records_stats_fn(centers: np.ndarray):
    """Sparse records -> one Lloyd iteration's counts and sums, in
    :func:`~sparkpriv.mechanisms.kmeans.cluster_stats`'s layout (the linear features are the rows)."""
    from sparkpriv.mechanisms.kmeans import cluster_input_sums_sparse

    centers = np.array(centers, dtype=np.float64, copy=True)
    k = centers.shape[0]

    def stats(block):
        return cluster_input_sums_sparse(assign_sparse(block, centers), block.offsets, block.indices,
                                         block.values, k, block.d)

    return stats


def _group_fn(centers: np.ndarray, row_bound: float):
    """Block -> (each row's nearest of ``centers``, the last round's: :func:`last_round_centres`;
    the rows clipped to the box [0, 1]); internal.
    Bounded event records stay sparse (the engine ships them so, and a cluster trains on a CSR
    matrix whose sampled batches alone are made dense)."""
    centers = np.array(centers, dtype=np.float64, copy=True)

    def group(block):
        if isinstance(block, _proto.SparseRows):
            return assign_sparse(block, centers), block
        X = np.clip(dense_rows(block), 0.0, 1.0)
        return assign_clusters(X, centers, row_bound), X

    return group


def _lengths_fn(centers: np.ndarray, row_bound: float, lplan: LengthPlan):
    """Block -> the ``k B`` exact length histograms of its rows by nearest of ``centers`` (the
    rows and assignment training uses: :func:`_group_fn`), summed over blocks and noised once on
    the driver."""
    group_fn, k, bins = _group_fn(centers, row_bound), int(np.asarray(centers).shape[0]), lplan.bins

    def hist(block):
        from sparkpriv.mechanisms.sparse import _csr

        g, X = group_fn(block)
        if isinstance(X, _proto.SparseRows):  # the same rows as scipy CSR: LengthPlan.histogram's sums
            X = _csr(X.offsets, X.indices, X.values, X.d)
        return np.bincount(np.asarray(g, dtype=np.int64) * bins + lplan.bins_of(X.sum(axis=1)),
                           minlength=k * bins).astype(np.float64)

    return hist


def _train_fn(plan: DPGMPlan, sizes: np.ndarray, centers: np.ndarray, seed: int, masses=None, chains=None,
              lengths=None, marginals: bool = False):
    """(j, rows of cluster j in any order[, report]) -> cluster j's DP-SGD parameters (its own
    streams; a table's rows train in their canonical order, :func:`canonical_order`);
    ``report(t, steps)`` after each step, where the engine trains in-process.
    ``masses``, ``chains``: the rbm's starting masses and chain lengths (:func:`train_clusters`).
    ``marginals`` (the plan's per-item counts released): the task then samples its cluster's
    share of the records that measure the mixture's marginals from its trained model
    (:func:`marginal_sums`, with the released length histograms ``lengths``) and appends their
    ``d`` column sums and ``d`` sums of squares."""
    sizes = np.array(sizes, dtype=np.float64, copy=True)
    lengths = None if lengths is None else np.array(lengths, dtype=np.float64, copy=True)
    samples = plan.marginals.cluster_samples(sizes) if marginals else None
    centers = np.array(centers, dtype=np.float64, copy=True)
    masses = None if masses is None else np.array(masses, dtype=np.float64, copy=True)
    chains = None if chains is None else np.array(chains, dtype=np.int64, copy=True)

    def train(j, Xj, report=None):
        labels = np.full(Xj.shape[0], int(j))
        on_step = None if report is None else (lambda _j, t, steps: report(t, steps))
        clips: dict = {}
        theta = train_clusters(Xj, labels, sizes, centers, plan, seed, clusters=[int(j)], on_step=on_step,
                               clips=clips, masses=masses, chain_lengths=chains)[int(j)]
        # quantile clipping: the final clip (post-processing of released counts) rides after theta;
        # then the sums of the records that measure the marginals
        parts = [theta] + ([[clips[int(j)]]] if plan.quantile else [])
        if samples is not None:
            parts.append(marginal_sums(plan, theta, int(j), int(samples[int(j)]), seed, lengths))
        return np.concatenate(parts) if len(parts) > 1 else theta

    return train


TRAINING_CHUNKS = 10  # in-process training reports each cluster's DP-SGD in at most this many steps


def _training_progress(progress, dplan: DPGMPlan, reserved: float):
    """``on_train(j, t, steps)`` for an engine that trains in-process: a step of ``progress`` at
    each chunk boundary of cluster ``j``'s DP-SGD (``TRAINING_CHUNKS`` per cluster, ``k`` clusters,
    in order), with the privacy spent so far.

    The whole release's epsilon is reserved before any data is read. Training composes: while the
    first cluster trains, the spend so far is at most ``epsilon(k-means + lengths + item counts + t
    steps)`` (the events released before training: :meth:`DPGMPlan.base_events`); every cluster
    runs the same ``(q, sigma, T)`` on disjoint rows (parallel composition), so once one cluster has
    made its ``T`` steps the whole reserved epsilon counts as spent (docs/research/dpgm.md "Progress").
    """
    k, steps = dplan.params.k, dplan.steps
    base = list(dplan.base_events())  # released before training: the k-means, lengths, item counts
    chunks = min(steps, TRAINING_CHUNKS)
    reported: dict = {}  # cluster -> chunks reported (a cluster with m_j > 1 may pass several at once)
    first: list = [None]  # the first cluster trained: the one whose steps add to the spend
    done = [0]  # steps reported so far
    # the spend after t steps, composed step chunk by chunk (t rises); an upper bound each time
    running = [None, 0]  # RunningEpsilon, steps composed into it

    def spent(t: int) -> float:
        if t >= steps:
            return reserved
        try:
            if running[0] is None:
                final = compose(base + [dplan.training_event()])
                acc = RunningEpsilon(final, dplan.params.delta)
                for e in base:
                    acc.add(e)
                running[0] = acc  # only once every base event is in it (a leaf it cannot build raises)
            if t > running[1]:
                running[0].add(dplan.training_event(t - running[1]))
                running[1] = t
            eps = running[0].epsilon()
        except ValueError:  # a leaf RunningEpsilon does not build: the accountant, from the start
            eps = epsilon_of(compose(base + [dplan.training_event(t)]), dplan.params.delta)
        return min(eps, reserved)

    def on_train(j: int, t: int, total: int) -> None:
        # chunk c ends at base step ceil(c steps / chunks): those <= t are the first floor(t chunks / steps)
        c = min(int(t) * chunks // steps, chunks)
        if c <= reported.get(j, 0):
            return
        done[0] += c - reported.get(j, 0)
        reported[j] = c
        if first[0] is None:
            first[0] = j
        so_far = spent(t) if j == first[0] else reserved
        progress.step("dpgm training", done[0], k * chunks,
                      f"cluster {j + 1}/{k}, DP-SGD step {t}/{total}; epsilon spent so far at most "
                      f"{so_far:.4g} of the reserved {reserved:.4g}")

    return on_train


def _column_types(facts: _proto.InputFacts) -> tuple:
    """The synthetic type of each declared column, from the input's schema (public)."""
    types = tuple(getattr(facts, "types", ()) or ())
    return tuple(synthetic_type(t) for t in types) if len(types) == facts.d else ()


class DPGM(_proto.Mechanism):
    """DP mixture of generative models: DP k-means (linear), then DP-SGD per cluster (docs/research/dpgm.md)."""

    name = "dpgm"
    title = "DPGM"
    summary = ("DP mixture of generative models: DP k-means, then one RBM or VAE per cluster trained with "
               "DP-SGD; releases the model file")
    Params = DPGMParams
    neighbors = (_proto.REPLACE_ONE,)
    refused_neighbors = dict(_Relations.refused_neighbors,
                             element="it protects whole records (people), not single attributes")
    row_level = False
    inputs = ("table", "records")

    def plan(self, params: DPGMParams, facts: _proto.InputFacts, caller: str) -> _proto.Plan:
        d = facts.d
        if facts.kind == "records":
            given = [n for n in ("columns", "row_bound", "fill") if getattr(params, n, None) is not None]
            if given:
                raise ParameterError(
                    f"The {', '.join(repr(g) for g in given)} parameter(s) of {caller} do not apply to "
                    "bounded event records: the items are the vocabulary (one 0/1 column per item) and the "
                    "row bound is sqrt(max_items) from the item cap. Remove them.")
            if float(facts.value_cap) != 1.0:
                raise ParameterError(
                    f"{caller} models binary event records (the set of items of a person): bound the "
                    "events with weights='binary' (no max_events_per_item).")
            params = dataclasses.replace(params, row_bound=float(facts.l2_bound))
        kplan, sigma = calibrate_dpgm(params, d, caller)
        event = requested_event(params, kplan, sigma, d)
        eps = epsilon_of(event, params.delta)
        if eps > params.epsilon:  # the calibration checks its own accountant; PLD is the recorded one
            raise ParameterError(
                f"{caller}: the release's epsilon by the library's accountant is {eps:.6g}, above the "
                f"request epsilon={params.epsilon!r} (accountant={params.accountant!r}); use accountant='pld'.")
        bounds = _bounds(params, d, caller)
        public = {
            "bounds": bounds.to_public_dict(), "kmeans": kplan.to_public_dict(), "steps": params.steps,
            "noise_multiplier": sigma, "sampling_rate": params.sampling_rate,
            "uncertainty": uncertainty_public(kplan),
            "accounting": accounting_note(params) + ": at the calibrated sigma, fixed before the data is read "
                          "(the step noise's grid comes from the public n; its multiplier is at least sigma/2) "
                          "(docs/math.md section 5)",
        }
        lplan = length_plan(params, d, caller)
        if lplan is not None:
            public["lengths"] = lplan.to_public_dict()
        mplan = marginal_plan(params, d, caller)
        if mplan is not None:
            public["item_counts"] = mplan.to_public_dict()
        if params.clip_quantile is not None:
            cstd = dpsgd.count_noise_std(sigma, params.clip_count_share)
            public["accounting"] = accounting_note(params) + ": at the calibrated sigma and sigma_b, fixed " \
                "before the data is read (the realized noises' multipliers are at least those)"
            public["quantile_clipping"] = {"count_noise_std": cstd, "step_multiplier":
                                           dpsgd.quantile_step_multiplier(sigma, cstd)}
        # the defaults that depend on the model, as used (a receipt states the shares spent, not None)
        resolved = {"length_share": params.lengths_share if params.model == "rbm" else 0.0,
                    "marginal_share": params.marginals_share if params.model == "rbm" else 0.0,
                    "length_strata": list(length_strata(params, d, caller)), "average_tail": params.tail,
                    "row_bound": bounds.row_bound}
        return _proto.Plan(events=event, epsilon=eps, delta=float(params.delta), public=public,
                           neighbors=_proto.REPLACE_ONE, parameters=resolved,
                           state=_DPGMState(params, d, kplan, sigma, _column_types(facts),
                                            getattr(facts, "events", None) if facts.kind == "records" else None),
                           secrets=new_secret_seed("dpgm"))

    def run(self, engine, source, plan: _proto.Plan, progress) -> _proto.Outcome:
        from sparkpriv.errors import InputError
        from sparkpriv.mechanisms.kmeans import _stats_fn

        st: _DPGMState = plan.state
        params, d, kplan, seed = st.params, st.d, st.kplan, plan.secrets
        bounds = _bounds(params, d, progress.caller)
        fmap = make_feature_map("linear", bounds, caller=progress.caller)
        k, dim = params.k, fmap.dim
        counters = engine.counters(("rows", "rows_box_clipped", "rows_norm_clipped"))
        records = source.kind == "records"  # kept sparse: d floats per person would not fit at scale
        if records:
            cache = engine.cache(source, _records_fn(counters), dim, sparse=True)
            stats_fn = _records_stats_fn
        else:
            cache = engine.cache(source, _dense_features_fn(fmap, counters), dim)
            stats_fn = _stats_fn
        try:
            n = cache.rows
            if n == 0:
                raise InputError("The input table is empty: there is nothing to release.")
            dplan = plan_for_rows(params, kplan, st.sigma, n=n, d=d, caller=progress.caller, requested=True,
                                  accounted=plan.epsilon)
            if dplan.dp_event() != plan.events:  # the model file states the recorded event's epsilon
                raise RuntimeError("dpgm: the run's event differs from the recorded one")
            progress.log("dpgm: k-means (linear), k=%d, %d iterations; features cached", k, kplan.iterations)
            centres0 = initial_centres(fmap, k, stream(seed, 1), None, progress.caller)

            def log(t, counts):
                progress.step("kmeans iteration", t, kplan.iterations)

            iteration_stats, seen = last_round_centres(lambda c: cache.aggregate(stats_fn(c), k * (dim + 1)))
            kmodel, history = fit_from_stats(kplan, fmap, centres0, iteration_stats, None, seed, log)
            centers = np.asarray(kmodel.centers, float)
            train_centres = seen["centres"]  # the last round's: internal, never released
            lengths = None
            if dplan.lengths is not None:  # the exact (k, B) histograms in one pass, noised here once
                lp, size = dplan.lengths, k * dplan.lengths.bins
                progress.log("dpgm: histograms of record lengths, %d clusters x %d bins (one pass)", k, lp.bins)
                lfn = _lengths_fn(train_centres, bounds.row_bound, lp)
                # event records: the cached records are the training rows; a table's cache holds its
                # features (rows also scaled onto the row-bound ball), so its histograms read the source
                exact = cache.aggregate(lfn, size) if records else engine.aggregate(source, lfn, size)
                lengths = lp.release(np.asarray(exact, dtype=np.float64).reshape(k, lp.bins), seed)
            item_counts = None
            if dplan.marginals is not None:  # the exact per-item counts of the cached (bounded) rows, noised
                # here once (a table's cache holds its rows clipped to the box and the row bound)
                progress.log("dpgm: per-item counts, %d columns (one pass)", d)
                item_counts = dplan.marginals.release(cache.aggregate(column_sums, dim), seed)
            sizes = cluster_sizes(kmodel.counts, lengths, kmodel.count_std,
                                  dplan.lengths.noise.std if dplan.lengths else 0.0)
            masses = visible_masses(dplan, lengths)
            chains = chain_lengths(dplan, lengths, seed)
        finally:
            cache.release()
        progress.log("dpgm: training %d %s model(s), %d DP-SGD steps each", k, params.model, dplan.steps)
        gen_dim = _make_model(params, d).dim
        marg = dplan.marginals is not None
        thetas = engine.train_groups(source, _group_fn(train_centres, bounds.row_bound),
                                     _train_fn(dplan, sizes, centers, seed, masses, chains, lengths, marg), k,
                                     gen_dim + int(dplan.quantile) + (2 * d if marg else 0), d,
                                     on_train=_training_progress(progress, dplan, plan.epsilon),
                                     what="dpgm training", order=training_order(sizes))
        thetas = np.asarray(thetas, float)
        # quantile clipping: each cluster's final clip rides after its theta
        public_record = model_public(dplan, sizes, thetas[:, gen_dim] if dplan.quantile else None, masses, kmodel)
        size_std = cluster_size_std(kmodel.count_std, dplan.lengths.bins if dplan.lengths else 0,
                                    dplan.lengths.noise.std if dplan.lengths else 0.0)
        reliable = reliable_clusters(sizes, size_std, n, params.reliability_stds, params.min_cluster_share)
        public_record["clusters"] = reliability_public(reliable, size_std, params)
        if not reliable.all():
            progress.warn("dpgm: %d of %d cluster(s) unreliable (noisy size below %g noise stds or %g of the "
                          "people): %s; synthesis skips them", int((~reliable).sum()), k, params.reliability_stds,
                          params.min_cluster_share, [int(j) for j in np.flatnonzero(~reliable)])
        sums = thetas[:, gen_dim + int(dplan.quantile):] if marg else None
        thetas = np.ascontiguousarray(thetas[:, :gen_dim])
        shift = None
        if marg:  # the mixture's marginals moved to the noisy per-item counts (post-processing)
            progress.log("dpgm: visible biases shifted towards the per-item counts")
            mix = np.where(reliable, sizes, 0.0) if reliable.any() else sizes  # synthesis' mixture weights
            thetas, shift, public_record["marginal_calibration"] = calibrate_marginals(dplan, thetas, sums, mix,
                                                                                       item_counts)
        model = _model(params, d, thetas, sizes, centers, public_record, dplan, lengths, st.column_types or None,
                       st.events, item_counts=item_counts, marginal_shift=shift)
        rows = [(j, float(sizes[j]), bool(reliable[j]), [float(v) for v in centers[j]]) for j in range(k)]
        table = engine.table(rows, [("cluster", "int", False), ("size", "double", False),
                                    ("reliable", "bool", False), ("center", "array<double>", False)])
        diagnostics = {}
        if counters is not None:
            diagnostics = {"rows": counters[0].value, "rows_box_clipped": counters[1].value,
                           "rows_norm_clipped": counters[2].value}
        return _proto.Outcome(
            table=table, model=model,
            public={"model": {"file": MODEL_FILE, "format_version": FORMAT_VERSION, "n": n,
                              "steps": dplan.steps, "step_noise": dplan.step_noise.to_public_dict(),
                              "cluster_sizes": [float(v) for v in sizes],
                              "clusters": public_record["clusters"],
                              "column_types": list(model.types),
                              "events": None if st.events is None else st.events.to_public_dict()}},
            files={MODEL_FILE: model.to_bytes()},
            extras={"history": history, "diagnostics": diagnostics})


def reliability_public(reliable: np.ndarray, size_std: float, params) -> dict:
    """The model's (and the receipt's) record of which clusters are reliable, and the public rule."""
    return {"reliable": [int(j) for j in np.flatnonzero(reliable)],
            "unreliable": [int(j) for j in np.flatnonzero(~reliable)],
            "usable": int(reliable.sum()) if reliable.any() else int(reliable.size),
            "size_std": float(size_std),
            "rule": f"reliable: noisy size >= {params.reliability_stds:g} x size_std and >= "
                    f"{params.min_cluster_share:g} x n; synthesis skips the others (all used when none is "
                    "reliable)"}


DPGM_MECHANISM = _proto.register(DPGM())
