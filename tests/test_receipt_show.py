"""``sparkpriv receipt show``, the receipt's summary, its side file of long lists and its paths."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from sparkpriv.api import release_projection
from sparkpriv.ledger import open_ledger

D = 1000  # columns: the per-column bounds, fills and names are long lists
TABLE = "towers"


def cli_main(*argv: str) -> int:
    from sparkpriv.cli import main

    return main(list(argv))


def _data():
    X = np.random.default_rng(3).uniform(-1.0, 1.0, size=(200, D))
    lower = -1.0 - np.arange(D) / D  # per column: a long public vector
    return X, lower


def _stubs(obj, found):
    if isinstance(obj, dict):
        if obj.get("in_file") == "_privacy_receipt_details.json":
            found.append(obj)
        for v in obj.values():
            _stubs(v, found)
    elif isinstance(obj, list):
        for v in obj:
            _stubs(v, found)
    return found


@pytest.fixture
def published(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    with open_ledger(url) as ledger:
        ledger.set_budget(TABLE, epsilon=5.0, delta=0.0)
    X, lower = _data()
    rel = release_projection(X, k=2, epsilon=0.5, lower=lower, upper=1.0, ledger=url, table_id=TABLE,
                             source=str(tmp_path / "input" / "towers.parquet"))
    out = rel.write(str(tmp_path / "release"))
    return url, out, rel, lower


def test_show_prints_the_summary_first_and_the_facts(published, tmp_path, capsys):
    url, out, rel, _ = published
    capsys.readouterr()
    assert cli_main("receipt", "show", str(tmp_path / "release")) == 0
    text = capsys.readouterr().out
    first = text.splitlines()[0]
    assert first.startswith("A projection release") and "(0.5, 0)-differentially private" in first
    assert "replace-one" in first or "add-remove" in first
    receipt = json.loads((tmp_path / "release" / "_privacy_receipt.json").read_text())
    assert receipt["summary"] == first  # the receipt carries the paragraph show prints
    assert list(receipt)[:2] == ["format", "summary"] or "summary" in receipt
    for fact in ("mechanism    projection", "holds        yes", f"entry {receipt['ledger']['entry_id']}",
                 f"of table {TABLE}", "z0:double", "library      sparkpriv", "created_at"):
        assert fact in text, fact
    assert "NO PRIVACY GUARANTEE" not in text


def test_show_json_puts_the_long_lists_back(published, tmp_path, capsys):
    _, _, rel, lower = published
    capsys.readouterr()
    assert cli_main("receipt", "show", str(tmp_path / "release" / "_privacy_receipt.json"), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert _stubs(doc, []) == []
    assert doc["input"]["columns"] == [f"x{i}" for i in range(D)]
    assert doc["input"]["fill_for_nulls"] == pytest.approx(((lower + 1.0) / 2).tolist())  # the clamp's centre
    assert doc["events"] == json.loads((tmp_path / "release" / "_privacy_receipt.json").read_text())["events"]


def test_a_fixed_seed_receipt_says_there_is_no_guarantee(tmp_path, capsys):
    from sparkpriv.privacy.random import insecure_fixed_seed

    X, lower = _data()
    with insecure_fixed_seed(5):
        release_projection(X, k=2, epsilon=0.5, lower=-1.0, upper=1.0).write(str(tmp_path / "seeded"))
    receipt = json.loads((tmp_path / "seeded" / "_privacy_receipt.json").read_text())
    assert "NO privacy guarantee" in receipt["summary"] and "FIXED TEST SEED" in receipt["summary"]
    capsys.readouterr()
    assert cli_main("receipt", "show", str(tmp_path / "seeded")) == 0
    text = capsys.readouterr().out
    assert text.startswith("*** NO PRIVACY GUARANTEE") and "holds        NO (fixed test seed)" in text
    assert "-differentially private" not in text


@pytest.mark.parametrize("make", ["missing", "not_json", "not_receipt", "remote"])
def test_bad_paths_are_clear_errors(tmp_path, capsys, make):
    path = str(tmp_path / "nothing-here")
    if make == "not_json":
        (tmp_path / "x.json").write_text("{not json")
        path = str(tmp_path / "x.json")
    elif make == "not_receipt":
        (tmp_path / "x.json").write_text(json.dumps({"hello": 1}))
        path = str(tmp_path / "x.json")
    elif make == "remote":
        path = "s3a://bucket/rel"
    capsys.readouterr()
    assert cli_main("receipt", "show", path) == 2
    err = capsys.readouterr().err
    assert path in err or repr(path) in err
    assert {"missing": "give a published release's directory", "not_json": "Cannot read the receipt",
            "not_receipt": "is not a sparkpriv privacy receipt", "remote": "copy the"}[make] in err


def test_side_file_holds_the_long_lists_once_and_the_receipt_is_small(published, tmp_path):
    _, _, rel, lower = published
    folder = tmp_path / "release"
    receipt = json.loads((folder / "_privacy_receipt.json").read_text())
    details = json.loads((folder / "_privacy_receipt_details.json").read_text())
    stubs = _stubs(receipt, [])
    lists = details["lists"]
    assert {s["key"] for s in stubs} == set(lists)  # every stub has its list, every list a stub
    values = [lists[s["key"]] for s in stubs]
    assert [float(v) for v in lower] in values  # the declared lower bounds, as given
    assert pytest.approx(((lower + 1.0) / 2).tolist()) in values  # the fill: centre of each column's clamp
    assert [f"x{i}" for i in range(D)] in values
    for s in stubs:
        v = lists[s["key"]]
        assert s["length"] == len(v) == D
        if "min" in s:
            assert (s["min"], s["max"]) == (min(v), max(v))
    assert len(lists) == len({json.dumps(v) for v in lists.values()})  # each list stored once
    # the numbers the guarantee depends on stay in the receipt
    details_main = receipt["mechanism_details"]
    assert details_main["noise_variance_per_entry"] == rel.public["noise_variance_per_entry"] > 0
    assert receipt["guarantee"]["epsilon"] == pytest.approx(0.5)
    size = os.path.getsize(folder / "_privacy_receipt.json")
    assert size < 16_000, size  # D = 1000 columns: the lists alone are ~100 KB pretty-printed


def test_no_absolute_path_in_any_receipt_file(published, tmp_path):
    _, out, _, _ = published
    folder = tmp_path / "release"
    receipt = json.loads((folder / "_privacy_receipt.json").read_text())
    assert receipt["output"]["path"] == "release" and receipt["output"]["local"] is True
    assert receipt["input"]["source"] == "towers.parquet"
    for name in ("_privacy_receipt.json", "_privacy_receipt_details.json", "_common_metadata",
                 "part-00000.parquet"):
        assert str(tmp_path).encode() not in (folder / name).read_bytes(), name


def test_receipt_verify_still_passes(published, tmp_path, capsys):
    url, out, _, _ = published
    capsys.readouterr()
    assert cli_main("receipt", "verify", out, "--ledger", url) == 0
    text = capsys.readouterr().out
    assert text.startswith("OK: ") and "note: the receipt's output path" not in text
    with open_ledger(url) as ledger:  # the ledger, the owner's record, keeps the full path
        (entry,) = ledger.status(TABLE).entries
    assert entry["output_path"] == out and str(tmp_path) in out


def test_public_path_rule(tmp_path, monkeypatch):
    from sparkpriv.receipt_form import public_path, public_source

    monkeypatch.chdir(tmp_path)
    assert public_path(f"file:{tmp_path}/a/b") == ("a/b", True)
    assert public_path("/home/alice/data/out") == ("out", True)
    assert public_path("s3a://AKIA:secret@bucket/rel/x") == ("s3a://bucket/rel/x", False)
    assert public_path("hdfs://nn:8020/rel") == ("hdfs://nn:8020/rel", False)
    assert public_source("cdr/2026-11-22") == "cdr/2026-11-22"
    assert public_source("/home/alice/in.parquet") == "in.parquet"
