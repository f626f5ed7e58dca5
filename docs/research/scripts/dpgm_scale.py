"""DPGM at the paper's sizes on Spark: counting-query error and wall time (docs/research/dpgm.md "At scale").

On a generated event table (``sparkpriv generate cdr|transit``), for each epsilon:
a DPGM release of the people's capped item sets (``release_dpgm`` on bounded
records, delta = 1/n), a synthetic table of ``--synthetic`` people from the
released model (post-processing), and the paper's counting-query protocol
(1,000 queries in 5 length groups, relative error with the sanity bound
0.001 n) against the real, uncapped table. Beside it, at the same epsilon, the
queries answered from DP per-item counts under independence (a counts release,
replace-one) and the release's own k-means part alone (independent Bernoullis at
the released centres, post-processing); once: an empty release, and a uniform random sample of the REAL
people of the synthetic table's size (the error a perfect model would still
have from the synthetic table's size alone). Every phase is timed.

    python docs/research/scripts/dpgm_scale.py --events /data/cdr-4427486 --epsilons 1 --synthetic 500000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

import numpy as np


def _bernoulli_answers(model, people: int, qs, n: int, chunk: int = 20_000):
    """The k-means part of the release alone: ``people`` records from the mixture of independent
    Bernoullis at the released centres, weighted by the noisy sizes (post-processing of the same
    release); answers scaled to ``n``. Returns (answers, scale)."""
    from sparkpriv.mechanisms.counting_queries import answer_queries

    rng = np.random.default_rng(12345)
    probs = np.clip(np.asarray(model.centers, float), 0.0, 1.0)
    w = np.clip(np.asarray(model.sizes, float), 0.0, None)
    w = w / w.sum() if w.sum() > 0 else np.full(w.size, 1.0 / w.size)
    total = np.zeros(qs.matrix.shape[1])
    for start in range(0, people, chunk):
        m = min(chunk, people - start)
        cl = rng.choice(probs.shape[0], size=m, p=w)
        rows, cols = np.nonzero(rng.random((m, probs.shape[1]), dtype=np.float32) < probs[cl])
        off = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=m))])
        total += answer_queries(off, cols, qs.matrix)
    return total, n / people


SIZE_BINS = (1, 2, 4, 8, 16, 32, 64, 128)


def _items_profile(df) -> dict:
    """How many items the people of ``df`` (an ``items`` array column) have: the mean and the
    share of people with at most 1, 2, 4, ... 128 items (long queries are answered mostly by the
    people with few items, so a model that gets this wrong is wrong on them)."""
    from pyspark.sql import functions as F

    sizes = df.select(F.size("items").alias("m"))
    aggs = [F.mean("m").alias("mean"), F.count(F.lit(1)).alias("n")]
    aggs += [F.sum(F.when(F.col("m") <= b, 1).otherwise(0)).alias(f"le{b}") for b in SIZE_BINS]
    row = sizes.agg(*aggs).first()
    n = max(int(row["n"]), 1)
    return {"mean": float(row["mean"] or 0.0), **{f"le{b}": row[f"le{b}"] / n for b in SIZE_BINS}}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", required=True, help="event table (Parquet) of sparkpriv generate")
    ap.add_argument("--kind", default="cdr", choices=["cdr", "transit"])
    ap.add_argument("--epsilons", default="1", help="comma-separated epsilons")
    ap.add_argument("--synthetic", type=int, default=500_000, help="synthetic people per release")
    ap.add_argument("--also-synthetic", type=int, default=None,
                    help="also synthesize this many people from each release (and a real sample of that size)")
    ap.add_argument("--max-items", type=int, default=32)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--sampling-rate", type=float, default=0.002)
    ap.add_argument("--epochs", type=float, default=0.8)
    ap.add_argument("--learning-rate", type=float, default=None,
                    help="Adam rate of every cluster (default: the library's, by cluster)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--clip", type=float, default=10.0)
    ap.add_argument("--average-tail", type=float, default=None,
                    help="DPGMParams.average_tail (default: the library's)")
    ap.add_argument("--lr-schedule", default=None, help="DPGMParams.lr_schedule (default: the library's)")
    ap.add_argument("--length-share", type=float, default=None,
                    help="share of epsilon of the length histograms (default: the library's; 0: none)")
    ap.add_argument("--length-strata", default=None, type=lambda v: tuple(int(x) for x in v.split(",")),
                    help="DPGMParams.length_strata: comma-separated interior edges, or 0 for none (default: the library's)")
    ap.add_argument("--marginal-share", type=float, default=None,
                    help="DPGMParams.marginal_share (default: the library's, 0.1 for the rbm; 0: none): the per-item counts and the shift")
    ap.add_argument("--marginal-samples", type=int, default=None,
                    help="DPGMParams.marginal_samples (default: the library's)")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--workdir", default="/tmp/dpgm-scale")
    ap.add_argument("--master", default=None, help="Spark master (default local[*])")
    ap.add_argument("--driver-memory", default="6g")
    ap.add_argument("--no-baselines", action="store_true", help="skip the counts baseline and the sample")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--variants", default=None,
                    help="JSON list of overrides run for each epsilon on one truth, e.g. "
                         "'[{\"hidden\": 200}, {\"epochs\": 2.4}, {\"k\": 30}]' (keys: k, hidden, epochs, "
                         "sampling_rate, learning_rate, clip, length_share, average_tail, lr_schedule, length_strata, "
                         "marginal_share, marginal_samples)")
    args = ap.parse_args(argv)
    # checked before Spark starts and the truth is computed, so a typo costs nothing
    variants = json.loads(args.variants) if args.variants else [{}]
    allowed = {"k", "hidden", "epochs", "sampling_rate", "learning_rate", "clip", "length_share", "average_tail",
               "lr_schedule", "length_strata", "marginal_share", "marginal_samples"}
    for v in variants:
        if set(v) - allowed:
            raise SystemExit(f"--variants: unknown keys {sorted(set(v) - allowed)}; allowed {sorted(allowed)}")

    from pyspark.sql import functions as F

    from sparkpriv.api import release_counts, release_dpgm
    from sparkpriv.io.synthesize import synthesize_dpgm
    from sparkpriv.mechanisms import counting_queries as cq
    from sparkpriv.mechanisms.counts import KeyDomain
    from sparkpriv.spark.counting_queries import answer_release
    from sparkpriv.spark.events import bound_contributions
    from sparkpriv.spark.generate_events import CDR_MODEL, TRANSIT_MODEL
    from sparkpriv.spark.session import get_spark

    model = CDR_MODEL if args.kind == "cdr" else TRANSIT_MODEL
    person, item = ("caller_id", "tower_id") if args.kind == "cdr" else ("card_id", "station_id")
    conf = {"spark.driver.memory": args.driver_memory, "spark.sql.shuffle.partitions": "16"}
    if args.master:
        conf["spark.master"] = args.master
    spark = get_spark(conf)
    d = model.items
    vocabulary = f"0..{d - 1}"
    events = spark.read.parquet(args.events)
    os.makedirs(args.workdir, exist_ok=True)
    out: dict = {"events": args.events, "kind": args.kind, "args": vars(args), "runs": []}

    t0 = time.perf_counter()
    truth = bound_contributions(events, person=person, item=item, max_items=1 << 30,
                                vocabulary=vocabulary).df.persist()
    try:
        longest = int(truth.select(F.max(F.size("items"))).first()[0] or 1)
        out["truth_items"] = _items_profile(truth)
        qs = cq.draw_queries(d, max_length=longest, n_queries=args.queries, groups=5, seed=0)
        true_a, n = answer_release(truth, qs.matrix, items_col="items")
        sample_a = n_sample = None
        if not args.no_baselines:  # a uniform random sample of the real people, as many as synthesized
            frac = min(1.0, args.synthetic / n)
            sample_a, n_sample = answer_release(truth.sample(False, frac, seed=1), qs.matrix, items_col="items")
            if args.also_synthetic:
                big = answer_release(truth.sample(False, min(1.0, args.also_synthetic / n), seed=2), qs.matrix,
                                     items_col="items")
    finally:
        truth.unpersist()
    out.update(n=int(n), d=d, longest=longest, truth_seconds=time.perf_counter() - t0)
    print(f"truth: {n} people, longest {longest} items, {out['truth_seconds']:.1f} s", flush=True)

    def summary(a, scale):
        e = cq.relative_errors(true_a, a * scale, n)
        return {"mean": float(e.mean()), "groups": [g["mean_relative_error"] for g in cq.group_summary(e, qs)]}

    out["empty"] = summary(np.zeros_like(true_a), 1.0)
    if sample_a is not None:
        out["real_sample"] = dict(summary(sample_a, n / max(n_sample, 1)), people=int(n_sample))
        print("real sample of the synthetic size:", json.dumps(out["real_sample"]), flush=True)
        if args.also_synthetic:
            out["real_sample_also"] = dict(summary(big[0], n / max(big[1], 1)), people=int(big[1]))
            print("real sample of the --also-synthetic size:", json.dumps(out["real_sample_also"]), flush=True)
    delta = 1.0 / n
    for eps, variant in [(float(e), v) for e in args.epsilons.split(",") for v in variants]:
        o = {**{a: getattr(args, a) for a in allowed}, **variant}
        run: dict = {"epsilon": eps, "delta": delta, "variant": variant}
        rel_dir = os.path.join(args.workdir, f"release-{eps:g}")
        syn_dir = os.path.join(args.workdir, f"synthetic-{eps:g}")
        for p in (rel_dir, syn_dir):
            shutil.rmtree(p, ignore_errors=True)
        records = bound_contributions(events, person=person, item=item, max_items=args.max_items,
                                      vocabulary=vocabulary)
        t = time.perf_counter()
        rel = release_dpgm(records, epsilon=eps, delta=delta, k=o["k"], sampling_rate=o["sampling_rate"],
                           epochs=o["epochs"], learning_rate=o["learning_rate"], hidden=o["hidden"],
                           clip=o["clip"], length_share=o["length_share"], ledger=None, source=args.events,
                           **{a: o[a] for a in ("average_tail", "lr_schedule", "length_strata", "marginal_share",
                                                "marginal_samples") if o[a] is not None})
        rel.write(rel_dir)
        run["release_seconds"] = time.perf_counter() - t
        pub = rel.public
        run["steps"] = pub["steps"]
        run["noise_multiplier"] = pub["noise_multiplier"]
        run["length_noise_std"] = (pub.get("lengths") or {}).get("std")
        run["item_count_noise_std"] = (pub.get("item_counts") or {}).get("std")
        run["marginal_calibration"] = rel.model.plan_public.get("marginal_calibration")
        run["cluster_sizes"] = [round(float(v)) for v in rel.model.sizes]
        t = time.perf_counter()
        syn = synthesize_dpgm(rel_dir, rows=args.synthetic, output=syn_dir)
        run["synthesize_seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        syn_df = spark.read.parquet(syn.output)
        syn_a, n_syn = answer_release(syn_df, qs.matrix, items_col="items", item_ids=vocabulary)
        run["answer_seconds"] = time.perf_counter() - t
        run["dpgm"] = summary(syn_a, n / max(n_syn, 1))
        run["dpgm_items"] = _items_profile(syn_df)
        if args.also_synthetic:
            t = time.perf_counter()
            big_dir = os.path.join(args.workdir, f"synthetic-also-{eps:g}")
            shutil.rmtree(big_dir, ignore_errors=True)
            big_syn = synthesize_dpgm(rel_dir, rows=args.also_synthetic, output=big_dir)
            big_a, n_big = answer_release(spark.read.parquet(big_syn.output), qs.matrix, items_col="items",
                                          item_ids=vocabulary)
            run["dpgm_also"] = dict(summary(big_a, n / max(n_big, 1)), people=int(n_big),
                                    seconds=time.perf_counter() - t)
        run["kmeans_bernoulli"] = summary(*_bernoulli_answers(rel.model, args.synthetic, qs, n))
        if not args.no_baselines and not variant:
            t = time.perf_counter()
            crec = bound_contributions(events, person=person, item=item, max_items=args.max_items,
                                       vocabulary=vocabulary)
            crel = release_counts(crec, domain=KeyDomain.product(item, range(0, d)), epsilon=eps,
                                  neighbors="replace-one", ledger=None, source=args.events)
            counts = crel.table.orderBy(item).select("noisy_count").toPandas()["noisy_count"].to_numpy()
            run["counts_seconds"] = time.perf_counter() - t
            run["independence"] = summary(cq.answers_under_independence(counts, n, qs.matrix), 1.0)
        out["runs"].append(run)
        print(json.dumps(run), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
