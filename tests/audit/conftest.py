"""The audit suite prints every measured lower bound as a table at the end of
the run (tests/audit/README.md explains the columns)."""

from __future__ import annotations

from ._audit import RESULTS


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not RESULTS:
        return
    tr = terminalreporter
    tr.section("privacy audit: empirical lower bounds (Clopper-Pearson, confidence 1 - alpha = 99.9 %)")
    tr.write_line("| audit | kind | trials per side | eps_lb | eps claim | eps_lb / claim | delta | mu_lb / mu claim |")
    tr.write_line("|---|---|---|---|---|---|---|---|")
    for r in RESULTS:
        tr.write_line(r.row())
