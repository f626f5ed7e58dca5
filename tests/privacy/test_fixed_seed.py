"""Fixed seeds: only an explicit block in code makes secrets deterministic.

The environment variable ``SPARKPRIV_INSECURE_TEST_SEED`` (the former hook)
is ignored for seeding; a release made under ``insecure_fixed_seed`` says in
its receipt that it has no privacy guarantee, and the ledger never records it.
Expected seeds come from ``derive_seed`` (SHA-256 of the seed and a label),
the documented derivation, not from ``new_secret_seed`` itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from dp_accounting import dp_event as ev

from sparkpriv.errors import ParameterError
from sparkpriv.privacy import random as sprandom
from sparkpriv.privacy.random import (
    TEST_SEED_ENV,
    active_fixed_seed,
    derive_seed,
    insecure_fixed_seed,
    new_secret_seed,
    refuse_fixed_seed,
    reset_test_counter,
)
from sparkpriv.release import Release, reserve

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


# --------------------------------------------------------------------------- the environment variable


def test_environment_variable_alone_does_not_fix_secrets(monkeypatch):
    monkeypatch.setenv(TEST_SEED_ENV, "12345")
    assert active_fixed_seed() is None
    a = new_secret_seed("projection-matrix")
    reset_test_counter()
    b = new_secret_seed("projection-matrix")
    # the former hook gave derive_seed(12345, "projection-matrix#1") both times
    assert a != b
    assert derive_seed(12345, "projection-matrix#1") not in (a, b)


def test_two_processes_with_the_environment_variable_draw_different_secrets():
    """A production job that inherits the variable still draws its secrets from OS entropy."""
    code = "from sparkpriv.privacy.random import new_secret_seed; print(new_secret_seed('projection-noise'))"
    runs = [_python(code, {TEST_SEED_ENV: "20261122"}) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    seeds = [int(r.stdout.split()[-1]) for r in runs]
    assert seeds[0] != seeds[1]
    assert derive_seed(20261122, "projection-noise#1") not in seeds
    assert "is set and ignored" in runs[0].stderr


# --------------------------------------------------------------------------- the explicit block


def test_fixed_seed_block_derives_secrets_and_restores_the_previous_state():
    assert active_fixed_seed() is None
    with insecure_fixed_seed(7) as s:
        assert s == 7 and active_fixed_seed() == 7
        assert new_secret_seed("a") == derive_seed(7, "a#1")
        assert new_secret_seed("b") == derive_seed(7, "b#2")
        with insecure_fixed_seed(8):
            assert new_secret_seed("a") == derive_seed(8, "a#1")
        # the enclosing block's seed and counter come back
        assert active_fixed_seed() == 7
        assert new_secret_seed("c") == derive_seed(7, "c#3")
        reset_test_counter()
        assert new_secret_seed("a") == derive_seed(7, "a#1")
    assert active_fixed_seed() is None
    x, y = new_secret_seed("a"), new_secret_seed("a")
    assert x != y and derive_seed(7, "a#1") not in (x, y) and derive_seed(7, "a#2") not in (x, y)


def test_fixed_seed_block_is_left_on_an_exception():
    with pytest.raises(RuntimeError):
        with insecure_fixed_seed(3):
            raise RuntimeError("boom")
    assert active_fixed_seed() is None


def test_blocks_ended_out_of_order_restore_the_right_state():
    """Threads may close their blocks in any order: each removes its own block only."""
    a, b = insecure_fixed_seed(1), insecure_fixed_seed(2)
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)  # the outer block ends first
    assert active_fixed_seed() == 2
    assert new_secret_seed("p") == derive_seed(2, "p#1")
    b.__exit__(None, None, None)
    assert active_fixed_seed() is None


def test_counter_is_exact_across_threads():
    n_threads, per_thread = 8, 400
    got: list[int] = []
    lock = threading.Lock()

    def draw():
        mine = [new_secret_seed("p") for _ in range(per_thread)]
        with lock:
            got.extend(mine)

    with insecure_fixed_seed(11):
        threads = [threading.Thread(target=draw) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    # every counter value 1..N used exactly once: no secret drawn twice, none skipped
    assert sorted(got) == sorted(derive_seed(11, f"p#{n}") for n in range(1, n_threads * per_thread + 1))


@pytest.mark.parametrize("bad", [-1, "12345", 1.5, True, None])
def test_fixed_seed_must_be_a_non_negative_integer(bad):
    with pytest.raises(ParameterError, match="non-negative integer seed"):
        insecure_fixed_seed(bad)
    assert active_fixed_seed() is None


def test_the_module_has_no_environment_hook_left():
    assert not hasattr(sprandom, "insecure_test_seed")


# --------------------------------------------------------------------------- refusals


def test_refuse_fixed_seed_names_the_variable_and_the_fix(monkeypatch):
    refuse_fixed_seed("sparkpriv")  # nothing set: no error
    for value in ("12345", ""):
        monkeypatch.setenv(TEST_SEED_ENV, value)
        with pytest.raises(ParameterError, match=f"{TEST_SEED_ENV} is set.*NOT private.*unset {TEST_SEED_ENV}"):
            refuse_fixed_seed("sparkpriv")
    monkeypatch.delenv(TEST_SEED_ENV)
    with insecure_fixed_seed(5):
        with pytest.raises(ParameterError, match="inside sparkpriv.privacy.random.insecure_fixed_seed"):
            refuse_fixed_seed("sparkpriv")


@pytest.fixture
def ledger_url(tmp_path):
    from sparkpriv.ledger import open_ledger

    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    with open_ledger(url) as led:
        led.set_budget("t.fixed", epsilon=10.0, delta=1e-6)
    return url


def _entries(url):
    from sparkpriv.ledger import open_ledger

    with open_ledger(url) as led:
        return list(led.status("t.fixed").entries)


def test_reserve_refuses_a_ledger_under_a_fixed_seed(ledger_url, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKPRIV_LEDGER", ledger_url)  # the default ledger of a bare table id
    event = ev.LaplaceDpEvent(1.0)
    with insecure_fixed_seed(9):
        for kw in ({"ledger": ledger_url, "table_id": "t.fixed"}, {"table_id": "t.fixed"}):
            with pytest.raises(ParameterError, match="NO privacy guarantee.*must not record it"):
                reserve(event=event, mechanism="projection", parameters={"k": 2}, **kw)
    assert _entries(ledger_url) == []
    # the same reservation outside the block is recorded (the refusal is the block's doing)
    hold = reserve(event=event, mechanism="projection", parameters={"k": 2}, ledger=ledger_url,
                   table_id="t.fixed")
    hold.abort("test")
    hold.close()
    assert [e["state"] for e in _entries(ledger_url)] == ["aborted"]


def _release(hold):
    field = SimpleNamespace(name="z0", dataType=SimpleNamespace(simpleString=lambda: "double"))
    df = SimpleNamespace(schema=SimpleNamespace(fields=[field]))
    return Release(df=df, mechanism="projection", event=ev.LaplaceDpEvent(1.0), epsilon=1.0, delta=0.0,
                   public={"neighbors": "replace-one"}, input_info={}, hold=hold)


def test_receipt_of_a_fixed_seed_release_states_no_guarantee():
    with insecure_fixed_seed(4):
        hold = reserve(event=ev.LaplaceDpEvent(1.0), mechanism="projection", parameters={})
    assert hold.fixed_seed and hold.reservation is None
    r = _release(hold).receipt("/out")  # written after the block ended: still not private
    assert r["insecure_test_seed"] is True
    assert r["guarantee"]["holds"] is False
    assert r["guarantee"]["statement"].startswith("NONE.")
    assert "no privacy guarantee" in r["guarantee"]["statement"]
    assert "NOT PRIVATE" in r["WARNING"]
    assert r["ledger"] is None
    # a release whose receipt is made inside a block is not private either
    with insecure_fixed_seed(4):
        r = _release(reserve(event=ev.LaplaceDpEvent(1.0), mechanism="p", parameters={})).receipt()
    assert r["guarantee"]["holds"] is False


def test_receipt_of_a_normal_release_holds(monkeypatch):
    monkeypatch.setenv(TEST_SEED_ENV, "12345")  # ignored
    r = _release(reserve(event=ev.LaplaceDpEvent(1.0), mechanism="projection", parameters={})).receipt("/o")
    assert r["insecure_test_seed"] is False
    assert r["guarantee"]["holds"] is True and "statement" not in r["guarantee"]
    assert "WARNING" not in r
