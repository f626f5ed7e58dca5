"""The HTML ledger report (sparkpriv.ledger.report), on both backends (``ledger_url``).

The page is parsed with the standard library's HTML parser (the browser test,
test_report_browser.py, renders it in headless Chromium). Expected numbers come
from closed forms, never from the ledger: Laplace releases compose to the sum
of their pure epsilons; Gaussian releases with multipliers ``z_i`` compose to
one Gaussian with ``1 / z**2 = sum 1 / z_i**2``, whose epsilon at ``delta``
solves Balle & Wang's exact ``delta(eps)`` (written here with scipy's normal
CDF, independently of sparkpriv).
"""

from __future__ import annotations

import html.parser
import math
import os
import re
from datetime import datetime, timezone

import pytest
from dp_accounting import dp_event as ev
from scipy.optimize import brentq
from scipy.stats import norm

from sparkpriv.errors import BudgetExceededError, LedgerError
from sparkpriv.ledger import open_ledger
from sparkpriv.ledger.report import render_report, write_report
from tests.ledger.test_ledger import cli, run_python

GAUSS_TABLE = "cdr.daily_towers"
LAPLACE_TABLE = "census/adult:v2"
EMPTY_TABLE = "empty.table-1"
GAUSS_DELTA = 1e-6
GAUSS_Z = (4.0, 5.0, 6.0)  # committed, in this order
PENDING_Z = 8.0  # the aborted, the running and the killed (unfinished) release each
LAPLACE_EPS = (0.25, 0.25)
INJECTED_PATH = '/data/out/<script>alert("path")</script><img src=x onerror=alert(1)>'
INJECTED_REASON = 'publishing failed: "><b id="bold">disk full</b> & <!-- -->'
INJECTED_MECHANISM = "dprp<i>x</i>"

KILLED_JOB = """
    import os, sys
    from dp_accounting import dp_event as ev
    from sparkpriv.ledger import open_ledger
    ledger = open_ledger(sys.argv[1])
    res = ledger.reserve("cdr.daily_towers", event=ev.GaussianDpEvent(8.0), mechanism="projection",
                         parameters={}, output_path="s3://bucket/cdr/killed")
    print(res.id, flush=True)
    os._exit(9)  # killed hard: no commit, no abort
"""


def gaussian_epsilon(z: float, delta: float) -> float:
    """Exact epsilon at ``delta`` of the Gaussian mechanism with sigma / sensitivity ``z`` (Balle & Wang, Thm 8)."""
    def delta_of(eps: float) -> float:
        return norm.cdf(1 / (2 * z) - eps * z) - math.exp(eps) * norm.cdf(-1 / (2 * z) - eps * z)

    return brentq(lambda e: delta_of(e) - delta, 1e-9, 100.0, xtol=1e-13)


def composed_gaussian(zs) -> float:
    return gaussian_epsilon(1.0 / math.sqrt(sum(1.0 / z**2 for z in zs)), GAUSS_DELTA)


def make_ledger(url: str, *, killed: bool = True) -> dict:
    """Three tables with releases in every state; returns what the report must show (closed forms)."""
    ids: dict = {}
    with open_ledger(url) as ledger:
        ledger.set_budget(GAUSS_TABLE, epsilon=6.0, delta=GAUSS_DELTA)
        ledger.set_budget(LAPLACE_TABLE, epsilon=1.0, delta=0.0)
        ledger.set_budget(EMPTY_TABLE, epsilon=2.0, delta=1e-5)
        ids["committed"] = []
        for day, z in enumerate(GAUSS_Z):
            r = ledger.reserve(GAUSS_TABLE, event=ev.GaussianDpEvent(z), mechanism="projection",
                               parameters={"k": 64}, output_path=f"s3://bucket/cdr/2026-11-{20 + day}")
            # the receipt states the release at its own delta (1e-7), not the budget's
            ledger.commit(r.id, receipt_summary={"epsilon": round(gaussian_epsilon(z, 1e-7), 4), "delta": 1e-7})
            ids["committed"].append(r.id)
        r = ledger.reserve(GAUSS_TABLE, event=ev.GaussianDpEvent(PENDING_Z), mechanism="projection",
                           parameters={}, output_path="s3://bucket/cdr/failed")
        ledger.abort(r.id, reason=INJECTED_REASON)
        ids["aborted"] = r.id
        ids["running"] = ledger.reserve(GAUSS_TABLE, event=ev.GaussianDpEvent(PENDING_Z), mechanism="kmeans",
                                        parameters={}, output_path="s3://bucket/cdr/running").id
        for eps in LAPLACE_EPS:
            r = ledger.reserve(LAPLACE_TABLE, event=ev.LaplaceDpEvent(1 / eps), mechanism=INJECTED_MECHANISM,
                               parameters={}, output_path=INJECTED_PATH)
            ledger.commit(r.id, receipt_summary={"epsilon": eps, "delta": 0.0})
    if killed:
        job = run_python(KILLED_JOB, url)
        assert job.returncode == 9, job.stderr
        ids["unfinished"] = job.stdout.strip()
    counted = [*GAUSS_Z, PENDING_Z] + ([PENDING_Z] if killed else [])
    gauss_spent = composed_gaussian(counted)
    return {
        "ids": ids,
        GAUSS_TABLE: {"budget": (6.0, GAUSS_DELTA), "points": [composed_gaussian(GAUSS_Z[:i + 1]) for i in range(3)],
                      "spent": gauss_spent, "remaining": 6.0 - gauss_spent},
        LAPLACE_TABLE: {"budget": (1.0, 0.0), "points": [0.25, 0.5], "spent": 0.5, "remaining": 0.5},
        EMPTY_TABLE: {"budget": (2.0, 1e-5), "points": [], "spent": 0.0, "remaining": 2.0},
    }


class Page(html.parser.HTMLParser):
    """The parsed page: every element (tag, attributes, text inside it), in document order."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[dict] = []
        self._open: list[dict] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, "attrs": dict(attrs), "text": []}
        self.elements.append(el)
        if tag not in ("meta", "br", "img", "input", "link", "circle", "line", "rect", "polyline"):
            self._open.append(el)

    def handle_startendtag(self, tag, attrs):
        self.elements.append({"tag": tag, "attrs": dict(attrs), "text": []})

    def handle_endtag(self, tag):
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i]["tag"] == tag:
                del self._open[i:]
                break

    def handle_data(self, data):
        for el in self._open:
            el["text"].append(data)

    def find(self, tag=None, **attrs) -> list[dict]:
        def has(el, key, value):
            got = el["attrs"].get(key.replace("_", "-") if key != "class_" else "class")
            if key == "class_":
                return got is not None and value in got.split()
            return got == value

        return [el for el in self.elements
                if (tag is None or el["tag"] == tag) and all(has(el, k, v) for k, v in attrs.items())]

    @staticmethod
    def text(el) -> str:
        return re.sub(r"\s+", " ", "".join(el["text"])).strip()

    def section(self, table_id: str) -> "Page":
        """The sub-page of one table's section."""
        (start,) = [i for i, el in enumerate(self.elements)
                    if el["tag"] == "section" and el["attrs"].get("data-table-id") == table_id]
        sub = Page("")
        end = next((i for i in range(start + 1, len(self.elements)) if self.elements[i]["tag"] == "section"),
                   len(self.elements))
        sub.elements = self.elements[start:end]
        return sub


def check_page(page: Page, expected: dict) -> None:
    """What a privacy officer must read on the page (shared with the browser test, on the rendered DOM)."""
    ids = expected["ids"]
    summary = [el["attrs"]["data-table-id"] for el in page.find("tr") if "data-table-id" in el["attrs"]]
    assert summary == sorted([GAUSS_TABLE, LAPLACE_TABLE, EMPTY_TABLE])
    for table_id in (GAUSS_TABLE, LAPLACE_TABLE, EMPTY_TABLE):
        want = expected[table_id]
        sec = page.section(table_id)
        assert [Page.text(el) for el in sec.find(class_="table-id")] == [table_id]
        figures = {el["attrs"]["data-figure"]: Page.text(el) for el in sec.find(tag="div")
                   if "data-figure" in el["attrs"]}
        eps, delta = want["budget"]
        assert figures["budget"] == f"ε = {eps:.6g}, δ = {delta:.6g}"
        # shown to 6 digits, spent rounded up and remaining down
        assert want["spent"] <= _number(figures["spent"]) <= want["spent"] * (1 + 1e-5) + 1e-12
        assert want["remaining"] * (1 - 1e-5) - 1e-12 <= _number(figures["remaining"]) <= want["remaining"]
        # the chart: one point per committed release at the closed-form composed epsilon, the budget line
        (svg,) = sec.find("svg", class_="chart")
        assert int(svg["attrs"]["data-commits"]) == len(want["points"])
        points = sec.find("circle", class_="spend-point")
        assert [float(p["attrs"]["data-epsilon"]) for p in points] == pytest.approx(want["points"], rel=1e-6)
        (budget_line,) = sec.find("line", class_="budget-line")
        assert float(budget_line["attrs"]["data-epsilon"]) == eps
        lines = sec.find("polyline", class_="spend-line")
        if want["points"]:
            (line,) = lines
            xy = [tuple(map(float, p.split(","))) for p in line["attrs"]["points"].split()]
            assert len(xy) == 2 * len(want["points"]) + 1  # from 0, a step up at each committed release
            ys = [y for _, y in xy]
            assert ys == sorted(ys, reverse=True)  # the spend never goes down (SVG's y grows downwards)
            assert [(x, y) for x, y in xy[2::2]] == [(float(p["attrs"]["cx"]), float(p["attrs"]["cy"]))
                                                    for p in points]
        else:
            assert lines == [] and [Page.text(el) for el in sec.find(class_="no-commits")] \
                == ["no committed release yet"]
    # the releases of the Gaussian table: state, receipt guarantee, mechanism, output
    rows = {el["attrs"]["data-entry-id"]: el for el in page.section(GAUSS_TABLE).find("tr", class_="entry")}
    committed = ids["committed"]
    expect_ids = [*committed, ids["aborted"], ids["running"]] + ([ids["unfinished"]] if "unfinished" in ids else [])
    assert list(rows) == expect_ids
    sec = page.section(GAUSS_TABLE)
    for n, entry_id in enumerate(committed):
        (guarantee,) = [Page.text(el) for el in sec.find("td", class_="guarantee")][n:n + 1]
        assert guarantee == f"ε = {round(gaussian_epsilon(GAUSS_Z[n], 1e-7), 4):.6g}, δ = 1e-07"
    states = [Page.text(el) for el in sec.find("span", class_="state")]
    assert states[:5] == ["committed"] * 3 + ["aborted", "reserved (job running)"]
    if "unfinished" in ids:
        assert states[5] == "unfinished (job gone, still counted)"
        assert [float(c["attrs"]["data-epsilon"]) for c in sec.find("circle", class_="counted-point")] \
            == pytest.approx([expected[GAUSS_TABLE]["spent"]], rel=1e-6)
    assert [Page.text(el) for el in sec.find(class_="reason")] == [INJECTED_REASON]
    assert [Page.text(el) for el in sec.find("td", class_="path")][:3] == [
        f"s3://bucket/cdr/2026-11-{20 + d}" for d in range(3)]
    lap = page.section(LAPLACE_TABLE)
    assert [Page.text(el) for el in lap.find("td", class_="path")] == [INJECTED_PATH] * 2
    assert [Page.text(el) for el in lap.find("td", class_="guarantee")] == ["ε = 0.25, δ = 0"] * 2
    assert [Page.text(el) for el in page.section(EMPTY_TABLE).find(class_="no-releases")] == ["No releases yet."]
    # nothing stored in the ledger became markup
    assert not page.find("script") and not page.find("img") and not page.find("b") and not page.find("i")


def _number(figure: str) -> float:
    return float(re.fullmatch(r"ε = (\S+)", figure).group(1))


# -- tests --------------------------------------------------------------------------------


def test_report_shows_budget_spend_chart_and_releases(ledger_url, tmp_path):
    expected = make_ledger(ledger_url)
    out = tmp_path / "report.html"
    with open_ledger(ledger_url, read_only=True) as ledger:
        result = write_report(ledger, out)
    assert result.tables == sorted([GAUSS_TABLE, LAPLACE_TABLE, EMPTY_TABLE]) and result.errors == []
    check_page(Page(out.read_text(encoding="utf-8")), expected)


def test_report_spent_is_the_ledgers_composition_not_a_sum(ledger_url):
    """Three Gaussian releases compose to far less than the sum of their epsilons; the report shows the former."""
    expected = make_ledger(ledger_url, killed=False)
    with open_ledger(ledger_url, read_only=True) as ledger:
        text, tables, _ = render_report(ledger, [GAUSS_TABLE])
        status = ledger.status(GAUSS_TABLE)
    page = Page(text)
    points = [float(p["attrs"]["data-epsilon"]) for p in page.find("circle", class_="spend-point")]
    sum_of_own = sum(gaussian_epsilon(z, GAUSS_DELTA) for z in GAUSS_Z)
    assert points[-1] == pytest.approx(composed_gaussian(GAUSS_Z), rel=1e-6) and points[-1] < 0.8 * sum_of_own
    (spent,) = page.find(data_figure="spent")
    assert float(spent["attrs"]["data-value"]) == status.spent_epsilon
    assert _number(Page.text(spent)) == pytest.approx(status.spent_epsilon, rel=1e-5)
    assert status.spent_epsilon == pytest.approx(expected[GAUSS_TABLE]["spent"], rel=1e-6)
    assert [t.status.table_id for t in tables] == [GAUSS_TABLE]


def test_every_ledger_string_is_escaped(tmp_path):
    """Paths, reasons and mechanism names are text on the page, never markup (fails if escaping is removed)."""
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    make_ledger(url, killed=False)
    text, _, _ = render_report(open_ledger(url, read_only=True))
    page = Page(text)
    for tag in ("script", "img", "b", "i"):
        assert page.find(tag) == [], tag
    assert "<script>" not in text and "<img" not in text and "<b " not in text and "<!-- -->" not in text
    assert "&lt;script&gt;alert(&quot;path&quot;)&lt;/script&gt;" in text
    # attribute values cannot be closed early either
    assert not any(key.startswith("on") for el in page.elements for key in el["attrs"])
    assert {Page.text(el) for el in page.find("td") if "<i>" in Page.text(el)} == {INJECTED_MECHANISM}


def test_control_characters_and_newlines_are_shown_escaped(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    with open_ledger(url) as ledger:
        ledger.set_budget("t", epsilon=1.0, delta=0.0)
        r = ledger.reserve("t", event=ev.LaplaceDpEvent(4.0), mechanism="m", parameters={},
                           output_path="/out/a\nfake row\x1b[31m")
        ledger.abort(r.id, reason="line1\nline2")
        text, _, _ = render_report(ledger)
    page = Page(text)
    assert [Page.text(el) for el in page.find("td", class_="path")] == ["/out/a\\nfake row\\x1b[31m"]
    assert [Page.text(el) for el in page.find(class_="reason")] == ["line1\\nline2"]


def test_page_is_self_contained(ledger_url):
    make_ledger(ledger_url, killed=False)
    with open_ledger(ledger_url, read_only=True) as ledger:
        text, _, _ = render_report(ledger)
    page = Page(text)
    (csp,) = page.find("meta", http_equiv="Content-Security-Policy")
    assert "default-src 'none'" in csp["attrs"]["content"]
    assert not page.find("link") and not page.find("script") and not page.find("iframe")
    for el in page.elements:
        for key in ("src", "href", "srcset", "data", "action"):
            value = el["attrs"].get(key)
            assert value is None or value.startswith("#"), (el["tag"], key, value)
    # the only URL is the SVG namespace (an identifier, never fetched)
    assert set(re.findall(r"https?://[^\s\"'<>]+", text)) == {"http://www.w3.org/2000/svg"}
    assert "@import" not in text and "url(" not in text


def test_no_tables_and_unreadable_tables(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    with open_ledger(url) as ledger:
        ledger.tables()
    text, tables, errors = render_report(open_ledger(url, read_only=True))
    assert tables == [] and errors == [] and Page(text).find(id="no-tables")
    with open_ledger(url) as ledger:
        ledger.set_budget("ok.table", epsilon=1.0, delta=0.0)
        ledger.set_budget("bad.table", epsilon=1.0, delta=0.0)
        r = ledger.reserve("bad.table", event=ev.LaplaceDpEvent(4.0), mechanism="m", parameters={},
                           output_path="/out")
    import sqlite3

    with sqlite3.connect(f"{tmp_path}/ledger.sqlite") as conn:  # a hand-edited, corrupt entry
        conn.execute("UPDATE sparkpriv_releases SET events = '{\"class_name\": \"<b>x</b>\"}' WHERE id = ?",
                     (r.id,))
    result = write_report(url, tmp_path / "r.html")
    assert result.tables == ["ok.table"] and len(result.errors) == 1 and result.exit_code == 1
    assert isinstance(result.errors[0], LedgerError)
    page = Page((tmp_path / "r.html").read_text(encoding="utf-8"))
    (err,) = page.find("div", class_="error")
    assert "bad.table" in Page.text(err) and "corrupt" in Page.text(err) and not page.find("b")


def test_cli_writes_the_report(ledger_url, tmp_path, capsys):
    expected = make_ledger(ledger_url, killed=False)
    out = tmp_path / "report.html"
    assert cli("ledger", "report", "--ledger", ledger_url, "--output", str(out)) == 0
    said = capsys.readouterr().out
    assert "Report of 3 table(s)" in said and str(out) in said
    page = Page(out.read_text(encoding="utf-8"))
    assert {el["attrs"]["data-table-id"] for el in page.find("section")} == {GAUSS_TABLE, LAPLACE_TABLE, EMPTY_TABLE}
    assert cli("ledger", "report", "--ledger", ledger_url, "-o", str(out), "--table-id", LAPLACE_TABLE,
               "--table-id", EMPTY_TABLE) == 0
    page = Page(out.read_text(encoding="utf-8"))
    assert [el["attrs"]["data-table-id"] for el in page.find("section")] == [LAPLACE_TABLE, EMPTY_TABLE]
    assert [float(p["attrs"]["data-epsilon"]) for p in page.find("circle", class_="spend-point")] \
        == pytest.approx(expected[LAPLACE_TABLE]["points"], abs=1e-12)
    # a table without a budget: listed on the page and stderr, exit code 1
    assert cli("ledger", "report", "--ledger", ledger_url, "-o", str(out), "--table-id", "no.such") == 1
    assert "No privacy budget is set for table 'no.such'" in capsys.readouterr().err


def test_write_is_atomic_and_refuses_bad_paths(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    with open_ledger(url) as ledger:
        ledger.set_budget("t", epsilon=1.0, delta=0.0)
    out = tmp_path / "report.html"
    out.write_text("old")
    write_report(url, out, generated_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
    assert "2026-01-02 03:04:05 UTC" in out.read_text(encoding="utf-8")
    assert sorted(os.listdir(tmp_path)) == sorted(p for p in os.listdir(tmp_path) if not p.startswith(".sparkpriv"))
    assert cli("ledger", "report", "--ledger", url, "-o", str(tmp_path / "missing" / "r.html")) == 2
    assert cli("ledger", "report", "--ledger", url, "-o", str(tmp_path)) == 2
    assert not (tmp_path / "missing").exists()
    # a ledger that does not exist is not created by a report
    assert cli("ledger", "report", "--ledger", f"sqlite:///{tmp_path}/none.sqlite", "-o", str(out)) == 1
    assert not (tmp_path / "none.sqlite").exists()


def test_long_history_is_composed_at_fewer_points_never_understating(monkeypatch, tmp_path):
    """With more committed releases than MAX_COMPOSED_POINTS, the chart composes at evenly spaced ones
    (the last included) and steps up to each point's value at the first release after the previous point."""
    import sparkpriv.ledger.report as report

    monkeypatch.setattr(report, "MAX_COMPOSED_POINTS", 3)
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    with open_ledger(url) as ledger:
        ledger.set_budget("t", epsilon=2.0, delta=0.0)
        ids = []
        for _ in range(7):
            r = ledger.reserve("t", event=ev.LaplaceDpEvent(8.0), mechanism="m", parameters={}, output_path="/o")
            ledger.commit(r.id)
            ids.append(r.id)
        text, (table,), _ = render_report(ledger)
    # ceil(7 / 3) - 1, ceil(14 / 3) - 1, 6: the 3rd, 5th and 7th release
    assert [(p.entry_id, p.commits) for p in table.points] == [(ids[2], 3), (ids[4], 2), (ids[6], 2)]
    assert [p.epsilon for p in table.points] == [3 / 8, 5 / 8, 7 / 8]  # pure Laplace: exact sums
    page = Page(text)
    (svg,) = page.find("svg", class_="chart")
    assert (svg["attrs"]["data-commits"], svg["attrs"]["data-points"]) == ("7", "3")
    circles = page.find("circle", class_="spend-point")
    assert [float(c["attrs"]["data-epsilon"]) for c in circles] == [3 / 8, 5 / 8, 7 / 8]
    (line,) = page.find("polyline", class_="spend-line")
    xy = [tuple(map(float, p.split(","))) for p in line["attrs"]["points"].split()]
    assert len(xy) == 7 and [y for _, y in xy] == sorted((y for _, y in xy), reverse=True)
    # each step up happens at or before its point (x of the step <= x of the circle), at the point's height
    for (x_step, y_step), c in zip(xy[2::2], circles):
        assert x_step <= float(c["attrs"]["cx"]) and y_step == float(c["attrs"]["cy"])
    assert page.find("p", class_="thinned")


def test_budget_lowered_below_the_spend_and_infinite_spend(tmp_path):
    """A budget lowered after releases shows the overspend; a Gaussian spend at a budget delta of 0 is infinite."""
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    with open_ledger(url) as ledger:
        ledger.set_budget("lowered", epsilon=1.0, delta=0.0)
        ledger.set_budget("gauss", epsilon=5.0, delta=1e-6)
        for eps in (0.5, 0.25):
            ledger.commit(ledger.reserve("lowered", event=ev.LaplaceDpEvent(1 / eps), mechanism="m", parameters={},
                                         output_path="/o").id)
        ledger.commit(ledger.reserve("gauss", event=ev.GaussianDpEvent(4.0), mechanism="m", parameters={},
                                     output_path="/o").id)
        ledger.set_budget("lowered", epsilon=0.5, delta=0.0)
        ledger.set_budget("gauss", epsilon=5.0, delta=0.0)  # a Gaussian release has no epsilon at delta 0
        text, _, _ = render_report(ledger)
    page = Page(text)
    low = page.section("lowered")
    assert low.find("p", class_="over")
    (spent,) = low.find(data_figure="spent")
    assert Page.text(spent) == "ε = 0.75" and "over" in spent["attrs"]["class"].split()
    assert [Page.text(el) for el in low.find(data_figure="remaining")] == ["ε = 0"]
    gauss = page.section("gauss")
    assert [Page.text(el) for el in gauss.find(data_figure="spent")] == ["ε = ∞"]
    assert [Page.text(el) for el in gauss.find(data_figure="remaining")] == ["ε = 0"]
    (point,) = gauss.find("circle", class_="spend-point")
    assert math.isinf(float(point["attrs"]["data-epsilon"]))
    (plot,) = gauss.find("rect")
    assert float(point["attrs"]["cy"]) == float(plot["attrs"]["y"])  # drawn at the top of the plot, not off it


def test_real_command_line(tmp_path):
    """`sparkpriv ledger report` through the package's entry point (python -m sparkpriv.cli)."""
    import subprocess
    import sys

    from tests.ledger.test_ledger import ROOT

    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    with open_ledger(url) as ledger:
        ledger.set_budget("t", epsilon=1.0, delta=0.0)
        ledger.commit(ledger.reserve("t", event=ev.LaplaceDpEvent(4.0), mechanism="m", parameters={},
                                     output_path="/o").id)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               SPARKPRIV_LEDGER=url)
    r = subprocess.run([sys.executable, "-m", "sparkpriv.cli", "ledger", "report", "--output", "r.html"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"Report of 1 table(s) of ledger {url} written to r.html\n"
    page = Page((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert [float(c["attrs"]["data-epsilon"]) for c in page.find("circle", class_="spend-point")] == [0.25]
    left = set(os.listdir(tmp_path)) - {"ledger.sqlite", "ledger.sqlite-shm", "ledger.sqlite-wal", "r.html"}
    assert left == set()  # no temporary file, no spark-warehouse: the report needs no Spark


# -- units, windows, the journal and the history ------------------------------------------------

UNIT_DAYS = 7
#: (day, table, epsilon, fate) of a week-windowed unit over cdr.*; epsilons exact in binary
UNIT_SCHEDULE = ((0, "cdr.calls", 0.5, "commit"), (2, "cdr.sms", 0.25, "commit"), (5, "cdr.calls", 0.5, "abort"),
                 (8, "cdr.sms", 0.5, "commit"), (9, "cdr.calls", 1.0, "reserve"), (9.5, "cdr.sms", 1.0, "refused"))


def make_unit_ledger(url: str, monkeypatch) -> dict:
    """A privacy unit with a 7-day window and a table with a monthly one, on a replaced clock."""
    from datetime import timedelta

    import sparkpriv.ledger.base as ledger_base

    start = datetime(2026, 3, 1, 6, tzinfo=timezone.utc)
    now = [start]
    monkeypatch.setattr(ledger_base, "_clock", lambda: now[0])
    ids = {}
    with open_ledger(url) as ledger:
        ledger.set_unit("subscribers", tables="cdr.*", epsilon=2.0, delta=0.0, window=f"{UNIT_DAYS}d",
                        reason="the same subscribers <b>")
        ledger.set_budget("cdr.calls", epsilon=1.75, delta=0.0, window="month", reason="policy 12")
        for day, table, eps, fate in UNIT_SCHEDULE:
            now[0] = start + timedelta(days=day)
            if fate == "refused":
                with pytest.raises(BudgetExceededError):
                    ledger.reserve(table, event=ev.LaplaceDpEvent(1 / eps), mechanism="m", parameters={},
                                   output_path="/o")
                continue
            r = ledger.reserve(table, event=ev.LaplaceDpEvent(1 / eps), mechanism="m", parameters={},
                               output_path=f"/o/{day}")
            ids[day] = r.id
            if fate == "commit":
                ledger.commit(r.id)
            elif fate == "abort":
                ledger.abort(r.id, reason="executor lost")
        now[0] = start + timedelta(days=10)
    counted = [(start + timedelta(days=d), eps) for d, _, eps, fate in UNIT_SCHEDULE if fate in ("commit", "reserve")]
    # the reference: the spend of the 7 days up to each counted release's time (exact sums)
    window = [sum(e for u, e in counted if t - timedelta(days=UNIT_DAYS) < u <= t) for t, _ in counted]
    return {"ids": ids, "window": window, "now": now[0], "start": start}


def test_report_shows_units_windows_the_journal_and_the_history(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    expected = make_unit_ledger(url, monkeypatch)
    assert expected["window"] == [0.5, 0.75, 0.75, 1.5]  # the spend of day 2 leaves the window on day 9
    with open_ledger(url, read_only=True) as ledger:
        text, tables, _ = render_report(ledger)
        head = ledger.head()
    page = Page(text)
    (verdict,) = page.find("p", class_="verdict")
    assert verdict["attrs"]["data-chain"] == "ok" and Page.text(verdict).startswith("Intact.")
    assert [Page.text(el) for el in page.find(id="journal-head")] == [head]
    (unit_row,) = page.find("tr", data_unit="subscribers")
    assert [Page.text(td) for td in unit_row_cells(page, unit_row)][1:3] == ["cdr.*", "per 7 days"]
    (unit,) = page.find("section", class_="ledger-unit")
    sec = section_of(page, unit)
    figures = {el["attrs"]["data-figure"]: Page.text(el) for el in sec.find(tag="div") if "data-figure" in el["attrs"]}
    assert figures["budget"] == "ε = 2, δ = 0, per 7 days"
    assert figures["spent"] == "ε = 1.5"  # day 8 and day 9, at day 10
    (chart,) = sec.find("svg", class_="window-chart")
    points = sec.find("circle", class_="window-point")
    assert [float(p["attrs"]["data-epsilon"]) for p in points] == expected["window"]
    (line,) = sec.find("polyline", class_="spend-line")
    xy = [tuple(map(float, p.split(","))) for p in line["attrs"]["points"].split()]
    assert [x for x, _ in xy] == sorted(x for x, _ in xy)  # time runs left to right
    assert max(y for _, y in xy) > min(y for _, y in xy)
    ys = [y for _, y in xy]
    assert any(b > a for a, b in zip(ys, ys[1:])), "the window's spend goes down when spends leave it"
    assert {Page.text(td) for td in sec.find("td", class_="path")} >= {"cdr.calls", "cdr.sms"}
    # the table with a monthly window: its own chart of the month's spend
    (calls,) = [t for t in tables if t.status.table_id == "cdr.calls"]
    tsec = page.section("cdr.calls")
    assert [float(p["attrs"]["data-epsilon"]) for p in tsec.find("circle", class_="window-point")] == [0.5, 1.5]
    assert "privacy unit(s) subscribers" in Page.text(tsec.find("p", class_="covers")[0])
    # the history: budget changes with who and why, the abort, the refusal; stored text escaped
    records = {el["attrs"]["data-kind"]: el for el in page.find("tr", class_="record")}
    assert set(records) == {"genesis", "unit", "budget", "abort", "refuse"}
    assert "the same subscribers <b>" in Page.text(records["unit"]) and not page.find("b")
    assert "executor lost" in Page.text(records["abort"])
    assert "it would exceed the privacy budget of privacy unit 'subscribers'" in Page.text(records["refuse"])
    # a tampered ledger: the page says so, naming the first broken record
    with open_ledger(url) as ledger:
        raw = ledger._transaction(write=True)
        with raw as tx:
            tx.execute("UPDATE sparkpriv_releases SET state = 'aborted' WHERE id = ?", (expected["ids"][8],))
        text, _, _ = render_report(ledger)
    (verdict,) = Page(text).find("p", class_="verdict")
    assert verdict["attrs"]["data-chain"] == "broken" and "differs from what journal record" in Page.text(verdict)


def unit_row_cells(page: Page, row: dict) -> list:
    start = page.elements.index(row)
    cells = []
    for el in page.elements[start + 1:]:
        if el["tag"] == "tr":
            break
        if el["tag"] == "td":
            cells.append(el)
    return cells


def section_of(page: Page, section: dict) -> Page:
    start = page.elements.index(section)
    end = next((i for i in range(start + 1, len(page.elements)) if page.elements[i]["tag"] == "section"),
               len(page.elements))
    sub = Page("")
    sub.elements = page.elements[start:end]
    return sub
