"""The mechanism protocol: what a mechanism declares, and what the engines call.

Every mechanism is one class in the numpy core (docs/architecture.md):

* ``Params``: a frozen dataclass of its PUBLIC parameters. Each field is made
  with :func:`option` and carries its help text, its constraints (the
  scikit-learn ``_parameter_constraints`` idea, :mod:`sparkpriv._validation`)
  and whether the command line offers it. The command line's flags, the TOML
  keys, their defaults and help, and the docs' option tables are all generated
  from it (:func:`option_table`); unknown keys are refused in one place
  (:meth:`Params.from_mapping`).
* ``neighbors``: the neighbour relations it supports, as types
  (:class:`ReplaceOne`, :class:`AddRemove`, :class:`Element`); a relation it
  does not support is refused by :func:`resolve_neighbors` before anything
  else happens, with the mechanism's stated reason.
* :meth:`Mechanism.plan`: validation and calibration from public facts only
  (parameters and the input's schema, never its values): it draws the secrets,
  and returns a :class:`Plan` holding the dp_accounting events, the accounted
  (epsilon, delta) and the public facts for the receipt. Nothing here reads
  data, so every refusal depends on public parameters only.
* :meth:`Mechanism.run`: the data passes, written once against the engine
  interface (:class:`Engine`): per-batch partials merged by the engine
  (``engine.aggregate``), blocks cached for iterative passes
  (``engine.cache``), row maps with keyed per-partition noise streams
  (``engine.map_rows``), a finalize on the driver that adds the aggregate
  noise once. Two engines implement it: local (numpy, pandas or Arrow tables
  in memory, :mod:`sparkpriv.local`) and Spark (:mod:`sparkpriv.spark.engine`).

:func:`sparkpriv.release.release` is the one path every release takes:
validate, plan, reserve the budget, run on an engine, build the
:class:`~sparkpriv.release.Release`, and (on ``write``) publish and commit.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import ParameterError

__all__ = [
    "Neighbors", "ReplaceOne", "AddRemove", "Element", "REPLACE_ONE", "ADD_REMOVE", "ELEMENT",
    "resolve_neighbors", "option", "Params", "OptionSpec", "option_table", "Plan", "Outcome",
    "SparseRows", "TableRows", "EventRows", "InputFacts", "Mechanism", "Progress", "register", "registered", "get_mechanism", "REQUIRED",
    "missing_value_fill",
]


# ----------------------------------------------------------------------------- neighbour relations


class Neighbors:
    """A neighbour relation: which pairs of inputs the guarantee is stated for."""

    name: ClassVar[str] = ""
    protects: ClassVar[str] = ""
    n_public: ClassVar[bool] = False

    def __eq__(self, other) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ReplaceOne(Neighbors):
    """One record (a person) replaced by another; the number of records ``n`` is public."""

    name = "replace-one"
    protects = "one record (person) replaced by another; the number of records n is public"
    n_public = True


class AddRemove(Neighbors):
    """One record (a person) added or removed."""

    name = "add-remove"
    protects = "one record (person) added or removed"


class Element(Neighbors):
    """One attribute of one record changed by at most a declared amount: NOT a person."""

    name = "element"
    protects = ("one attribute (element) of one record changed by at most the declared element bound; "
                "NOT a person")
    n_public = True


REPLACE_ONE, ADD_REMOVE, ELEMENT = ReplaceOne(), AddRemove(), Element()
RELATIONS = {r.name: r for r in (REPLACE_ONE, ADD_REMOVE, ELEMENT)}

ROW_LEVEL_ADD_REMOVE = (
    "the output has one row per input record, so adding or removing a person changes the number "
    "of output rows, which no noise hides. Use neighbors='replace-one' (one person replaced; the "
    "number of records is public), or an aggregate release (e.g. k-means) where adding or "
    "removing a person is meaningful"
)


def resolve_neighbors(value: Any, mechanism: "Mechanism | type[Mechanism]", caller: str) -> Neighbors:
    """The relation ``value`` (a name or a :class:`Neighbors`) if ``mechanism`` supports it.

    The refusal names what the mechanism supports and why the relation is
    refused (the mechanism's ``refused_neighbors`` reason, or the row-level
    reason for add-remove); it depends on the parameter only.
    """
    rel = RELATIONS.get(value) if isinstance(value, str) else value if isinstance(value, Neighbors) else None
    supported = ", ".join(repr(r.name) for r in mechanism.neighbors)
    if rel is None:
        raise ParameterError(
            f"The 'neighbors' parameter of {caller} must be one of {supported}. Got {value!r} instead."
        )
    if rel not in mechanism.neighbors:
        why = mechanism.refused_neighbors.get(rel.name)
        if why is None and rel == ADD_REMOVE and mechanism.row_level:
            why = ROW_LEVEL_ADD_REMOVE
        raise ParameterError(
            f"The 'neighbors' parameter of {caller} cannot be {rel.name!r} for {mechanism.title}"
            + (f": {why}." if why else ".") + f" Supported: {supported}."
        )
    return rel


# ----------------------------------------------------------------------------- parameters

# The range of public numbers every mechanism computes with exactly (Params._check_magnitudes):
# squares of bounds times counts stay far below float64's 1.8e308, noise grids inside int64.
MAX_PUBLIC_MAGNITUDE = 1e15
MIN_PUBLIC_SCALE = 1e-12
EPSILON_RANGE = (1e-4, 1e6)
MIN_DELTA = 1e-12  # dp_accounting's PLD resolves no delta below about 1e-15 (its tail truncation)
POSITIVE_SCALES = frozenset({"row_bound", "element_bound", "clip", "kernel_width", "label_scale",
                             "max_value", "value_bound"})
# public numbers that are not magnitudes of the data (shares, rates, counts, probabilities)
_NOT_MAGNITUDES = frozenset({"neighbors"})


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
_KINDS = ("str", "int", "float", "bool", "strs", "floats", "neighbors", "object")


def option(default: Any = REQUIRED, *, help: str, constraints: Sequence[Any] = (), kind: str | None = None,
           cli: bool = True, doc_default: str | None = None, required_unless: str | None = None,
           metavar: str | None = None, recorded: bool = True) -> Any:
    """A field of a :class:`Params` class: default, help, constraints and CLI exposure.

    ``kind`` is the command-line/TOML type (``str``, ``int``, ``float``,
    ``bool``, ``strs``, ``floats``, ``neighbors``; ``object`` for Python-only
    values such as arrays); inferred from the constraints when omitted.
    ``doc_default`` says what a ``None`` default means (``"0.1"``,
    ``"4 k2"``); the option table shows it. ``cli=False`` keeps an option out
    of the command line and config files (Python only). ``recorded=False``
    keeps a parameter out of receipts and the ledger.
    """
    meta = {"help": help, "constraints": tuple(constraints), "kind": kind, "cli": cli,
            "doc_default": doc_default, "required_unless": required_unless, "metavar": metavar, "recorded": recorded}
    if default is REQUIRED:
        return field(default=None, metadata=dict(meta, required=True))
    return field(default=default, metadata=dict(meta, required=False))


def _infer_kind(constraints: Sequence[Any]) -> str:
    for c in constraints:
        if isinstance(c, Interval):
            return "int" if c.kind == "integer" else "float"
        if isinstance(c, Options):
            if all(isinstance(v, bool) for v in c.values):
                return "bool"
            if all(isinstance(v, str) for v in c.values):
                return "str"
        if c is bool:
            return "bool"
        if c is str:
            return "str"
    return "object"


@dataclass(frozen=True)
class OptionSpec:
    """One option as the command line, config files and docs see it."""

    name: str
    kind: str
    help: str
    default: Any
    required: bool
    choices: tuple | None
    doc_default: str | None
    required_unless: str | None
    cli: bool

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _as_tuple(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(v)
    if isinstance(v, np.ndarray) and v.ndim == 1:
        return tuple(float(x) for x in v)
    return v


@dataclass(frozen=True, kw_only=True)
class Params:
    """Base of every mechanism's frozen parameters (public by definition).

    Subclasses declare fields with :func:`option`. Lists are stored as tuples.
    :meth:`validate` checks every field's constraints and then
    :meth:`check` (cross-field rules) with scikit-learn's error template.
    """

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            t = _as_tuple(v)
            if t is not v and f.metadata.get("kind") in (None, "strs", "floats"):
                object.__setattr__(self, f.name, t)

    @classmethod
    def specs(cls) -> tuple[OptionSpec, ...]:
        out = []
        for f in dataclasses.fields(cls):
            m = f.metadata
            if "help" not in m:
                continue
            kind = m["kind"] or _infer_kind(m["constraints"])
            choices = None
            for c in m["constraints"]:
                if isinstance(c, Options):
                    choices = tuple(c.values)
            out.append(OptionSpec(f.name, kind, m["help"], f.default, m["required"], choices,
                                  m["doc_default"], m["required_unless"], m["cli"] and kind != "object"))
        return tuple(out)

    def validate(self, caller: str) -> None:
        for f in dataclasses.fields(self):
            m = f.metadata
            v = getattr(self, f.name)
            if m.get("required") and v is None and not (m.get("required_unless")
                                                        and getattr(self, m["required_unless"], None)):
                raise ParameterError(f"The {f.name!r} parameter of {caller} is required "
                                     f"({'--' + f.name.replace('_', '-')}): {m['help']}.")
            cons = list(m.get("constraints", ()))
            if cons and v is not None:
                check_param(f.name, v, cons, caller)
        self._check_magnitudes(caller)
        self.check(caller)

    def _check_magnitudes(self, caller: str) -> None:
        """Every public number within the range the calibration computes with exactly.

        A declared bound, fill or scale above :data:`MAX_PUBLIC_MAGNITUDE` (or a
        positive scale below :data:`MIN_PUBLIC_SCALE`), an epsilon outside
        :data:`EPSILON_RANGE` or a positive delta below :data:`MIN_DELTA` would
        overflow (or underflow) the sensitivity, the noise scale or the
        accountant somewhere after the reservation; it is refused here, naming
        the parameter, before anything is reserved or read.
        """
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "epsilon":
                lo, hi = EPSILON_RANGE
                if isinstance(v, (int, float)) and not isinstance(v, bool) and not lo <= v <= hi:
                    raise ParameterError(
                        f"The 'epsilon' parameter of {caller} must be a float in the range [{lo:g}, {hi:g}]. "
                        f"Got {v!r} instead: below {lo:g} the noise is larger than any answer, above {hi:g} "
                        "there is no privacy left to state.")
                continue
            if f.name == "delta":
                if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < MIN_DELTA:
                    raise ParameterError(
                        f"The 'delta' parameter of {caller} must be 0 or at least {MIN_DELTA:g}. Got {v!r} "
                        "instead: the accountants do not resolve smaller deltas (1/n or 1e-9 is usual).")
                continue
            if f.name in _NOT_MAGNITUDES or f.metadata.get("kind") == "object":
                continue
            vals = v if isinstance(v, tuple) else (v,)
            for x in vals:
                if isinstance(x, bool) or not isinstance(x, (int, float)):
                    continue
                if not math.isfinite(x) or abs(x) > MAX_PUBLIC_MAGNITUDE:
                    raise ParameterError(
                        f"The {f.name!r} parameter of {caller} must be a finite number of magnitude at most "
                        f"{MAX_PUBLIC_MAGNITUDE:g}. Got {x!r} instead: rescale the column (e.g. to thousands) "
                        "and declare the bound in those units.")
                if f.name in POSITIVE_SCALES and 0 < x < MIN_PUBLIC_SCALE:
                    raise ParameterError(
                        f"The {f.name!r} parameter of {caller} must be 0 or at least {MIN_PUBLIC_SCALE:g}. Got "
                        f"{x!r} instead: rescale the column and declare the bound in those units.")

    def check(self, caller: str) -> None:
        """Cross-field rules (subclasses); public parameters only."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], caller: str) -> "Params":
        """Build from keyword arguments, refusing unknown names (the one place that does)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ParameterError(
                f"{caller} got an unknown parameter {unknown[0]!r}. Its parameters: "
                f"{', '.join(sorted(names))}."
            )
        return cls(**values)

    def public_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not f.metadata.get("recorded", True):
                continue  # e.g. a seed: the ledger refuses secret-looking names, receipts never show them
            if isinstance(v, Neighbors):
                v = v.name
            elif isinstance(v, np.ndarray):
                v = "array of shape " + "x".join(map(str, v.shape))
            elif isinstance(v, float) and not math.isfinite(v):
                v = str(v)
            out[f.name] = v
        return out


def option_table(mechanism: "Mechanism") -> str:
    """The docs' option table of a mechanism's parameters (generated, never hand-written)."""
    rows = ["| option | TOML key | type | default | meaning |", "|---|---|---|---|---|"]
    for s in mechanism.specs():
        if s.required or s.required_unless:
            default = "required" + (f" unless `{s.required_unless}`" if s.required_unless else "")
        elif s.doc_default is not None:
            default = s.doc_default
        elif s.default is None:
            default = "none"
        else:
            default = f"`{s.default}`"
        kind = ", ".join(map(str, s.choices)) if s.choices else s.kind
        flag = f"`{s.flag}`" if s.cli else "(Python only)"
        rows.append(f"| {flag} | `{s.name}` | {kind} | {default} | {s.help} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------- plan, blocks, outcome


@dataclass(frozen=True)
class InputFacts:
    """Public facts of the input an engine gives the plan: its schema, never its values.

    ``kind`` is ``"table"`` (one row per person: dense ``columns``),
    ``"records"`` (bounded person records of an event table: ``d`` items,
    each person at most ``value_cap`` per item and ``l2_bound`` in L2) or
    ``"events"`` (an event table grouped by person, :class:`EventRows` blocks:
    ``d`` keys of a public domain, 0 for private keys; ``columns`` the value
    columns).
    ``integer_columns``: indices of the declared columns of an integer type
    (a table). ``classes``: the declared label values, coerced to the label
    column's type (when ``engine.open`` got ``labels=(column, classes)``).
    ``names``: every column name of a table input (its schema; empty for a
    numpy array), for parameters that name other columns (kept public columns).
    ``types``: the SQL type of each declared column (a table; Spark's simple
    strings: ``tinyint``, ``smallint``, ``int``, ``bigint``, ``float``,
    ``double``, ``boolean``, ``decimal(p,s)``; empty when unknown), for outputs
    that keep the source's column types (DPGM's synthetic tables).
    ``length_histogram``: bounded event records whose bound is ``auto``: the release path measures the
    DP histogram of items per person (and gives it to the mechanism as ``source.length_histogram``).
    ``events``: bounded event records, the event table's public
    :class:`~sparkpriv.mechanisms.event_columns.EventColumns` (person and item
    column names, the item column's type, the declared vocabulary), for outputs
    that give events back (DPGM's synthetic event tables); None when unknown.
    """

    kind: str
    d: int
    columns: tuple = ()
    value_cap: float | None = None
    l2_bound: float | None = None
    integer_columns: tuple = ()
    classes: tuple = ()
    names: tuple = ()
    types: tuple = ()
    events: Any = None
    length_histogram: bool = False  # records with max_items='auto': the release measures items per person


@dataclass(frozen=True)
class SparseRows:
    """A block of sparse records (CSR): row ``i`` has ``values[offsets[i]:offsets[i+1]]`` at
    ``indices[...]`` of ``d`` columns."""

    offsets: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    d: int

    @property
    def n(self) -> int:
        return len(self.offsets) - 1


@dataclass(frozen=True)
class EventRows:
    """A block of people's raw events (an event table grouped by person, nothing bounded yet).

    Person ``r`` owns events ``offsets[r]:offsets[r+1]``; ``keys`` (int64) is each event's key: its
    index in a public key domain, or a 64-bit id of the key's values (private keys); ``values`` the
    ``(events, V)`` float64 matrix of the declared value columns (NaN for nulls); ``person_hash`` the
    public 64-bit hash of each person's key (the keyed choice of kept keys). ``dropped``: events of
    this block's people outside the key domain (owner diagnostics).
    """

    offsets: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    person_hash: np.ndarray
    dropped: int = 0

    @property
    def n(self) -> int:
        return len(self.offsets) - 1


@dataclass(frozen=True)
class TableRows:
    """A dense block with what ``engine.open`` was asked for beyond the matrix.

    ``X``: the ``(n, d)`` float64 matrix of the declared columns (with
    ``missing=True``, nulls are 0.0 and marked in ``missing``, the ``(n, d)``
    bool mask; a numpy input's NaN count as nulls). ``codes``: the class index
    of each row's label (``labels=(column, classes)``), int64; a null label or
    a value that is not a declared class is an InputError naming the column.
    """

    X: np.ndarray
    codes: np.ndarray | None = None
    missing: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.X.shape[0])


@dataclass
class Plan:
    """What :meth:`Mechanism.plan` returns: events, the accounted guarantee, public facts.

    ``state`` holds what :meth:`Mechanism.run` needs (calibrated noise, public
    matrices); ``secrets`` what must never leave the process (seeds, secret
    matrices): neither is ever written, logged or shown in ``repr``.
    ``parameters``: public parameters as the plan resolved them (defaults
    computed from the schema, e.g. ``k1 = 4 k2``), recorded in the receipt's
    and the ledger's parameters over the values given.
    """

    events: Any
    epsilon: float
    delta: float
    public: dict
    neighbors: Neighbors
    state: Any = field(default=None, repr=False)
    secrets: Any = field(default=None, repr=False)
    parameters: dict = field(default_factory=dict)  # public parameters as resolved (defaults filled in)

    def forget_secrets(self) -> None:
        self.secrets = None


@dataclass
class Outcome:
    """What :meth:`Mechanism.run` returns to the release path.

    ``columns``/``schema``: the released table as named columns (small
    aggregate outputs) or ``table``: an engine table already built (row-level
    outputs). ``public`` adds public facts learned while running (e.g. the
    released model). ``files``: public files published with the table.
    """

    table: Any = None
    model: Any = None
    public: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict)
    rows: Any = None


class Mechanism:
    """Base class of a mechanism (see the module docstring; docs/architecture.md).

    Class attributes: ``name`` (CLI and receipts), ``title`` (prose),
    ``summary`` (one line for ``--help``), ``Params``, ``neighbors``,
    ``refused_neighbors`` (relation name -> reason), ``row_level`` (one output
    row per input record), ``inputs`` (``"table"``, ``"records"``), ``engines``
    (``"local"``, ``"spark"``).
    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Params: ClassVar[type[Params]] = Params
    neighbors: ClassVar[tuple[Neighbors, ...]] = (REPLACE_ONE,)
    refused_neighbors: ClassVar[dict] = {}
    row_level: ClassVar[bool] = False
    inputs: ClassVar[tuple[str, ...]] = ("table",)
    engines: ClassVar[tuple[str, ...]] = ("local", "spark")
    # an empty input is refused on write (a data-dependent refusal: only where the number of
    # records is public, or the release is meaningless without rows); counts publish noisy zeros
    refuses_empty_input: ClassVar[bool] = True

    @classmethod
    def specs(cls) -> tuple[OptionSpec, ...]:
        """The options of this mechanism (neighbour choices from ``neighbors``)."""
        out = []
        for s in cls.Params.specs():
            if s.kind == "neighbors":
                s = dataclasses.replace(s, kind="str", choices=tuple(r.name for r in cls.neighbors))
            out.append(s)
        return tuple(out)

    def open_args(self, params: Params) -> dict:
        """The keyword arguments of ``engine.open`` for these parameters (public only).

        Default: the declared ``columns`` and the public ``fill``. A mechanism
        that needs more of the input (a label column decoded to class codes,
        the null mask, columns kept in a row-level output) says so here.
        """
        columns = params.input_columns() if hasattr(params, "input_columns") else getattr(params, "columns", None)
        return {"columns": columns, "fill": missing_value_fill(params)}

    def plan(self, params: Params, facts: InputFacts, caller: str) -> Plan:  # pragma: no cover
        raise NotImplementedError

    def run(self, engine, source, plan: Plan, progress: Callable[..., None]) -> Outcome:  # pragma: no cover
        raise NotImplementedError

    def check_input(self, params: Params, facts: InputFacts, caller: str) -> None:
        """Refuse an input kind the mechanism does not take (public schema only)."""
        if facts.kind not in self.inputs:
            raise ParameterError(f"{caller} does not take {facts.kind} input; it takes: "
                                 f"{', '.join(self.inputs)}.")


def missing_value_fill(params: Params):
    """The public replacement of nulls, NaN and infinities in a table's declared columns.

    The declared ``fill`` when there is one; otherwise the centre of the declared
    per-column box ``[lower, upper]`` (one value, or one per column) when both ends
    are declared; otherwise 0.0 (the centre of a norm ball). The same rule for every
    record, decided by public parameters only: no value of the data makes a release
    fail or changes what it costs (docs/privacy.md, "Failures"). Clipping then
    applies as to any other value.
    """
    fill = getattr(params, "fill", None)
    if isinstance(fill, (int, float)) and not isinstance(fill, bool):
        return float(fill)
    lo, hi = getattr(params, "lower", None), getattr(params, "upper", None)
    if lo is not None and hi is not None:
        try:
            c = (np.asarray(lo, dtype=np.float64) + np.asarray(hi, dtype=np.float64)) / 2.0
        except (TypeError, ValueError):
            return None
        if np.all(np.isfinite(c)):
            return float(c.reshape(-1)[0]) if c.size == 1 else tuple(float(v) for v in np.ravel(c))
    return None


class Progress:
    """What a running mechanism reports: log lines, and steps (``what i/n``) with the spend.

    The release path gives one to :meth:`Mechanism.run`; ``caller`` names the
    public entry point for error messages. Steps are logged one line each and
    passed to ``on_step`` (a progress bar, when the caller draws one).
    """

    def __init__(self, caller: str, logger, on_step: Callable[..., None] | None = None,
                 spent: str = ""):
        self.caller = caller
        self._log = logger
        self._on_step = on_step
        self.spent = spent

    def log(self, fmt: str, *args) -> None:
        self._log.info(fmt, *args)

    def warn(self, fmt: str, *args) -> None:
        self._log.warning(fmt, *args)

    def step(self, what: str, i: int, n: int, message: str = "") -> None:
        self._log.info("%s %d/%d: %s%s", what, i, n, message, f" ({self.spent})" if self.spent else "")
        if self._on_step is not None:
            self._on_step(what, i, n, message)


_REGISTRY: dict[str, Mechanism] = {}


def register(mechanism: Mechanism) -> Mechanism:
    """Register a mechanism (its module calls this at import)."""
    _REGISTRY[mechanism.name] = mechanism
    return mechanism


def registered() -> dict[str, Mechanism]:
    """Every registered mechanism, by name (imports the built-in ones)."""
    import sparkpriv.mechanisms.dpgm  # noqa: F401  (registers itself)
    import sparkpriv.mechanisms.dprp  # noqa: F401  (registers itself)
    import sparkpriv.mechanisms.counts  # noqa: F401  (registers itself)
    import sparkpriv.mechanisms.aggregates  # noqa: F401  (registers itself)
    import sparkpriv.mechanisms.kmeans  # noqa: F401  (registers itself)
    import sparkpriv.mechanisms.regression  # noqa: F401  (registers itself)
    import sparkpriv.mechanisms.projection  # noqa: F401  (registers itself)
    import sparkpriv.mechanisms.synthetic  # noqa: F401  (registers itself)

    return dict(_REGISTRY)


def get_mechanism(name: str) -> Mechanism:
    regs = registered()
    if name not in regs:
        raise ParameterError(f"Unknown mechanism {name!r}; available: {', '.join(sorted(regs))}.")
    return regs[name]
