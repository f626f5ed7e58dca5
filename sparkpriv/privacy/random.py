"""Where randomness comes from (MATH.md section 7).

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

Test hook: setting the environment variable ``SPARKPRIV_INSECURE_TEST_SEED`` to
an integer makes every secret deterministic (derived from that integer), so
tests can reproduce runs and scan outputs for known secrets. A release made
that way is *not private*; it is logged as an error and flagged in its receipt
(``"insecure_test_seed": true``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import operator
import os
import secrets

import numpy as np
from randomgen import AESCounter

__all__ = [
    "TEST_SEED_ENV",
    "insecure_test_seed",
    "new_secret_seed",
    "derive_seed",
    "stream",
]

TEST_SEED_ENV = "SPARKPRIV_INSECURE_TEST_SEED"
_log = logging.getLogger(__name__)
_counter = 0


def insecure_test_seed() -> int | None:
    """The test seed if the insecure test hook is set, else None."""
    raw = os.environ.get(TEST_SEED_ENV)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        from sparkpriv.errors import ParameterError

        raise ParameterError(
            f"The environment variable {TEST_SEED_ENV} must be an integer; unset it for real releases."
        ) from None


def new_secret_seed(purpose: str) -> int:
    """A fresh 128-bit secret seed from OS entropy.

    With the test hook set, the seed is derived deterministically from the test
    seed, ``purpose`` and a per-process counter instead.
    """
    global _counter
    test = insecure_test_seed()
    if test is None:
        return secrets.randbits(128)
    _log.error(
        "%s is set: secrets are derived from a fixed test seed; this release is NOT private",
        TEST_SEED_ENV,
    )
    _counter += 1
    return derive_seed(test, f"{purpose}#{_counter}")


def reset_test_counter() -> None:
    """Reset the per-process counter used by the test hook (tests only)."""
    global _counter
    _counter = 0


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
