"""The README: at most 300 lines, its relative links (and every docs page's) exist, every `sparkpriv ...`
command it shows parses, its job config is one the release accepts, and its Python quick start runs."""

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


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_the_readme_is_short():
    assert len(README.splitlines()) <= 300


def test_every_docs_page_links_to_files_that_exist():
    pages = [*ROOT.glob("docs/**/*.md"), ROOT / "deploy" / "README.md", ROOT / "scripts" / "README.md"]
    missing = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" not in target and not target.startswith("mailto:") and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_the_job_config_is_accepted_by_the_release_it_names():
    import tomllib

    from sparkpriv.cli import build_parser
    from sparkpriv.config import build_config
    from sparkpriv.runner import options_for

    build_parser(["release"])  # registers every mechanism's options
    configs = [tomllib.loads(b) for b in _blocks("toml")]
    assert configs and all("mechanism" in c for c in configs)
    for values in configs:
        cfg = build_config(values["mechanism"], options_for(values["mechanism"]), values, {})
        assert cfg.values["epsilon"] == values["epsilon"] and cfg.spark


def test_the_python_quick_start_runs_in_memory():
    """The data scientist's block, up to its Spark-only last statement, on the local engine."""
    (block,) = [b for b in _blocks("python") if "DPLinearRegression" in b]
    local = block.split("per_tower =")[0]
    assert "Aggregates(" in block and "Aggregates(" not in local
    ns: dict = {}
    exec(compile(local, "README.md", "exec"), ns)  # noqa: S102  (the README's own example)
    assert ns["proj"].to_numpy().shape == (10_000, 4)
    assert ns["reg"].coef_.shape == (8,) and ns["rel"].model.predict(ns["X"][:5]).shape == (5,)
