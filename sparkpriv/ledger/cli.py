"""The ``sparkpriv ledger ...`` commands and ``sparkpriv receipt verify``.

Thin: parse, call :mod:`sparkpriv.ledger`, print, return an exit code. Wire it
into the main parser with::

    ledger = subparsers.add_parser("ledger", help="privacy-budget ledger")
    add_ledger_subparsers(ledger.add_subparsers(dest="ledger_command", required=True))
    receipt = subparsers.add_parser("receipt", help="privacy receipts")
    add_receipt_subparsers(receipt.add_subparsers(dest="receipt_command", required=True))
    args = parser.parse_args(argv)
    return args._handler(args)          # also available as args.func

Each handler catches :class:`~sparkpriv.errors.SparkPrivError`, prints its
message on stderr and returns its ``exit_code`` (a refused release is 3).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, TextIO

from sparkpriv.errors import EXIT_FAILURE, EXIT_OK, ParameterError, SparkPrivError
from sparkpriv.ledger import DEFAULT_LEDGER_ENV, DEFAULT_LEDGER_URL, KEY_FILE_ENV, TableStatus, UnitStatus, open_ledger
from sparkpriv.ledger.base import _printable
from sparkpriv.ledger.history import describe

__all__ = ["add_ledger_subparsers", "add_receipt_subparsers", "cmd_abort", "cmd_history", "cmd_report",
           "cmd_set_budget", "cmd_show", "cmd_upgrade", "cmd_verify", "cmd_receipt_show", "cmd_receipt_verify",
           "format_status", "format_report"]

_WINDOW_HELP = ("lifetime (every spend ever; the default for a new budget), Nd such as 30d (any N consecutive "
                "days) or month (any calendar month, UTC); default: keep the current window")


def add_ledger_subparsers(commands) -> None:
    """Add the ``ledger`` commands to ``commands``, the sub-commands of ``ledger``.

    ``commands`` is what ``add_subparsers()`` of the ``ledger`` parser
    returned. Each leaf sets ``_handler`` (and ``func``) to a handler
    ``handler(args) -> int``.
    """
    p = commands.add_parser(
        "set-budget",
        help="create or change a table's or a privacy unit's budget",
        description="Create or change the (epsilon, delta) budget of a table (--table-id), or of a privacy unit "
        "(--unit with --tables): one budget over every table whose id matches the patterns, which hold the same "
        "people. --window composes the spends in any N days or calendar month instead of over the lifetime. A "
        "budget below what is already spent is accepted, but then every further release it covers is refused. "
        "Every change is journalled with who made it, when and --reason.",
    )
    _add_ledger_option(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--table-id", help="logical table id, e.g. cdr.daily_towers")
    which.add_argument("--unit", help="privacy unit name, e.g. subscribers")
    p.add_argument("--tables", metavar="PATTERNS", help="with --unit: comma-separated table ids or glob patterns it "
                   "covers, e.g. 'cdr.*,billing.*' (required when the unit is created; default: keep them)")
    p.add_argument("--epsilon", required=True, type=float, help="total epsilon of the budget (> 0), per window")
    p.add_argument("--delta", required=True, type=float, help="delta at which spends are composed, in [0, 1)")
    p.add_argument("--window", help=_WINDOW_HELP)
    p.add_argument("--reason", help="why the budget is set or changed (recorded in the journal)")
    _add_job_option(p)
    p.add_argument("--json", action="store_true", help="print the budget's status as JSON")
    p.set_defaults(_handler=cmd_set_budget, func=cmd_set_budget)

    s = commands.add_parser(
        "show",
        help="budgets, spent, remaining and releases; --unfinished: reservations still counted",
        description="Show each table's and privacy unit's budget, the epsilon spent by its counted releases in its "
        "current window (composed at the budget's delta: exactly for Gaussian releases, by dp_accounting's PLD "
        "accountant otherwise), what remains, and every release. --unfinished lists only the reservations of "
        "running or killed jobs, which stay counted until aborted. Opens the ledger read-only.",
    )
    _add_ledger_option(s)
    s.add_argument("--table-id", help="only this table (default: every table and unit)")
    s.add_argument("--unit", help="only this privacy unit")
    s.add_argument("--unfinished", action="store_true", help="only the entries still reserved (running jobs, or "
                   "jobs that died: still counted), with the command that releases one")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(_handler=cmd_show, func=cmd_show)

    r = commands.add_parser(
        "report",
        help="write an HTML report of the ledger for privacy officers",
        description="Write a self-contained HTML page (no network needed to view it): per table and privacy unit "
        "the budget and its window, the composed spend over time as a chart with the budget line, every release "
        "with the guarantee its receipt states, mechanism, output, state and times, the remaining budget, the "
        "journal's verification and the history of budget changes, aborts and refusals. Opens the ledger "
        "read-only.",
    )
    _add_ledger_option(r)
    r.add_argument("--output", "-o", required=True, metavar="FILE", help="the HTML file to write, e.g. report.html "
                   "(replaced if it exists)")
    r.add_argument("--table-id", action="append", metavar="ID",
                   help="only this table (repeat for several; default: every table)")
    r.add_argument("--key-file", help=f"the journal's key, to verify a keyed journal (default: ${KEY_FILE_ENV})")
    r.set_defaults(_handler=cmd_report, func=cmd_report)

    v = commands.add_parser(
        "verify",
        help="check the journal's hash chain and that the budgets and entries are what it recorded",
        description="Recompute the journal's hash chain, replay it, and compare the result with the budgets, units "
        "and entries the ledger admits from. Any edit of them or of the journal (a state flipped, an entry "
        "deleted, reordered or altered, a budget raised) is reported with the first broken record. A database "
        "writer can recompute an unkeyed chain: give --key-file for a keyed journal, and --pin heads copied "
        "elsewhere (receipts, logs) to detect that (docs/ledger.md, 'Tamper evidence'). Exit code 0 when all is "
        "intact, 1 otherwise. Opens the ledger read-only.",
    )
    _add_ledger_option(v)
    v.add_argument("--key-file", help=f"the journal's key (default: ${KEY_FILE_ENV})")
    v.add_argument("--pin", action="append", default=[], metavar="SEQ:HASH",
                   help="a head copied earlier (from a receipt or a log) that the journal must still hold; repeat")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    v.set_defaults(_handler=cmd_verify, func=cmd_verify)

    a = commands.add_parser(
        "abort",
        help="release a reservation whose output was not published (the on-call engineer's command)",
        description="Release the reservation ID: its spend stops counting. Only for a release whose output was "
        "NOT published (a killed job: see `sparkpriv ledger show --unfinished`); a committed entry cannot be "
        "aborted. The abort is journalled with who made it, when and --reason.",
    )
    _add_ledger_option(a)
    a.add_argument("entry_id", metavar="ID", help="the ledger entry (reservation) id")
    a.add_argument("--reason", required=True, help="why, e.g. 'driver killed by the OOM killer, nothing published'")
    _add_job_option(a)
    a.set_defaults(_handler=cmd_abort, func=cmd_abort)

    h = commands.add_parser(
        "history",
        help="the journal: budget changes, reservations, commits, aborts and refused attempts",
        description="Print the journal's records, oldest first: who did what, when, with which job and why. "
        "Opens the ledger read-only (use `verify` to check the journal).",
    )
    _add_ledger_option(h)
    h.add_argument("--table-id", help="only the records about this table")
    h.add_argument("--unit", help="only the records about this privacy unit")
    h.add_argument("--kind", action="append", choices=("budget", "unit", "reserve", "import", "commit", "abort",
                                                        "refuse", "genesis", "upgrade", "key"),
                   help="only records of this kind (repeat for several)")
    h.add_argument("--json", action="store_true", help="machine-readable output")
    h.set_defaults(_handler=cmd_history, func=cmd_history)

    u = commands.add_parser(
        "upgrade",
        help="upgrade a ledger written by an older sparkpriv (schema version 1), once",
        description="Convert a schema-version-1 ledger to this version's in one transaction: what it holds "
        "becomes the first records of its journal. Back it up and stop its writers first; older sparkpriv "
        "versions cannot write to it afterwards. A current ledger is left as it is.",
    )
    _add_ledger_option(u)
    u.add_argument("--key-file", help=f"key the journal from the start (default: ${KEY_FILE_ENV})")
    u.set_defaults(_handler=cmd_upgrade, func=cmd_upgrade)


def add_receipt_subparsers(commands) -> None:
    """Add ``show`` and ``verify`` to ``commands``, the sub-commands of ``receipt``."""
    s = commands.add_parser(
        "show",
        help="print a release's receipt in short: what it guarantees, its ledger entry, its output",
        description="Print a published release's receipt in short: its summary, the mechanism, the guarantee "
        "(epsilon, delta, neighbour relation, what it protects, and whether it holds: a fixed test seed means "
        "none), the events, the ledger entry, the output's schema, library version and time. Reads no ledger. "
        "Exit code 0, or 2 when PATH holds no readable receipt.",
    )
    s.add_argument("path", metavar="PATH", help="a published release's directory (local or mounted) or its "
                   "_privacy_receipt.json")
    s.add_argument("--json", action="store_true", help="the whole receipt as JSON, its long lists put back "
                   "from _privacy_receipt_details.json when it is there")
    s.set_defaults(_handler=cmd_receipt_show, func=cmd_receipt_show)
    v = commands.add_parser(
        "verify",
        help="check a release's receipt against the ledger that recorded it",
        description="Check that the ledger counts what a published release's receipt says was spent: its entry "
        "exists for the same table and is not aborted, its stored and journalled events are the receipt's, they "
        "spend no more than the receipt states, and the journal still holds the head the receipt carries. Exit "
        "code 0 when so, 1 otherwise. Opens the ledger read-only.",
    )
    v.add_argument("path", nargs="+", metavar="PATH", help="a published release's directory (local or mounted) "
                   "or its _privacy_receipt.json; several may be given")
    _add_ledger_option(v)
    v.add_argument("--json", action="store_true", help="machine-readable output")
    v.set_defaults(_handler=cmd_receipt_verify, func=cmd_receipt_verify)


def _add_ledger_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ledger",
        metavar="URL",
        help=f"sqlite:///path or postgresql://... (default: ${DEFAULT_LEDGER_ENV}, else {DEFAULT_LEDGER_URL})",
    )


def _add_job_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-id", help="the job or ticket this is done for, recorded in the journal (default: "
                        "$SPARKPRIV_JOB_ID, or the scheduler's: Airflow's run, the Spark application)")


def cmd_set_budget(args: argparse.Namespace) -> int:
    """Handler of ``sparkpriv ledger set-budget``; returns the exit code."""
    return _run(_set_budget, args)


def cmd_show(args: argparse.Namespace) -> int:
    """Handler of ``sparkpriv ledger show``; returns the exit code."""
    return _run(_show, args)


def cmd_report(args: argparse.Namespace) -> int:
    """Handler of ``sparkpriv ledger report``; returns the exit code."""
    return _run(_report, args)


def cmd_verify(args: argparse.Namespace) -> int:
    """Handler of ``sparkpriv ledger verify``; returns the exit code."""
    return _run(_verify, args)


def cmd_abort(args: argparse.Namespace) -> int:
    """Handler of ``sparkpriv ledger abort``; returns the exit code."""
    return _run(_abort, args)


def cmd_history(args: argparse.Namespace) -> int:
    """Handler of ``sparkpriv ledger history``; returns the exit code."""
    return _run(_history, args)


def cmd_upgrade(args: argparse.Namespace) -> int:
    """Handler of ``sparkpriv ledger upgrade``; returns the exit code."""
    return _run(_upgrade, args)


def cmd_receipt_show(args: argparse.Namespace) -> int:
    """Handler of ``sparkpriv receipt show``; returns the exit code."""
    return _run(_receipt_show, args)


def cmd_receipt_verify(args: argparse.Namespace) -> int:
    """Handler of ``sparkpriv receipt verify``; returns the exit code."""
    return _run(_receipt_verify, args)


def _run(command: Callable[[argparse.Namespace, TextIO], int | None], args: argparse.Namespace) -> int:
    try:
        return command(args, sys.stdout) or EXIT_OK
    except SparkPrivError as exc:
        print(f"sparkpriv ledger: error: {exc}", file=sys.stderr)
        return exc.exit_code


def _dump(doc: dict, out: TextIO) -> None:
    json.dump(doc, out, indent=2, allow_nan=False)
    out.write("\n")


def _set_budget(args: argparse.Namespace, out: TextIO) -> None:
    if args.tables is not None and args.unit is None:
        raise ParameterError("--tables applies to a privacy unit: give --unit NAME with it (a table's own budget "
                             "covers that table only).")
    with open_ledger(args.ledger) as ledger:
        if args.unit is not None:
            ledger.set_unit(args.unit, tables=args.tables, epsilon=args.epsilon, delta=args.delta,
                            window=args.window, reason=args.reason, job_id=args.job_id)
            status = ledger.unit_status(args.unit)
        else:
            ledger.set_budget(args.table_id, epsilon=args.epsilon, delta=args.delta, window=args.window,
                              reason=args.reason, job_id=args.job_id)
            status = ledger.status(args.table_id)
        url = ledger.url
    if args.json:
        key = "units" if args.unit is not None else "tables"
        _dump({"ledger": url, "tables": [], "units": [], key: [status.to_dict()]}, out)
        return
    what = f"privacy unit {status.unit} (tables {', '.join(status.patterns)})" if args.unit is not None \
        else f"table {status.table_id}"
    out.write(
        f"Budget of {what} in {_printable(url)} set to epsilon = {_g(status.budget_epsilon)}, "
        f"delta = {_g(status.budget_delta)}, window {status.window}; spent "
        f"{'so far' if status.window == 'lifetime' else 'in the current window'}: "
        f"epsilon = {_g(status.spent_epsilon)}.\n"
    )
    if status.spent_epsilon > status.budget_epsilon:
        out.write("Warning: more than this budget is already spent; every release it covers will be refused.\n")


def _show(args: argparse.Namespace, out: TextIO) -> int:
    """Every table and unit that can be read is shown; one that cannot (a corrupt entry) is reported on stderr."""
    if args.unfinished:
        return _show_unfinished(args, out)
    statuses, failures = [], []
    with open_ledger(args.ledger, read_only=True) as ledger:
        if args.table_id or args.unit:
            calls = ([lambda: ledger.status(args.table_id)] if args.table_id else []) + \
                ([lambda: ledger.unit_status(args.unit)] if args.unit else [])
            statuses = [call() for call in calls]
        else:
            for call, ids in ((ledger.status, ledger.tables()), (ledger.unit_status, ledger.units())):
                for name in ids:
                    try:
                        statuses.append(call(name))
                    except SparkPrivError as exc:
                        failures.append(exc)
        head = ledger.head()
        url = ledger.url
    for exc in failures:
        print(f"sparkpriv ledger: error: {exc}", file=sys.stderr)
    code = max((exc.exit_code for exc in failures), default=EXIT_OK)
    if args.json:
        _dump({"ledger": url, "journal_head": head,
               "tables": [s.to_dict() for s in statuses if isinstance(s, TableStatus)],
               "units": [s.to_dict() for s in statuses if isinstance(s, UnitStatus)]}, out)
        return code
    out.write(f"Ledger {_printable(url)}\n")
    out.write(f"Journal head {head}  (check it with `sparkpriv ledger verify`)\n")
    if not statuses and not failures:
        out.write(
            "No table or privacy unit has a budget yet. Set one with "
            "`sparkpriv ledger set-budget --table-id ID --epsilon E --delta D`.\n"
        )
    for status in statuses:
        out.write("\n" + format_status(status))
    return code


def _show_unfinished(args: argparse.Namespace, out: TextIO) -> int:
    with open_ledger(args.ledger, read_only=True) as ledger:
        entries = ledger.unfinished()
        url = ledger.url
    if args.table_id:
        entries = [e for e in entries if e["table_id"] == args.table_id]
    if args.json:
        _dump({"ledger": url, "unfinished": [{k: e[k] for k in ("id", "table_id", "label", "created_at",
                                                                   "mechanism", "output_path", "host", "pid",
                                                                   "user_name", "job_id", "sparkpriv_version")}
                                             for e in entries]}, out)
        return EXIT_OK
    out.write(f"Ledger {_printable(url)}: {len(entries)} reservation(s) still counted and not published\n")
    if not entries:
        return EXIT_OK
    header = ("ID", "TABLE", "CREATED (UTC)", "STATE", "HOST", "PID", "USER", "JOB", "OUTPUT")
    rows = [tuple(_printable(c) for c in (e["id"], e["table_id"], _time(e["created_at"]), e["label"], e["host"],
                                          e["pid"], e["user_name"], e["job_id"] or "-", e["output_path"]))
            for e in entries]
    out.write(_columns(header, rows))
    out.write("\n'reserved': its job is running on this host. 'unfinished': its job is gone. 'reserved "
              "(unfinished?)': made on another host. A reservation stays counted until it is committed or "
              "aborted; once you know its output was NOT published, release it with\n"
              f"  sparkpriv ledger abort --ledger '{_printable(url)}' ID --reason '...'\n")
    return EXIT_OK


def _report(args: argparse.Namespace, out: TextIO) -> int:
    """The page is written with every table that can be read; one that cannot is listed on it and on stderr."""
    from sparkpriv.ledger.report import write_report

    with open_ledger(args.ledger, read_only=True, key_file=args.key_file) as ledger:
        result = write_report(ledger, args.output, args.table_id)
        url = ledger.url
    for exc in result.errors:
        print(f"sparkpriv ledger: error: {exc}", file=sys.stderr)
    out.write(f"Report of {len(result.tables)} table(s) of ledger {_printable(url)} written to "
              f"{_printable(result.path)}\n")
    return result.exit_code


def _verify(args: argparse.Namespace, out: TextIO) -> int:
    with open_ledger(args.ledger, read_only=True, key_file=args.key_file) as ledger:
        report = ledger.verify(pins=args.pin)
        url = ledger.url
    if args.json:
        _dump({"ledger": url, **report.to_dict()}, out)
    else:
        out.write(format_report(url, report))
    return EXIT_OK if report.ok else EXIT_FAILURE


def format_report(url: str, report) -> str:
    """What ``sparkpriv ledger verify`` prints for a :class:`~sparkpriv.ledger.chain.VerifyReport`."""
    keyed = ("not keyed" if report.keyed_from is None else
             f"keyed (key {report.key_id}) from record #{report.keyed_from}"
             + ("" if report.key_checked else ", key not given"))
    lines = [f"Ledger {_printable(url)}",
             f"  journal: {report.records} record(s), {keyed}",
             f"  head:    {report.head}  ({_time(report.head_at)} UTC)"]
    if report.pins_checked:
        lines.append(f"  pinned heads checked: {report.pins_checked}")
    if report.ok:
        lines.append("OK: the chain is intact and the budgets, units and entries are exactly what it recorded.")
        if report.keyed_from is None:
            lines.append("Note: an unkeyed chain shows edits made without recomputing it; someone who can write "
                         "to the database can recompute it. Keep the head above elsewhere and check it with --pin, "
                         f"or key the journal ({KEY_FILE_ENV}).")
        return "\n".join(lines) + "\n"
    first = report.first
    lines.append(f"BROKEN: {first.what}.")
    if len(report.problems) > 1:
        lines.append(f"All {len(report.problems)} problems:")
        lines += [f"  - {p.what}" for p in report.problems]
    return "\n".join(lines) + "\n"


def _abort(args: argparse.Namespace, out: TextIO) -> None:
    from sparkpriv.ledger.checks import job_context

    with open_ledger(args.ledger) as ledger:
        before = ledger.entry(args.entry_id)
        with job_context(args.job_id):
            ledger.abort(args.entry_id, reason=args.reason)
        url = ledger.url
    if before["state"] == "aborted":
        out.write(f"Entry {args.entry_id} of table {before['table_id']} in {_printable(url)} was already aborted; "
                  "nothing changed.\n")
        return
    out.write(f"Aborted entry {args.entry_id} of table {before['table_id']} in {_printable(url)}: its spend "
              f"(epsilon {_g(before['epsilon'])} on its own) no longer counts.\n")


def _history(args: argparse.Namespace, out: TextIO) -> None:
    with open_ledger(args.ledger, read_only=True) as ledger:
        records = ledger.history(kinds=args.kind)
        url = ledger.url
    if args.table_id or args.unit:
        records = [r for r in records if _about(r, args.table_id, args.unit)]
    if args.json:
        _dump({"ledger": url, "records": [_strict(r) for r in records]}, out)
        return
    out.write(f"Ledger {_printable(url)}: {len(records)} journal record(s)\n")
    header = ("#", "AT (UTC)", "KIND", "ABOUT", "BY", "JOB", "WHAT")
    rows = [tuple(_printable(c) for c in (r["seq"], _time(r["at"]), r["kind"], *describe(r).values()))
            for r in records]
    out.write(_columns(header, rows))


def _strict(record: dict) -> dict:
    from sparkpriv.ledger.checks import _strict_json

    return _strict_json(record)


def _about(record: dict, table_id: str | None, unit: str | None) -> bool:
    row = record.get("row") if isinstance(record.get("row"), dict) else {}
    if unit is not None and record.get("unit") == unit:
        return True
    return table_id is not None and table_id in (record.get("table_id"), row.get("table_id"))


def _upgrade(args: argparse.Namespace, out: TextIO) -> None:
    from sparkpriv.ledger import upgrade_ledger

    out.write(upgrade_ledger(args.ledger, key_file=args.key_file) + "\n")


def _receipt_show(args: argparse.Namespace, out: TextIO) -> None:
    from sparkpriv.ledger.receipts import describe_receipt, load_details, load_receipt, restore_lists

    file, receipt = load_receipt(args.path, "receipt show")
    if args.json:
        _dump(restore_lists(receipt, load_details(file)), out)
    else:
        out.write(describe_receipt(receipt))


def _receipt_verify(args: argparse.Namespace, out: TextIO) -> int:
    from sparkpriv.ledger.receipts import check_receipt, load_receipt

    checks = []
    with open_ledger(args.ledger, read_only=True) as ledger:
        for path in args.path:
            file, receipt = load_receipt(path)
            checks.append(check_receipt(ledger, receipt, file))
        url = ledger.url
    if args.json:
        _dump({"ledger": url, "ok": all(c.ok for c in checks), "receipts": [c.to_dict() for c in checks]}, out)
    else:
        for c in checks:
            out.write(f"{'OK' if c.ok else 'FAILED'}: {_printable(c.path)}: entry {c.entry_id} of table "
                      f"{_printable(c.table_id)} ({c.state or 'not found'}) in ledger {_printable(url)}\n")
            out.writelines(f"  problem: {p}\n" for p in c.problems)
            out.writelines(f"  note: {n}\n" for n in c.notes)
    return EXIT_OK if all(c.ok for c in checks) else EXIT_FAILURE


def _columns(header: tuple, rows: list) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return "".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] + "\n"
                   for r in [header, *rows])


def format_status(status) -> str:
    """The readable table that ``sparkpriv ledger show`` prints for one table (or privacy unit)."""
    d = _g(status.budget_delta)
    if isinstance(status, UnitStatus):
        title = f"Privacy unit {status.unit}  (tables {', '.join(status.patterns)}; seen: " \
            f"{', '.join(status.members) or 'none yet'})"
    else:
        title = f"Table {status.table_id}" + (f"  (also in privacy unit(s) {', '.join(status.units)})"
                                              if status.units else "")
    window = "" if status.window == "lifetime" else f", window {status.window}"
    since = "" if status.window_start is None else f" since {_time(status.window_start)} UTC"
    who = f" by {status.budget_updated_by}" if status.budget_updated_by else ""
    why = f": {status.budget_reason}" if status.budget_reason else ""
    lines = [
        title,
        f"  budget     epsilon = {_g(status.budget_epsilon)}, delta = {d}{window}  (set "
        f"{_time(status.budget_updated_at)} UTC{who}{why})",
        f"  spent      epsilon = {_g(status.spent_epsilon)} at delta = {d}{since}  "
        f"({status.counted} counted release(s), {status.unfinished} unfinished)",
        f"  remaining  epsilon = {_g(status.remaining_epsilon)}",
    ]
    lines = [_printable(line) for line in lines]
    if not status.entries:
        lines.append("  no releases yet")
        return "\n".join(lines) + "\n"
    unit = isinstance(status, UnitStatus)
    header = ("ID",) + (("TABLE",) if unit else ()) + ("CREATED (UTC)", "MECHANISM", "STATE", "EPSILON", "OUTPUT")
    rows = [  # stored text is escaped: a newline in a path must not print a fake row
        tuple(_printable(c) for c in (e["id"], *((e["table_id"],) if unit else ()), _time(e["created_at"]),
                                      e["mechanism"], e["label"], _g(e["epsilon"]), e["output_path"]))
        for e in status.entries
    ]
    num = len(header) - 2
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for r in [header, *rows]:
        cells = [c.rjust(w) if i == num else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  " + "  ".join(cells) + "  " + r[-1])
    return "\n".join(lines) + "\n"


def _g(x: float) -> str:
    return f"{x:.6g}"


def _time(iso: str | None) -> str:
    return "-" if iso is None else str(iso)[:19].replace("T", " ")
