"""The ledger report in a real browser: headless Chromium renders it, on both backends.

Chromium loads the written page from a ``file://`` URL with every network host
unresolvable (the page must need none), dumps the DOM it built (checked like
the page itself in test_report.py: table ids, budgets, states, remaining
budget, the chart's points) and takes a screenshot, in which the chart's spend
line and budget line must actually be painted: the pixels of their colours
must cover about as much as the drawn segments (with the spend line's stroke
removed from the page, the test fails).

A second page, with a privacy unit and windowed budgets, must show the
journal's verdict, the units and their window charts, painted.

The browser: ``$SPARKPRIV_CHROMIUM``, else ``chromium`` / ``chromium-browser`` /
``google-chrome`` on PATH. When none is found and we are root with apt-get,
the fixture runs ``.ci/chromium.sh`` (Debian's ``chromium`` package). Still
none: skipped with the reason, or failed when ``CI=true``.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkpriv.ledger import open_ledger
from sparkpriv.ledger.report import BUDGET_COLOUR, COUNTED_COLOUR, SPEND_COLOUR, write_report
from tests.ledger.test_report import GAUSS_TABLE, LAPLACE_TABLE, Page, check_page, make_ledger

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDTH, HEIGHT = 1100, 2200


def _find_browser() -> str | None:
    env = os.environ.get("SPARKPRIV_CHROMIUM")
    if env and os.access(env, os.X_OK):
        return env
    return next((shutil.which(n) for n in NAMES if shutil.which(n)), None)


@pytest.fixture(scope="session")
def chromium() -> str:
    found = _find_browser()
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        try:
            r = subprocess.run([shutil.which("sh") or "/bin/sh", str(ROOT / ".ci" / "chromium.sh")],
                               capture_output=True, text=True, timeout=1200)
            said = f"exit code {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            said = f"{type(exc).__name__}: {exc}"
        found = _find_browser()
        if found is None:
            reason = f".ci/chromium.sh could not install chromium ({said})"
    elif found is None:
        reason = "no chromium on PATH (and not root with apt-get to install it): run .ci/chromium.sh"
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return found


def run_browser(browser: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           "--disable-background-networking", "--disable-sync", "--disable-dev-shm-usage",
           "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={profile}", "--hide-scrollbars",
           "--force-device-scale-factor=1", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stderr[-3000:]}"
    return r


def _polyline_length(points: str) -> float:
    xy = [tuple(map(float, p.split(","))) for p in points.split()]
    return sum(math.dist(a, b) for a, b in zip(xy, xy[1:]))


def _pixels_of(image, colour: str, tolerance: int = 24) -> int:
    """How many pixels of ``image`` (RGB) are within ``tolerance`` of ``colour`` in every channel."""
    import numpy as np

    want = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
    rgb = np.asarray(image.convert("RGB"), dtype=np.int16)
    return int((np.abs(rgb - want) <= tolerance).all(axis=2).sum())


def test_report_renders_in_chromium(chromium, ledger_url, tmp_path):
    from PIL import Image  # Pillow comes with matplotlib (the test extra)

    expected = make_ledger(ledger_url)
    report = tmp_path / "report.html"
    with open_ledger(ledger_url, read_only=True) as ledger:
        write_report(ledger, report)
    url = report.resolve().as_uri()

    # the DOM Chromium built from the page: what a privacy officer reads
    dom = run_browser(chromium, tmp_path, "--dump-dom", url).stdout
    assert "<svg" in dom, dom[:2000]
    page = Page(dom)
    check_page(page, expected)
    assert [Page.text(el) for el in page.find("h1")] == ["Privacy budget report"]

    # the screenshot: the chart is painted (the spend line's colour covers its drawn length)
    shot = tmp_path / "shot.png"
    run_browser(chromium, tmp_path, f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={shot}", url)
    image = Image.open(shot)
    assert image.size == (WIDTH, HEIGHT)
    drawn = sum(_polyline_length(el["attrs"]["points"]) for el in page.find("polyline", class_="spend-line"))
    assert drawn > 300  # two tables with committed releases
    # 3 px wide line (legend lines and point markers add a little); anti-aliased edges fall outside the tolerance
    spend_pixels = _pixels_of(image, SPEND_COLOUR)
    assert spend_pixels >= 1.5 * drawn, (spend_pixels, drawn)
    budget_lines = page.find("line", class_="budget-line")
    assert len(budget_lines) == 3
    # the dashed budget lines, 2 px wide, 2/3 of each drawn (dashes 8 on, 4 off)
    budget_length = sum(float(el["attrs"]["x2"]) - float(el["attrs"]["x1"]) for el in budget_lines)
    assert _pixels_of(image, BUDGET_COLOUR) >= 0.5 * budget_length
    # the dashed step to what is counted now (a reserved and an unfinished release)
    assert _pixels_of(image, COUNTED_COLOUR) >= 20

    assert {GAUSS_TABLE, LAPLACE_TABLE} <= {el["attrs"].get("data-table-id") for el in page.find("section")}


def test_units_windows_and_the_journal_render_in_chromium(chromium, tmp_path, monkeypatch):
    from PIL import Image

    from tests.ledger.test_report import make_unit_ledger

    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    expected = make_unit_ledger(url, monkeypatch)
    report = tmp_path / "report.html"
    with open_ledger(url, read_only=True) as ledger:
        write_report(ledger, report)
    page = Page(run_browser(chromium, tmp_path, "--dump-dom", report.resolve().as_uri()).stdout)
    (verdict,) = page.find("p", class_="verdict")
    assert verdict["attrs"]["data-chain"] == "ok"
    (unit,) = page.find("section", class_="ledger-unit")
    assert unit["attrs"]["data-unit"] == "subscribers"
    points = [float(p["attrs"]["data-epsilon"]) for p in page.find("circle", class_="window-point")]
    assert points[:4] == expected["window"]  # the unit's chart comes first, then the table's
    assert {el["attrs"]["data-kind"] for el in page.find("tr", class_="record")} >= {"unit", "budget", "refuse"}

    shot = tmp_path / "shot.png"
    run_browser(chromium, tmp_path, f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={shot}",
                report.resolve().as_uri())
    image = Image.open(shot)
    drawn = sum(_polyline_length(el["attrs"]["points"]) for el in page.find("polyline", class_="window-line"))
    assert drawn > 300  # the unit's and the table's window charts
    assert _pixels_of(image, SPEND_COLOUR) >= 1.5 * drawn
    assert _pixels_of(image, BUDGET_COLOUR) >= 0.5 * sum(
        float(el["attrs"]["x2"]) - float(el["attrs"]["x1"]) for el in page.find("line", class_="budget-line"))
