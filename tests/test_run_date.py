"""``{date}`` and ``{date_nodash}`` in a release's input, output and table id: one config for every night."""

from __future__ import annotations

import datetime as dt

import pytest

from sparkpriv.errors import ParameterError

BASE = {"columns": ["a"], "k": 1, "epsilon": 1.0, "row_bound": 1.0}


def _build(file_values, cli_values=None):
    from sparkpriv.cli import build_parser
    from sparkpriv.config import build_config
    from sparkpriv.runner import options_for

    build_parser(["release"])
    return build_config("projection", options_for("projection"), {**BASE, **file_values}, cli_values or {})


def test_the_run_date_fills_input_output_and_table_id():
    cfg = _build({"input": "s3a://lake/cdr/date={date}", "output": "s3a://out/{date}/towers",
                  "table_id": "cdr.calls.{date_nodash}", "owner_report": "/secure/{date}.json"},
                 {"run_date": "2026-02-28"})
    v = cfg.values
    assert (v["input"], v["output"], v["table_id"], v["owner_report"]) == (
        "s3a://lake/cdr/date=2026-02-28", "s3a://out/2026-02-28/towers", "cdr.calls.20260228", "/secure/2026-02-28.json")


def test_without_a_run_date_it_is_today_in_utc_and_other_braces_stay():
    before = dt.datetime.now(dt.timezone.utc).date()
    cfg = _build({"input": "in/{date}", "output": "out/{region}/{date_nodash}"})
    after = dt.datetime.now(dt.timezone.utc).date()
    assert cfg.values["input"] in (f"in/{before.isoformat()}", f"in/{after.isoformat()}")
    assert cfg.values["output"] in (f"out/{{region}}/{d:%Y%m%d}" for d in (before, after))


def test_paths_without_placeholders_are_unchanged():
    cfg = _build({"input": "in/2026-01-01", "output": "out"}, {"run_date": "2026-12-04"})
    assert (cfg.values["input"], cfg.values["output"]) == ("in/2026-01-01", "out")


@pytest.mark.parametrize("bad", ["2026-13-01", "04.12.2026", "2026-2-1", "yesterday"])
def test_a_bad_run_date_is_refused_naming_the_option(bad):
    with pytest.raises(ParameterError, match="'run_date' option must be a date YYYY-MM-DD"):
        _build({"input": "in/{date}", "output": "out"}, {"run_date": bad})


def test_the_command_line_takes_run_date_and_refuses_a_bad_one_before_spark(tmp_path, capsys):
    from sparkpriv.cli import build_parser, main

    argv = ["release", "projection", "--input", "in/{date}", "--output", str(tmp_path / "{date}"), "--columns",
            "a", "--k", "1", "--epsilon", "1", "--row-bound", "1", "--run-date", "2026-12-04"]
    assert build_parser(argv).parse_args(argv).run_date == "2026-12-04"
    assert main([*argv[:-1], "2026-12-40"]) == 2
    assert "'run_date' option must be a date" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
