"""The local engine: releases of numpy arrays, pandas or Arrow tables held in memory.

See :mod:`sparkpriv.local.engine` and docs/architecture.md.
"""

from sparkpriv.local.engine import LocalEngine

__all__ = ["LocalEngine"]
