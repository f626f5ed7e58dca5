"""Counting-query error of the DPGM release on a generated CDR-like table (docs/research/dpgm.md).

numpy only: people are drawn with the same generator as the Spark event tables
(sparkpriv.spark.generate_events.person_items on the public map), each person's
distinct towers capped at L (a uniformly random subset). Compared, on the
paper's protocol (1,000 queries in 5 length groups, relative error with the
sanity bound 0.001 n): the DPGM (DP k-means + one RBM per cluster), the
k-means + independent-Bernoulli baseline of notebooks/04_cdr.ipynb at the
same epsilon, the queries answered from DP per-tower counts under independence
(the counts mechanism at the same epsilon, replace-one), an empty release, and
the models at a huge epsilon (model error only).

    python docs/research/scripts/dpgm_utility.py --people 20000 --epsilon 1
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def popular_towers(count: int, seed: int):
    """The ``count`` most popular towers of the PUBLIC map of ``seed`` (its Zipf popularity,
    not a count of anybody's records), in decreasing popularity: a public choice of columns."""
    from sparkpriv.spark.generate_events import CDR_MODEL, event_map

    if not 1 <= count <= CDR_MODEL.items:
        raise ValueError(f"towers must be in 1..{CDR_MODEL.items}, got {count}")
    _, pop, _ = event_map(CDR_MODEL, seed)
    return np.argsort(-pop, kind="stable")[:count]


def cdr_table(people: int, max_items: int, seed: int, towers: int | None = None):
    """``(src, X)``: the uncapped 0/1 table and the table capped at ``max_items`` per person.

    With ``towers``, only the ``popular_towers(towers, seed)`` are kept (column j is the
    j-th most popular), before the cap: the same people, each holding the chosen towers
    of their full record.
    """
    from sparkpriv.spark.generate_events import CDR_MODEL, event_map, person_items

    _, pop, nbr = event_map(CDR_MODEL, seed)
    rng = np.random.default_rng(seed + 1)
    p, c = person_items(CDR_MODEL, pop, nbr, rng, people)
    d = CDR_MODEL.items
    if towers is not None:
        column = np.full(d, -1)
        column[popular_towers(towers, seed)] = np.arange(towers)
        keep = column[c] >= 0
        p, c, d = p[keep], column[c[keep]], towers
    src = np.zeros((people, d), dtype=np.float64)
    src[p, c] = 1.0
    # cap: keep a uniformly random subset of at most L items per person
    key = rng.random(p.size)
    order = np.lexsort((key, p))
    ps = p[order]
    start = np.searchsorted(ps, np.arange(people))
    rank = np.arange(ps.size) - start[ps]
    keep = order[rank < max_items]
    X = np.zeros((people, d))
    X[p[keep], c[keep]] = 1.0
    return src, X


def csr(X):
    rows, cols = np.nonzero(X)
    counts = np.bincount(rows, minlength=X.shape[0])
    return np.concatenate([[0], np.cumsum(counts)]), cols


def answers(X, qs):
    from sparkpriv.mechanisms.counting_queries import answer_queries

    off, idx = csr(X)
    return answer_queries(off, idx, qs.matrix)


def baseline(X, eps, k, iterations, max_items, n_out, seed):
    from sparkpriv import release_kmeans_array
    from sparkpriv.privacy.random import insecure_fixed_seed

    d = X.shape[1]
    with insecure_fixed_seed(seed):
        r = release_kmeans_array(X, k=k, epsilon=eps, delta=1e-5, iterations=iterations, variant="linear",
                                 lower=np.zeros(d), upper=np.ones(d), row_bound=float(np.sqrt(max_items)))
    probs = np.clip(np.asarray(r.model.centers), 0, 1)
    w = np.clip(np.asarray(r.model.counts), 0, None)
    rng = np.random.default_rng(seed)
    cl = rng.choice(k, size=n_out, p=w / w.sum())
    return (rng.random((n_out, d)) < probs[cl]).astype(float)


def independence(X, eps, max_items, qs, seed):
    """Answers from DP per-item counts (discrete Laplace, replace-one) under independence."""
    from sparkpriv.mechanisms.counting_queries import answers_under_independence
    from sparkpriv.mechanisms.counts import CountsParams, finalize_counts, plan_counts
    from sparkpriv.privacy.random import stream

    n, d = X.shape
    plan = plan_counts(CountsParams(epsilon=eps, max_keys=max_items, neighbors="replace-one"), d)
    res = finalize_counts(X.sum(axis=0).astype(np.int64), plan, stream(seed, 0))
    return answers_under_independence(res.value, n, qs.matrix)


def main(argv=None):
    from threadpoolctl import threadpool_limits

    from sparkpriv.mechanisms.counting_queries import draw_queries, group_summary, relative_errors
    from sparkpriv.mechanisms.dpgm import DPGMParams, fit_dpgm_array, synthesize

    ap = argparse.ArgumentParser()
    ap.add_argument("--people", type=int, default=20000)
    ap.add_argument("--max-items", type=int, default=32)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--sampling-rate", type=float, default=0.05)
    ap.add_argument("--epochs", type=float, default=20.0)
    ap.add_argument("--clip", type=float, default=10.0)
    ap.add_argument("--lr", type=float, default=None, help="Adam rate (default: the library's, by cluster)")
    ap.add_argument("--kmeans-share", type=float, default=0.3)
    ap.add_argument("--average-tail", type=float, default=None, help="DPGMParams.average_tail (default: the library's)")
    ap.add_argument("--epochs-scale", type=float, default=1.0, help="multiply --epochs (more steps, same q)")
    ap.add_argument("--baseline-k", type=int, default=20)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--skip-huge", action="store_true")
    ap.add_argument("--only-dpgm", action="store_true")
    ap.add_argument("--huge", type=float, default=1e4)
    ap.add_argument("--synthetic", type=int, default=None, help="synthetic people (answers scaled to n)")
    ap.add_argument("--baseline-seeds", type=int, default=1)
    ap.add_argument("--min-batch", type=int, default=None, help="DPGMParams.min_batch (per-cluster rates)")
    ap.add_argument("--towers", type=int, default=None,
                    help="keep only the N most popular towers of the public map (default: all 1,303)")
    ap.add_argument("--length-strata", default=None,
                    help="DPGMParams.length_strata: comma-separated interior edges, or 0 for none (default: the library's)")
    args = ap.parse_args(argv)
    threadpool_limits(1)
    t0 = time.perf_counter()
    src, X = cdr_table(args.people, args.max_items, args.seed, args.towers)
    n, d = X.shape
    distinct = src.sum(1)
    qs = draw_queries(d, max_length=int(distinct.max()), n_queries=args.queries, groups=5, seed=args.seed)
    true = answers(src, qs)
    print(f"table: {n} people x {d} towers, mean {distinct.mean():.2f} distinct (max {int(distinct.max())}), "
          f"after cap L={args.max_items}: mean {X.sum(1).mean():.2f}; {time.perf_counter() - t0:.0f} s")
    results = {}

    def score(name, S):
        e = relative_errors(true, answers(S, qs) * (n / S.shape[0]), n)
        results[name] = {g["group"]: g["mean_relative_error"] for g in group_summary(e, qs)}
        results[name]["all"] = float(e.mean())
        print(f"{name:40s} " + " ".join(f"{results[name][g]:.4f}" for g in range(1, 6)) +
              f"  mean {e.mean():.4f}  ({time.perf_counter() - t0:.0f} s)", flush=True)

    m = n if args.synthetic is None else args.synthetic
    if not args.only_dpgm:
        score("empty release", np.zeros((n, d)))
    if not args.only_dpgm:
        for b in range(args.baseline_seeds):
            e = relative_errors(true, independence(X, args.epsilon, args.max_items, qs, args.seed + b), n)
            name = f"independence from DP counts, eps={args.epsilon:g}, seed {args.seed + b}"
            results[name] = {g["group"]: g["mean_relative_error"] for g in group_summary(e, qs)}
            results[name]["all"] = float(e.mean())
            print(f"{name:40s} " + " ".join(f"{results[name][g]:.4f}" for g in range(1, 6)) +
                  f"  mean {e.mean():.4f}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    eps_list = [args.epsilon] + ([] if args.skip_huge else [args.huge])
    for eps in eps_list:
        for b in range(0 if args.only_dpgm else args.baseline_seeds):
            score(f"k-means + Bernoulli, eps={eps:g}, seed {args.seed + b}",
                  baseline(X, eps, args.baseline_k, 8, args.max_items, n, args.seed + b))
        # PLD at every epsilon: at 10^4 the RDP accountant states the k-means, lengths and item
        # counts (calibrated at their shares) above the whole request and refuses the release
        params = DPGMParams(epsilon=eps, delta=1e-5, k=args.k, model="rbm", kmeans_share=args.kmeans_share,
                            row_bound=float(np.sqrt(args.max_items)), clip=args.clip,
                            sampling_rate=args.sampling_rate, epochs=args.epochs * args.epochs_scale,
                            learning_rate=args.lr, hidden=args.hidden, accountant="pld",
                            min_batch=args.min_batch,
                            length_strata=None if args.length_strata is None else
                            tuple(int(v) for v in args.length_strata.split(",")),
                            **({} if args.average_tail is None else {"average_tail": args.average_tail}))
        model, plan = fit_dpgm_array(X, params, seed=args.seed)
        print(f"  DPGM plan: noise multiplier {plan.noise_multiplier:.3f}, steps {plan.steps}, "
              f"epsilon spent {plan.epsilon_spent():.4f}, cluster sizes {np.round(model.sizes).astype(int)}, "
              f"batches per update {model.plan_public['batches']}")
        score(f"DPGM (k-means + RBM), eps={eps:g}", synthesize(model, m, seed=args.seed))
    print("groups 1..5 mean relative error; paper CDR eps=1: 0.017 (short) .. 0.0012 (long)")
    print(json.dumps({"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
