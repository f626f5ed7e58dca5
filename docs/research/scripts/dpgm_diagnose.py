"""Where a DPGM model's counting-query error is, on a generated event table, in memory
(docs/research/dpgm.md, "Where the model's error is").

The people of ``sparkpriv generate cdr|transit --people N --seed 0`` capped at ``L`` items and the
paper's query protocol, as docs/research/scripts/dpgm_model_study.py has them (the same people, caps, queries
and truth), and three yardsticks, none of them private (measurements with fixed test seeds):

* ``--oracle-ks 1,30,300``: mixtures of ``k`` clusters (scikit-learn's MiniBatchKMeans on the
  capped records) where each record has a real record's length and, given it, independent items
  at its cluster's exact marginals: what clusters and exact marginals alone give. With
  ``--length-bins 1,2,...,129`` each cluster is split further by record length (the bins
  ``[e_i, e_{i+1})`` of the given edges), each cell with its own exact marginals: what exact
  marginals by cluster AND length give (``--length-bins fine``: each length 1-12 alone, then
  13-15, 16-19, 20-23, 24-31, 32-47, 48-63, 64-128). ``--oracle-half``: the cells (clusters,
  marginals, sizes, lengths) from a random half of the people, the truth on all of them: whether
  fine cells memorise their people.
* ``--model FILE`` (a DPGM model file, as ``sparkpriv release dpgm`` writes it, or
  ``DPGMModel.save``): ``--synthetic`` people synthesized from it, their error, and the error
  when their weights are raked (maximum entropy) to the capped table's exact per-item counts
  (an oracle: how far exact marginals would take this model's records) and to Gaussian-noised
  counts at ``--count-epsilons`` (what the same reweighting could do with counts a release
  could afford); with ``--shift-epsilons exact,0.3,0.1`` also the release's shift of the model's
  visible biases towards the exact or noised counts (``shifted``), and the shifted model's error.
* Every row: the mean relative error per length group and its ``bias``, the mean of the signed
  relative error ``(q(D') - q(D)) / max(q(D), 0.001 n)`` per group (positive: too many people hit).
* For the model's records and a real sample of the same size: the co-occurrence of items by the
  distance between them (the generator's tower or station coordinates), as the synthetic table's
  pair count over the real one in each distance band: 1 where the model puts the right mass on
  pairs of that distance.

    python docs/research/scripts/dpgm_diagnose.py --people 4427486 --cache /tmp/cdr.npz --oracle-ks 1,30,300
    python docs/research/scripts/dpgm_diagnose.py --people 4427486 --cache /tmp/cdr.npz --model release/model.npz
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
from scipy.optimize import minimize
from scipy.sparse import csr_matrix, vstack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dpgm_model_study as study  # noqa: E402  (the same people, caps and answers)

DISTANCE_BANDS = (0.0, 2.0, 5.0, 10.0, 20.0, 40.0, math.inf)  # km, the generator's map units
FINE_LENGTH_BINS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 20, 24, 32, 48, 64)  # --length-bins fine


def rake(V, target, total: float, reg: float = 1e-3, maxiter: int = 500) -> np.ndarray:
    """Weights ``w_i = total exp(v_i . lam) / sum_r exp(v_r . lam)`` of the rows of ``V`` (n, d) with
    ``sum_i w_i v_i = target`` (a maximum-entropy reweighting, raking): ``lam`` minimises the convex
    ``total log sum_i exp(v_i . lam) - lam . target + reg |lam|^2 / 2`` (L-BFGS). An item no row
    holds gets a target of ``1e-3`` more than asked, so ``lam`` stays finite; ``reg`` keeps it so
    where a target cannot be met."""
    target = np.asarray(target, dtype=np.float64) + 1e-3

    def f(lam):
        z = V @ lam
        top = z.max()
        e = np.exp(z - top)
        Z = e.sum()
        w = total * e / Z
        return total * (math.log(Z) + top) - lam @ target + 0.5 * reg * lam @ lam, V.T @ w - target + reg * lam

    res = minimize(f, np.zeros(V.shape[1]), jac=True, method="L-BFGS-B", options={"maxiter": maxiter})
    z = V @ res.x
    e = np.exp(z - z.max())
    return total * e / e.sum()


def weighted_answers(V, Q, w) -> np.ndarray:
    """Per query (column of ``Q``), the weighted number of rows of ``V`` with any of its items."""
    out = np.zeros(Q.shape[1])
    for s in range(0, V.shape[0], 200_000):
        out += w[s:s + 200_000] @ np.asarray((V[s:s + 200_000] @ Q) > 0, dtype=np.float64)
    return out


def pair_mass(M, D, bands=DISTANCE_BANDS) -> np.ndarray:
    """Per distance band ``[a, b)``, the number of (person, unordered pair of distinct items of the
    person) with the items' distance ``D[i, j]`` in the band."""
    C = (M.T @ M).toarray()
    np.fill_diagonal(C, 0.0)
    return np.array([C[(D >= a) & (D < b)].sum() / 2.0 for a, b in zip(bands, bands[1:])])


def oracle_mixture(X, k: int, S: int, seed: int, chunk: int = 20_000, length_bins=None):
    """NOT private: ``S`` records (CSR) of the mixture of ``k`` clusters of MiniBatchKMeans (fit on
    at most 500,000 records; ``k = 1``: one cluster), cluster ``j`` by its real size, its record a
    real record's length of the cluster and, given it, independent items at the cluster's exact
    marginals (the conditional Bernoulli): :func:`dpgm_model_study.oracle_sample`, drawn in chunks
    of ``chunk`` records so that only sparse records are kept. ``length_bins`` (increasing edges,
    the first at most the shortest length): the cells are (cluster, bin of the record's length),
    each by its real size with its own exact marginals and real lengths."""
    from sparkpriv.mechanisms.rbm import conditional_bernoulli

    n, d = X.shape
    labels = np.zeros(n, np.int64) if k == 1 else study.minibatch_kmeans(X, k, seed)[0]
    if length_bins is not None:
        edges = np.asarray(length_bins, dtype=np.int64)
        if edges.size == 0 or np.any(np.diff(edges) <= 0):
            raise ValueError(f"length_bins must be increasing edges; got {list(length_bins)}")
        nb = edges.size
        b = np.searchsorted(edges, np.diff(X.indptr), side="right") - 1
        if np.any(b < 0):
            raise ValueError(f"length_bins starts at {int(edges[0])}, above the shortest record "
                             f"({int(np.diff(X.indptr).min())} items): start the edges lower")
        labels, k = labels * nb + b, k * nb
    rng = np.random.default_rng(seed + 1)
    counts = np.bincount(labels, minlength=k)
    take = rng.multinomial(S, counts / n)
    order = np.argsort(labels, kind="stable")
    starts = np.concatenate(([0], np.cumsum(counts)))
    out = []
    for j in np.flatnonzero(take):
        Xj = X[order[starts[j]:starts[j + 1]]]
        p = np.clip(np.asarray(Xj.mean(axis=0)).ravel(), 1e-7, 1 - 1e-7)
        logit, lens = np.log(p / (1 - p)), np.diff(Xj.indptr)
        for s in range(0, int(take[j]), chunk):
            m = lens[rng.integers(0, Xj.shape[0], min(chunk, int(take[j]) - s))]
            L = np.ascontiguousarray(np.broadcast_to(logit, (m.size, d)))
            out.append(csr_matrix(conditional_bernoulli(L, m, rng)))
    return vstack(out).tocsr()


def table(kind: str, people: int, max_items: int, cap_seed: int, cache=None):
    """``(Xfull, X, queries, truth)``: the generated people (uncapped, CSR; read from ``cache``, a
    .npz file, when it exists, else made and written there), capped at ``max_items``, the paper's
    1,000 queries in 5 length groups (``draw_queries(seed=0)``) and their answers on the uncapped
    people, as docs/research/scripts/dpgm_model_study.py has them."""
    from scipy.sparse import load_npz, save_npz

    from sparkpriv.mechanisms import counting_queries as cq

    if cache and os.path.exists(cache):
        Xfull = load_npz(cache).tocsr()
    else:
        Xfull = study.people(kind, people)
        if cache:
            save_npz(cache, Xfull)
    X = study.cap(Xfull, max_items, cap_seed)
    qs = cq.draw_queries(Xfull.shape[1], max_length=int(np.diff(Xfull.indptr).max()), n_queries=1000, groups=5,
                         seed=0)
    return Xfull, X, qs, study.answers(Xfull, qs.matrix)


def emit(row: dict, out=None) -> None:
    """Print ``row`` as a JSON line, and append it to the file ``out`` if given."""
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


def synthesize(model, S: int, seed: int):
    """``S`` synthetic people (CSR) from ``model``, in slices of 20,000 as a Spark task makes them."""
    from sparkpriv.mechanisms import dpgm

    return vstack([csr_matrix(dpgm.synthesize_part(model, min(20_000, S - s), seed, s) >= 0.5, dtype=np.float64)
                   for s in range(0, S, 20_000)]).tocsr()


def shifted(model, counts, noise_var: float, n: int, samples: int, seed: int):
    """``model`` with the release's shift of its visible biases towards ``counts`` (noise variance
    ``noise_var``): the library's own steps on a saved model, ``samples`` record means over the
    clusters by noisy size (``cluster_samples``, ``model_sums``: a release's training tasks), then
    ``calibration`` and ``shift_visible_biases``, which is what ``calibrate_marginals`` does in a
    release. Post-processing."""
    import dataclasses

    from sparkpriv.mechanisms.dpgm import _marginals as mg

    per = mg.cluster_samples(samples, model.sizes)
    sums = np.stack([mg.model_sums(model, j, int(per[j]), seed) for j in range(model.k)])
    shift, _ = mg.calibration(counts, sums, per, model.sizes, n, noise_var)
    return dataclasses.replace(model, thetas=mg.shift_visible_biases(model.thetas, shift, model.d, model.params.hidden))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", default="cdr", choices=["cdr", "transit"])
    ap.add_argument("--people", type=int, default=1_000_000)
    ap.add_argument("--max-items", type=int, default=128)
    ap.add_argument("--cap-seed", type=int, default=7, help="the cap's seed (dpgm_model_study's --seed)")
    ap.add_argument("--synthetic", type=int, default=200_000)
    ap.add_argument("--oracle-ks", default="", help="comma-separated k of the oracle mixtures")
    ap.add_argument("--length-bins", default="",
                    help="the oracles' cells also by record length: comma-separated increasing edges "
                         "(bins [e_i, e_i+1)), or 'fine' (each length 1-12, then 13, 16, 20, 24, 32, 48, 64+)")
    ap.add_argument("--oracle-half", action="store_true",
                    help="the oracles' cells (clusters, marginals, sizes, lengths) from a random half of the people "
                         "only, the truth on all: whether the cells memorise their people")
    ap.add_argument("--model", default=None, help="a DPGM model file")
    ap.add_argument("--count-epsilons", default="0.1,0.3",
                    help="epsilon of the noised per-item counts the model's records are raked to")
    ap.add_argument("--shift-epsilons", default="",
                    help="with --model: comma-separated epsilons (or 'exact') of counts the release's shift of "
                         "the model's visible biases moves to (its banded_model_error and marginal_shift on "
                         "--marginal-samples record means); each shifted model synthesizes --synthetic people")
    ap.add_argument("--marginal-samples", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--cache", default=None, help="a .npz file: the generated table, made once and read after")
    ap.add_argument("--out", default=None, help="append one JSON line per result here")
    a = ap.parse_args(argv)

    from sparkpriv.mechanisms import counting_queries as cq
    from sparkpriv.mechanisms import dpgm
    from sparkpriv.privacy import noise as nz
    from sparkpriv.spark.generate_events import CDR_MODEL, TRANSIT_MODEL, event_map

    Xfull, X, qs, truth = table(a.kind, a.people, a.max_items, a.cap_seed, a.cache)
    n, d = Xfull.shape
    Q = qs.matrix
    exact = np.asarray(X.sum(axis=0)).ravel()
    S = a.synthetic

    def report(name, answers, **extra):
        e = cq.relative_errors(truth, answers, n)
        signed = np.sign(answers - truth) * e  # the relative error with its sign
        row = {"name": name, "kind": a.kind, "people": n, "synthetic": S, "error": round(float(e.mean()), 4),
               "groups": [round(float(e[qs.group == g].mean()), 4) for g in range(1, 6)],
               "bias": [round(float(signed[qs.group == g].mean()), 4) for g in range(1, 6)], **extra}
        emit(row, a.out)

    idx = np.random.default_rng(a.seed).choice(n, min(S, n), replace=False)
    real = X[idx]  # capped, for the pair counts; the size floor answers from the uncapped records
    report("real sample", study.answers(Xfull[idx], Q) * n / idx.size)
    bins = (FINE_LENGTH_BINS if a.length_bins.strip() == "fine"
            else [int(v) for v in a.length_bins.split(",") if v.strip()]) or None
    by = "" if bins is None else " by length"
    if a.oracle_half:
        by += ", cells from half the people"
    for k in [int(v) for v in a.oracle_ks.split(",") if v.strip()]:
        t = time.time()
        half = np.random.default_rng(99).permutation(n)[: n // 2] if a.oracle_half else slice(None)
        V = oracle_mixture(X[half], k, S, a.seed, length_bins=bins)
        report(f"oracle k={k}{by}", study.answers(V, Q) * n / S, seconds=round(time.time() - t))
        w = rake(V, exact * S / n, S)
        report(f"oracle k={k}{by} raked to the exact counts", weighted_answers(V, Q, w) * n / S)
    if a.model:
        model = dpgm.DPGMModel.load(a.model)
        if model.d != d:
            raise SystemExit(f"--model has d={model.d}; the {a.kind} table has {d} items: pass --kind.")
        t = time.time()
        V = synthesize(model, S, a.seed)
        marg = np.asarray(V.sum(axis=0)).ravel() * n / S
        report("model", study.answers(V, Q) * n / S, seconds=round(time.time() - t),
               marginal_l1=round(float(np.abs(marg - exact).sum() / exact.sum()), 4))
        w = rake(V, exact * S / n, S)
        report("model raked to the exact counts (oracle)", weighted_answers(V, Q, w) * n / S)
        for eps in [float(v) for v in a.count_epsilons.split(",") if v.strip()]:
            g = nz.calibrate_gaussian_noise(sensitivity=math.sqrt(2 * a.max_items), epsilon=eps, delta=0.5 / n,
                                            dim=d, max_abs=float(exact.max()) * 4)
            noisy = exact + np.random.default_rng(a.seed + 5).standard_normal(d) * g.std
            w = rake(V, np.maximum(noisy, 0.0) * S / n, S)
            report(f"model raked to Gaussian counts at epsilon {eps:g}", weighted_answers(V, Q, w) * n / S,
                   count_std=round(float(g.std), 1))
        for name in [v.strip() for v in a.shift_epsilons.split(",") if v.strip()]:
            if name == "exact":
                counts, var = exact, 0.0
            else:
                g = nz.calibrate_gaussian_noise(sensitivity=math.sqrt(2 * a.max_items), epsilon=float(name),
                                                delta=1.0 / n, dim=d, max_abs=float(exact.max()) * 4)
                counts, var = exact + np.random.default_rng(a.seed + 5).standard_normal(d) * g.std, g.std ** 2
            Vs = synthesize(shifted(model, counts, var, n, a.marginal_samples, a.seed), S, a.seed + 1)
            report(f"model shifted to counts at {name}", study.answers(Vs, Q) * n / S,
                   count_std=round(math.sqrt(var), 1))
        xy = event_map({"cdr": CDR_MODEL, "transit": TRANSIT_MODEL}[a.kind], 0)[0]
        D = np.linalg.norm(xy[:, None, :] - xy[None, :, :], axis=2)
        pr, pv = pair_mass(real, D), pair_mass(V, D)
        bands = [f"[{lo:g},{hi:g})" for lo, hi in zip(DISTANCE_BANDS, DISTANCE_BANDS[1:])]
        row = {"name": "pair mass, model over real sample", "bands_km": bands,
               "ratio": [round(float(v), 3) for v in pv / np.maximum(pr, 1.0) * real.shape[0] / S],
               "real_share": [round(float(v), 4) for v in pr / pr.sum()]}
        emit(row, a.out)


if __name__ == "__main__":
    main()
