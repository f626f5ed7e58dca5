"""The README's relative links exist, and every `sparkpriv ...` command it shows parses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _commands() -> list[list[str]]:
    """The ``sparkpriv ...`` lines of the README's shell blocks (continuations joined)."""
    out, block, lang = [], None, None
    for line in README.splitlines():
        if line.startswith("```"):
            if block is None:
                block, lang = [], line[3:].strip()
            else:
                if lang in ("bash", "sh", "console", ""):
                    text = "\n".join(block).replace("\\\n", " ")
                    for cmd in text.splitlines():
                        cmd = cmd.split(" # ")[0].strip().removeprefix("$ ")
                        for part in re.split(r"\s*(?:&&|\|\||;)\s*", cmd):
                            if part.startswith("sparkpriv "):
                                out.append(shlex.split(part)[1:])
                block = None
            continue
        if block is not None:
            block.append(line)
    return out


def test_the_readme_shows_commands():
    assert len(_commands()) >= 5


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a)[:60])
def test_every_command_parses(argv):
    from sparkpriv.cli import build_parser

    argv = [a for a in argv if a != "..."]  # an elided part of an example
    build_parser(argv).parse_args(argv)


def test_relative_links_exist():
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (ROOT / target).exists():
            missing.append(target)
    assert not missing, f"README.md links to files that do not exist: {missing}"
