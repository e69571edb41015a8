"""The inputs and cases on which fp4lab's fp4tk quantizers are checked against
fp4-trainkit's own code (Python stdlib only).

scripts/fp4tk_oracle.py runs fp4-trainkit's simulators on these inputs (torch,
on the GPU machine) and records a SHA-256 of each output in
tests/data/fp4tk_oracle.json; tests/cli/test_fp4tk.py regenerates the same
inputs, runs `fp4lab quantize` and compares the hashes. Every input is built
from a fixed seed with Python's `random` and exact float32 bit patterns, so
both sides see the same bits.
"""
import hashlib
import math
import random
import struct

from oracle_common import bits, f32, from_bits, step  # noqa: F401 (re-exported: float32 helpers)


def _normal(rng, rows, cols):
    """Gaussian values, each row of 32 with its own magnitude 10^U(-8, 4)."""
    x = []
    for r in range(rows):
        for c0 in range(0, cols, 32):
            mag = 10.0 ** rng.uniform(-8, 4)
            x += [f32(rng.gauss(0, 1) * mag) for _ in range(32)]
    return x


def _grid(rng, rows, cols):
    """Every block's amax is 6 (row 0 and every 16th column are +-6), so every
    rule's scale is 1 and the other elements meet E2M1's rounding directly:
    the thresholds 0.25 ... 5 and one and two ulps around them, the tops of
    binades (1.75 .. 2, 3.5 .. 4), tiny and subnormal values, signed zeros."""
    special = [0.0, -0.0, 2.0 ** -24, 2.0 ** -23, 2.0 ** -22, 1e-30, 2.0 ** -149, 6.0, 5.999999, 7.0, 100.0]
    for t in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0):
        for n in (-2, -1, 0, 1, 2):
            special.append(step(t, n))
    special += [f32(1.75 + i / 64.0) for i in range(17)] + [f32(3.5 + i / 32.0) for i in range(17)]
    vals = special + [-v for v in special]
    x = []
    for r in range(rows):
        for c in range(cols):
            if r % 16 == 0 or c % 16 == 0:
                x.append(6.0 if (r + c) % 2 == 0 else -6.0)
            elif vals:
                x.append(vals.pop())
            else:
                x.append(f32(rng.uniform(-6, 6)))
    return x


def _blocks_with_amax(rng, amaxes, k, cols):
    """Row blocks of k elements, block i with amax amaxes[i] at a random
    position and the rest amax * U(-1, 1)."""
    x = []
    for a in amaxes:
        blk = [f32(a * rng.uniform(-1, 1)) for _ in range(k)]
        blk[rng.randrange(k)] = a if rng.random() < 0.5 else -a
        x += blk
    while len(x) % cols:
        x += [f32(rng.uniform(-1, 1))] * 1
    return x


def _mx_scale_edges(rng, cols):
    """Block amaxes one and two ulps around 4 * 2^k and 6 * 2^k (where
    floor(log2(amax / 4)) and ceil(log2(amax / 6)) change), subnormal
    and near-eps amaxes included, k from -140 to 125."""
    amaxes = []
    for k in range(-140, 126):
        for m in (4.0, 6.0):
            base = f32(m * 2.0 ** k)
            if base == 0.0:
                continue
            for n in (-2, -1, 0, 1, 2):
                a = step(base, n)
                if 0 < a < float('inf'):
                    amaxes.append(a)
    return _blocks_with_amax(rng, amaxes, 32, cols)


def _e4m3_values():
    v = []
    for e in range(16):
        for m in range(8):
            if e == 15 and m == 7:
                continue
            v.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))
    return v


def _nv_scale_edges(rng, cols):
    """Block amaxes whose amax / 6 lies on, between and one ulp around every
    E4M3 value and midpoint, and around the clamps 2^-9 and 448."""
    e4 = _e4m3_values()
    targets = set(e4)
    for a, b in zip(e4, e4[1:]):
        targets.add((a + b) / 2)
    targets |= {2.0 ** -10, 2.0 ** -12, 460.0, 464.0, 480.0, 1000.0}
    amaxes = []
    for t in sorted(targets):
        base = f32(6.0 * t)
        for n in (-1, 0, 1):
            amaxes.append(step(base, n))
    return _blocks_with_amax(rng, amaxes, 16, cols)


def _specials(rng, rows, cols):
    """Blocks of 16 (rows) holding NaN, +-Inf, all zeros, all -0, values below
    2^-23, float32 subnormals, and amaxes near FLT_MAX (amax * 2 overflows)."""
    x = [f32(rng.gauss(0, 1)) for _ in range(rows * cols)]
    nan, inf = float('nan'), float('inf')
    pats = [
        [nan] + [1.0] * 15, [inf] + [1.0] * 15, [-inf, 2.0] + [0.5] * 14, [0.0] * 16, [-0.0] * 16,
        [1e-8 * (i - 8) for i in range(16)], [2.0 ** -149 * i for i in range(16)], [3e38, -1e38] + [1.0] * 14,
        [f32(1.7e38)] + [1e30] * 15, [2.0 ** -130] * 16,
    ]
    for i, p in enumerate(pats * 3):
        r, c0 = (i * 5) % rows, (16 * i) % cols
        for j, v in enumerate(p):
            x[r * cols + c0 + j] = f32(v) if not math.isnan(v) else v
    # a column of NaN and one of Inf for the column-wise cases
    for r in range(rows):
        x[r * cols + 47] = nan if r == 3 else x[r * cols + 47]
        x[r * cols + 63] = inf if r == 20 else x[r * cols + 63]
    return x


def inputs():
    """name -> (rows, cols, float32 values row-major). Deterministic."""
    out = {}
    rng = random.Random(20261125)
    out['normal'] = (64, 64, _normal(rng, 64, 64))
    out['grid'] = (32, 64, _grid(rng, 32, 64))
    mx = _mx_scale_edges(rng, 64)
    out['mx_scale_edges'] = (len(mx) // 64, 64, mx)
    nv = _nv_scale_edges(rng, 64)
    out['nv_scale_edges'] = (len(nv) // 64, 64, nv)
    out['specials'] = (64, 64, _specials(rng, 64, 64))
    return out


def words(name, rows, cols):
    """The uint32 random words of stochastic rounding for an input:
    word r * cols + c is element (r, c)'s (fp4lab's per_element contract)."""
    rng = random.Random('words:' + name)
    return [rng.getrandbits(32) for _ in range(rows * cols)]


# (format, fp4-trainkit ScaleImpl, fp4lab quantizer)
QUANTIZERS = [
    ('mxfp4', 'MX', {'element': 'e2m1', 'scale': 'e8m0', 'scale_rule': 'ocp', 'emulate': 'fp4tk'}, 32),
    ('mxfp4', 'Nvidia_To_Infinity', {'element': 'e2m1', 'scale': 'e8m0', 'scale_rule': 'ceil', 'emulate': 'fp4tk'}, 32),
    ('mxfp4', 'TetraJet', {'element': 'e2m1', 'scale': 'e8m0', 'scale_rule': 'tetrajet', 'emulate': 'fp4tk'}, 32),
    ('nvfp4', 'FP4_All_The_Way', {'element': 'e2m1', 'scale': 'ue4m3', 'scale_rule': 'nv_noglobal', 'global_scale': 'none',
                                  'emulate': 'fp4tk'}, 16),
]


def cases():
    """Every (input, quantizer, axis, rounding) whose block axis divides by K
    (fp4-trainkit refuses the others). Returns dicts with name, input, fmt,
    scale_impl, axis ('row' = fp4-trainkit's RowWise), round ('rn' | 'rs'),
    quantizer (fp4lab JSON object)."""
    shapes = {k: (v[0], v[1]) for k, v in inputs().items()}
    out = []
    for inp, (rows, cols) in shapes.items():
        for fmt, impl, q, k in QUANTIZERS:
            if inp == 'mx_scale_edges' and fmt != 'mxfp4':
                continue
            if inp == 'nv_scale_edges' and fmt != 'nvfp4':
                continue
            for axis in ('row', 'col'):
                if (cols if axis == 'row' else rows) % k:
                    continue
                if inp.endswith('scale_edges') and axis == 'col':
                    continue
                for rnd in ('rn', 'rs'):
                    spec = dict(q, block=[1, k] if axis == 'row' else [k, 1], round=rnd)
                    out.append({'name': '%s-%s-%s-%s' % (inp, impl, axis, rnd), 'input': inp, 'fmt': fmt,
                                'scale_impl': impl, 'axis': axis, 'round': rnd, 'quantizer': spec})
    return out


def digest(vals_bits):
    """SHA-256 of float32 bit patterns (little endian), every NaN written as
    0x7FC00000 (NaN payloads and signs are not part of the contract)."""
    h = hashlib.sha256()
    buf = bytearray()
    for u in vals_bits:
        if (u & 0x7F800000) == 0x7F800000 and (u & 0x7FFFFF):
            u = 0x7FC00000
        buf += struct.pack('<I', u)
    h.update(bytes(buf))
    return h.hexdigest()
