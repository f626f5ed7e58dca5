"""Where randomness comes from (docs/math.md section 7).

* Secrets (projection matrices, job seeds) are drawn from the operating
  system's entropy (:func:`secrets.randbits`, i.e. ``os.urandom``).
* Noise streams are AES-128 in counter mode (randomgen's ``AESCounter``
  behind numpy's ``Generator`` interface), keyed by a 128-bit key derived
  with HMAC-SHA256 from the secret seed and a public integer path. Row-level
  noise in Spark uses one stream per (secret job seed, stage, partition id): a
  retried or recomputed task redraws the *same* noise, so recomputation never
  releases a second, independent draw. Aggregate noise is drawn once, on the
  driver.

Why a cryptographic generator: in a row-level release an attacker who knows
some released people's true rows (their own, say) learns the exact noise
integers of those rows, i.e. outputs of the stream. A statistical generator
such as numpy's PCG64 can have its state recovered from its outputs (this has
been done for PCG64 in the literature), which would give every other row's
noise. AES-CTR outputs reveal nothing about the key or other blocks unless AES
is broken, and the HMAC key derivation makes the streams of different paths
(partitions) independent. The stream is still only as secret as the seed: the
seed never leaves the job (it is not written, logged, or put in a query plan);
an attacker who learns it can remove the noise exactly, just as one who learns
the projection matrix can invert it. With AES-NI (``use_aesni``, nearly every
x86-64 CPU since 2010) a 64-bit word costs about as much as a PCG64 word;
without it randomgen falls back to a portable software AES: the same words,
several times slower. docs/noise.md has the figures.

Fixed seeds (tests only, NOT PRIVATE): secrets can be made deterministic
only by code that asks for it explicitly::

    from sparkpriv.privacy.random import insecure_fixed_seed

    with insecure_fixed_seed(12345):  # tests only: the release is NOT private
        release = release_projection(df, ...)
        release.write(path)

Inside the block every secret is derived from the seed, the purpose and a
per-process counter, so a test can reproduce a run and scan its outputs for
known secrets. Such a release carries NO privacy guarantee: anyone who knows or
guesses the seed recomputes the secret matrices and the noise and removes them.
Its receipt says so (``"insecure_test_seed": true``, ``"guarantee": {"holds":
false, ...}`` and a ``WARNING``), and the budget ledger refuses it
(:func:`sparkpriv.release.reserve` raises instead of recording a spend). The
state is per process (all threads; the Python workers of Spark executors are
other processes and never draw secrets); leaving the block restores the
previous state. The command line and ``jobs/release.py`` refuse to run inside
such a block.

The environment variable ``SPARKPRIV_INSECURE_TEST_SEED`` (the former test
hook) is ignored for seeding: whatever it says, secrets come from the
operating system's entropy. The command line and ``jobs/release.py`` refuse to
run while it is set, so that a production job that inherits it fails instead
of publishing noise anyone can recompute.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import operator
import os
import secrets
import threading

import numpy as np
from randomgen import AESCounter

__all__ = [
    "TEST_SEED_ENV",
    "insecure_fixed_seed",
    "active_fixed_seed",
    "refuse_fixed_seed",
    "new_secret_seed",
    "derive_seed",
    "stream",
]

TEST_SEED_ENV = "SPARKPRIV_INSECURE_TEST_SEED"  # no longer read for seeding: its presence is refused
_log = logging.getLogger(__name__)

# The fixed-seed state of this process: a stack of the open insecure_fixed_seed
# blocks, each [seed, counter]; the innermost is in force (empty: secrets from
# OS entropy). One lock guards it, so the counter is exact across threads.
_lock = threading.Lock()
_blocks: list[list[int]] = []
_env_warned = False


class insecure_fixed_seed:
    """Context manager: derive every secret from ``seed`` (TESTS ONLY; NOT PRIVATE).

    ``with insecure_fixed_seed(12345): ...`` makes :func:`new_secret_seed`
    return ``derive_seed(seed, f"{purpose}#{n}")`` for the n-th secret drawn in
    the block (n counts from 1). A release made in the block has no privacy
    guarantee: its receipt says so and the budget ledger refuses it. Leaving
    the block restores the previous state (an enclosing block's seed and
    counter, or OS entropy), also when blocks of several threads end out of
    order. The state is process-wide: while a block is open, every thread of
    the process draws fixed secrets.
    """

    def __init__(self, seed: int):
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            from sparkpriv.errors import ParameterError

            raise ParameterError(f"insecure_fixed_seed needs a non-negative integer seed, not {seed!r}.")
        self.seed = seed
        self._entries: list[list[int]] = []

    def __enter__(self) -> int:
        entry = [self.seed, 0]
        with _lock:
            _blocks.append(entry)
        self._entries.append(entry)
        _log.error("insecure_fixed_seed is active: secrets are derived from a fixed seed; "
                   "releases made now are NOT private")
        return self.seed

    def __exit__(self, *exc) -> None:
        entry = self._entries.pop()
        with _lock:
            for i in range(len(_blocks) - 1, -1, -1):
                if _blocks[i] is entry:
                    del _blocks[i]
                    break


def active_fixed_seed() -> int | None:
    """The seed of the innermost open :class:`insecure_fixed_seed` block, else None."""
    with _lock:
        return _blocks[-1][0] if _blocks else None


def refuse_fixed_seed(what: str) -> None:
    """Raise :class:`ParameterError` if a fixed seed could be in play for ``what``.

    Refused: the environment variable ``SPARKPRIV_INSECURE_TEST_SEED`` is set
    (to anything, even empty), or an :class:`insecure_fixed_seed` block is open
    in this process. The command line and ``jobs/release.py`` call this before
    Spark starts.
    """
    from sparkpriv.errors import ParameterError

    if TEST_SEED_ENV in os.environ:
        raise ParameterError(
            f"{what} refuses to run while the environment variable {TEST_SEED_ENV} is set: it was the "
            f"insecure test hook for fixed seeds, and a release made with a fixed seed is NOT private. "
            f"Unset it (unset {TEST_SEED_ENV}) and run again."
        )
    if active_fixed_seed() is not None:
        raise ParameterError(
            f"{what} refuses to run inside sparkpriv.privacy.random.insecure_fixed_seed: a release made "
            "with a fixed seed is NOT private. Call it outside that block."
        )


def new_secret_seed(purpose: str) -> int:
    """A fresh 128-bit secret seed from OS entropy.

    Inside an :class:`insecure_fixed_seed` block (tests only) the seed is
    derived from the fixed seed, ``purpose`` and the block's counter instead.
    The environment variable ``SPARKPRIV_INSECURE_TEST_SEED`` is not read for
    this. Call it on the driver only: an executor's Python worker is another
    process, outside any fixed-seed block.
    """
    global _env_warned
    with _lock:
        if _blocks:
            block = _blocks[-1]
            block[1] += 1
            fixed, n = block
        else:
            fixed = n = None
        warn_env = fixed is None and not _env_warned and TEST_SEED_ENV in os.environ
        if warn_env:
            _env_warned = True
    if warn_env:
        _log.warning("%s is set and ignored: secrets come from OS entropy (fixed seeds need "
                     "insecure_fixed_seed in code)", TEST_SEED_ENV)
    if fixed is None:
        return secrets.randbits(128)
    # not logged per secret: the block logs on entry and every release made in it logs once
    return derive_seed(fixed, f"{purpose}#{n}")


def bounding_key(seed: int | bytes | None = None) -> int:
    """The secret key of contribution bounding's keyed choice (which items or keys a capped person
    keeps): fresh from :func:`new_secret_seed`, or derived from a caller's secret ``seed`` (bytes of
    at least 16, or an int), the same on every engine."""
    if seed is None:
        return new_secret_seed("contribution-bounding")
    if isinstance(seed, bytes) and len(seed) < 16:
        from sparkpriv.errors import ParameterError

        raise ParameterError("The contribution-bounding key must be at least 16 bytes of secret material.")
    return derive_seed(seed, "contribution-bounding")


def reset_test_counter() -> None:
    """Tests only: restart the counter of the innermost fixed-seed block, to draw the same secrets again."""
    with _lock:
        if _blocks:
            _blocks[-1][1] = 0


def derive_seed(key: int | bytes, label: str) -> int:
    """A 128-bit seed derived from a secret key and a public label (SHA-256)."""
    if isinstance(key, int):
        key = key.to_bytes((max(key.bit_length(), 1) + 7) // 8, "little")
    digest = hashlib.sha256(b"sparkpriv/" + label.encode() + b"/" + key).digest()
    return int.from_bytes(digest[:16], "little")


_STREAM_DOMAIN = b"sparkpriv/stream/aes128-ctr/v1"


def _int_field(x: int) -> bytes:
    """An unambiguous encoding of an integer: 4-byte length, then two's complement big-endian."""
    b = int(x).to_bytes(int(x).bit_length() // 8 + 1, "big", signed=True)
    return len(b).to_bytes(4, "big") + b


def _stream_key(seed: int, *key: int) -> int:
    """The 128-bit AES key of :func:`stream` (HMAC-SHA256 of the path, keyed by the seed).

    ``HMAC-SHA256(seed, domain || n || field(key_1) || ... || field(key_n))``,
    first 16 bytes, where each integer is length-prefixed: distinct paths (or
    seeds) are distinct messages, so their keys are independent pseudorandom
    values. A secret; never log or store it.
    """
    msg = [_STREAM_DOMAIN, len(key).to_bytes(4, "big")]
    msg += [_int_field(operator.index(k)) for k in key]
    digest = hmac.new(_int_field(operator.index(seed)), b"".join(msg), hashlib.sha256).digest()
    return int.from_bytes(digest[:16], "little")


def stream(seed: int, *key: int) -> np.random.Generator:
    """An AES-128-CTR generator for ``seed`` and the public integer path ``key``.

    ``stream(job_seed, stage, partition_id)`` is the per-partition noise stream
    of a Spark task: the same arguments always give the same sequence (a
    retried task redraws the same noise), and different paths give independent
    streams (keys from ``_stream_key``). The generator is numpy's
    ``Generator`` over randomgen's ``AESCounter(key=K, counter=0)``: block ``i``
    of the stream is ``AES_K(i)``, a cryptographically secure pseudorandom
    sequence (module docstring).
    """
    bg = AESCounter(key=_stream_key(seed, *key), counter=0)
    if not bg.use_aesni:
        _warn_software_aes()
    return np.random.Generator(bg)


_warned_software_aes = False


def _warn_software_aes() -> None:
    global _warned_software_aes
    if not _warned_software_aes:
        _warned_software_aes = True
        _log.warning("this CPU has no AES-NI: noise streams use randomgen's software AES "
                     "(the same numbers, many times slower; docs/noise.md)")
