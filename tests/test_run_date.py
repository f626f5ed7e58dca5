"""``{run_date}`` in input and output: the date of a scheduled run without date templating."""

from __future__ import annotations

import datetime as dt

import pytest

from sparkpriv.config import build_config
from sparkpriv.errors import ParameterError
from sparkpriv.runner import options_for

BASE = {"columns": ["a", "b"], "k": 1, "epsilon": 1.0, "row_bound": 1.0}


def _cfg(**values):
    return build_config("projection", options_for("projection"), dict(BASE, **values), {})


def test_run_date_from_the_environment(monkeypatch):
    monkeypatch.setenv("SPARKPRIV_RUN_DATE", "2026-03-04")
    cfg = _cfg(input="s3a://lake/cdr/date={run_date}", output="s3a://out/{run_date}/towers")
    assert cfg.values["input"] == "s3a://lake/cdr/date=2026-03-04"
    assert cfg.values["output"] == "s3a://out/2026-03-04/towers"


def test_run_date_defaults_to_today_in_utc(monkeypatch):
    monkeypatch.delenv("SPARKPRIV_RUN_DATE", raising=False)
    before = dt.datetime.now(dt.timezone.utc).date()
    cfg = _cfg(input="in/{run_date}", output="out/x")
    after = dt.datetime.now(dt.timezone.utc).date()
    assert cfg.values["input"] in (f"in/{before.isoformat()}", f"in/{after.isoformat()}")
    assert cfg.values["output"] == "out/x"


@pytest.mark.parametrize("bad", ["2026-3-4", "yesterday", "2026-02-30", "2026-03-04T00:00"])
def test_a_bad_run_date_names_the_variable_and_the_fix(monkeypatch, bad):
    monkeypatch.setenv("SPARKPRIV_RUN_DATE", bad)
    with pytest.raises(ParameterError, match="SPARKPRIV_RUN_DATE.*YYYY-MM-DD"):
        _cfg(input="in/{run_date}", output="out/{run_date}")
