"""Every (mechanism, noise, neighbour relation) the library offers has an audit.

The offered combinations are found by asking the library itself: every public
``release_*`` function of :mod:`sparkpriv` and every mechanism registered for
the CLI must map to audited mechanisms here, and for each mechanism every
relation in ``bounds.NEIGHBORS`` (and every noise kind and bound kind) is
tried on a tiny input with its numpy core: whatever is accepted must appear in
``AUDITED``, naming an existing test. A new mechanism, relation or noise kind
therefore fails this suite until it is audited. (The Spark functions' own
acceptance is probed in ``test_spark.py`` against the same table.)

Decided refusals (not audited, tested here to be refused): add-remove for
row-level releases (dense and event-records projection, DPRP), and the
element-wise relation together with a row norm bound.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import sparkpriv
from sparkpriv.errors import ParameterError
from sparkpriv.privacy.bounds import NEIGHBORS

pytestmark = pytest.mark.audit

LAP, GAU = "laplace", "gaussian"

# (mechanism, noise, relation, kind) -> "module::test function" that audits it
AUDITED: dict[tuple[str, str, str, str], str] = {}
for _noise, _fn in ((LAP, "test_dense_projection_laplace"), (GAU, "test_dense_projection_gaussian")):
    for _rel, _kind in (("replace-one", "l2"), ("replace-one", "l1"), ("replace-one", "box"),
                        ("element", "box"), ("element", "element_bound")):
        AUDITED[("projection", _noise, _rel, _kind)] = f"test_projection::{_fn}"
for _noise in (LAP, GAU):
    for _w in ("binary", "counts"):
        AUDITED[("projection-events", _noise, "replace-one", _w)] = "test_projection::test_event_records_projection"
for _src in ("table", "records"):
    AUDITED[("dprp", GAU, "replace-one", _src)] = "test_dprp::test_dprp_row_projection"
for _v in ("linear", "kernel"):
    for _rel in ("replace-one", "add-remove"):
        AUDITED[(f"kmeans-{_v}", GAU, _rel, "rows")] = "test_kmeans::test_kmeans_step"
AUDITED[("dpsgd", GAU, "replace-one", "sampled")] = "test_dpsgd::test_dpsgd_step_sampled_replace_one_within_claim"
AUDITED[("dpsgd-quantile-clip", GAU, "replace-one", "sampled")] = \
    "test_dpsgd_quantile_clip::test_quantile_clip_step_full_batch_replace_one"
AUDITED[("dpgm-lengths", GAU, "replace-one", "histogram")] = "test_dpgm_lengths::test_length_histograms"
AUDITED[("dpgm-item-counts", GAU, "replace-one", "counts")] = "test_dpgm_marginals::test_item_counts"
for _rel in ("replace-one", "add-remove"):
    AUDITED[("row-bound-quantile", LAP, _rel, "histogram")] = "test_quantile::test_row_bound_histogram"
for _scheme in ("sketch", "additive"):
    AUDITED[(f"regression-{_scheme}", GAU, "replace-one", "l2")] = "test_regression::test_regression_release"
for _rel in ("replace-one", "add-remove"):
    for _model in ("linear", "logistic"):
        AUDITED[("regression-ssp", GAU, _rel, _model)] = "test_regression_ssp::test_ssp_statistics"
    AUDITED[("regression-ssp-target-range", LAP, _rel, "histogram")] = "test_regression_ssp::test_ssp_target_histogram"
    for _step in ("gradient", "hessian"):
        AUDITED[("regression-ssp-logistic-pass", GAU, _rel, _step)] = "test_regression_ssp::test_ssp_logistic_passes"
for _noise, _fn in ((LAP, "test_counts_laplace"), (GAU, "test_counts_gaussian")):
    for _rel in ("replace-one", "add-remove"):
        for _w in ("people", "events-capped"):
            AUDITED[("counts", _noise, _rel, _w)] = f"test_counts::{_fn}"

for _rel in ("replace-one", "add-remove"):
    AUDITED[("synthetic-counts", GAU, _rel, "counts")] = "test_synthetic::test_item_counts"
AUDITED[("aggregates-sum", LAP, "replace-one", "sum")] = "test_aggregates::test_sum_replace_one"
AUDITED[("aggregates-count-distinct", LAP, "add-remove", "people")] = "test_aggregates::test_count_distinct_add_remove"
for _rel in ("replace-one", "add-remove"):  # max_items='auto' on bounded event records
    AUDITED[("contribution-bound", LAP, _rel, "histogram")] = "test_quantile::test_contribution_bound_histogram"

# every public release function and CLI mechanism -> the audited mechanisms it runs
FUNCTIONS = {
    "release_projection_array": ("projection",),
    "release_projection": ("projection", "projection-events", "row-bound-quantile", "contribution-bound"),
    "release_dprp_array": ("dprp",),
    "release_dprp": ("dprp", "contribution-bound"),
    "release_kmeans_array": ("kmeans-linear", "kmeans-kernel"),
    "release_kmeans": ("kmeans-linear", "kmeans-kernel", "contribution-bound"),
    "release_regression_array": ("regression-sketch", "regression-additive"),
    "release_regression": ("regression-ssp", "regression-ssp-target-range", "regression-ssp-logistic-pass",
                           "regression-sketch", "regression-additive"),
    "release_counts": ("counts", "contribution-bound"),
    "release_synthetic": ("synthetic-counts", "contribution-bound"),
    "release_aggregates": ("aggregates-sum", "aggregates-count-distinct"),
    "release_dpgm_array": ("kmeans-linear", "dpsgd", "dpsgd-quantile-clip", "dpgm-lengths", "dpgm-item-counts"),
    "release_dpgm": ("kmeans-linear", "dpsgd", "dpsgd-quantile-clip", "dpgm-lengths", "dpgm-item-counts", "contribution-bound"),
}
CLI_MECHANISMS = {
    "projection": ("projection", "projection-events", "row-bound-quantile", "contribution-bound"),
    "dprp": ("dprp", "contribution-bound"),
    "kmeans": ("kmeans-linear", "kmeans-kernel", "contribution-bound"),
    "regression": ("regression-ssp", "regression-ssp-target-range", "regression-ssp-logistic-pass", "regression-sketch",
                   "regression-additive"),
    "counts": ("counts", "contribution-bound"),
    "synthetic": ("synthetic-counts", "contribution-bound"),
    "aggregates": ("aggregates-sum", "aggregates-count-distinct"),
    "dpgm": ("kmeans-linear", "dpsgd", "dpsgd-quantile-clip", "dpgm-lengths", "dpgm-item-counts", "contribution-bound"),
}
SAMPLERS = {"sample_discrete_laplace": "test_samplers::test_sampler_matches_exact_pmf",
            "sample_discrete_gaussian": "test_samplers::test_sampler_matches_exact_pmf"}


# ----------------------------------------------------------------------------- probes


def _accepts(fn) -> bool:
    try:
        fn()
    except ParameterError:
        return False
    return True


X = np.random.default_rng(0).uniform(-0.5, 0.5, size=(16, 3))
DENSE_BOUNDS = {
    "l2": {"row_bound": 1.0, "norm": "l2"},
    "l1": {"row_bound": 1.0, "norm": "l1"},
    "box": {"lower": [-1.0] * 3, "upper": [1.0] * 3},
    "element_bound": {"element_bound": 0.5},
}


def offered_projection() -> set:
    from sparkpriv.api import release_projection_array
    from sparkpriv.mechanisms.projection import NOISE_KINDS

    out = set()
    for noise in NOISE_KINDS:
        delta = 1e-6 if noise == GAU else 0.0
        for rel in NEIGHBORS:
            for kind, kw in DENSE_BOUNDS.items():
                if _accepts(lambda: release_projection_array(X, k=2, epsilon=1.0, delta=delta, noise=noise,
                                                             neighbors=rel, **kw)):
                    out.add(("projection", noise, rel, kind))
    return out


def plan_records_projection(neighbors: str, noise: str, delta: float, cap) -> None:
    """The release path of the projection mechanism on bounded event records, up to its plan
    (parameters, neighbour relation, calibration; the engine only adds the data)."""
    from sparkpriv.mechanisms.projection import PROJECTION, ProjectionParams
    from sparkpriv.mechanisms.protocol import InputFacts, resolve_neighbors

    p = ProjectionParams(k=2, epsilon=1.0, delta=delta, noise=noise, neighbors=neighbors)
    resolve_neighbors(p.neighbors, PROJECTION, "audit")
    p.validate("audit")
    PROJECTION.plan(p, InputFacts("records", 20, (), cap.value_cap, cap.l2_bound), "audit")


def offered_projection_events() -> set:
    from sparkpriv.mechanisms.projection import NOISE_KINDS
    from sparkpriv.mechanisms.sparse import WEIGHTS, ItemCap

    out = set()
    for noise in NOISE_KINDS:
        delta = 1e-6 if noise == GAU else 0.0
        for w in WEIGHTS:
            cap = ItemCap(2, w, None if w == "binary" else 3)
            for rel in NEIGHBORS:
                if _accepts(lambda: plan_records_projection(rel, noise, delta, cap)):
                    out.add(("projection-events", noise, rel, w))
    return out


def offered_dprp() -> set:
    from sparkpriv.api import release_dprp_array
    from sparkpriv.mechanisms.protocol import get_mechanism, resolve_neighbors

    out = set()
    for rel in NEIGHBORS:
        if _accepts(lambda: release_dprp_array(X, epsilon=1.0, delta=1e-6, lower=[-1.0] * 3,
                                                    upper=[1.0] * 3, neighbors=rel)):
            out.add(("dprp", GAU, rel, "table"))
        # event records take the same release path: the relation is resolved before the input's kind
        # matters (resolve_neighbors), and the plan of records calibrates for replace-one
        if _accepts(lambda: resolve_neighbors(rel, get_mechanism("dprp"), "probe")):
            out.add(("dprp", GAU, rel, "records"))
    return out


def offered_kmeans() -> set:
    from sparkpriv.api import release_kmeans
    from sparkpriv.mechanisms.kmeans import VARIANTS

    out = set()
    for variant in VARIANTS:
        extra = {"kernel_width": 0.5, "frequencies": 4} if variant == "kernel" else {}
        for rel in NEIGHBORS:
            ok = _accepts(lambda: release_kmeans(X, k=2, epsilon=1.0, delta=1e-6, iterations=1,
                                                 variant=variant, row_bound=1.0, neighbors=rel, **extra))
            if ok:
                out.add((f"kmeans-{variant}", GAU, rel, "rows"))
    return out


def offered_dpgm() -> set:
    """The relations the DPGM release accepts (its k-means is the linear variant, probed above)."""
    from sparkpriv.api import release_dpgm

    Xb = (X > 0).astype(float)
    out = set()
    for rel in NEIGHBORS:
        if _accepts(lambda: release_dpgm(Xb, k=2, epsilon=5.0, delta=1e-5, kmeans_iterations=1, sampling_rate=0.5,
                                         epochs=1.0, hidden=2, chains=4, neighbors=rel)):
            out.add(("dpsgd", GAU, rel, "sampled"))
            out.add(("dpgm-lengths", GAU, rel, "histogram"))  # released by default (rbm)
        if _accepts(lambda: release_dpgm(Xb, k=2, epsilon=5.0, delta=1e-5, kmeans_iterations=1, sampling_rate=0.5,
                                         epochs=1.0, hidden=2, chains=4, neighbors=rel, clip_quantile=0.5)):
            out.add(("dpsgd-quantile-clip", GAU, rel, "sampled"))
        if _accepts(lambda: release_dpgm(Xb, k=2, epsilon=5.0, delta=1e-5, kmeans_iterations=1, sampling_rate=0.5,
                                         epochs=1.0, hidden=2, chains=4, neighbors=rel, marginal_share=0.1,
                                         marginal_samples=100)):
            out.add(("dpgm-item-counts", GAU, rel, "counts"))
    return out


def offered_quantile(projection_offered: set) -> set:
    """The histogram is only reachable through release_projection(row_bound_quantile=...),
    which refuses the element-wise relation; its relations are those the dense
    projection offers with a row bound (the Spark probe in test_spark.py checks
    the Spark function itself)."""
    rels = {r for (m, _, r, kind) in projection_offered if m == "projection" and kind in ("l2", "l1")}
    return {("row-bound-quantile", LAP, r, "histogram") for r in rels if r != "element"}


def offered_regression() -> set:
    """The sketch's schemes through its numpy reference; AdaSSP (linear, logistic, the DP target range)
    through the release path on a table (the local engine)."""
    from sparkpriv.api import release_regression
    from sparkpriv.mechanisms.regression import MODELS, SCHEMES, RegressionParams, release_regression_array

    b = X @ np.array([0.2, -0.1, 0.3])
    out = set()
    for scheme in SCHEMES:
        for rel in NEIGHBORS:
            if _accepts(lambda: release_regression_array(X, b, RegressionParams(
                    method="sketch", row_bound=1.0, epsilon=1.0, delta=1e-6, scheme=scheme, neighbors=rel,
                    sketch_rows=4))):
                out.add((f"regression-{scheme}", GAU, rel, "l2"))
    M = np.column_stack([X, (b > 0).astype(float)])
    cols = dict(columns=["x0", "x1", "x2"], target="y")
    for rel in NEIGHBORS:
        for model in MODELS:
            target = dict(target_lower=-1.0, target_upper=1.0) if model == "linear" else {}
            if _accepts(lambda: release_regression(M, **cols, model=model, lower=-1.0, upper=1.0, epsilon=1.0,
                                                   delta=1e-6, neighbors=rel, **target)):
                out.add(("regression-ssp", GAU, rel, model))
        if _accepts(lambda: release_regression(M, **cols, lower=-1.0, upper=1.0, target_quantile=0.9, epsilon=1.0,
                                               delta=1e-6, neighbors=rel)):
            out.add(("regression-ssp-target-range", LAP, rel, "histogram"))
        if _accepts(lambda: release_regression(M, **cols, model="logistic", logistic_steps=1, lower=-1.0, upper=1.0,
                                               epsilon=1.0, delta=1e-6, neighbors=rel)):
            out |= {("regression-ssp-logistic-pass", GAU, rel, "gradient"),
                    ("regression-ssp-logistic-pass", GAU, rel, "hessian")}
    return out


def offered_counts() -> set:
    from sparkpriv.mechanisms.counts import NOISE_KINDS, CountsParams, plan_counts

    out = set()
    for noise in NOISE_KINDS:
        delta = 1e-6 if noise == "discrete_gaussian" else 0.0
        for rel in NEIGHBORS:
            for w, c in (("people", None), ("events-capped", 3)):
                if _accepts(lambda: plan_counts(CountsParams(epsilon=1.0, max_keys=2, max_events_per_key=c,
                                                             noise=noise, delta=delta, neighbors=rel), 5)):
                    out.add(("counts", LAP if noise == "discrete_laplace" else GAU, rel, w))
    return out


def all_offered() -> set:
    proj = offered_projection()
    return (proj | offered_projection_events() | offered_dprp() | offered_kmeans() | offered_quantile(proj)
            | offered_regression() | offered_counts() | offered_dpgm())


# ----------------------------------------------------------------------------- tests


def test_every_public_release_function_is_audited():
    public = {n for n in sparkpriv.__all__ if n.startswith("release_")}
    assert public <= set(FUNCTIONS), f"public release functions with no audit: {sorted(public - set(FUNCTIONS))}"
    mechanisms = {m for (m, *_rest) in AUDITED}
    for fn, mechs in FUNCTIONS.items():
        assert set(mechs) <= mechanisms, (fn, mechs)


def test_every_cli_mechanism_is_audited():
    from sparkpriv.runner import MECHANISMS

    assert set(MECHANISMS) <= set(CLI_MECHANISMS), (
        f"CLI mechanisms with no audit: {sorted(set(MECHANISMS) - set(CLI_MECHANISMS))}")


def test_every_sampler_is_audited():
    from sparkpriv.privacy import noise

    samplers = {n for n in noise.__all__ if n.startswith("sample_")}
    assert samplers <= set(SAMPLERS), f"samplers with no goodness-of-fit audit: {sorted(samplers - set(SAMPLERS))}"


def test_every_offered_combination_has_an_audit():
    offered = all_offered()
    missing = sorted(offered - set(AUDITED))
    assert not missing, (
        "offered (mechanism, noise, relation, kind) combinations with no audit in tests/audit "
        f"(add one and list it in AUDITED): {missing}")


def test_audit_registry_points_at_existing_tests():
    for target in set(AUDITED.values()) | set(SAMPLERS.values()):
        mod, fn = target.split("::")
        m = importlib.import_module(f"tests.audit.{mod}")
        assert callable(getattr(m, fn, None)), target


REFUSED = [
    ("projection add-remove (rows)", lambda: __import__("sparkpriv.api", fromlist=["x"])
     .release_projection_array(X, k=2, epsilon=1.0, neighbors="add-remove", row_bound=1.0)),
    ("projection element + row_bound", lambda: __import__("sparkpriv.api", fromlist=["x"])
     .release_projection_array(X, k=2, epsilon=1.0, neighbors="element", row_bound=1.0,
                               lower=[-1.0] * 3, upper=[1.0] * 3)),
    ("projection element + element_bound + row_bound",
     lambda: __import__("sparkpriv.api", fromlist=["x"])
     .release_projection_array(X, k=2, epsilon=1.0, neighbors="element", row_bound=1.0, element_bound=0.5)),
    ("event-records projection add-remove", lambda: plan_records_projection(
        "add-remove", LAP, 0.0, __import__("sparkpriv.mechanisms.sparse", fromlist=["x"]).ItemCap(2))),
    ("event-records projection element", lambda: plan_records_projection(
        "element", LAP, 0.0, __import__("sparkpriv.mechanisms.sparse", fromlist=["x"]).ItemCap(2))),
    ("dprp add-remove", lambda: __import__("sparkpriv.api", fromlist=["x"])
     .release_dprp_array(X, epsilon=1.0, delta=1e-6, lower=[-1.0] * 3, upper=[1.0] * 3,
                         neighbors="add-remove")),
]
for _scheme in ("sketch", "additive"):
    for _rel in ("add-remove", "element"):
        REFUSED.append((f"regression {_scheme} {_rel}", lambda s=_scheme, r=_rel: __import__(
            "sparkpriv.mechanisms.regression", fromlist=["x"]).release_regression_array(
            X, X[:, 0], __import__("sparkpriv.mechanisms.regression", fromlist=["x"]).RegressionParams(
                method="sketch", row_bound=1.0, epsilon=1.0, delta=1e-6, scheme=s, neighbors=r, sketch_rows=4))))
REFUSED.append(("regression ssp element", lambda: __import__("sparkpriv.api", fromlist=["x"]).release_regression(
    X, columns=["x0", "x1"], target="x2", lower=-1.0, upper=1.0, target_lower=-1.0, target_upper=1.0, epsilon=1.0,
    delta=1e-6, neighbors="element")))


@pytest.mark.parametrize("name,call", REFUSED, ids=[r[0] for r in REFUSED])
def test_decided_refusals(name, call):
    """Combinations the library refuses (so they are not audited)."""
    with pytest.raises(ParameterError):
        call()
