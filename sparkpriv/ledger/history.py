"""What a journal record says, in words (``sparkpriv ledger history`` and the HTML report)."""

from __future__ import annotations

__all__ = ["describe", "subject", "by", "job", "what"]


def describe(record: dict) -> dict:
    """``{"about", "by", "job", "what"}`` of a record as :meth:`Ledger.history` returns it (text, unescaped)."""
    return {"about": subject(record), "by": by(record), "job": job(record) or "-", "what": what(record)}


def subject(r: dict) -> str:
    row = r.get("row") if isinstance(r.get("row"), dict) else {}
    if r["kind"] in ("reserve", "import"):
        return f"{row.get('table_id')} {row.get('id')}"
    if r["kind"] in ("commit", "abort"):
        return str(r.get("id"))
    if r["kind"] == "unit":
        return f"unit {r.get('unit')}"
    return str(r.get("table_id") or "")


def by(r: dict) -> str:
    row = r.get("row") if isinstance(r.get("row"), dict) else {}
    return str(r.get("by") or r.get("updated_by") or row.get("user_name") or "-")


def job(r: dict) -> str | None:
    row = r.get("row") if isinstance(r.get("row"), dict) else {}
    return r.get("job") or row.get("job_id")


def what(r: dict) -> str:
    kind = r["kind"]
    if kind == "budget":
        return (f"epsilon {r.get('epsilon')}, delta {r.get('delta')}, window {r.get('time_window')}"
                + (" (as found by the upgrade)" if r.get("imported") else "") + f"; why: {r.get('reason') or '-'}")
    if kind == "unit":
        return (f"tables {r.get('patterns')}, epsilon {r.get('epsilon')}, delta {r.get('delta')}, window "
                f"{r.get('time_window')}; why: {r.get('reason') or '-'}")
    if kind in ("reserve", "import"):
        row = r.get("row") or {}
        return f"{row.get('mechanism')}, epsilon {row.get('epsilon')} at delta {row.get('epsilon_delta')}" + \
            (f", state {row.get('state')}" if kind == "import" else "")
    if kind == "commit":
        return f"published to {r.get('output_path')}"
    if kind == "abort":
        return f"why: {r.get('reason')}"
    if kind == "refuse":
        return str(r.get("reason") or "").splitlines()[0][:300]
    if kind == "upgrade":
        return (f"upgraded from schema version {r.get('from')}: {r.get('budgets')} budget(s), "
                f"{r.get('releases')} entries")
    if kind == "key":
        return f"journal keyed with key {r.get('key_id')} from here on"
    return ""
