"""Where randomness comes from (MATH.md section 7).

* Secrets (projection matrices, job seeds) are drawn from the operating
  system's entropy (:func:`secrets.randbits`, i.e. ``os.urandom``).
* Noise streams are numpy ``PCG64`` generators seeded through
  ``numpy.random.SeedSequence``. Row-level noise in Spark uses one stream per
  (secret job seed, stage, partition id): a retried or recomputed task redraws
  the *same* noise, so recomputation never releases a second, independent draw.
  Aggregate noise is drawn once, on the driver.

What this does and does not protect against: PCG64 is a statistical generator,
not a cryptographic one. Its outputs are unpredictable only as long as its
128-bit seed is secret; the seed never leaves the job (it is not written,
logged, or put in a query plan). An attacker who learns the seed can remove the
noise exactly, just as one who learns the projection matrix can invert it.

Test hook: setting the environment variable ``SPARKPRIV_INSECURE_TEST_SEED`` to
an integer makes every secret deterministic (derived from that integer), so
tests can reproduce runs and scan outputs for known secrets. A release made
that way is *not private*; it is logged as an error and flagged in its receipt
(``"insecure_test_seed": true``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets

import numpy as np

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


def stream(seed: int, *key: int) -> np.random.Generator:
    """A PCG64 generator for ``seed`` and the public integer path ``key``.

    ``stream(job_seed, stage, partition_id)`` is the per-partition noise stream
    of a Spark task: the same arguments always give the same sequence, and
    different paths give independent streams (SeedSequence spawn keys).
    """
    ss = np.random.SeedSequence(entropy=seed, spawn_key=tuple(int(k) for k in key))
    return np.random.Generator(np.random.PCG64(ss))
