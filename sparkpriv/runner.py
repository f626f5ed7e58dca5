"""One release, from a configuration to a published table (layer 3).

The CLI's ``release <mechanism>`` and ``jobs/release.py`` both call
:func:`run_release`; the Python functions (``sparkpriv.api.release_projection``
...) are what it calls. Each mechanism registers a :class:`MechanismSpec` naming its own
options (shared by the command line and config files) and how to call its
release function from a config.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

from sparkpriv.config import COMMON_OPTIONS, Option, ReleaseConfig, apply_bounds_file
from sparkpriv.errors import ParameterError

__all__ = ["MechanismSpec", "MECHANISMS", "register", "options_for", "run_release", "RunResult"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MechanismSpec:
    name: str
    summary: str
    options: tuple[Option, ...]
    release: Callable  # (df, cfg: ReleaseConfig, source: str) -> Release
    precheck: Callable | None = None  # (cfg) -> None: parameter checks before Spark starts
    lazy_options: Callable | None = None  # () -> options, for mechanisms whose import is costly

    def all_options(self) -> tuple[Option, ...]:
        return self.options if self.lazy_options is None else self.lazy_options()
    row_level: bool = True  # its table is computed in Python (the Arrow writer can write it); False: an aggregate


MECHANISMS: dict[str, MechanismSpec] = {}


def register(spec: MechanismSpec) -> None:
    MECHANISMS[spec.name] = spec


def options_for(mechanism: str) -> tuple[Option, ...]:
    spec = MECHANISMS.get(mechanism)
    if spec is None:
        raise ParameterError(
            f"Unknown mechanism {mechanism!r}; available: {', '.join(sorted(MECHANISMS))}."
        )
    return COMMON_OPTIONS + spec.all_options()


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


def _event_records(df, cfg: ReleaseConfig, source: str):
    """``--events``: bound the event table to one record per person (docs/math.md section 8)."""
    from sparkpriv.spark.events import bound_contributions

    missing = [f"--{n.replace('_', '-')}" for n in ("person_col", "item_col", "max_items", "vocabulary")
               if cfg.get(n) is None]
    if missing:
        raise ParameterError(f"An event-table release (--events) needs {', '.join(missing)}.")
    return bound_contributions(
        df, person=cfg.get("person_col"), item=cfg.get("item_col"), max_items=cfg.get("max_items"),
        vocabulary=cfg.get("vocabulary"), weights=cfg.get("weights", "binary"),
        max_events_per_item=cfg.get("max_events_per_item"),
        seed=read_key_file(cfg.get("bounding_key_file")), source=source)


EVENT_OPTIONS = (
    # event tables (CDR, transit): one bounded record per person, docs/math.md section 8
    Option("events", "bool", "the input is an event table (one row per call/tap); each person's "
           "events become one record of at most --max-items items of --vocabulary", default=False),
    Option("person_col", "str", "event tables: the person-key column (never copied to the output)"),
    Option("item_col", "str", "event tables: the item column (tower, station)"),
    Option("max_items", "int", "event tables: at most this many distinct items per person, chosen "
           "uniformly at random when a person has more"),
    Option("vocabulary", "str", "event tables: the PUBLIC item ids: a file of ids (one per line or "
           "a CSV's first column), or a range 'a..b' (inclusive); other items are dropped and counted"),
    Option("weights", "str", "event tables: binary (1 per visited item) or counts (event counts "
           "capped at --max-events-per-item)", default="binary", choices=("binary", "counts")),
    Option("max_events_per_item", "int", "event tables with --weights counts: cap of a person's "
           "events at one item"),
    Option("bounding_key_file", "str", "event tables: file holding a secret key (>= 16 bytes) "
           "for the choice of items, to make the same choice in later runs"),
)


@dataclass(frozen=True)
class RunResult:
    output: str
    receipt_path: str
    epsilon: float
    delta: float
    ledger_entry: str | None


def check_budget_exists(ledger_url: str | None, table_id: str | None) -> None:
    """Refuse, without starting Spark, a release whose table has no budget in the ledger.

    Only a cheap early check (read-only, public metadata): the admission itself
    is the reservation the release makes before reading data.
    """
    if table_id is None:
        return
    from sparkpriv.errors import BudgetExceededError
    from sparkpriv.ledger import open_ledger
    from sparkpriv.ledger.base import _no_budget_message

    from sparkpriv.ledger.base import default_ledger_url

    url = ledger_url or default_ledger_url()
    if url.startswith("sqlite:///"):
        path = os.path.expanduser(url[len("sqlite:///"):].split("?", 1)[0])
        if not os.path.exists(path):  # no ledger yet, so no budget in it
            raise BudgetExceededError(_no_budget_message(url, table_id))
    try:
        led = open_ledger(url, read_only=True)
    except Exception:
        return  # a ledger that cannot be read here: the reservation says why
    with led:
        if table_id not in led.tables():
            raise BudgetExceededError(_no_budget_message(getattr(led, "public_url", None) or str(url), table_id))


def check_local_paths(cfg: ReleaseConfig) -> None:
    """Refuse, before Spark starts, a missing input and an existing output (without
    ``--overwrite``) where the paths are files of this machine
    (:func:`sparkpriv.spark.session.paths_are_local`); Spark checks the others."""
    import re

    from sparkpriv.errors import InputError, OutputExistsError
    from sparkpriv.io.inputs import _guess_format
    from sparkpriv.spark.session import paths_are_local

    def local(path) -> str | None:
        if not isinstance(path, str) or not path or any(c in path for c in "*?[{"):  # globs: Spark's
            return None
        if path.startswith("file:"):
            path = re.sub(r"^file:(//(localhost)?)?", "", path)
            return path if path.startswith("/") else None
        return None if re.match(r"^[A-Za-z][\w+.-]*:", path) else path

    if not paths_are_local(cfg.spark):
        return
    source, fmt = cfg.get("input"), cfg.get("input_format")
    path = local(source)
    if path is not None and (fmt or _guess_format(source)) != "table" and not os.path.exists(path):
        raise InputError(f"Cannot read the input {source!r}: there is no such file or directory on this machine. "
                         "Check the path or table name and the format (--input-format parquet|csv|table).")
    path = local(cfg.get("output"))
    if path is not None and os.path.lexists(path) and not cfg.get("overwrite"):
        raise OutputExistsError(f"The output {'file:' + os.path.abspath(path)!r} already exists. Choose another "
                                "path or pass overwrite=True (--overwrite) to replace it.")


def run_release(cfg: ReleaseConfig, spark=None, on_step=None) -> RunResult:
    """Read the input, release it with the configured mechanism, publish it.

    Refused (:class:`ParameterError`, before Spark starts) while the
    environment variable ``SPARKPRIV_INSECURE_TEST_SEED`` is set or inside
    :class:`sparkpriv.privacy.random.insecure_fixed_seed`: the command line
    and jobs never publish a release made with a fixed seed.
    """
    from sparkpriv.io.inputs import read_table
    from sparkpriv.io.writer import RECEIPT_FILE, check_output_path, check_writer
    from sparkpriv.privacy.random import refuse_fixed_seed
    from sparkpriv.spark.session import get_spark

    refuse_fixed_seed("sparkpriv release")
    spec = MECHANISMS[cfg.mechanism]
    cfg = apply_bounds_file(cfg, options_for(cfg.mechanism))  # parameter errors before Spark starts
    if spec.precheck is not None:
        spec.precheck(cfg)
    check_budget_exists(cfg.get("ledger"), cfg.get("table_id"))
    if spark is None:
        check_local_paths(cfg)
    spark = spark or get_spark(cfg.spark, size_local_driver=True)
    out_q = check_output_path(spark, cfg.get("output"), bool(cfg.get("overwrite")))
    check_writer(spark, out_q, spec.row_level, cfg.get("writer") or "auto")  # before any data is read
    # event tables are bounded by Spark SQL (bound_contributions): always Spark's reader
    if cfg.get("events") and cfg.get("reader") == "arrow":
        raise ParameterError("--reader arrow does not apply to --events: an event table is bounded by Spark "
                             "SQL, so Spark reads it. Leave --reader out (auto) or use --reader spark.")
    reader = "spark" if cfg.get("events") else cfg.get("reader", "auto")
    df = read_table(spark, cfg.get("input"), cfg.get("input_format"), null_value=cfg.get("null_value"),
                    reader=reader)
    release = spec.release(df, cfg, cfg.get("input"), **({"on_step": on_step} if spec.precheck else {}))
    entry = release.hold.reservation.id if release.hold.reservation is not None else None
    out = release.write(cfg.get("output"), overwrite=bool(cfg.get("overwrite")), writer=cfg.get("writer"),
                        owner_report=cfg.get("owner_report"))
    return RunResult(output=out, receipt_path=f"{out}/{RECEIPT_FILE}", epsilon=release.epsilon,
                     delta=release.delta, ledger_entry=entry)


def _read_init_file(path: str):
    import numpy as np

    try:
        return np.loadtxt(path, delimiter=",", ndmin=2)
    except (OSError, ValueError) as exc:
        raise ParameterError(f"Cannot read the public init file {path!r}: "
                             f"{getattr(exc, 'strerror', None) or exc}.") from None


def _option_of(s) -> Option:
    """A command-line/config option from a mechanism's parameter (sparkpriv.mechanisms.protocol)."""
    help_ = s.help + (f" [default: {s.doc_default}]" if s.doc_default else "")
    return Option(s.name, s.kind, help_, default=s.default, required=s.required or s.required_unless is not None,
                  choices=s.choices, required_unless=s.required_unless)


def register_protocol(name: str, summary: str, *, row_level: bool, extra: tuple[Option, ...] = (),
                      adapt=None) -> None:
    """Register a protocol mechanism: options from its parameters class, one release call.

    A parameter that is also a common option (columns, fill, epsilon, delta)
    keeps the common definition (its command-line rules, e.g. columns required
    unless --events); the mechanism's Params still validates it. ``extra``
    are command-line-only options (files to read), turned into parameters by
    ``adapt(cfg, params)``. The mechanism module is imported when its options
    are first needed (commands that do not release do not pay for it);
    ``summary`` is its one-line help and ``row_level`` whether its table is
    computed in Python (the Arrow writer can write it); a test checks both
    against the mechanism.
    """
    from functools import lru_cache

    common = {o.name for o in COMMON_OPTIONS}

    @lru_cache(maxsize=1)
    def resolved():
        from sparkpriv.mechanisms.protocol import get_mechanism

        mech = get_mechanism(name)
        specs = [s for s in mech.specs() if s.cli]
        events = "records" in mech.inputs
        options = tuple(_option_of(s) for s in specs if s.name not in common) + extra \
            + (EVENT_OPTIONS if events else ())
        return mech, specs, events, options

    def params_of(cfg: ReleaseConfig) -> dict:
        specs = resolved()[1]
        params = {s.name: cfg.get(s.name) for s in specs if cfg.get(s.name) is not None}
        return adapt(cfg, params) if adapt is not None else params

    def run(df, cfg: ReleaseConfig, source: str, on_step=None):
        from sparkpriv.api import release

        if resolved()[2] and cfg.get("events"):
            df = _event_records(df, cfg, source)
        return release(name, df, ledger=cfg.get("ledger"), table_id=cfg.get("table_id"), source=source,
                       caller=f"sparkpriv release {name}", on_step=on_step, **params_of(cfg))

    def precheck(cfg: ReleaseConfig) -> None:
        """The parameters' own checks, before Spark starts (public parameters only)."""
        from sparkpriv.mechanisms.protocol import resolve_neighbors

        mech = resolved()[0]
        caller = f"sparkpriv release {name}"
        p = mech.Params.from_mapping(params_of(cfg), caller)
        if hasattr(p, "neighbors"):
            resolve_neighbors(p.neighbors, mech, caller)
        p.validate(caller)

    register(MechanismSpec(name=name, summary=summary, options=(), release=run, precheck=precheck,
                           lazy_options=lambda: resolved()[3], row_level=row_level))


def _kmeans_adapt(cfg: ReleaseConfig, params: dict) -> dict:
    if cfg.get("init_file") is not None:
        params["init"] = _read_init_file(cfg.get("init_file"))
    return params


def _dprp_adapt(cfg: ReleaseConfig, params: dict) -> dict:
    if params.get("threshold") is not None and not cfg.get("events"):  # before Spark starts
        raise ParameterError("--threshold applies to --events only (the released items of a person).")
    if cfg.get("fill_dp_mean"):
        if params.get("fill") is not None:
            raise ParameterError("Give either --fill (a public constant) or --fill-dp-mean, not both.")
        params["fill"] = "dp-mean"
    return params


register_protocol("dprp", "DPRP private table release: noisy random projection + noisy Gram, same columns and "
                  "scale", row_level=True, adapt=_dprp_adapt, extra=(
    Option("fill_dp_mean", "bool", "replace nulls by DP column means (spends --impute-share of the "
           "budget; one more read of the input)", default=False),
))
register_protocol("kmeans", "DP k-means (kernel: random Fourier features; linear: DPLloyd); releases "
                  "noisy centres", row_level=False, adapt=_kmeans_adapt, extra=(
    Option("init_file", "str", "CSV of k PUBLIC rows used as initial centres (default: random "
           "points of the declared domain)"),
))
register_protocol("dpgm", "DP mixture of generative models: DP k-means, then one RBM or VAE per cluster trained "
                  "with DP-SGD; releases the model file", row_level=False)


register_protocol("regression", "linear or logistic regression: noisy sufficient statistics with AdaSSP's "
                  "ridge (default), or a sample-mixing sketch S M + W; releases the statistics (or sketch) and the "
                  "coefficients", row_level=False)


def _counts_adapt(cfg: ReleaseConfig, params: dict) -> dict:
    """The key domain of the records: the declared vocabulary of --item-col."""
    if not cfg.get("events"):
        raise ParameterError("sparkpriv release counts reads an event table: give --events with "
                             "--person-col, --item-col, --vocabulary and --max-items.")
    if cfg.get("item_col") and cfg.get("vocabulary"):
        from sparkpriv.mechanisms.counts import KeyDomain

        params["domain"] = KeyDomain.product(cfg.get("item_col"), cfg.get("vocabulary"))
    return params


register_protocol("counts", "DP counts per public key of an event table (distinct people, or capped events, "
                  "per tower / station / pair); every key of the domain gets a noisy value and its interval",
                  row_level=False, adapt=_counts_adapt)


def _projection_adapt(cfg: ReleaseConfig, params: dict) -> dict:
    if cfg.get("events") and (cfg.get("columns") or cfg.get("keep_columns")):
        raise ParameterError("--columns and --keep-columns do not apply to --events: the record of a "
                             "person is built from --item-col over --vocabulary.")
    if cfg.get("delta") is None and cfg.get("noise", "laplace") != "laplace":
        raise ParameterError("Gaussian noise needs a delta: give --delta (e.g. 1e-6).")
    if cfg.get("matrix_key_file") is not None:
        params["matrix_key"] = read_key_file(cfg.get("matrix_key_file"))
    return params


register_protocol("projection", "JL random projection + calibrated noise (pairwise distances recoverable)",
                  row_level=True, adapt=_projection_adapt, extra=(
    Option("matrix_key_file", "str", "file holding a secret key (>= 16 bytes) from which the "
           "projection matrix is derived, to reuse the same matrix across releases"),
))


def _legacy_table(options) -> str:
    rows = ["| option | TOML key | type | default | meaning |", "|---|---|---|---|---|"]
    for o in options:
        if o.required:
            default = "required" + (f" unless `{o.required_unless}`" if o.required_unless else "")
        elif o.default in (None, ()):
            default = "none"
        else:
            default = f"`{o.default}`"
        kind = ", ".join(map(str, o.choices)) if o.choices else o.type
        rows.append(f"| `--{o.name.replace('_', '-')}` | `{o.name}` | {kind} | {default} | {o.help} |")
    return "\n".join(rows)


def options_markdown() -> str:
    """docs/options.md: every option of every mechanism, generated (never edit the file by hand)."""
    from sparkpriv.mechanisms.protocol import option_table, registered

    protocol = registered()
    out = ["# Options", "",
           "Generated from the code by `python -m sparkpriv.runner > docs/options.md` (a test checks",
           "that this file is up to date). A command-line flag `--row-bound` is the key `row_bound` of",
           "a job config file (TOML). For the mechanisms of the protocol the table comes from the",
           "mechanism's parameters class, which also defines the Python keywords; \"(Python only)\"",
           "marks parameters that have no flag.", "",
           "## Every release", "", _legacy_table(COMMON_OPTIONS), ""]
    for name in sorted(MECHANISMS):
        spec = MECHANISMS[name]
        out += [f"## {name}", "", spec.summary + ".", ""]
        if name in protocol:
            common = {o.name for o in COMMON_OPTIONS}
            mech = protocol[name]
            out += [option_table(mech), ""]
            cli_only = [o for o in spec.all_options() if o.name not in {s.name for s in mech.specs()}
                        and o.name not in common and o not in EVENT_OPTIONS]
            if cli_only:
                out += ["Command line and config files only:", "", _legacy_table(cli_only), ""]
            if "records" in mech.inputs:
                out += ["Event tables (`--events`): see [Event tables](#event-tables).", ""]
        else:
            out += [_legacy_table(spec.all_options()), ""]
    out += ["## Event tables", "", "Options of every mechanism that takes an event table (`--events`).", "",
            _legacy_table(EVENT_OPTIONS), ""]
    return "\n".join(out)


if __name__ == "__main__":  # python -m sparkpriv.runner > docs/options.md
    print(options_markdown(), end="")
