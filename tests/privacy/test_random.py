"""The noise streams (sparkpriv.privacy.random.stream) are AES-128-CTR under a key
derived with HMAC-SHA256 from the secret seed and the public path: checked word
for word against an independent AES and key derivation written from their
specifications, plus reproducibility (retries) and independence of paths."""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pytest

from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.random import stream
from tests.privacy._aes_reference import encrypt


def _field(x: int) -> bytes:
    b = x.to_bytes(x.bit_length() // 8 + 1, "big", signed=True)
    return len(b).to_bytes(4, "big") + b


def _spec_key(seed: int, *path: int) -> bytes:
    """docs/noise.md: HMAC-SHA256(key = field(seed), domain || n || field(p_1) ...), first 16 bytes."""
    msg = b"sparkpriv/stream/aes128-ctr/v1" + len(path).to_bytes(4, "big") + b"".join(map(_field, path))
    return hmac.new(_field(seed), msg, hashlib.sha256).digest()[:16]


def _spec_words(seed: int, path: tuple, blocks: int) -> list[int]:
    """AES-128-CTR: block i = AES_K(i as a 16-byte little-endian counter), read as two
    little-endian 64-bit words (the key's bytes in the same order as ``_spec_key``)."""
    key = _spec_key(seed, *path)
    out = []
    for i in range(blocks):
        blk = encrypt(key, i.to_bytes(16, "little"))
        out += [int.from_bytes(blk[:8], "little"), int.from_bytes(blk[8:], "little")]
    return out


def test_reference_aes_meets_the_fips_197_vector():
    key = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
    pt = bytes.fromhex("00112233445566778899aabbccddeeff")
    assert encrypt(key, pt).hex() == "69c4e0d86a7b0430d8cdb78070b4c55a"


@pytest.mark.parametrize("seed,path", [(0, ()), (123, (4, 5)), (2**128 - 1, (11, 3)),
                                       (2**127 + 99, (0, 2**40, 7)), (5, (-1,))])
def test_stream_is_aes_ctr_under_the_derived_key(seed, path):
    rng = stream(seed, *path)
    assert type(rng.bit_generator).__name__ == "AESCounter"
    got = [int(w) for w in rng.bit_generator.random_raw(10)]
    assert got == _spec_words(seed, path, 5)


def test_software_aes_gives_the_same_words():
    a, b = stream(77, 1, 2), stream(77, 1, 2)
    b.bit_generator.use_aesni = False  # randomgen's portable AES (the fallback without AES-NI)
    assert not b.bit_generator.use_aesni
    assert np.array_equal(a.bit_generator.random_raw(1000), b.bit_generator.random_raw(1000))


def test_same_seed_and_path_reproduce_the_noise_exactly():
    """A retried or recomputed task redraws the same noise (one stream per path)."""
    noise = nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=1.0, dim=8)
    x = np.random.default_rng(0).normal(size=(500, 8))
    a = nz.add_noise(x, noise, stream(2**100 + 3, 7, 41))
    b = nz.add_noise(x, noise, stream(2**100 + 3, 7, 41))
    assert np.array_equal(a, b)
    c = nz.add_noise(x, noise, stream(2**100 + 3, 7, 42))
    assert not np.any(a == c)  # t ~ 2^40 grid steps: equal entries have probability ~1e-12


def test_paths_and_seeds_are_encoded_unambiguously():
    """Paths that would collide under a naive concatenation give different streams."""
    cases = [(1, ()), (1, (0,)), (1, (0, 0)), (1, (1, 2)), (1, (12,)), (1, (258,)),
             (1, (1, 0, 2)), (1, (-1,)), (1, (255,)), (258, ()), (2, (1,)), (0, (1, 1))]
    first = {tuple(int(w) for w in stream(s, *p).bit_generator.random_raw(2)) for s, p in cases}
    assert len(first) == len(cases)


def test_receipts_name_the_generator():
    lap = nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=1.0, dim=3).to_public_dict()
    gau = nz.calibrate_gaussian_noise(sensitivity=1.0, epsilon=1.0, delta=1e-6, dim=3).to_public_dict()
    for pub in (lap, gau):
        assert "AES-128-CTR" in pub["generator"]
        assert "PCG64" not in repr(pub)
