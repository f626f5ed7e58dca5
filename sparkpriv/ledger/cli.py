"""``sparkpriv ledger set-budget``, ``sparkpriv ledger show`` and ``sparkpriv ledger report``.

Thin: parse, call :mod:`sparkpriv.ledger`, print, return an exit code. Wire it
into the main parser with::

    ledger = subparsers.add_parser("ledger", help="privacy-budget ledger")
    add_ledger_subparsers(ledger.add_subparsers(dest="ledger_command", required=True))
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

from sparkpriv.errors import EXIT_OK, SparkPrivError
from sparkpriv.ledger import DEFAULT_LEDGER_ENV, DEFAULT_LEDGER_URL, TableStatus, open_ledger
from sparkpriv.ledger.base import _printable

__all__ = ["add_ledger_subparsers", "cmd_report", "cmd_set_budget", "cmd_show", "format_status"]


def add_ledger_subparsers(commands) -> None:
    """Add ``set-budget``, ``show`` and ``report`` to ``commands``, the sub-commands of ``ledger``.

    ``commands`` is what ``add_subparsers()`` of the ``ledger`` parser
    returned. Each leaf sets ``_handler`` (and ``func``) to a handler
    ``handler(args) -> int``.
    """
    p = commands.add_parser(
        "set-budget",
        help="create or change a table's budget",
        description="Create or change the (epsilon, delta) budget of a table. A budget below what is "
        "already spent is accepted, but then every further release of the table is refused.",
    )
    _add_ledger_option(p)
    p.add_argument("--table-id", required=True, help="logical table id, e.g. cdr.daily_towers")
    p.add_argument("--epsilon", required=True, type=float, help="total epsilon of the table (> 0)")
    p.add_argument("--delta", required=True, type=float, help="delta at which spends are composed, in [0, 1)")
    p.add_argument("--json", action="store_true", help="print the table's status as JSON")
    p.set_defaults(_handler=cmd_set_budget, func=cmd_set_budget)

    s = commands.add_parser(
        "show",
        help="budget, spent, remaining and releases of one or every table",
        description="Show each table's budget, the epsilon spent by its counted releases (composed at the "
        "budget's delta: exactly for Gaussian releases, by dp_accounting's PLD accountant otherwise), what "
        "remains, and every release. Opens the ledger read-only.",
    )
    _add_ledger_option(s)
    s.add_argument("--table-id", help="only this table (default: every table)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(_handler=cmd_show, func=cmd_show)

    r = commands.add_parser(
        "report",
        help="write an HTML report of the ledger for privacy officers",
        description="Write a self-contained HTML page (no network needed to view it): per table the budget, "
        "the composed spend after each committed release as a chart with the budget line, every release with "
        "the guarantee its receipt states, mechanism, output, state and times, and the remaining budget. "
        "Opens the ledger read-only.",
    )
    _add_ledger_option(r)
    r.add_argument("--output", "-o", required=True, metavar="FILE", help="the HTML file to write, e.g. report.html "
                   "(replaced if it exists)")
    r.add_argument("--table-id", action="append", metavar="ID",
                   help="only this table (repeat for several; default: every table)")
    r.set_defaults(_handler=cmd_report, func=cmd_report)


def _add_ledger_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ledger",
        metavar="URL",
        help=f"sqlite:///path or postgresql://... (default: ${DEFAULT_LEDGER_ENV}, else {DEFAULT_LEDGER_URL})",
    )


def cmd_set_budget(args: argparse.Namespace) -> int:
    """Handler of ``sparkpriv ledger set-budget``; returns the exit code."""
    return _run(_set_budget, args)


def cmd_show(args: argparse.Namespace) -> int:
    """Handler of ``sparkpriv ledger show``; returns the exit code."""
    return _run(_show, args)


def cmd_report(args: argparse.Namespace) -> int:
    """Handler of ``sparkpriv ledger report``; returns the exit code."""
    return _run(_report, args)


def _run(command: Callable[[argparse.Namespace, TextIO], int | None], args: argparse.Namespace) -> int:
    try:
        return command(args, sys.stdout) or EXIT_OK
    except SparkPrivError as exc:
        print(f"sparkpriv ledger: error: {exc}", file=sys.stderr)
        return exc.exit_code


def _set_budget(args: argparse.Namespace, out: TextIO) -> None:
    with open_ledger(args.ledger) as ledger:
        ledger.set_budget(args.table_id, epsilon=args.epsilon, delta=args.delta)
        status = ledger.status(args.table_id)
        url = ledger.url
    if args.json:
        json.dump({"ledger": url, "tables": [status.to_dict()]}, out, indent=2, allow_nan=False)
        out.write("\n")
        return
    out.write(
        f"Budget of table {status.table_id} in {_printable(url)} set to epsilon = {_g(status.budget_epsilon)}, "
        f"delta = {_g(status.budget_delta)}; spent so far: epsilon = {_g(status.spent_epsilon)}.\n"
    )
    if status.spent_epsilon > status.budget_epsilon:
        out.write("Warning: the table has already spent more than this budget; every release will be refused.\n")


def _show(args: argparse.Namespace, out: TextIO) -> int:
    """Every table that can be read is shown; one that cannot (a corrupt entry) is reported on stderr."""
    statuses, failures = [], []
    with open_ledger(args.ledger, read_only=True) as ledger:
        table_ids = [args.table_id] if args.table_id else ledger.tables()
        for table_id in table_ids:
            try:
                statuses.append(ledger.status(table_id))
            except SparkPrivError as exc:
                if args.table_id:
                    raise
                failures.append(exc)
        url = ledger.url
    for exc in failures:
        print(f"sparkpriv ledger: error: {exc}", file=sys.stderr)
    code = max((exc.exit_code for exc in failures), default=EXIT_OK)
    if args.json:
        json.dump({"ledger": url, "tables": [s.to_dict() for s in statuses]}, out, indent=2, allow_nan=False)
        out.write("\n")
        return code
    out.write(f"Ledger {_printable(url)}\n")
    if not statuses and not failures:
        out.write(
            "No table has a budget yet. Set one with "
            "`sparkpriv ledger set-budget --table-id ID --epsilon E --delta D`.\n"
        )
    for status in statuses:
        out.write("\n" + format_status(status))
    return code


def _report(args: argparse.Namespace, out: TextIO) -> int:
    """The page is written with every table that can be read; one that cannot is listed on it and on stderr."""
    from sparkpriv.ledger.report import write_report

    with open_ledger(args.ledger, read_only=True) as ledger:
        result = write_report(ledger, args.output, args.table_id)
        url = ledger.url
    for exc in result.errors:
        print(f"sparkpriv ledger: error: {exc}", file=sys.stderr)
    out.write(f"Report of {len(result.tables)} table(s) of ledger {_printable(url)} written to "
              f"{_printable(result.path)}\n")
    return result.exit_code


def format_status(status: TableStatus) -> str:
    """The readable table that ``sparkpriv ledger show`` prints for one table."""
    d = _g(status.budget_delta)
    counted = sum(1 for e in status.entries if e["state"] in ("reserved", "committed"))
    lines = [
        f"Table {status.table_id}",
        f"  budget     epsilon = {_g(status.budget_epsilon)}, delta = {d}  (set {_time(status.budget_updated_at)} UTC)",
        f"  spent      epsilon = {_g(status.spent_epsilon)} at delta = {d}  "
        f"({counted} counted release(s), {status.unfinished} unfinished)",
        f"  remaining  epsilon = {_g(status.remaining_epsilon)}",
    ]
    if not status.entries:
        lines.append("  no releases yet")
        return "\n".join(lines) + "\n"
    header = ("ID", "CREATED (UTC)", "MECHANISM", "STATE", "EPSILON", "OUTPUT")
    rows = [  # stored text is escaped: a newline in a path must not print a fake row
        tuple(_printable(c) for c in (e["id"], _time(e["created_at"]), e["mechanism"], e["label"],
                                      _g(e["epsilon"]), e["output_path"]))
        for e in status.entries
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for r in [header, *rows]:
        cells = [c.rjust(w) if i == 4 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  " + "  ".join(cells) + "  " + r[-1])
    return "\n".join(lines) + "\n"


def _g(x: float) -> str:
    return f"{x:.6g}"


def _time(iso: str | None) -> str:
    return "-" if iso is None else str(iso)[:19].replace("T", " ")
