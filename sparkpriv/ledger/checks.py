"""The ledger's checks of what it stores (table ids, texts, parameters as JSON without secrets) and
the messages it gives (refusals, corrupt rows), apart from the :class:`~sparkpriv.ledger.base.Ledger`
class that uses them."""

from __future__ import annotations

import contextlib
import contextvars
import getpass
import json
import math
import numbers
import os
import re
import socket
from datetime import datetime, timezone
from typing import Any, Mapping

from sparkpriv.errors import LedgerError, ParameterError


DEFAULT_LEDGER_ENV = "SPARKPRIV_LEDGER"
DEFAULT_LEDGER_URL = "sqlite:///~/.sparkpriv/ledger.sqlite"
_TABLE_ID = re.compile(r"[A-Za-z0-9_.:/-]+")
_SECRET_WORDS = ("seed", "secret", "key", "matrix")
# public parameter names that contain one of those words in another sense (the keys of a group-by)
_PUBLIC_NAMES = frozenset({"max_keys", "max_keys_limit", "key_columns", "max_events_per_key", "key_domain",
                           "keys", "max_keys_share"})
_MAX_DEPTH = 64  # of recorded parameters


JOB_ID_ENV = "SPARKPRIV_JOB_ID"
_JOB: contextvars.ContextVar = contextvars.ContextVar("sparkpriv_ledger_job", default=None)


@contextlib.contextmanager
def job_context(job_id: str | None):
    """Within the block, ledger entries record ``job_id`` (unless a call names its own); None changes nothing.

    The command line's ``--job-id`` sets it around a release.
    """
    if job_id is None:
        yield
        return
    _check_text(job_id, "job_id", "job_context", 1024)
    token = _JOB.set(job_id)
    try:
        yield
    finally:
        _JOB.reset(token)


def current_job(explicit: str | None = None, caller: str = "the ledger") -> str | None:
    """The job id an entry records: ``explicit``, else :func:`job_context`'s, else ``$SPARKPRIV_JOB_ID``,
    else what the scheduler exports (Airflow's ``AIRFLOW_CTX_DAG_ID``/``_DAG_RUN_ID``/``_TASK_ID``/``_TRY_NUMBER``,
    ``$SPARK_APPLICATION_ID`` or the running SparkContext's application id), else None."""
    if explicit is not None:
        _check_text(explicit, "job_id", caller, 1024)
        return explicit
    job = _JOB.get() or os.environ.get(JOB_ID_ENV)
    if job:
        return job[:1024]
    parts = []
    env = os.environ
    if env.get("AIRFLOW_CTX_DAG_ID"):
        run = "/".join(env.get(k, "") for k in ("AIRFLOW_CTX_DAG_ID", "AIRFLOW_CTX_DAG_RUN_ID", "AIRFLOW_CTX_TASK_ID"))
        try_number = env.get("AIRFLOW_CTX_TRY_NUMBER")
        parts.append(f"airflow:{run}" + (f" try {try_number}" if try_number else ""))
    app = env.get("SPARK_APPLICATION_ID") or _spark_application_id()
    if app:
        parts.append(f"spark:{app}")
    text = " ".join(parts)[:1024]
    return _printable(text) if text else None


def _spark_application_id() -> str | None:
    """The application id of a SparkContext running in this process (pyspark is not imported for it)."""
    import sys

    spark = sys.modules.get("pyspark")
    context = getattr(getattr(spark, "SparkContext", None), "_active_spark_context", None)
    try:
        return str(context.applicationId) if context is not None else None
    except Exception:  # a stopped or broken context: no id
        return None


def current_user() -> str:
    """Who runs this process (the operating-system user), for the entries it writes."""
    try:
        return getpass.getuser()[:256]
    except Exception:  # no user name for this uid (containers)
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"


def default_ledger_url() -> str:
    """``$SPARKPRIV_LEDGER`` if set, else ``sqlite:///~/.sparkpriv/ledger.sqlite``."""
    return os.environ.get(DEFAULT_LEDGER_ENV) or DEFAULT_LEDGER_URL


def redact_url(url: str) -> str:
    """``url`` without its password (for messages and ``ledger show``)."""
    url = re.sub(r"(?i)(password=)[^&\s]*", r"\1***", url)
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/:@]*):[^/@]*@", r"\1:***@", url)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _check_table_id(table_id: Any, caller: str, name: str = "table_id", example: str = "cdr.daily_towers") -> None:
    """A table id (or a privacy unit's name, ``name="unit"``): 1 to 256 of ``A-Z a-z 0-9 _ . : / -``."""
    if not isinstance(table_id, str) or not _TABLE_ID.fullmatch(table_id) or len(table_id) > 256:
        raise ParameterError(
            f"The {name!r} parameter of {caller} must be a non-empty string of letters, digits "
            f"and _ . : / - (at most 256 characters), e.g. {example!r}. Got {table_id!r} instead."
        )


def _check_text(value: Any, name: str, caller: str, max_len: int) -> None:
    """A str that any database can store: valid Unicode (no lone surrogates), no NUL, at most ``max_len``."""
    problem = None
    if not isinstance(value, str):
        problem = f"Got a {type(value).__name__} instead."
    elif len(value) > max_len:
        problem = f"Got {len(value)} characters instead."
    elif "\x00" in value:
        problem = "Got a string with a NUL character instead."
    else:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            problem = "Got a string with an unpaired surrogate character (not valid Unicode) instead."
    if problem:
        raise ParameterError(
            f"The {name!r} parameter of {caller} must be a string of valid Unicode without NUL characters, "
            f"at most {max_len} characters long. {problem}"
        )


def _walk_plain(value: Any, name: str, caller: str) -> list[str]:
    """Check a parameters value (depth, strings) and list the keys that look like secrets."""
    secret: list[str] = []
    stack = [(value, name, 0)]
    while stack:
        v, where, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise ParameterError(f"The {name!r} parameter of {caller} is nested more than {_MAX_DEPTH} levels "
                                 "deep; record a flat summary of the parameters.")
        if isinstance(v, str):
            _check_text(v, where, caller, 1 << 20)
        elif isinstance(v, Mapping):
            for k, x in v.items():
                if not isinstance(k, str):
                    raise ParameterError(f"The {name!r} parameter of {caller} must have string keys; "
                                         f"{where} has a {type(k).__name__} key.")
                _check_text(k, f"{where} key", caller, 1024)
                sub = f"{where}.{k}"
                if k not in _PUBLIC_NAMES and any(word in k.lower() for word in _SECRET_WORDS):
                    secret.append(sub)
                stack.append((x, sub, depth + 1))
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                stack.append((x, f"{where}[{i}]", depth + 1))
        elif _non_finite(v):
            raise ParameterError(
                f"The {where!r} parameter of {caller} must be a finite number: the ledger stores strict "
                f"JSON, which has no NaN or infinity. Got {float(v)!r} instead. Record it as a string "
                "(e.g. 'inf') or leave it out."
            )
    return sorted(secret)


def _non_finite(v: Any) -> bool:
    """A float (or numpy float scalar) that is NaN or infinite."""
    if isinstance(v, (bool, int, str)) or not (isinstance(v, numbers.Real) or getattr(v, "ndim", None) == 0):
        return False
    try:
        return not math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _json_without_secrets(value: Any, name: str, caller: str) -> str | None:
    """JSON text of a parameters dict (None stays None), refusing what looks like a secret."""
    if value is None and name != "parameters":
        return None
    if not isinstance(value, Mapping):
        raise ParameterError(f"The {name!r} parameter of {caller} must be a dict. Got a {type(value).__name__} "
                             "instead.")
    secret = _walk_plain(value, name, caller)
    if secret:
        raise LedgerError(
            f"{caller} refuses to store {', '.join(secret)}: keys containing "
            f"{', '.join(_SECRET_WORDS)} look like secrets (seeds, keys, projection matrices), and the "
            "ledger is not a place for secrets. Leave them out of the recorded parameters."
        )

    def scalar(v: Any) -> Any:  # numpy scalars and other numbers
        if isinstance(v, numbers.Number) or getattr(v, "ndim", None) == 0:
            return v.item() if hasattr(v, "item") else float(v)
        raise LedgerError(
            f"{caller} cannot store {type(v).__name__} values in {name!r}; record plain numbers, "
            "strings, lists and dicts."
        )

    try:
        return json.dumps(value, sort_keys=True, default=scalar, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ParameterError(f"The {name!r} parameter of {caller} cannot be stored as JSON "
                             f"({type(exc).__name__}); record plain numbers, strings, lists and dicts.") from None


def _printable(text: Any) -> str:
    """``text`` with every non-printable character (newline, control, surrogate) escaped, for display."""
    text = "" if text is None else str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)


def _corrupt_message(url: str, table_id: str, entry_id: Any, why: str) -> str:
    return (
        f"Ledger entry {_printable(entry_id)[:64]} of table '{table_id}' in ledger {url} is corrupt: {why}. "
        f"No release of '{table_id}' is admitted until the entry is repaired (restore it from a backup, or "
        "ask whoever edited the ledger by hand); other tables are not affected."
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except (OSError, IndexError):
        return True


def _label(state: str, host: str, pid: int) -> str:
    if state != "reserved":
        return state
    if host != socket.gethostname():
        return "reserved (unfinished?)"  # no reliable liveness check across hosts
    return "reserved" if _pid_alive(pid) else "unfinished"


def _json_float(x: float) -> float | str:
    """``x``, or ``"inf"`` / ``"-inf"`` / ``"nan"`` for strict JSON (which has no non-finite numbers)."""
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _strict_json(value: Any) -> Any:
    """``value`` (parsed JSON) with every non-finite float written as a string (an entry stored before
    non-finite numbers were refused may hold NaN)."""
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict_json(v) for v in value]
    return value


def _budget_values(url: str, what: str, epsilon: Any, delta: Any) -> tuple[float, float]:
    """A stored budget's ``(epsilon, delta)`` as floats, or :class:`LedgerError` naming what is wrong.

    The schema's CHECK constraints do not hold against every hand edit (SQLite stores the text
    'abc' in a DOUBLE PRECISION column, PostgreSQL accepts NaN > 0), so the values are checked
    when they are read.
    """
    problems = []
    for name, value, ok in (("epsilon", epsilon, lambda x: 0.0 < x < math.inf),
                            ("delta", delta, lambda x: 0.0 <= x < 1.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"its {name} is {_printable(repr(value))[:60]}, not a number")
        elif not ok(float(value)):
            problems.append(f"its {name} is {float(value)!r}, outside "
                            f"{'(0, inf)' if name == 'epsilon' else '[0, 1)'}")
    if problems:
        raise LedgerError(
            f"The budget of {what} in ledger {url} is corrupt: {'; '.join(problems)}. No release it covers "
            "is admitted until it is set again (`sparkpriv ledger set-budget`), after finding out who edited "
            "the ledger by hand (`sparkpriv ledger verify` shows what else was changed)."
        )
    return float(epsilon), float(delta)


def _g(x: float) -> str:
    return f"{x:.6g}"


def _g_above(x: float, limit: float) -> str:
    """``x`` to 6 digits, or to every digit when 6 would not show that it is above ``limit``."""
    shown = _g(x)
    return shown if not (x > limit >= float(shown)) else repr(x)


def _set_budget_hint(url: str, table_id: str, unit: str | None = None) -> str:
    if unit is not None:
        return f"sparkpriv ledger set-budget --ledger '{url}' --unit {unit} --epsilon E --delta D"
    return f"sparkpriv ledger set-budget --ledger '{url}' --table-id {table_id} --epsilon E --delta D"


def _no_budget_message(url: str, table_id: str) -> str:
    return (
        f"No privacy budget is set for table '{table_id}' in ledger {url} (neither its own nor a privacy unit's "
        f"that covers it), so no release of it can be accounted. Set one first: "
        f"`{_set_budget_hint(url, table_id)}`, or a unit's that covers it: `sparkpriv ledger set-budget --ledger "
        f"'{url}' --unit NAME --tables 'PATTERN,...' --epsilon E --delta D`."
    )


def _refusal_message(url, table_id, budget, before, own, after, counted, pending, at, oldest=None) -> str:
    """Why ``budget`` (a :class:`~sparkpriv.ledger.windows.Budget`) refuses a release of ``table_id`` at ``at``."""
    d = _g(budget.delta)
    w = budget.window
    if budget.kind == "table" and w.kind == "lifetime":
        head = "it would exceed the table's privacy budget."
        where = ""
    else:
        head = f"it would exceed the privacy budget of {budget.label} {w.describe()}."
        where = (" of the unit's tables" if budget.kind == "unit" else "") + \
            (f" in {w.current(at)}" if w.kind != "lifetime" else "")
    lines = [
        f"Release refused for table '{table_id}' (ledger {url}): {head}",
        f"  budget:    epsilon = {_g(budget.epsilon)}, delta = {d}" + (f", {w.describe()}" if w.kind != "lifetime"
                                                                       else ""),
        f"  spent:     epsilon = {_g(before)} at delta = {d} ({counted} counted release(s){where}, composed)",
        f"  requested: epsilon = {_g(own)} at delta = {d} (this release alone)",
        f"  remaining: epsilon = {_g(max(0.0, budget.epsilon - before))} at delta = {d} "
        f"(with this release the composed total would be {_g_above(after, budget.epsilon)})",
    ]
    if math.isinf(own) and budget.delta == 0.0:
        lines.append("A Gaussian (approximate-DP) release cannot fit a budget with delta = 0.")
    if pending:
        lines.append(
            f"Counted but not published: {pending} reservation(s) of running or killed jobs (see `sparkpriv "
            "ledger show --unfinished`); a killed job's reservation stays counted until it is aborted "
            "(`sparkpriv ledger abort ID --reason ...`)."
        )
    if w.kind == "rolling" and oldest:
        lines.append(f"The oldest counted spend in this window was made at {str(oldest)[:19].replace('T', ' ')} UTC; "
                     f"each spend stops counting {w.days} days after it was made.")
    elif w.kind == "month":
        lines.append("Each calendar month (UTC) starts with nothing spent.")
    unit = budget.name if budget.kind == "unit" else None
    lines.append(
        "Fix: request a smaller epsilon, or, if the policy allows, raise the budget with "
        f"`{_set_budget_hint(url, table_id, unit)}`."
    )
    return "\n".join(lines)
