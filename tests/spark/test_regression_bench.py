"""The regression benchmark runs end to end on tiny inputs (timing, utility, the sketch's study); smoke
only: nothing here looks at timings, the figures in docs/regression.md come from real runs."""

import json

import numpy as np
import pytest


@pytest.mark.spark
def test_bench_regression_smoke(spark, tmp_path, capsys):
    from sparkpriv.bench import regression

    res = regression.run(rows=3000, cols=5, repeats=1, data_dir=str(tmp_path), with_sketch=True, sketch_rows=20)
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["ratio_vs_mllib"] == res["ratio_vs_mllib"] and res["ratio_vs_mllib"][0] > 0
    assert res["runs"][0]["m"] == 20
    errs = res["relative_objective_error"]
    assert errs["MLlib (non-private)"][0] < 1e-8 and errs["sparkpriv ssp"][0] >= 0


def test_utility_smoke():
    from sparkpriv.bench import regression_utility as u

    out = u.utility(tasks=("coimbra", "ilpd-albumin"), epsilons=(1.0,), trials=1)
    methods = {r["method"] for r in out["records"]}
    assert {"sparkpriv ssp (linear)", "sparkpriv ssp (logistic)", "diffprivlib LogisticRegression",
            "DP-SGD logistic (sparkpriv dpsgd)", "non-private logistic", "sparkpriv sketch (linear)"} <= methods
    assert all(np.isfinite(r["score"]) for r in out["records"])


def test_sketch_study_smoke_and_adassp(tmp_path):
    from sparkpriv.bench import regression_sketch
    from sparkpriv.bench.adassp import adassp

    out = regression_sketch.sketch_study(trials=1, uniform_ns=(800,), uniform_eps=(), mnist=False,
                                         json_path=str(tmp_path / "u.jsonl"))
    methods = {r["method"] for r in out["records"]}
    assert {"non-private", "additive", "AdaSSP", "diffprivlib (pure eps)"} <= methods
    assert len((tmp_path / "u.jsonl").read_text().splitlines()) == len(out["records"])
    # AdaSSP at a huge budget is the least-squares fit
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (5000, 3)) / 2
    y = X @ np.array([0.3, -0.2, 0.1])
    x = adassp(X, y, epsilon=1e6, delta=1e-6, bound_x=1.0, bound_y=1.0, rng=rng)
    np.testing.assert_allclose(x, [0.3, -0.2, 0.1], atol=1e-3)
