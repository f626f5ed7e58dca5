"""docs/options.md is generated from the parameters classes and option tables: it must be current."""

from pathlib import Path

from sparkpriv.runner import options_markdown


def test_options_doc_is_generated_and_current():
    doc = Path(__file__).resolve().parents[1] / "docs" / "options.md"
    assert doc.read_text() == options_markdown(), (
        "docs/options.md is out of date: regenerate it with `python -m sparkpriv.runner > docs/options.md`")
