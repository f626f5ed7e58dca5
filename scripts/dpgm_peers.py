"""Peers of the DPGM release (MST, AIM, MWEM) on the counting-query protocol of
scripts/dpgm_utility.py (docs/dpgm.md, "Peers: MST, AIM, MWEM").

The table, the 1,000 queries and the truth are those of dpgm_utility.py (its
functions are imported, not copied): people drawn by the Spark event tables'
generator on the public map, 1,303 towers, truth on the UNCAPPED table; the
peers, like the DPGM, see the table capped at L towers per person (1,303
binary columns). Each peer releases a synthetic table of n people, scored with
the paper's relative error in 5 length groups.

The peers are smartnoise-synth's wrappers of private-pgm (package ``mbi``):
benchmark-only, installed in their own environment, never a sparkpriv
dependency (docs/dpgm.md says how to install them):

* ``mst``: ``MSTSynthesizer.MST`` as shipped (1-way marginals, domain
  compression, maximum-spanning-tree selection of 2-way marginals by the
  exponential mechanism, mirror descent, sampling), except that the selection
  step's scores ``||x_ab - xhat_ab||_1`` over all d (d - 1) / 2 pairs are
  computed in numpy from ``X^T X`` (the shipped loop projects the data 848,253
  times) and its Kruskal loop keeps component labels in an array: the same
  scores, the same exponential mechanism (``np.random``), the same tree law.
* ``aim``: ``AIMSynthesizer.AIM`` as shipped, on a reduced workload (every
  1-way marginal and ``--aim-pairs`` random 2-way marginals), ``--aim-rounds``
  rounds, under a wall-clock limit (``--aim-time-limit``): AIM needs at least
  0.9 d rounds (its 1-way measurements alone take ``0.9 d / rounds`` of rho)
  and fits a graphical model (1,000 mirror-descent steps) in each.
* ``mwem``: ``MWEMSynthesizer`` as shipped, with ``split_factor`` columns per
  histogram (the full 2^1303 histogram cannot exist): the columns are cut
  into disjoint blocks, each block gets its own MWEM at epsilon / (number of
  blocks), and the blocks are sampled independently.

The peers' noise: MST's and AIM's Gaussian and MWEM's Laplace noise come from
OpenDP's samplers (not seedable); their exponential mechanisms and sampling
use ``np.random``, seeded with ``--seed``. Their neighbour relation is
add/remove one person (sensitivity 1 per marginal); the DPGM's is replace-one.

    python scripts/dpgm_peers.py --people 20000 --epsilons 0.5 1 2 4 --peers mst
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dpgm_utility import answers, cdr_table  # noqa: E402

PEERS = ("mst", "aim", "mwem")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--people", type=int, default=20000)
    ap.add_argument("--max-items", type=int, default=32)
    ap.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--mst-iters", type=int, default=5000, help="mirror-descent steps of MST's final fit (shipped: 5000)")
    ap.add_argument("--aim-pairs", type=int, default=100, help="random 2-way marginals in AIM's workload")
    ap.add_argument("--aim-rounds", type=int, default=None, help="AIM rounds (shipped default 16 d)")
    ap.add_argument("--aim-time-limit", type=float, default=1800.0, help="seconds per AIM run")
    ap.add_argument("--mwem-split", type=int, default=8, help="columns per MWEM histogram")
    args = ap.parse_args(argv)
    if args.people < 2 or args.queries < 5 or args.max_items < 1:
        ap.error("--people >= 2, --queries >= 5 and --max-items >= 1 are needed")
    if any(e <= 0 for e in args.epsilons) or not 0 < args.delta < 1:
        ap.error("every --epsilons value must be > 0 and --delta in (0, 1)")
    if args.mwem_split < 1 or args.aim_pairs < 0:
        ap.error("--mwem-split >= 1 and --aim-pairs >= 0 are needed")
    return args


def protocol(people: int, max_items: int, seed: int, n_queries: int = 1000):
    """The table, queries and truth of scripts/dpgm_utility.py: ``(src, X, qs, true)``.

    ``src`` is the uncapped 0/1 table (the truth), ``X`` the capped one (what
    the releases see), ``qs`` the queries drawn exactly as dpgm_utility.main.
    """
    from sparkpriv.mechanisms.counting_queries import draw_queries

    src, X = cdr_table(people, max_items, seed)
    distinct = src.sum(1)
    qs = draw_queries(X.shape[1], max_length=int(distinct.max()), n_queries=n_queries, groups=5, seed=seed)
    return src, X, qs, answers(src, qs)


def score(true, S, qs, n: int) -> dict:
    """Mean relative error per length group (1..5) and over all queries; answers scaled to n."""
    from sparkpriv.mechanisms.counting_queries import group_summary, relative_errors

    S = np.asarray(S, dtype=np.float64)
    e = relative_errors(true, answers(S, qs) * (n / S.shape[0]), n)
    out = {g["group"]: g["mean_relative_error"] for g in group_summary(e, qs)}
    out["all"] = float(e.mean())
    return out


def pair_l1_scores(X, p):
    """MST's selection scores for binary columns: ``||x_ab - n p_a p_b||_1`` for every pair a < b.

    ``x_ab`` is the (2 x 2) marginal of columns a, b of the 0/1 table X; ``p``
    (d, 2) the independent model's 1-way probabilities. Returns ``(a, b, score)``
    over ``itertools.combinations(range(d), 2)`` order.
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    c = X.sum(0)
    C = X.T @ X
    a, b = np.triu_indices(d, 1)
    n11 = C[a, b]
    n10 = c[a] - n11
    n01 = c[b] - n11
    n00 = n - c[a] - c[b] + n11
    s = (np.abs(n00 - n * p[a, 0] * p[b, 0]) + np.abs(n01 - n * p[a, 0] * p[b, 1])
         + np.abs(n10 - n * p[a, 1] * p[b, 0]) + np.abs(n11 - n * p[a, 1] * p[b, 1]))
    return a, b, s


def zcdp_epsilon(rho: float, delta: float) -> float:
    """(epsilon, delta) implied by rho-zCDP (Bun and Steinke 2016, Prop. 1.3)."""
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def _binary_dataset(X):
    from mbi import Dataset, Domain

    cols = [f"t{j}" for j in range(X.shape[1])]
    data = {c: X[:, j].astype(np.int64) for j, c in enumerate(cols)}
    return Dataset(data, Domain(cols, [2] * len(cols))), cols


def run_mst(X, eps, delta, seed, n_out, iters=5000, log=print):
    import networkx as nx
    from mbi import estimation, marginal_oracles
    from snsynth.mst.mst import MSTSynthesizer

    class VectorizedSelectMST(MSTSynthesizer):
        def select(self, data, rho, measurement_log, total, cliques=[]):
            t = time.perf_counter()
            est = estimation.mirror_descent(data.domain, measurement_log, known_total=float(total), iters=1000,
                                            marginal_oracle=marginal_oracles.message_passing_stable)
            attrs = list(data.domain.attrs)
            if any(data.domain[c] != 2 for c in attrs):
                raise RuntimeError("domain compression changed a binary column; the vectorized select needs 2 levels")
            p = np.stack([np.asarray(est.project([c]).datavector()) for c in attrs])
            p = p / p.sum(1, keepdims=True)
            Xd = np.stack([np.asarray(data.to_dict()[c]) for c in attrs], 1)
            a, b, w = pair_l1_scores(Xd, p)
            comp = np.arange(len(attrs))
            r = len(attrs)
            epsilon = np.sqrt(8 * rho / (r - 1))
            T = nx.Graph()
            T.add_nodes_from(attrs)
            for _ in range(r - 1):
                live = np.flatnonzero(comp[a] != comp[b])
                i = live[self.exponential_mechanism(w[live], epsilon, sensitivity=1.0)]
                T.add_edge(attrs[a[i]], attrs[b[i]])
                old, new = comp[b[i]], comp[a[i]]
                comp[comp == old] = new
            log(f"    MST select: {time.perf_counter() - t:.0f} s")
            return list(T.edges)

    np.random.seed(seed)
    data, cols = _binary_dataset(X)
    syn = VectorizedSelectMST(epsilon=eps, delta=delta)
    if iters != 5000:
        orig = estimation.mirror_descent

        def md(*a, **k):
            if k.get("iters") == 5000:
                k["iters"] = iters
            return orig(*a, **k)
        estimation.mirror_descent = md
    syn.MST(data, eps, delta)
    out = syn.undo_compress_fn(syn.synthesizer.synthetic_data(rows=n_out))
    return out.df[cols].to_numpy(np.float64)


class _Timeout(Exception):
    pass


def run_aim(X, eps, delta, seed, n_out, pairs, rounds, time_limit, log=print):
    import itertools

    from snsynth.aim.aim import AIMSynthesizer
    from snsynth.utils import cdp_rho

    np.random.seed(seed)
    data, cols = _binary_dataset(X)
    d = len(cols)
    if rounds is not None and rounds <= 0.9 * d:
        raise ValueError(f"--aim-rounds must exceed 0.9 d = {0.9 * d:g}: AIM's 1-way measurements alone "
                         "spend 0.9 d / rounds of its budget")
    rng = np.random.default_rng(seed)
    all_pairs = list(itertools.combinations(cols, 2))
    chosen = rng.choice(len(all_pairs), size=min(pairs, len(all_pairs)), replace=False)
    workload = [(c,) for c in cols] + [all_pairs[i] for i in chosen]
    syn = AIMSynthesizer(epsilon=eps, delta=delta, rounds=rounds, verbose=True)
    syn.rho = cdp_rho(eps, delta)

    def alarm(*_):
        raise _Timeout

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(int(time_limit))
    t = time.perf_counter()
    try:
        syn.AIM(data, workload)
    except _Timeout:
        log(f"    AIM stopped by the time limit after {time.perf_counter() - t:.0f} s")
        return None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out = syn.synthesizer.synthetic_data(rows=n_out)
    return out.df[cols].to_numpy(np.float64)


def run_mwem(X, eps, seed, n_out, split):
    import random

    from snsynth.mwem import MWEMSynthesizer

    np.random.seed(seed)
    random.seed(seed)
    syn = MWEMSynthesizer(epsilon=eps, split_factor=split, verbose=False)
    syn.fit(X.astype(np.int64), categorical_columns=list(range(X.shape[1])))
    return np.asarray(syn.sample(n_out), dtype=np.float64)


def main(argv=None):
    args = parse_args(argv)
    t0 = time.perf_counter()
    src, X, qs, true = protocol(args.people, args.max_items, args.seed, args.queries)
    n, d = X.shape
    print(f"table: {n} people x {d} towers; {time.perf_counter() - t0:.0f} s", flush=True)
    results = {}
    for peer in args.peers:
        for eps in args.epsilons:
            t = time.perf_counter()
            name = f"{peer}, eps={eps:g}"
            if peer == "mst":
                S = run_mst(X, eps, args.delta, args.seed, n, iters=args.mst_iters)
            elif peer == "aim":
                S = run_aim(X, eps, args.delta, args.seed, n, args.aim_pairs, args.aim_rounds, args.aim_time_limit)
            else:
                S = run_mwem(X, eps, args.seed, n, args.mwem_split)
            secs = time.perf_counter() - t
            if S is None:
                results[name] = {"timeout": True, "seconds": secs}
                print(f"{name:24s} no release within the time limit ({secs:.0f} s)", flush=True)
                continue
            results[name] = score(true, S, qs, n)
            results[name]["seconds"] = secs
            r = results[name]
            print(f"{name:24s} " + " ".join(f"{r[g]:.4f}" for g in range(1, 6)) +
                  f"  mean {r['all']:.4f}  ({secs:.0f} s)", flush=True)
    print(json.dumps({"args": vars(args), "results": {k: {str(g): v for g, v in r.items()}
                                                      for k, r in results.items()}}))


if __name__ == "__main__":
    main()
