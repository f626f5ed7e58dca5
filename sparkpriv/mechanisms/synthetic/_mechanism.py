"""The synthetic person x item table release (:class:`Synthetic`), on both engines (docs/math.md
section 10; docs/utility.md).

Released, each once, on the driver:

1. the histogram of the number of distinct items per person over ``0 .. length_limit`` (the last
   bin: that many or more), with Laplace noise: one person moves between two bins under
   replace-one (L1 sensitivity 2; 1 under add-remove). Pure ``length_share * epsilon``. With
   ``max_items="auto"`` it is the histogram that chose ``L``
   (:mod:`sparkpriv.mechanisms.auto_bound`), released once and used for both;
2. the per-item counts of the records bounded at ``L`` items per person, with discrete Gaussian
   noise: a replaced person moves the count vector by ``x' - x`` with ``x, x'`` in ``{0, 1}^d``
   and at most ``L`` ones, so ``||x' - x||_2 <= sqrt(2 L)`` (``x . x' >= 0``); ``sqrt(L)`` under
   add-remove. Calibrated to the rest of ``(epsilon, delta)``.

The model (:class:`~sparkpriv.mechanisms.synthetic.SyntheticModel`) is post-processing of the two:
the pooled length distribution, the shrunk counts, ``n`` the noisy histogram's total. Its synthetic
tables are generated from it (``model.sample``, ``sparkpriv synthesize``), as many as wanted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sparkpriv._validation import Interval, Options
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.mechanisms.synthetic._model import MODEL_FILE, FORMAT_VERSION, SyntheticModel
from sparkpriv.mechanisms.synthetic._post import (CALIBRATE_LOSS, CALIBRATE_STDS, TAIL_STDS, calibrate, expand_bins,
                                                  pooled_lengths, shrunk_counts, uncapped_ratio)
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import compose, epsilon_of
from sparkpriv.privacy.random import new_secret_seed, stream

__all__ = ["SyntheticParams", "Synthetic", "SYNTHETIC", "plan_synthetic", "item_sums_fn"]

MAX_COUNT = 2**33  # a public clamp of every exact count (never reached by real data)
MIN_COUNT_CLAMP = 2.0**20  # with very little noise (epsilon in the hundreds) the clamp is lowered, not below this
COUNTS_STAGE, LENGTHS_STAGE, STRATA_STAGE = 1, 2, 3
_POS = Interval("real", 0, None, "neither")


@dataclass(frozen=True, kw_only=True)
class SyntheticParams(_p.Params):
    """Public parameters of the synthetic table release (bounded event records)."""

    epsilon: float = _p.option(help="epsilon of the release (the accounted epsilon never exceeds it)",
                               constraints=[_POS])
    delta: float = _p.option(help="delta of the release, in (0, 1) (the per-item counts' Gaussian noise); at "
                             "most 1/n is advised", constraints=[Interval("real", 0, 1, "neither")])
    length_share: float = _p.option(0.15, help="share of epsilon spent on the histogram of items per person "
                                    "(with --max-items auto: the share of the histogram that also chooses L)",
                                    constraints=[Interval("real", 0, 0.9, "neither")])
    length_limit: int = _p.option(256, help="the histogram of items per person covers 0 .. this many (the "
                                  "last bin: this many or more); with --max-items auto: --max-items-limit",
                                  constraints=[Interval("integer", 1, 1 << 16, "both")])
    shrink: str = _p.option("eb", help="post-processing of the noisy per-item counts: eb (each count's posterior "
                            "mean under a prior fitted to all of them) or clamp (negative counts to 0)",
                            constraints=[Options(("eb", "clamp"))])
    anchors: int = _p.option(64, help="at most this many popular items get a stratum of their own (the people whose "
                             "most popular item it is): their item profile and lengths are measured apart, so the "
                             "model learns which items go together; the number used is chosen from the first "
                             "release (strata of at least 10 noise stds of people; fewer than 4 such: none, "
                             "and their budget measures the per-item counts again); 0: one profile for everyone",
                             constraints=[Interval("integer", 0, 4096, "both")])
    anchor_share: float = _p.option(0.2, help="with anchors: the share of the counts' budget (after the length "
                                    "histogram) that measures the strata", constraints=[Interval("real", 0, 1, "neither")])
    neighbors: str = _p.option("replace-one", help="neighbour relation: replace-one (n public) or add-remove",
                               kind="neighbors")


def item_sums_fn(d: int):
    """Block of binary records -> the number of records holding each item, then the number of
    records ``(d + 1,)`` (the last: public under replace-one, never released under add-remove)."""

    def item_sums(block):
        out = np.bincount(np.asarray(block.indices, np.int64), minlength=d + 1).astype(np.float64)
        out[d] = block.n
        return out

    return item_sums


@dataclass
class SyntheticPlan:
    """The public calibration: the counts' Gaussian and (when this release measures it) the
    length histogram's Laplace, their sensitivities and the bound ``L``."""

    d: int
    L: int
    limit: int
    neighbors: str
    counts_noise: _noise.GaussianNoise
    length_noise: object | None  # LaplaceNoise; None: the auto bound's histogram is used
    length_epsilon: float
    strata_noise: _noise.GaussianNoise | None = None  # the anchor strata's Gaussian (None: no strata)
    anchors: int = 0  # the most anchors that may be chosen
    count_clamp: float = float(MAX_COUNT)  # public clamp of every exact count (lowered for very small noise)

    @property
    def counts_sensitivity(self) -> float:
        return math.sqrt((2.0 if self.neighbors == "replace-one" else 1.0) * self.L)

    def gaussian_events(self):
        if self.strata_noise is None:
            return self.counts_noise.dp_event()
        return compose([self.counts_noise.dp_event(), self.strata_noise.dp_event()])

    def dp_event(self):
        if self.length_noise is None:
            return self.gaussian_events()
        return compose([self.length_noise.dp_event(), self.gaussian_events()])

    def to_public_dict(self) -> dict:
        out = {"items": self.d, "max_items": self.L, "length_limit": self.limit, "neighbors": self.neighbors,
               "count_clamp": self.count_clamp,
               "counts": {"sensitivity_l2": self.counts_sensitivity, "noise": self.counts_noise.to_public_dict(),
                          "std": float(self.counts_noise.std),
                          "note": "number of people holding each item, each person's at most max_items items"},
               "lengths": ({"source": "the auto contribution bound's histogram (contribution_bound_estimation)"}
                           if self.length_noise is None else
                           {"sensitivity_l1": 2.0 if self.neighbors == "replace-one" else 1.0,
                            "epsilon": self.length_epsilon, "noise": self.length_noise.to_public_dict(),
                            "std": float(self.length_noise.std)})}
        if self.strata_noise is not None:
            from sparkpriv.mechanisms.synthetic._anchors import ANCHOR_STDS, STRATA_LENGTH_CUTS, TOP_ITEMS

            cuts = ", ".join(str(c) for c in STRATA_LENGTH_CUTS)
            out["strata"] = {"sensitivity_l2": self.counts_sensitivity, "noise": self.strata_noise.to_public_dict(),
                             "std": float(self.strata_noise.std), "anchors_max": self.anchors,
                             "measured_items": int(min(TOP_ITEMS, self.d)),
                             "note": f"per stratum (the people whose most popular item is one anchor, or none): "
                                     f"the number of items per person (length bins starting at {cuts} and the "
                                     f"length limit) and each person's at most max_items - 1 "
                                     f"most popular other items among the {int(min(TOP_ITEMS, self.d))} most "
                                     f"popular; anchors: the most popular items whose stratum the first release "
                                     f"implies holds at least {ANCHOR_STDS:g} noise stds of people"}
        return out


def plan_synthetic(params: SyntheticParams, d: int, L: int, *, lengths_given: bool, caller: str) -> SyntheticPlan:
    """Calibrate the release's noise from public parameters (reads no data, draws nothing)."""
    from sparkpriv.mechanisms.auto_bound import histogram_noise_for
    from sparkpriv.privacy.calibration import split_epsilon

    rel = params.neighbors if isinstance(params.neighbors, str) else params.neighbors.name
    if lengths_given:  # max_items='auto': the release path measured the histogram (and charges it)
        eps_len, eps_counts, lnoise = 0.0, float(params.epsilon), None
    else:
        eps_len, eps_counts = split_epsilon(params.epsilon, params.length_share)
        lnoise = histogram_noise_for(epsilon=eps_len, neighbors=rel, limit=min(params.length_limit, d))
    factor = 2.0 if rel == "replace-one" else 1.0
    clamp = float(MAX_COUNT)
    while True:  # the public clamp of the exact counts: as large as the noise's grid can hold
        try:
            cnoise = _noise.calibrate_gaussian_noise(sensitivity=math.sqrt(factor * L), epsilon=eps_counts,
                                                     delta=float(params.delta), dim=int(min(d, factor * L)),
                                                     max_abs=clamp)
            break
        except ParameterError:
            if clamp <= MIN_COUNT_CLAMP:
                raise ParameterError(f"The 'epsilon' parameter of {caller} is too large for counts of up to "
                                     f"{MIN_COUNT_CLAMP:.0e} people per item: the noise is too small for its "
                                     f"grid. Got {params.epsilon!r}; use a smaller epsilon.") from None
            clamp /= 4.0
    snoise = None
    anchors = int(min(params.anchors, d))
    if anchors > 0:  # two Gaussians whose composition is the one above: 1/z^2 = (1 - share)/z^2 + share/z^2
        from sparkpriv.privacy.accounting import fit_to_epsilon

        z = float(cnoise.dp_event().noise_multiplier)
        share = float(params.anchor_share)

        # coordinates a neighbour changes: the counts at most min(d, factor L); the strata vector at most
        # factor L (a person's at most L - 1 items and one length bin, in one row)
        dims = (int(min(d, factor * L)), int(factor * L))

        def build(r: float):
            return tuple(_noise.gaussian_noise_from_multiplier(
                sensitivity=math.sqrt(factor * L), noise_multiplier=z / math.sqrt(w) / r,
                dim=dim, max_abs=clamp) for w, dim in zip((1.0 - share, share), dims))

        r = fit_to_epsilon(lambda r: compose([g.dp_event() for g in build(r)]), epsilon=eps_counts,
                           delta=float(params.delta), caller=caller)
        cnoise, snoise = build(r)
    return SyntheticPlan(int(d), int(L), int(min(params.length_limit, d)), rel, cnoise, lnoise, float(eps_len),
                         snoise, anchors, clamp)


@dataclass
class _State:
    plan: SyntheticPlan
    events: object  # EventColumns or None


class Synthetic(_p.Mechanism):
    """A DP synthetic person x item table: released lengths and item counts, a generative model."""

    name = "synthetic"
    title = "DP synthetic person x item table"
    summary = ("a DP synthetic table of an event table (each person's set of items): the histogram of items "
               "per person and the per-item counts, released once; synthetic people drawn from them")
    Params = SyntheticParams
    neighbors = (_p.REPLACE_ONE, _p.ADD_REMOVE)
    refused_neighbors = {"element": "it protects whole people, not single attributes"}
    inputs = ("records",)
    engines = ("local", "spark")
    refuses_empty_input = False  # under add-remove an empty table is not public: released like any other

    def auto_share(self, params: SyntheticParams) -> float:
        """With ``max_items='auto'`` the histogram that chooses ``L`` is also the length histogram: it
        gets this release's ``length_share`` (sparkpriv.release._plan_auto)."""
        return float(params.length_share)

    max_items_rule = ("the L in 1 .. limit minimising (1 - S(L)/S(limit))^2 + (d sigma(L)/S(L))^2, S(L) the "
                      "items people hold capped at L by the post-processed histogram, sigma(L) the per-item "
                      "counts' noise std at L; at most the DP 0.95 quantile of the lengths, and at least the "
                      f"smallest L up to that quantile with E[m] / E[min(m, L)] <= {1 + CALIBRATE_LOSS:g} (where "
                      "the calibration rakes)")

    def choose_max_items(self, params: SyntheticParams, facts: _p.InputFacts, noisy, std: float, limit: int,
                         caller: str) -> int:
        """With ``max_items="auto"`` and no quantile given: ``L`` minimising an estimate of the error
        from the released length histogram and the counts' public noise multiplier, at most the DP
        0.95 quantile and at least the smallest ``L`` up to it at which the calibration rakes
        (docs/math/10-synthetic.md, "Automatic L";
        :func:`~sparkpriv.mechanisms.synthetic._post.choose_max_items_error`). Post-processing: it
        reads only the noisy histogram and public parameters."""
        from sparkpriv.mechanisms.auto_bound import DEFAULT_QUANTILE, choose_max_items, length_edges
        from sparkpriv.mechanisms.synthetic._post import choose_max_items_error

        rel = _p.resolve_neighbors(params.neighbors, self, caller).name
        factor = 2.0 if rel == "replace-one" else 1.0
        sp = plan_synthetic(params, facts.d, int(limit), lengths_given=True, caller=caller)
        z = float(sp.counts_noise.std) / sp.counts_sensitivity  # the same at every L (auto_bound)
        edges = length_edges(limit)
        q = choose_max_items(noisy, DEFAULT_QUANTILE, limit)
        L = min(choose_max_items_error(noisy, std, edges, int(limit), int(facts.d), z, factor), q)
        # never below the smallest L <= q at which the calibration rakes (E[m] / E[min(m, L)] <= 1.03 by
        # the same lengths the run will pool): the estimate does not know what the raking gains
        lam = expand_bins(pooled_lengths(noisy, std), edges, limit)
        rakes = np.flatnonzero(uncapped_ratio(lam, np.arange(1, q + 1)) <= 1.0 + CALIBRATE_LOSS)
        return int(max(L, int(rakes[0]) + 1) if rakes.size else L)

    def plan(self, params: SyntheticParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        c = float(facts.value_cap)
        if c != 1.0:
            raise ParameterError(f"{caller} takes binary records (weights='binary'): a person's set of items.")
        L = int(round((float(facts.l2_bound) / c) ** 2))
        given = bool(getattr(facts, "length_histogram", False))
        rel = _p.resolve_neighbors(params.neighbors, self, caller)
        plan = plan_synthetic(params, facts.d, L, lengths_given=given, caller=caller)
        event = plan.dp_event()
        public = plan.to_public_dict()
        public["model"] = {"file": MODEL_FILE, "format_version": FORMAT_VERSION,
                           "post_processing": {"lengths": f"the noisy histogram cut where its tail first holds less "
                                                          f"than {TAIL_STDS:g} noise stds beyond its mode, "
                                                          "non-increasing beyond the mode (isotonic), clamped at 0",
                                               "counts": params.shrink,
                                               "calibration": f"draws per person and item profile raked so that "
                                                              f"the model's expected holders of every item whose "
                                                              f"noisy count is at least {CALIBRATE_STDS:g} noise "
                                                              f"stds equal its count x E[m] / E[min(m, max_items)]"}}
        return _p.Plan(events=event, epsilon=float(epsilon_of(event, float(params.delta))), delta=float(params.delta),
                       public=public, neighbors=rel, state=_State(plan, facts.events),
                       secrets=new_secret_seed("synthetic-noise"))

    def run(self, engine, source, plan: _p.Plan, progress) -> _p.Outcome:
        from sparkpriv.mechanisms.auto_bound import items_histogram_fn, length_edges
        from sparkpriv.mechanisms.synthetic._anchors import ANCHOR_STDS, MIN_ANCHORS

        st: _State = plan.state
        sp = st.plan
        seed = plan.secrets
        given = getattr(source, "length_histogram", None)
        if sp.length_noise is None:
            if given is None:  # pragma: no cover - the release path sets it with the auto bound
                raise RuntimeError("the auto contribution bound's histogram is missing")
            noisy_len, len_std, limit = np.asarray(given[0], np.float64), float(given[1]), int(given[2])
        else:  # one pass with the records bounded at the limit: each person's number of items
            L, limit = sp.L, sp.limit
            source.set_max_items(limit)
            try:
                exact = engine.aggregate(source, items_histogram_fn(limit), int(length_edges(limit).size),
                                         count=False)
            finally:
                source.set_max_items(L)
            clamp = sp.length_noise.max_abs_value
            noisy_len = _noise.add_noise(np.clip(np.asarray(exact, np.float64), -clamp, clamp), sp.length_noise,
                                         stream(seed, LENGTHS_STAGE))
            len_std = float(sp.length_noise.std)
            progress.log("synthetic: histogram of items per person over 0..%d (noise std %.3g)", limit, len_std)
        sums = engine.aggregate(source, item_sums_fn(sp.d), sp.d + 1, count=True)
        people = int(round(float(sums[-1])))  # exact: public under replace-one only (below)
        noisy = _noise.add_noise(np.clip(np.asarray(sums[:-1], np.float64), 0.0, sp.count_clamp), sp.counts_noise,
                                 stream(seed, COUNTS_STAGE))
        progress.log("synthetic: per-item counts of %d items, at most %d per person (noise std %.3g)", sp.d, sp.L,
                     float(sp.counts_noise.std))
        lengths = expand_bins(pooled_lengths(noisy_len, len_std), length_edges(limit), limit)
        # n: public under replace-one; under add-remove the noisy histogram's total (DP)
        n = people if sp.neighbors == "replace-one" else int(max(1, round(float(np.asarray(noisy_len).sum()))))
        count_std = float(sp.counts_noise.std)

        def first_model(noisy_counts, std):
            """The shrunk counts, the first model's draws and profile raked to them (post-processing)."""
            c = shrunk_counts(noisy_counts, std) if st_shrink(plan) == "eb" else np.maximum(noisy_counts, 0.0)
            return (c, *calibrate(lengths, c, noisy_counts, std, n, sp.L))

        counts, draws, profile = first_model(noisy, count_std)
        strata, strata_public = None, None
        if sp.strata_noise is not None:
            K = _anchors_chosen(sp, lengths, profile, n)
            if K > 0:
                strata, strata_public = _measure_strata(engine, source, sp, seed, lengths, draws, profile, n, limit,
                                                        K, progress)
            else:  # the strata's Gaussian measures the per-item counts a second time (the same event)
                second = _noise.add_noise(np.clip(np.asarray(sums[:-1], np.float64), 0.0, sp.count_clamp),
                                          sp.strata_noise, stream(seed, STRATA_STAGE))
                w1, w2 = count_std ** -2, float(sp.strata_noise.std) ** -2
                noisy = (w1 * noisy + w2 * second) / (w1 + w2)
                count_std = float((w1 + w2) ** -0.5)
                counts, draws, profile = first_model(noisy, count_std)
                progress.log("synthetic: fewer than %d items' strata would hold %g noise stds of people: the "
                             "strata's budget measured the per-item counts again (combined noise std %.3g)",
                             MIN_ANCHORS, ANCHOR_STDS, count_std)
                strata_public = {"chosen": 0, "note": f"fewer than {MIN_ANCHORS} anchors passed the threshold: "
                                                      "the strata's Gaussian measured the per-item counts a second "
                                                      "time, combined with the first by inverse variance (the "
                                                      "same event)"}
        model = SyntheticModel(sp.d, n, draws, profile * float(counts.sum()), noisy,
                               public={"n_people": n, "max_items": sp.L, "length_limit": limit,
                                       **({"anchors": strata_public} if strata_public else {})},
                               events=st.events, strata=strata)
        item = np.arange(sp.d, dtype=np.int64)
        table = engine.columns_table([("item_index", "long", item), ("noisy_count", "double", noisy),
                                      ("count", "double", counts)])
        public = {"model": dict(plan.public["model"], n_people=n,
                                length_distribution_mean=float((lengths / max(lengths.sum(), 1e-300)
                                                                * np.arange(lengths.size)).sum())),
                  "uncertainty": {"noisy_count_std": count_std,
                                  "interval": "noisy_count +- 1.96 std covers each item's count of the BOUNDED "
                                              "records (at most max_items items per person) with probability "
                                              "0.95; count is post-processing (shrunk), not an interval centre"}}
        if strata_public is not None:
            public["model"]["anchors"] = strata_public
        if st.events is not None:
            public["model"]["events"] = st.events.to_public_dict()
        return _p.Outcome(table=table, model=model, public=public, files={MODEL_FILE: model.to_bytes()})


def _ranked_profile(profile):
    profile = np.maximum(np.asarray(profile, np.float64), 0.0)
    profile = profile / max(profile.sum(), 1e-300)
    return profile, np.argsort(-profile, kind="stable")  # public: post-processing of the released counts


def _anchors_chosen(sp: SyntheticPlan, lengths, profile, n) -> int:
    """The number of anchors the first release supports
    (:func:`~sparkpriv.mechanisms.synthetic._anchors.choose_anchors`)."""
    from sparkpriv.mechanisms.synthetic._anchors import TOP_ITEMS, choose_anchors

    profile, order = _ranked_profile(profile)
    M = int(min(TOP_ITEMS, sp.d))
    return int(choose_anchors(lengths, profile, order, n, float(sp.strata_noise.std), min(sp.anchors, M)))


def _measure_strata(engine, source, sp: SyntheticPlan, seed, lengths, draws, profile, n, limit, K, progress):
    """The anchor strata (docs/math/10-synthetic.md, "Anchor strata"): ``K >= 1`` anchors chosen from the
    first release, one pass over the records bounded at the length limit, noise once, the fit."""
    from sparkpriv.mechanisms.synthetic._anchors import (TOP_ITEMS, fit_strata, strata_fn, strata_length_edges,
                                                        strata_size)

    profile, order = _ranked_profile(profile)
    M = int(min(TOP_ITEMS, sp.d))
    std = float(sp.strata_noise.std)
    edges = strata_length_edges(limit)
    rank = np.empty(sp.d, dtype=np.int64)
    rank[order] = np.arange(sp.d)
    source.set_max_items(limit)
    try:
        exact = engine.aggregate(source, strata_fn(rank, K, M, sp.L, edges), strata_size(K, M, edges.size),
                                 count=False)
    finally:
        source.set_max_items(sp.L)
    noisy = _noise.add_noise(np.clip(np.asarray(exact, np.float64), 0.0, sp.count_clamp), sp.strata_noise,
                             stream(seed, STRATA_STAGE))
    progress.log("synthetic: %d anchor strata over the %d most popular items (noise std %.3g)", K, M, std)
    V = noisy.reshape(K + 1, M + edges.size)
    strata = fit_strata(counts_noisy=V[:, :M], lengths_noisy=V[:, M:], std=std, anchors_K=K, order=order,
                        profile=profile, lengths=lengths, n=float(n), L=sp.L, edges=edges, draws0=draws)
    return strata, {"chosen": K, "measured_items": M, "noise_std": std}


def st_shrink(plan: _p.Plan) -> str:
    return plan.public["model"]["post_processing"]["counts"]


SYNTHETIC = _p.register(Synthetic())
