"""One release, from a configuration to a published table (layer 3).

The CLI's ``release <mechanism>`` and ``jobs/release.py`` both call
:func:`run_release`; the Python functions (``release_projection`` ...) are what
it calls. Each mechanism registers a :class:`MechanismSpec` naming its own
options (shared by the command line and config files) and how to call its
release function from a config.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from sparkpriv.config import COMMON_OPTIONS, Option, ReleaseConfig
from sparkpriv.errors import ParameterError

__all__ = ["MechanismSpec", "MECHANISMS", "register", "options_for", "run_release", "RunResult"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MechanismSpec:
    name: str
    summary: str
    options: tuple[Option, ...]
    release: Callable  # (df, cfg: ReleaseConfig, source: str) -> Release


MECHANISMS: dict[str, MechanismSpec] = {}


def register(spec: MechanismSpec) -> None:
    MECHANISMS[spec.name] = spec


def options_for(mechanism: str) -> tuple[Option, ...]:
    spec = MECHANISMS.get(mechanism)
    if spec is None:
        raise ParameterError(
            f"Unknown mechanism {mechanism!r}; available: {', '.join(sorted(MECHANISMS))}."
        )
    return COMMON_OPTIONS + spec.options


def per_column(values, d: int, name: str):
    """A per-column list from one value (applied to every column) or d values."""
    if values is None:
        return None
    values = tuple(values)
    if len(values) == 1:
        return values * d
    if len(values) != d:
        raise ParameterError(
            f"The {name!r} option must have one value, or one per column ({d}). Got {len(values)}."
        )
    return values


def read_key_file(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            key = f.read()
    except OSError as exc:
        raise ParameterError(f"Cannot read the matrix key file {path!r}: {exc.strerror}.") from None
    if len(key) < 16:
        raise ParameterError(f"The matrix key file {path!r} must hold at least 16 bytes of secret material.")
    return key


def _projection(df, cfg: ReleaseConfig, source: str):
    from sparkpriv.spark.projection import release_projection

    cols = cfg.get("columns")
    noise = cfg.get("noise", "laplace")
    delta = cfg.get("delta")
    if delta is None:
        delta = 0.0 if noise == "laplace" else None
    if delta is None:
        raise ParameterError("Gaussian noise needs a delta: give --delta (e.g. 1e-6).")
    return release_projection(
        df,
        columns=cols,
        k=cfg.get("k"),
        epsilon=cfg.get("epsilon"),
        delta=delta,
        noise=noise,
        neighbors=cfg.get("neighbors", "replace-one"),
        row_bound=cfg.get("row_bound"),
        norm=cfg.get("norm", "l2"),
        lower=per_column(cfg.get("lower"), len(cols), "lower"),
        upper=per_column(cfg.get("upper"), len(cols), "upper"),
        element_bound=cfg.get("element_bound"),
        keep_columns=cfg.get("keep_columns", ()),
        fill=cfg.get("fill"),
        matrix_key=read_key_file(cfg.get("matrix_key_file")),
        ledger=cfg.get("ledger"),
        table_id=cfg.get("table_id"),
        source=source,
    )


register(MechanismSpec(
    name="projection",
    summary="JL random projection + calibrated noise (pairwise distances recoverable)",
    options=(
        Option("k", "int", "output dimension (columns z0..z{k-1})", required=True),
        Option("noise", "str", "laplace (pure epsilon-DP) or gaussian ((epsilon, delta)-DP)",
               default="laplace", choices=("laplace", "gaussian")),
        Option("neighbors", "str", "neighbour relation: replace-one (a person), add-remove (a "
               "person), or element (ONE ATTRIBUTE only, not a person)", default="replace-one",
               choices=("replace-one", "add-remove", "element")),
        Option("row_bound", "float", "declared bound on each row's norm (rows are clipped to it)"),
        Option("norm", "str", "norm of --row-bound", default="l2", choices=("l2", "l1")),
        Option("lower", "floats", "declared per-column lower bounds (one value for all columns, or one per column)"),
        Option("upper", "floats", "declared per-column upper bounds (one value for all columns, or one per column)"),
        Option("element_bound", "float", "largest change of one attribute (element-wise relation)"),
        Option("matrix_key_file", "str", "file holding a secret key (>= 16 bytes) from which the "
               "projection matrix is derived, to reuse the same matrix across releases"),
    ),
    release=_projection,
))


@dataclass(frozen=True)
class RunResult:
    output: str
    receipt_path: str
    epsilon: float
    delta: float
    ledger_entry: str | None


def run_release(cfg: ReleaseConfig, spark=None) -> RunResult:
    """Read the input, release it with the configured mechanism, publish it."""
    from sparkpriv.io.inputs import read_table
    from sparkpriv.io.writer import RECEIPT_FILE, check_output_path
    from sparkpriv.spark.session import get_spark

    spec = MECHANISMS[cfg.mechanism]
    spark = spark or get_spark(cfg.spark)
    check_output_path(spark, cfg.get("output"), bool(cfg.get("overwrite")))
    df = read_table(spark, cfg.get("input"), cfg.get("input_format"))
    release = spec.release(df, cfg, cfg.get("input"))
    entry = release.hold.reservation.id if release.hold.reservation is not None else None
    out = release.write(cfg.get("output"), overwrite=bool(cfg.get("overwrite")),
                        owner_report=cfg.get("owner_report"))
    return RunResult(output=out, receipt_path=f"{out}/{RECEIPT_FILE}", epsilon=release.epsilon,
                     delta=release.delta, ledger_entry=entry)
