"""The released DPGM model (its file) and synthesis from it, with the spread of synthetic counts
(docs/research/dpgm.md, "Synthesizing a table", "Uncertainty"). Post-processing: no budget."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field

import numpy as np

from sparkpriv._validation import Interval, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.column_types import SYNTHETIC_TYPES, synthetic_arrays
from sparkpriv.mechanisms.event_columns import EventColumns
from sparkpriv.mechanisms.kmeans import KMeansPlan
from sparkpriv.privacy.random import new_secret_seed, stream
from sparkpriv.mechanisms.dpgm._params import (DPGMParams, FORMAT_VERSION, READ_VERSIONS, SYNTH_STAGE,
                                               length_strata)
from sparkpriv.mechanisms.dpgm._lengths import WITHIN_BIN
from sparkpriv.mechanisms.dpgm._marginals import sample_records, strata_longest
from sparkpriv.mechanisms.dpgm._plan import _make_model


@dataclass
class DPGMModel:
    """The released mixture: per-cluster parameters and noisy sizes (public)."""

    params: DPGMParams
    d: int
    thetas: np.ndarray  # (k, dim)
    sizes: np.ndarray  # (k,) noisy sizes of the clusters as trained (cluster_sizes), clamped at 0
    centers: np.ndarray  # (k, d) k-means centres
    plan_public: dict = field(default_factory=dict)
    # the synthetic type of each column (SYNTHETIC_TYPES; from the source's schema), None: all double
    column_types: tuple | None = None
    # released on event records: the public EventColumns (person and item columns, item type, the
    # declared vocabulary: column j is item vocabulary[j]); None for a table
    events: "EventColumns | None" = None
    # the noisy (k, B) histograms of record lengths, their bin edges and noise std (LengthPlan); None:
    # not released (length_share 0, or a model of format version < 4)
    lengths: np.ndarray | None = None
    length_edges: np.ndarray | None = None
    length_std: float = math.nan
    # how synthesis draws a length within its bin (WITHIN_BIN): "uniform" for files before format 6
    length_within: str = "exponential"
    # the noisy (d,) per-item counts and the shift their calibration added to every cluster's visible
    # biases (already in thetas; MarginalPlan); None: not released (marginal_share 0)
    item_counts: np.ndarray | None = None
    marginal_shift: np.ndarray | None = None

    def __post_init__(self):
        dim = self.generator().dim
        if np.ndim(self.thetas) != 2 or np.shape(self.thetas)[1] != dim:
            raise ParameterError(f"The model's parameters have shape {np.shape(self.thetas)}; its params "
                                 f"(model={self.params.model!r}, hidden={self.params.hidden}, length strata "
                                 f"{list(length_strata(self.params, self.d))}) need {dim} per cluster.")

    @property
    def k(self) -> int:
        return self.thetas.shape[0]

    @property
    def reliable(self) -> np.ndarray:
        """``(k,)`` bool: the clusters synthesis draws from (docs/research/dpgm.md, "Unreliable clusters"); every
        cluster for a model written before the flags, or when none is reliable."""
        rec = (self.plan_public or {}).get("clusters")
        if not rec or not rec.get("reliable"):
            return np.ones(self.k, dtype=bool)
        out = np.zeros(self.k, dtype=bool)
        out[np.asarray(rec["reliable"], dtype=np.int64)] = True
        return out

    def mixture_weights(self) -> np.ndarray:
        """The probability of each cluster in synthesis: the noisy sizes of the reliable clusters,
        normalised (uniform over them when their sizes are all 0)."""
        w = np.where(self.reliable, np.maximum(np.asarray(self.sizes, float), 0.0), 0.0)
        if not np.any(w > 0):
            w = self.reliable.astype(float)
        return w / w.sum()

    def sample_cluster(self, gen, j: int, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` records of cluster ``j``'s model; with the length histograms, each record's length
        drawn from cluster ``j``'s (:func:`synthetic_lengths`; a model with length strata falls back
        to the pooled histogram, then ``L``: :func:`draw_lengths`), then the record given it."""
        longest = strata_longest(gen, self.params, self.d)
        return sample_records(gen, self.thetas[j], int(n), rng, j=j, lengths=self.lengths, edges=self.length_edges,
                              std=self.length_std, longest=longest, within=self.length_within)

    @property
    def types(self) -> tuple:
        """The type of each synthetic column (``double`` for all when none was recorded)."""
        return tuple(self.column_types) if self.column_types else ("double",) * self.d

    @property
    def column_names(self) -> tuple:
        """The released column names (``x0, x1, ...`` for a numpy input)."""
        return tuple(str(c) for c in self.params.columns) if self.params.columns else \
            tuple(f"x{j}" for j in range(self.d))

    def generator(self):
        return _make_model(self.params, self.d)

    def query_spread(self, queries, n: int, *, repeats: int = 199, confidence: float = 0.95,
                     threshold: float = 0.5, seed: int | None = None) -> "QuerySpread":
        """The spread of counting queries over ``repeats`` syntheses of ``n`` records
        (:func:`query_spread`; post-processing, no budget; docs/research/dpgm.md, "Uncertainty")."""
        return query_spread(self, queries, n, repeats=repeats, confidence=confidence, threshold=threshold,
                            seed=seed)

    def save(self, path) -> None:
        """A ``.npz`` with the arrays and a JSON header (``format_version``)."""
        with open(path, "wb") as f:
            f.write(self.to_bytes())

    def to_bytes(self) -> bytes:
        """The ``.npz`` file's bytes (:meth:`save`; a release publishes them as ``MODEL_FILE``)."""
        header = {"format": "sparkpriv-dpgm", "format_version": FORMAT_VERSION,
                  "params": self.params.public_dict(), "d": self.d,
                  # resolved (the default may change): the file says which strata its thetas hold
                  "length_strata": list(length_strata(self.params, self.d)), "public": self.plan_public,
                  "column_types": list(self.types),
                  "events": None if self.events is None else self.events.to_header(),
                  "lengths": None if self.lengths is None else
                  {"edges": [int(e) for e in self.length_edges], "std": float(self.length_std),
                   "within_bin": self.length_within},
                  "item_counts": None if self.item_counts is None else
                  {"note": "item_counts: the noisy per-item counts; marginal_shift: the vector added to every "
                           "cluster's visible biases (in thetas) to move the mixture's marginals to them"}}
        arrays = {} if self.lengths is None else {"lengths": np.asarray(self.lengths, dtype=np.float64)}
        if self.item_counts is not None:
            arrays["item_counts"] = np.asarray(self.item_counts, dtype=np.float64)
            arrays["marginal_shift"] = np.asarray(self.marginal_shift, dtype=np.float64)
        buf = io.BytesIO()
        np.savez(buf, header=np.frombuffer(json.dumps(header, default=float).encode(), np.uint8),
                 thetas=self.thetas, sizes=self.sizes, centers=self.centers, **arrays)
        return buf.getvalue()

    @classmethod
    def load(cls, path) -> "DPGMModel":
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode())
            version = header.get("format_version")
            if header.get("format") != "sparkpriv-dpgm" or version not in READ_VERSIONS:
                raise ParameterError(
                    f"{path} is not a sparkpriv DPGM model of format version "
                    f"{' or '.join(map(str, READ_VERSIONS))} (found {header.get('format')!r} version {version!r}).")
            d = int(header["d"])
            types = None  # version 1: no types recorded, every synthetic column is double
            if version >= 2:
                types = tuple(str(t) for t in header.get("column_types") or ())
                if len(types) != d or any(t not in SYNTHETIC_TYPES for t in types):
                    raise ParameterError(f"{path}: the model's column types {list(types)!r} are not {d} of "
                                         f"{', '.join(SYNTHETIC_TYPES)}: not a released model.")
            events = None  # versions 1 and 2: tables only (event records were read as tables)
            if version >= 3 and header.get("events") is not None:
                events = EventColumns.from_header(header["events"], d, str(path))
            lengths = edges = None  # versions 1 to 3: no length histograms
            std, within = math.nan, "exponential"
            if version >= 4 and header.get("lengths") is not None:
                within = str(header["lengths"].get("within_bin", "uniform"))  # before 6: uniform
                if within not in WITHIN_BIN:
                    raise ParameterError(f"{path}: the model's lengths are drawn {within!r} within a bin, "
                                         f"not one of {', '.join(WITHIN_BIN)}: not a released model.")
                edges = np.asarray(header["lengths"]["edges"], dtype=np.int64)
                lengths, std = np.asarray(z["lengths"], dtype=np.float64), float(header["lengths"]["std"])
                if lengths.shape != (z["thetas"].shape[0], edges.size - 1) or np.any(np.diff(edges) <= 0):
                    raise ParameterError(f"{path}: the model's length histograms {lengths.shape} do not match "
                                         f"its {z['thetas'].shape[0]} clusters and {edges.size - 1} bins.")
            counts = shift = None  # optional arrays (marginal_share > 0): readers that ignore them synthesize
            # the same (the shift is in thetas)
            if header.get("item_counts") is not None:
                counts = np.asarray(z["item_counts"], dtype=np.float64)
                shift = np.asarray(z["marginal_shift"], dtype=np.float64)
                if counts.shape != (d,) or shift.shape != (d,):
                    raise ParameterError(f"{path}: the model's item counts {counts.shape} or marginal shift "
                                         f"{shift.shape} do not match its {d} columns.")
            params = dict(header["params"])
            params.setdefault("average_tail", 0.0)  # written before the tail mean: the last iterate
            if version < 5:
                params["length_strata"] = 0  # written before the length strata: none
            elif tuple(length_strata(DPGMParams(**params), d)) != tuple(header.get("length_strata") or ()):
                params["length_strata"] = list(header.get("length_strata") or ()) or 0
            return cls(DPGMParams(**params), d, z["thetas"], z["sizes"], z["centers"],
                       header.get("public", {}), types, events, lengths, edges, std, within, counts, shift)



def synthesize(model: DPGMModel, n: int, seed: int) -> np.ndarray:
    """``n`` synthetic records (n, d): cluster ``j`` with probability noisy ``n_j / sum``, then
    its model's sampler; reproducible from ``seed`` (post-processing: no budget)."""
    check_param("n", n, [Interval("integer", 0, None, "left")], "synthesize")
    counts = stream(seed, SYNTH_STAGE, model.k).multinomial(int(n), model.mixture_weights())
    gen = model.generator()
    parts = [model.sample_cluster(gen, j, int(c), stream(seed, SYNTH_STAGE, j))
             for j, c in enumerate(counts) if c > 0]
    out = np.concatenate(parts) if parts else np.zeros((0, model.d))
    return out[stream(seed, SYNTH_STAGE, model.k + 1).permutation(out.shape[0])]


def synthesize_table(model: DPGMModel, n: int, seed: int):
    """:func:`synthesize`'s ``n`` records as a pyarrow Table: the released column names and the
    source's column types (``model.types``: integer and boolean columns get the model's 0/1
    values, rounded; float columns stay float; all double for a model of format version 1)."""
    import pyarrow as pa

    X = np.clip(synthesize(model, n, seed), 0.0, 1.0)
    return pa.Table.from_arrays(synthetic_arrays(X, model.types), names=list(model.column_names))


def synthesize_part(model: DPGMModel, n: int, seed: int, *key: int) -> np.ndarray:
    """``n`` synthetic records (n, d) of one slice of a large table: :func:`synthesize`'s
    mixture (cluster ``j`` with probability noisy ``n_j / sum``, then its model's sampler, rows
    shuffled) from the keyed streams ``stream(seed, SYNTH_STAGE, *key, ...)``, values clipped to
    the declared box ``[0, 1]``. A Spark task passes its ``(partition, batch)`` as ``key``: a
    retried task regenerates the same rows, and distinct keys give independent slices.
    Post-processing of the released model: no budget."""
    check_param("n", n, [Interval("integer", 0, None, "left")], "synthesize")
    key = tuple(int(v) for v in key)
    counts = stream(seed, SYNTH_STAGE, *key, model.k).multinomial(int(n), model.mixture_weights())
    gen = model.generator()
    parts = [model.sample_cluster(gen, j, int(c), stream(seed, SYNTH_STAGE, *key, j))
             for j, c in enumerate(counts) if c > 0]
    out = np.concatenate(parts).astype(np.float64, copy=False) if parts else np.zeros((0, model.d))
    out = out[stream(seed, SYNTH_STAGE, *key, model.k + 1).permutation(out.shape[0])]
    return np.clip(out, 0.0, 1.0)


# ----------------------------------------------------------------------------- uncertainty of synthetic counts

DEFAULT_SPREAD_REPEATS = 199  # with confidence 0.95: the 5th and 195th of 199 answers, exactly 95%
SPREAD_METHOD = ("R independent syntheses of n records from the released model (post-processing, no "
                 "budget); per counting query the mean, the std and the central interval between order "
                 "statistics r = floor((R + 1) (1 - confidence) / 2) and R + 1 - r of the R answers, which "
                 "holds the answer of another independent synthesis with probability at least "
                 "1 - 2 r / (R + 1) >= confidence (exactly, for answers without ties)")


@dataclass(frozen=True)
class QuerySpread:
    """Per counting query, the spread of its answer over repeated syntheses (arrays of length
    ``n_queries``); :func:`query_spread`."""

    mean: np.ndarray
    std: np.ndarray
    low: np.ndarray
    high: np.ndarray
    repeats: int
    confidence: float
    coverage: float  # 1 - 2 r / (R + 1): the interval's coverage of a fresh synthesis (at least)


def _query_matrix(queries, d: int) -> np.ndarray:
    Q = np.asarray(getattr(queries, "matrix", queries), dtype=np.float64)
    if Q.ndim == 1:
        Q = Q[:, None]
    if Q.ndim != 2 or Q.shape[0] != d:
        raise ParameterError(f"query_spread: queries must be a QuerySet or a (d, n_queries) 0/1 matrix with "
                             f"d = {d} rows (one per column of the records). Got shape {Q.shape}.")
    return Q


def answer_dense(records: np.ndarray, Q: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Per query (a column of ``Q``), the number of records with a value ``>= threshold`` in any of
    its columns (the counting queries of :mod:`~sparkpriv.mechanisms.counting_queries` on a dense
    table)."""
    visited = (np.asarray(records) >= threshold).astype(np.float64)
    return ((visited @ (np.asarray(Q) > 0).astype(np.float64)) > 0).sum(axis=0).astype(np.float64)


def _spread_seed(seed: int, i: int) -> int:
    """The seed of synthesis ``i`` of :func:`query_spread` (independent streams per ``i``)."""
    from sparkpriv.privacy.random import derive_seed

    return derive_seed(int(seed), f"query-spread/{int(i)}")


def query_spread(model: "DPGMModel", queries, n: int, *, repeats: int = DEFAULT_SPREAD_REPEATS,
                 confidence: float = 0.95, threshold: float = 0.5, seed: int | None = None) -> QuerySpread:
    """How much counting queries on a synthetic table of ``n`` records move between syntheses.

    ``repeats`` (R) independent syntheses from the same released ``model``
    (post-processing: no budget); ``queries``: a
    :class:`~sparkpriv.mechanisms.counting_queries.QuerySet` or a ``(d, n_queries)``
    0/1 matrix, answered as "records with a value ``>= threshold`` in any of
    the query's columns". Per query: the mean and std of the R answers and
    the central interval between order statistics ``r`` and ``R + 1 - r``,
    ``r = floor((R + 1)(1 - confidence) / 2)``: another independent synthesis
    answers inside it with probability at least ``coverage = 1 - 2 r / (R + 1)``
    (exchangeability; exactly 0.95 at the default R = 199). It is the spread
    of the synthesis only: the noise in the released model and the model's
    error against the real data are not in it (docs/research/dpgm.md, "Uncertainty").
    ``seed`` makes it reproducible; by default fresh OS entropy.
    """
    caller = "query_spread"
    check_param("n", n, [Interval("integer", 1, None, "left")], caller)
    check_param("repeats", repeats, [Interval("integer", 1, None, "left")], caller)
    check_param("confidence", confidence, [Interval("real", 0, 1, "neither")], caller)
    r = int(math.floor((repeats + 1) * (1.0 - confidence) / 2.0))
    if r < 1:
        need = int(math.ceil(2.0 / (1.0 - confidence))) - 1
        raise ParameterError(f"The 'repeats' parameter of {caller} must be at least {need} for a "
                             f"{confidence:g} interval (the interval lies between two of the answers). "
                             f"Got {repeats}.")
    Q = _query_matrix(queries, model.d)
    if seed is None:
        seed = new_secret_seed("dpgm-query-spread")  # not a secret: fresh entropy for the syntheses
    answers = np.stack([answer_dense(synthesize(model, n, _spread_seed(seed, i)), Q, threshold)
                        for i in range(repeats)])
    srt = np.sort(answers, axis=0)
    return QuerySpread(mean=answers.mean(axis=0), std=answers.std(axis=0, ddof=1) if repeats > 1 else
                       np.zeros(Q.shape[1]), low=srt[r - 1], high=srt[repeats - r], repeats=int(repeats),
                       confidence=float(confidence), coverage=1.0 - 2.0 * r / (repeats + 1))


def uncertainty_public(kplan: KMeansPlan) -> dict:
    """The receipt's ``uncertainty`` of a DPGM release: public parameters only, no data-derived number."""
    return {
        "cluster_size_std": float(kplan.count_std),
        "cluster_size_note": "each released cluster size is the k-means count plus Gaussian noise of this "
                             "std (before the clamp at 0); 95%: size +- 1.96 std",
        "synthetic_queries": {
            "accessor": "model.query_spread(queries, n, repeats=199, confidence=0.95)",
            "method": SPREAD_METHOD,
            "default_repeats": DEFAULT_SPREAD_REPEATS,
            "covers": "the answer of another synthesis from the same model: the spread of the synthesis "
                      "only, not the noise in the model nor its error against the real data",
            "docs": "docs/research/dpgm.md",
        },
    }
