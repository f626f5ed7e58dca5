"""docs/research/scripts/dpgm_scale.py (docs/research/dpgm.md, "At the paper's size"): a bad ``--variants`` is refused
before Spark starts or the truth is computed (minutes at the paper's size)."""

from __future__ import annotations

import sys

import pytest

from tests.scripts import load_script


def test_unknown_variant_key_is_refused_before_spark_starts(tmp_path):
    scale = load_script("dpgm_scale")
    had_spark = "pyspark.sql" in sys.modules
    with pytest.raises(SystemExit) as err:
        scale.main(["--events", str(tmp_path / "missing"), "--variants", '[{"epochs": 2}, {"name": "x"}]'])
    msg = str(err.value)
    assert "unknown keys ['name']" in msg and "epochs" in msg  # names the bad key and the allowed ones
    if not had_spark:  # run alone: the refusal came before the script's first Spark import
        assert "pyspark.sql" not in sys.modules
