"""A study of the per-cluster RBM training (docs/research/dpgm.md "Training: a first study"), not a release.

On a generated CDR event table (``sparkpriv generate cdr``): the people's tower sets capped at
L = 128 (random towers kept), the paper's 1,000 counting queries against the uncapped truth,
ONE DP k-means (linear, the library's driver loop, epsilon ``argv[2]``), and then, on the same
clusters, RBM trainings that differ in one knob each (learning rate, steps, clip, chains, iterate
averaging, DP noise), each judged by the counting-query error of ``S`` synthetic people (env S,
default 20,000) from the mixture. Without ``noise`` a training is NOT private (the exact clipped
average of each batch, batch about 900 people per cluster); with ``noise = epsilon`` it uses the
plan's step noise for that epsilon, ``q`` and steps, but the clusters' REAL sizes as ``n_pub``:
a study of training, not a release.

    python docs/research/scripts/dpgm_training_study.py cdr-200000 1.0 '[{"name": "base"}, {"name": "lr", "lr": 0.001}]'
"""
import json
import math
import sys
import time

import numpy as np
import pyarrow.parquet as pq
from scipy.sparse import csr_matrix

from sparkpriv.mechanisms import dpgm, dpsgd, counting_queries as cq
from sparkpriv.mechanisms.rbm import RBM
from sparkpriv.mechanisms.kmeans import make_feature_map, initial_centres, fit_from_stats, cluster_stats
from sparkpriv.privacy.random import stream

PATH = sys.argv[1]
L = 128; D = 1303; K = 10
t = pq.read_table(PATH, columns=["caller_id", "tower_id"]).to_pandas().drop_duplicates()
pid, inv = np.unique(t.caller_id.to_numpy(), return_inverse=True)
n = pid.size
items = t.tower_id.to_numpy()
rng = np.random.default_rng(0)
Xfull = csr_matrix((np.ones(len(inv)), (inv, items)), shape=(n, D))
Xfull.sum_duplicates()
# cap: keep L random items per person
key = rng.random(len(inv)); order = np.lexsort((key, inv)); inv_s, it_s = inv[order], items[order]
start = np.searchsorted(inv_s, np.arange(n)); rank = np.arange(len(inv_s)) - start[inv_s]
keep = rank < L
X = csr_matrix((np.ones(keep.sum()), (inv_s[keep], it_s[keep])), shape=(n, D)); X.sum_duplicates()
longest = int(np.diff(Xfull.indptr).max())
qs = cq.draw_queries(D, max_length=longest, n_queries=1000, groups=5, seed=0)
true_a = np.asarray(((Xfull @ qs.matrix) > 0).sum(axis=0)).ravel().astype(float)
print(f"n={n} longest={longest} mean items={np.diff(Xfull.indptr).mean():.1f}", flush=True)

def err_of(V, w=1.0):
    a = np.asarray(((csr_matrix(V) @ qs.matrix) > 0).sum(axis=0)).ravel() * (n / V.shape[0])
    e = cq.relative_errors(true_a, a, n)
    return float(e.mean()), [round(float(e[qs.group == g].mean()), 4) for g in range(1, 6)]

# real sample floor
S = int(__import__("os").environ.get("S", "20000"))
samp = rng.choice(n, S, replace=False)
print(f"real sample {S}:", err_of(Xfull[samp].toarray()), flush=True)

EPS_KM = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
params = dpgm.DPGMParams(epsilon=EPS_KM, delta=1.0 / n, k=K, sampling_rate=0.02, epochs=8.0, hidden=64,
                         row_bound=math.sqrt(L), learning_rate=0.01)
plan = dpgm.plan_dpgm(params, n=n, d=D)
seed = 777
fmap = make_feature_map("linear", dpgm._bounds(params, D, "x"), caller="x")
centres0 = initial_centres(fmap, K, stream(seed, 1), None, "x")


def _kmeans(Xd):
    Z, Xc, _ = fmap.features(Xd)
    km, _ = fit_from_stats(plan.kmeans, fmap, centres0, lambda c: cluster_stats(Z, c),
                           lambda c: cluster_stats(Z, c, Xc), seed)
    return km


Xd = X.toarray()
kmodel = _kmeans(Xd)
centers = np.asarray(kmodel.centers, float)
sizes = np.maximum(np.asarray(kmodel.counts, float), 1.0)
labels = dpgm.assign_clusters(Xd, centers, params.row_bound)
del Xd
print("sizes", np.round(sizes).astype(int), "noise mult", plan.noise_multiplier if hasattr(plan, "noise_multiplier") else None, flush=True)

def mixture_sample(samplers, S, seed=5):
    w = sizes / sizes.sum()
    cnt = np.random.default_rng(seed).multinomial(S, w)
    return np.concatenate([samplers[j](int(c)) for j, c in enumerate(cnt)])

r = np.random.default_rng(9)
print("kmeans bernoulli:", err_of(mixture_sample([lambda c, j=j: (r.random((c, D)) < np.clip(centers[j], 0, 1)).astype(float) for j in range(K)], S)), flush=True)

def train_variant(name, *, clip=10.0, lr=0.01, steps=400, q=None, hidden=64, chains=100, gibbs=1, ema=None,
                  noise=None, burn=50, clusters=range(K), tseed=None):
    t0 = time.time()
    ts = seed if tseed is None else int(tseed)  # the training's streams (batches, noise, chains)
    if isinstance(noise, (int, float)):  # an epsilon: the plan's step noise for this q and steps
        pp = dpgm.DPGMParams(epsilon=float(noise), delta=1.0 / n, k=K, sampling_rate=q, epochs=steps * q,
                             hidden=hidden, row_bound=math.sqrt(L), clip=clip)
        pl = dpgm.plan_dpgm(pp, n=n, d=D)
        noise = pl.step_noise
        print(f"  eps {pp.epsilon}: steps {pl.steps}, sigma {noise.std / clip if hasattr(noise, 'std') else '?'}", flush=True)
    gen = RBM(D, hidden, gibbs_steps=gibbs, chains=chains)
    thetas = []
    for j in clusters:
        Xj = X[labels == j]
        nj = Xj.shape[0]
        qj = q if q is not None else min(1.0, 900 / max(nj, 1))
        theta = gen.init(stream(ts, 2, j))
        theta[D * hidden: D * hidden + D] = dpgm.visible_init(centers[j], L)  # the library's, without histograms
        state = gen.init_state(stream(ts, 23, j, 0), theta)
        opt = dpsgd.Adam(lr=lr)
        avg = theta.copy()
        for s in range(1, steps + 1):
            g, state, _ = dpsgd.dp_step(gen, Xj, theta, state, clip=clip, sampling_rate=qj, noise=noise,
                                        n_pub=max(nj, 1), seed=ts, cluster=j, step=s)
            theta = opt.step(theta, g)
            if ema:
                avg = ema * avg + (1 - ema) * theta
        thetas.append(avg if ema else theta)
    for b in (burn if isinstance(burn, list) else [burn]):
        smp = [lambda c, j=i: gen.sample(thetas[j], c, np.random.default_rng(100 + j), burn_in=b) for i, j in enumerate(clusters)]
        e = err_of(mixture_sample(smp, S))
        print(f"{name} burn {b}: {e}  ({time.time()-t0:.0f}s)", flush=True)
    return thetas

if __name__ == "__main__":
    variants = json.loads(sys.argv[3]) if len(sys.argv) > 3 else [{"name": "base"}]
    for v in variants:
        train_variant(v.pop("name"), **v)
