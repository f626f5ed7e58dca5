"""Training the DPGM's models in memory: the RBM's start, the assignment of records to clusters,
DP-SGD per cluster (docs/research/dpgm.md, "The RBM's starting point")."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import dpsgd
from sparkpriv.mechanisms.kmeans import cluster_stats, fit_from_stats, initial_centres, make_feature_map
from sparkpriv.mechanisms.sparse import _GOLDEN, _splitmix
from sparkpriv.privacy.random import new_secret_seed, stream
from sparkpriv.mechanisms.dpgm._params import DPGMParams, length_strata, max_length
from sparkpriv.mechanisms.dpgm._lengths import chain_lengths, cluster_sizes, expected_length, last_round_centres
from sparkpriv.mechanisms.dpgm._marginals import calibration, shift_visible_biases, strata_longest, synthetic_sums
from sparkpriv.mechanisms.dpgm._plan import DPGMPlan, _bounds, _make_model, plan_dpgm
from sparkpriv.mechanisms.dpgm._released import DPGMModel


INIT_FLOOR = 1e-3  # an RBM's starting visible probabilities lie in [INIT_FLOOR, 1 - INIT_FLOOR]


def project_capped(c: np.ndarray, mass: float) -> np.ndarray:
    """The Euclidean projection of ``c`` onto ``{p in [0, 1]^d : sum(p) <= mass}``.

    It is ``clip(c - lam, 0, 1)`` with the least ``lam >= 0`` that meets the mass (soft
    thresholding, then the box). The set is convex, so for any ``p`` in it ``||project(c) - p||
    <= ||c - p||``: when the cluster's true mean record lies in it, the projected centre is at
    least as close to it as ``c``. docs/math.md section 5, "The RBM's starting point"."""
    c = np.asarray(c, dtype=np.float64)
    mass = max(float(mass), 0.0)
    p = np.clip(c, 0.0, 1.0)
    if p.sum() <= mass:
        return p
    # f(lam) = sum clip(c - lam, 0, 1) is continuous and non-increasing, f(0) > mass >= f(max c) = 0;
    # bisect for the bracket, then solve the linear piece it lies on exactly
    lo, hi = 0.0, float(c.max())
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if np.clip(c - mid, 0.0, 1.0).sum() > mass:
            lo = mid
        else:
            hi = mid
    free = (c - hi > 0.0) & (c - hi < 1.0)
    if np.any(free):  # on this piece f(lam) = sum_free (c_i - lam) + #(c_i - lam >= 1)
        lam = (c[free].sum() + np.count_nonzero(c - hi >= 1.0) - mass) / np.count_nonzero(free)
        if lo <= lam <= hi:
            hi = lam
    return np.clip(c - hi, 0.0, 1.0)


def visible_masses(plan: DPGMPlan, noisy_lengths: np.ndarray | None) -> np.ndarray:
    """Each cluster's expected record length, the mass its RBM starts from (:func:`visible_init`):
    the mean length synthesis draws from the cluster's released histogram (:func:`expected_length`);
    for a cluster with no bin left, that of the sum of the k histograms (noise std ``sqrt(k)``
    times); with neither (or no histograms), the longest record ``L`` the bounds admit. At most
    ``L``. Post-processing of released histograms and public bounds."""
    k, longest = plan.params.k, float(max_length(plan.params, plan.d))
    lp = plan.lengths
    if lp is None or noisy_lengths is None:
        return np.full(k, longest)
    noisy_lengths = np.asarray(noisy_lengths, dtype=np.float64)
    pooled = expected_length(noisy_lengths.sum(axis=0), lp.edges, lp.noise.std * math.sqrt(k))
    out = []
    for j in range(k):
        own = expected_length(noisy_lengths[j], lp.edges, lp.noise.std)
        out.append(min(longest, own if own is not None else pooled if pooled is not None else longest))
    return np.asarray(out, dtype=np.float64)


def visible_init(centre: np.ndarray, mass: float) -> np.ndarray:
    """An RBM's starting visible biases: the logits of the released centre projected onto
    ``{p in [0, 1]^d : sum(p) <= mass}`` (:func:`project_capped`), kept within
    ``[INIT_FLOOR, 1 - INIT_FLOOR]``. A noisy centre clipped to the box keeps every positive
    noise, which at small clusters puts most of its mass on items nobody in the cluster has;
    the projection removes it (docs/research/dpgm.md, "The RBM's starting point")."""
    p = np.clip(project_capped(centre, mass), INIT_FLOOR, 1.0 - INIT_FLOOR)
    return np.log(p / (1.0 - p))


def fit_dpgm_array(X, params: DPGMParams, *, seed: int | None = None, log=None) -> tuple[DPGMModel, DPGMPlan]:
    """In-memory DPGM release of ``X`` (n, d) with entries in [0, 1] (binary for ``rbm``).

    ``seed`` (tests only) fixes every secret; by default they come from OS entropy.
    """
    caller = "fit_dpgm_array"
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ParameterError(f"X must be a non-empty 2-D array (records, columns). Got shape {X.shape}.")
    if not np.all(np.isfinite(X)) or X.min() < 0 or X.max() > 1:
        raise ParameterError("X must have finite values in [0, 1]: map columns with public bounds first.")
    n, d = X.shape
    plan = plan_dpgm(params, n=n, d=d, caller=caller)
    seed = new_secret_seed("dpgm") if seed is None else int(seed)
    # 1. DP k-means (linear), the library's driver loop
    fmap = make_feature_map("linear", _bounds(params, d, caller), caller=caller)
    centres0 = initial_centres(fmap, params.k, stream(seed, 1), None, caller)
    Z, Xc, _ = fmap.features(X)
    item_counts = None  # the per-item counts of the bounded rows (the k-means' features), noised once
    if plan.marginals is not None:
        item_counts = plan.marginals.release(Z.sum(axis=0), seed)
    iteration_stats, seen = last_round_centres(lambda c: cluster_stats(Z, c))
    kmodel, _ = fit_from_stats(plan.kmeans, fmap, centres0, iteration_stats,
                               lambda c: cluster_stats(Z, c, Xc), seed)
    centers = np.asarray(kmodel.centers, float)
    # 2. internal: the last round's clusters, whose noisy means and counts the k-means released
    labels = assign_clusters(X, seen["centres"], _bounds(params, d, caller).row_bound)
    # 3. the length histograms of the same clusters, noised once (they also set where each rbm starts,
    # and their sums the size of each cluster as trained)
    lengths = None
    if plan.lengths is not None:
        lengths = plan.lengths.release(np.stack([plan.lengths.histogram(X[labels == j]) for j in range(params.k)]),
                                       seed)
    sizes = cluster_sizes(kmodel.counts, lengths, kmodel.count_std, plan.lengths.noise.std if plan.lengths else 0.0)
    masses = visible_masses(plan, lengths)
    chains = chain_lengths(plan, lengths, seed)
    # 4. one model per cluster, same (q, sigma, T)
    clips: dict = {}
    thetas = train_clusters(X, labels, sizes, centers, plan, seed, log=log, clips=clips, masses=masses,
                            chain_lengths=chains)
    public = model_public(plan, sizes, [clips[j] for j in range(params.k)], masses, kmodel)
    shift = None
    if plan.marginals is not None:  # 5. the mixture's marginals moved to the noisy counts (post-processing)
        samples = plan.marginals.cluster_samples(sizes)
        sums = np.stack([marginal_sums(plan, thetas[j], j, samples[j], seed, lengths) for j in range(params.k)])
        thetas, shift, public["marginal_calibration"] = calibrate_marginals(plan, thetas, sums, sizes, item_counts)
    return _model(params, d, thetas, sizes, centers, public, plan, lengths, item_counts=item_counts,
                  marginal_shift=shift), plan


def marginal_sums(plan: DPGMPlan, theta: np.ndarray, j: int, count: int, seed: int, lengths) -> np.ndarray:
    """The ``(2 d,)`` column sums and sums of squares of ``count`` records of cluster ``j``'s
    trained model ``theta`` drawn as synthesis draws them (its released length histogram, the
    model's length strata), each counted as its mean given its last hidden units and length:
    :func:`synthetic_sums` from ``stream(seed, MARGINAL_SAMPLE_STAGE, j, b)``. A Spark task runs it
    after training its cluster. Post-processing of released values."""
    gen, lp = _make_model(plan.params, plan.d), plan.lengths
    longest = strata_longest(gen, plan.params, plan.d)
    return synthetic_sums(gen, np.asarray(theta, dtype=np.float64), int(j), int(count), seed, plan.d,
                          lengths=None if lp is None else lengths, edges=None if lp is None else lp.edges,
                          std=math.nan if lp is None else float(lp.noise.std), longest=longest)


def calibrate_marginals(plan: DPGMPlan, thetas: np.ndarray, sums: np.ndarray, sizes, item_counts) -> tuple:
    """``(thetas, shift, public)``: every cluster's visible biases plus the shift of
    :func:`._marginals.calibration` (the mixture's marginals from each cluster's sampled sums,
    ``plan.marginals.cluster_samples(sizes)`` records each, moved towards the noisy counts), and the
    model file's record of it. Post-processing of released values (docs/research/dpgm.md, "Calibrating the
    marginals")."""
    mp = plan.marginals
    shift, public = calibration(item_counts, sums, mp.cluster_samples(sizes), sizes, plan.n, mp.noise_var)
    return shift_visible_biases(thetas, shift, plan.d, plan.params.hidden), shift, public


def _model(params, d, thetas, sizes, centers, public, plan: DPGMPlan, lengths, column_types=None,
           events=None, item_counts=None, marginal_shift=None) -> DPGMModel:
    lp = plan.lengths
    return DPGMModel(params, d, thetas, sizes, centers, public, column_types, events, lengths,
                     None if lp is None else lp.edges, math.nan if lp is None else float(lp.noise.std),
                     item_counts=item_counts, marginal_shift=marginal_shift)


def training_order(sizes) -> list:
    """The clusters' training order on an engine that trains them in parallel: largest noisy
    size first (a larger cluster draws larger batches over the same steps, so it trains
    longest; starting it first shortens the slowest executor's queue). Public: a function of
    the released noisy sizes only."""
    return [int(j) for j in np.argsort(-np.asarray(sizes, dtype=np.float64), kind="stable")]


def model_public(plan: DPGMPlan, sizes, clips=None, masses=None, kmeans=None) -> dict:
    """The model file's public record: the plan's, each cluster's learning rate and batches per
    update ``m_j`` (functions of the noisy sizes), the rbm's starting masses (:func:`visible_masses`),
    with quantile clipping each cluster's final ``clips`` (:func:`final_clips_public`), and
    ``kmeans`` (the k-means model): its noisy counts and their std, which :func:`cluster_sizes` read."""
    out = plan.to_public_dict()
    if kmeans is not None:
        out["kmeans_sizes"] = {"values": [float(v) for v in kmeans.counts], "count_std": float(kmeans.count_std),
                               "note": "the k-means' noisy counts of its last round's clusters, which the "
                                       "models train on; with the length histograms the sizes are the "
                                       "inverse-variance mean of these and the histograms' sums "
                                       "(cluster_sizes)"}
        out["training_clusters"] = ("the k-means' last round's clusters: each record trains the model of "
                                    "the centre nearest to it among those that round assigned with (internal, "
                                    "never released); the released centre and count are that cluster's noisy "
                                    "mean and size")
    if plan.params.model == "rbm" and masses is not None:
        out["start_masses"] = [float(v) for v in masses]
    out["learning_rates"] = plan.learning_rates(sizes)
    out["average_tail"] = plan.params.tail  # the share of the last iterates each model is the mean of
    if length_strata(plan.params, plan.d):
        out["strata_trained"] = plan.strata_trained(sizes)
    out["batches"] = plan.batches(sizes)
    out["updates"] = [dpsgd.updates(plan.steps, m) for m in out["batches"]]
    if plan.quantile:
        out["final_clips"] = final_clips_public(clips, plan, sizes)
    return out


def final_clips_public(clips, plan: DPGMPlan, sizes) -> dict:
    """The model's public record of each cluster's last clip under quantile clipping."""
    adapted = [dpsgd.clip_adapts(plan.count_noise.std, plan.params.sampling_rate, max(float(s), 1.0),
                                 plan.batches_for(max(float(s), 1.0))) for s in sizes]
    return {"values": [float(c) for c in clips], "adapted": adapted,
            "note": "each cluster's clip after its last update: a function of the released noisy counts "
                    "(post-processing, covered by the release's epsilon), not of the data otherwise; "
                    "adapted false: the cluster's expected batch is too small for its count "
                    "(count noise std / (m q noisy size) > %g, m its batches per update), its clip stayed "
                    "at clip" % dpsgd.MAX_FRACTION_NOISE}


def assign_clusters(X: np.ndarray, centers: np.ndarray, row_bound: float) -> np.ndarray:
    """The nearest of ``centers`` to each row after the k-means clip (box [0, 1], then the
    row bound): internal, never released. The Spark path calls the same function per block."""
    from sparkpriv.mechanisms.kmeans import assign_nearest, project_to_ball

    Xc = project_to_ball(np.clip(np.asarray(X, dtype=np.float64), 0.0, 1.0), float(row_bound))
    return assign_nearest(Xc, np.asarray(centers, dtype=np.float64))


# fixed salts of the row hash in canonical_order, one per column: SplitMix64's outputs (public
# constants, not a secret; integer arithmetic, the same on every machine and NumPy version)
_ROW_HASH = _splitmix(np.arange(4096, dtype=np.uint64) * _GOLDEN)


def _row_hashes(U: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    """Per row of ``U`` (n, w) uint64 (or of ``U[rows]``): ``sum_c splitmix(U_rc ^ salt_c)``
    modulo 2^64, in slices of rows. Each value is mixed before the sum, so rows that differ in
    any bit get unrelated hashes (a plain multiply-sum keeps only the low bits of each product,
    where the float64 of 0 or 1 has none)."""
    n = U.shape[0] if rows is None else rows.size
    salt = _ROW_HASH[np.arange(U.shape[1]) % _ROW_HASH.size]
    h = np.empty(n, dtype=np.uint64)
    for s in range(0, n, 8192):
        part = U[s:s + 8192] if rows is None else U[rows[s:s + 8192]]
        h[s:s + part.shape[0]] = _splitmix(part ^ salt).sum(axis=1, dtype=np.uint64)
    return h


def canonical_order(X: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """A permutation that puts the rows of ``X`` (n, w) in an order fixed by their contents alone:
    ``X[canonical_order(X)]`` is the same matrix for every order of the same rows (the rows as a
    multiset). A cluster's DP-SGD trains on its rows in this order (docs/research/dpgm.md, "Row order"), so
    its model does not depend on the order the rows arrive in: a retried Spark task, a source whose
    partitions come back in another order, and the in-memory engine all train the same model.
    ``rows`` (indices into ``X``): order those rows only, without copying them; the result then
    permutes ``rows`` (``X[rows[canonical_order(X, rows)]]``).

    The rows are sorted by a hash of their float64 bits (:func:`_row_hashes`: each value mixed
    with its column's fixed salt by SplitMix64, summed modulo 2^64): rows of equal hash are
    identical, and then interchangeable, unless two different rows collide, which is checked
    exactly; on a collision the order is the lexicographic order of the rows' bits (first column
    first). Work ``O(n w)`` plus a sort of ``n`` keys."""
    X = np.asarray(X, dtype=np.float64)
    rows = None if rows is None else np.asarray(rows, dtype=np.int64)
    n = X.shape[0] if rows is None else rows.size
    if n < 2:
        return np.arange(n)
    U = np.ascontiguousarray(X.reshape(X.shape[0], -1)).view(np.uint64)
    h = _row_hashes(U, rows)
    o = np.argsort(h, kind="stable")
    hs = h[o]
    tie = np.flatnonzero(hs[1:] == hs[:-1])
    for s in range(0, tie.size, 8192):  # in slices: a table of many identical rows has many ties
        t = tie[s:s + 8192]
        a, b = (o[t], o[t + 1]) if rows is None else (rows[o[t]], rows[o[t + 1]])
        if np.any(U[a] != U[b]):  # two different rows share a hash
            return np.lexsort((U if rows is None else U[rows]).T[::-1])
    return o


def train_clusters(X: np.ndarray, labels: np.ndarray, sizes: np.ndarray, centers: np.ndarray,
                   plan: DPGMPlan, seed: int, clusters=None, log=None, on_step=None,
                   clips: dict | None = None, masses=None, chain_lengths=None) -> np.ndarray:
    """DP-SGD of every cluster's model on its own rows (a Spark task per cluster does the same
    for one ``j``): ``(k, dim)`` parameters. Cluster ``j`` sees only ``X[labels == j]`` (a table's
    rows in their :func:`canonical_order`, whatever order they came in), the
    public ``sizes[j]``, ``centers[j]``, ``masses[j]`` and its own streams ``(seed, stage, j, step)``.
    ``masses``: the rbm's starting mass per cluster (:func:`visible_masses` of the released length
    histograms; None: the longest record the bounds admit, for every cluster).
    ``chain_lengths`` (k, chains): the fixed lengths of each cluster's persistent chains for an rbm
    with length strata (:func:`chain_lengths` of the released histograms). None: no cluster trains
    its strata (the plain RBM, offsets 0): a stratum without chains would have no model term, and
    its offsets would only climb.
    ``on_step(j, t, steps)``: called after DP-SGD step ``t`` of cluster ``j`` (progress).
    ``clips`` (a dict), when given, receives cluster ``j``'s final clip (quantile clipping: a
    function of released counts; else the declared clip)."""
    params, d = plan.params, plan.d
    gen = _make_model(params, d)
    clusters = range(params.k) if clusters is None else clusters
    masses = visible_masses(plan, None) if masses is None else np.asarray(masses, dtype=np.float64)
    strata = params.model == "rbm" and bool(gen.strata)
    thetas = np.zeros((params.k, gen.dim))
    for j in clusters:
        if isinstance(X, np.ndarray):  # a table's rows in an order fixed by their contents, one copy
            idx = np.flatnonzero(labels == j)  # (a Spark task's rows are all of cluster j)
            Xj = X[idx[canonical_order(X, None if idx.size == X.shape[0] else idx)]]
        else:  # event records arrive sparse, in the keyed person layout: an order a retry repeats
            Xj = X[labels == j]
        n_pub = max(float(sizes[j]), 1.0)
        gj = gen
        if strata:  # with its strata and chains of fixed lengths; a noisy cluster, or no chain lengths:
            # the plain RBM, offsets 0
            gj = dataclasses.replace(gen, chain_lengths=tuple(int(v) for v in chain_lengths[j])) \
                if chain_lengths is not None and plan.strata_for(n_pub) else dataclasses.replace(gen, strata=())
        theta0 = gj.init(stream(seed, 2, j))
        if params.model == "rbm":  # start at the cluster's released centre, its noise projected away
            theta0[d * params.hidden: d * params.hidden + d] = visible_init(centers[j], masses[j])
        info = {}
        thetas[j, : gj.dim] = dpsgd.train(gj, Xj, theta0, clip=params.clip, sampling_rate=params.sampling_rate,
                                          steps=plan.steps, noise=plan.step_noise, n_pub=n_pub,
                                          seed=seed, cluster=j, lr=plan.learning_rate_for(n_pub),
                                          on_step=None if on_step is None else (lambda t, T, j=j: on_step(j, t, T)),
                                          adaptive=plan.adaptive(), info=info, schedule=params.lr_schedule,
                                          average=params.tail, batches=plan.batches_for(n_pub))
        if clips is not None:
            clips[j] = float(info["clip"])
        if log is not None:
            log(j, Xj.shape[0])
    return thetas
