"""The column types of a synthetic table (DPGM, docs/research/dpgm.md "Synthesizing a table").

A release records the SQL type of each source column (``InputFacts.types``,
its schema: public); a synthetic column gets the same type for boolean,
integer and float columns, ``double`` for any other numeric type. The model's
values lie in ``[0, 1]``: booleans are ``value >= 0.5``, integers the value
rounded half up (the RBM's values are 0/1 already), floats unchanged.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SYNTHETIC_TYPES", "synthetic_type", "cast_column", "synthetic_arrays"]

# The column types of a synthetic table (Spark's simple strings) and their numpy dtypes: integer
# and boolean source columns keep their type, float stays float, any other numeric type is double.
SYNTHETIC_TYPES = {"boolean": np.bool_, "tinyint": np.int8, "smallint": np.int16, "int": np.int32,
                   "bigint": np.int64, "float": np.float32, "double": np.float64}


def synthetic_type(source_type: str) -> str:
    """The type of a synthetic column for a source column of SQL type ``source_type``
    (``InputFacts.types``): the same for boolean, integer, float and double; double otherwise."""
    t = str(source_type).strip().lower()
    t = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint", "bool": "boolean"}.get(t, t)
    return t if t in SYNTHETIC_TYPES else "double"


def cast_column(x: np.ndarray, t: str) -> np.ndarray:
    """Synthetic values in [0, 1] of one column as type ``t``: boolean ``x >= 0.5``, integers
    rounded half up (the RBM's values are 0/1 already), floats as they are."""
    if t == "boolean":
        return x >= 0.5
    dtype = SYNTHETIC_TYPES[t]
    if np.issubdtype(dtype, np.integer):
        return np.floor(x + 0.5).astype(dtype)
    return x.astype(dtype, copy=False)


def synthetic_arrays(X: np.ndarray, types) -> list:
    """The columns of synthetic records ``X`` (n, d) as Arrow arrays of the given synthetic types."""
    import pyarrow as pa

    X = np.asarray(X, dtype=np.float64)
    return [pa.array(cast_column(np.ascontiguousarray(X[:, j]), t)) for j, t in enumerate(types)]
