"""Realistic event tables (call-detail records, transit taps), generated in
parallel by Spark from keyed streams (never on the driver).

The generative model (documented with measured statistics in ``docs/generators.md``):

* **Map** (public, small, built on the driver from the seed): ``items`` points
  on a 100 x 100 km square. CDR towers: a few cities (Gaussian clusters of
  Zipf-distributed sizes) plus a rural background. Transit stations: evenly
  spaced along straight lines crossing the city near its centre. Each item has
  a Zipf-like popularity (``1 / rank^zipf``, ranks favouring central items)
  and a list of its ``neighbours`` nearest items.
* **People** (generated per block of 4096 person ids, each block from the
  stream keyed by (seed, block), so a person's events depend only on the seed
  and their id): the number of distinct items ``m = 1 + floor(X)``,
  ``X ~ LogNormal(mu, sigma)`` (heavy tail: most people visit a handful of
  items, a few visit hundreds), capped at ``max_distinct``. Places (anchors):
  home (drawn by popularity), work (near home: a neighbour of home at a
  geometric rank), and ``ceil(m / items_per_anchor)`` other places (by
  popularity), so heavy users travel. The ``m`` distinct items are drawn
  without replacement by an exponential race with weights
  ``anchor_weight * popularity * locality^rank`` over the anchors'
  neighbourhoods (spatial locality + popularity).
* **Events**: each kept item gets ``Geometric(1 / events_per_item)`` events
  (at least one) at times uniform over ``period_days`` days with a diurnal
  profile (daytime calls; morning and evening peaks for transit).

Defaults reproduce the paper's marginals: CDR 1,303 towers, mean 11.42 and max
422 distinct towers per person at 4.4 M people; TRANSIT 342 stations, mean
5.26, max 57 at 1.2 M people.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from sparkpriv._validation import Interval, check_param
from sparkpriv.privacy.random import stream

__all__ = ["EventModel", "CDR_MODEL", "TRANSIT_MODEL", "event_map", "generate_events",
           "generate_cdr", "generate_transit", "person_items", "person_matrix", "write_events"]

_BLOCK = 4096
_START = 1_736_121_600  # 2025-01-06 00:00 UTC, a Monday


@dataclass(frozen=True)
class EventModel:
    """Parameters of the generative model (see the module docstring)."""

    kind: str                    # "cdr" | "transit"
    items: int
    mu: float                    # log-normal of the distinct-item count
    sigma: float
    max_distinct: int
    zipf: float = 0.9
    neighbours: int = 24
    locality: float = 0.8        # weight decay per neighbour rank
    items_per_anchor: float = 6.0
    anchor_weights: tuple = (4.0, 2.5, 1.0)  # home, work, each other place
    events_per_item: float = 2.0
    period_days: int = 30
    cities: int = 8
    lines: int = 12
    person_col: str = "caller_id"
    item_col: str = "tower_id"

    def with_(self, **kw) -> "EventModel":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


CDR_MODEL = EventModel("cdr", items=1303, mu=2.076, sigma=0.793, max_distinct=1303,
                       events_per_item=2.0, person_col="caller_id", item_col="tower_id")
TRANSIT_MODEL = EventModel("transit", items=342, mu=1.41, sigma=0.546, max_distinct=342,
                           zipf=0.7, neighbours=16, locality=0.75, items_per_anchor=4.0,
                           events_per_item=3.0, person_col="card_id", item_col="station_id")


def event_map(model: EventModel, seed: int):
    """The public map: ``(xy (T, 2), popularity (T,), neighbours (T, K))``."""
    rng = stream(seed, 0)
    T = model.items
    if model.kind == "cdr":
        sizes = 1.0 / np.arange(1, model.cities + 1) ** 1.0
        centres = rng.uniform(15, 85, (model.cities, 2))
        n_rural = int(0.15 * T)
        which = rng.choice(model.cities, T - n_rural, p=sizes / sizes.sum())
        spread = 2.0 + 6.0 * np.sqrt(sizes / sizes[0])
        xy = np.vstack([centres[which] + rng.standard_normal((T - n_rural, 2)) * spread[which, None],
                        rng.uniform(0, 100, (n_rural, 2))])
        centre_dist = np.min(np.linalg.norm(xy[:, None, :] - centres[None], axis=2), axis=1)
    else:
        per = np.full(model.lines, T // model.lines)
        per[: T % model.lines] += 1
        pts = []
        for line, n in enumerate(per):
            ang = rng.uniform(0, np.pi)
            off = rng.normal(0, 8, 2)
            half = rng.uniform(30, 48)
            t = np.linspace(-half, half, n)
            pts.append(50 + off + np.outer(t, [np.cos(ang), np.sin(ang)]))
        xy = np.vstack(pts)
        centre_dist = np.linalg.norm(xy - 50, axis=1)
    xy = np.clip(xy, 0, 100)
    # Zipf popularity; central items tend to get the better ranks
    order = np.argsort(centre_dist + rng.exponential(10.0, T))
    rank = np.empty(T)
    rank[order] = np.arange(1, T + 1)
    pop = 1.0 / rank ** model.zipf
    pop /= pop.sum()
    K = min(model.neighbours, T)
    D = np.linalg.norm(xy[:, None, :] - xy[None], axis=2)
    nbr = np.argsort(D, axis=1, kind="stable")[:, :K].astype(np.int32)
    return xy, pop, nbr


def person_items(model: EventModel, pop: np.ndarray, nbr: np.ndarray, rng: np.random.Generator, n: int):
    """Distinct items of ``n`` people: ``(person index, item)`` arrays, one entry per
    (person, distinct item), drawn by the model from ``rng``."""
    T, K = nbr.shape
    m = np.minimum(1 + np.floor(rng.lognormal(model.mu, model.sigma, n)).astype(np.int64), model.max_distinct)
    n_other = np.ceil(m / model.items_per_anchor).astype(np.int64)
    n_anchor = 2 + n_other
    A = int(n_anchor.sum())
    a_person = np.repeat(np.arange(n), n_anchor)
    first = np.concatenate(([0], np.cumsum(n_anchor)[:-1]))
    slot = np.arange(A) - np.repeat(first, n_anchor)
    cdf = np.cumsum(pop)
    anchors = np.minimum(np.searchsorted(cdf, rng.random(A) * cdf[-1]), T - 1)
    home = anchors[first]
    work_rank = np.minimum(rng.geometric(0.15, n), K - 1)
    anchors[first + 1] = nbr[home, work_rank]
    aw = np.asarray(model.anchor_weights, float)
    a_weight = aw[np.minimum(slot, 2)]
    # candidates: each anchor's neighbourhood, weighted by popularity and locality
    cand = nbr[anchors].ravel()
    c_person = np.repeat(a_person, K)
    w = np.repeat(a_weight, K) * pop[cand] * np.tile(model.locality ** np.arange(K), A)
    # one race per distinct (person, item): the min of independent exponential races
    # with weights w_1, w_2, ... is the race of the summed weight
    uk, inv = np.unique(c_person * T + cand, return_inverse=True)
    score = rng.exponential(1.0, uk.size) / np.bincount(inv.ravel(), weights=w, minlength=uk.size)
    rank = np.empty(uk.size, np.int64)
    rank[np.argsort(score)] = np.arange(uk.size)
    o = np.argsort((uk // T) * uk.size + rank)  # by person, then by score (keys are distinct)
    p_s, c_s = uk[o] // T, (uk[o] % T).astype(np.int32)
    starts = np.searchsorted(p_s, np.arange(n))
    pos = np.arange(p_s.size) - starts[p_s]
    sel = pos < m[p_s]
    return p_s[sel], c_s[sel]


def person_matrix(model: EventModel, people: int, seed: int = 0):
    """The distinct items of people ``0 .. people-1`` of ``generate_events(model, people=N,
    seed=seed)`` (any ``N >= people``: the same blocks, so the same people), in memory, as a
    scipy CSR 0/1 matrix ``(people, model.items)`` of float32, indices sorted (no events, no times)."""
    from scipy.sparse import csr_matrix

    check_param("people", people, [Interval("integer", 1, None, "left")], "person_matrix")
    _, pop, nbr = event_map(model, seed)
    ps, cs = [], []
    for blk in range(-(-people // _BLOCK)):
        p, c = person_items(model, pop, nbr, stream(seed, 1, blk), _BLOCK)
        p = p + blk * _BLOCK
        sel = p < people
        ps.append(p[sel])
        cs.append(c[sel])
    p, c = np.concatenate(ps), np.concatenate(cs)
    X = csr_matrix((np.ones(p.size, np.float32), (p, c)), shape=(people, model.items))
    X.sum_duplicates()
    X.sort_indices()
    return X


def _diurnal(kind: str) -> np.ndarray:
    h = np.arange(24)
    if kind == "cdr":
        p = 0.15 + np.exp(-0.5 * ((h - 14) / 4.5) ** 2)
    else:
        p = 0.05 + np.exp(-0.5 * ((h - 8) / 1.2) ** 2) + 0.9 * np.exp(-0.5 * ((h - 18) / 1.5) ** 2)
    return np.cumsum(p / p.sum())


def generate_events(spark, model: EventModel, *, people: int, seed: int = 0, partitions: int | None = None):
    """A DataFrame of events: person id (long), item id (int, in ``[0, items)``), ``ts`` (timestamp).

    Generated in parallel: each block of 4096 person ids from the stream keyed
    by (seed, block), so the table does not depend on the partitioning.
    """
    caller = f"generate {model.kind}"
    check_param("people", people, [Interval("integer", 1, None, "left")], caller)
    check_param("items", model.items, [Interval("integer", 2, 1_000_000, "both")], caller)
    check_param("events_per_item", model.events_per_item, [Interval("real", 1, None, "left")], caller)
    check_param("period_days", model.period_days, [Interval("integer", 1, 3660, "both")], caller)
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType, TimestampType

    if partitions is None:
        try:
            par = spark.sparkContext.defaultParallelism
        except Exception:
            par = 2
        partitions = max(par, -(-people // 250_000))
    xy, pop, nbr = event_map(model, seed)
    diurnal = _diurnal(model.kind)
    p_ev = 1.0 / model.events_per_item
    period = model.period_days
    names = (model.person_col, model.item_col, "ts")
    schema = StructType([StructField(names[0], LongType(), False), StructField(names[1], IntegerType(), False),
                         StructField("ts", TimestampType(), False)])

    def sparkpriv_generate_events(batches):
        for b in batches:
            ids = b.column(0).to_numpy()
            if ids.size == 0:
                continue
            for blk in np.unique(ids // _BLOCK):
                rng = stream(seed, 1, int(blk))
                p_idx, item = person_items(model, pop, nbr, rng, _BLOCK)
                n_ev = rng.geometric(p_ev, p_idx.size)
                pid = np.repeat(blk * _BLOCK + p_idx, n_ev)
                it = np.repeat(item, n_ev).astype(np.int32)
                E = pid.size
                day = rng.integers(0, period, E)
                hour = np.searchsorted(diurnal, rng.random(E))
                sec = _START + day * 86400 + hour * 3600 + rng.integers(0, 3600, E)
                lo, hi = ids.min(), ids.max()
                sel = (pid >= lo) & (pid <= hi)  # the ids of this batch only
                ts = pa.array(sec[sel] * 1_000_000, pa.timestamp("us", tz="UTC"))
                yield pa.RecordBatch.from_arrays([pa.array(pid[sel]), pa.array(it[sel]), ts], list(names))

    sparkpriv_generate_events.__name__ = f"sparkpriv_generate_{model.kind}"
    return spark.range(0, people, 1, numPartitions=partitions).mapInArrow(sparkpriv_generate_events, schema)


def generate_cdr(spark, *, people: int, seed: int = 0, partitions: int | None = None, **params):
    """Call-detail records: ``caller_id, tower_id, ts`` (see :data:`CDR_MODEL`)."""
    return generate_events(spark, CDR_MODEL.with_(**params), people=people, seed=seed, partitions=partitions)


def generate_transit(spark, *, people: int, seed: int = 0, partitions: int | None = None, **params):
    """Smart-card taps: ``card_id, station_id, ts`` (see :data:`TRANSIT_MODEL`)."""
    return generate_events(spark, TRANSIT_MODEL.with_(**params), people=people, seed=seed,
                           partitions=partitions)


def expected_mean_distinct(model: EventModel) -> float:
    """E[m] of the model's distinct-item count (before the candidate shortfall)."""
    # E floor(X) for log-normal X, by quadrature over the normal
    z = np.linspace(-8, 8, 4001)
    x = np.exp(model.mu + model.sigma * z)
    m = np.minimum(1 + np.floor(x), model.max_distinct)
    wgt = np.exp(-z * z / 2)
    return float((m * wgt).sum() / wgt.sum())


def map_table(model: EventModel, seed: int) -> str:
    """The public map as CSV text (``id,x,y``): usable as a vocabulary file."""
    xy, _, _ = event_map(model, seed)
    rows = [f"{model.item_col},x_km,y_km"] + [f"{i},{x:.3f},{y:.3f}" for i, (x, y) in enumerate(xy)]
    return "\n".join(rows) + "\n"



def write_events(spark, kind: str, *, people: int, output: str, map_output: str | None = None,
                 seed: int = 0, partitions: int | None = None, overwrite: bool = False, **params) -> dict:
    """Generate a ``kind`` ("cdr" | "transit") event table and write it as Parquet
    (``sparkpriv generate cdr|transit``); optionally write the public map CSV."""
    model = {"cdr": CDR_MODEL, "transit": TRANSIT_MODEL}[kind].with_(**params)
    df = generate_events(spark, model, people=people, seed=seed, partitions=partitions)
    df.write.mode("overwrite" if overwrite else "errorifexists").parquet(output)
    if map_output:
        with open(map_output, "w") as f:
            f.write(map_table(model, seed))
    return {"model": model, "vocabulary": f"items {model.item_col} 0..{model.items - 1}"}
