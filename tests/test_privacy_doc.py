"""docs/privacy.md's table "What each mechanism promises" has a row for every registered mechanism, and
each row's relations are the ones the mechanism accepts (a new mechanism without a row fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "privacy.md"
RELATIONS = ("replace-one", "add-remove", "element")


def _rows() -> dict:
    text = DOC.read_text()
    section = text.split("## What each mechanism promises", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.search(r'`mechanism = "([a-z_]+)"`', line)
        if m and line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[m.group(1)] = cells
    return rows


def test_every_registered_mechanism_has_a_row():
    from sparkpriv.runner import MECHANISMS

    rows = _rows()
    missing = sorted(set(MECHANISMS) - set(rows))
    assert not missing, f"docs/privacy.md, 'What each mechanism promises': no row for {missing}"


@pytest.mark.parametrize("name", sorted(_rows()))
def test_each_row_states_the_relations_the_mechanism_accepts(name):
    from sparkpriv.mechanisms.protocol import get_mechanism

    cells = _rows()[name]
    stated = {r for r in RELATIONS if r in cells[2]}
    accepted = {r.name for r in get_mechanism(name).neighbors}
    assert stated == accepted, f"{name}: the doc says {sorted(stated)}, the mechanism accepts {sorted(accepted)}"
    guarantee = cells[3]
    assert "epsilon" in guarantee and ("delta" in guarantee or "pure" in guarantee)
