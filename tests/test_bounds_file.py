"""Declared bounds from a file (wide tables), checked before Spark starts."""

from __future__ import annotations

import pytest

from sparkpriv.config import ReleaseConfig, apply_bounds_file, read_bounds_file
from sparkpriv.errors import ParameterError
from sparkpriv.runner import options_for


def _cfg(**values):
    base = {"columns": ("a", "b", "c")}
    base.update(values)
    return ReleaseConfig("dprp", base)


def test_csv_and_toml_bounds(tmp_path):
    csv = tmp_path / "b.csv"
    csv.write_text("column,lower,upper\nc,0,9\na,-1,1\nb,2.5,3\nunused,0,1\n")
    toml = tmp_path / "b.toml"
    toml.write_text('a = [-1.0, 1.0]\nb = [2.5, 3]\nc = [0, 9]\n')
    for path in (csv, toml):
        cfg = apply_bounds_file(_cfg(bounds_file=str(path)), options_for("dprp"))
        assert cfg.get("lower") == (-1.0, 2.5, 0.0) and cfg.get("upper") == (1.0, 3.0, 9.0)  # column order


@pytest.mark.parametrize("text,msg", [
    ("col,lo,hi\na,0,1\n", "must start with the header column,lower,upper"),
    ("column,lower,upper\na,0,1\nb,0,1\n", r"no bounds for the column\(s\) c"),
    ("column,lower,upper\na,0,1\nb,1,0\nc,0,1\n", "'b' needs lower < upper"),
    ("column,lower,upper\na,0,x\nb,0,1\nc,0,1\n", "line 2 \\(upper\\) is not a number"),
    ("column,lower,upper\na,0,inf\nb,0,1\nc,0,1\n", "must be finite"),
    ("column,lower,upper\na,0,1\na,0,2\n", "'a' appears twice"),
])
def test_bad_bounds_files_name_the_fault(tmp_path, text, msg):
    p = tmp_path / "b.csv"
    p.write_text(text)
    with pytest.raises(ParameterError, match=msg):
        apply_bounds_file(_cfg(bounds_file=str(p)), options_for("dprp"))


def test_bounds_file_and_lower_upper_are_exclusive(tmp_path):
    p = tmp_path / "b.csv"
    p.write_text("column,lower,upper\na,0,1\nb,0,1\nc,0,1\n")
    with pytest.raises(ParameterError, match="not both"):
        apply_bounds_file(_cfg(bounds_file=str(p), lower=(0.0,)), options_for("dprp"))
    assert read_bounds_file(str(p)) == {"a": (0.0, 1.0), "b": (0.0, 1.0), "c": (0.0, 1.0)}


def test_cli_reads_the_bounds_file_before_spark_starts(tmp_path, capsys):
    from sparkpriv.cli import main

    p = tmp_path / "b.csv"
    p.write_text("column,lower,upper\na,0,1\n")
    rc = main(["release", "dprp", "--input", str(tmp_path / "missing.parquet"), "--output", str(tmp_path / "o"),
               "--columns", "a,b", "--epsilon", "1", "--delta", "1e-6", "--bounds-file", str(p)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no bounds for the column(s) b" in err and "missing.parquet" not in err
