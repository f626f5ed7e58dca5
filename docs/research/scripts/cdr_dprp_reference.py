"""Reference rows for the DPRP counting-query table of docs/research/cdr-dprp-records.md (numpy, no Spark).

On a generated CDR event table (Parquet, ``caller_id, tower_id``), with the
queries ``sparkpriv evaluate counting-queries`` draws (seed 0, 1,000 queries,
5 groups, ``max_length`` = the largest person), prints the per-group mean
relative error of:

* two baselines: a release answering ``n`` to every query (everybody visited
  every item) and one answering 0 (an empty release);
* DPRP of the bounded records WITHOUT noise: the records capped at ``L`` items
  (``cap_items``, a fixed key), then ``gram_partial_sparse``, ``solve`` and
  ``reconstruct_sparse_items(..., noise=None)`` with threshold 0.5: what the
  release computes before noise, for each ``(k2, k1)``.

Usage::

    python docs/research/scripts/cdr_dprp_reference.py /tmp/helper-dprp/cdr-200k --max-items 32 --k 64,256 --k 8,512
"""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow.parquet as pq

from sparkpriv.mechanisms import counting_queries as cq
from sparkpriv.mechanisms import dprp as core
from sparkpriv.mechanisms import dprp_records as rcore
from sparkpriv.mechanisms.projection import draw_projection_matrix
from sparkpriv.mechanisms.sparse import ItemCap, cap_items, dedupe_rows

D = 1303


def _summary(name, err, qs, items_per_person):
    groups = [round(g["mean_relative_error"], 3) for g in cq.group_summary(err, qs)]
    print(f"{name}: groups {groups} all {float(err.mean()):.3f} items/person {items_per_person:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("events")
    ap.add_argument("--max-items", type=int, default=32)
    ap.add_argument("--k", action="append", default=None, help="K2,K1 (repeatable)")
    args = ap.parse_args()
    t = pq.read_table(args.events, columns=["caller_id", "tower_id"])
    p = t.column("caller_id").to_numpy()
    it = t.column("tower_id").to_numpy()
    o = np.argsort(p, kind="stable")
    p, it = p[o], it[o]
    off = np.r_[np.flatnonzero(np.r_[True, p[1:] != p[:-1]]), p.size].astype(np.int64)
    off, idx, _ = dedupe_rows(off, it.astype(np.int32))
    n = off.size - 1
    qs = cq.draw_queries(D, max_length=int(np.diff(off).max()), n_queries=1000, groups=5, seed=0)
    true = cq.answer_queries(off, idx, qs.matrix)
    _summary("everyone visits every item", cq.relative_errors(true, np.full(qs.size, float(n)), n), qs, D)
    _summary("empty release", cq.relative_errors(true, np.zeros(qs.size), n), qs, 0)
    boff, bidx, _, _ = cap_items(off, idx, None, np.arange(n), ItemCap(args.max_items), 12345)
    _summary(f"bounded records (L = {args.max_items})",
             cq.relative_errors(true, cq.answer_queries(boff, bidx, qs.matrix), n), qs, bidx.size / n)
    _, (G,) = core.gram_from_partial(rcore.gram_partial_sparse(boff, bidx, None, D), D, 1)
    for spec in args.k or ["64,256"]:
        k2, k1 = (int(x) for x in spec.split(","))
        R = draw_projection_matrix(D, k1, 1)
        (M,) = core.solve([G], R, k2)
        ro, ri = rcore.reconstruct_sparse_items(boff, bidx, None, R, M, None, None)
        _summary(f"DPRP without noise, k2 = {k2}, k1 = {k1}",
                 cq.relative_errors(true, cq.answer_queries(ro, ri, qs.matrix), n), qs, ri.size / n)


if __name__ == "__main__":
    main()
