"""Test helper: record every secret seed a release draws (to check none is published)."""

from __future__ import annotations

import sys

from sparkpriv.privacy import random as sprandom


def record_secret_seeds(monkeypatch) -> list:
    """Every seed drawn through new_secret_seed from now on (also where a sparkpriv module
    imported the name), appended to the returned list."""
    seeds = []
    real = sprandom.new_secret_seed

    def recording(purpose):
        s = real(purpose)
        seeds.append(s)
        return s

    monkeypatch.setattr(sprandom, "new_secret_seed", recording)
    for mod in list(sys.modules.values()):
        if getattr(mod, "new_secret_seed", None) is real and mod.__name__.startswith("sparkpriv"):
            monkeypatch.setattr(mod, "new_secret_seed", recording)
    return seeds
