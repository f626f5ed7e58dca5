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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkpriv.mechanisms.dpsgd import clip_factors

__all__ = ["RBM"]


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _softplus(x):
    return np.logaddexp(0.0, x)


@dataclass(frozen=True)
class RBM:
    """Shapes and the public knobs of a Bernoulli RBM (no parameters: those are ``theta``)."""

    d: int
    hidden: int = 64
    gibbs_steps: int = 1  # Gibbs steps of the persistent chains per update
    chains: int = 100  # persistent chains (negative phase)
    chain_init_p: float = 0.05  # data-independent initial chain density

    @property
    def dim(self) -> int:
        return self.d * self.hidden + self.d + self.hidden

    def unpack(self, theta):
        d, m = self.d, self.hidden
        W = theta[: d * m].reshape(d, m)
        return W, theta[d * m: d * m + d], theta[d * m + d:]

    def init(self, rng: np.random.Generator, visible_logit: float = 0.0) -> np.ndarray:
        """Data-independent start: ``W ~ N(0, 0.01^2)``, ``b = visible_logit``, ``c = 0``."""
        theta = np.zeros(self.dim)
        theta[: self.d * self.hidden] = 0.01 * rng.standard_normal(self.d * self.hidden)
        theta[self.d * self.hidden: self.d * self.hidden + self.d] = visible_logit
        return theta

    def init_state(self, rng: np.random.Generator, theta: np.ndarray | None = None):
        """Persistent chains, data-independent: Bernoulli(``sigmoid(b)``) of the starting
        parameters (public), or Bernoulli(``chain_init_p``) without them."""
        return self._start(self.chains, rng, theta)

    def _start(self, n: int, rng: np.random.Generator, theta: np.ndarray | None):
        p = self.chain_init_p if theta is None else _sigmoid(self.unpack(theta)[1])
        return (rng.random((int(n), self.d)) < p).astype(np.float64)

    # ------------------------------------------------------------------ energies and gradients

    def free_energy(self, V: np.ndarray, theta: np.ndarray) -> np.ndarray:
        W, b, c = self.unpack(theta)
        return -(V @ b) - _softplus(V @ W + c).sum(axis=1)

    def per_example_grads(self, V: np.ndarray, theta: np.ndarray, rng=None) -> np.ndarray:
        """``grad F(v_i)`` materialised, shape (n, dim): tests and small batches only."""
        W, b, c = self.unpack(theta)
        H = _sigmoid(V @ W + c)
        G = np.einsum("ni,nj->nij", V, H).reshape(V.shape[0], -1)
        return -np.concatenate([G, V, H], axis=1)

    def clipped_sum(self, V: np.ndarray, theta: np.ndarray, clip: float | None, rng=None):
        """``(sum_i f_i grad F(v_i), squared norms)``; ``clip=None``: no clipping (f = 1)."""
        W, b, c = self.unpack(theta)
        V = np.asarray(V, dtype=np.float64)
        H = _sigmoid(V @ W + c)
        vv = np.einsum("ij,ij->i", V, V)
        hh = np.einsum("ij,ij->i", H, H)
        sq = vv * hh + vv + hh
        f = np.ones(V.shape[0]) if clip is None else clip_factors(sq, clip)
        Hf = H * f[:, None]
        out = np.empty(self.dim)
        d, m = self.d, self.hidden
        out[: d * m] = -(V.T @ Hf).ravel()
        out[d * m: d * m + d] = -(f @ V)
        out[d * m + d:] = -Hf.sum(axis=0)
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

    def sample(self, theta: np.ndarray, n: int, rng: np.random.Generator, burn_in: int = 50) -> np.ndarray:
        """``n`` binary records (n, d) after ``burn_in`` Gibbs sweeps of independent chains
        (float32 arithmetic: post-processing, only the speed matters)."""
        V0 = self._start(n, rng, theta)  # from the model's visible biases: shorter burn-in
        return self.gibbs(theta, V0, burn_in, rng, dtype=np.float32)
