"""Release configuration: one frozen dataclass, loaded from TOML or the CLI.

A config file holds the same options as the command line (``--row-bound`` is
``row_bound``), plus ``mechanism`` and a ``[spark]`` table of Spark settings.
Unknown keys are errors; ``epsilon`` has no default, and ``delta`` is never
silently chosen for a mechanism that needs one.

Example (``nightly.toml``)::

    mechanism = "projection"
    input = "s3a://lake/cdr/towers/2026-11-21"
    output = "s3a://releases/cdr/towers/2026-11-21"
    columns = ["f0", "f1", "f2"]
    k = 2
    epsilon = 1.0
    row_bound = 1.0
    table_id = "cdr.daily_towers"
    ledger = "postgresql://ledger@db/ledger"

    [spark]
    "spark.sql.shuffle.partitions" = "64"
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from sparkpriv.errors import ParameterError

__all__ = ["Option", "COMMON_OPTIONS", "TABLE_OPTIONS", "ReleaseConfig", "load_toml", "coerce", "read_bounds_file",
           "apply_bounds_file"]


@dataclass(frozen=True)
class Option:
    """One option of a command: its name, type and help (shared by CLI and TOML)."""

    name: str
    type: str  # "str" | "int" | "float" | "bool" | "strs" | "floats" | "int_or_auto"
    help: str
    default: Any = None
    required: bool = False
    choices: tuple | None = None
    required_unless: str | None = None  # not required when this other option is set


COMMON_OPTIONS = (
    Option("input", "str", "source table: a Parquet/CSV path or a catalog table name", required=True),
    Option("input_format", "str", "format of the input (default: guessed from the path)",
           choices=("parquet", "csv", "table")),
    Option("null_value", "str", "CSV input: the string that marks a missing value (e.g. '?'); "
           "such cells are read as nulls (then replaced by the public fill)"),
    Option("output", "str", "destination directory of the private Parquet table", required=True),
    Option("overwrite", "bool", "replace an existing output", default=False),
    Option("writer", "str", "who writes the part files: arrow (the Python tasks; row-level releases "
           "to local paths, s3:// and gs://), spark, or auto (arrow where it applies)", default="auto",
           choices=("auto", "spark", "arrow")),
    Option("reader", "str", "who reads a Parquet input's rows: arrow (the Python workers read the row "
           "groups; local files), spark, or auto (arrow where it applies, else spark)", default="auto",
           choices=("auto", "spark", "arrow")),
    Option("epsilon", "float", "privacy budget epsilon of this release", required=True),
    Option("delta", "float", "privacy budget delta of this release (0 for pure-DP mechanisms)"),
    Option("ledger", "str", "budget ledger URL: sqlite:///path or postgresql://... "
           "(default: $SPARKPRIV_LEDGER or ~/.sparkpriv/ledger.sqlite)"),
    Option("table_id", "str", "logical id of the source table in the ledger, e.g. cdr.daily_towers"),
    Option("job_id", "str", "id of this run, recorded in its ledger entry (default: $SPARKPRIV_JOB_ID, or the "
           "scheduler's: Airflow's dag/run/task, the Spark application id)"),
    Option("owner_report", "str", "write data-owner diagnostics (NOT private) to this local JSON file"),
)

# Options of releases of a table's columns; a mechanism offers those that apply to it
# (sparkpriv.runner.options_for): --columns where it takes a table, --keep-columns, --fill and
# --bounds-file where its parameters have keep_columns, fill, lower and upper.
TABLE_OPTIONS = (
    Option("columns", "strs", "comma-separated numeric feature columns", required=True,
           required_unless="events"),
    Option("keep_columns", "strs", "comma-separated input columns declared PUBLIC and copied "
           "to the output unchanged (person keys are never copied otherwise)", default=()),
    Option("fill", "float", "public value that replaces nulls, NaN and infinities in the feature columns "
           "(default: the centre of the declared box, else 0)"),
    Option("bounds_file", "str", "file of declared per-column bounds instead of --lower/--upper: CSV "
           "with the header column,lower,upper, or TOML lines column = [lower, upper]"),
)


def coerce(opt: Option, value: Any, where: str) -> Any:
    """Convert ``value`` (from TOML or a CLI string) to the option's type."""
    if value is None:
        return None
    t = opt.type
    try:
        if t == "str":
            if isinstance(value, int) and not isinstance(value, bool):
                value = str(value)  # a TOML number for an option that also takes words (max_keys = 16 or "auto")
            if not isinstance(value, str):
                raise TypeError
            out = value
        elif t == "bool":
            if isinstance(value, bool):
                out = value
            elif isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                out = value.lower() in ("true", "1", "yes")
            else:
                raise TypeError
        elif t == "int_or_auto":  # a positive bound, or "auto" (chosen by the release)
            if isinstance(value, str) and value.strip().lower() == "auto":
                out = "auto"
            else:
                out = coerce(dataclasses.replace(opt, type="int"), value, where)
        elif t == "int":
            if isinstance(value, bool):
                raise TypeError
            if isinstance(value, str):
                value = int(value)
            if isinstance(value, float) and not value.is_integer():
                raise TypeError
            out = int(value)
        elif t == "float":
            if isinstance(value, bool):
                raise TypeError
            out = float(value)
        elif t == "strs":
            if isinstance(value, str):
                out = tuple(s.strip() for s in value.split(",") if s.strip())
            elif isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value):
                out = tuple(value)
            else:
                raise TypeError
        elif t == "floats":
            if isinstance(value, str):
                out = tuple(float(s) for s in value.split(",") if s.strip())
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                out = (float(value),)
            else:
                out = tuple(float(s) for s in value)
        else:  # pragma: no cover
            raise AssertionError(t)
    except (TypeError, ValueError):
        raise ParameterError(
            f"The {opt.name!r} option ({where}) must be {_type_words(t)}. Got {value!r} instead."
        ) from None
    if opt.choices is not None and out not in opt.choices:
        raise ParameterError(
            f"The {opt.name!r} option ({where}) must be one of {', '.join(map(str, opt.choices))}. "
            f"Got {out!r} instead."
        )
    return out


def _type_words(t: str) -> str:
    return {
        "str": "a string", "bool": "true or false", "int": "an integer", "float": "a number",
        "strs": "a list of names (comma-separated on the command line)",
        "floats": "a number or a list of numbers", "int_or_auto": "an integer or auto",
    }[t]


@dataclass(frozen=True)
class ReleaseConfig:
    """A validated release configuration."""

    mechanism: str
    values: Mapping[str, Any]
    spark: Mapping[str, str] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        v = self.values.get(name)
        return default if v is None else v


def load_toml(path: str) -> dict:
    """Read a TOML config file into a dict (errors name the file)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ParameterError(f"The config file {path!r} does not exist.") from None
    except tomllib.TOMLDecodeError as exc:
        raise ParameterError(f"The config file {path!r} is not valid TOML: {exc}.") from None


def split_file_values(file_values: dict, mechanism: str | None, known, source: str) -> dict:
    """Check a config file's keys (the one place that does) and take out ``mechanism`` and
    ``[spark]``: returns the Spark settings; ``file_values`` keeps the options.

    Unknown keys, a ``mechanism`` other than the command's, and a ``[spark]``
    that is not a table are refused, naming the file and the known keys
    (``mechanism`` None: a command that releases nothing; the key is ignored).
    """
    spark_conf = file_values.pop("spark", {}) or {}
    if not isinstance(spark_conf, dict):
        raise ParameterError(f"The [spark] section of the {source} must be a table of settings.")
    mech = file_values.pop("mechanism", None)
    if mech is not None and mechanism is not None and mech != mechanism:
        raise ParameterError(
            f"The {source} names mechanism {mech!r} but the command releases {mechanism!r}."
        )
    unknown = sorted(k for k in file_values if k not in known or k.startswith("_"))
    if unknown:
        raise ParameterError(
            f"Unknown key {unknown[0]!r} in the {source}. Known keys{f' for {mechanism}' if mechanism else ''}: "
            f"{', '.join(sorted(k for k in known if not k.startswith('_')))}, mechanism, [spark]."
        )
    return spark_conf


def build_config(
    mechanism: str,
    options: tuple[Option, ...],
    file_values: Mapping[str, Any] | None,
    cli_values: Mapping[str, Any],
    *,
    source: str = "config file",
) -> ReleaseConfig:
    """Merge config-file and command-line values (the command line wins).

    Unknown keys in the file are errors; missing required options are errors.
    """
    file_values = dict(file_values or {})
    spark_conf = split_file_values(file_values, mechanism, {o.name for o in options}, source)
    known = {o.name: o for o in options}
    values: dict[str, Any] = {}
    for name, opt in known.items():
        v = cli_values.get(name)
        where = "command line"
        if v is None:
            v = file_values.get(name)
            where = source
        v = coerce(opt, v, where)
        if v is None:
            v = opt.default
        if v is None and opt.required and opt.required_unless is not None:
            other = cli_values.get(opt.required_unless)
            if other is None:
                other = file_values.get(opt.required_unless)
            if opt.required_unless in known and other not in (None, False, "false", "False"):
                values[name] = v
                continue
        if v is None and opt.required and name in ("lower", "upper") and "bounds_file" in known and (
                cli_values.get("bounds_file") is not None or file_values.get("bounds_file") is not None):
            values[name] = v  # taken from the bounds file (apply_bounds_file)
            continue
        if v is None and opt.required:
            flag = "--" + name.replace("_", "-")
            raise ParameterError(f"The {name!r} option is required: give {flag} or set {name} in the config file.")
        values[name] = v
    for name in ("input", "output"):
        if isinstance(values.get(name), str) and RUN_DATE_PLACEHOLDER in values[name]:
            values[name] = values[name].replace(RUN_DATE_PLACEHOLDER, run_date())
    return ReleaseConfig(mechanism=mechanism, values=values,
                         spark={str(k): str(v) for k, v in spark_conf.items()})


RUN_DATE_PLACEHOLDER = "{run_date}"


def run_date() -> str:
    """The date that ``{run_date}`` in ``input`` and ``output`` stands for: the environment
    variable ``SPARKPRIV_RUN_DATE`` (``YYYY-MM-DD``) if set, else today's date in UTC.

    For schedulers without date templating (the Kubernetes operator's
    ScheduledSparkApplication): ``input = "s3a://lake/cdr/date={run_date}"``.
    """
    import datetime as dt
    import os

    value = os.environ.get("SPARKPRIV_RUN_DATE")
    if not value:
        return dt.datetime.now(dt.timezone.utc).date().isoformat()
    try:
        if len(value) != 10:
            raise ValueError
        return dt.date.fromisoformat(value).isoformat()
    except ValueError:
        raise ParameterError(f"The SPARKPRIV_RUN_DATE environment variable must be a date YYYY-MM-DD. "
                             f"Got {value!r} instead. Unset it to use today's date (UTC).") from None


def read_bounds_file(path: str) -> dict[str, tuple[float, float]]:
    """``{column: (lower, upper)}`` from a bounds file (CSV ``column,lower,upper`` or TOML).

    The bounds are public declarations: write them from domain knowledge, not
    from the data. Errors name the file, the line or column, and the fix.
    """
    import csv
    import math

    def number(v, where):
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ParameterError(f"The bounds file {path!r}: {where} is not a number ({v!r}).") from None
        if not math.isfinite(x):
            raise ParameterError(f"The bounds file {path!r}: {where} must be finite (got {v!r}).")
        return x

    out: dict[str, tuple[float, float]] = {}
    if path.lower().endswith(".toml"):
        for col, v in load_toml(path).items():
            if not isinstance(v, list) or len(v) != 2:
                raise ParameterError(f"The bounds file {path!r}: column {col!r} must be [lower, upper].")
            out[col] = (number(v[0], f"the lower bound of {col!r}"), number(v[1], f"the upper bound of {col!r}"))
    else:
        try:
            with open(path, newline="") as f:
                rows = list(csv.reader(f))
        except OSError as exc:
            raise ParameterError(f"Cannot read the bounds file {path!r}: {exc.strerror}.") from None
        if not rows or [c.strip().lower() for c in rows[0]] != ["column", "lower", "upper"]:
            raise ParameterError(f"The bounds file {path!r} must start with the header column,lower,upper "
                                 "(or be a .toml file of column = [lower, upper] lines).")
        for i, row in enumerate(rows[1:], start=2):
            if not row or not any(c.strip() for c in row):
                continue
            if len(row) != 3:
                raise ParameterError(f"The bounds file {path!r}, line {i}: expected column,lower,upper.")
            col = row[0].strip()
            if col in out:
                raise ParameterError(f"The bounds file {path!r}, line {i}: column {col!r} appears twice.")
            out[col] = (number(row[1], f"line {i} (lower)"), number(row[2], f"line {i} (upper)"))
    for col, (lo, hi) in out.items():
        if not lo < hi:
            raise ParameterError(f"The bounds file {path!r}: column {col!r} needs lower < upper (got {lo}, {hi}).")
    return out


def apply_bounds_file(cfg: ReleaseConfig, options) -> ReleaseConfig:
    """``cfg`` with ``lower``/``upper`` taken from ``cfg['bounds_file']`` for its columns."""
    import dataclasses

    path = cfg.get("bounds_file")
    if path is None:
        return cfg
    names = {o.name for o in options}
    if not {"lower", "upper"} <= names:
        raise ParameterError(f"bounds_file (--bounds-file) does not apply to the {cfg.mechanism} release "
                             "(it declares no per-column bounds).")
    if cfg.get("lower") is not None or cfg.get("upper") is not None:
        raise ParameterError("Give the bounds either in bounds_file (--bounds-file) or as lower/upper "
                             "(--lower/--upper), not both.")
    if cfg.get("events"):
        raise ParameterError("bounds_file (--bounds-file) is for table columns; event records have no "
                             "per-column bounds.")
    bounds = read_bounds_file(path)
    cols = list(cfg.get("columns") or ())
    missing = [c for c in cols if c not in bounds]
    if missing:
        raise ParameterError(f"The bounds file {path!r} has no bounds for the column(s) {', '.join(missing)}; "
                             "add a line for each released column.")
    values = dict(cfg.values)
    values["lower"] = tuple(bounds[c][0] for c in cols)
    values["upper"] = tuple(bounds[c][1] for c in cols)
    return dataclasses.replace(cfg, values=values)
