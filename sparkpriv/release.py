"""The one release path, the release object every mechanism returns, and its budget handling.

Flow of every release (docs/architecture.md): read -> validate and bound ->
mechanism -> account -> write. :func:`release` is that flow, written once for
every mechanism of the protocol (:mod:`sparkpriv.mechanisms.protocol`) and both
engines: it validates the parameters (unknown names and constraints), resolves
the neighbour relation, opens the input on the engine (schema only), lets the
mechanism plan (secrets drawn, noise calibrated, events known), and calls
:func:`reserve` *before any data is read*: the ledger (when a table id is
given) refuses a release that would exceed the table's budget at that point.
It then runs the mechanism on the engine and returns a :class:`Release`
holding the private table; its :meth:`Release.write` publishes the table and
receipt atomically and commits the reservation. A run that fails after the
reservation keeps it as spent (whether a run fails may depend on one record),
and so does a release that is abandoned; a failed publish leaves it reserved
(counted) so the release can be written again.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import platform
from dataclasses import dataclass, field
from typing import Any, Callable

from sparkpriv import __version__
from sparkpriv.errors import InputError
from sparkpriv.privacy.accounting import describe_event, epsilon_of, event_to_dict
from sparkpriv.privacy.random import active_fixed_seed
from sparkpriv.receipt_form import (DETAILS_FILE, public_ledger, public_path, public_source, split_long_lists,
                                     summary_of)

__all__ = ["Release", "BudgetHold", "reserve", "release", "choose_engine", "RECEIPT_FORMAT"]

RECEIPT_FORMAT = "sparkpriv.receipt/1"
NO_GUARANTEE = (
    "NONE. The secrets and noise of this release were derived from a fixed seed set in code "
    "(sparkpriv.privacy.random.insecure_fixed_seed, for tests only): anyone who knows or guesses "
    "the seed can recompute the noise and remove it. epsilon and delta here describe the noise "
    "calibration only; they are no privacy guarantee, and no budget ledger recorded this release."
)
_log = logging.getLogger(__name__)
# the share of people (or events) cut by the contribution bounds above which the owner is warned
TRUNCATION_WARNING_SHARE = 0.05


@dataclass
class BudgetHold:
    """A ledger reservation held by a release (or nothing when no ledger is used)."""

    ledger: Any = None
    reservation: Any = None
    table_id: str | None = None
    owns_ledger: bool = False
    fixed_seed: bool = False  # reserved inside insecure_fixed_seed: NOT private, never in a ledger

    def to_public_dict(self) -> dict | None:
        if self.reservation is None:
            return None
        r = self.reservation
        return {
            "table_id": r.table_id,
            "entry_id": r.id,
            "ledger": getattr(self.ledger, "public_url", None),
            "budget": {"epsilon": r.budget_epsilon, "delta": r.budget_delta},
            "spent_before": r.epsilon_spent_before,
            "spent_after": r.epsilon_spent_after,
            "chain_head": getattr(r, "chain_head", None),  # pins the ledger's journal (`ledger verify --pin`)
        }

    def commit(self, output_path: str, summary: dict) -> None:
        if self.reservation is not None:
            self.ledger.commit(self.reservation.id, output_path=output_path, receipt_summary=summary)
            _log.info("ledger: committed entry %s for table %s", self.reservation.id, self.table_id)

    def spend_failed(self, reason: str) -> None:
        """Keep the reservation as spent: the release failed after its budget was reserved.

        Whether a run fails may depend on what one record holds, so a failure
        after the reservation costs what was reserved (docs/privacy.md,
        "Failures"). The entry is committed with no output and the failure in
        its summary (the error's type only: no value of the data).
        """
        if self.reservation is not None:
            r = self.reservation
            try:
                self.ledger.commit(r.id, output_path=None,
                                   receipt_summary={"failed": reason[:500], "published": False,
                                                    "epsilon": r.epsilon_requested})
                _log.warning("ledger: entry %s on table %s keeps its spend (epsilon %.6g at the budget's delta): "
                             "the release failed after its budget was reserved (%s), and whether a release "
                             "fails may depend on the data, so a failure is charged like a release",
                             r.id, self.table_id, r.epsilon_requested, reason[:200])
            except Exception:  # never hide the original failure; the entry stays reserved (counted)
                _log.exception("ledger: could not record the failed release %s; it stays reserved (counted)", r.id)
            self.reservation = None

    def abort(self, reason: str) -> None:
        """Release the reservation (not counted): only before anything was computed from the data."""
        if self.reservation is not None:
            try:
                self.ledger.abort(self.reservation.id, reason=reason[:500])
                _log.info("ledger: released reservation %s (%s)", self.reservation.id, reason[:200])
            except Exception:  # never hide the original failure
                _log.exception("ledger: could not release reservation %s", self.reservation.id)
            self.reservation = None

    def close(self) -> None:
        if self.owns_ledger and self.ledger is not None:
            self.ledger.close()


def reserve(
    *,
    event,
    mechanism: str,
    parameters: dict,
    ledger=None,
    table_id: str | None = None,
    output_path: str = "",
) -> BudgetHold:
    """Reserve ``event`` on ``table_id`` in ``ledger`` (a URL or a Ledger), before reading data.

    Without a ``table_id`` nothing is reserved and a warning says so: the
    release is then not protected by any cross-run budget.

    Inside :class:`sparkpriv.privacy.random.insecure_fixed_seed` (tests only)
    the release has no privacy guarantee, so it is never recorded as a spend:
    a ``table_id`` or ``ledger`` is refused with :class:`ParameterError`
    before the ledger is opened.
    """
    fixed = active_fixed_seed() is not None
    if fixed and (table_id is not None or ledger is not None):
        from sparkpriv.errors import ParameterError

        raise ParameterError(
            f"This {mechanism} release is made inside sparkpriv.privacy.random.insecure_fixed_seed: its "
            "secrets and noise come from a fixed seed, so it has NO privacy guarantee and a budget "
            "ledger must not record it as a spend. Drop table_id and ledger (--table-id, --ledger), or "
            "make the release outside the fixed-seed block."
        )
    if fixed:
        _log.error("this %s release uses a fixed seed (insecure_fixed_seed): NOT private, not recorded "
                   "in any budget ledger", mechanism)
        return BudgetHold(fixed_seed=True)
    if table_id is None:
        if ledger is not None:
            from sparkpriv.errors import ParameterError

            raise ParameterError("A ledger was given without a table id: pass table_id (--table-id) too.")
        _log.warning("no table id given: this %s release is not recorded in any budget ledger", mechanism)
        return BudgetHold()
    from sparkpriv.ledger import Ledger, open_ledger

    owns = not isinstance(ledger, Ledger)
    led = open_ledger(ledger) if owns else ledger
    try:
        res = led.reserve(table_id, event=event, mechanism=mechanism, parameters=parameters,
                          output_path=output_path)
    except BaseException:
        if owns:
            led.close()
        raise
    _log.info(
        "ledger: reserved this release's events on table %s: epsilon %.6g at the budget's delta %.3g "
        "(the ledger states every spend at the budget's delta; the receipt states the release at its "
        "own); table spent %.6g -> %.6g of %.6g",
        table_id, res.epsilon_requested, res.budget_delta, res.epsilon_spent_before,
        res.epsilon_spent_after, res.budget_epsilon,
    )
    return BudgetHold(ledger=led, reservation=res, table_id=table_id, owns_ledger=owns)


@dataclass
class Release:
    """A private release, the same type for every mechanism and engine.

    Attributes
    ----------
    df : pyspark.sql.DataFrame or pyarrow.Table
        The private table: a lazy Spark DataFrame on the Spark engine (every
        evaluation gives the same values, since the noise comes from keyed
        per-partition streams), a pyarrow Table on the local engine.
    mechanism : str
        The registered mechanism's name.
    event : dp_accounting.DpEvent
        What was spent (also as ``events``).
    epsilon, delta : float
        The guarantee computed from ``event`` by dp_accounting.
    model : object or None
        The released model, for mechanisms that fit one (k-means: a
        :class:`~sparkpriv.mechanisms.kmeans_model.KMeansModel`).
    public : dict
        Every public fact of the release (what the receipt's
        ``mechanism_details`` holds).
    extras : dict
        Mechanism-specific public by-products (k-means: ``iteration_seconds``,
        the raw noisy sizes ``history``, which are owner diagnostics).
    engine : str
        ``"spark"`` or ``"local"``.
    """

    df: Any
    mechanism: str
    event: Any
    epsilon: float
    delta: float
    public: dict
    input_info: dict
    hold: BudgetHold = field(default_factory=BudgetHold)
    diagnostics: Callable[[], dict] | None = None
    source_df: Any = None
    rows: Any = None
    written_to: str | None = None
    model: Any = None
    files: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict)
    engine: str = "spark"
    # where the release's long pass runs when it is written (row-level releases on Spark: the
    # output's job, with the event bounding for event records): (what, report) or None
    write_progress: tuple | None = field(default=None, repr=False)
    _warned: set = field(default_factory=set, repr=False)

    @property
    def events(self):
        return self.event

    @property
    def table(self):
        """The private table (the same object as ``df``)."""
        return self.df

    def uncertainty(self) -> dict:
        """The noise this release added, in the units of its outputs (public; also in the receipt,
        ``mechanism_details.uncertainty``). What each mechanism states (docs/outputs.md, "Uncertainty"):

        * k-means: ``count_std`` (std of each noisy cluster size), ``sum_std``,
          ``center_std`` (k x d, first-order std of each centre coordinate) and
          how to read 95% intervals (docs/kmeans.md).
        * counts: ``std``, ``half_width`` and ``coverage_exact`` of each key's
          interval, the same for every key (docs/counts.md).
        * regression: the coefficients' standard errors and confidence
          intervals (``coefficient_stderr``, ``confidence_intervals``,
          ``sketch_entry_std``; docs/regression.md).
        * projection: ``value_std`` of every released value and how squared
          distances are recovered; :meth:`squared_distances` gives them with
          their std and intervals (docs/math.md section 2).
        * DPRP: ``value_std``, the std of the noise in each released column
          (per class with public labels) in the column's units, and the std of
          DP fill values (docs/dprp.md, "Uncertainty").
        * DPGM: ``cluster_size_std`` and how the spread of counting queries over
          repeated syntheses is obtained (``model.query_spread``; docs/research/dpgm.md).
        """
        u = self.public.get("uncertainty")
        if u is None:
            from sparkpriv.errors import ParameterError

            raise ParameterError(f"The {self.mechanism} release does not state its uncertainty yet; "
                                 "its receipt's mechanism_details give the noise scale.")
        return u

    def squared_distances(self, Zi, Zj, confidence: float = 0.95):
        """Squared distances between released rows of a projection, with their uncertainty.

        ``Zi``, ``Zj``: released rows (``k`` values each; shape ``(k,)`` or
        ``(pairs, k)``, e.g. from :meth:`to_numpy`) of THIS release. Returns a
        :class:`~sparkpriv.mechanisms.projection.SqDistances`: ``estimate``
        (unbiased for the squared distance of the two clipped input rows),
        ``std``, and the ``confidence`` interval ``low``..``high``, over the draw
        of the secret matrix and the noise (docs/math.md section 2). Post-processing:
        no budget. Other mechanisms raise :class:`ParameterError`.
        """
        from sparkpriv.errors import ParameterError

        if self.mechanism != "projection":
            raise ParameterError(f"squared_distances applies to projection releases; this is a "
                                 f"{self.mechanism} release.")
        from sparkpriv.mechanisms.projection import sq_distance_intervals

        Zi, Zj = _as_rows(Zi), _as_rows(Zj)
        k = int(self.public["k"])
        for z in (Zi, Zj):
            if z.shape[-1] != k:
                raise ParameterError(f"squared_distances: a released row of this projection has k = {k} "
                                     f"values (z0..z{k - 1}); got {z.shape[-1]}.")
        return sq_distance_intervals(Zi, Zj, noise_variance=self.public["noise_variance_per_entry"],
                                     noise_kind=self.public["noise_kind"], confidence=confidence)

    def __getattr__(self, name):  # mechanism extras as attributes (release.iteration_seconds)
        extras = self.__dict__.get("extras") or {}
        if name in extras:
            return extras[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def receipt(self, output_path: str | None = None) -> dict:
        """The privacy receipt (JSON-ready dict). It never holds secrets or data statistics."""
        # fixed when the secrets were drawn (reserve) or now: either way, no guarantee
        test_seed = self.hold.fixed_seed or active_fixed_seed() is not None
        shown, local = public_path(output_path)
        r = {
            "format": RECEIPT_FORMAT,
            "summary": "",
            "mechanism": self.mechanism,
            "library": {"name": "sparkpriv", "version": __version__, "python": platform.python_version()},
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "guarantee": {
                "holds": not test_seed,
                "epsilon": self.epsilon,
                "delta": self.delta,
                "neighbors": self.public.get("neighbors"),
                "protects": self.public.get("protects"),
                "accountant": "dp_accounting PLD (pure epsilon summed exactly when delta = 0)",
                "conditional_on_secrets": "holds for every draw of the secret matrices (sensitivity "
                "computed from the realized matrices)",
            },
            "events": event_to_dict(self.event),
            "events_summary": describe_event(self.event),
            "mechanism_details": self.public,
            "input": dict(self.input_info, source=public_source(self.input_info.get("source")))
            if "source" in self.input_info else self.input_info,
            "output": {
                "path": shown,
                **({"local": True} if local else {}),
                "schema": _schema_of(self.df),
            },
            "ledger": _public_ledger_info(self.hold.to_public_dict()),
            "insecure_test_seed": test_seed,
        }
        if test_seed:
            r["guarantee"]["statement"] = NO_GUARANTEE
            r["WARNING"] = "made with a fixed test seed (insecure_fixed_seed): NOT PRIVATE, no privacy guarantee"
        r["summary"] = summary_of(r)
        return r

    def _receipt_and_files(self, output_path: str) -> tuple[dict, dict[str, bytes]]:
        """The receipt as published (long lists in its side file) and the files published with it."""
        main, details = split_long_lists(self.receipt(output_path))
        files = self.extra_files()
        if details is not None:
            files[DETAILS_FILE] = json.dumps(details, sort_keys=True).encode()
        return main, files

    def write(self, path: str, *, overwrite: bool = False, owner_report: str | None = None,
              writer: str = "auto") -> str:
        """Publish the private table and its receipt to ``path`` atomically.

        ``writer``: who writes the part files, ``"auto"`` (default), ``"spark"``
        or ``"arrow"`` (the Python tasks, for row-level releases to local
        paths; :mod:`sparkpriv.io.writer`). Commits the ledger reservation on
        success; a failed publish keeps it (counted as spent: the table was
        computed from the data), and the release may be written again to
        another path. Returns the fully qualified output
        path. An empty input raises :class:`InputError` and publishes nothing
        (Spark's writer checks the input first; the Arrow writer checks it
        only when its tasks wrote no rows, saving a Spark job).
        """
        publish = self._publish_local if self.engine == "local" else self._publish_spark
        # A failed publish keeps the reservation (counted, shown as unfinished): the private table
        # was computed from the data (in memory, or lazily by this very write), so its spend
        # cannot be given back. The same release may be written again (another path); abandon()
        # records it as spent without an output.
        out = publish(path, overwrite, writer)
        self.hold.commit(out, {"epsilon": self.epsilon, "delta": self.delta})
        self.hold.close()
        self.written_to = out
        self._owner_report(out, owner_report)
        return out

    def _publish_spark(self, path: str, overwrite: bool, writer: str) -> str:
        from sparkpriv.io.writer import check_output_path, choose_writer, publish

        def refuse_empty_input():
            if self.source_df is not None and self.source_df.limit(1).count() == 0:
                raise InputError("The input table is empty: there is nothing to release.")

        path_q = check_output_path(self.df.sparkSession, path, overwrite)
        how = choose_writer(self.df.sparkSession, path_q, self.rows, writer)
        if how != "arrow":
            refuse_empty_input()
        # the Arrow writer's tasks report their row counts: the input is only
        # looked at (one more Spark job) when the release came out with no rows
        watch = contextlib.nullcontext()
        if self.write_progress is not None:
            from sparkpriv.spark.progress import TaskProgress

            watch = TaskProgress(self.df.sparkSession, *self.write_progress)
        with watch:
            receipt, files = self._receipt_and_files(path_q)
            return publish(self.df, path, receipt=receipt, overwrite=overwrite, rows=self.rows,
                           writer=how, extra_files=files, if_no_rows=refuse_empty_input)

    def _publish_local(self, path: str, overwrite: bool, writer: str) -> str:
        from sparkpriv.io.local_writer import publish_local

        if writer not in ("auto", "arrow"):
            from sparkpriv.errors import ParameterError

            raise ParameterError(f"An in-memory release is written by this process (pyarrow); "
                                 f"writer={writer!r} does not apply. Leave writer out.")
        return publish_local(self.df, path, receipt_for=self._receipt_and_files, overwrite=overwrite)

    def extra_files(self) -> dict[str, bytes]:
        """Public files published with the table (name -> bytes), inside the same atomic step."""
        return dict(self.files)

    def to_numpy(self, columns=None):
        """The released table's ``columns`` (default: all) as a float64 array ``(rows, len(columns))``.

        On the local engine the Arrow columns are copied; on the Spark engine
        the private table is computed and collected to the driver (for small
        releases; the same values every time, the noise being keyed). A
        projection of a numpy array has only its ``z`` columns, so
        ``rel.to_numpy()`` is the released matrix.
        """
        import numpy as np

        if self.engine == "local":
            cols = list(columns) if columns is not None else list(self.df.column_names)
            return np.column_stack([np.asarray(self.df.column(c).to_numpy(), dtype=np.float64) for c in cols]) \
                if cols else np.zeros((self.df.num_rows, 0))
        cols = list(columns) if columns is not None else list(self.df.columns)
        return self.df.select(*cols).toPandas().to_numpy(dtype=np.float64)

    def abandon(self, reason: str = "abandoned by the caller") -> None:
        """Record a release that will not be written: its reservation stays SPENT.

        The private table (and model) were computed from the data and are in
        the caller's hands, so not publishing them gives nothing back: the
        ledger entry is committed with no output and ``reason`` (docs/privacy.md,
        "Failures").
        """
        self.hold.spend_failed(f"not published: {reason}")
        self.hold.close()

    def owner_warnings(self) -> list[str]:
        """Warnings for the data owner (logged once, written to the owner report; never in the receipt).

        Bounded event records: more than :data:`TRUNCATION_WARNING_SHARE` of the
        people lost items to the cap ``L``, or of the events to the cap ``c``; the
        released values (and their intervals) are then those of the bounded
        contributions, well below the raw totals. Replaced missing values.
        Empty until the data was read (a lazy Spark table: after it is written).
        """
        diag = self.diagnostics() if self.diagnostics else {}
        out = []
        cap, what, caps = _CAP_NAMES.get(self.mechanism, _CAP_NAMES[None])
        people, cut = diag.get("people", 0), diag.get("people_truncated", 0)
        if people and cut / people > TRUNCATION_WARNING_SHARE:
            out.append(f"{cut} of {people} people ({cut / people:.0%}) had more than {cap} {what} and lost the "
                       "rest: the released values and their intervals are those of the bounded contributions, "
                       f"below the raw totals; raise {cap} (or use {cap}='auto') if that is not meant")
        events = diag.get("events", 0)
        capped = diag.get("events_capped", 0) + diag.get("events_dropped", 0) + diag.get("events_beyond_cap", 0)
        if events and capped / events > TRUNCATION_WARNING_SHARE:
            out.append(f"{capped} of {events} events ({capped / events:.0%}) were cut by the contribution bounds "
                       f"({caps})")
        if diag.get("missing_values_replaced"):
            out.append(f"{diag['missing_values_replaced']} null, NaN or infinite values were replaced by the "
                       "public fill (the receipt's input.missing_values states the rule)")
        return out

    def warn_owner(self) -> None:
        """Log :meth:`owner_warnings` once (WARNING level; the log is the owner's, not the release's)."""
        for w in self.owner_warnings():
            if w not in self._warned:
                _log.warning("owner warning (not part of the release): %s", w)
                self._warned.add(w)

    def _owner_report(self, out: str, owner_report: str | None) -> None:
        diag = self.diagnostics() if self.diagnostics else {}
        if diag:
            _log.info("owner diagnostics (not part of the release): %s", json.dumps(diag, sort_keys=True))
        self.warn_owner()
        if owner_report:
            doc = {"output": out, "mechanism": self.mechanism, "diagnostics": diag,
                   "warnings": self.owner_warnings(),
                   "note": "data-owner diagnostics; NOT private, never publish with the release"}
            with open(owner_report, "w") as f:
                json.dump(doc, f, indent=2, sort_keys=True)


def _public_ledger_info(info: dict | None) -> dict | None:
    if isinstance(info, dict) and info.get("ledger"):
        info = dict(info, ledger=public_ledger(info["ledger"]))
    return info


def _as_rows(Z):
    import numpy as np

    return np.asarray(Z, dtype=np.float64)


def guarantee(event, delta: float) -> float:
    return epsilon_of(event, delta)


def _schema_of(table) -> list[dict]:
    fields = getattr(getattr(table, "schema", None), "fields", None)
    if fields is not None:  # Spark
        return [{"name": f.name, "type": f.dataType.simpleString()} for f in fields]
    return [{"name": f.name, "type": str(f.type)} for f in table.schema]  # Arrow


# ----------------------------------------------------------------------------- the one release path


# the contribution caps of event releases, as the owner warnings name them: (per-person cap, what it
# counts, the caps that cut events)
_CAP_NAMES = {None: ("max_items", "items", "max_items, max_events_per_item"),
              "aggregates": ("max_keys", "keys", "max_keys, max_events_per_key")}


def choose_engine(data, mechanism, caller: str):
    """The engine for ``data``: Spark for DataFrames and event records, local for in-memory data."""
    from sparkpriv.errors import ParameterError
    from sparkpriv.local import engine as local

    if local.accepts(data):
        engine = local.LocalEngine()
    else:
        from sparkpriv.spark import engine as spark

        if not spark.accepts(data):
            raise ParameterError(
                f"{caller} takes a Spark DataFrame, bounded event records, a numpy array, or a "
                f"pandas/Arrow table. Got {type(data).__name__}."
            )
        engine = spark.SparkEngine()
    if engine.name not in mechanism.engines:
        raise ParameterError(f"{caller} runs on {', '.join(mechanism.engines)} only; the input is for "
                             f"the {engine.name} engine.")
    return engine


def _write_progress(watched: bool, outcome, src, progress) -> tuple | None:
    """A row-level release's pass runs when it is written: report it there (Spark engine)."""
    if not watched or outcome.rows is None:
        return None
    kind = getattr(src, "kind", "table")
    return ("event bounding and write" if kind == "records" else "write", progress.step)


def _plan_auto(mech, p, src, auto, caller):
    """The plan of a release whose contribution bound is ``auto`` (reads no data).

    The mechanism is planned with ``(1 - share) epsilon`` at the largest bound
    that may be chosen (its events do not depend on the bound:
    :mod:`sparkpriv.mechanisms.auto_bound`), and its events are composed with the
    Laplace histogram's, so the ledger reserves the whole spend before any data
    is read.
    """
    import dataclasses

    from sparkpriv.mechanisms.auto_bound import EPSILON_MARGIN, discount_event, histogram_noise_for
    from sparkpriv.privacy.accounting import compose
    from sparkpriv.privacy.calibration import split_epsilon
    from sparkpriv.privacy.random import new_secret_seed

    share = getattr(mech, "auto_share", None)
    share = float(share(p)) if share is not None else auto.share  # a release that also uses the histogram
    eps_q, eps_rest = split_epsilon(p.epsilon, share)
    p_rest = dataclasses.replace(p, epsilon=eps_rest * (1.0 - EPSILON_MARGIN))
    src.set_max_items(auto.limit)
    inner = mech.plan(p_rest, src.facts, caller)
    reserved = discount_event(inner.events)  # a hair more than the limit's plan spends (auto_bound)
    qnoise = histogram_noise_for(epsilon=eps_q, neighbors=inner.neighbors.name, limit=auto.limit)
    events = compose([qnoise.dp_event(), reserved])
    plan = dataclasses.replace(inner, events=events, epsilon=epsilon_of(events, inner.delta))
    own_rule = auto.quantile is None and getattr(mech, "choose_max_items", None) is not None
    how = {**auto.to_public_dict(mech.max_items_rule if own_rule else None, resolved=True),
           "epsilon_share": share}
    return plan, {"p": p_rest, "auto": auto, "noise": qnoise, "epsilon": eps_q, "inner_events": reserved, "share": share,
                  "how": how, "seed": new_secret_seed("contribution-bound-histogram")}


def _auto_parameters(parameters: dict, how: dict) -> dict:
    """The declared ``max_items='auto'`` as the release will do it (known before the data is read): the
    rule that chooses ``L`` (no quantile when the mechanism's own rule does) and the share of epsilon
    spent on the histogram, in place of the input's generic description."""
    cb = parameters.get("contribution_bound")
    if not isinstance(cb, dict):
        return parameters
    rest = {k: v for k, v in cb.items() if k not in how and k not in ("max_items", "method", "quantile")}
    return {**parameters, "contribution_bound": {"max_items": "auto", **how, **rest}}


def _resolve_auto(mech, eng, src, plan, st, progress, caller):
    """One pass: the noisy histogram of items per person, ``L`` chosen, the mechanism planned at it."""
    import dataclasses

    import numpy as np

    from sparkpriv.mechanisms.auto_bound import choose_max_items, dominates, items_histogram_fn
    from sparkpriv.privacy import noise as _noise
    from sparkpriv.privacy.random import stream

    auto, qnoise = st["auto"], st["noise"]
    src.set_max_items(auto.limit)
    from sparkpriv.mechanisms.auto_bound import length_edges

    hist = eng.aggregate(src, items_histogram_fn(auto.limit), int(length_edges(auto.limit).size), count=False)
    clamp = qnoise.max_abs_value  # a public range: never increases the sensitivity
    noisy = _noise.add_noise(np.clip(np.asarray(hist, dtype=np.float64), -clamp, clamp), qnoise,
                             stream(st["seed"], 0))
    rule = getattr(mech, "choose_max_items", None) if auto.quantile is None else None
    if rule is not None:  # the mechanism's own rule: post-processing of the histogram and public facts
        L = int(rule(st["p"], src.facts, noisy, float(qnoise.std), int(auto.limit), caller))
    else:
        L = choose_max_items(noisy, auto.effective_quantile, auto.limit)
    src.length_histogram = (noisy, float(qnoise.std), int(auto.limit))  # public (DP): a mechanism may use it (synthetic)
    src.set_max_items(L)
    chosen = mech.plan(st["p"], src.facts, caller)
    if not dominates(chosen.events, st["inner_events"]):  # pragma: no cover - tested for every mechanism
        raise RuntimeError(f"{caller}: the release at the chosen contribution bound would spend more than "
                           "was reserved")
    how = ("the mechanism's error estimate" if rule is not None else
           f"a DP quantile ({auto.effective_quantile:g} of the people)")
    progress.log("contribution bound: max_items %d chosen by %s on a DP histogram of the record lengths, "
                 "epsilon %.4g", L, how, st["epsilon"])
    public = dict(chosen.public, contribution_bound_estimation={
        **st["how"], "epsilon": st["epsilon"], "histogram_noise": qnoise.to_public_dict(),
        "chosen_max_items": int(L)})
    return dataclasses.replace(chosen, events=plan.events, epsilon=plan.epsilon, public=public)


def release(mechanism, data, *, ledger=None, table_id: str | None = None, source: str | None = None,
            engine=None, caller: str | None = None, on_step=None, **params) -> Release:
    """Release ``data`` with a registered ``mechanism`` (its name or object): the one path.

    ``params`` are the mechanism's parameters (its ``Params`` class; unknown
    names are refused). ``ledger``/``table_id``: the budget reservation made
    before any data is read. ``source`` names the input in the receipt.
    ``engine``: default from the data (:func:`choose_engine`). ``on_step``:
    ``(what, i, n, message)`` called on each long step (a progress bar).
    """
    from sparkpriv.mechanisms.protocol import Progress, get_mechanism, resolve_neighbors

    mech = get_mechanism(mechanism) if isinstance(mechanism, str) else mechanism
    caller = caller or f"release_{mech.name}"
    p = mech.Params.from_mapping(params, caller)
    if hasattr(p, "neighbors"):
        resolve_neighbors(p.neighbors, mech, caller)
    p.validate(caller)
    eng = engine if engine is not None else choose_engine(data, mech, caller)
    src = eng.open(data, caller=caller, **mech.open_args(p))
    mech.check_input(p, src.facts, caller)
    auto = getattr(src, "auto_cap", None)  # max_items='auto': L chosen by a DP quantile, accounted here
    if auto is not None:
        plan, auto_state = _plan_auto(mech, p, src, auto, caller)
    else:
        plan, auto_state = mech.plan(p, src.facts, caller), None
    declared = p.public_dict()  # a parameter left None (columns of a numpy array) takes the input's value
    parameters = {**src.public_params(), **{k: v for k, v in declared.items() if v is not None or k not in
                                            src.public_params()},
                  "bounds": plan.public.get("bounds"), **plan.parameters}
    if auto_state is not None:
        parameters = _auto_parameters(parameters, auto_state["how"])
    hold = reserve(event=plan.events, mechanism=mech.name, parameters=parameters, ledger=ledger,
                   table_id=table_id)
    progress = Progress(caller, logging.getLogger(f"sparkpriv.{mech.name}"), on_step,
                        spent=f"release epsilon {plan.epsilon:.6g}, delta {plan.delta:.3g}")
    watched = hasattr(eng, "watch")  # an engine that reports its long passes (the Spark engine)
    if watched:
        eng.progress = progress.step
    try:
        if auto_state is not None:
            plan = _resolve_auto(mech, eng, src, plan, auto_state, progress, caller)
        outcome = mech.run(eng, src, plan, progress)
    except BaseException as exc:
        # the run read the data: whether it fails may depend on one record, so the failure is
        # charged (docs/privacy.md, "Failures")
        hold.spend_failed(f"{mech.name} failed: {type(exc).__name__}")
        hold.close()
        raise
    finally:
        plan.forget_secrets()
        if watched:
            eng.progress = None
    public = dict(plan.public, parameters=parameters, **outcome.public)
    public.setdefault("neighbors", plan.neighbors.name)
    public.setdefault("protects", plan.neighbors.protects)
    owner = outcome.extras.pop("diagnostics", {})
    rel = Release(df=outcome.table, mechanism=mech.name, event=plan.events, epsilon=plan.epsilon,
                   delta=plan.delta, public=public, input_info=src.input_info(source), hold=hold,
                   diagnostics=lambda: {**src.diagnostics(), **(owner() if callable(owner) else owner)},
                   source_df=src.source_df if mech.refuses_empty_input else None,
                   rows=outcome.rows, model=outcome.model, files=outcome.files, extras=outcome.extras,
                   engine=eng.name, write_progress=_write_progress(watched, outcome, src, progress))
    rel.warn_owner()  # what the run already counted (aggregates); lazy tables warn when written
    return rel
