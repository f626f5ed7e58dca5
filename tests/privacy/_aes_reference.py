"""A small pure-Python AES-128 (FIPS-197), written from the standard: the
independent reference that tests/privacy/test_random.py checks the noise
streams against. Slow (about 1 ms a block); tests only."""

def _xt(a):
    a <<= 1
    return (a ^ 0x11B) if a & 0x100 else a

def _sbox():
    # multiplicative inverse in GF(2^8) followed by the affine map (FIPS-197 5.1.1)
    inv = [0] * 256
    for a in range(1, 256):
        for b in range(1, 256):
            p, x, y = 0, a, b
            while y:
                if y & 1:
                    p ^= x
                x, y = _xt(x), y >> 1
            if p == 1:
                inv[a] = b
                break
    box = []
    for a in range(256):
        b = inv[a]
        r = b
        for i in range(1, 5):
            r ^= ((b << i) | (b >> (8 - i))) & 0xFF
        box.append(r ^ 0x63)
    return box

SBOX = _sbox()

def _expand(key):
    w = [list(key[4 * i:4 * i + 4]) for i in range(4)]
    rcon = 1
    for i in range(4, 44):
        t = list(w[i - 1])
        if i % 4 == 0:
            t = [SBOX[b] for b in t[1:] + t[:1]]
            t[0] ^= rcon
            rcon = _xt(rcon)
        w.append([a ^ b for a, b in zip(w[i - 4], t)])
    return [sum(w[4 * r:4 * r + 4], []) for r in range(11)]

def encrypt(key: bytes, block: bytes) -> bytes:
    rk = _expand(key)
    s = [a ^ b for a, b in zip(block, rk[0])]
    for r in range(1, 11):
        s = [SBOX[b] for b in s]
        s = [s[(i + 4 * (i % 4)) % 16] for i in range(16)]  # ShiftRows (column-major state)
        if r != 10:
            out = []
            for c in range(4):
                a = s[4 * c:4 * c + 4]
                out += [_xt(a[0]) ^ _xt(a[1]) ^ a[1] ^ a[2] ^ a[3],
                        a[0] ^ _xt(a[1]) ^ _xt(a[2]) ^ a[2] ^ a[3],
                        a[0] ^ a[1] ^ _xt(a[2]) ^ _xt(a[3]) ^ a[3],
                        _xt(a[0]) ^ a[0] ^ a[1] ^ a[2] ^ _xt(a[3])]
            s = out
        s = [a ^ b for a, b in zip(s, rk[r])]
    return bytes(s)
