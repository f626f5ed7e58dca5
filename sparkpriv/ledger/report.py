"""A self-contained HTML report of a budget ledger, for privacy officers (docs/ledger.md).

>>> from sparkpriv.ledger.report import write_report
>>> write_report("sqlite:////var/lib/sparkpriv/ledger.sqlite", "report.html")  # doctest: +SKIP

Per table: the budget, the spent and remaining epsilon (as
:meth:`Ledger.status` computes them), a chart of the composed spend after each
committed release with the budget line, and every release with the guarantee
its receipt states, its mechanism, output, state and times. A budget with a
window (a table's, or a privacy unit's over several tables) is charted as the
composed spend of its window over time (:class:`WindowPoint`). Before them the
journal's verification (:meth:`Ledger.verify`), after them the history of
budget changes, aborts and refused attempts.

Every number about privacy comes from the ledger's own composition: the
table's spent epsilon is ``TableStatus.spent_epsilon``, and the chart's point
after the ``i``-th committed release (in publication order) is
:func:`sparkpriv.ledger.base.composed_epsilon` of the events of the first
``i`` committed releases at the budget's delta. Nothing is added up here.
A table with more than :data:`MAX_COMPOSED_POINTS` committed releases is
composed after that many of them, evenly spaced; between two points the chart
shows the later point's value (an upper bound), see :class:`SpendPoint`.

The page needs no network to be viewed: CSS inline, the chart an inline SVG
drawn here, no script, and a Content-Security-Policy that forbids loading
anything. Every text that comes from the ledger (table ids, paths, mechanism
names, abort reasons, the URL) is escaped, so a stored string cannot inject
markup. The report is written atomically (a temporary file, then a rename).
"""

from __future__ import annotations

import decimal
import html
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Sequence

from sparkpriv._version import __version__
from sparkpriv.errors import ParameterError, SparkPrivError
from sparkpriv.ledger import base as _base
from sparkpriv.ledger.base import COUNTED_STATES, Ledger, TableStatus, UnitStatus, _printable, composed_epsilon
from sparkpriv.ledger.history import describe
from sparkpriv.ledger.windows import Window, parse_time

__all__ = ["MAX_COMPOSED_POINTS", "ReportResult", "SpendPoint", "TableReport", "UnitReport", "WindowPoint",
           "build_tables", "build_units", "render_report", "write_report"]

#: Colours of the chart (the browser test looks for them in the screenshot).
SPEND_COLOUR = "#1f5fbf"
BUDGET_COLOUR = "#c0392b"
COUNTED_COLOUR = "#e67e22"

# chart geometry (SVG user units)
_W, _H = 760, 280
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 20, 24, 46


#: At most this many compositions per table for the chart (each may be a PLD computation).
MAX_COMPOSED_POINTS = 250
#: The journal records the history at the end of the page shows (reservations and commits are the entries).
HISTORY_KINDS = ("genesis", "upgrade", "key", "budget", "unit", "abort", "refuse")


@dataclass(frozen=True)
class SpendPoint:
    """The composed spend after a committed release (a point of the chart).

    ``epsilon`` is the ledger's composition, at the budget's delta, of the
    events of every committed release published up to and including
    ``entry_id`` (published at ``published_at``). ``commits`` releases were
    published since the previous point, the first at ``first_published_at``:
    more than 1 only when a table has more than :data:`MAX_COMPOSED_POINTS`
    committed releases, and then the chart steps up to ``epsilon`` at the
    first of them (an upper bound of the spend in between).
    """

    published_at: str
    epsilon: float
    entry_id: str
    commits: int = 1
    first_published_at: str = ""


@dataclass(frozen=True)
class WindowPoint:
    """The composed spend of a windowed budget's window ending at ``at`` (a point of its chart).

    ``epsilon`` is the ledger's composition, at the budget's delta, of the
    events of every counted entry (committed or reserved) it covers made in
    the window that ends at ``at`` (the ``N`` days up to ``at``, or ``at``'s
    calendar month up to ``at``). ``entry_id`` is the entry made at ``at``, or
    None where the value changes because spends left the window (or now).
    """

    at: str
    epsilon: float
    entry_id: str | None = None


@dataclass(frozen=True)
class TableReport:
    """What the report shows for one table: its status and the chart's points (:class:`SpendPoint`, or
    :class:`WindowPoint` for a windowed budget)."""

    status: TableStatus
    points: list = field(default_factory=list)
    window_points: list = field(default_factory=list)

    @property
    def committed(self) -> int:
        return sum(p.commits for p in self.points)

    @property
    def counted_not_committed(self) -> list:
        return [e for e in self.status.entries if e["state"] == "reserved"]


@dataclass(frozen=True)
class UnitReport:
    """What the report shows for one privacy unit: its status and its window chart's points."""

    status: UnitStatus
    window_points: list = field(default_factory=list)


@dataclass(frozen=True)
class ReportResult:
    """What :func:`write_report` wrote: the path, the tables shown, and the tables that could not be read."""

    path: str
    tables: list
    errors: list

    @property
    def exit_code(self) -> int:
        return max((e.exit_code for e in self.errors), default=0)


def build_tables(ledger: Ledger, table_ids: Sequence[str] | None = None) -> tuple[list, list]:
    """``([TableReport, ...], [SparkPrivError, ...])`` for ``table_ids`` (default: every table).

    A table that cannot be read (no budget, a corrupt entry) is returned as its
    error, the others are reported; with explicit ``table_ids`` the errors are
    returned the same way.
    """
    ids = list(table_ids) if table_ids else ledger.tables()
    tables, errors = [], []
    now = _base._clock()
    for table_id in ids:
        try:
            status = ledger.status(table_id)
        except SparkPrivError as exc:
            errors.append(exc)
            continue
        if status.window == "lifetime":
            tables.append(TableReport(status, _spend_points(status)))
        else:
            tables.append(TableReport(status, [], _window_points(status, now)))
    return tables, errors


def build_units(ledger: Ledger) -> tuple[list, list]:
    """``([UnitReport, ...], [SparkPrivError, ...])`` for every privacy unit of the ledger."""
    units, errors = [], []
    now = _base._clock()
    for name in ledger.units():
        try:
            status = ledger.unit_status(name)
        except SparkPrivError as exc:
            errors.append(exc)
            continue
        units.append(UnitReport(status, _window_points(status, now)))
    return units, errors


def _window_points(status, now: datetime) -> list:
    """The window's composed spend at each counted entry's time, where spends leave it, and now."""
    window = Window.parse(status.window)
    counted = sorted((e for e in status.entries if e["state"] in COUNTED_STATES),
                     key=lambda e: (e["created_at"], e["id"]))
    if not counted:
        return []
    times = [parse_time(e["created_at"]) for e in counted]
    evals = [(t, e["id"]) for t, e in zip(times, counted)]
    if window.kind == "rolling":
        span = timedelta(days=window.days)
        evals += [(t + span, None) for t in times if t + span <= now]
    elif window.kind == "month":
        month = times[0].replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        while True:
            month = (month + timedelta(days=32)).replace(day=1)
            if month > now:
                break
            evals.append((month, None))
    if window.kind != "lifetime":
        evals.append((max(now, times[-1]), None))
    evals.sort(key=lambda p: (p[0], p[1] is None))
    evals = evals[-MAX_COMPOSED_POINTS:]  # the latest changes (the chart says so when some are left out)
    points = []
    for at, entry_id in evals:
        start = window.start(at)
        inside = [e["events"] for e, t in zip(counted, times) if (start is None or t >= start) and t <= at]
        points.append(WindowPoint(at.isoformat(), composed_epsilon(inside, status.budget_delta), entry_id))
    return points


def _spend_points(status: TableStatus) -> list:
    committed = sorted((e for e in status.entries if e["state"] == "committed"),
                       key=lambda e: (_published(e), e["id"]))
    n = len(committed)
    if n <= MAX_COMPOSED_POINTS:
        sample = list(range(n))
    else:  # evenly spaced, always the last
        sample = sorted({math.ceil((i + 1) * n / MAX_COMPOSED_POINTS) - 1 for i in range(MAX_COMPOSED_POINTS)})
    events = [e["events"] for e in committed]
    points, previous = [], -1
    for k in sample:
        e = committed[k]
        # the ledger's composition of the first k + 1 committed releases, at the budget's delta
        eps = composed_epsilon(events[:k + 1], status.budget_delta)
        points.append(SpendPoint(_published(e), eps, e["id"], k - previous, _published(committed[previous + 1])))
        previous = k
    return points


def _published(entry: dict) -> str:
    return entry["published_at"] or entry["created_at"]


def render_report(ledger: Ledger, table_ids: Sequence[str] | None = None, *,
                  generated_at: datetime | None = None) -> tuple[str, list, list]:
    """``(html text, [TableReport, ...], [SparkPrivError, ...])`` of ``ledger``."""
    tables, errors = build_tables(ledger, table_ids)
    units, unit_errors = build_units(ledger) if not table_ids else ([], [])
    errors = errors + unit_errors
    now = generated_at or datetime.now(timezone.utc)
    chain = ledger.verify()
    history = [r for r in ledger.history(kinds=HISTORY_KINDS)
               if not table_ids or r.get("table_id") in table_ids or r.get("kind") in ("genesis", "upgrade", "key")]
    return _page(ledger.public_url, tables, errors, now, units, chain, history), tables, errors


def write_report(ledger: Ledger | str | None, path: str | os.PathLike, table_ids: Sequence[str] | None = None, *,
                 generated_at: datetime | None = None) -> ReportResult:
    """Write the HTML report of ``ledger`` to ``path`` (replaced atomically if it exists).

    Parameters
    ----------
    ledger : Ledger, str or None
        An open ledger, or a ledger URL (opened read-only; None means
        ``$SPARKPRIV_LEDGER``, else the default ledger).
    path : str or path-like
        The HTML file to write (its directory must exist).
    table_ids : sequence of str, optional
        Only these tables (default: every table with a budget).
    generated_at : datetime, optional
        The time stated on the page (default: now).

    Returns
    -------
    ReportResult
        ``path``, ``tables`` (the table ids shown) and ``errors`` (one
        :class:`~sparkpriv.errors.SparkPrivError` per table that could not be
        read; the page lists them too).
    """
    path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise ParameterError("The 'path' parameter of write_report must be a non-empty file path, "
                             "e.g. 'report.html'.")
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    if os.path.isdir(target):
        raise ParameterError(f"The report path {path!r} is a directory; give a file name, e.g. "
                             f"{os.path.join(path, 'report.html')!r}.")
    if not os.path.isdir(folder):
        raise ParameterError(f"The directory of the report path {path!r} does not exist; create {folder!r} "
                             "first or choose another path.")
    if isinstance(ledger, Ledger):
        text, tables, errors = render_report(ledger, table_ids, generated_at=generated_at)
    else:
        from sparkpriv.ledger import open_ledger

        with open_ledger(ledger, read_only=True) as led:
            text, tables, errors = render_report(led, table_ids, generated_at=generated_at)
    fd, tmp = tempfile.mkstemp(prefix=".sparkpriv-report-", suffix=".html.tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return ReportResult(path, [t.status.table_id for t in tables], errors)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- formatting ------------------------------------------------------------------------


def _esc(value) -> str:
    """Text from the ledger, safe in HTML text and in quoted attributes (control characters made visible)."""
    return html.escape(_printable(value), quote=True)


def _num(x: float, rounding: str = decimal.ROUND_HALF_EVEN) -> str:
    """``x`` to 6 significant digits; spends are rounded up and what remains down (never shown as less)."""
    if x is None:
        return "-"
    x = float(x)
    if math.isinf(x):
        return "∞"
    if math.isnan(x):
        return "NaN"
    with decimal.localcontext() as ctx:
        ctx.prec, ctx.rounding = 6, rounding
        return f"{float(+decimal.Decimal(repr(x))):.6g}"  # repr: the shortest decimal of the float


def _up(x: float) -> str:
    return _num(x, decimal.ROUND_CEILING)


def _down(x: float) -> str:
    return _num(x, decimal.ROUND_FLOOR)


def _parse_time(iso: str | None) -> datetime | None:
    if not iso:
        return None
    try:
        t = datetime.fromisoformat(str(iso))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _time(iso: str | None) -> str:
    return "-" if not iso else _esc(str(iso)[:19].replace("T", " "))


def _when(iso: str | None) -> str:
    """A time in a table cell: the date and the time on one line each if the cell is narrow."""
    if not iso:
        return "-"
    day, _, clock = _time(iso).partition(" ")
    return f'<span class="nw">{day}</span> <span class="nw">{clock}</span>'


def _guarantee(summary) -> str:
    """The (epsilon, delta) the release's receipt states, as the ledger recorded it at publication."""
    if not isinstance(summary, dict):
        return '<span class="muted">no receipt</span>'
    eps, delta = summary.get("epsilon"), summary.get("delta")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (eps, delta)):
        return '<span class="muted">receipt without epsilon and delta</span>'
    return f'<span class="nw">ε = {_up(eps)},</span> <span class="nw">δ = {_up(delta)}</span>'


_STATE_TEXT = {
    "committed": "committed",
    "aborted": "aborted",
    "reserved": "reserved (job running)",
    "unfinished": "unfinished (job gone, still counted)",
    "reserved (unfinished?)": "reserved (other host: running or unfinished, counted)",
}


def _state_class(label: str) -> str:
    return {"committed": "committed", "aborted": "aborted", "reserved": "reserved"}.get(label, "unfinished")


# -- the page --------------------------------------------------------------------------

_CSS = """
body{font-family:"DejaVu Sans",Helvetica,Arial,sans-serif;margin:24px auto;max-width:1100px;color:#222;
 padding:0 16px;font-size:14px;line-height:1.4}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #ccc;padding-bottom:4px}
.meta{color:#555;margin:0 0 16px}.muted{color:#777}
table{border-collapse:collapse;margin:8px 0;width:100%}
th,td{border:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.nw{white-space:nowrap}td.path,td.id{font-family:"DejaVu Sans Mono",monospace;font-size:12px;word-break:break-all}
.figures{display:flex;flex-wrap:wrap;gap:8px 28px;margin:8px 0}
.figure .label{color:#555;font-size:12px}.figure .value{font-size:18px;font-weight:600}
.state{padding:1px 6px;border-radius:3px;font-size:12px;white-space:nowrap}
.state-committed{background:#dff0d8;color:#255625}.state-aborted{background:#eee;color:#555}
.state-reserved{background:#fcf3cf;color:#7a5b00}.state-unfinished{background:#fde2cf;color:#8a3b00}
.over{color:#b00020;font-weight:600}.error{border:1px solid #b00020;background:#fdecee;padding:8px;
 white-space:pre-wrap;font-family:"DejaVu Sans Mono",monospace;font-size:12px}
.reason{color:#555;font-size:12px}
svg.chart{max-width:100%;height:auto;border:1px solid #eee;background:#fff}
svg.chart text{font-family:"DejaVu Sans",Helvetica,Arial,sans-serif;font-size:11px;fill:#333}
.note{color:#555;font-size:12px;max-width:900px}td.about,td.job{font-family:"DejaVu Sans Mono",monospace;
 font-size:12px;word-break:break-all}
.verdict{padding:6px 10px;border-radius:3px}.verdict.ok{background:#dff0d8;color:#255625}
.verdict.over{background:#fdecee}.covers{color:#444}td.what{font-size:12px}
"""


def _page(url: str, tables: list, errors: list, now: datetime, units: Sequence = (), chain=None,
          history: Sequence = ()) -> str:
    title = "Privacy budget report"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # nothing may be loaded: the page is complete as it is (and no injected markup could run)
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "img-src data:\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="generator" content="sparkpriv ' + _esc(__version__) + '">',
        f"<title>{title}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{title}</h1>",
        f'<p class="meta">Ledger <code id="ledger-url">{_esc(url)}</code> · generated '
        f'{_esc(now.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"))} UTC by sparkpriv {_esc(__version__)}'
        f" · {len(tables)} table(s), {len(units)} privacy unit(s)</p>",
        '<p class="note">Spent is the epsilon, at the budget\'s delta, of the <em>composition</em> of every '
        "counted release of the table (committed, and reserved by a running or unfinished job), as the ledger "
        "computes it (exact for Gaussian releases, dp_accounting's PLD accountant otherwise): it is not the "
        "sum of the releases' epsilons. Aborted releases are not counted. The chart shows the composed spend "
        "after each committed release, in the order they were published; for a budget with a window (any N "
        "days, or any calendar month), the composed spend of the window ending at each moment. A privacy unit "
        "is one budget over every table whose id matches its patterns (tables that hold the same people).</p>",
    ]
    if chain is not None:
        out.append(_journal(chain))
    if not tables and not units and not errors:
        out.append('<p id="no-tables">No table has a budget yet. Set one with <code>sparkpriv ledger set-budget '
                   "--table-id ID --epsilon E --delta D</code>.</p>")
    if tables:
        out.append(_summary(tables))
    if units:
        out.append(_unit_summary(units))
    for error in errors:
        out.append('<h2 class="unreadable">A table that could not be read</h2>')
        # the message is multi-line text (ledger strings in it are already made printable): escape only
        out.append(f'<div class="error">{html.escape(str(error), quote=True)}</div>')
    for i, u in enumerate(units):
        out.append(_unit_section(i, u))
    for i, t in enumerate(tables):
        out.append(_table_section(i, t))
    if chain is not None:
        out.append(_history(history))
    out.append("</body></html>\n")
    return "\n".join(out)


def _journal(chain) -> str:
    """The journal's verification: intact or broken (the first broken record), its head, keyed or not."""
    keyed = ("not keyed: anyone who can write to the database could recompute it, so keep the head below "
             "elsewhere (receipts carry it) and check it with <code>sparkpriv ledger verify --pin</code>"
             if chain.keyed_from is None else
             f"keyed (HMAC, key {_esc(chain.key_id)}) from record #{chain.keyed_from}"
             + ("" if chain.key_checked else ": not checked, no key was given"))
    if chain.ok:
        verdict = ('<p class="verdict ok" data-chain="ok"><strong>Intact.</strong> The hash chain of every change '
                   "is unbroken, and the budgets, units and entries shown here are exactly what it recorded.</p>")
    else:
        first = chain.first
        verdict = (f'<p class="verdict over" data-chain="broken"><strong>Broken.</strong> {_esc(first.what)}.'
                   f' ({len(chain.problems)} problem(s); <code>sparkpriv ledger verify</code> lists them.) The '
                   "figures below are what the tables hold now, not what was recorded.</p>")
    return (f'<div class="journal" id="journal" data-part="journal"><h2>Journal</h2>{verdict}'
            f'<p class="note">{chain.records} record(s); head <code id="journal-head">{_esc(chain.head)}</code> '
            f"({_time(chain.head_at)} UTC); {keyed}.</p></div>")


def _history(records: Sequence) -> str:
    if not records:
        return '<div class="history" id="history" data-part="history"><h2>History</h2><p>No records.</p></div>'
    rows = []
    for r in records:
        d = describe(r)
        rows.append(f'<tr class="record" data-kind="{_esc(r["kind"])}" data-seq="{int(r["seq"])}">'
                    f'<td class="num">{int(r["seq"])}</td><td>{_when(r["at"])}</td><td>{_esc(r["kind"])}</td>'
                    f'<td class="about">{_esc(d["about"])}</td><td>{_esc(d["by"])}</td><td class="job">'
                    f'{_esc(d["job"])}</td><td class="what">{_esc(d["what"])}</td></tr>')
    return ('<div class="history" id="history" data-part="history"><h2>History</h2><p class="note">Budget and unit '
            "changes (who, when, why), aborted reservations and refused attempts, from the journal; the releases "
            "are listed with their tables above.</p><table class=\"records\"><thead><tr><th>#</th>"
            "<th>At (UTC)</th><th>Kind</th><th>About</th><th>By</th><th>Job</th><th>What</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table></div>")


def _unit_summary(units: Sequence) -> str:
    rows = []
    for i, u in enumerate(units):
        s = u.status
        rows.append(
            f'<tr data-unit="{_esc(s.unit)}"><td><a href="#unit-{i}">{_esc(s.unit)}</a></td>'
            f'<td>{_esc(", ".join(s.patterns))}</td><td>{_esc(_window_text(s.window))}</td>'
            f'<td class="num">{_num(s.budget_epsilon)}</td><td class="num">{_num(s.budget_delta)}</td>'
            f'<td class="num{" over" if s.spent_epsilon > s.budget_epsilon else ""}">{_up(s.spent_epsilon)}</td>'
            f'<td class="num">{_down(s.remaining_epsilon)}</td></tr>'
        )
    return ('<table id="unit-summary"><thead><tr><th>Privacy unit</th><th>Tables</th><th>Window</th>'
            "<th>Budget ε</th><th>Budget δ</th><th>Spent ε (current window)</th><th>Remaining ε</th></tr></thead>"
            "<tbody>" + "".join(rows) + "</tbody></table>")


def _window_text(window: str) -> str:
    w = Window.parse(window)
    return {"lifetime": "lifetime", "month": "per calendar month (UTC)"}.get(w.kind, f"per {w.days} days")


def _unit_section(i: int, u: UnitReport) -> str:
    s = u.status
    d = _num(s.budget_delta)
    over = s.spent_epsilon > s.budget_epsilon
    since = "" if s.window_start is None else f" since {_time(s.window_start)} UTC"
    parts = [
        f'<section class="ledger-unit" id="unit-{i}" data-unit="{_esc(s.unit)}">',
        f'<h2>Privacy unit <span class="unit-name">{_esc(s.unit)}</span></h2>',
        f'<p class="covers">Covers the tables <code>{_esc(", ".join(s.patterns))}</code>; seen so far: '
        f'{_esc(", ".join(s.members)) or "none"}.</p>',
        '<div class="figures">',
        _figure("budget", "Budget", f"ε = {_num(s.budget_epsilon)}, δ = {d}, {_esc(_window_text(s.window))}",
                f"set {_time(s.budget_updated_at)} UTC{_set_by(s)}"),
        _figure("spent", "Spent (composed, current window)", f"ε = {_up(s.spent_epsilon)}",
                f"at δ = {d}{since}; {s.counted} counted release(s), {s.unfinished} unfinished", over,
                s.spent_epsilon),
        _figure("remaining", "Remaining", f"ε = {_down(s.remaining_epsilon)}", f"at δ = {d}",
                raw=s.remaining_epsilon),
        "</div>",
        _window_chart(f"unit-{i}", s, u.window_points),
        _entries(s, with_table=True),
        "</section>",
    ]
    return "\n".join(parts)


def _set_by(s) -> str:
    who = f" by {_esc(s.budget_updated_by)}" if s.budget_updated_by else ""
    why = f": {_esc(s.budget_reason)}" if s.budget_reason else ""
    return who + why


def _summary(tables: list) -> str:
    rows = []
    for i, t in enumerate(tables):
        s = t.status
        over = s.spent_epsilon > s.budget_epsilon
        counts = _counts(s)
        rows.append(
            f'<tr data-table-id="{_esc(s.table_id)}"><td><a href="#table-{i}">{_esc(s.table_id)}</a></td>'
            f'<td class="num">{_num(s.budget_epsilon)}</td><td class="num">{_num(s.budget_delta)}</td>'
            f'<td class="num{" over" if over else ""}">{_up(s.spent_epsilon)}</td>'
            f'<td class="num">{_down(s.remaining_epsilon)}</td>'
            f'<td class="num">{counts["committed"]}</td><td class="num">{counts["reserved"]}</td>'
            f'<td class="num">{counts["aborted"]}</td></tr>'
        )
    return ('<table id="summary"><thead><tr><th>Table</th><th>Budget ε</th><th>Budget δ</th>'
            "<th>Spent ε (composed, at budget δ)</th><th>Remaining ε</th><th>Committed</th>"
            "<th>Reserved or unfinished</th><th>Aborted</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _counts(status: TableStatus) -> dict:
    counts = {"committed": 0, "reserved": 0, "aborted": 0}
    for e in status.entries:
        counts[e["state"]] = counts.get(e["state"], 0) + 1
    return counts


def _table_section(i: int, t: TableReport) -> str:
    s = t.status
    d = _num(s.budget_delta)
    counted = sum(1 for e in s.entries if e["state"] in COUNTED_STATES)
    over = s.spent_epsilon > s.budget_epsilon
    windowed = s.window != "lifetime"
    if windowed:
        counted = s.counted
    since = "" if s.window_start is None else f" since {_time(s.window_start)} UTC"
    parts = [
        f'<section class="ledger-table" id="table-{i}" data-table-id="{_esc(s.table_id)}">',
        f'<h2>Table <span class="table-id">{_esc(s.table_id)}</span></h2>',
    ]
    if s.units:
        parts.append(f'<p class="covers">Also covered by the privacy unit(s) {_esc(", ".join(s.units))}: a release '
                     "must fit their budgets too.</p>")
    parts += [
        '<div class="figures">',
        _figure("budget", "Budget", f"ε = {_num(s.budget_epsilon)}, δ = {d}"
                + (f", {_esc(_window_text(s.window))}" if windowed else ""),
                f"set {_time(s.budget_updated_at)} UTC{_set_by(s)}"),
        _figure("spent", "Spent (composed" + (", current window)" if windowed else ")"), f"ε = {_up(s.spent_epsilon)}",
                f"at δ = {d}{since}; {counted} counted release(s), {s.unfinished} unfinished", over, s.spent_epsilon),
        _figure("remaining", "Remaining", f"ε = {_down(s.remaining_epsilon)}", f"at δ = {d}",
                raw=s.remaining_epsilon),
        "</div>",
    ]
    if over:
        parts.append('<p class="over">The table has spent more than its budget (the budget was lowered after '
                     "releases were made): every further release is refused.</p>")
    if windowed:
        parts.append(_window_chart(f"table-{i}", s, t.window_points))
        parts.append(_entries(s))
        parts.append("</section>")
        return "\n".join(parts)
    parts.append(_chart(i, t))
    if t.committed > len(t.points):
        parts.append(f'<p class="note thinned">{t.committed} committed releases: the spend is composed after '
                     f"{len(t.points)} of them, evenly spaced (the last included); between two points the line "
                     "steps up to the later point's value at the first release after the earlier one, so it "
                     "never shows less than was spent.</p>")
    parts.append(_entries(s))
    parts.append("</section>")
    return "\n".join(parts)


def _figure(key: str, label: str, value: str, sub: str, alarm: bool = False, raw: float | None = None) -> str:
    cls = "value over" if alarm else "value"
    data = "" if raw is None else f' data-value="{float(raw)!r}"'
    return (f'<div class="figure figure-{key}"><div class="label">{label}</div>'
            f'<div class="{cls}" data-figure="{key}"{data}>{value}</div><div class="label">{sub}</div></div>')


def _entries(s, with_table: bool = False) -> str:
    if not s.entries:
        return '<p class="no-releases">No releases yet.</p>'
    rows = []
    for n, e in enumerate(s.entries, 1):
        label = e["label"]
        state = (f'<span class="state state-{_state_class(label)}" title="{_esc(label)}">'
                 f'{_esc(_STATE_TEXT.get(label, label))}</span>')
        if e["state"] == "aborted" and e["abort_reason"]:
            state += f'<div class="reason">{_esc(e["abort_reason"])}</div>'
        if e["state"] == "committed":
            finished = f'published {_when(e["published_at"])}'
        elif e["state"] == "aborted":
            finished = f'aborted {_when(e["aborted_at"])}'
        else:
            finished = '<span class="muted">not published</span>'
        rows.append(
            f'<tr class="entry" data-state="{_esc(e["state"])}" data-entry-id="{_esc(e["id"])}">'
            f'<td class="num">{n}</td>'
            + (f'<td class="path">{_esc(e["table_id"])}</td>' if with_table else "")
            + f'<td>{_when(e["created_at"])}</td><td>{finished}</td>'
            f'<td>{state}</td>'
            f'<td>{_esc(e["mechanism"])}</td><td class="guarantee">{_guarantee(e["receipt_summary"])}</td>'
            f'<td class="num">{_up(e["epsilon"])}</td>'
            f'<td class="path">{_esc(e["output_path"]) or "<span class=muted>-</span>"}</td>'
            f'<td class="id">{_esc(e["id"])}</td></tr>'
        )
    return (
        '<table class="entries"><thead><tr><th>#</th>' + ("<th>Table</th>" if with_table else "")
        + '<th>Created (UTC)</th><th>Published / aborted (UTC)</th>'
        "<th>State</th><th>Mechanism</th><th>Guarantee (receipt)</th>"
        f"<th>Own ε at budget δ = {_num(s.budget_delta)}</th><th>Output</th><th>Ledger entry</th></tr></thead>"
        "<tbody>" + "".join(rows) + "</tbody></table>"
    )


# -- the chart ---------------------------------------------------------------------------


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag  # pragma: no cover


def _time_label(t: datetime, span: timedelta) -> str:
    if span > timedelta(days=2):
        return t.strftime("%Y-%m-%d")
    if span > timedelta(hours=1):
        return t.strftime("%m-%d %H:%M")
    return t.strftime("%H:%M:%S")


def _chart(i: int, t: TableReport) -> str:
    s = t.status
    pending = t.counted_not_committed
    label = (f"Composed spend of table {_esc(s.table_id)} after each committed release, with the budget "
             f"epsilon {_num(s.budget_epsilon)}")
    head = (f'<svg class="chart" id="chart-{i}" role="img" aria-label="{label}" viewBox="0 0 {_W} {_H}" '
            f'width="{_W}" height="{_H}" xmlns="http://www.w3.org/2000/svg" data-commits="{t.committed}" '
            f'data-points="{len(t.points)}">'
            f"<title>{label}</title>")
    times = [_parse_time(w) for p in t.points for w in (p.first_published_at, p.published_at)]
    if pending:
        times += [_parse_time(e["created_at"]) for e in pending]
    times = [x for x in times if x is not None]
    finite = [p.epsilon for p in t.points if math.isfinite(p.epsilon)]
    if math.isfinite(s.spent_epsilon):
        finite.append(s.spent_epsilon)
    ymax = max([s.budget_epsilon, *finite]) * 1.1
    x0, x1 = _plot_x()
    y0, y1 = _H - _BOTTOM, _TOP

    def ypos(v: float) -> float:
        return y1 if not math.isfinite(v) else y0 - (y0 - y1) * min(v, ymax) / ymax

    if times:
        t_lo, t_hi = min(times), max(times)
        if t_hi - t_lo < timedelta(seconds=2):
            t_lo, t_hi = t_lo - timedelta(seconds=1), t_hi + timedelta(seconds=1)
        pad = (t_hi - t_lo) * 0.04
        t_lo, t_hi = t_lo - pad, t_hi + pad
        span = (t_hi - t_lo).total_seconds()

        def xpos(when: datetime) -> float:
            return x0 + (x1 - x0) * (when - t_lo).total_seconds() / span
    out = [head, f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="#fafafa" stroke="#ccc"/>']
    step = _nice_step(ymax)
    v = 0.0
    while v <= ymax + 1e-12:
        y = ypos(v)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#e6e6e6"/>'
                   f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{_num(round(v, 12))}</text>')
        v += step
    out.append(f'<text x="14" y="{(y0 + y1) / 2:.0f}" transform="rotate(-90 14 {(y0 + y1) / 2:.0f})" '
               f'text-anchor="middle">ε at δ = {_num(s.budget_delta)}</text>')
    if times:
        shown = set()
        for k in range(5):
            when = t_lo + (t_hi - t_lo) * (0.5 + k) / 5
            x, text = xpos(when), _time_label(when, t_hi - t_lo)
            if text in shown:
                continue
            shown.add(text)
            out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 4}" stroke="#999"/>'
                       f'<text x="{x:.1f}" y="{y0 + 17}" text-anchor="middle">'
                       f"{_esc(text)}</text>")
        out.append(f'<text x="{(x0 + x1) / 2:.0f}" y="{_H - 6}" text-anchor="middle">time (UTC)</text>')
    # the budget line
    yb = ypos(s.budget_epsilon)
    out.append(f'<line class="budget-line" x1="{x0}" y1="{yb:.1f}" x2="{x1}" y2="{yb:.1f}" '
               f'stroke="{BUDGET_COLOUR}" stroke-width="2" stroke-dasharray="8 4" data-epsilon="{s.budget_epsilon!r}"/>'
               f'<text x="{x1 - 4}" y="{yb - 5:.1f}" text-anchor="end" fill="{BUDGET_COLOUR}">'
               f"budget ε = {_num(s.budget_epsilon)}</text>")
    if t.points:
        pts = [(xpos(_parse_time(p.published_at) or t_lo), ypos(p.epsilon)) for p in t.points]
        line = [(x0, y0)]
        prev = y0
        for p, (x, y) in zip(t.points, pts):
            x_step = xpos(_parse_time(p.first_published_at) or t_lo) if p.commits > 1 else x
            line += [(x_step, prev), (x_step, y)]
            prev = y
        out.append(f'<polyline class="spend-line" fill="none" stroke="{SPEND_COLOUR}" stroke-width="3" '
                   f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in line)}"/>')
        for p, (x, y) in zip(t.points, pts):
            since = f" ({p.commits} releases since the previous point)" if p.commits > 1 else ""
            out.append(f'<circle class="spend-point" cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{SPEND_COLOUR}" '
                       f'data-epsilon="{p.epsilon!r}" data-entry-id="{_esc(p.entry_id)}" '
                       f'data-commits="{p.commits}"><title>published {_time(p.published_at)} UTC: composed '
                       f"ε = {_up(p.epsilon)}{since} (entry {_esc(p.entry_id)})</title></circle>")
        last_x, last_y = pts[-1]
    else:
        out.append(f'<text class="no-commits" x="{(x0 + x1) / 2:.0f}" y="{(y0 + y1) / 2:.0f}" '
                   'text-anchor="middle">no committed release yet</text>')
        last_x, last_y = x0, y0
    if pending and times:
        when = max(x for x in (_parse_time(e["created_at"]) for e in pending) if x is not None)
        xc, yc = max(xpos(when), last_x), ypos(s.spent_epsilon)
        out.append(f'<polyline class="counted-line" fill="none" stroke="{COUNTED_COLOUR}" stroke-width="2" '
                   f'stroke-dasharray="4 3" points="{last_x:.1f},{last_y:.1f} {xc:.1f},{last_y:.1f} '
                   f'{xc:.1f},{yc:.1f}"/>'
                   f'<circle class="counted-point" cx="{xc:.1f}" cy="{yc:.1f}" r="4" fill="{COUNTED_COLOUR}" '
                   f'data-epsilon="{s.spent_epsilon!r}"><title>counted now, with {len(pending)} reserved or '
                   f"unfinished release(s): ε = {_up(s.spent_epsilon)}</title></circle>")
    # legend
    ly = _TOP - 8
    out.append(f'<line x1="{x0}" y1="{ly}" x2="{x0 + 22}" y2="{ly}" stroke="{SPEND_COLOUR}" stroke-width="3"/>'
               f'<text x="{x0 + 28}" y="{ly + 4}">composed spend after each committed release</text>')
    if pending:
        out.append(f'<line x1="{x0 + 330}" y1="{ly}" x2="{x0 + 352}" y2="{ly}" stroke="{COUNTED_COLOUR}" '
                   f'stroke-width="2" stroke-dasharray="4 3"/><text x="{x0 + 358}" y="{ly + 4}">'
                   "counted now, with reserved or unfinished releases</text>")
    out.append("</svg>")
    return "\n".join(out)


def _plot_x() -> tuple[int, int]:
    return _LEFT, _W - _RIGHT



def _window_chart(cid: str, s, points: list) -> str:
    """The composed spend of the budget's window over time (a step line), the budget line, the spends' points."""
    what = "privacy unit" if isinstance(s, UnitStatus) else "table"
    name = s.unit if isinstance(s, UnitStatus) else s.table_id
    label = (f"Composed spend of {what} {_esc(name)} in its window ({_esc(_window_text(s.window))}) over time, "
             f"with the budget epsilon {_num(s.budget_epsilon)}")
    spends = [p for p in points if p.entry_id is not None]
    head = (f'<svg class="chart window-chart" id="chart-{_esc(cid)}" role="img" aria-label="{label}" '
            f'viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" xmlns="http://www.w3.org/2000/svg" '
            f'data-window="{_esc(s.window)}" data-points="{len(points)}" data-spends="{len(spends)}">'
            f"<title>{label}</title>")
    times = [t for t in (_parse_time(p.at) for p in points) if t is not None]
    finite = [p.epsilon for p in points if math.isfinite(p.epsilon)]
    ymax = max([s.budget_epsilon, *finite]) * 1.1
    x0, x1 = _plot_x()
    y0, y1 = _H - _BOTTOM, _TOP

    def ypos(v: float) -> float:
        return y1 if not math.isfinite(v) else y0 - (y0 - y1) * min(v, ymax) / ymax

    out = [head, f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="#fafafa" stroke="#ccc"/>']
    step = _nice_step(ymax)
    v = 0.0
    while v <= ymax + 1e-12:
        y = ypos(v)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#e6e6e6"/>'
                   f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{_num(round(v, 12))}</text>')
        v += step
    out.append(f'<text x="14" y="{(y0 + y1) / 2:.0f}" transform="rotate(-90 14 {(y0 + y1) / 2:.0f})" '
               f'text-anchor="middle">ε in the window at δ = {_num(s.budget_delta)}</text>')
    yb = ypos(s.budget_epsilon)
    out.append(f'<line class="budget-line" x1="{x0}" y1="{yb:.1f}" x2="{x1}" y2="{yb:.1f}" '
               f'stroke="{BUDGET_COLOUR}" stroke-width="2" stroke-dasharray="8 4" data-epsilon="{s.budget_epsilon!r}"/>'
               f'<text x="{x1 - 4}" y="{yb - 5:.1f}" text-anchor="end" fill="{BUDGET_COLOUR}">'
               f"budget ε = {_num(s.budget_epsilon)} {_esc(_window_text(s.window))}</text>")
    if not times:
        out.append(f'<text class="no-commits" x="{(x0 + x1) / 2:.0f}" y="{(y0 + y1) / 2:.0f}" '
                   'text-anchor="middle">no counted release yet</text></svg>')
        return "\n".join(out)
    t_lo, t_hi = min(times), max(times)
    if t_hi - t_lo < timedelta(seconds=2):
        t_lo, t_hi = t_lo - timedelta(seconds=1), t_hi + timedelta(seconds=1)
    pad = (t_hi - t_lo) * 0.04
    t_lo, t_hi = t_lo - pad, t_hi + pad
    span = (t_hi - t_lo).total_seconds()

    def xpos(when: datetime) -> float:
        return x0 + (x1 - x0) * (when - t_lo).total_seconds() / span

    shown = set()
    for k in range(5):
        when = t_lo + (t_hi - t_lo) * (0.5 + k) / 5
        x, text = xpos(when), _time_label(when, t_hi - t_lo)
        if text in shown:
            continue
        shown.add(text)
        out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 4}" stroke="#999"/>'
                   f'<text x="{x:.1f}" y="{y0 + 17}" text-anchor="middle">{_esc(text)}</text>')
    out.append(f'<text x="{(x0 + x1) / 2:.0f}" y="{_H - 6}" text-anchor="middle">time (UTC)</text>')
    line, prev = [], y0
    for p in points:  # the spend holds until the next change: a step at each point
        x, y = xpos(_parse_time(p.at)), ypos(p.epsilon)
        line += [(x, prev), (x, y)]
        prev = y
    counted = sum(1 for e in s.entries if e["state"] in COUNTED_STATES)
    out.append(f'<polyline class="spend-line window-line" fill="none" stroke="{SPEND_COLOUR}" stroke-width="3" '
               f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in line)}"/>')
    for p in spends:
        x, y = xpos(_parse_time(p.at)), ypos(p.epsilon)
        out.append(f'<circle class="window-point" cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{SPEND_COLOUR}" '
                   f'data-epsilon="{p.epsilon!r}" data-entry-id="{_esc(p.entry_id)}" data-at="{_esc(p.at)}">'
                   f"<title>{_time(p.at)} UTC: composed ε in the window = {_up(p.epsilon)} (entry "
                   f"{_esc(p.entry_id)})</title></circle>")
    ly = _TOP - 8
    out.append(f'<line x1="{x0}" y1="{ly}" x2="{x0 + 22}" y2="{ly}" stroke="{SPEND_COLOUR}" stroke-width="3"/>'
               f'<text x="{x0 + 28}" y="{ly + 4}">composed spend of the window ending at each moment (counted '
               "releases)</text></svg>")
    if len(spends) < counted:
        out.append(f'<p class="note thinned">{counted} counted releases: the chart shows the window\'s spend at the '
                   f"last {len(points)} moments it changed.</p>")
    return "\n".join(out)
