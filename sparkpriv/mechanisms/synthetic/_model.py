"""The released synthesizer model and its sampler (post-processing; docs/math.md section 10).

The model is two public vectors: ``lengths[m]``, the share of people who draw ``m`` items
(``m = 0 .. limit``; the released distribution of items per person, calibrated by the release so
that the distinct items drawn match the measured counts: ``_post.calibrate``), and ``counts[i]``,
the (shrunk, calibrated) number of people holding item ``i``, whose shares are the profile; with
``n`` the number of people. A synthetic person draws a number
``m`` from ``lengths``, then ``m`` items independently from the item profile
``counts / sum(counts)``, keeping the distinct ones. So the answer of a union query (people with
at least one item of ``S``) has the closed form

    n sum_m lengths[m] (1 - (1 - W(S))^m),    W(S) = sum_{i in S} profile[i],

(:meth:`SyntheticModel.union_answers`): long records reach more items, and the record lengths
are the real ones (released up to ``limit``), not the capped ones the counts were measured on
(the cap keeps a uniformly random subset of a person's items, so the profile's shares are
unbiased for everyone's items; only its noise grows with the cap).

The sampler is balanced (:func:`balanced_draws`): each person's number of draws and each draw have
the model's distribution, so the closed forms hold, but within a block of people every outcome
(a number of draws, an item, a stratum) is drawn ``floor`` or ``ceil`` of its expected number of
times, not a binomial number: the table's item counts carry almost none of the sampling noise that
independent people would add (docs/math.md section 10, "The sampler").
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

import numpy as np

from sparkpriv.errors import ParameterError
from sparkpriv.privacy.random import stream

__all__ = ["SyntheticModel", "MODEL_FILE", "FORMAT_VERSION", "SYNTH_STAGE"]

MODEL_FILE = "_synthetic_model.npz"
FORMAT_VERSION = 2  # 2: optional anchor strata (format 1 files still load)
READS = (1, 2)
SYNTH_STAGE = 0x5E  # keyed stream stage of synthesis (a public constant)


def balanced_positions(rng: np.random.Generator, total: float, k: int) -> np.ndarray:
    """``k`` points of ``[0, total)``, each uniform, jointly stratified: ``(u + j) total / k`` for
    ``j = 0 .. k-1`` and one uniform ``u``, in random order. Any interval of ``[0, total)``
    of length ``w`` holds ``floor`` or ``ceil`` of ``k w / total`` of them."""
    k = int(k)
    if k <= 0:
        return np.zeros(0)
    pos = (rng.random() + np.arange(k, dtype=np.float64)) * (float(total) / k)
    return pos[rng.permutation(k)]


def balanced_draws(rng: np.random.Generator, cdf: np.ndarray, k: int) -> np.ndarray:
    """``k`` draws of the outcome ``i`` with probability ``(cdf[i] - cdf[i-1]) / cdf[-1]``, each draw
    with exactly that distribution, outcome ``i`` drawn ``floor`` or ``ceil`` of its expected
    number of times (systematic sampling, randomly ordered: :func:`balanced_positions`)."""
    cdf = np.asarray(cdf, dtype=np.float64)
    return np.searchsorted(cdf, balanced_positions(rng, cdf[-1], k), side="right")


@dataclass
class SyntheticModel:
    """The released model (module docstring). ``events``: the public
    :class:`~sparkpriv.mechanisms.event_columns.EventColumns` of the source event table, or None."""

    d: int
    n: int
    lengths: np.ndarray
    counts: np.ndarray
    noisy_counts: np.ndarray
    public: dict = field(default_factory=dict)
    events: object = None
    strata: object = None  # Strata (docs/math.md section 10, "Anchor strata") or None: one stratum

    def __post_init__(self):
        self.lengths = np.asarray(self.lengths, dtype=np.float64)
        self.counts = np.asarray(self.counts, dtype=np.float64)
        self.noisy_counts = np.asarray(self.noisy_counts, dtype=np.float64)
        if self.counts.shape != (self.d,) or self.noisy_counts.shape != (self.d,):
            raise ParameterError(f"A synthetic model of {self.d} items needs {self.d} counts.")
        if self.lengths.ndim != 1 or np.any(self.lengths < 0) or not np.all(np.isfinite(self.lengths)):
            raise ParameterError("A synthetic model's length distribution must be nonnegative and finite.")
        s = self.lengths.sum()
        if not s > 0:
            self.lengths = np.eye(1, self.lengths.size, 0).ravel()
        elif abs(s - 1.0) > 1e-12:  # shares already (a saved model): kept as they are, so a round trip is exact
            self.lengths = self.lengths / s

    @property
    def profile(self) -> np.ndarray:
        """The share of each item among the items people hold (``counts`` normalised)."""
        s = self.counts.sum()
        return self.counts / s if s > 0 else np.full(self.d, 1.0 / max(self.d, 1))

    @property
    def limit(self) -> int:
        return int(self.lengths.size - 1)

    def union_answers(self, queries, n: int | None = None) -> np.ndarray:
        """The model's expected number of people with at least one item of each query (``queries``: a
        ``(q, d)`` 0/1 sparse or dense matrix), for ``n`` people (default the released ``n``)."""
        n = self.n if n is None else int(n)
        if self.strata is not None:
            return n * self._strata_unions(queries)
        W = np.clip(np.asarray(queries @ self.profile, dtype=np.float64).ravel(), 0.0, 1.0)
        m = np.arange(self.lengths.size)
        out = np.empty(W.size)
        for s in range(0, W.size, 4096):  # (q, limit + 1) at a time
            miss = (1.0 - W[s:s + 4096, None]) ** m[None, :]
            out[s:s + 4096] = ((1.0 - miss) * self.lengths[None, :]).sum(axis=1)
        return n * out

    def _strata_unions(self, queries) -> np.ndarray:
        from sparkpriv.mechanisms.synthetic._anchors import _miss

        st = self.strata
        if hasattr(queries, "tocsc"):
            Qc = queries.tocsc()
            top = np.asarray((Qc[:, st.top] != 0).astype(np.float64).toarray())
            rest = np.asarray(Qc @ st.rest, dtype=np.float64).ravel()
            anchored = np.asarray((Qc[:, st.anchors] != 0).toarray())
        else:
            Qd = np.asarray(queries, dtype=np.float64)
            top, rest, anchored = (Qd[:, st.top] != 0).astype(np.float64), Qd @ st.rest, Qd[:, st.anchors] != 0
        W = np.clip(top @ st.top_profile.T + rest[:, None] * st.rest_share[None, :], 0.0, 1.0)  # (q, K+1)
        hit = 1.0 - _miss(st.draws, W.T)  # (K+1, q)
        hit[:st.K][anchored.T] = 1.0
        return st.weights @ hit

    def pair_answers(self, pairs: np.ndarray, n: int | None = None) -> np.ndarray:
        """Expected number of people with both items of each pair ``(a, b)`` (``(P, 2)``)."""
        n = self.n if n is None else int(n)
        pairs = np.asarray(pairs, dtype=np.int64)
        if self.strata is not None:
            from sparkpriv.mechanisms.synthetic._anchors import _miss

            st = self.strata
            pa, pb = st.item_probability(pairs[:, 0]), st.item_probability(pairs[:, 1])
            ma, mb, mab = _miss(st.draws, pa), _miss(st.draws, pb), _miss(st.draws, np.clip(pa + pb, 0, 1))
            both = 1.0 - ma - mb + mab
            anc = st.anchors[:, None]
            both[:st.K] = np.where(pairs[None, :, 0] == anc, 1.0 - mb[:st.K],
                                   np.where(pairs[None, :, 1] == anc, 1.0 - ma[:st.K], both[:st.K]))
            return n * (st.weights @ both)
        p = self.profile
        pa, pb = p[pairs[:, 0]][:, None], p[pairs[:, 1]][:, None]
        m = np.arange(self.lengths.size)[None, :]
        both = 1.0 - (1.0 - pa) ** m - (1.0 - pb) ** m + np.clip(1.0 - pa - pb, 0.0, 1.0) ** m
        return n * (both * self.lengths[None, :]).sum(axis=1)

    def sample_sparse(self, n: int, seed: int, *key: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` synthetic people as ``(offsets (n + 1,), item indices)``, each row's items distinct
        and sorted, from the keyed streams ``stream(seed, SYNTH_STAGE, *key, ...)`` (a retried task
        redraws the same rows). Post-processing of the model: no budget.

        Balanced: the people's strata and numbers of draws, and each stratum's item draws, are
        drawn by :func:`balanced_draws` (every outcome drawn ``floor`` or ``ceil`` of its expected
        number of times, in random order), so each draw has the model's distribution (the closed
        forms hold) while the table's item counts carry almost none of independent sampling's
        noise (docs/math.md section 10, "The sampler")."""
        n = int(n)
        if self.strata is not None:
            return self._strata_sample(n, seed, key)
        rng_len = stream(seed, SYNTH_STAGE, *key, 0)
        rng_items = stream(seed, SYNTH_STAGE, *key, 1)
        m = np.minimum(balanced_draws(rng_len, np.cumsum(self.lengths), n), self.limit)
        items = np.minimum(balanced_draws(rng_items, np.cumsum(self.profile), int(m.sum())), self.d - 1)
        rows = np.repeat(np.arange(n, dtype=np.int64), m)
        return self._distinct(n, rows, items)

    def _distinct(self, n: int, rows: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        code = np.unique(rows * self.d + items)  # distinct items per person, sorted by (person, item)
        r, i = np.divmod(code, self.d)
        off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(r, minlength=n), out=off[1:])
        return off, i.astype(np.int64)

    def _strata_sample(self, n: int, seed: int, key) -> tuple[np.ndarray, np.ndarray]:
        """Each person: a stratum by its weight, the anchor (anchor strata), a number of draws from the
        stratum's distribution, each draw a measured item or, with the stratum's rest share, another;
        every one of these drawn balanced (:func:`balanced_draws`) within its stratum."""
        st = self.strata
        comp = np.minimum(balanced_draws(stream(seed, SYNTH_STAGE, *key, 2), np.cumsum(st.weights), n), st.K)
        rng_len = stream(seed, SYNTH_STAGE, *key, 0)
        rng_items = stream(seed, SYNTH_STAGE, *key, 1)
        empty = (st.top_profile.sum(axis=1) + st.rest_share) <= 0  # a stratum with nothing to draw: no draws
        m = np.zeros(n, dtype=np.int64)  # (its closed forms agree: a draw of probability 0 never hits)
        order = np.argsort(comp, kind="stable")
        bounds = np.searchsorted(comp[order], np.arange(st.K + 2))
        for s in range(st.K + 1):
            sel = order[bounds[s]:bounds[s + 1]]
            if sel.size and not empty[s]:
                m[sel] = np.minimum(balanced_draws(rng_len, np.cumsum(st.draws[s]), sel.size), st.draws.shape[1] - 1)
        rows = np.repeat(np.arange(n, dtype=np.int64), m)
        rc = comp[rows]
        items = np.empty(rows.size, dtype=np.int64)
        crest = np.cumsum(st.rest)
        order = np.argsort(rc, kind="stable")
        bounds = np.searchsorted(rc[order], np.arange(st.K + 2))
        for s in range(st.K + 1):
            sel = order[bounds[s]:bounds[s + 1]]
            if not sel.size:
                continue
            ct = np.cumsum(st.top_profile[s])
            tmass, rmass = float(ct[-1]), float(st.rest_share[s])
            pos = balanced_positions(rng_items, tmass + rmass, sel.size)
            is_top = (pos < tmass) | (rmass <= 0.0)  # (a point rounded onto the total stays a measured item)
            t = sel[is_top]
            items[t] = st.top[np.minimum(np.searchsorted(ct, pos[is_top], side="right"), st.top.size - 1)]
            r = sel[~is_top]
            if r.size:
                u = (pos[~is_top] - tmass) / rmass * crest[-1]
                items[r] = np.minimum(np.searchsorted(crest, u, side="right"), self.d - 1)
        anchored = np.flatnonzero(comp < st.K)
        rows = np.concatenate([rows, anchored])
        items = np.concatenate([items, st.anchors[comp[anchored]]])
        return self._distinct(n, rows, items)

    def sample(self, n: int, seed: int):
        """``n`` synthetic people as a ``scipy.sparse`` 0/1 CSR matrix ``(n, d)``."""
        from scipy import sparse

        off, idx = self.sample_sparse(n, seed)
        return sparse.csr_matrix((np.ones(idx.size), idx, off), shape=(int(n), self.d))

    # ------------------------------------------------------------------------- file

    def to_bytes(self) -> bytes:
        header = {"format_version": FORMAT_VERSION, "d": self.d, "n": self.n, "public": self.public,
                  "events": None if self.events is None else self.events.to_header()}
        buf = io.BytesIO()
        extra = {} if self.strata is None else self.strata.arrays()
        np.savez(buf, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), lengths=self.lengths,
                 counts=self.counts, noisy_counts=self.noisy_counts, **extra)
        return buf.getvalue()

    @classmethod
    def load(cls, path_or_file) -> "SyntheticModel":
        from sparkpriv.mechanisms.event_columns import EventColumns

        with np.load(path_or_file, allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode())
            if header.get("format_version") not in READS:
                raise ParameterError(f"A synthetic model file of format {header.get('format_version')!r}; this "
                                     f"sparkpriv reads formats {', '.join(map(str, READS))}.")
            events = header.get("events")
            strata = None
            if "s_anchors" in z.files:
                from sparkpriv.mechanisms.synthetic._anchors import Strata

                strata = Strata.from_arrays(z)
            return cls(int(header["d"]), int(header["n"]), z["lengths"], z["counts"], z["noisy_counts"],
                       header.get("public", {}),
                       EventColumns.from_header(events, int(header["d"])) if events else None, strata)
