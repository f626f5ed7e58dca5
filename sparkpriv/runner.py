"""One release, from a configuration to a published table (layer 3).

The CLI's ``release <mechanism>`` and ``jobs/release.py`` both call
:func:`run_release`; the Python functions (``sparkpriv.api.release_projection``
...) are what it calls. Each mechanism registers a :class:`MechanismSpec` naming its own
options (shared by the command line and config files) and how to call its
release function from a config.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from typing import Callable

from sparkpriv.config import COMMON_OPTIONS, TABLE_OPTIONS, Option, ReleaseConfig, apply_bounds_file
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
    plan_without_data: Callable | None = None  # (cfg) -> the events, or None when they need the input
    table_fields: Callable | None = None  # () -> the names of its parameters (which table options apply)
    event_table: bool = False  # its input is always an event table, bounded by Spark SQL (Spark reads it)


MECHANISMS: dict[str, MechanismSpec] = {}


def register(spec: MechanismSpec) -> None:
    MECHANISMS[spec.name] = spec


def options_for(mechanism: str) -> tuple[Option, ...]:
    spec = MECHANISMS.get(mechanism)
    if spec is None:
        raise ParameterError(
            f"Unknown mechanism {mechanism!r}; available: {', '.join(sorted(MECHANISMS))}."
        )
    return COMMON_OPTIONS + table_options(mechanism) + spec.all_options()


def table_options(mechanism: str) -> tuple[Option, ...]:
    """The options of :data:`TABLE_OPTIONS` that apply to ``mechanism`` (none to a release of event
    tables only, such as counts; ``--bounds-file`` only where the parameters declare lower and upper)."""
    spec = MECHANISMS[mechanism]
    fields = spec.table_fields() if spec.table_fields is not None else None
    if fields is None:  # a mechanism outside the protocol: every table option
        return TABLE_OPTIONS
    out = []
    for o in TABLE_OPTIONS:
        if o.name == "bounds_file":
            ok = {"lower", "upper"} <= fields
        else:
            ok = o.name in fields
        if ok:
            out.append(o)
    return tuple(out)

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

    max_items, auto = check_event_options(cfg)
    return bound_contributions(
        df, person=cfg.get("person_col"), item=cfg.get("item_col"), max_items=max_items,
        vocabulary=cfg.get("vocabulary"), weights=cfg.get("weights", "binary"),
        max_events_per_item=cfg.get("max_events_per_item"),
        seed=read_key_file(cfg.get("bounding_key_file")), source=source, auto=auto)


def check_event_options(cfg: ReleaseConfig):
    """``(max_items, AutoCap or None)`` of an event-table release, or a ParameterError (public options
    only: run before Spark starts)."""
    from sparkpriv._validation import Interval, check_param

    caller = f"sparkpriv release {cfg.mechanism}"
    missing = [f"--{n.replace('_', '-')}" for n in ("person_col", "item_col", "max_items", "vocabulary")
               if cfg.get(n) is None]
    if missing:
        raise ParameterError(f"An event-table release (--events) needs {', '.join(missing)}.")
    raw = cfg.get("max_items")
    auto_opts = {k: cfg.get(f"max_items_{k}") for k in ("quantile", "share", "limit")
                 if cfg.get(f"max_items_{k}") is not None}
    if str(raw).strip().lower() == "auto":
        from sparkpriv.mechanisms.auto_bound import DEFAULT_LIMIT, AutoCap

        limit = auto_opts.pop("limit", DEFAULT_LIMIT)
        return "auto", AutoCap(**auto_opts, limit=limit, _caller=caller)
    try:
        max_items = int(str(raw).strip())
    except ValueError:
        max_items = None
    if max_items is None or max_items < 1:
        raise ParameterError(f"The 'max_items' parameter of {caller} (--max-items) must be a positive integer "
                             f"or 'auto'. Got {raw!r} instead.")
    if auto_opts:
        raise ParameterError(f"--max-items-{next(iter(auto_opts))} applies to --max-items auto only.")
    check_param("max_events_per_item", cfg.get("max_events_per_item"), [None, Interval("integer", 1, None, "left")],
                caller)
    return max_items, None


EVENT_OPTIONS = (
    # event tables (CDR, transit): one bounded record per person, docs/math.md section 8
    Option("events", "bool", "the input is an event table (one row per call/tap); each person's "
           "events become one record of at most --max-items items of --vocabulary", default=False),
    Option("person_col", "str", "event tables: the person-key column (never copied to the output)"),
    Option("item_col", "str", "event tables: the item column (tower, station)"),
    Option("max_items", "int_or_auto", "event tables: at most this many distinct items per person, chosen "
           "uniformly at random when a person has more; 'auto': chosen by the release from a DP histogram of "
           "the items per person, as its 0.95 quantile (release synthetic: the L minimising its error "
           "estimate, at most that quantile); spends --max-items-share of epsilon, accounted in the same "
           "event"),
    Option("max_items_quantile", "float", "with --max-items auto: the share of people whose items all fit "
           "(default 0.95; release synthetic: unless given, L minimises its error estimate, at most the "
           "0.95 quantile)"),
    Option("max_items_share", "float", "with --max-items auto: the share of epsilon the choice spends "
           "(default 0.1)"),
    Option("max_items_limit", "int", "with --max-items auto: the largest bound that may be chosen "
           "(default 256)"),
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
    notes: tuple = ()  # public facts the command prints (unreliable clusters, the chosen max_items)


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
        if not led.budgets_for(table_id):  # neither its own budget nor a privacy unit's
            raise BudgetExceededError(_no_budget_message(getattr(led, "public_url", None) or str(url), table_id))


def check_budget_admits(cfg: ReleaseConfig, plan_without_data) -> None:
    """Refuse, without starting Spark, a release the ledger would refuse now (over budget).

    The release's events are planned from its public parameters alone where the input's
    public facts follow from them (a table's declared columns; an event table's vocabulary
    and contribution bound): ``plan_without_data(cfg)`` returns them, or None when they
    need the input's schema. The ledger's dry run (``check_admission``) then raises the
    refusal the reservation would (exit 3). Nothing is reserved here: the reservation, made
    after Spark starts and before any data is read, still decides.
    """
    table_id = cfg.get("table_id")
    if table_id is None:
        return
    events = plan_without_data(cfg)
    if events is None:
        return
    from sparkpriv.ledger import open_ledger
    from sparkpriv.ledger.base import default_ledger_url

    try:
        led = open_ledger(cfg.get("ledger") or default_ledger_url(), read_only=True)
    except Exception:
        return  # a ledger that cannot be read here: the reservation says why
    with led:
        check = getattr(led, "check_admission", None)
        if check is not None:
            check(table_id, events)


class _PlannedRecords:
    """The public facts of an event table's bounded records, from the options alone (no data)."""

    def __init__(self, d: int, max_items: int, value_cap: float, auto):
        self.d, self.value_cap, self.auto_cap = d, value_cap, auto
        self.set_max_items(max_items)

    def set_max_items(self, max_items: int) -> None:
        self.max_items = int(max_items)

    @property
    def facts(self):
        from sparkpriv.mechanisms.protocol import InputFacts

        return InputFacts("records", self.d, (), self.value_cap, math.sqrt(self.max_items) * self.value_cap)


def _public_facts(cfg: ReleaseConfig, mech):
    """The input facts a release would see, from public options only (None where they need data)."""
    from sparkpriv.mechanisms.protocol import InputFacts

    if cfg.get("events"):
        from sparkpriv.mechanisms.sparse import Vocabulary

        max_items, auto = check_event_options(cfg)
        try:
            d = Vocabulary.parse(cfg.get("vocabulary")).size
        except Exception:
            return None  # a vocabulary file Spark reads (a remote path): checked at the reservation
        if auto is not None:
            auto = dataclasses.replace(auto, limit=min(auto.limit, d))
            max_items = auto.limit
        c = float(cfg.get("max_events_per_item") or 1) if cfg.get("weights", "binary") == "counts" else 1.0
        return _PlannedRecords(d, max_items, c, auto)
    columns = cfg.get("columns")
    if not columns:
        return None
    columns = tuple(columns)
    names = columns + tuple(cfg.get("keep_columns") or ()) + tuple(c for c in (cfg.get("label"), cfg.get("target"))
                                                                  if c)
    return type("_Table", (), {"facts": InputFacts("table", len(columns), columns, names=names),
                               "auto_cap": None})()


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
    if spec.plan_without_data is not None:
        check_budget_admits(cfg, spec.plan_without_data)
    if spark is None:
        check_local_paths(cfg)
    spark = spark or get_spark(cfg.spark, size_local_driver=True)
    out_q = check_output_path(spark, cfg.get("output"), bool(cfg.get("overwrite")))
    check_writer(spark, out_q, spec.row_level, cfg.get("writer") or "auto")  # before any data is read
    # event tables are bounded by Spark SQL (bound_contributions): always Spark's reader
    if (cfg.get("events") or spec.event_table) and cfg.get("reader") == "arrow":
        raise ParameterError("--reader arrow does not apply to --events: an event table is bounded by Spark "
                             "SQL, so Spark reads it. Leave --reader out (auto) or use --reader spark.")
    reader = "spark" if (cfg.get("events") or spec.event_table) else cfg.get("reader", "auto")
    used = [c for c in (*(cfg.get("columns") or ()), *(cfg.get("keep_columns") or ()), cfg.get("label"),
                        cfg.get("target"), cfg.get("person_col"), cfg.get("item_col")) if c]
    df = read_table(spark, cfg.get("input"), cfg.get("input_format"), null_value=cfg.get("null_value"),
                    reader=reader, columns=used)
    from sparkpriv.ledger.checks import job_context

    with job_context(cfg.get("job_id")):  # recorded in the ledger entry (reserve and commit)
        release = spec.release(df, cfg, cfg.get("input"), **({"on_step": on_step} if spec.precheck else {}))
        entry = release.hold.reservation.id if release.hold.reservation is not None else None
        try:
            out = release.write(cfg.get("output"), overwrite=bool(cfg.get("overwrite")), writer=cfg.get("writer"),
                                owner_report=cfg.get("owner_report"))
        except BaseException as exc:
            # the job ends here: its computed (or partly computed) table is charged, never given back
            release.abandon(f"publishing failed: {type(exc).__name__}")
            raise
    return RunResult(output=out, receipt_path=f"{out}/{RECEIPT_FILE}", epsilon=release.epsilon,
                     delta=release.delta, ledger_entry=entry, notes=public_notes(release.public))


def public_notes(public: dict) -> tuple:
    """What a user must see of a release's public facts before using it (printed by the command)."""
    notes = []
    clusters = (public.get("model") or {}).get("clusters")
    if clusters and clusters.get("unreliable"):
        k = len(clusters["reliable"]) + len(clusters["unreliable"])
        notes.append(f"{clusters['usable']} of {k} clusters usable; clusters {clusters['unreliable']} are unreliable "
                     "(noisy size below the rule in the receipt) and synthesis skips them")
    unreliable = public.get("unreliable_clusters")
    if isinstance(unreliable, (list, tuple)) and unreliable:
        notes.append(f"clusters {list(unreliable)} are unreliable (noisy size within noise of 0): their centres are "
                     "noise")
    est = public.get("contribution_bound_estimation")
    if est:
        how = (f"a DP quantile ({est['quantile']:g} of the people)" if "quantile" in est else
               "the release's error estimate on a DP histogram of the record lengths")
        notes.append(f"max_items {est['chosen_max_items']} chosen by {how}, epsilon {est['epsilon']:.4g} of the release")
    return tuple(notes)


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
                      adapt=None, prepare=None, event_table: bool = False) -> None:
    """Register a protocol mechanism: options from its parameters class, one release call.

    A parameter that is also a common option (columns, fill, epsilon, delta)
    keeps the common definition (its command-line rules, e.g. columns required
    unless --events); the mechanism's Params still validates it. ``extra``
    are command-line-only options (files to read), turned into parameters by
    ``adapt(cfg, params)``. The mechanism module is imported when its options
    are first needed (commands that do not release do not pay for it);
    ``summary`` is its one-line help and ``row_level`` whether its table is
    computed in Python (the Arrow writer can write it); a test checks both
    against the mechanism. ``prepare(df, cfg, params)``: a last step once the input is read (Spark
    runs), e.g. reading a public table that a parameter names. ``event_table``: the input is always
    an event table (Spark reads it; ``--reader arrow`` is refused).
    """
    from functools import lru_cache

    common = {o.name for o in COMMON_OPTIONS + TABLE_OPTIONS}

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
        params = params_of(cfg)
        if prepare is not None:
            params = prepare(df, cfg, params)
        return release(name, df, ledger=cfg.get("ledger"), table_id=cfg.get("table_id"), source=source,
                       caller=f"sparkpriv release {name}", on_step=on_step, **params)

    def precheck(cfg: ReleaseConfig) -> None:
        """The parameters' own checks, before Spark starts (public parameters only)."""
        from sparkpriv.mechanisms.protocol import resolve_neighbors

        mech, _, events, _ = resolved()
        caller = f"sparkpriv release {name}"
        params = params_of(cfg)  # the mechanism's own refusals of options first
        if events and cfg.get("events"):
            check_event_options(cfg)
        p = mech.Params.from_mapping(params, caller)
        if hasattr(p, "neighbors"):
            resolve_neighbors(p.neighbors, mech, caller)
        p.validate(caller)

    def plan_without_data(cfg: ReleaseConfig):
        """The release's events from its public options alone, or None (they need the input)."""
        from sparkpriv.release import _plan_auto

        mech = resolved()[0]
        caller = f"sparkpriv release {name}"
        src = _public_facts(cfg, mech)
        if src is None:
            return None
        try:
            p = mech.Params.from_mapping(params_of(cfg), caller)
            p.validate(caller)
            mech.check_input(p, src.facts, caller)
            if src.auto_cap is not None:
                return _plan_auto(mech, p, src, src.auto_cap, caller)[0].events
            return mech.plan(p, src.facts, caller).events
        except Exception:  # the real plan, on the input's schema, refuses what is wrong
            return None

    register(MechanismSpec(name=name, summary=summary, options=(), release=run, precheck=precheck,
                           lazy_options=lambda: resolved()[3], row_level=row_level,
                           plan_without_data=plan_without_data, event_table=event_table,
                           table_fields=lambda: ({s.name for s in resolved()[0].specs()}
                                                 if "table" in resolved()[0].inputs else set())))


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


def _events_only(cfg: ReleaseConfig, params: dict) -> dict:
    if not cfg.get("events"):
        raise ParameterError("sparkpriv release synthetic reads an event table: give --events with "
                             "--person-col, --item-col, --vocabulary and --max-items (auto is advised).")
    return params


register_protocol("synthetic", "a DP synthetic table of an event table (each person's set of items): the histogram "
                  "of items per person and the per-item counts, released once; synthetic people drawn from them",
                  row_level=False, adapt=_events_only)


def _aggregates_prepare(df, cfg: ReleaseConfig, params: dict) -> dict:
    """``--domain col=table:PATH[:column]``: the column's domain read from a PUBLIC table (Spark runs)."""
    from sparkpriv.mechanisms.aggregates import table_specs

    tables = table_specs(params.get("domain"))
    if not tables:
        return params
    from sparkpriv.io.inputs import read_table
    from sparkpriv.spark.aggregates import public_column_vocabulary

    domain = {}
    for part in params["domain"]:
        col, spec = (x.strip() for x in part.split("=", 1))
        if col in tables:
            path, column = tables[col]
            domain[col] = public_column_vocabulary(read_table(df.sparkSession, path, None), column)
        else:
            domain[col] = spec
    return {**params, "domain": domain}


register_protocol("aggregates", "DP aggregates per key of an event table (count, count_distinct, sum, mean, "
                  "variance, quantiles), every cell with its std and interval; public key domains or private key "
                  "selection", row_level=False, prepare=_aggregates_prepare, event_table=True)


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
           "## Every release", "", _legacy_table(COMMON_OPTIONS), "",
           "## Releases of a table's columns", "",
           "Each mechanism that takes a table offers those of these that apply to it.", "",
           _legacy_table(TABLE_OPTIONS), ""]
    for name in sorted(MECHANISMS):
        spec = MECHANISMS[name]
        out += [f"## {name}", "", spec.summary + ".", ""]
        if name in protocol:
            common = {o.name for o in COMMON_OPTIONS + TABLE_OPTIONS}
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
