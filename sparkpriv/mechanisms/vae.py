"""A VAE with one hidden layer per side, trained with DP-SGD (docs/math.md section 5).

Encoder ``h1 = tanh(x W1 + b1)`` (``hidden`` units, 200 by default), ``[mu,
logvar] = h1 W2 + b2`` (latent ``L``, 2 by default); reparameterisation
``z = mu + exp(logvar / 2) eps`` with ``eps ~ N(0, I)`` from a keyed stream;
decoder ``h3 = tanh(z W3 + b3)``, output ``o = h3 W4 + b4``. The per-example
loss is the negative ELBO (one sample of ``eps``)

    loss(x) = rec(x, o) + 0.5 sum(mu^2 + exp(logvar) - logvar - 1),

with ``rec = sum softplus(o) - x o`` (``likelihood="bernoulli"``: binary or
[0, 1] columns) or ``sum (x - o)^2 / (2 s^2)`` (``"gaussian"``, fixed public
``s``). DP-SGD clips the per-example gradient of ``loss`` (all of it depends on
the record).

Per-example norms without per-example gradients: every dense layer ``l`` is
applied once per record, so its per-example weight gradient is the outer
product ``a_l,i delta_l,i^T`` of the layer's input and the loss gradient at its
output, and

    ||grad_i||^2 = sum_l ||delta_l,i||^2 (||a_l,i||^2 + 1)      (bias: + ||delta_l,i||^2),

exactly. The clipped sum is ``sum_l (A_l^T diag(f) Delta_l, f Delta_l)``: the
same matrix products as the non-private gradient, with the rows of ``Delta``
scaled by the clip factors ``f``.

Parameters are one flat float64 vector ``[W1, b1, W2, b2, W3, b3, W4, b4]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkpriv.mechanisms.dpsgd import clip_factors

__all__ = ["VAE"]

LIKELIHOODS = ("bernoulli", "gaussian")


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


@dataclass(frozen=True)
class VAE:
    d: int
    hidden: int = 200
    latent: int = 2
    likelihood: str = "bernoulli"
    obs_std: float = 0.1  # gaussian likelihood only (public)

    def shapes(self):
        d, H, L = self.d, self.hidden, self.latent
        return [(d, H), (H,), (H, 2 * L), (2 * L,), (L, H), (H,), (H, d), (d,)]

    @property
    def dim(self) -> int:
        return int(sum(np.prod(s) for s in self.shapes()))

    def unpack(self, theta):
        out, o = [], 0
        for s in self.shapes():
            k = int(np.prod(s))
            out.append(theta[o: o + k].reshape(s))
            o += k
        return out

    def init(self, rng: np.random.Generator) -> np.ndarray:
        """Data-independent Glorot-style start, zero biases."""
        parts = []
        for s in self.shapes():
            if len(s) == 2:
                parts.append(rng.standard_normal(s).ravel() * np.sqrt(1.0 / s[0]))
            else:
                parts.append(np.zeros(s))
        return np.concatenate(parts)

    def init_state(self, rng, theta=None):
        return None

    def model_term(self, theta, state, rng, clip=None):
        return 0.0, state

    # ------------------------------------------------------------------ forward / backward

    def _forward_backward(self, X, theta, eps):
        W1, b1, W2, b2, W3, b3, W4, b4 = self.unpack(theta)
        L = self.latent
        h1 = np.tanh(X @ W1 + b1)
        o2 = h1 @ W2 + b2
        mu, lv = o2[:, :L], o2[:, L:]
        std = np.exp(0.5 * lv)
        z = mu + std * eps
        h3 = np.tanh(z @ W3 + b3)
        o = h3 @ W4 + b4
        if self.likelihood == "bernoulli":
            rec = (np.logaddexp(0.0, o) - X * o).sum(axis=1)
            d4 = _sigmoid(o) - X
        else:
            s2 = float(self.obs_std) ** 2
            r = o - X
            rec = 0.5 * (r * r).sum(axis=1) / s2
            d4 = r / s2
        kl = 0.5 * (mu * mu + std * std - lv - 1.0).sum(axis=1)
        d3 = (d4 @ W4.T) * (1.0 - h3 * h3)
        dz = d3 @ W3.T
        d2 = np.concatenate([dz + mu, 0.5 * dz * eps * std + 0.5 * (std * std - 1.0)], axis=1)
        d1 = (d2 @ W2.T) * (1.0 - h1 * h1)
        acts = [X, h1, z, h3]
        deltas = [d1, d2, d3, d4]
        return rec + kl, acts, deltas

    def loss(self, X, theta, eps) -> np.ndarray:
        """Per-example negative ELBO for the given ``eps`` (n, latent)."""
        return self._forward_backward(np.asarray(X, float), theta, eps)[0]

    def draw_eps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.standard_normal((int(n), self.latent))

    def per_example_grads(self, X, theta, rng=None, eps=None) -> np.ndarray:
        """Per-example gradients materialised, shape (n, dim): tests only."""
        X = np.asarray(X, float)
        eps = self.draw_eps(X.shape[0], rng) if eps is None else eps
        _, acts, deltas = self._forward_backward(X, theta, eps)
        parts = []
        for A, D in zip(acts, deltas):
            parts.append(np.einsum("ni,nj->nij", A, D).reshape(X.shape[0], -1))
            parts.append(D)
        return np.concatenate(parts, axis=1)

    def clipped_sum(self, X, theta, clip, rng=None, eps=None):
        """``(sum_i f_i grad_i, squared norms)``; ``clip=None`` means f = 1."""
        X = np.asarray(X, float)
        eps = self.draw_eps(X.shape[0], rng) if eps is None else eps
        _, acts, deltas = self._forward_backward(X, theta, eps)
        sq = np.zeros(X.shape[0])
        for A, D in zip(acts, deltas):
            dd = np.einsum("ij,ij->i", D, D)
            sq += dd * (np.einsum("ij,ij->i", A, A) + 1.0)
        f = np.ones(X.shape[0]) if clip is None else clip_factors(sq, clip)
        out = np.empty(self.dim)
        o = 0
        for A, D in zip(acts, deltas):
            Df = D * f[:, None]
            k = A.shape[1] * D.shape[1]
            out[o: o + k] = (A.T @ Df).ravel()
            o += k
            out[o: o + D.shape[1]] = Df.sum(axis=0)
            o += D.shape[1]
        return out, sq

    # ------------------------------------------------------------------ sampling

    def decode(self, theta, Z) -> np.ndarray:
        W1, b1, W2, b2, W3, b3, W4, b4 = self.unpack(theta)
        return np.tanh(Z @ W3 + b3) @ W4 + b4

    def sample(self, theta, n: int, rng: np.random.Generator, binary: bool = True) -> np.ndarray:
        """``n`` records: ``z ~ N(0, I)``, then Bernoulli draws (``binary``) or the means."""
        o = self.decode(theta, rng.standard_normal((int(n), self.latent)))
        if self.likelihood == "bernoulli":
            p = _sigmoid(o)
            return (rng.random(p.shape) < p).astype(np.float64) if binary else p
        return o
