"""Bernoulli RBM trained with DP-SGD and persistent contrastive divergence (docs/math.md section 5).

Model: binary visible ``v`` (d items of a person), binary hidden ``h`` (m units),
``E(v, h) = -b.v - c.h - v^T W h``. The free energy is

    F(v) = -b.v - sum_j softplus(c_j + (v W)_j)

and the negative log-likelihood of a record is ``F(v) + log Z``, so its gradient is

    grad NLL(v) = grad F(v) - E_model[grad F(v')].

Only the first term depends on the record: with ``h(v) = sigmoid(c + v W)``,
``grad_W F(v) = -v h(v)^T``, ``grad_b F(v) = -v``, ``grad_c F(v) = -h(v)``. That
term is the per-example gradient that DP-SGD clips and noises. The second
(negative phase) is estimated from persistent Gibbs chains (PCD, Tieleman
2008) and depends only on the released parameters and the chains' own
randomness; it is clipped with the same ``C`` as the records (for
consistency, not privacy: see :meth:`RBM.model_term`). Correction to the usual PCD recipe: the chains must NOT be
started from data records (a common initialisation); they start from a
data-independent Bernoulli draw (of ``sigmoid(b)`` for the public starting
parameters, e.g. the cluster's released centre), so the negative phase is
post-processing of released quantities.

Per-example norms without per-example gradients: ``||v h^T||_F = ||v|| ||h||``,
so ``||grad F(v)||^2 = ||v||^2 ||h||^2 + ||v||^2 + ||h||^2``; the clipped sum is
``-(V^T diag(f) H, f V, f H)`` with the clip factors ``f`` (one matrix product).

Parameters are one flat float64 vector ``theta = [W.ravel(), b, c]``.

Sampling with given record lengths (docs/research/dpgm.md, "Record lengths"): given the
hidden units, the visible units are independent Bernoullis; given also their
number of ones ``m``, they follow the conditional Bernoulli distribution
``P(v) ∝ prod_i o_i^{v_i}`` over the ``v`` with ``|v| = m`` (``o_i`` the odds).
It is invariant to multiplying every odd by one constant, so
:func:`conditional_bernoulli` tilts the logits by ``t`` (about ``sum_i
sigmoid(l_i + t) = m``, where acceptance is likeliest), draws independent
Bernoullis and keeps the rows whose sum is ``m``: an exact draw, whatever ``t``.
Block Gibbs sweeps ``h | v``, ``v | h, |v| = m`` then leave ``p(v, h | |v| = m)``
invariant.

Length strata (docs/research/dpgm.md, "Length strata"; docs/math.md section 5.3): with public
interior edges ``e_1 < ... < e_{S-1}`` (``strata``), a record of length ``m = |v|``
lies in stratum ``s(m)`` (``[0, e_1)``, ``[e_1, e_2)``, ..., ``[e_{S-1}, inf)``) and
its visible bias is ``b + A_{s(m)}``:

    F(v) = -(b + A_{s(|v|)}).v - sum_j softplus(c_j + (v W)_j).

The model is trained as the conditional ``p(v | |v| = m)``, the distribution
synthesis samples from: a record's term is still ``grad F(v)`` (``grad_{A_s} F(v)
= -v`` for its own stratum, 0 for the others, so ``||grad F(v)||^2 = ||v||^2
||h||^2 + 2 ||v||^2 + ||h||^2``), and the negative phase runs persistent chains
each of a FIXED public length (``chain_lengths``, drawn from the released length
histograms), swept ``h | v``, ``v | h, |v| = m``. ``theta = [W.ravel(), b, c,
A.ravel()]``; without strata nothing changes (``A`` is absent).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkpriv.mechanisms.dpsgd import clip_factors

__all__ = ["RBM", "conditional_bernoulli", "inclusion_probabilities"]

LENGTH_SWEEPS = 3  # Gibbs sweeps with the record lengths fixed, after the free burn-in
STRATA_LR = 10.0  # the Adam rate of the strata offsets A, a multiple of the model's rate (docs/research/dpgm.md)
CB_TRIES = 400  # rejection rounds of conditional_bernoulli before its approximate fallback
CB_TABLE_VALUES = 1 << 23  # inclusion_probabilities holds at most this many float64 (64 MiB) at once


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _softplus(x):
    return np.logaddexp(0.0, x)


def _tilt(L: np.ndarray, m: np.ndarray, iters: int = 6) -> np.ndarray:
    """Per row a ``t`` with ``sum_i sigmoid(L_i + t)`` near ``m`` (0 < m < d): Newton's method on
    the increasing, convex-then-concave sum, from a start that matches the mean logit. Only the
    acceptance rate of :func:`conditional_bernoulli` depends on it, not what it samples."""
    d = L.shape[1]
    t = np.log(m / (d - m)) - L.mean(axis=1)
    for _ in range(iters):
        P = _sigmoid(L + t[:, None])
        f = P.sum(axis=1) - m
        g = np.maximum((P * (1.0 - P)).sum(axis=1), 1e-3)
        t = t - np.clip(f / g, -4.0, 4.0)
    return t


def conditional_bernoulli(L: np.ndarray, m: np.ndarray, rng: np.random.Generator,
                          tries: int = CB_TRIES) -> np.ndarray:
    """Rows ``v`` (n, d) of 0/1 with ``|v_r| = m_r``, ``P(v_r) ∝ prod_i exp(L_ri v_ri)``: independent
    Bernoulli(``sigmoid(L_r)``) given their sum (module docstring). Exact by rejection from the tilted
    Bernoullis; a row still unaccepted after ``tries`` rounds (rare: the acceptance rate is about
    ``1 / sqrt(2 pi var)`` of the row's tilted sum) takes its ``m`` largest ``L + Gumbel``
    (sampling without replacement proportional to the odds: close, not exact)."""
    L = np.asarray(L)
    n, d = L.shape
    m = np.clip(np.asarray(m, dtype=np.int64), 0, d)
    out = np.zeros((n, d), dtype=L.dtype)
    out[m >= d] = 1
    todo = np.flatnonzero((m > 0) & (m < d))
    if todo.size == 0:
        return out
    P = _sigmoid(L[todo] + _tilt(L[todo], m[todo].astype(np.float64)).astype(L.dtype)[:, None])
    want = m[todo]
    for _ in range(int(tries)):
        V = rng.random(P.shape, dtype=L.dtype) < P
        ok = V.sum(axis=1) == want
        out[todo[ok]] = V[ok]
        keep = ~ok
        todo, P, want = todo[keep], P[keep], want[keep]
        if todo.size == 0:
            return out
    G = L[todo] - np.log(-np.log(rng.random((todo.size, d), dtype=L.dtype)))
    rank = np.argsort(np.argsort(-G, axis=1), axis=1)
    out[todo] = (rank < want[:, None]).astype(L.dtype)
    return out


def inclusion_probabilities(L: np.ndarray, m: np.ndarray, table_values: int = CB_TABLE_VALUES,
                            fallback=None) -> np.ndarray:
    """Per row ``pi_ri = P(v_ri = 1 | |v_r| = m_r)`` (n, d) under independent Bernoulli(``sigmoid(L_r)``):
    the exact means of :func:`conditional_bernoulli`'s rows (docs/math.md section 5.4). With
    ``p = sigmoid(L_r + t)`` (the tilt of :func:`_tilt`: the law given the sum does not depend on
    it, and it keeps ``P(S = m)`` near its largest), ``pi_i = p_i P(S_{-i} = m - 1) / P(S = m)``,
    ``S`` the sum of independent Bernoulli(``p``) and ``S_{-i}`` the sum without item ``i``:
    Poisson-binomial distributions truncated at ``m``, from a backward recursion over the items
    (kept) and a forward one (``O(d m)`` per row, every step a convex combination: no cancellation).
    Rows are taken in order of length, at most ``table_values`` values of the backward table at once.

    A row whose ``P(S = m)`` underflows (logits beyond float range that the tilt cannot bring back,
    e.g. more than ``m`` items at ``sigmoid = 1.0``) has no finite answer here: ``fallback(rows)``
    gives those rows instead (e.g. records drawn by :func:`conditional_bernoulli`, whose mean the
    row is); without it they raise ``FloatingPointError``: never a NaN in the result."""
    L = np.asarray(L, dtype=np.float64)
    n, d = L.shape
    m = np.clip(np.asarray(m, dtype=np.int64), 0, d)
    out = np.zeros((n, d))
    out[m >= d] = 1.0
    todo = np.flatnonzero((m > 0) & (m < d))
    todo = todo[np.argsort(m[todo], kind="stable")]
    start = 0
    while start < todo.size:
        size = max(1, int(table_values) // ((d + 1) * (int(m[todo[start]]) + 1)))
        while size > 1 and size * (d + 1) * (int(m[todo[min(start + size, todo.size) - 1]]) + 1) > table_values:
            size //= 2
        rows = todo[start: start + size]
        start += rows.size
        mm = m[rows]
        K = int(mm.max()) + 1
        P = _sigmoid(L[rows] + _tilt(L[rows], mm.astype(np.float64))[:, None])
        Q = 1.0 - P
        G = np.zeros((d + 1, rows.size, K))  # G[i][:, k] = P(sum of items i.. = k), k < K
        G[d, :, 0] = 1.0
        for i in range(d - 1, -1, -1):
            np.multiply(G[i + 1], Q[:, i: i + 1], out=G[i])
            G[i, :, 1:] += G[i + 1, :, :-1] * P[:, i: i + 1]
        total = G[0, np.arange(rows.size), mm]
        back = mm[:, None] - 1 - np.arange(K)[None, :]  # the index into G of k items before i
        valid = back >= 0
        back = np.where(valid, back, 0)
        F = np.zeros((rows.size, K))  # P(sum of items before i = k)
        F[:, 0] = 1.0
        block = np.empty((rows.size, d))
        for i in range(d):
            rest = (F * np.take_along_axis(G[i + 1], back, axis=1) * valid).sum(axis=1)
            block[:, i] = P[:, i] * rest
            F[:, 1:] = F[:, 1:] * Q[:, i: i + 1] + F[:, :-1] * P[:, i: i + 1]
            F[:, 0] *= Q[:, i]
        ok = np.isfinite(total) & (total > 0.0)
        out[rows[ok]] = block[ok] / total[ok, None]
        if not ok.all():
            bad = rows[~ok]
            if fallback is None:
                raise FloatingPointError(
                    f"inclusion_probabilities: P(|v| = m) underflows on {bad.size} row(s) (logits beyond "
                    "the float range the tilt can bring back); pass a fallback")
            out[bad] = np.asarray(fallback(bad), dtype=np.float64)
    return out


@dataclass(frozen=True)
class RBM:
    """Shapes and the public knobs of a Bernoulli RBM (no parameters: those are ``theta``)."""

    d: int
    hidden: int = 64
    gibbs_steps: int = 1  # Gibbs steps of the persistent chains per update
    chains: int = 100  # persistent chains (negative phase)
    chain_init_p: float = 0.05  # data-independent initial chain density
    # length strata: public interior edges (ints, increasing, >= 1); () none (module docstring)
    strata: tuple = ()
    # the persistent chains' fixed lengths (public, one per chain); None: free chains. Required
    # with strata (the chains' biases depend on their lengths).
    chain_lengths: tuple | None = None

    @property
    def n_strata(self) -> int:
        """``S``: the number of length strata (0 without them)."""
        return len(self.strata) + 1 if self.strata else 0

    @property
    def dim(self) -> int:
        return self.d * self.hidden + self.d + self.hidden + self.n_strata * self.d

    def unpack(self, theta):
        """``(W, b, c)`` (the strata offsets: :meth:`offsets`)."""
        d, m = self.d, self.hidden
        W = theta[: d * m].reshape(d, m)
        return W, theta[d * m: d * m + d], theta[d * m + d: d * m + d + m]

    def offsets(self, theta) -> np.ndarray:
        """``A`` (S, d): each length stratum's offset of the visible bias."""
        d, m = self.d, self.hidden
        return theta[d * m + d + m:].reshape(self.n_strata, d)

    def stratum(self, lengths) -> np.ndarray:
        """The stratum of records of these lengths (``searchsorted`` of the interior edges)."""
        return np.searchsorted(np.asarray(self.strata, dtype=np.int64),
                               np.asarray(lengths, dtype=np.int64), side="right")

    def visible_bias(self, theta, lengths, dtype=np.float64) -> np.ndarray:
        """Per record the visible bias ``b + A_{s(m)}`` (n, d) for records of these lengths."""
        b = np.asarray(self.unpack(theta)[1])
        if not self.strata:
            return np.broadcast_to(b.astype(dtype), (np.asarray(lengths).size, self.d))
        return (b[None, :] + self.offsets(theta)[self.stratum(lengths)]).astype(dtype)

    def lr_scales(self) -> np.ndarray | None:
        """Per parameter, its Adam rate's multiple of the model's rate: :data:`STRATA_LR` for the
        strata offsets (each row learns from its stratum's share of a batch only), 1 elsewhere;
        None without strata. A choice of the optimiser on released gradients: post-processing."""
        if not self.strata:
            return None
        out = np.ones(self.dim)
        out[self.d * self.hidden + self.d + self.hidden:] = STRATA_LR
        return out

    def init(self, rng: np.random.Generator, visible_logit: float = 0.0) -> np.ndarray:
        """Data-independent start: ``W ~ N(0, 0.01^2)``, ``b = visible_logit``, ``c = 0``."""
        theta = np.zeros(self.dim)
        theta[: self.d * self.hidden] = 0.01 * rng.standard_normal(self.d * self.hidden)
        theta[self.d * self.hidden: self.d * self.hidden + self.d] = visible_logit
        return theta

    def init_state(self, rng: np.random.Generator, theta: np.ndarray | None = None):
        """Persistent chains, data-independent: Bernoulli(``sigmoid(b)``) of the starting
        parameters (public), or Bernoulli(``chain_init_p``) without them. With
        ``chain_lengths``: ``(V, lengths)``, each chain drawn given its length from the starting
        parameters' visible biases (:func:`conditional_bernoulli`)."""
        if self.chain_lengths is None:
            if self.strata:
                raise ValueError("an RBM with length strata needs chain_lengths (its chains' fixed lengths)")
            return self._start(self.chains, rng, theta)
        m = np.asarray(self.chain_lengths, dtype=np.int64)
        if m.shape != (self.chains,):
            raise ValueError(f"chain_lengths must hold one length per chain ({self.chains}); got {m.size}")
        if theta is None:
            L = np.full((m.size, self.d), np.log(self.chain_init_p / (1.0 - self.chain_init_p)))
        else:
            L = np.array(self.visible_bias(theta, m))
        return conditional_bernoulli(L, m, rng), m

    def _start(self, n: int, rng: np.random.Generator, theta: np.ndarray | None):
        p = self.chain_init_p if theta is None else _sigmoid(self.unpack(theta)[1])
        return (rng.random((int(n), self.d)) < p).astype(np.float64)

    # ------------------------------------------------------------------ energies and gradients

    def _lengths(self, V: np.ndarray) -> np.ndarray:
        return np.rint(np.asarray(V, dtype=np.float64).sum(axis=1)).astype(np.int64)

    def free_energy(self, V: np.ndarray, theta: np.ndarray) -> np.ndarray:
        W, b, c = self.unpack(theta)
        if self.strata:
            return -(V * self.visible_bias(theta, self._lengths(V))).sum(axis=1) - _softplus(V @ W + c).sum(axis=1)
        return -(V @ b) - _softplus(V @ W + c).sum(axis=1)

    def per_example_grads(self, V: np.ndarray, theta: np.ndarray, rng=None) -> np.ndarray:
        """``grad F(v_i)`` materialised, shape (n, dim): tests and small batches only."""
        W, b, c = self.unpack(theta)
        H = _sigmoid(V @ W + c)
        G = np.einsum("ni,nj->nij", V, H).reshape(V.shape[0], -1)
        parts = [G, V, H]
        if self.strata:
            A = np.zeros((V.shape[0], self.n_strata, self.d))
            A[np.arange(V.shape[0]), self.stratum(self._lengths(V))] = V
            parts.append(A.reshape(V.shape[0], -1))
        return -np.concatenate(parts, axis=1)

    def clipped_sum(self, V: np.ndarray, theta: np.ndarray, clip: float | None, rng=None):
        """``(sum_i f_i grad F(v_i), squared norms)``; ``clip=None``: no clipping (f = 1)."""
        W, b, c = self.unpack(theta)
        V = np.asarray(V, dtype=np.float64)
        H = _sigmoid(V @ W + c)
        vv = np.einsum("ij,ij->i", V, V)
        hh = np.einsum("ij,ij->i", H, H)
        sq = vv * hh + vv + hh
        if self.strata:
            sq = sq + vv  # the record's own stratum's offsets: -v
        f = np.ones(V.shape[0]) if clip is None else clip_factors(sq, clip)
        Hf = H * f[:, None]
        out = np.empty(self.dim)
        d, m = self.d, self.hidden
        out[: d * m] = -(V.T @ Hf).ravel()
        out[d * m: d * m + d] = -(f @ V)
        out[d * m + d: d * m + d + m] = -Hf.sum(axis=0)
        if self.strata:
            S = np.zeros((V.shape[0], self.n_strata))
            S[np.arange(V.shape[0]), self.stratum(np.rint(vv).astype(np.int64))] = f
            out[d * m + d + m:] = -(S.T @ V).ravel()
        return out, sq

    def model_term(self, theta: np.ndarray, state: np.ndarray, rng: np.random.Generator,
                   clip: float | None = None):
        """Negative phase: ``(-mean over chains of f grad F, new chains)`` after ``gibbs_steps`` sweeps.

        ``clip``: the chains' gradients are clipped like the records' (no privacy
        role: they carry no data). Without it the estimate ``E_data[clipped] -
        E_model[unclipped]`` does not vanish when the model equals the data
        distribution, and training drifts (every unit's probability fell from
        0.33 to 0.18 in a two-cluster test).
        """
        if isinstance(state, tuple):  # chains of fixed lengths: h | v, then v | h, |v| = m
            chains, lengths = state
            W, _, c = self.unpack(theta)
            B = self.visible_bias(theta, lengths)
            for _ in range(int(self.gibbs_steps)):
                H = (rng.random((chains.shape[0], self.hidden)) < _sigmoid(chains @ W + c)).astype(np.float64)
                chains = conditional_bernoulli(H @ W.T + B, lengths, rng)
            g, _ = self.clipped_sum(chains, theta, clip)
            return -g / chains.shape[0], (chains, lengths)
        chains = self.gibbs(theta, state, self.gibbs_steps, rng)
        g, _ = self.clipped_sum(chains, theta, clip)
        return -g / chains.shape[0], chains

    # ------------------------------------------------------------------ sampling

    def gibbs(self, theta, V, steps: int, rng: np.random.Generator, dtype=np.float64) -> np.ndarray:
        """``steps`` block-Gibbs sweeps (h | v, then v | h) from the rows of ``V``."""
        W, b, c = (np.asarray(a, dtype=dtype) for a in self.unpack(theta))
        V = np.asarray(V, dtype=dtype)
        for _ in range(int(steps)):
            H = (rng.random((V.shape[0], self.hidden), dtype=dtype) < _sigmoid(V @ W + c)).astype(dtype)
            V = (rng.random((V.shape[0], self.d), dtype=dtype) < _sigmoid(H @ W.T + b)).astype(dtype)
        return V.astype(np.float64)

    def sample(self, theta: np.ndarray, n: int, rng: np.random.Generator, burn_in: int = 50,
               lengths: np.ndarray | None = None, sweeps: int = LENGTH_SWEEPS, means: bool = False) -> np.ndarray:
        """``n`` binary records (n, d) after ``burn_in`` Gibbs sweeps of independent chains
        (float32 arithmetic: post-processing, only the speed matters). ``lengths`` (n,): the
        number of ones of each record; then ``sweeps`` more sweeps draw ``v | h`` given it
        (:func:`conditional_bernoulli`), so the records are the model's given their lengths.

        ``means``: instead of each record's last ``v``, its mean given the last ``h`` (and its
        length): ``sigmoid(b + W h)``, or :func:`inclusion_probabilities` given the length. The
        same expectation as the records' (the records' law is unchanged), without the variance of
        the last draw: the mixture's marginals from far fewer records (docs/research/dpgm.md,
        "Calibrating the marginals")."""
        if self.strata:
            if lengths is None:
                raise ValueError("an RBM with length strata samples given record lengths: pass lengths")
            return self._sample_strata(theta, int(n), rng, burn_in, lengths, sweeps, means)
        V0 = self._start(n, rng, theta)  # from the model's visible biases: shorter burn-in
        V = self.gibbs(theta, V0, burn_in, rng, dtype=np.float32)
        W, b, c = (np.asarray(a, dtype=np.float32) for a in self.unpack(theta))
        if lengths is None:
            if not means:
                return V
            H = (rng.random((V.shape[0], self.hidden), dtype=np.float32) < _sigmoid(V.astype(np.float32) @ W + c))
            return _sigmoid(H.astype(np.float64) @ W.T.astype(np.float64) + b)
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.shape != (int(n),):
            raise ValueError(f"lengths must have shape ({int(n)},), got {lengths.shape}")
        return self._given_lengths(V.astype(np.float32), W, np.broadcast_to(b, (int(n), self.d)), c, lengths, rng,
                                   sweeps, means)

    def _given_lengths(self, V, W, B, c, lengths, rng, sweeps: int, means: bool) -> np.ndarray:
        """``sweeps`` sweeps ``h | v``, ``v | h, |v| = m`` (float32); the last ``v``, or with ``means``
        its mean given the last ``h`` (:func:`inclusion_probabilities`)."""
        steps = max(int(sweeps), 1)
        for s in range(steps):
            H = (rng.random((V.shape[0], self.hidden), dtype=np.float32) < _sigmoid(V @ W + c)).astype(np.float32)
            if means and s == steps - 1:
                Lm = H.astype(np.float64) @ W.T.astype(np.float64) + B
                return inclusion_probabilities(  # rows beyond float range: a drawn record (its mean)
                    Lm, lengths, fallback=lambda r: conditional_bernoulli(Lm[r], np.asarray(lengths)[r], rng))
            V = conditional_bernoulli(H @ W.T + B, lengths, rng)
        return V.astype(np.float64)

    def _sample_strata(self, theta, n: int, rng, burn_in: int, lengths, sweeps: int, means: bool = False) -> np.ndarray:
        """:meth:`sample` with length strata: each record's visible bias is its length's
        ``b + A_s``; ``burn_in`` free sweeps at that bias, then ``sweeps`` given the length."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.shape != (n,):
            raise ValueError(f"lengths must have shape ({n},), got {lengths.shape}")
        W, _, c = (np.asarray(a, dtype=np.float32) for a in self.unpack(theta))
        B = self.visible_bias(theta, lengths, np.float32)
        V = (rng.random((n, self.d), dtype=np.float32) < _sigmoid(B)).astype(np.float32)
        for _ in range(int(burn_in)):
            H = (rng.random((n, self.hidden), dtype=np.float32) < _sigmoid(V @ W + c)).astype(np.float32)
            V = (rng.random((n, self.d), dtype=np.float32) < _sigmoid(H @ W.T + B)).astype(np.float32)
        return self._given_lengths(V, W, B, c, lengths, rng, sweeps, means)
