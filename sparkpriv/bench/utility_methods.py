"""The methods of ``sparkpriv bench utility``, in a registry that a new synthesizer joins as one entry.

A method is a function ``fn(X, *, epsilon, delta, seed) -> output``:

* ``X``: the table, scipy CSR ``(n, d)`` float64 0/1, one row per person, UNCAPPED
  (a method bounds each person itself: that is part of its mechanism);
* ``epsilon``, ``delta``: the method's whole budget (replace-one neighbours unless its
  entry's ``note`` says otherwise); ``n`` is public;
* ``seed``: this draw's seed. A private method derives its noise from it through the
  library (``sparkpriv.privacy.random.stream(seed, ...)`` with the samplers of
  :mod:`sparkpriv.privacy.noise`, or a release made inside
  ``insecure_fixed_seed(seed)``), so every draw is reproducible and draws differ;
* ``output``: a synthetic table (scipy sparse ``(m, d)``, any ``m``: answers are scaled
  by ``n / m``), or a model answering in people of the table (``unions(Q)`` for a
  ``(d, queries)`` 0/1 matrix, ``pairs(P)`` for ``(P, 2)`` item pairs, as
  :class:`ProductMixture`), or a dict ``{variant: output}`` (settings sharing one
  expensive step, e.g. post-processings of one set of noisy counts: each variant is
  scored as the method ``name[variant]``).

Adding the new synthesizer::

    from sparkpriv.bench.utility_methods import register

    def my_synth(X, *, epsilon, delta, seed):
        ...                                    # cap, measure, fit, sample
        return synthetic_csr                   # (m, X.shape[1])

    register("my_synth", my_synth, note="...")  # then: sparkpriv bench utility --methods my_synth ...

(or ``--plugin module:function``, a function that registers its methods, on the command
line). ``family`` is ``"private"`` (DP; the goal compares these), ``"yardstick"``
(non-private references: the empty release, real samples) or ``"peer"``; ``sweep``
names a family of settings whose best per cell is reported as one row (``<sweep> (best)``),
the whole sweep in its own table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from scipy import sparse

__all__ = ["Method", "REGISTRY", "register", "ProductMixture", "bernoulli_rows", "default_methods",
           "INDEPENDENCE_CAPS", "KMEANS_CAPS", "DPGM_CAP", "synthetic_defaults"]

INDEPENDENCE_CAPS = (1, 2, 4, 8, 16, 32, 64)
KMEANS_CAPS = (8, 32)
DPGM_CAP = 32  # docs/research/dpgm.md's event-table examples (--max-items 32)
KMEANS_K = 10


@dataclass(frozen=True)
class Method:
    """A registry entry (module docstring)."""

    name: str
    fn: Callable
    family: str = "private"
    sweep: str | None = None
    note: str = ""
    settings: dict = field(default_factory=dict)
    quick: bool = True  # run by --quick
    cost: str = "low"  # "low" | "high" (high: fewer draws allowed by --expensive-draws)


REGISTRY: dict = {}


def register(name: str, fn: Callable, *, family: str = "private", sweep: str | None = None, note: str = "",
             settings: dict | None = None, quick: bool = True, cost: str = "low", replace: bool = False) -> Method:
    """Add a method to :data:`REGISTRY` (module docstring)."""
    if family not in ("private", "yardstick", "peer"):
        raise ValueError(f"family must be private, yardstick or peer; got {family!r}")
    if name in REGISTRY and not replace:
        raise ValueError(f"method {name!r} is already registered (replace=True to override)")
    m = Method(name, fn, family, sweep, note, dict(settings or {}), quick, cost)
    REGISTRY[name] = m
    return m


# ----------------------------------------------------------------------------- outputs


@dataclass(frozen=True)
class ProductMixture:
    """A mixture of product-of-Bernoulli distributions over ``d`` items, as answers.

    ``weights`` (k,) nonnegative, ``P`` (k, d) item probabilities in [0, 1], ``n`` the
    people answered for. Union answers ``n sum_j w_j (1 - prod_{i in q} (1 - P_ji))``,
    pair answers ``n sum_j w_j P_ja P_jb`` (exact expectations of a synthetic table
    drawn from it). ``k = 1``: independence of the items.
    """

    weights: np.ndarray
    P: np.ndarray
    n: int

    def __post_init__(self):
        w = np.clip(np.asarray(self.weights, float).ravel(), 0.0, None)
        w = np.full(w.size, 1.0 / w.size) if not w.sum() > 0 else w / w.sum()
        object.__setattr__(self, "weights", w)
        object.__setattr__(self, "P", np.clip(np.atleast_2d(np.asarray(self.P, float)), 0.0, 1.0))

    def unions(self, Q) -> np.ndarray:
        with np.errstate(divide="ignore"):
            logmiss = np.log1p(-np.minimum(self.P, 1.0 - 1e-12))  # (k, d); finite, so 0 x log stays 0
        miss = np.exp(logmiss @ np.asarray(Q, float))  # (k, queries)
        return self.n * (self.weights @ (1.0 - miss))

    def pairs(self, pairs) -> np.ndarray:
        pairs = np.asarray(pairs)
        return self.n * ((self.P[:, pairs[:, 0]] * self.P[:, pairs[:, 1]]).T @ self.weights)

    def sample(self, m: int, rng: np.random.Generator) -> sparse.csr_matrix:
        """``m`` synthetic people (CSR)."""
        sizes = rng.multinomial(int(m), self.weights)
        return bernoulli_rows(self.P, sizes, rng)


def bernoulli_rows(P: np.ndarray, sizes, rng: np.random.Generator) -> sparse.csr_matrix:
    """``sizes[j]`` rows with independent items of probabilities ``P[j]``, cluster after cluster (CSR 0/1).

    Sparse in time and memory: per cluster and item the number of holders is Binomial,
    and which rows hold it a uniform subset (the same law as row-by-row Bernoullis).
    """
    P = np.clip(np.atleast_2d(np.asarray(P, float)), 0.0, 1.0)
    rows, cols = [], []
    start = 0
    for j, m in enumerate(np.asarray(sizes, np.int64)):
        if m == 0:
            continue
        cnt = rng.binomial(int(m), P[j])
        items = np.flatnonzero(cnt)
        for i in items:
            r = rng.choice(int(m), int(cnt[i]), replace=False) if cnt[i] < m else np.arange(m)
            rows.append(r + start)
            cols.append(np.full(r.size, i))
        start += int(m)
    r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    X = sparse.csr_matrix((np.ones(r.size), (r, c)), shape=(start, P.shape[1]))
    X.sort_indices()
    return X


# ----------------------------------------------------------------------------- yardsticks


def empty_release(X, *, epsilon, delta, seed):
    """No people: every answer 0 (error 1 wherever the truth is at least 0.001 n)."""
    return sparse.csr_matrix((1, X.shape[1]))


def real_sample(fraction: float):
    def sample(X, *, epsilon, delta, seed):
        from sparkpriv.bench.utility_data import sample_people

        return sample_people(X, fraction, np.random.default_rng([seed, 11]))

    sample.__doc__ = f"A uniformly random {fraction:.0%} of the real people (NOT private)."
    return sample


# ----------------------------------------------------------------------------- DP per-item counts


def _noisy_item_counts(X, L: int, noise: str, epsilon: float, delta: float, seed: int):
    """The library's counts mechanism on the per-item counts of ``X`` capped at ``L``: ``(values, std)``."""
    from sparkpriv.bench.utility_data import cap_rows
    from sparkpriv.mechanisms.counts import CountsParams, finalize_counts, plan_counts
    from sparkpriv.privacy.random import stream

    Xc = cap_rows(X, L, np.random.default_rng([seed, 21]))
    kind = "discrete_gaussian" if noise == "gaussian" else "discrete_laplace"
    params = CountsParams(epsilon=epsilon, max_keys=L, noise=kind, delta=delta if kind == "discrete_gaussian" else 0.0,
                          neighbors="replace-one")
    plan = plan_counts(params, X.shape[1])
    res = finalize_counts(np.asarray(Xc.sum(axis=0)).ravel().astype(np.int64), plan, stream(seed, 22))
    return res.value, float(plan.std)


def independence(noise: str, L: int):
    """DP per-item counts (the counts mechanism: replace-one, cap ``L``), answered under independence.

    Variants (post-processing of the same noisy counts): ``clamp`` (rates clipped to
    [0, 1]) and ``zero<2sd`` (counts below 2 noise stds set to 0)."""

    def fn(X, *, epsilon, delta, seed):
        n = X.shape[0]
        c, std = _noisy_item_counts(X, L, noise, epsilon, delta, seed)
        return {"clamp": ProductMixture(np.ones(1), c[None] / n, n),
                "zero<2sd": ProductMixture(np.ones(1), np.where(c < 2 * std, 0.0, c)[None] / n, n)}

    return fn


# ----------------------------------------------------------------------------- k-means + Bernoulli


def kmeans_bernoulli(L: int, k: int = KMEANS_K, iterations: int = 8):
    """The DPGM's DP k-means (linear variant, the library's release_kmeans on the local engine) on the
    table capped at ``L`` (row bound sqrt(L)), then each cluster an independent-Bernoulli model:
    its released (noisy) centre as item probabilities, its noisy size as weight.

    Variants (post-processing): ``clip`` (centres as released, clipped to [0, 1]) and
    ``zero<2sd`` (centre coordinates below 2 noise stds of that cluster's mean set to 0)."""

    def fn(X, *, epsilon, delta, seed):
        from sparkpriv.api import release_kmeans
        from sparkpriv.bench.utility_data import cap_rows
        from sparkpriv.privacy.random import insecure_fixed_seed

        n, d = X.shape
        D = cap_rows(X, L, np.random.default_rng([seed, 31])).toarray()
        with insecure_fixed_seed(int(seed) % 2**63):
            r = release_kmeans(D, k=min(k, math.isqrt(n)), epsilon=epsilon, delta=delta, iterations=iterations,
                               variant="linear", lower=np.zeros(d), upper=np.ones(d), row_bound=float(np.sqrt(L)))
        del D
        C = np.clip(np.asarray(r.model.centers, float), 0.0, 1.0)
        w = np.clip(np.asarray(r.model.counts, float), 0.0, None)
        sd = float(r.model.sum_std or 0.0) / np.maximum(w, 1.0)  # noise std of a centre coordinate
        return {"clip": ProductMixture(w, C, n),
                "zero<2sd": ProductMixture(w, np.where(C < 2 * sd[:, None], 0.0, C), n)}

    return fn


# ----------------------------------------------------------------------------- the DPGM


def dpgm_defaults(L: int = DPGM_CAP, block: int = 10_000):
    """The DPGM at the library's defaults (``sparkpriv.api.release_dpgm`` on the local engine: a dense
    numpy table, the records capped at ``L`` and declared by ``row_bound = sqrt(L)``), ``n``
    synthetic people (``synthesize_part``, ``block`` at a time)."""

    def fn(X, *, epsilon, delta, seed):
        from sparkpriv.api import release_dpgm
        from sparkpriv.bench.utility_data import cap_rows
        from sparkpriv.mechanisms.dpgm import synthesize_part
        from sparkpriv.privacy.random import insecure_fixed_seed

        n, d = X.shape
        D = cap_rows(X, L, np.random.default_rng([seed, 41])).toarray()
        with insecure_fixed_seed(int(seed) % 2**63):
            rel = release_dpgm(D, epsilon=epsilon, delta=delta, row_bound=float(np.sqrt(L)))
        del D
        parts = [sparse.csr_matrix(synthesize_part(rel.model, min(block, n - s), int(seed) % 2**63, b) > 0.5)
                 for b, s in enumerate(range(0, n, block))]
        return sparse.vstack(parts).tocsr().astype(np.float64)

    return fn


# ----------------------------------------------------------------------------- the synthetic release


def synthetic_defaults(**params):
    """sparkpriv's synthetic release at its defaults (``sparkpriv.api.release_synthetic`` on the local
    engine: ``max_items="auto"``, docs/math.md section 10; ``params`` override its parameters, for
    studies), scored two ways from one release:

    * ``table``: ``n`` synthetic people sampled from the model (what ``sparkpriv synthesize`` writes);
    * ``expected``: the model's expected answers (``union_answers``, ``pair_answers``), the same
      table without the sampling noise."""

    def fn(X, *, epsilon, delta, seed):
        from sparkpriv.api import release_synthetic
        from sparkpriv.privacy.random import insecure_fixed_seed

        n = X.shape[0]
        with insecure_fixed_seed(int(seed) % 2**63):
            rel = release_synthetic(sparse.csr_matrix(X), epsilon=epsilon, delta=delta, **params)
        model = rel.model
        return {"table": model.sample(n, int(seed) % 2**63), "expected": _ModelAnswers(model, n)}

    return fn


@dataclass(frozen=True)
class _ModelAnswers:
    model: object
    n: int

    def unions(self, Q) -> np.ndarray:
        return self.model.union_answers(np.asarray(Q).T, self.n)

    def pairs(self, pairs) -> np.ndarray:
        return self.model.pair_answers(np.asarray(pairs), self.n)


def default_methods() -> None:
    """Register the built-in methods (idempotent)."""
    if "empty" in REGISTRY:
        return
    register("empty", empty_release, family="yardstick", note="no people: every answer 0")
    register("sample 1%", real_sample(0.01), family="yardstick", note="a uniformly random 1% of the real people, "
             "answers x100 (NOT private)")
    register("sample 10%", real_sample(0.10), family="yardstick", note="a uniformly random 10% of the real people, "
             "answers x10 (NOT private)")
    for noise in ("laplace", "gaussian"):
        for L in INDEPENDENCE_CAPS:
            register(f"independence[{noise},L={L}]", independence(noise, L), sweep="independence",
                     settings={"noise": noise, "L": L}, quick=L in (4, 16),
                     note="DP per-item counts (discrete Laplace or Gaussian, replace-one, cap L) under independence")
    for L in KMEANS_CAPS:
        register(f"kmeans+bernoulli[L={L}]", kmeans_bernoulli(L), sweep="kmeans+bernoulli",
                 settings={"L": L, "k": KMEANS_K, "iterations": 8}, quick=L == 8,
                 note="the DPGM's DP k-means (linear, k=10, 8 iterations, cap L), an independent-Bernoulli model "
                      "per cluster from its noisy centre and size")
    register("synthetic", synthetic_defaults(), settings={"max_items": "auto"},
             note="sparkpriv release synthetic at its defaults (L a DP quantile of the record lengths, a DP length "
                  "profile, Gaussian per-item counts, empirical-Bayes shrinkage); 'table' scores n sampled people, "
                  "'expected' the model's exact expectations")
    register("dpgm", dpgm_defaults(), settings={"L": DPGM_CAP}, cost="high",
             note=f"the DPGM at the library's defaults (k=10, RBM, q=0.05, 20 epochs; cap L={DPGM_CAP})")
