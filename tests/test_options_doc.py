"""docs/options.md is generated from the parameters classes and option tables: it must be current."""

from pathlib import Path

from sparkpriv.runner import options_markdown


def test_options_doc_is_generated_and_current():
    doc = Path(__file__).resolve().parents[1] / "docs" / "options.md"
    assert doc.read_text() == options_markdown(), (
        "docs/options.md is out of date: regenerate it with `python -m sparkpriv.runner > docs/options.md`")


def test_cli_summaries_are_the_mechanisms_own():
    from sparkpriv.mechanisms.protocol import registered
    from sparkpriv.runner import MECHANISMS

    for name, mech in registered().items():
        assert MECHANISMS[name].summary == mech.summary


def test_commands_that_do_not_release_do_not_import_the_mechanisms():
    import subprocess
    import sys

    code = ("import sys; from sparkpriv.cli import build_parser; build_parser(['ledger', 'show']); "
            "sys.exit(1 if 'sparkpriv.mechanisms.kmeans' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
