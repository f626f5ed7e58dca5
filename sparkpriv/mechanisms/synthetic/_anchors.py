"""Anchor strata: the synthetic model's second measurement and its fit (docs/math.md section 10,
"Anchor strata"; post-processing apart from :func:`strata_fn`'s measurement).

The first measurement (lengths, per-item counts) gives a model in which items meet only through
how many items people hold. People who hold popular items differ, though: who views the
checkout page views the basket page; who buys beer often buys crisps. The anchor strata
measure that once, at the same per-person sensitivity as the per-item counts:

* the items are ranked by the first release's (shrunk) counts: public. The ``K`` most popular
  are the **anchors**; a person's stratum is the highest-ranked anchor they hold (stratum
  ``K``: none). ``K`` is chosen after the first release (:func:`choose_anchors`), from it
  alone: the anchors whose stratum the first model expects to hold at least ``ANCHOR_STDS``
  noise standard deviations of people;
* each person adds, in their stratum's row only, a 1 in the bin of their number of items
  (:func:`strata_length_edges`: ten coarse bins, fewer noisy cells per stratum than the length
  histogram's) and a 1 at each of their at most ``L - 1``
  highest-ranked other items among the ``M`` most popular (the anchor itself and the anchors
  above it are never counted: structurally 0). So a person's vector has at most ``L`` ones,
  all in one row; a replaced person moves the vector by at most ``sqrt(2 L)`` in L2 (``x . x'
  >= 0``), ``sqrt(L)`` under add-remove: the per-item counts' sensitivity
  (:func:`strata_fn`; checked by enumeration in the tests). Discrete Gaussian noise, once.

The fit (:func:`fit_strata`, no budget) shrinks every noisy cell towards what the first model
implies for it (empirical Bayes, the prior variance fitted to all cells), makes the strata's
lengths add up to the released length distribution (iterative proportional fitting; within a bin
a stratum's people are spread as the released distribution spreads them), and then
rakes the strata's item profiles so that the model's expected count of every item equals the
first model's (an anchor's is at least what its measured stratum holds: the first model, drawing
items with replacement, is low for items many people hold): the strata add
who-holds-what-with-what, not new per-item counts.
"""

from __future__ import annotations

import numpy as np

from sparkpriv.mechanisms.synthetic._post import expand_bins

__all__ = ["ANCHOR_STDS", "MIN_ANCHORS", "TOP_ITEMS", "STRATA_LENGTH_CUTS", "strata_length_edges", "strata_fn",
           "strata_size", "choose_anchors", "implied_strata",
           "fit_strata", "Strata"]

ANCHOR_STDS = 10.0  # an anchor's stratum must be expected to hold this many noise stds of people
TOP_ITEMS = 1024  # M: the strata's item counts cover the M most popular items (the rest: the global profile)
MIN_ANCHORS = 4  # fewer anchors than this: the strata's budget measures the per-item counts again instead
RAKE_STEPS = 12
RAKE_ROUNDS = 3
PRIOR_SD = 0.5  # relative prior sd of a stratum's row total around the first model's
# the first lengths of the strata's length bins (then the length limit): fewer, wider bins than the length
# histogram's, so a stratum's lengths carry less noise; paired over the utility suite against the histogram's
# 24 bins spread evenly: 14 cells better, none worse, BMS-WebView-2's popular items at epsilon 1 0.0310 -> 0.0298
# (docs/research/synthesizer.md)
STRATA_LENGTH_CUTS = (0, 1, 2, 3, 5, 8, 13, 22, 40)


def strata_length_edges(limit: int) -> np.ndarray:
    """The strata's length bins over ``0 .. limit`` (public, from ``limit`` alone): the cuts of
    :data:`STRATA_LENGTH_CUTS` below ``limit``, then ``limit`` (that many items or more)."""
    limit = int(limit)
    return np.asarray([c for c in STRATA_LENGTH_CUTS if c < limit] + [limit], dtype=np.int64)


def strata_size(K: int, M: int, bins: int) -> int:
    """Length of the strata vector: ``K + 1`` rows of ``M`` item cells then ``bins`` length bins."""
    return (int(K) + 1) * (int(M) + int(bins))


def strata_fn(rank: np.ndarray, K: int, M: int, L: int, edges: np.ndarray):
    """Block of records bounded at the length limit -> the strata vector (module docstring).

    ``rank[i]``: item ``i``'s public rank (0 the most popular); ``K`` anchors (ranks
    ``0 .. K-1``), ``M >= K`` measured items (ranks ``0 .. M-1``), at most ``L - 1`` other
    items per person, ``edges`` the length bins (:func:`strata_length_edges`).
    Row ``s`` (``0 .. K``) of the result is ``[item cells by rank (M), length bins]``.
    """
    rank = np.asarray(rank, dtype=np.int64)
    edges = np.asarray(edges, dtype=np.int64)
    K, M, L = int(K), int(M), int(L)
    width = M + edges.size
    size = (K + 1) * width

    def strata(block):
        off = np.asarray(block.offsets, dtype=np.int64)
        n = off.size - 1
        out = np.zeros(size, dtype=np.float64)
        if n == 0:
            return out
        m = np.diff(off)
        r = rank[np.asarray(block.indices, dtype=np.int64)]
        row = np.repeat(np.arange(n, dtype=np.int64), m)
        best = np.full(n, np.iinfo(np.int64).max)
        np.minimum.at(best, row, r)
        comp = np.where(best < K, best, K)
        lbin = np.searchsorted(edges, np.minimum(m, edges[-1]), side="right") - 1
        np.add.at(out, comp * width + M + lbin, 1.0)
        # the other measured items: rank < M, not the person's anchor (rank == comp)
        keep = (r < M) & (r != comp[row])
        rr, kr = row[keep], r[keep]
        order = np.lexsort((kr, rr))  # by person, then by rank (highest-ranked first)
        rr, kr = rr[order], kr[order]
        pos = np.arange(rr.size) - np.searchsorted(rr, rr, side="left")
        sel = pos < (L - 1)
        np.add.at(out, comp[rr[sel]] * width + kr[sel], 1.0)
        return out

    return strata


def implied_strata(lengths: np.ndarray, profile_anchor: np.ndarray, n: float):
    """What the first model implies per stratum: ``(people (K+1,), length distributions (K+1, limit+1))``.

    A person of ``m`` draws from the profile is in stratum ``s`` when they draw anchor ``s`` and no
    anchor above it: ``(1 - W_<s)^m - (1 - W_<=s)^m``, ``W`` the anchors' cumulative profile.
    """
    lam = np.asarray(lengths, dtype=np.float64)
    lam = lam / max(lam.sum(), 1e-300)
    m = np.arange(lam.size, dtype=np.float64)
    W = np.concatenate([[0.0], np.cumsum(np.asarray(profile_anchor, dtype=np.float64))])
    W = np.clip(W, 0.0, 1.0)
    K = W.size - 1
    miss = (1.0 - W[:, None]) ** m[None, :]  # (K + 1, limit + 1)
    g = np.empty((K + 1, lam.size))
    g[:K] = lam[None, :] * (miss[:-1] - miss[1:])
    g[K] = lam * miss[K]
    people = float(n) * g.sum(axis=1)
    return people, g / np.maximum(g.sum(axis=1, keepdims=True), 1e-300)


def choose_anchors(lengths: np.ndarray, profile: np.ndarray, order: np.ndarray, n: float, std: float,
                   k_max: int) -> int:
    """``K``: the longest run of top-ranked items whose implied strata each hold at least
    ``ANCHOR_STDS`` noise stds of people, or 0 (none) when that run is shorter than ``MIN_ANCHORS``
    (and ``k_max`` allows as many): a handful of strata does not pay for its share of the budget,
    which then measures the per-item counts again (paired on groceries at epsilon 0.5, 3 anchors:
    uniform 0.131 -> 0.117; docs/research/synthesizer.md). Post-processing of the first release."""
    k_max = int(min(k_max, len(order)))
    if k_max <= 0:
        return 0
    people, _ = implied_strata(lengths, np.asarray(profile)[np.asarray(order[:k_max])], n)
    ok = people[:k_max] >= ANCHOR_STDS * float(std)
    K = int(k_max if ok.all() else np.argmin(ok))
    return K if K >= min(MIN_ANCHORS, k_max) else 0


def _shrink(noisy: np.ndarray, prior: np.ndarray, std: float) -> np.ndarray:
    """Each cell's posterior mean under a Gaussian prior centred on ``prior`` with variance
    ``tau2 * prior`` (``tau2`` by moments over all cells whose prior is positive), clamped at 0;
    cells whose prior is 0 stay 0."""
    dev = noisy - prior
    mask = prior > 0
    s2 = float(std) ** 2
    tau2 = max(0.0, float((dev[mask] ** 2).sum() - s2 * mask.sum()) / max(float(prior[mask].sum()), 1e-300))
    k = tau2 * prior / (tau2 * prior + s2) if s2 > 0 else np.ones_like(prior)
    return np.where(mask, np.maximum(prior + k * dev, 0.0), 0.0)


class Strata:
    """The fitted strata (public arrays; :class:`~sparkpriv.mechanisms.synthetic.SyntheticModel` holds one).

    ``anchors (K,)`` item ids; ``weights (K+1,)`` people shares; ``draws (K+1, limit+1)`` the
    distribution of the number of items drawn from the stratum's profile (anchor strata: besides
    the anchor); ``top (M,)`` the measured items; ``top_profile (K+1, M)`` their probabilities per
    stratum; ``rest_share (K+1,)`` the probability of drawing any other item, spread as ``rest (d,)``
    (0 on ``top``, sums to 1).
    """

    def __init__(self, anchors, weights, draws, top, top_profile, rest_share, rest):
        self.anchors = np.asarray(anchors, dtype=np.int64)
        self.weights = np.asarray(weights, dtype=np.float64)
        self.draws = np.asarray(draws, dtype=np.float64)
        self.top = np.asarray(top, dtype=np.int64)
        self.top_profile = np.asarray(top_profile, dtype=np.float64)
        self.rest_share = np.asarray(rest_share, dtype=np.float64)
        self.rest = np.asarray(rest, dtype=np.float64)

    @property
    def K(self) -> int:
        return int(self.anchors.size)

    def arrays(self) -> dict:
        return {"s_anchors": self.anchors, "s_weights": self.weights, "s_draws": self.draws, "s_top": self.top,
                "s_top_profile": self.top_profile, "s_rest_share": self.rest_share, "s_rest": self.rest}

    @classmethod
    def from_arrays(cls, z) -> "Strata":
        return cls(z["s_anchors"], z["s_weights"], z["s_draws"], z["s_top"], z["s_top_profile"], z["s_rest_share"],
                   z["s_rest"])

    def item_probability(self, items: np.ndarray) -> np.ndarray:
        """``(K+1, len(items))``: each stratum's probability of drawing each item."""
        items = np.asarray(items, dtype=np.int64)
        col = np.full(self.rest.size, -1, dtype=np.int64)
        col[self.top] = np.arange(self.top.size)
        c = col[items]
        out = self.rest_share[:, None] * self.rest[None, items]
        t = c >= 0
        out[:, t] = self.top_profile[:, c[t]]
        return out


def _miss(draws: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``sum_m draws[m] (1 - q)^m`` (Horner). ``draws (T,)`` with ``q (N,)``, or ``draws (S, T)`` with
    ``q (S, N)`` (one distribution per row)."""
    draws = np.asarray(draws, dtype=np.float64)
    x = np.clip(1.0 - np.asarray(q, dtype=np.float64), 0.0, 1.0)
    two = draws.ndim == 2
    D = draws if two else draws[None, :]
    X = x if two else x[None, :]
    nz = np.flatnonzero(D.any(axis=0))
    top = int(nz.max()) + 1 if nz.size else 1
    acc = np.repeat(D[:, top - 1:top], X.shape[1], axis=1)
    for m in range(top - 2, -1, -1):
        acc *= X
        acc += D[:, m:m + 1]
    return acc if two else acc[0]


def _rest_bins(u: np.ndarray, bins: int = 200):
    """Group the rest items' (positive) probabilities into geometric bins: ``(bin of each item, centres, counts)``."""
    pos = u > 0
    if not pos.any():
        return np.zeros(u.size, np.int64), np.zeros(1), np.zeros(1)
    lo, hi = float(u[pos].min()), float(u[pos].max())
    edges = np.geomspace(lo, hi * (1 + 1e-12), bins + 1) if hi > lo else np.array([lo, hi * (1 + 1e-9) + 1e-300])
    b = np.clip(np.searchsorted(edges, u, side="right") - 1, 0, edges.size - 2)
    cnt = np.bincount(b[pos], minlength=edges.size - 1).astype(np.float64)
    tot = np.bincount(b[pos], weights=u[pos], minlength=edges.size - 1)
    centre = np.where(cnt > 0, tot / np.maximum(cnt, 1), 0.0)
    return b, centre, cnt


def fit_strata(*, counts_noisy: np.ndarray, lengths_noisy: np.ndarray, std: float, anchors_K: int, order: np.ndarray,
               profile: np.ndarray, lengths: np.ndarray, n: float, L: int, edges: np.ndarray,
               draws0: np.ndarray | None = None) -> Strata:
    """The strata of the model from the noisy strata vector (module docstring; no budget).

    ``counts_noisy (K+1, M)``, ``lengths_noisy (K+1, bins)``: the noisy vector's two parts; ``std``
    its noise std; ``order`` the public ranking (item ids, most popular first); ``profile (d,)`` and
    ``lengths (limit+1,)`` the first model's (``lengths`` the released distribution of items per
    person); ``draws0 (limit+1,)`` the first model's draws per person when calibrated
    (:func:`~sparkpriv.mechanisms.synthetic._post.calibrate`; default ``lengths``), whose expected
    item counts the strata are raked to; ``n`` people; ``L`` the bound.
    """
    K = int(anchors_K)
    order = np.asarray(order, dtype=np.int64)
    M = counts_noisy.shape[1]
    top = order[:M]
    anchors = order[:K]
    p = np.maximum(np.asarray(profile, dtype=np.float64), 0.0)
    p = p / max(p.sum(), 1e-300)
    lam = np.asarray(lengths, dtype=np.float64)
    lam = lam / max(lam.sum(), 1e-300)
    limit = lam.size - 1
    edges = np.asarray(edges, dtype=np.int64)
    people0, g0 = implied_strata(lam, p[anchors], n)

    # lengths: shrink towards the implied people per (stratum, bin), then fit to the released lengths
    prior_h = np.add.reduceat(people0[:, None] * g0, edges, axis=1)
    H = _shrink(np.asarray(lengths_noisy, dtype=np.float64), prior_h, std)
    H[:K, 0] = 0.0  # a person with an anchor holds at least one item
    col_t = np.add.reduceat(float(n) * lam, edges)
    row_t = H.sum(axis=1) * float(n) / max(H.sum(), 1e-300)
    for _ in range(100):
        H *= (row_t / np.maximum(H.sum(axis=1), 1e-300))[:, None]
        H *= (col_t / np.maximum(H.sum(axis=0), 1e-300))[None, :]
    people = H.sum(axis=1)
    people *= float(n) / max(people.sum(), 1e-300)
    total_len = np.zeros((K + 1, limit + 1))
    for s in range(K + 1):
        h = expand_bins(H[s], edges, limit, shape=lam)
        if s < K:
            h[0] = 0.0
        total_len[s] = h / max(h.sum(), 1e-300)
    draws = total_len.copy()
    draws[:K, :-1] = total_len[:K, 1:]  # anchor strata draw m - 1 items besides the anchor
    draws[:K, -1] = 0.0
    mean_draws = (draws * np.arange(limit + 1)).sum(axis=1)

    # item cells: shrink towards the first model's profile (excluding structural zeros), scaled
    C = np.asarray(counts_noisy, dtype=np.float64)
    ptop = p[top]
    prior_c = np.zeros_like(C)
    share_top = np.zeros(K + 1)
    for s in range(K + 1):
        excl = min(s + 1, K)  # ranks 0 .. excl-1 never counted in row s (its anchor and those above)
        pt = ptop.copy()
        pt[:excl] = 0.0
        share_top[s] = pt.sum() / max(1.0 - p[anchors[:excl]].sum(), 1e-300)
        pt = pt / max(pt.sum(), 1e-300)
        kept = min(mean_draws[s] * share_top[s], L - 1) * people[s]
        obs = C[s].sum()
        vv, nv = (PRIOR_SD * kept + 1.0) ** 2, float(std) ** 2 * M
        scale = max((obs * vv + kept * nv) / (vv + nv), 0.0)
        prior_c[s] = scale * pt
    post = _shrink(C, prior_c, std)
    top_profile = share_top[:, None] * post / np.maximum(post.sum(axis=1, keepdims=True), 1e-300)
    rest = p.copy()
    rest[top] = 0.0
    rest_mass = rest.sum()
    rest = rest / rest_mass if rest_mass > 0 else rest
    rest_share = np.where(rest_mass > 0, 1.0 - top_profile.sum(axis=1), 0.0)
    if rest_mass <= 0:
        top_profile /= np.maximum(top_profile.sum(axis=1, keepdims=True), 1e-300)

    # rake: every item's expected count equal to the first model's; draws stretched to keep the total
    first = lam if draws0 is None else np.asarray(draws0, dtype=np.float64) / max(float(np.sum(draws0)), 1e-300)
    target_top = float(n) * (1.0 - _miss(first, ptop))
    rb, rc, rn = _rest_bins(rest)
    target_rest = float(n) * float(((1.0 - _miss(first, rc * rest_mass)) * rn).sum())
    base = draws.copy()

    def expected(tp, rs, dr):
        miss_top = _miss(dr, tp)  # (K+1, M)
        e_top = (people[:, None] * (1.0 - miss_top)).sum(axis=0)
        idx = np.arange(K)
        e_top[idx] += people[:K] * miss_top[idx, idx]  # the anchor is held by everyone in its stratum
        miss_rest = _miss(dr, rc[None, :] * rs[:, None])  # (K+1, bins)
        e_rest = float((people[:, None] * ((1.0 - miss_rest) * rn[None, :])).sum())
        return e_top, e_rest

    def stretched(pi):
        k, f = int(np.floor(pi)), pi - np.floor(pi)
        out = np.zeros_like(base)
        w = base.shape[1]
        out[:, k:] += (1.0 - f) * base[:, :w - k]
        out[:, k + 1:] += f * base[:, :w - k - 1]
        return out / np.maximum(out.sum(axis=1, keepdims=True), 1e-300)

    tp, rs = top_profile, rest_share
    # an anchor is held by its whole stratum (measured): raked up to the first model, never down
    target_top[:K] = np.maximum(target_top[:K], expected(tp, rs, draws)[0][:K])
    for _ in range(RAKE_ROUNDS):
        for _ in range(RAKE_STEPS):
            e_top, e_rest = expected(tp, rs, draws)
            r_top = np.where(e_top > 0, target_top / np.maximum(e_top, 1e-300), 1.0)
            r_rest = target_rest / e_rest if e_rest > 0 else 1.0
            tp = tp * r_top[None, :]
            rs = rs * r_rest
            z = tp.sum(axis=1) + rs
            tp, rs = tp / np.maximum(z, 1e-300)[:, None], rs / np.maximum(z, 1e-300)
        want = target_top.sum() + target_rest
        lo, hi = 0.0, 3.0
        for _ in range(24):
            mid = (lo + hi) / 2.0
            e_top, e_rest = expected(tp, rs, stretched(mid))
            lo, hi = (mid, hi) if e_top.sum() + e_rest < want else (lo, mid)
        draws = stretched(lo)
    return Strata(anchors, people / max(people.sum(), 1e-300), draws, top, tp, rs, rest)
