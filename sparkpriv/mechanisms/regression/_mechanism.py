"""Private regression as a mechanism of the release protocol (:class:`Regression`), on any engine: AdaSSP's
noisy sufficient statistics (``method="ssp"``) or the sample-mixing sketch (``method="sketch"``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
from dp_accounting import dp_event

from sparkpriv.mechanisms import protocol as _p
from sparkpriv.errors import InputError, ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import epsilon_of, fit_to_epsilon
from sparkpriv.privacy.bounds import Bounds, clip_rows
from sparkpriv.privacy.calibration import gdp_mu_for
from sparkpriv.privacy.random import new_secret_seed, stream
from sparkpriv.mechanisms.regression._params import RegressionParams
from sparkpriv.mechanisms.regression._sketch import ADDITIVE_STAGE, _block, block_rows, partial_size, sketch_rows_for
from sparkpriv.mechanisms.regression._ssp import (COUNTERS, TARGET_STAGE, SSPPlan, choose_target_range,
                                                  logistic_pass_fn, logistic_pass_size, occupancy_threshold,
                                                  plan_ssp, stats_size, statistics_fn, target_histogram_fn)
from sparkpriv.mechanisms.regression._ssp_fit import finalize_ssp
from sparkpriv.mechanisms.regression._logistic import (LogisticSteps, bohning_step, finalize_logistic_pass,
                                                       fit_from_released, initial_theta)
from sparkpriv.mechanisms.regression._plan import RegressionPlan
from sparkpriv.mechanisms.regression._fit import (finalize_sketch, fit_from_gram_and_meat, fit_from_moments,
                                                  sandwich_moments)


def sketch_slots(n: int, m: int) -> int:
    """Column-norm slots of an indexed pass: one per column block of ``S`` (``ceil(n / block_rows)``)."""
    return -(-int(n) // block_rows(m))


def indexed_sketch_fn(seed: int, m: int, n: int, row_bound: float, counters=None):
    """``fn(block, start)`` for :meth:`engine.index(...).aggregate`: the packed partial of a block of
    rows with global indices ``start ..``. Column norms: the block holding the first row of a column
    block of ``S`` writes that column block's largest column norm (columns below ``n``) into the
    block's own slot, so sums of partials keep every maximum exactly once."""
    br = block_rows(m)
    slots = sketch_slots(n, m)

    def sketch_block(X, start):
        p = X.shape[1]
        Mc, counts = clip_rows(X, Bounds(p, row_bound=float(row_bound), _caller="release_regression"))
        if counters is not None:
            counters[0].add(counts.rows)
            counters[1].add(counts.norm_clipped)
        out = np.zeros(partial_size(m, p, slots))
        SM = out[: m * p].reshape(m, p)
        l1 = out[m * p: m * p + m]
        stop = start + X.shape[0]
        lo = start
        while lo < stop:
            k = lo // br
            hi = min(stop, (k + 1) * br)
            G = _block(seed, m, k)
            C = G[lo - k * br: hi - k * br]
            SM += C.T @ Mc[lo - start: hi - start]
            l1 += np.abs(C).sum(axis=0)
            if start <= k * br < stop:
                used = G[: min(br, n - k * br)]
                out[m * p + m + k] = float(np.sqrt(np.einsum("ij,ij->i", used, used).max()))
            lo = hi
        return out

    return sketch_block


@dataclass(frozen=True)
class _RegressionState:
    params: RegressionParams
    noise_multiplier: float
    mu: float


@dataclass(frozen=True)
class _SSPState:
    params: RegressionParams
    plan: SSPPlan


class Regression(_p.Mechanism):
    """Private regression: noisy sufficient statistics with AdaSSP (``method="ssp"``, linear or
    logistic) or the sample-mixing sketch (``method="sketch"``); releases a table and a model."""

    name = "regression"
    title = "private regression (AdaSSP sufficient statistics, or a sample-mixing sketch)"
    summary = ("linear or logistic regression: noisy sufficient statistics with AdaSSP's ridge (default), or a "
               "sample-mixing sketch S M + W; releases the statistics (or sketch) and the coefficients")
    Params = RegressionParams
    neighbors = (_p.REPLACE_ONE, _p.ADD_REMOVE)
    refused_neighbors = {
        "element": "rows are clipped to an L2 ball, and a norm clip rescales the whole row, so one changed "
                   "attribute changes every coordinate; a regression protects a person (a row)",
    }
    inputs = ("table",)

    def open_args(self, params: RegressionParams) -> dict:
        """SSP opens the null mask (``missing``): its per-block function replaces a missing value by a
        public one and counts it, so no value of the input decides whether the release runs."""
        args = {"columns": params.input_columns(), "fill": params.fill}
        if params.method == "ssp":
            args["missing"] = True
        return args

    def plan(self, params: RegressionParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        if not params.columns or not params.target:
            raise ParameterError(f"{caller} needs feature columns (columns / --columns) and a target column "
                                 "(target / --target).")
        if params.method == "ssp":
            return self._plan_ssp(params, facts, caller)
        eps, delta = float(params.epsilon), float(params.delta)
        mu = gdp_mu_for(eps, delta)
        r = fit_to_epsilon(lambda r: dp_event.GaussianDpEvent(1.0 / (r * mu)), epsilon=eps, delta=delta,
                           caller=caller)
        z = 1.0 / (r * mu)
        event = dp_event.GaussianDpEvent(z)
        sketch = params.scheme == "sketch"
        public = {
            "mechanism": ("linear regression on a sample-mixing sketch (docs/math.md section 6)" if sketch else
                          "linear regression, additive noise baseline M + W (docs/math.md section 6)"),
            "method": "sketch", "scheme": params.scheme,
            "features": list(params.columns), "target": params.target, "row_bound": float(params.row_bound),
            "bounds": {"row_bound": float(params.row_bound), "norm": "l2", "applies_to": "[features..., target]"},
            "noise_multiplier": z, "gaussian_dp_mu": r * mu,
            "sensitivity": ("2 row_bound max_i ||S_:,i||_2 of the realized secret sketch S" if sketch else
                            "2 row_bound (one row replaced changes one released row)"),
        }
        return _p.Plan(events=event, epsilon=epsilon_of(event, delta), delta=delta, public=public,
                       neighbors=_p.REPLACE_ONE, state=_RegressionState(params, z, r * mu),
                       secrets=(new_secret_seed("regression-sketch"), new_secret_seed("regression-noise")))

    def _plan_ssp(self, params: RegressionParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        splan = plan_ssp(params, len(params.columns), caller)
        event = splan.dp_event()
        dom = splan.domain
        public = dict(splan.to_public_dict(), features=list(params.columns), target=params.target,
                      bounds={"lower": None if dom.lower is None else list(dom.lower),
                              "upper": None if dom.upper is None else list(dom.upper),
                              "row_bound": dom.row_bound, "norm": "l2", "applies_to": "features",
                              "target": ("classes: positive value vs any other" if dom.model == "logistic" else
                                         list(dom.target_range) if dom.target_range is not None else
                                         f"DP quantile range of coverage {params.target_quantile}")})
        neighbors = _p.ADD_REMOVE if params.neighbors == "add-remove" else _p.REPLACE_ONE
        secrets = (new_secret_seed("regression-ssp-noise"),
                   new_secret_seed("regression-target-histogram") if splan.histogram is not None else None)
        return _p.Plan(events=event, epsilon=epsilon_of(event, splan.delta), delta=splan.delta, public=public,
                       neighbors=neighbors, state=_SSPState(params, splan), secrets=secrets)

    def run(self, engine, source, plan: _p.Plan, progress) -> _p.Outcome:
        if isinstance(plan.state, _SSPState):
            return _run_ssp(engine, source, plan, progress)
        st: _RegressionState = plan.state
        pr = st.params
        d = len(pr.columns)
        p = d + 1
        idx = engine.index(source)
        n = idx.rows
        if n == 0:
            raise InputError("The input table is empty: there is nothing to release.")
        if pr.scheme == "additive":
            return _run_additive(engine, source, plan, n, progress)
        m = sketch_rows_for(pr.sketch_rule, n, p) if pr.sketch_rows is None else int(pr.sketch_rows)
        if m > n:
            raise ParameterError(
                f"The 'sketch_rows' parameter of {progress.caller} must be at most the number of rows n = {n} "
                f"(S is m x n; m = n is the 'full' sketch). Got {m} instead: lower it, or use "
                "sketch_rule='full'."
            )
        sketch_seed, noise_seed = plan.secrets
        rplan = RegressionPlan(pr, n, d, m, st.noise_multiplier, st.mu, plan.epsilon, plan.delta,
                               sketch_seed=sketch_seed, noise_seed=noise_seed)
        progress.log("regression: n=%d rows, sketch of m=%d rows, p=%d columns", n, m, p)
        counters = engine.counters(("rows", "rows_norm_clipped"))
        slots = sketch_slots(n, m)
        total = idx.aggregate(indexed_sketch_fn(sketch_seed, m, n, pr.row_bound, counters),
                              partial_size(m, p, slots))
        rel = finalize_sketch(total, rplan, slots=slots)
        names = list(pr.columns) + [pr.target]
        table = engine.table([tuple(float(v) for v in row) for row in rel.R],
                             [(c, "double", False) for c in names])
        model = rel.fit.to_public_dict(pr.columns)
        model.update({"method": "sketch", "features": list(pr.columns), "target": pr.target, "sketch_rows": m,
                      "n": n, "noise_variance_per_entry": rel.noise_variance})
        public = {"n": n, "sketch_rows": m,
                  "sketch_rule": pr.sketch_rule if pr.sketch_rows is None else "given",
                  "sensitivity_value": rel.sensitivity, "noise": rel.noise.to_public_dict(),
                  "noise_variance_per_entry": rel.noise_variance, "model": model,
                  "uncertainty": {"coefficient_stderr": model["stderr"],
                                  "confidence_intervals": model["confidence_intervals"],
                                  "confidence": model["confidence"],
                                  "sketch_entry_std": rel.noise.std}}
        diagnostics = {}
        if counters is not None:
            diagnostics = {"rows": counters[0].value, "rows_norm_clipped": counters[1].value}
        return _p.Outcome(table=table, model=rel.fit, public=public,
                          files={MODEL_FILE: json.dumps(model, indent=2, sort_keys=True).encode()},
                          extras={"sketch": rel.R, "diagnostics": diagnostics})


def _unique(name: str, taken) -> str:
    while name in taken:
        name += "_"
    return name


def _run_ssp(engine, source, plan: _p.Plan, progress) -> _p.Outcome:
    """One pass of the statistics (two with target_quantile), the noise once on the driver, the fit."""
    st: _SSPState = plan.state
    pr, splan = st.params, st.plan
    dom = splan.domain
    seed, hist_seed = plan.secrets
    public: dict = {}
    if splan.histogram is not None:
        hist_noise = splan.histogram
        counts = engine.aggregate(source, target_histogram_fn(dom, splan.candidates), hist_noise.dim)
        lim = hist_noise.max_abs_value
        noisy = _noise.add_noise(np.clip(counts, -lim, lim), hist_noise, stream(hist_seed, TARGET_STAGE))
        lo, hi = choose_target_range(noisy, splan.candidates, splan.quantile, occupancy_threshold(hist_noise))
        dom = dom.with_target_range(lo, hi)
        public["target_range"] = {"lower": lo, "upper": hi, "coverage": splan.quantile,
                                  "chosen_by": "DP quantiles of a Laplace histogram (this release's first event)"}
        progress.log("regression: DP target range [%.6g, %.6g] (coverage %g)", lo, hi, splan.quantile)
    names = list(pr.columns) + ([_unique("_intercept", pr.columns)] if dom.intercept else [])
    counters = engine.counters(COUNTERS)
    progress.log("regression (ssp, %s): sufficient statistics of %d feature(s)%s", dom.model, dom.d,
                 " and an intercept" if dom.intercept else "")
    total = engine.aggregate(source, statistics_fn(dom, counters), stats_size(dom))
    stats_, clamped = finalize_ssp(total, splan, dom, seed, tuple(names))
    steps = None
    if splan.steps:
        steps, more = _logistic_passes(engine, source, splan, dom, stats_, seed, progress)
        clamped += more
    fit = fit_from_released(stats_, steps, confidence=splan.confidence, bootstrap=splan.bootstrap)
    model = fit.to_public_dict(pr.columns)
    model.update({"method": "ssp", "features": list(pr.columns), "target": pr.target,
                  "statistics": stats_.to_public_dict()})
    if steps is not None:
        model["logistic_steps"] = steps.to_public_dict()
    if dom.model == "logistic":
        model["positive"] = dom.positive
    noises = splan.noises(dom) + splan.step_noises(dom)
    public.update({
        "model": model,
        "noise": {k: nz.to_public_dict() for k, nz in zip(("smallest_eigenvalue", "gram", "moments",
                                                           "logistic_gradient_per_pass", "logistic_hessian"),
                                                          noises)},
        "uncertainty": {"coefficient_stderr": model["stderr"], "confidence_intervals": model["confidence_intervals"],
                        "intercept_stderr": model["intercept_stderr"],
                        "intercept_confidence_interval": model["intercept_confidence_interval"],
                        "confidence": model["confidence"],
                        "statistics_std": {"gram": math.sqrt(stats_.var_gram), "xy": math.sqrt(stats_.var_xy),
                                           "yy": math.sqrt(stats_.var_yy)}},
    })
    if plan.neighbors == _p.REPLACE_ONE:
        public["n"] = int(stats_.n)  # public under replace-one; add-remove releases only the noisy n
    table = _statistics_table(engine, stats_, pr.target)
    diagnostics = {"values_clamped": clamped}
    if counters is not None:  # the engine's source counts the replaced values (missing_values_replaced)
        diagnostics.update({name: c.value for name, c in zip(COUNTERS, counters) if name != "values_replaced"})
    return _p.Outcome(table=table, model=fit, public=public,
                      files={MODEL_FILE: json.dumps(model, indent=2, sort_keys=True).encode()},
                      extras={"statistics": stats_, "diagnostics": diagnostics})


def _logistic_passes(engine, source, splan: SSPPlan, dom, st, seed: int, progress):
    """The ``K`` noisy gradient passes of the logistic model (docs/math.md section 6.2): each at the public
    coefficients the released values so far give; the last also releases the Hessian."""
    theta, lam = initial_theta(st)
    grads, hess, clamped = [], None, 0
    for j in range(splan.steps):
        last = j == splan.steps - 1
        progress.log("regression (ssp, logistic): noisy gradient pass %d of %d%s", j + 1, splan.steps,
                     " and the Hessian" if last else "")
        total = engine.aggregate(source, logistic_pass_fn(dom, theta, last), logistic_pass_size(dom, last))
        g, H, c = finalize_logistic_pass(total, splan, dom, seed, j, last)
        grads.append(g)
        clamped += c
        if last:
            hess = H
        else:
            theta = bohning_step(st, lam, theta, g)
    ng, nh = splan.step_noises(dom)
    return LogisticSteps(np.array(grads), hess, float(ng.variance), float(nh.variance)), clamped


def _statistics_table(engine, st, target: str):
    """The released statistics as a table: the noisy symmetric cross-product matrix of
    ``[x~..., y~]`` (scaled as the model file's ``statistics.scale`` says), one row per variable."""
    names = list(st.names) + [target]
    k = len(names)
    M = np.zeros((k, k))
    M[:-1, :-1] = st.gram
    M[:-1, -1] = M[-1, :-1] = st.xy
    M[-1, -1] = st.yy
    row = _unique("statistic", names)
    rows = [(nm, *(float(v) for v in M[i])) for i, nm in enumerate(names)]
    return engine.table(rows, [(row, "string", False)] + [(nm, "double", False) for nm in names])


def _additive_row_map(noise_seed: int, nz: _noise.GaussianNoise, row_bound: float, counters=None):
    """``row_map(pid, blocks)`` of the additive baseline: clip each row to ``row_bound``, add the
    per-entry Gaussian noise from the partition's keyed stream ``(noise_seed, ADDITIVE_STAGE, pid)``."""

    def additive_rows(pid, blocks):
        rng = stream(noise_seed, ADDITIVE_STAGE, pid)
        for X in blocks:
            Mc, counts = clip_rows(np.asarray(X, np.float64),
                                   Bounds(X.shape[1], row_bound=float(row_bound), _caller="release_regression"))
            if counters is not None:
                counters[0].add(counts.rows)
                counters[1].add(counts.norm_clipped)
            R = _noise.add_noise(Mc, nz, rng)
            yield [R[:, j] for j in range(R.shape[1])]

    return additive_rows


def _gram_fn():
    def gram(X):
        X = np.asarray(X, np.float64)
        return (X.T @ X).reshape(-1)

    return gram


def _meat_fn(x: np.ndarray, s2: float, ridge: float, debias: bool, rows: int):
    def meat(X):
        return sandwich_moments(np.asarray(X, np.float64), x, s2, ridge=ridge, debias=debias, rows=rows).reshape(-1)

    return meat


def _run_additive(engine, source, plan: _p.Plan, n: int, progress) -> _p.Outcome:
    """The additive baseline ``M + W`` as a release: one noisy row per input row (a row-level output,
    keyed per-partition streams), and the model fitted on exactly those released rows (two more
    passes that regenerate them: post-processing)."""
    st: _RegressionState = plan.state
    pr = st.params
    d = len(pr.columns)
    p = d + 1
    _, noise_seed = plan.secrets
    rplan = RegressionPlan(pr, n, d, n, st.noise_multiplier, st.mu, plan.epsilon, plan.delta,
                           noise_seed=noise_seed)
    nz = rplan.additive_noise()
    names = list(pr.columns) + [pr.target]
    cols = [(c, "double", False) for c in names]
    progress.log("regression (additive baseline): n=%d noisy rows of p=%d columns", n, p)
    counters = engine.counters(("rows", "rows_norm_clipped"))
    counted, _ = engine.map_rows(source, _additive_row_map(noise_seed, nz, pr.row_bound, counters), cols)
    table, rows = engine.map_rows(source, _additive_row_map(noise_seed, nz, pr.row_bound), cols)
    caller = progress.caller
    s2 = float(nz.variance)
    G = engine.aggregate(engine.open(counted, columns=names, fill=None, caller=caller), _gram_fn(), p * p)
    G = G.reshape(p, p)
    x, floored = fit_from_moments(G, n, s2, ridge=pr.ridge, debias=pr.debias)
    meat = engine.aggregate(engine.open(table, columns=names, fill=None, caller=caller),
                            _meat_fn(x, s2, pr.ridge, pr.debias, n), d * d).reshape(d, d)
    fit = fit_from_gram_and_meat(G, meat, x, n, s2, ridge=pr.ridge, debias=pr.debias, confidence=pr.confidence)
    model = fit.to_public_dict(pr.columns)
    model.update({"features": list(pr.columns), "target": pr.target, "scheme": "additive", "n": n,
                  "noise_variance_per_entry": s2})
    public = {"n": n, "sketch_rows": None, "sensitivity_value": 2.0 * float(pr.row_bound),
              "noise": nz.to_public_dict(), "noise_variance_per_entry": s2, "model": model,
              "uncertainty": {"coefficient_stderr": model["stderr"],
                              "confidence_intervals": model["confidence_intervals"],
                              "confidence": model["confidence"], "entry_std": nz.std}}
    diagnostics = (lambda: {"rows": counters[0].value, "rows_norm_clipped": counters[1].value}) \
        if counters is not None else {}
    return _p.Outcome(table=table, rows=rows, model=fit, public=public,
                      files={MODEL_FILE: json.dumps(model, indent=2, sort_keys=True).encode()},
                      extras={"diagnostics": diagnostics})


MODEL_FILE = "_regression_model.json"
REGRESSION = _p.register(Regression())
