"""What the peers' oracle cases share (tests/cli/*_cases.py; Python stdlib only): float32 rounding and bit
patterns, the SHA-256 digests of inputs and outputs both sides record, and the E4M3 value list. The oracle
scripts (scripts/*_oracle.py) reach these through their cases module."""
import hashlib
import struct


def f32(v):
    """v rounded to float32 (nearest even), as a Python float."""
    return struct.unpack('<f', struct.pack('<f', v))[0]


def bits(v):
    return struct.unpack('<I', struct.pack('<f', v))[0]


def from_bits(u):
    return struct.unpack('<f', struct.pack('<I', u & 0xFFFFFFFF))[0]


def step(v, n):
    """The float32 n ulps above (n > 0) or below v > 0."""
    return from_bits(bits(v) + n)


def f32_bytes(vals):
    """The little-endian float32 bytes of the values (NaN as 0x7FC00000: struct's)."""
    return struct.pack('<%df' % len(vals), *vals)


def digest_bytes(b):
    return hashlib.sha256(bytes(b)).hexdigest()


def digest_input(vals):
    return hashlib.sha256(f32_bytes(vals)).hexdigest()


def e4m3_values():
    """The non-negative finite E4M3 (fn) values, ascending."""
    out = [m / 8 * 2.0 ** -6 for m in range(8)]
    for e in range(1, 16):
        out += [(1 + m / 8) * 2.0 ** (e - 7) for m in range(8) if not (e == 15 and m == 7)]
    return out
