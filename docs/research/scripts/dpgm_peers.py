"""Peers of the DPGM release (MST, AIM, MWEM) on the counting-query protocol of
docs/research/scripts/dpgm_utility.py (docs/research/dpgm.md, "Peers: MST, AIM, MWEM").

The table, the 1,000 queries and the truth are those of dpgm_utility.py (its
functions are imported, not copied): people drawn by the Spark event tables'
generator on the public map, 1,303 towers, truth on the UNCAPPED table; the
peers, like the DPGM, see the table capped at L towers per person (1,303
binary columns). Each peer releases a synthetic table of n people, scored with
the paper's relative error in 5 length groups.

The peers are smartnoise-synth's wrappers of private-pgm (package ``mbi``):
benchmark-only, installed in their own environment, never a sparkpriv
dependency (docs/research/dpgm.md says how to install them):

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

    python docs/research/scripts/dpgm_peers.py --people 20000 --epsilons 0.5 1 2 4 --peers mst

A column sample (``--towers N``, ``--kind utility``): AIM cannot finish its
rounds on 1,303 columns, so the same people are kept on the N most popular
towers of the PUBLIC map (``dpgm_utility.popular_towers``: the generator's
popularity, not a count of the table), each holding those of their own towers,
then capped; ``dpgm_utility.py --towers N`` gives the DPGM and the baselines
on the same table and queries (docs/research/dpgm.md, "AIM on a column sample"):

    python docs/research/scripts/dpgm_peers.py --people 20000 --max-items 16 --towers 32 --epsilons 1 \
        --peers aim --aim-pairs 496 --aim-rounds 64

Event tables at scale (``--kind cdr|transit``; docs/research/dpgm.md, "At the paper's
size"): the table, queries and truth of docs/research/scripts/dpgm_model_study.py (its
``people``, ``cap`` and ``answers`` are imported, not copied): the people of
``sparkpriv generate cdr|transit --people N --seed 0``, each person's items
capped at ``--max-items`` (a uniformly random subset, ``cap`` at ``--seed``),
the 1,000 queries ``draw_queries(d, max_length=longest, seed=0)`` where
``longest`` is the largest number of distinct items of a person in the
UNCAPPED table, the truth on the uncapped table; delta defaults to 1/n, and
each run synthesizes ``--synthetic`` people whose answers are scaled by
n / ``--synthetic``. ``--cache DIR`` keeps the uncapped table as
``DIR/<kind>-<N>.npz`` (scipy sparse) so the generator runs once.

A dense private-pgm ``Dataset`` of 4.4 M people x 1,303 int64 columns (46 GB)
does not fit, so ``--sparse`` (MST only) hands MST a stand-in,
``SparseBinaryDataset``, holding n, the column counts c and X^T X of the
sparse capped table (the table itself is then dropped). MST reads its data
only through ``domain``, ``len(data.df)``, ``project(cols).datavector()`` of
1-way and 2-way marginals (the measurements and the domain compression) and,
in the vectorized selection, these same statistics: all of them follow from
(n, c, X^T X), exactly (float64 sums of 0/1, below 2^53). ``project`` returns
the Factor ``mbi.Dataset.project`` returns, in its order (C order over the
attributes as given: ``[[n00, n01], [n10, n11]]`` for ``(a, b)``), and
``--check-sparse`` checks that bit for bit against mbi's own ``Dataset`` on a
small random table and on the table of the other arguments (all 1-way
marginals, random pairs in both orders, the selection scores). Domain
compression never changes a binary column (a column keeps both levels when
fewer than 2 pass its 3 sigma test), so MST's ``transform_data`` is the
identity there and, for the stand-in, is replaced by that identity (it fails
if a support is not full). The mechanism is otherwise the one above: the same
measurements, selection, final fit and sampling. Each phase's wall time and
the process's peak memory are logged, and, beside the query errors, the
synthetic table's items per person, per-item marginal error and the share of
queries it over-answers (``describe``).

    python docs/research/scripts/dpgm_peers.py --kind cdr --people 4427486 --max-items 128 --synthetic 100000 \
        --sparse --peers mst --epsilons 1 --mst-iters 1000 --cache /tmp/peers
    python docs/research/scripts/dpgm_peers.py --kind cdr --people 20000 --max-items 128 --check-sparse
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import signal
import sys
import time
from pathlib import Path

import numpy as np
from scipy import sparse

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dpgm_model_study as study  # noqa: E402
from dpgm_utility import answers, cdr_table  # noqa: E402

PEERS = ("mst", "aim", "mwem")
KINDS = ("utility", "cdr", "transit")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=KINDS, default="utility",
                    help="utility: dpgm_utility.py's table (default); cdr, transit: dpgm_model_study.py's people")
    ap.add_argument("--people", type=int, default=20000)
    ap.add_argument("--max-items", type=int, default=32)
    ap.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--delta", type=float, default=None, help="default: 1e-5 (utility), 1/n (cdr, transit)")
    ap.add_argument("--synthetic", type=int, default=None, help="synthetic people per release (default n)")
    ap.add_argument("--sparse", action="store_true", help="MST reads the table through SparseBinaryDataset")
    ap.add_argument("--check-sparse", action="store_true",
                    help="check SparseBinaryDataset against mbi's Dataset on this table and a random one, then stop")
    ap.add_argument("--cache", default=None, help="cdr, transit: keep the uncapped table as DIR/<kind>-<N>.npz")
    ap.add_argument("--out", default=None, help="append one JSON line per release here")
    ap.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--mst-iters", type=int, default=5000, help="mirror-descent steps of MST's final fit (shipped: 5000)")
    ap.add_argument("--aim-pairs", type=int, default=100, help="random 2-way marginals in AIM's workload")
    ap.add_argument("--aim-rounds", type=int, default=None, help="AIM rounds (shipped default 16 d)")
    ap.add_argument("--aim-time-limit", type=float, default=1800.0, help="seconds per AIM run")
    ap.add_argument("--towers", type=int, default=None,
                    help="utility: keep only the N most popular towers of the public map (dpgm_utility.py --towers)")
    ap.add_argument("--mwem-split", type=int, default=8, help="columns per MWEM histogram")
    args = ap.parse_args(argv)
    if args.people < 2 or args.queries < 5 or args.max_items < 1:
        ap.error("--people >= 2, --queries >= 5 and --max-items >= 1 are needed")
    if any(e <= 0 for e in args.epsilons) or (args.delta is not None and not 0 < args.delta < 1):
        ap.error("every --epsilons value must be > 0 and --delta in (0, 1)")
    if args.delta is None and args.kind == "utility":
        args.delta = 1e-5  # cdr, transit: 1/n, once n is known (main)
    if args.mwem_split < 1 or args.aim_pairs < 0:
        ap.error("--mwem-split >= 1 and --aim-pairs >= 0 are needed")
    if args.synthetic is not None and args.synthetic < 1:
        ap.error("--synthetic >= 1 is needed")
    if args.sparse and set(args.peers) != {"mst"}:
        ap.error("--sparse serves MST only (--peers mst)")
    if args.kind == "utility" and args.cache:
        ap.error("--cache serves --kind cdr|transit only")
    if args.towers is not None and (args.kind != "utility" or not 1 <= args.towers <= 1303):
        ap.error("--towers serves --kind utility only, and must be in 1..1303")
    return args


def protocol(people: int, max_items: int, seed: int, n_queries: int = 1000, towers: int | None = None):
    """The table, queries and truth of docs/research/scripts/dpgm_utility.py: ``(src, X, qs, true)``.

    ``src`` is the uncapped 0/1 table (the truth), ``X`` the capped one (what
    the releases see), ``qs`` the queries drawn exactly as dpgm_utility.main
    (with ``towers``, on the public map's most popular towers, as ``--towers`` there).
    """
    from sparkpriv.mechanisms.counting_queries import draw_queries

    src, X = cdr_table(people, max_items, seed, towers)
    distinct = src.sum(1)
    qs = draw_queries(X.shape[1], max_length=int(distinct.max()), n_queries=n_queries, groups=5, seed=seed)
    return src, X, qs, answers(src, qs)


def event_protocol(kind: str, people: int, max_items: int, seed: int, n_queries: int = 1000, cache=None,
                   log=print):
    """The table, queries and truth of docs/research/scripts/dpgm_model_study.py: ``(X, qs, true)``.

    ``X`` is the capped table (scipy CSR, float64), ``qs`` the queries
    ``draw_queries(d, max_length=longest, seed=0)``, ``true`` their answers on
    the uncapped table (which is not returned). With ``cache`` the uncapped
    table is read from, or else saved to, ``cache/<kind>-<people>.npz``.
    """
    from sparkpriv.mechanisms.counting_queries import draw_queries

    t = time.perf_counter()
    path = Path(cache) / f"{kind}-{people}.npz" if cache else None
    if path is not None and path.exists():
        src = sparse.load_npz(path).tocsr()
        log(f"uncapped table read from {path}: {time.perf_counter() - t:.0f} s")
    else:
        src = study.people(kind, people)
        log(f"uncapped table generated: {time.perf_counter() - t:.0f} s")
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            sparse.save_npz(path, src)
    if src.shape[0] != people:
        raise ValueError(f"{path} holds {src.shape[0]} people, not {people}")
    t = time.perf_counter()
    X = study.cap(src, max_items, seed)
    lengths = np.diff(src.indptr)
    longest = int(lengths.max())
    qs = draw_queries(src.shape[1], max_length=longest, n_queries=n_queries, groups=5, seed=0)
    true = study.answers(src, qs.matrix)
    log(f"{kind}: n={src.shape[0]} d={src.shape[1]} longest={longest} mean items {lengths.mean():.2f} "
        f"(capped at {max_items}: {np.diff(X.indptr).mean():.2f}, {X.nnz} ones); cap, queries and truth "
        f"{time.perf_counter() - t:.0f} s")
    return X, qs, true


def score(true, S, qs, n: int) -> dict:
    """Mean relative error per length group (1..5) and over all queries; answers scaled to n.

    ``S`` is a dense 0/1 table (answered as dpgm_utility.py does) or a scipy
    sparse one (answered by dpgm_model_study.answers); both count exactly.
    """
    from sparkpriv.mechanisms.counting_queries import group_summary, relative_errors

    if sparse.issparse(S):
        e = relative_errors(true, study.answers(S, qs.matrix) * (n / S.shape[0]), n)
    else:
        S = np.asarray(S, dtype=np.float64)
        e = relative_errors(true, answers(S, qs) * (n / S.shape[0]), n)
    out = {g["group"]: g["mean_relative_error"] for g in group_summary(e, qs)}
    out["all"] = float(e.mean())
    return out


def gram(X):
    """``(n, c, C)`` of a 0/1 table X (dense or scipy sparse): its rows, column counts and X^T X.

    float64, exact (sums of 0 and 1 below 2^53, whatever their order).
    """
    if sparse.issparse(X):
        X = sparse.csr_matrix(X, dtype=np.float64)
        return X.shape[0], np.asarray(X.sum(0)).ravel(), (X.T @ X).toarray()
    X = np.asarray(X, dtype=np.float64)
    return X.shape[0], X.sum(0), X.T @ X


def describe(S, counts, true, qs, n: int) -> dict:
    """Diagnostics of a synthetic 0/1 table S (scipy sparse), beside its counting-query error.

    As dpgm_model_study.py reports them: mean items per synthetic person, the
    share with at most 2 / 4 / 8 items, and the per-item marginal error
    ``sum |n / |S| * S.sum(0) - counts| / sum counts`` against the capped
    table's item ``counts``. Also the signed errors of the queries: the share
    answered above the truth and the mean of ``(released - true) / max(true, 0.001 n)``.
    """
    lengths = np.diff(S.indptr)
    scale = n / S.shape[0]
    marg = np.asarray(S.sum(0)).ravel() * scale
    released = study.answers(S, qs.matrix) * scale
    return {"mean_items": round(float(lengths.mean()), 3),
            "short": [round(float((lengths <= m).mean()), 4) for m in (2, 4, 8)],
            "marginal_l1": round(float(np.abs(marg - counts).sum() / counts.sum()), 4),
            "over": round(float((released > true).mean()), 4),
            "signed": round(float(((released - true) / np.maximum(true, 0.001 * n)).mean()), 4)}


def pair_l1_scores(X, p, stats=None):
    """MST's selection scores for binary columns: ``||x_ab - n p_a p_b||_1`` for every pair a < b.

    ``x_ab`` is the (2 x 2) marginal of columns a, b of the 0/1 table X; ``p``
    (d, 2) the independent model's 1-way probabilities. Returns ``(a, b, score)``
    over ``itertools.combinations(range(d), 2)`` order. ``stats``: X's
    ``gram(X)`` if already computed (then X is not read).
    """
    n, c, C = gram(X) if stats is None else stats
    d = c.size
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


class SparseBinaryDataset:
    """What MST reads of an mbi ``Dataset`` of binary columns ``t0 .. t{d-1}``, from a 0/1 table.

    Holds ``stats = gram(X)`` (n, the column counts, X^T X), not the table:
    ``project`` gives every 0-, 1- and 2-way marginal as the Factor
    ``mbi.Dataset.project`` gives (float64 counts in C order over the
    attributes as given), ``records`` and ``len(df)`` give n, and the
    vectorized selection reads ``stats``. ``check_sparse`` checks it against
    mbi's ``Dataset``.
    """

    def __init__(self, X):
        from mbi import Domain

        self.stats = gram(X)
        self.attrs = [f"t{j}" for j in range(self.stats[1].size)]
        self.domain = Domain(self.attrs, [2] * len(self.attrs))
        self._index = {a: j for j, a in enumerate(self.attrs)}

    @property
    def records(self) -> int:
        return self.stats[0]

    @property
    def df(self):
        """A frame of n rows and no columns: MST reads ``len(data.df)`` only (``transform_data`` aside)."""
        import pandas as pd

        return pd.DataFrame(index=pd.RangeIndex(self.records))

    def project(self, cols):
        import jax.numpy as jnp
        from mbi import Factor

        cols = [cols] if isinstance(cols, str) else list(cols)
        domain = self.domain.project(cols)
        n, c, C = self.stats
        j = [self._index[a] for a in cols]
        if not j:
            v = np.float64(n)
        elif len(j) == 1:
            v = np.array([n - c[j[0]], c[j[0]]])
        elif len(j) == 2 and j[0] != j[1]:
            a, b = j
            n11 = C[a, b]
            v = np.array([[n - c[a] - c[b] + n11, c[b] - n11], [c[a] - n11, n11]])
        else:
            raise NotImplementedError("SparseBinaryDataset projects on at most 2 distinct attributes")
        return Factor(domain, jnp.asarray(v))


def check_sparse(X, pairs: int = 2000, seed: int = 0, log=print) -> None:
    """Raise unless ``SparseBinaryDataset(X)`` equals mbi's ``Dataset`` of X bit for bit.

    Compares the 0-way, every 1-way and ``pairs`` random 2-way marginals (in
    both orders: values, dtype, shape, domain), the number of records, and
    ``pair_l1_scores`` from the stand-in's statistics against those of the
    dense table. X must fit densely in memory.
    """
    dense = X.toarray() if sparse.issparse(X) else np.asarray(X)
    ref, cols = _binary_dataset(dense)
    sb = SparseBinaryDataset(sparse.csr_matrix(X) if not sparse.issparse(X) else X)
    rng = np.random.default_rng(seed)
    d = len(cols)
    idx = rng.choice(d * (d - 1), size=min(pairs, d * (d - 1)), replace=False)
    a, b = np.divmod(idx, d - 1)
    b = b + (b >= a)
    projections = [()] + [(c,) for c in cols] + [q for i, j in zip(a, b) for q in ((cols[i], cols[j]),
                                                                                     (cols[j], cols[i]))]
    for proj in projections:
        x, y = ref.project(list(proj)), sb.project(list(proj))
        u, v = np.asarray(x.datavector()), np.asarray(y.datavector())
        if x.domain != y.domain or u.dtype != v.dtype or u.shape != v.shape or not np.array_equal(u, v):
            raise AssertionError(f"marginal {proj}: mbi {u} ({u.dtype}), sparse {v} ({v.dtype})")
    if sb.records != ref.records or len(sb.df) != len(ref.df):
        raise AssertionError("number of records differs")
    p = rng.dirichlet([1.0, 1.0], size=d)
    for s, t in zip(pair_l1_scores(dense, p), pair_l1_scores(None, p, sb.stats)):
        if not np.array_equal(s, t):
            raise AssertionError("selection scores differ")
    log(f"check_sparse: {dense.shape[0]} x {d}, {int(dense.sum())} ones: the 0-way, {d} 1-way and "
        f"{len(projections) - 1 - d} 2-way marginals ({len(a)} pairs, both orders) and the "
        f"{d * (d - 1) // 2} selection scores are bit-identical to mbi's Dataset")


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def run_mst(X, eps, delta, seed, n_out, iters=5000, log=print, phases=None):
    """MST's synthetic table (dense, n_out x d) from X: a 0/1 table or a ``SparseBinaryDataset``.

    ``phases`` (a dict), if given, receives each phase's wall time in seconds.
    """
    import networkx as nx
    from mbi import estimation, marginal_oracles
    from snsynth.mst.mst import MSTSynthesizer

    phases = {} if phases is None else phases

    def timed(name, t):
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
        log(f"    MST {name}: {time.perf_counter() - t:.0f} s (peak RSS {_peak_gb():.2f} GB)")

    class VectorizedSelectMST(MSTSynthesizer):
        def measure(self, data, cliques, sigma, weights=None):
            t = time.perf_counter()
            out = super().measure(data, cliques, sigma, weights)
            timed(f"measure {len(cliques[0])}-way", t)
            return out

        def compress_domain(self, data, measurements):
            low = sum(int((np.asarray(m.noisy_measurement) < 3 * m.stddev).sum()) for m in measurements)
            log(f"    MST compression: {low} of {sum(np.size(m.noisy_measurement) for m in measurements)} "
                f"1-way cells below 3 sigma = {3 * measurements[0].stddev:.1f}")
            return super().compress_domain(data, measurements)

        def transform_data(self, data, supports):
            if not isinstance(data, SparseBinaryDataset):
                return super().transform_data(data, supports)
            if not all(np.all(s) for s in supports.values()):
                raise RuntimeError("domain compression changed a binary column; SparseBinaryDataset needs 2 levels")
            return data

        def select(self, data, rho, measurement_log, total, cliques=[]):
            t = time.perf_counter()
            est = estimation.mirror_descent(data.domain, measurement_log, known_total=float(total), iters=1000,
                                            marginal_oracle=marginal_oracles.message_passing_stable)
            t1 = time.perf_counter()
            attrs = list(data.domain.attrs)
            if any(data.domain[c] != 2 for c in attrs):
                raise RuntimeError("domain compression changed a binary column; the vectorized select needs 2 levels")
            p = np.stack([np.asarray(est.project([c]).datavector()) for c in attrs])
            p = p / p.sum(1, keepdims=True)
            if isinstance(data, SparseBinaryDataset):
                a, b, w = pair_l1_scores(None, p, data.stats)
            else:
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
            timed("select: scores and tree", t1)
            log(f"    MST select: {time.perf_counter() - t:.0f} s")
            return list(T.edges)

    np.random.seed(seed)
    if isinstance(X, SparseBinaryDataset):
        data, cols = X, X.attrs
    else:
        data, cols = _binary_dataset(X)
    syn = VectorizedSelectMST(epsilon=eps, delta=delta)
    orig = estimation.mirror_descent

    def md(*a, **k):
        t = time.perf_counter()
        shipped = k.get("iters")
        if shipped == 5000:
            k["iters"] = iters
        out = orig(*a, **k)
        timed("final fit" if shipped == 5000 else "select: fit", t)
        return out

    estimation.mirror_descent = md
    try:
        syn.MST(data, eps, delta)
    finally:
        estimation.mirror_descent = orig
    t = time.perf_counter()
    out = syn.synthesizer.synthetic_data(rows=n_out)
    timed("sampling", t)
    t = time.perf_counter()
    out = syn.undo_compress_fn(out).df[cols].to_numpy(np.float64)
    timed("undo compression", t)
    return out


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


def log(msg: str) -> None:
    print(msg, flush=True)


def main(argv=None):
    args = parse_args(argv)
    t0 = time.perf_counter()
    if args.kind == "utility":
        src, X, qs, true = protocol(args.people, args.max_items, args.seed, args.queries, args.towers)
        del src
    else:
        X, qs, true = event_protocol(args.kind, args.people, args.max_items, args.seed, args.queries,
                                     args.cache, log)
    n, d = X.shape
    delta = args.delta if args.delta is not None else (1e-5 if args.kind == "utility" else 1.0 / n)
    n_out = args.synthetic or n
    print(f"table: {n} people x {d} towers; {time.perf_counter() - t0:.0f} s", flush=True)
    if args.check_sparse:
        check_sparse(np.asarray(np.random.default_rng(args.seed).random((500, 12)) < [0.0, 1.0] + [0.3] * 10,
                                dtype=np.float64), log=log)
        check_sparse(X, log=log)
        return
    counts = np.asarray(X.sum(0)).ravel()
    if args.kind != "utility":
        log(f"capped table: mean items {X.nnz / n:.3f}, at most 2 / 4 / 8 items: "
            f"{[round(float((np.diff(X.indptr) <= m).mean()), 4) for m in (2, 4, 8)]}")
    if args.sparse:
        t = time.perf_counter()
        X = SparseBinaryDataset(X)
        log(f"statistics (n, column counts, X^T X): {time.perf_counter() - t:.0f} s "
            f"(peak RSS {_peak_gb():.2f} GB)")
    elif sparse.issparse(X):
        X = X.toarray()
    results = {}
    for peer in args.peers:
        for eps in args.epsilons:
            t = time.perf_counter()
            name = f"{peer}, eps={eps:g}"
            phases = {}
            if peer == "mst":
                S = run_mst(X, eps, delta, args.seed, n_out, iters=args.mst_iters, log=log, phases=phases)
            elif peer == "aim":
                S = run_aim(X, eps, delta, args.seed, n_out, args.aim_pairs, args.aim_rounds, args.aim_time_limit)
            else:
                S = run_mwem(X, eps, args.seed, n_out, args.mwem_split)
            secs = time.perf_counter() - t
            if S is None:
                results[name] = {"timeout": True, "seconds": secs}
                print(f"{name:24s} no release within the time limit ({secs:.0f} s)", flush=True)
                continue
            S = sparse.csr_matrix(S)
            extra = describe(S, counts, true, qs, n)
            results[name] = score(true, S, qs, n)
            results[name]["seconds"] = secs
            if phases:
                results[name]["phases"] = {k: round(v, 1) for k, v in phases.items()}
            r = results[name]
            print(f"{name:24s} " + " ".join(f"{r[g]:.4f}" for g in range(1, 6)) +
                  f"  mean {r['all']:.4f}  ({secs:.0f} s)", flush=True)
            if extra:
                log(f"    synthetic table: {json.dumps(extra)}")
                r.update(extra)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps({"name": name, "kind": args.kind, "people": n, "max_items": args.max_items,
                                        "synthetic": n_out, "delta": delta, "mst_iters": args.mst_iters,
                                        "result": {str(g): v for g, v in r.items()},
                                        "peak_rss_gb": round(_peak_gb(), 2)}) + "\n")
    print(json.dumps({"args": vars(args), "results": {k: {str(g): v for g, v in r.items()}
                                                      for k, r in results.items()}}))


if __name__ == "__main__":
    main()
