"""`sparkpriv release dpgm` end to end on a small CSV (a subprocess, local Spark)."""

import json
import os
import subprocess
import sys

import numpy as np

from sparkpriv.ledger import open_ledger
from sparkpriv.mechanisms.dpgm import MODEL_FILE, DPGMModel, synthesize


def test_cli_release_dpgm_writes_model_receipt_and_ledger(tmp_path):
    rng = np.random.default_rng(5)
    n, d = 300, 4
    X = (rng.random((n, d)) < np.where(np.arange(n)[:, None] % 2 == 0, 0.8, 0.1)).astype(int)
    data = tmp_path / "records.csv"
    cols = [f"c{j}" for j in range(d)]
    data.write_text(",".join(cols) + "\n" + "\n".join(",".join(map(str, r)) for r in X) + "\n")
    led = f"sqlite:///{tmp_path}/ledger.sqlite"
    with open_ledger(led) as ledger:
        ledger.set_budget("t.records", epsilon=10.0, delta=1e-4)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    out = tmp_path / "release"
    cmd = [sys.executable, "-m", "sparkpriv.cli", "release", "dpgm", "--input", str(data), "--output", str(out),
           "--columns", ",".join(cols), "--k", "2", "--epsilon", "5", "--delta", "1e-5", "--epochs", "1",
           "--sampling-rate", "0.2", "--hidden", "3", "--chains", "10", "--kmeans-iterations", "2",
           "--accountant", "rdp", "--marginal-share", "0.1", "--marginal-samples", "500", "--ledger", led,
           "--table-id", "t.records"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    receipt = json.loads((out / "_privacy_receipt.json").read_text())
    assert receipt["mechanism"] == "dpgm" and receipt["guarantee"]["epsilon"] <= 5.0
    assert receipt["ledger"]["table_id"] == "t.records"
    model = DPGMModel.load(out / MODEL_FILE)
    assert model.k == 2 and model.d == d and model.params.columns == tuple(cols)
    assert model.plan_public["epsilon_spent"] == receipt["guarantee"]["epsilon"]
    # the per-item counts: released, stated, in the spend (the receipt lists their event)
    assert model.item_counts.shape == (d,) and model.marginal_shift.shape == (d,)
    assert receipt["mechanism_details"]["item_counts"]["share_of_epsilon"] == 0.1
    assert "item counts" in json.dumps(receipt)
    S = synthesize(model, 50, seed=1)
    assert S.shape == (50, d) and set(np.unique(S)) <= {0.0, 1.0}
    with open_ledger(led) as ledger:
        entries = ledger.status("t.records").entries
    assert [e["state"] for e in entries] == ["committed"] and entries[0]["mechanism"] == "dpgm"
