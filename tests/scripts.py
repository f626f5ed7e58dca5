"""Load a study script of docs/research/scripts/ as a module, for the tests of the measurement scripts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "docs" / "research" / "scripts"


def load_script(name: str):
    """``docs/research/scripts/<name>.py`` imported as the module ``<name>_script``."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
