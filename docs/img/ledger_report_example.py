"""Make the example ledger report and the screenshot in docs/img/ledger-report.png.

    python docs/img/ledger_report_example.py /tmp/example     # needs chromium for the screenshot

A fresh SQLite ledger with two tables, a privacy unit with a 7-day window over
the CDR tables, and a fortnight of nightly releases (the ledger's clock is set
back for the example), its report, and a PNG of the report's top (the
journal's verdict, the summaries and the unit's window chart) as headless
Chromium renders it.
"""

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from dp_accounting import dp_event as ev

import sparkpriv.ledger.base as base
from sparkpriv.ledger import open_ledger
from sparkpriv.ledger.report import write_report

out = Path(sys.argv[1] if len(sys.argv) > 1 else "ledger-report-example")
out.mkdir(parents=True, exist_ok=True)
(out / "ledger.sqlite").unlink(missing_ok=True)
url = f"sqlite:///{out.resolve()}/ledger.sqlite"
clock = [datetime(2026, 11, 9, 1, 0, tzinfo=timezone.utc)]
base._clock = lambda: clock[0]  # the example's clock


def at(day: int, hour: int, minute: int = 0) -> None:
    clock[0] = datetime(2026, 11, 9, tzinfo=timezone.utc) + timedelta(days=day, hours=hour, minutes=minute)


with open_ledger(url) as ledger:
    at(0, 9)
    ledger.set_budget("cdr.daily_towers", epsilon=3.0, delta=1e-6)
    ledger.set_budget("census/adult:v2", epsilon=1.0, delta=0.0)
    ledger.set_unit("subscribers", tables="cdr.*", epsilon=2.0, delta=1e-6, window="7d",
                    reason="the same subscribers in every CDR table: DPIA 2026-17")
    for night in range(1, 12):
        at(night, 2, 5)
        mech = "kmeans" if night % 4 == 0 else "projection"
        r = ledger.reserve("cdr.daily_towers", event=ev.GaussianDpEvent(6.0), mechanism=mech, parameters={"k": 64},
                           output_path=f"s3://dp-releases/cdr/daily_towers/2026-11-{9 + night:02d}")
        if night == 6:
            at(night, 2, 41)
            ledger.abort(r.id, reason="publishing failed: OSError")
            continue
        at(night, 2, 38)
        ledger.commit(r.id, receipt_summary={"epsilon": 0.8, "delta": 1e-7})
    at(12, 2, 5)
    ledger.reserve("cdr.daily_towers", event=ev.GaussianDpEvent(6.0), mechanism="projection", parameters={},
                   output_path="s3://dp-releases/cdr/daily_towers/2026-11-21")
    for day, eps in ((2, 0.25), (9, 0.25)):
        at(day, 14)
        r = ledger.reserve("census/adult:v2", event=ev.LaplaceDpEvent(1 / eps), mechanism="dprp", parameters={},
                           output_path=f"/data/private/adult/v{day}")
        at(day, 14, 20)
        ledger.commit(r.id, receipt_summary={"epsilon": eps, "delta": 0.0})

report = out / "report.html"
at(12, 8)
write_report(url, report, generated_at=clock[0])
print(report)
shot = out / "ledger-report.png"
subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--force-device-scale-factor=1", "--window-size=1000,1200", f"--screenshot={shot.resolve()}",
                report.resolve().as_uri()], check=True, capture_output=True)
try:  # a small palette PNG for the repository
    from PIL import Image

    Image.open(shot).convert("RGB").quantize(colors=128, method=Image.Quantize.MAXCOVERAGE).save(shot, optimize=True)
except ImportError:
    pass
print(shot)
