"""A study of the DPGM's model on event tables, in memory (docs/research/dpgm.md "Training: a second study").

The people of ``sparkpriv generate cdr|transit --people N --seed 0`` (the same generator and
blocks, so the same people), their item sets capped at ``L`` (a uniformly random subset), the
paper's counting-query protocol (1,000 queries in 5 length groups, against the uncapped truth,
``draw_queries(seed=0)``), and a DPGM release made by the library's own pieces on the capped
records (the k-means on sparse statistics, the plan's DP-SGD step noise and sizes, the length
histograms), so a variant differs from the release only in the knob it changes. Each variant is
judged by the counting-query error of ``--synthetic`` people from its model, and by two
diagnostics: the error of the per-item marginals (sum |synthetic - real| / sum real, over the
capped records' item counts) and the share of people with few items.

Fixed test seeds (``--seed``): measurements, not private releases.

    python docs/research/scripts/dpgm_model_study.py --people 1000000 --variants '[{"name": "defaults"}]'
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from scipy.sparse import csr_matrix


def people(kind: str, n: int, seed: int = 0):
    """The uncapped item sets of people ``0 .. n-1`` (CSR, items sorted): those of
    ``sparkpriv generate cdr|transit --people N --seed seed``."""
    from sparkpriv.spark.generate_events import CDR_MODEL, TRANSIT_MODEL, person_matrix

    return person_matrix({"cdr": CDR_MODEL, "transit": TRANSIT_MODEL}[kind], n, seed)


def cap(X, L: int, seed: int):
    """At most ``L`` items per person, a uniformly random subset (``default_rng(seed)``)."""
    from sparkpriv.bench.utility_data import cap_rows

    return cap_rows(X, L, np.random.default_rng(seed))


def answers(X, Q) -> np.ndarray:
    out = np.zeros(Q.shape[1])
    for s in range(0, X.shape[0], 200_000):
        out += np.asarray(((X[s:s + 200_000] @ Q) > 0).sum(axis=0)).ravel()
    return out


def kmeans(X, params, plan, d: int, seed: int, previous: bool = False):
    """The release's DP k-means (linear) on the sparse records: the mechanism's own stats.
    ``previous``: label each record by the centres its last round assigned with (the last round's
    clusters) instead of by the released centres."""
    from sparkpriv.mechanisms import dpgm
    from sparkpriv.mechanisms.kmeans import fit_from_stats, initial_centres, make_feature_map
    from sparkpriv.mechanisms.protocol import SparseRows
    from sparkpriv.privacy.random import stream

    fmap = make_feature_map("linear", dpgm._bounds(params, d, "study"), caller="study")
    c0 = initial_centres(fmap, params.k, stream(seed, 1), None, "study")
    blocks = [SparseRows(X.indptr[s:s + 500_001] - X.indptr[s], X.indices[X.indptr[s]:X.indptr[min(s + 500_000, X.shape[0])]],
                         None, d) for s in range(0, X.shape[0], 500_000)]

    def stats_of(c):
        fn = dpgm._records_stats_fn(c)
        return sum(fn(b) for b in blocks)

    stats, seen = dpgm.last_round_centres(stats_of)
    km, _ = fit_from_stats(plan.kmeans, fmap, c0, stats, None, seed)
    centers = np.asarray(km.centers, float)
    labels = np.concatenate([dpgm.assign_sparse(b, seen["centres"] if previous else centers) for b in blocks])
    return centers, np.maximum(np.asarray(km.counts, float), 0.0), labels, float(km.count_std)


def minibatch_kmeans(X, k: int, seed: int):
    """NOT private: ``(labels, centres)`` of ``k`` clusters of scikit-learn's MiniBatchKMeans, fit on
    at most 500,000 of the records (drawn with ``default_rng(seed)``), every record labelled."""
    from sklearn.cluster import MiniBatchKMeans

    n = X.shape[0]
    fit = X[np.random.default_rng(seed).choice(n, min(n, 500_000), replace=False)]
    km = MiniBatchKMeans(k, batch_size=8192, n_init=1, random_state=seed, max_iter=20).fit(fit)
    return np.concatenate([km.predict(X[s:s + 500_000]) for s in range(0, n, 500_000)]), km.cluster_centers_


def exact_kmeans(X, params, plan, d: int, seed: int, previous: bool = True):
    """NOT private: the clusters of :func:`minibatch_kmeans`, their exact sizes and centres
    (clipped to ``[0, 1]``), in the place of the DP k-means (the variant key ``exact_kmeans``): what
    the RBMs give on clusters the DP k-means' noise has not emptied. ``plan`` and ``previous`` are
    unused (the signature of :func:`kmeans`)."""
    labels, centres = minibatch_kmeans(X, params.k, seed)
    sizes = np.bincount(labels, minlength=params.k).astype(np.float64)
    return np.clip(centres, 0.0, 1.0), sizes, labels, 1e-6


class SharedRBM:
    """A study model (docs/research/dpgm.md, "One model for all clusters"): ONE Bernoulli RBM for all
    clusters, its weights ``W`` (d, m), hidden biases ``c`` and length-strata offsets ``A`` (S, d)
    shared, and a visible bias ``B_j`` per cluster. A record ``v`` of cluster ``j`` (its training
    cluster, internal) and stratum ``s(|v|)`` has the free energy

        F(v) = -(B_j + A_s).v - sum_i softplus(c_i + (v W)_i),

    so its gradient is ``-v h^T`` (W), ``-h`` (c), ``-v`` in row ``j`` of ``B`` and in row ``s`` of
    ``A``, zero elsewhere: ``||grad F(v)||^2 = ||v||^2 ||h||^2 + ||h||^2 + 2 ||v||^2``, as for one
    cluster's RBM with strata. DP-SGD runs ONCE over all ``n`` people (one Poisson sample a step,
    the clipped sum of every sampled record's gradient, one Gaussian noise), so the privacy event is
    that of one cluster's training at the same ``(q, sigma, T)``; the noise on the shared weights is
    averaged over ``q n`` people a step instead of ``q n_j``.

    The negative phase: persistent chains per cluster, each of a fixed public length drawn from
    its cluster's released length histogram, swept at its cluster's bias; cluster ``j``'s chains
    weigh ``w_j`` (its noisy size's share) in the model's mean. All public: released sizes,
    histograms, centres.

    ``theta = [W.ravel(), c, B.ravel(), A.ravel()]``. The training data are the records with one
    more column, ``label + 1`` (the cluster), so that a batch carries its rows' clusters."""

    def __init__(self, d: int, hidden: int, k: int, strata: tuple, weights, chain_cluster, chain_lengths,
                 gibbs_steps: int = 1, b_scales=None, w_scale: float = 1.0):
        from sparkpriv.mechanisms.rbm import RBM

        self.d, self.hidden, self.k, self.strata = int(d), int(hidden), int(k), tuple(strata)
        self._rbm = RBM(d, hidden, strata=self.strata, chain_lengths=(1,), chains=1)  # stratum(), only
        self.S = len(self.strata) + 1 if self.strata else 1
        self.gibbs_steps = int(gibbs_steps)
        self.chain_cluster = np.asarray(chain_cluster, dtype=np.int64)
        self.chain_lengths = np.asarray(chain_lengths, dtype=np.int64)
        w = np.asarray(weights, dtype=np.float64)
        per = np.bincount(self.chain_cluster, minlength=self.k).astype(np.float64)
        self.chain_weight = (w / np.maximum(per, 1.0))[self.chain_cluster]  # sums to sum(w) = 1
        self.b_scales = None if b_scales is None else np.asarray(b_scales, dtype=np.float64)
        self.w_scale = float(w_scale)

    @property
    def dim(self) -> int:
        return self.d * self.hidden + self.hidden + self.k * self.d + self.S * self.d

    def unpack(self, theta):
        d, m, k = self.d, self.hidden, self.k
        W = theta[: d * m].reshape(d, m)
        c = theta[d * m: d * m + m]
        B = theta[d * m + m: d * m + m + k * d].reshape(k, d)
        A = theta[d * m + m + k * d:].reshape(self.S, d)
        return W, c, B, A

    def pack(self, W, c, B, A) -> np.ndarray:
        return np.concatenate([np.ravel(W), np.ravel(c), np.ravel(B), np.ravel(A)])

    def stratum(self, lengths) -> np.ndarray:
        if not self.strata:
            return np.zeros(np.asarray(lengths).size, dtype=np.int64)
        return self._rbm.stratum(lengths)

    def free_energy(self, V, labels, theta) -> np.ndarray:
        W, c, B, A = self.unpack(theta)
        V = np.asarray(V, dtype=np.float64)
        s = self.stratum(np.rint(V.sum(axis=1)).astype(np.int64))
        return -(V * (B[labels] + A[s])).sum(axis=1) - np.logaddexp(0.0, V @ W + c).sum(axis=1)

    def per_example_grads(self, V, labels, theta) -> np.ndarray:
        """``grad F(v_i)`` materialised (n, dim): tests only."""
        from sparkpriv.mechanisms.rbm import _sigmoid

        W, c, _, _ = self.unpack(theta)
        V = np.asarray(V, dtype=np.float64)
        n = V.shape[0]
        H = _sigmoid(V @ W + c)
        Bg = np.zeros((n, self.k, self.d))
        Bg[np.arange(n), labels] = V
        Ag = np.zeros((n, self.S, self.d))
        Ag[np.arange(n), self.stratum(np.rint(V.sum(axis=1)).astype(np.int64))] = V
        return -np.concatenate([np.einsum("ni,nj->nij", V, H).reshape(n, -1), H, Bg.reshape(n, -1),
                                Ag.reshape(n, -1)], axis=1)

    def _sum(self, V, labels, theta, clip, weight=None):
        """``(sum_i weight_i f_i grad F(v_i), squared norms)`` without per-example gradients."""
        from scipy.sparse import csr_matrix as _csr

        from sparkpriv.mechanisms.dpsgd import clip_factors
        from sparkpriv.mechanisms.rbm import _sigmoid

        W, c, _, _ = self.unpack(theta)
        V = _csr(np.asarray(V, dtype=np.float64))  # records are sparse: products by their nonzeros
        H = _sigmoid(np.asarray(V @ W) + c)
        vv = np.asarray(V.multiply(V).sum(axis=1)).ravel()
        hh = np.einsum("ij,ij->i", H, H)
        sq = vv * hh + hh + 2.0 * vv
        f = np.ones(V.shape[0]) if clip is None else clip_factors(sq, clip)
        if weight is not None:
            f = f * weight
        n = V.shape[0]
        Hf = H * f[:, None]
        Mk = _csr((f, (labels, np.arange(n))), shape=(self.k, n))
        Ms = _csr((f, (self.stratum(np.rint(vv).astype(np.int64)), np.arange(n))), shape=(self.S, n))
        return -self.pack(np.asarray(V.T @ Hf), Hf.sum(axis=0), (Mk @ V).toarray(), (Ms @ V).toarray()), sq

    def clipped_sum(self, Xb, theta, clip, rng=None):
        """DP-SGD's data term on a batch of records with their ``label + 1`` as the last column."""
        Xb = np.asarray(Xb)
        labels = np.rint(Xb[:, self.d]).astype(np.int64) - 1
        return self._sum(Xb[:, : self.d], labels, theta, clip)

    def init_state(self, rng, theta):
        """The chains: each drawn given its fixed length at its cluster's starting bias."""
        from sparkpriv.mechanisms.rbm import conditional_bernoulli

        _, _, B, A = self.unpack(theta)
        L = B[self.chain_cluster] + A[self.stratum(self.chain_lengths)]
        return conditional_bernoulli(L, self.chain_lengths, rng)

    def model_term(self, theta, chains, rng, clip=None):
        """``(-sum_i w_i f_i grad F(chain_i), new chains)`` after ``gibbs_steps`` sweeps ``h | v``,
        ``v | h, |v| = m`` of every chain at its cluster's bias (clipped like the records, as
        :meth:`RBM.model_term`)."""
        from sparkpriv.mechanisms.rbm import _sigmoid, conditional_bernoulli

        W, c, B, A = self.unpack(theta)
        bias = B[self.chain_cluster] + A[self.stratum(self.chain_lengths)]
        for _ in range(self.gibbs_steps):
            Hs = rng.random((chains.shape[0], self.hidden)) < _sigmoid(chains @ W + c)
            chains = conditional_bernoulli(Hs.astype(np.float64) @ W.T + bias, self.chain_lengths, rng)
        g, _ = self._sum(chains, self.chain_cluster, theta, clip, self.chain_weight)
        return -g, chains

    def lr_scales(self) -> np.ndarray:
        """Adam's rate multiples: ``W`` and ``c`` at ``w_scale``, the strata offsets at the RBM's
        STRATA_LR, each ``B_j`` at ``b_scales[j]`` (the library's per-cluster rate for its noisy
        size, over the base rate)."""
        from sparkpriv.mechanisms.rbm import STRATA_LR

        out = np.ones(self.dim)
        d, m, k = self.d, self.hidden, self.k
        out[: d * m + m] = self.w_scale
        if self.b_scales is not None:
            out[d * m + m: d * m + m + k * d] = np.repeat(self.b_scales, d)
        out[d * m + m + k * d:] = STRATA_LR if self.strata else 1.0
        return out

    def cluster_thetas(self, theta) -> np.ndarray:
        """``(k, RBM dim)``: cluster ``j``'s RBM ``[W, B_j, c, A]`` (the library's layout with
        strata), so the library's synthesis draws from the mixture."""
        W, c, B, A = self.unpack(theta)
        if not self.strata:  # the one offset row is a visible bias every record shares
            return np.stack([np.concatenate([W.ravel(), B[j] + A[0], c]) for j in range(self.k)])
        rows = [np.concatenate([W.ravel(), B[j], c, A.ravel()]) for j in range(self.k)]
        return np.stack(rows)


def allocate_chains(sizes, total: int) -> np.ndarray:
    """Per cluster, how many of ``total`` persistent chains it runs when they are shared out in
    proportion to the noisy sizes, rounded, at least one each (so the sum can pass ``total`` by
    up to ``k``): the weighted negative phase ``sum_j w_j
    mean_j`` has the least Monte Carlo variance, for chains of equal variance, when cluster ``j``
    runs a number proportional to ``w_j``. Post-processing of released sizes: public."""
    w = np.maximum(np.asarray(sizes, dtype=np.float64), 0.0)
    w = w / w.sum() if w.sum() > 0 else np.full(w.size, 1.0 / w.size)
    return np.maximum(1, np.rint(w * int(total))).astype(np.int64)


def train_shared(X, labels, sizes, centers, plan, seed: int, lengths, masses, *, rate: float | None = None,
                 steps: int | None = None, chains: int = 20, lr: float | None = None, w_lr: float = 1.0,
                 allocate: bool = False):
    """DP-SGD of one :class:`SharedRBM` over all people (the variant key ``shared``). ``rate``,
    ``steps``: its ``(q, T)`` (default the plan's); the noise multiplier is calibrated again for
    them by :func:`dpgm.plan_dpgm` with the same release parameters otherwise, so the release's
    privacy is the plan's: the k-means, histograms and counts as before, and one DP-SGD run at
    ``(q, sigma, T)`` over ``n`` people in the place of ``k`` in parallel at theirs. Returns ``(k,
    RBM dim)`` per-cluster thetas and the calibrated sigma. ``allocate``: the ``chains x k`` chains
    shared out by :func:`allocate_chains` instead of ``chains`` a cluster. Fixed test seed: a
    measurement."""
    import dataclasses

    from scipy.sparse import hstack

    from sparkpriv.mechanisms import dpgm, dpsgd
    from sparkpriv.mechanisms.dpgm._train import visible_init
    from sparkpriv.privacy.random import stream

    params, n, d = plan.params, X.shape[0], X.shape[1]
    q = float(rate or params.sampling_rate)
    T = int(steps or plan.steps)
    splan = dpgm.plan_dpgm(dataclasses.replace(params, sampling_rate=q, epochs=q * T * (1 - 1e-12)), n=n, d=d,
                           caller="study")
    assert splan.steps == T, (splan.steps, T)
    assert splan.kmeans.to_public_dict() == plan.kmeans.to_public_dict()
    k, h = params.k, params.hidden
    gen = dpgm._make_model(params, d)
    strata = tuple(gen.strata)
    sizes = np.maximum(np.asarray(sizes, dtype=np.float64), 0.0)
    weights = sizes / sizes.sum()
    if allocate:  # each cluster's fixed lengths drawn as dpgm.chain_lengths draws them, public
        from sparkpriv.mechanisms.dpgm._lengths import draw_lengths
        from sparkpriv.mechanisms.dpgm._params import CHAIN_STAGE

        per = allocate_chains(sizes, chains * k)
        chain_cluster = np.repeat(np.arange(k), per)
        chain_len = np.concatenate([draw_lengths(lengths, plan.lengths.edges, plan.lengths.noise.std, j, int(per[j]),
                                                 stream(seed, CHAIN_STAGE, j), dpgm.max_length(params, d))
                                    for j in range(k)])
    else:
        cl = np.asarray(dpgm.chain_lengths(plan, lengths, seed))[:, :chains]  # (k, chains), public draws
        chain_cluster, chain_len = np.repeat(np.arange(k), cl.shape[1]), cl.ravel()
    b_scales = np.asarray([splan.learning_rate_for(max(float(s), 1.0)) for s in sizes]) / params.lr
    model = SharedRBM(d, h, k, strata, weights, chain_cluster, chain_len,
                      gibbs_steps=params.gibbs_steps, b_scales=b_scales, w_scale=w_lr)
    theta0 = np.zeros(model.dim)
    theta0[: d * h] = 0.01 * stream(seed, 2, 0).standard_normal(d * h)
    B0 = np.stack([visible_init(centers[j], masses[j]) for j in range(k)])
    theta0[d * h + h: d * h + h + k * d] = B0.ravel()
    noise = dpsgd.step_noise(clip=params.clip, noise_multiplier=splan.noise_multiplier, dim=model.dim,
                             neighbors=params.neighbors, max_abs=float(n) * params.clip)
    assert noise.dp_event().noise_multiplier >= splan.noise_multiplier / 2 * (1 - 1e-9)
    Xl = hstack([X, csr_matrix((np.asarray(labels, np.float64) + 1.0)[:, None])], format="csr").astype(np.float32)
    t0 = time.time()

    def progress(u, total):
        if u % max(total // 10, 1) == 0:
            print(f"  shared: step {u}/{total} ({time.time() - t0:.0f}s)", flush=True)

    theta = dpsgd.train(model, Xl, theta0, clip=params.clip, sampling_rate=q, steps=T, noise=noise,
                        n_pub=float(n), seed=seed, cluster=0, lr=lr or params.lr, schedule=params.lr_schedule,
                        average=params.tail, on_step=progress)
    return model.cluster_thetas(theta), float(splan.noise_multiplier)


def dp_item_counts(real_marg, L: int, epsilon: float, delta: float, seed: int) -> tuple[np.ndarray, float]:
    """The per-item counts of distinct people with discrete Gaussian noise at (epsilon, delta),
    replace-one (L2 sensitivity sqrt(2 L): a person has at most L items), and the noise std. Fixed
    test seed: a measurement."""
    from sparkpriv.privacy import noise as nz
    from sparkpriv.privacy.random import stream

    g = nz.calibrate_gaussian_noise(sensitivity=math.sqrt(2 * L), epsilon=epsilon, delta=delta,
                                    dim=real_marg.size, max_abs=float(real_marg.max()) * 4)
    print(f"  DP per-item counts: epsilon {epsilon:g}, delta {delta:.3g}, std {g.std:.1f}", flush=True)
    return np.maximum(nz.add_noise(real_marg.astype(float), g, stream(seed, 99)), 0.0), g.std


def calibrate_marginals(model, current, target, shrink: float):
    """Post-processing: every cluster's visible biases shifted by one common vector
    ``log((target + shrink) / (current + shrink))``, so that the mixture's per-item marginals move
    to ``target`` (a Newton step of the exponential tilt that the length-conditioned sampler
    makes). This is the study's form (docs/research/dpgm.md, "Calibrating the marginals to DP per-item
    counts"); the release's :func:`dpgm.marginal_shift` now moves each item only as far as its
    count is more precise than the models (posterior mean), with :func:`dpgm.shift_visible_biases`."""
    import dataclasses

    from sparkpriv.mechanisms import dpgm

    shift = np.log((np.maximum(target, 0.0) + shrink) / (np.maximum(current, 0.0) + shrink))
    return dataclasses.replace(model, thetas=dpgm.shift_visible_biases(model.thetas, shift, model.d,
                                                                         model.params.hidden))


def oracle_sample(X, labels, k: int, S: int, rng, strata=None) -> np.ndarray:
    """NOT private, a yardstick: ``S`` records from the mixture of the clusters (by their real sizes)
    where cluster ``j``'s record has a real record's length and, given it, independent items at the
    cluster's real marginals (the conditional Bernoulli): what clusters, lengths and marginals
    alone give, with no model of which items go together. ``strata`` (interior edges of record
    lengths): the groups are (cluster, length stratum) instead, each with its own marginals
    (docs/research/dpgm.md, "Length strata")."""
    from sparkpriv.mechanisms.rbm import conditional_bernoulli

    n, d = X.shape
    if strata:
        s = np.searchsorted(np.asarray(strata), np.diff(X.indptr), side="right")
        labels, k = labels * (len(strata) + 1) + s, k * (len(strata) + 1)
    counts = np.bincount(labels, minlength=k)
    take = rng.multinomial(S, counts / n)
    out = []
    for j in range(k):
        if take[j] == 0:
            continue
        Xj = X[labels == j]
        p = np.clip(np.asarray(Xj.mean(axis=0)).ravel(), 1e-7, 1 - 1e-7)
        m = np.diff(Xj.indptr)[rng.integers(0, Xj.shape[0], take[j])]
        L = np.broadcast_to(np.log(p / (1 - p)), (int(take[j]), d))
        out.append(conditional_bernoulli(np.ascontiguousarray(L), m, rng))
    return np.concatenate(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", default="cdr", choices=["cdr", "transit"])
    ap.add_argument("--people", type=int, default=1_000_000)
    ap.add_argument("--max-items", type=int, default=128)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--synthetic", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sampling-rate", type=float, default=None, help="default: 880 / (n / k) per step")
    ap.add_argument("--epochs", type=float, default=None, help="default: 400 steps")
    ap.add_argument("--variants", default='[{"name": "defaults"}]',
                    help="JSON list of {name, and DPGMParams fields to change}; study-only keys: oracle, "
                         "oracle_strata (the yardsticks), previous (false: format 6's training clusters, "
                         "nearest the released centres, and James-Stein sizes; by default the library's "
                         "since model format 7, the k-means' last round's clusters with inverse-variance "
                         "sizes), kmeans_sizes (with previous false: the k-means' counts as sizes, as before "
                         "format 6), exact_kmeans (true: NOT private MiniBatchKMeans clusters and sizes in the "
                         "place of the DP k-means), shared (true: one model for all clusters, SharedRBM, with shared_rate, "
                         "shared_steps, shared_chains, shared_lr, shared_w_lr: W's rate over the rest's, shared_allocate: the "
                         "chains shared out by noisy size), burn_in, sweeps")
    ap.add_argument("--out", default=None, help="append one JSON line per variant here")
    ap.add_argument("--cache", default=None, help="a .npz file: the generated table, made once and read after")
    ap.add_argument("--save-model", default=None,
                    help="a directory: each variant's model (before any calibration) saved there as <name>.npz, "
                         "a DPGM model file (docs/research/scripts/dpgm_diagnose.py --model)")
    a = ap.parse_args(argv)

    from sparkpriv.mechanisms import counting_queries as cq
    from sparkpriv.mechanisms import dpgm

    t0 = time.time()
    import os

    from scipy.sparse import load_npz, save_npz

    if a.cache and os.path.exists(a.cache):
        Xfull = load_npz(a.cache).tocsr()
    else:
        Xfull = people(a.kind, a.people)
        if a.cache:
            save_npz(a.cache, Xfull)
    n, d = Xfull.shape
    X = cap(Xfull, a.max_items, a.seed)
    longest = int(np.diff(Xfull.indptr).max())
    qs = cq.draw_queries(d, max_length=longest, n_queries=1000, groups=5, seed=0)
    Q = qs.matrix
    true_a = answers(Xfull, Q)
    real_marg = np.asarray(X.sum(axis=0)).ravel()
    lens = np.diff(X.indptr)
    print(f"{a.kind}: n={n} d={d} longest={longest} mean items {np.diff(Xfull.indptr).mean():.2f} "
          f"(capped {lens.mean():.2f}); at most 2/4/8 items: "
          f"{[round(float((lens <= m).mean()), 4) for m in (2, 4, 8)]}  ({time.time() - t0:.0f}s)", flush=True)
    rng = np.random.default_rng(1)
    S = a.synthetic
    samp = rng.choice(n, min(S, n), replace=False)
    e = cq.relative_errors(true_a, answers(Xfull[samp], Q) * n / samp.size, n)
    smarg = np.asarray(X[samp].sum(axis=0)).ravel() * n / samp.size
    print(f"real sample of {samp.size}: {e.mean():.4f} by group "
          f"{[round(float(e[qs.group == g].mean()), 4) for g in range(1, 6)]}, marginal_l1 "
          f"{np.abs(smarg - real_marg).sum() / real_marg.sum():.4f}", flush=True)
    e = cq.relative_errors(true_a, cq.answers_under_independence(real_marg, n, Q), n)
    print(f"independence from the capped table's exact per-item counts (not private): {e.mean():.4f} by group "
          f"{[round(float(e[qs.group == g].mean()), 4) for g in range(1, 6)]}", flush=True)
    q = a.sampling_rate or min(1.0, 880.0 / (n / a.k))
    epochs = a.epochs or 400 * q
    for v in json.loads(a.variants):
        v = dict(v)
        name = v.pop("name")
        t1 = time.time()
        kw = dict(epsilon=a.epsilon, delta=1.0 / n, k=a.k, sampling_rate=q, epochs=epochs,
                  row_bound=math.sqrt(a.max_items))
        kw.update(v)
        oracle = kw.pop("oracle", False)
        oracle_strata = kw.pop("oracle_strata", None)  # with "oracle": marginals per (cluster, stratum)
        kmeans_sizes = kw.pop("kmeans_sizes", False)  # the k-means' counts as sizes (before format 6)
        previous = kw.pop("previous", True)  # the last k-means round's clusters (the library's since format 7)
        exact = kw.pop("exact_kmeans", False)  # NOT private clusters: exact_kmeans
        calibrate = kw.pop("calibrate", None)  # "oracle" (NOT private) or "dp": see calibrate_marginals
        rounds = kw.pop("calibrate_rounds", 2)
        share = kw.pop("calibrate_share", 0.1)  # with "dp": the share of epsilon the per-item counts take
        if calibrate == "dp":
            kw["epsilon"] = a.epsilon * (1 - share)
            kw["delta"] = 0.5 / n
        shared = kw.pop("shared", False)  # one SharedRBM over all people (train_shared)
        shared_kw = {key: kw.pop("shared_" + key) for key in ("rate", "steps", "chains", "lr", "w_lr", "allocate") if "shared_" + key in kw}
        burn_in = kw.pop("burn_in", None)
        sweeps = kw.pop("sweeps", None)
        params = dpgm.DPGMParams(**kw)
        plan = dpgm.plan_dpgm(params, n=n, d=d, caller="study")
        centers, sizes, labels, kstd = (exact_kmeans if exact else kmeans)(X, params, plan, d, a.seed, previous)
        t2 = time.time()
        wstats, sigma = {}, None
        if oracle:  # NOT private: each cluster's real marginals, records given their real lengths
            V = csr_matrix(oracle_sample(X, labels, params.k, S, np.random.default_rng(11), oracle_strata))
        else:
            lengths = None  # released before training, as the library does (they set each RBM's start)
            if plan.lengths is not None:
                lengths = plan.lengths.release(np.stack([plan.lengths.histogram(X[labels == j])
                                                         for j in range(params.k)]), a.seed)
            if previous:  # the library's: K and H count the same set, inverse-variance weights
                sizes = dpgm.cluster_sizes(sizes, lengths, kstd, plan.lengths.noise.std if plan.lengths else 0.0)
            elif not kmeans_sizes and lengths is not None:  # format 6: K moved towards H (James-Stein)
                D = lengths.sum(axis=1) - sizes
                var = kstd ** 2 + lengths.shape[1] * plan.lengths.noise.std ** 2
                with np.errstate(divide="ignore", invalid="ignore"):
                    sizes = np.maximum(sizes + D * np.where(D != 0, np.maximum(0.0, 1 - var / (D * D)), 0.0), 0.0)
            sigma = plan.noise_multiplier
            if shared:
                thetas, sigma = train_shared(X, labels, sizes, centers, plan, a.seed, lengths,
                                             dpgm.visible_masses(plan, lengths), **shared_kw)
            else:
                thetas = dpgm.train_clusters(X, labels, sizes, centers, plan, a.seed,
                                             masses=dpgm.visible_masses(plan, lengths),
                                             chain_lengths=dpgm.chain_lengths(plan, lengths, a.seed))
            public = plan.to_public_dict()
            model = dpgm._model(params, d, thetas, sizes, centers, public, plan, lengths)
            if a.save_model:
                os.makedirs(a.save_model, exist_ok=True)
                model.save(os.path.join(a.save_model, f"{name}.npz"))
            W = thetas[:, : d * params.hidden]
            wstats = {"w_abs_mean": round(float(np.abs(W).mean()), 4), "w_abs_max": round(float(np.abs(W).max()), 3)}
            t2 = time.time()
            from sparkpriv.mechanisms.rbm import RBM

            saved = RBM.sample.__defaults__
            RBM.sample.__defaults__ = (burn_in or saved[0], saved[1], sweeps or saved[2], *saved[3:])
            try:
                parts = [dpgm.synthesize_part(model, min(20_000, S - s), 11, s) for s in range(0, S, 20_000)]
            finally:
                RBM.sample.__defaults__ = saved
            V = csr_matrix(np.concatenate(parts) >= 0.5, dtype=np.float64)
            if calibrate:
                if calibrate == "oracle":
                    target, shrink = real_marg, 1.0
                else:
                    target, std = dp_item_counts(real_marg, a.max_items, a.epsilon * share, 0.5 / n,
                                                 a.seed)
                    shrink = 2.0 * std  # a noisy small count moves its item little
                for r in range(rounds):
                    e = cq.relative_errors(true_a, answers(V, Q) * n / S, n)
                    marg = np.asarray(V.sum(axis=0)).ravel() * n / S
                    print(f"  calibration round {r}: error {e.mean():.4f} by group "
                          f"{[round(float(e[qs.group == g].mean()), 4) for g in range(1, 6)]}, marginal_l1 "
                          f"{np.abs(marg - real_marg).sum() / real_marg.sum():.4f}", flush=True)
                    model = calibrate_marginals(model, marg, target, shrink)
                    parts = [dpgm.synthesize_part(model, min(20_000, S - s), 11 + r + 1, s)
                             for s in range(0, S, 20_000)]
                    V = csr_matrix(np.concatenate(parts) >= 0.5, dtype=np.float64)
        e = cq.relative_errors(true_a, answers(V, Q) * n / S, n)
        groups = [round(float(e[qs.group == g].mean()), 4) for g in range(1, 6)]
        marg = np.asarray(V.sum(axis=0)).ravel() * n / S
        merr = float(np.abs(marg - real_marg).sum() / real_marg.sum())
        sl = np.diff(V.indptr)
        row = {"name": name, "kind": a.kind, "people": n, "epsilon": a.epsilon, "params": v,
               "steps": int(shared_kw.get("steps") or plan.steps) if shared else plan.steps, "sizes": [int(s) for s in sizes],
               "error": round(float(e.mean()), 4), "groups": groups, "marginal_l1": round(merr, 4),
               "short": [round(float((sl <= m).mean()), 4) for m in (2, 4, 8)],
               **wstats, "sigma": None if oracle else sigma, "train_s": round(t2 - t1), "synth_s": round(time.time() - t2)}
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
