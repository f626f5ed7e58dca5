"""DPGM: accounting of the whole release, parallel composition, file format, synthesis."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting import dp_event as ev

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import dpgm, dpsgd
from sparkpriv.mechanisms.rbm import RBM
from sparkpriv.privacy.accounting import compose, epsilon_of

P = dpgm.DPGMParams(epsilon=2.0, delta=1e-5, k=2, sampling_rate=0.05, epochs=2, hidden=4,
                    accountant="rdp", kmeans_iterations=3)


@pytest.fixture(scope="module")
def plan():
    return dpgm.plan_dpgm(P, n=400, d=10)


def test_plan_event_is_kmeans_plus_lengths_plus_item_counts_plus_one_cluster_of_dpsgd(plan):
    """The rbm's defaults release the length histograms and the per-item counts before DP-SGD."""
    e = plan.dp_event()
    assert isinstance(e, ev.ComposedDpEvent)
    km, lengths, counts, sgd = e.events[:-3], e.events[-3], e.events[-2], e.events[-1]
    assert compose(km) == compose([plan.kmeans.dp_event()])
    assert lengths == plan.lengths.dp_event() and isinstance(lengths, ev.GaussianDpEvent)
    assert counts == plan.marginals.dp_event() and isinstance(counts, ev.GaussianDpEvent)
    assert plan.marginals.share == 0.3
    assert sgd.count == plan.steps == 40
    assert sgd.event.sampling_probability == 0.05
    # replace-one: an add/remove step of sensitivity 2C, multiplier at least sigma / 2
    assert sgd.event.event.noise_multiplier >= plan.noise_multiplier / 2
    assert sgd.event.event.noise_multiplier <= plan.noise_multiplier / 2 * (1 + 1e-6)
    assert plan.step_noise.std >= plan.noise_multiplier * P.clip


def test_plan_meets_the_request_and_the_noise_is_needed(plan):
    assert plan.epsilon_spent() <= P.epsilon
    weaker = compose([plan.kmeans.dp_event(), plan.lengths.dp_event(), plan.marginals.dp_event(),
                      dpsgd.dpsgd_event(P.sampling_rate, plan.noise_multiplier / 1.05, plan.steps)])
    assert dpsgd.accounted_epsilon(weaker, P.delta, P.accountant) > P.epsilon
    pub = plan.to_public_dict()
    assert pub["epsilon_spent"] <= P.epsilon and pub["neighbors"] == "replace-one"


def test_each_record_trains_one_model(plan):
    """Changing a record of cluster 0 leaves cluster 1's released parameters bit for bit."""
    rng = np.random.default_rng(0)
    X = (rng.random((400, 10)) < 0.3).astype(float)
    labels = (np.arange(400) % 2).astype(int)
    sizes = np.array([200.0, 200.0])
    centers = np.full((2, 10), 0.3)
    a = dpgm.train_clusters(X, labels, sizes, centers, plan, seed=7)
    Y = X.copy()
    Y[0] = 1.0 - Y[0]  # row 0 is in cluster 0
    b = dpgm.train_clusters(Y, labels, sizes, centers, plan, seed=7)
    assert np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], b[0])
    again = dpgm.train_clusters(X, labels, sizes, centers, plan, seed=7, clusters=[0])
    assert np.array_equal(again[0], a[0])  # a retried task (one cluster) reproduces its model


def _toy_model(sizes, biases):
    d, h = len(biases[0]), 2
    gen = RBM(d, h)
    thetas = np.zeros((len(sizes), gen.dim))
    for j, b in enumerate(biases):
        thetas[j, d * h: d * h + d] = b
    params = dpgm.DPGMParams(k=len(sizes), hidden=h, length_strata=0)
    return dpgm.DPGMModel(params, d, thetas, np.asarray(sizes, float), np.zeros((len(sizes), d)))


def test_synthesize_follows_noisy_sizes_and_is_reproducible():
    m = _toy_model([3000.0, 1000.0, 0.0], [[20.0, -20.0], [-20.0, 20.0], [20.0, 20.0]])
    S = dpgm.synthesize(m, 20_000, seed=3)
    assert S.shape == (20_000, 2)
    first = np.mean((S[:, 0] == 1) & (S[:, 1] == 0))
    assert abs(first - 0.75) < 5 * np.sqrt(0.75 * 0.25 / 20_000)
    assert not np.any((S[:, 0] == 1) & (S[:, 1] == 1))  # a zero-size cluster is never drawn
    assert np.array_equal(S, dpgm.synthesize(m, 20_000, seed=3))
    assert not np.array_equal(S, dpgm.synthesize(m, 20_000, seed=4))


def test_save_load_roundtrip_and_version(tmp_path):
    m = _toy_model([5.0, 2.0], [[1.0, -1.0], [0.5, 0.5]])
    m.plan_public = {"epsilon_spent": 1.0}
    path = tmp_path / "model.npz"
    m.save(path)
    back = dpgm.DPGMModel.load(path)
    assert back.params == m.params and back.d == m.d and back.plan_public == m.plan_public
    assert np.array_equal(back.thetas, m.thetas) and np.array_equal(back.sizes, m.sizes)
    assert np.array_equal(dpgm.synthesize(back, 50, 1), dpgm.synthesize(m, 50, 1))
    np.savez(tmp_path / "bad.npz", header=np.frombuffer(b'{"format": "x"}', np.uint8))
    with pytest.raises(ParameterError, match="format version"):
        dpgm.DPGMModel.load(tmp_path / "bad.npz")


@pytest.mark.parametrize("change,match", [
    (dict(k=30), "'k'"), (dict(model="gan"), "model"), (dict(sampling_rate=0.0), "sampling_rate"),
    (dict(clip=-1.0), "clip"), (dict(kmeans_share=1.0), "kmeans_share"),
])
def test_bad_parameters_are_named(change, match):
    import dataclasses

    with pytest.raises(ParameterError, match=match):
        dpgm.plan_dpgm(dataclasses.replace(P, **change), n=400, d=10)


def test_fit_end_to_end_recovers_two_clusters():
    """Large epsilon: the mixture's synthetic marginals match two well-separated clusters."""
    rng = np.random.default_rng(1)
    n, d = 2000, 12
    z = rng.random(n) < 0.5
    p = np.where(z[:, None], np.r_[np.full(6, 0.7), np.full(6, 0.05)], np.r_[np.full(6, 0.05), np.full(6, 0.7)])
    X = (rng.random((n, d)) < p).astype(float)
    params = dpgm.DPGMParams(epsilon=50.0, delta=1e-5, k=2, sampling_rate=0.1, epochs=3, hidden=4, accountant="rdp",
                             kmeans_iterations=4)
    model, plan = dpgm.fit_dpgm_array(X, params, seed=11)
    assert plan.epsilon_spent() <= 50.0
    S = dpgm.synthesize(model, 4000, seed=2)
    first = S[:, :6].sum(1) > S[:, 6:].sum(1)
    assert 0.4 < first.mean() < 0.6
    np.testing.assert_allclose(S[first][:, :6].mean(0), 0.7, atol=0.08)
    np.testing.assert_allclose(S[first][:, 6:].mean(0), 0.05, atol=0.05)


def test_fit_with_the_vae_runs_and_generates_in_the_domain():
    rng = np.random.default_rng(2)
    X = (rng.random((500, 6)) < 0.3).astype(float)
    params = dpgm.DPGMParams(epsilon=5.0, delta=1e-5, k=2, model="vae", hidden=8, latent=2, sampling_rate=0.2, epochs=2,
                             accountant="rdp", kmeans_iterations=2)
    model, plan = dpgm.fit_dpgm_array(X, params, seed=4)
    assert model.thetas.shape == (2, model.generator().dim)
    S = dpgm.synthesize(model, 300, seed=1)
    assert S.shape == (300, 6) and set(np.unique(S)) <= {0.0, 1.0}
    assert np.array_equal(S, dpgm.synthesize(model, 300, seed=1))


def test_params_are_protocol_params_and_refuse_add_remove():
    from sparkpriv.mechanisms.protocol import Params

    assert isinstance(P, Params)
    names = {s.name for s in dpgm.DPGMParams.specs()}
    assert {"epsilon", "delta", "k", "model", "clip", "sampling_rate", "epochs"} <= names
    import dataclasses

    with pytest.raises(ParameterError, match="add-remove"):
        dpgm.plan_dpgm(dataclasses.replace(P, neighbors="add-remove"), n=400, d=10)
    with pytest.raises(ParameterError, match="'delta'.*required"):
        dpgm.plan_dpgm(dataclasses.replace(P, delta=None), n=400, d=10)


def test_release_on_the_local_engine_equals_the_numpy_reference(monkeypatch):
    """release_dpgm (protocol, engine calls) gives fit_dpgm_array's model for the same secret seed,
    and records the event at the calibrated multiplier (at most the request, before any data)."""
    from sparkpriv.api import release_dpgm

    rng = np.random.default_rng(3)
    X = (rng.random((300, 5)) < np.where(np.arange(300)[:, None] % 2 == 0, 0.8, 0.1)).astype(float)
    params = dict(epsilon=4.0, delta=1e-5, k=2, sampling_rate=0.2, epochs=1, hidden=3, chains=10,
                  kmeans_iterations=2, accountant="rdp")
    monkeypatch.setattr(dpgm._mechanism, "new_secret_seed", lambda purpose: 77)  # where the release draws it
    rel = release_dpgm(X, **params)
    model, plan = dpgm.fit_dpgm_array(X, dpgm.DPGMParams(**params), seed=77)
    np.testing.assert_allclose(rel.model.centers, model.centers, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rel.model.sizes, model.sizes, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rel.model.thetas, model.thetas, rtol=1e-9, atol=1e-12)
    # recorded: the calibrated sigma / 2 per step (the realized noise's multiplier is at least that)
    sgd = rel.events.events[-1]
    assert sgd.event.event.noise_multiplier == plan.noise_multiplier / 2
    assert plan.step_noise.dp_event().noise_multiplier >= plan.noise_multiplier / 2
    assert rel.epsilon == epsilon_of(rel.events, 1e-5) <= 4.0
    # never states less than the realized noise spends (its multiplier is at least the recorded one,
    # asserted exactly above; the RDP accountant is monotone in it only to about 1e-11)
    assert rel.epsilon >= plan.epsilon_spent() - 1e-9
    assert rel.df.column_names == ["cluster", "size", "reliable", "center"] and rel.df.num_rows == 2
    assert set(rel.files) == {dpgm.MODEL_FILE}


# ----------------------------------------------------------------------------- the source's column types

def _typed_table(n=300, seed=3):
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    hi = np.arange(n) % 2 == 0
    return pa.table({"i": pa.array((rng.random(n) < np.where(hi, 0.8, 0.1)).astype(np.int32)),
                     "b": pa.array(rng.random(n) < np.where(hi, 0.7, 0.2)),
                     "x": (rng.random(n) < np.where(hi, 0.9, 0.1)).astype(np.float64),
                     "l": pa.array((rng.random(n) < 0.5).astype(np.int64)),
                     "f": pa.array((rng.random(n) < 0.5).astype(np.float32)),
                     "other": pa.array(["s"] * n)})


TYPED = dict(epsilon=4.0, delta=1e-5, k=2, sampling_rate=0.2, epochs=1, hidden=3, chains=10, kmeans_iterations=2,
             accountant="rdp")


def test_a_release_records_the_source_types_and_synthesizes_a_table_in_them(tmp_path):
    import pyarrow as pa

    from sparkpriv.api import release_dpgm
    from sparkpriv.privacy.random import insecure_fixed_seed

    cols = ["i", "b", "x", "l", "f"]
    with insecure_fixed_seed(2):
        rel = release_dpgm(_typed_table(), columns=cols, **TYPED)
    assert rel.model.types == ("int", "boolean", "double", "bigint", "float")
    assert rel.receipt()["mechanism_details"]["model"]["column_types"] == list(rel.model.types)
    assert rel.receipt()["mechanism_details"]["model"]["format_version"] == dpgm.FORMAT_VERSION == 7
    # the receipt states the shares and defaults as used, not the None the caller left
    got = rel.receipt()["mechanism_details"]["parameters"]
    assert (got["length_share"], got["marginal_share"], got["average_tail"]) == (0.1, 0.3, 0.5)
    assert got["length_strata"] == [3] and got["row_bound"] == pytest.approx(np.sqrt(5))  # edges <= L = 5
    t = dpgm.synthesize_table(rel.model, 500, seed=1)
    assert t.column_names == cols
    assert [t.schema.field(c).type for c in cols] == [pa.int32(), pa.bool_(), pa.float64(), pa.int64(), pa.float32()]
    # the same records as synthesize(): the 0/1 values cast (the RBM samples binary records)
    S = dpgm.synthesize(rel.model, 500, seed=1)
    assert set(np.unique(S)) <= {0.0, 1.0}
    for j, c in enumerate(cols):
        np.testing.assert_array_equal(t.column(c).to_numpy(zero_copy_only=False).astype(np.float64), S[:, j])
    # the model file keeps the types
    rel.model.save(tmp_path / "m.npz")
    assert dpgm.DPGMModel.load(tmp_path / "m.npz").types == rel.model.types
    # a numpy input: its dtype for every column, named x0, x1, ...
    X = np.column_stack([t.column(c).to_numpy(zero_copy_only=False) for c in ("i", "l")]).astype(np.int16)
    with insecure_fixed_seed(2):
        rel_np = release_dpgm(np.vstack([X, X]), **TYPED)
    tn = dpgm.synthesize_table(rel_np.model, 5, seed=1)
    assert tn.column_names == ["x0", "x1"] and {f.type for f in tn.schema} == {pa.int16()}


def test_casts_round_integers_and_threshold_booleans():
    """A continuous model (e.g. the Gaussian VAE) gives values in [0, 1]: integer columns get them
    rounded half up, booleans x >= 0.5, floats unchanged."""
    X = np.array([[0.49, 0.49, 0.49, 0.49], [0.5, 0.5, 0.5, 0.5], [0.7, 0.2, 1.0, 0.0]])
    arrays = dpgm.synthetic_arrays(X, ["bigint", "boolean", "double", "tinyint"])
    assert arrays[0].to_pylist() == [0, 1, 1] and str(arrays[0].type) == "int64"
    assert arrays[1].to_pylist() == [False, True, False]
    assert arrays[2].to_pylist() == [0.49, 0.5, 1.0]
    assert arrays[3].to_pylist() == [0, 1, 0] and str(arrays[3].type) == "int8"
    assert [dpgm.synthetic_type(t) for t in ("int", "integer", "boolean", "decimal(10,2)", "float", "smallint")] \
        == ["int", "int", "boolean", "double", "float", "smallint"]


def _format1_bytes(m) -> bytes:
    """A model file of format version 1 (before the column types), as the library wrote it."""
    import io
    import json

    header = {"format": "sparkpriv-dpgm", "format_version": 1, "params": m.params.public_dict(), "d": m.d,
              "public": m.plan_public}
    buf = io.BytesIO()
    np.savez(buf, header=np.frombuffer(json.dumps(header, default=float).encode(), np.uint8),
             thetas=m.thetas, sizes=m.sizes, centers=m.centers)
    return buf.getvalue()


def test_a_format_1_model_still_loads_and_synthesizes_doubles(tmp_path):
    import pyarrow as pa

    m = _toy_model([5.0, 2.0], [[1.0, -1.0], [0.5, 0.5]])
    path = tmp_path / "old.npz"
    path.write_bytes(_format1_bytes(m))
    back = dpgm.DPGMModel.load(path)
    assert back.column_types is None and back.types == ("double", "double")
    assert np.array_equal(back.thetas, m.thetas)
    t = dpgm.synthesize_table(back, 20, seed=1)
    assert t.column_names == ["x0", "x1"] and all(f.type == pa.float64() for f in t.schema)
    # a damaged type list in a format 2 file is refused
    bad = dpgm.DPGMModel(m.params, m.d, m.thetas, m.sizes, m.centers, column_types=("int", "string"))
    (tmp_path / "bad.npz").write_bytes(bad.to_bytes())
    with pytest.raises(ParameterError, match="column types"):
        dpgm.DPGMModel.load(tmp_path / "bad.npz")


def test_learning_rate_by_cluster_follows_the_noise_of_the_averaged_gradient(plan):
    """Unset learning_rate, rbm: 0.002 min(max(tau / 0.03, 1), 5) with tau = sigma C / (q n)
    (closed form, from the plan's public sigma); a declared rate or the vae: the same rate
    for every cluster."""
    sigma, C, q = plan.noise_multiplier, P.clip, P.sampling_rate
    for n in (1.0, 10.0, 1e3, 1e5, 1e9):
        tau = sigma * C / (q * n)
        want = 0.002 * min(max(tau / 0.03, 1.0), 5.0)
        assert plan.learning_rate_for(n) == pytest.approx(want, rel=1e-12)
    assert plan.learning_rate_for(1e9) == 0.002 and plan.learning_rate_for(1.0) == pytest.approx(0.01)
    assert plan.learning_rate_for(0.0) == plan.learning_rate_for(1.0)  # an empty cluster trains as n = 1
    fixed = dpgm.plan_dpgm(dpgm.DPGMParams(**dict(P.public_dict(), learning_rate=0.005)), n=400, d=10)
    assert {fixed.learning_rate_for(n) for n in (1.0, 1e3, 1e9)} == {0.005}
    vae = dpgm.plan_dpgm(dpgm.DPGMParams(**dict(P.public_dict(), model="vae")), n=400, d=10)
    assert {vae.learning_rate_for(n) for n in (1.0, 1e3, 1e9)} == {0.01}


def test_a_release_records_each_clusters_learning_rate():
    rng = np.random.default_rng(3)
    X = (rng.random((600, 10)) < 0.2).astype(float)
    model, plan = dpgm.fit_dpgm_array(X, P, seed=5)
    want = [plan.learning_rate_for(max(float(s), 1.0)) for s in model.sizes]
    assert model.plan_public["learning_rates"] == pytest.approx(want)
    assert all(0.002 <= r <= 0.01 for r in want)


def test_schedule_and_tail_mean_reach_every_clusters_trainer(monkeypatch):
    """``lr_schedule`` and ``average_tail`` are passed to DP-SGD for every cluster (their effect on
    the iterates is checked against a plain loop in test_dpsgd.py); by default the rbm is the mean of
    the last half of its iterates, the vae its last iterate (docs/research/dpgm.md, "MNIST")."""
    import dataclasses

    assert dpgm.DPGMParams().average_tail is None and dpgm.DPGMParams().lr_schedule == "constant"
    assert dpgm.DPGMParams(model="rbm").tail == 0.5 and dpgm.DPGMParams(model="vae").tail == 0.0
    assert dpgm.DPGMParams(model="vae", average_tail=0.25).tail == 0.25

    p = dataclasses.replace(P, lr_schedule="cosine", average_tail=0.25)
    plan = dpgm.plan_dpgm(p, n=400, d=10)
    seen = []

    def spy(*args, **kw):
        seen.append((kw["schedule"], kw["average"]))
        return real(*args, **kw)

    real = dpsgd.train
    monkeypatch.setattr(dpsgd, "train", spy)
    X = (np.random.default_rng(0).random((400, 10)) < 0.3).astype(float)
    dpgm.train_clusters(X, (np.arange(400) % 2).astype(int), np.array([200.0, 200.0]), np.full((2, 10), 0.3),
                        plan, seed=7)
    assert seen == [("cosine", 0.25), ("cosine", 0.25)]
    for model, want in (("rbm", 0.5), ("vae", 0.0)):  # unset: the model's default reaches the trainer
        seen.clear()
        q = dataclasses.replace(P, model=model, average_tail=None)
        qplan = dpgm.plan_dpgm(q, n=400, d=10)
        dpgm.train_clusters(X, (np.arange(400) % 2).astype(int), np.array([200.0, 200.0]), np.full((2, 10), 0.3),
                            qplan, seed=7)
        assert [a for _, a in seen] == [want, want], model
        assert dpgm.model_public(qplan, [200.0, 200.0])["average_tail"] == want  # the model file says which
    with pytest.raises(ParameterError, match="average_tail"):
        dpgm.plan_dpgm(dataclasses.replace(P, average_tail=1.0), n=400, d=10)
    with pytest.raises(ParameterError, match="lr_schedule"):
        dpgm.plan_dpgm(dataclasses.replace(P, lr_schedule="step"), n=400, d=10)


def test_a_model_file_from_before_the_tail_mean_says_it_kept_the_last_iterate(tmp_path):
    """Files written before ``average_tail`` existed have no such key: their models are the last
    iterate, so they load with 0.0, not with today's default; today's files keep what they say
    (unset: the model's default)."""
    import io
    import json

    m = _toy_model([5.0, 2.0], [[1.0, -1.0], [0.5, 0.5]])
    z = np.load(io.BytesIO(m.to_bytes()))
    header = json.loads(bytes(z["header"]).decode())
    assert "average_tail" in header["params"] and header["params"]["average_tail"] is None  # the default
    for key in ("average_tail", "lr_schedule"):
        del header["params"][key]
    buf = io.BytesIO()
    np.savez(buf, header=np.frombuffer(json.dumps(header).encode(), np.uint8),
             **{k: z[k] for k in z.files if k != "header"})
    (tmp_path / "old.npz").write_bytes(buf.getvalue())
    back = dpgm.DPGMModel.load(tmp_path / "old.npz")
    assert back.params.average_tail == 0.0 and back.params.lr_schedule == "constant"
    (tmp_path / "new.npz").write_bytes(m.to_bytes())
    new = dpgm.DPGMModel.load(tmp_path / "new.npz").params
    assert new.average_tail is None and new.tail == 0.5  # the rbm's default


def test_reliability_rule_against_its_closed_form():
    from sparkpriv.mechanisms.dpgm import cluster_size_std, reliable_clusters

    sizes = np.array([0.0, 174.0, 0.0, 0.0, 41.0, 0.0, 5069.0, 0.0, 39.0, 0.0])  # the 5,000 people
    got = reliable_clusters(sizes, size_std=12.0, n=5000, reliability_stds=3.0, min_share=0.01)
    assert got.tolist() == [s >= 36.0 and s >= 50.0 for s in sizes]
    assert got.tolist() == [False, True, False, False, False, False, True, False, False, False]
    # the inverse-variance mean's std: sqrt(1 / (1/a^2 + 1/(B b^2)))
    assert cluster_size_std(3.0, 4, 2.0) == pytest.approx((1 / (1 / 9 + 1 / 16)) ** 0.5)
    assert cluster_size_std(3.0) == 3.0


def test_degenerate_mixture_is_flagged_and_synthesis_skips_unreliable_clusters(monkeypatch):
    """A table where nearly everyone is alike: most of the 6 clusters are near empty. They are flagged in
    the model, the receipt, the output table and the command's notes, and synthesis never draws them."""
    from sparkpriv.api import release_dpgm
    from sparkpriv.mechanisms.dpgm import DPGMModel, synthesize
    from sparkpriv.privacy.random import insecure_fixed_seed
    from sparkpriv.runner import public_notes

    rng = np.random.default_rng(3)
    X = (rng.random((3000, 8)) < 0.6).astype(float)
    X[:20] = 0.0
    with insecure_fixed_seed(2):
        rel = release_dpgm(X, k=6, epsilon=1.0, delta=1e-5, kmeans_iterations=3, sampling_rate=0.2, epochs=1.0,
                           hidden=3, chains=10, min_cluster_share=0.05)
    clusters = rel.public["model"]["clusters"]
    sizes = np.asarray(rel.public["model"]["cluster_sizes"])
    expected = (sizes >= 3.0 * clusters["size_std"]) & (sizes >= 0.05 * 3000)
    assert clusters["reliable"] == np.flatnonzero(expected).tolist()
    assert clusters["unreliable"] == np.flatnonzero(~expected).tolist() and clusters["unreliable"]
    assert rel.df.column("reliable").to_pylist() == expected.tolist()
    assert rel.model.reliable.tolist() == expected.tolist()
    assert any("usable" in n for n in public_notes(rel.public))
    drawn = []
    real = DPGMModel.sample_cluster

    def spy(self, gen, j, n, rng):
        drawn.append(j)
        return real(self, gen, j, n, rng)

    monkeypatch.setattr(DPGMModel, "sample_cluster", spy)
    synthesize(rel.model, 5000, seed=4)
    assert drawn and set(drawn) <= set(clusters["reliable"])
    w = rel.model.mixture_weights()
    assert np.all(w[~expected] == 0) and w.sum() == pytest.approx(1.0)
