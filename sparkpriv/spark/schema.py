"""Schema checks of Spark DataFrames (public facts only: names and types, never values)."""

from __future__ import annotations

import hashlib
import json
from typing import Sequence

from sparkpriv.errors import SchemaError

__all__ = ["check_numeric_columns", "check_present_columns", "schema_fingerprint"]


def check_numeric_columns(df, columns: Sequence[str], *, role: str = "feature") -> None:
    """Every declared column exists and is numeric or boolean (read as 0/1, as the local engine
    does); otherwise a :class:`SchemaError`."""
    from pyspark.sql.types import BooleanType, NumericType

    fields = {f.name: f for f in df.schema.fields}
    if not columns:
        raise SchemaError(f"No {role} columns were declared (columns / --columns).")
    seen = set()
    for c in columns:
        if c in seen:
            raise SchemaError(f"Column {c!r} is declared twice.")
        seen.add(c)
        if c not in fields:
            avail = ", ".join(fields) if len(fields) <= 40 else ", ".join(list(fields)[:40]) + ", ..."
            raise SchemaError(
                f"Column {c!r} is not in the input. Available columns: {avail}."
            )
        if not isinstance(fields[c].dataType, (NumericType, BooleanType)):
            raise SchemaError(
                f"Column {c!r} has type {fields[c].dataType.simpleString()}, but {role} columns "
                "must be numeric. Cast it or leave it out of the columns."
            )


def check_present_columns(df, columns: Sequence[str], *, role: str) -> None:
    names = df.columns
    for c in columns:
        if c not in names:
            raise SchemaError(f"The {role} column {c!r} is not in the input. Available columns: {', '.join(names)}.")


def schema_fingerprint(schema) -> str:
    """SHA-256 of the schema's canonical JSON (names, types, nullability)."""
    doc = json.dumps(json.loads(schema.json()), sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(doc).hexdigest()
