"""The inputs and cases on which fp4lab's torchao MX scale rules (torchao_floor, torchao_ceil, torchao_even,
torchao_rceil: schemes/mx_scale_modes/scalar.hpp) are checked against torchao's own `to_mx` (Python stdlib only).

scripts/mx_modes_oracle.py runs torchao's to_mx (torchao/prototype/mx_formats/mx_tensor.py, ScaleCalculationMode
FLOOR / CEIL / EVEN / RCEIL) on these inputs (torch, on the GPU machine, on the GPU and on the CPU) and records a
SHA-256 of the element codes and of the E8M0 scale bytes of each case in tests/data/mx_modes_oracle.json;
tests/cli/test_mx_modes.py regenerates the same inputs, runs `fp4lab quantize` and compares the hashes.
Every case is blocks of 32 along rows ([1,32], to_mx's block_size 32 on the last dimension), elements e2m1,
e2m3, e3m2, e4m3, e5m2 (torchao's SUPPORTED_ELEM_DTYPES), RN, saturating. Inputs are built from fixed seeds with
Python's `random` and exact float32 values; the oracle file also records each input's SHA-256, so a Python
whose `random` draws differently is named as such and not taken for a disagreement.

to_mx needs the last dimension to be a multiple of the block size; the oracle pads the inputs `partial` and
`narrow` with zero columns and drops the padding's codes (zeros do not change a block's amax, NaN included), which
is fp4lab's partial-block rule (amax over the valid elements, DESIGN.md 'Blocks, edges and special values').
"""
import math
import random

from fp4tk_cases import bits, f32, from_bits  # noqa: F401 (float32 helpers)
from oracle_common import digest_bytes, digest_input, f32_bytes  # noqa: F401 (re-exported to the oracle scripts)

BLOCK = 32
FLT_MAX = from_bits(0x7F7FFFFF)
INF = float('inf')
NAN = float('nan')

# short name -> (exponent bits, mantissa bits, kind, max finite, emax = torchao's *_MAX_POW2).
# kind: 'fn' no Inf/NaN codes ('fn8': e4m3fn, S.1111.111 is NaN), 'ieee' (e5m2: top exponent is Inf/NaN).
ELEMENTS = {
    'e2m1': (2, 1, 'fn', 6.0, 2),
    'e2m3': (2, 3, 'fn', 7.5, 2),
    'e3m2': (3, 2, 'fn', 28.0, 4),
    'e4m3': (4, 3, 'fn8', 448.0, 8),
    'e5m2': (5, 2, 'ieee', 57344.0, 15),
}
MODES = ('floor', 'ceil', 'even', 'rceil')


def f32c(v):
    """v rounded to float32, clamped to +-FLT_MAX first (no overflow to Inf)."""
    return f32(max(-FLT_MAX, min(FLT_MAX, v)))


def ulps(v, n):
    """The float32 n ulps above (n > 0) or below the float32 v >= 0; None outside [0, FLT_MAX]."""
    u = bits(v) + n
    return from_bits(u) if 0 <= u <= 0x7F7FFFFF else None


def element_values(elem):
    """The element format's non-negative finite values, ascending."""
    eb, mb, kind, _, _ = ELEMENTS[elem]
    bias = (1 << (eb - 1)) - 1
    out = []
    for e in range(1 << eb):
        for m in range(1 << mb):
            if kind == 'ieee' and e == (1 << eb) - 1:
                continue
            if kind == 'fn8' and e == (1 << eb) - 1 and m == (1 << mb) - 1:
                continue
            out.append(m / (1 << mb) * 2.0 ** (1 - bias) if e == 0 else (1 + m / (1 << mb)) * 2.0 ** (e - bias))
    return sorted(out)


def _block(rng, a):
    """32 float32 values of amax exactly |a|: a * U(-1, 1), and +-a at a random position."""
    blk = [f32(a * rng.uniform(-1, 1)) for _ in range(BLOCK)]
    blk[rng.randrange(BLOCK)] = a if rng.random() < 0.5 else -a
    return blk


def _fill(rng, blocks, cols, lo=-30, hi=30):
    """Lay the blocks (lists of 32) out row-major in rows of `cols` (a multiple of 32), padding the last row with
    Gaussian blocks of magnitude 2^U(lo, hi). -> (rows, cols, values)."""
    per_row = cols // BLOCK
    while len(blocks) % per_row:
        mag = 2.0 ** rng.uniform(lo, hi)
        blocks.append([f32c(rng.gauss(0, 1) * mag) for _ in range(BLOCK)])
    x = [v for b in blocks for v in b]
    return len(blocks) // per_row, cols, x


def _edge_amaxes():
    """Block amaxes on and around each rule's thresholds:
    - every power of two 2^-149 .. 2^127 and 1, 2 ulps either side (FLOOR / CEIL: amax's mantissa 0 or not;
      subnormal amaxes, which torchao reads as 2^-127, and the clamp of the exponent at -127);
    - max_pos * 2^k and 1 ulp either side for each element's max_pos (RCEIL: amax * fl(1/max_pos) a power of
      two), down into the float32 subnormals;
    - amaxes whose fl(amax * fl(1/max_pos)) is at or next to 2^-127 (0x00400000: RCEIL's subnormal round-up
      threshold), 2^-126, the smallest subnormals;
    - (2 - 2^-(m+1)) * 2^k and 1 ulp either side for m = 1, 2, 3 (EVEN: where amax rounded to m mantissa bits
      carries into the next power of two);
    - FLT_MAX and the ulps below it, 2^127 (the top of the scale range), 0 and the tiniest subnormals."""
    out = []
    for k in range(-149, 128):
        for n in (-2, -1, 0, 1, 2):
            v = ulps(2.0 ** k, n)
            if v:
                out.append(v)
    for mp in sorted(set(e[3] for e in ELEMENTS.values())):
        for k in range(-152, 128):
            base = mp * 2.0 ** k
            if base > FLT_MAX or base < 2.0 ** -149:
                continue
            base = f32(base)
            for n in (-1, 0, 1):
                v = ulps(base, n)
                if v:
                    out.append(v)
        for db in (1, 2, 3, 0x3FFFFE, 0x3FFFFF, 0x400000, 0x400001, 0x400002, 0x7FFFFF, 0x800000, 0x800001,
                   0x3F800000):
            base = f32(from_bits(db) * mp)
            for n in range(-4, 5):
                v = ulps(base, n)
                if v:
                    out.append(v)
    for m in (1, 2, 3):
        t = 2.0 - 2.0 ** -(m + 1)
        for k in range(-149, 128):
            base = t * 2.0 ** k
            if base < 2.0 ** -149 or base > FLT_MAX:
                continue
            base = f32(base)
            for n in (-1, 0, 1):
                v = ulps(base, n)
                if v:
                    out.append(v)
    out += [ulps(FLT_MAX, -n) for n in range(0, 5)] + [2.0 ** 127, f32(1.5 * 2.0 ** 127), f32(1.75 * 2.0 ** 127)]
    out += [2.0 ** -149, 2.0 ** -148, from_bits(3), 0.0]
    return out


def _edges(rng):
    blocks = [_block(rng, a) for a in _edge_amaxes()]
    # Blocks all zero, all -0, +-0 mixed, one tiny value among zeros, all +-amax, a lone FLT_MAX.
    blocks.append([0.0] * BLOCK)
    blocks.append([-0.0] * BLOCK)
    blocks.append([0.0 if i % 2 else -0.0 for i in range(BLOCK)])
    blocks.append([0.0] * 31 + [-(2.0 ** -149)])
    blocks.append([6.0 if i % 2 else -6.0 for i in range(BLOCK)])
    blocks.append([-FLT_MAX] * BLOCK)
    blocks.append([FLT_MAX] + [1.0] * 31)
    return _fill(rng, blocks, 256)


def _normal(rng, rows, cols, lo, hi):
    """Gaussian values, each block with its own magnitude 2^U(lo, hi); 3% of blocks all zero."""
    x = []
    for _ in range(rows):
        for c0 in range(0, cols, BLOCK):
            n = min(BLOCK, cols - c0)
            if rng.random() < 0.03:
                x += [0.0] * n
                continue
            mag = 2.0 ** rng.uniform(lo, hi)
            x += [f32c(rng.gauss(0, 1) * mag) for _ in range(n)]
    return x


def _lognormal(rng, rows, cols):
    """Signed lognormal values exp(N(mu, 2.5)), mu per row U(-40, 40): heavy-tailed blocks."""
    x = []
    for _ in range(rows):
        mu = rng.uniform(-40, 40)
        for _ in range(cols):
            v = f32c(math.exp(min(88.0, rng.gauss(mu, 2.5))))
            x.append(v if rng.random() < 0.5 else -v)
    return x


def _tiny(rng, rows, cols):
    """Magnitudes 2^U(-149, -110): blocks whose amax is a float32 subnormal or just above."""
    x = []
    for _ in range(rows):
        for c0 in range(0, cols, BLOCK):
            hi = rng.uniform(-149, -110)
            for _ in range(BLOCK):
                v = f32(2.0 ** rng.uniform(-149, hi)) if rng.random() < 0.9 else 0.0
                x.append(v if rng.random() < 0.5 else -v)
    return x


def _partial(rng, rows, cols):
    """Rows whose last block is partial; amaxes of the partial blocks from the edge list."""
    am = _edge_amaxes()
    x = []
    for r in range(rows):
        for c0 in range(0, cols, BLOCK):
            n = min(BLOCK, cols - c0)
            a = am[rng.randrange(len(am))]
            blk = [f32(a * rng.uniform(-1, 1)) for _ in range(n)]
            blk[rng.randrange(n)] = a if rng.random() < 0.5 else -a
            x += blk
    return x


def _inf_nan(rng):
    """Blocks with Inf, -Inf, NaN (positive) among finite values, alone and together, next to FLT_MAX; one
    block all NaN, one all Inf; every other block finite (so a non-finite value's reach is seen)."""
    blocks = []
    specials = [[INF], [-INF], [NAN], [INF, NAN], [-INF, INF], [NAN, NAN, NAN], [INF, FLT_MAX], [NAN, -FLT_MAX],
                [NAN, 0.0], [INF, 2.0 ** -149]]
    for i in range(64):
        mag = 2.0 ** rng.uniform(-30, 30)
        blk = [f32c(rng.gauss(0, 1) * mag) for _ in range(BLOCK)]
        if i % 2 == 0:
            for v in specials[(i // 2) % len(specials)]:
                blk[rng.randrange(BLOCK)] = v
        blocks.append(blk)
    blocks.append([NAN] * BLOCK)
    blocks.append([INF if i % 2 else -INF for i in range(BLOCK)])
    return _fill(rng, blocks, 256)


def _ties(rng, elem):
    """Elements at the midpoints between the element format's neighbouring values (ties of RN), both signs, in
    blocks whose amax is max_pos * 2^s or 2^emax * 2^s (so every mode's scale is near 2^s), s over the range."""
    _, _, _, mp, emax = ELEMENTS[elem]
    vals = element_values(elem)
    mids = [(a + b) / 2 for a, b in zip(vals, vals[1:])]
    blocks = []
    i = 0
    for s in list(range(-140, 120, 9)) + [-149, -133, -127, 100, 110, 112]:
        for top in (mp, 2.0 ** emax):
            if top * 2.0 ** s > FLT_MAX:
                continue
            blk = [f32(top * 2.0 ** s) if rng.random() < 0.5 else -f32(top * 2.0 ** s)]
            tries = 0
            while len(blk) < BLOCK and tries < 64 * len(mids):
                m = mids[i % len(mids)] * 2.0 ** s
                i += 1
                tries += 1
                if m >= top * 2.0 ** s or f32(m) != m:
                    continue
                blk.append(m if rng.random() < 0.5 else -m)
            blk += [0.0] * (BLOCK - len(blk))
            rng.shuffle(blk)
            blocks.append(blk)
    return _fill(rng, blocks, 256)


def inputs():
    """name -> (rows, cols, float32 values row-major)."""
    out = {}
    rng = random.Random(20261202)
    out['edges'] = _edges(rng)
    out['normal'] = (96, 256, _normal(rng, 96, 256, -150, 124))
    out['lognormal'] = (64, 256, _lognormal(rng, 64, 256))
    out['tiny'] = (32, 256, _tiny(rng, 32, 256))
    out['partial'] = (96, 100, _partial(rng, 96, 100))
    out['narrow'] = (64, 7, _partial(rng, 64, 7))
    out['inf_nan'] = _inf_nan(rng)
    for e in ELEMENTS:
        out['ties_' + e] = _ties(rng, e)
    return out


def quantizer(elem, mode):
    """The fp4lab quantizer JSON of torchao's to_mx(x, elem, 32, ScaleCalculationMode.<mode>)."""
    return {'element': elem, 'scale': 'e8m0', 'block': [1, BLOCK], 'scale_rule': 'torchao_' + mode, 'round': 'rn',
            'overflow': 'saturate'}


def cases():
    """Every input under every element and mode, but ties_<e> only under its own element e."""
    out = []
    for inp in ('edges', 'normal', 'lognormal', 'tiny', 'partial', 'narrow', 'inf_nan') + tuple(
            'ties_' + e for e in ELEMENTS):
        for elem in ELEMENTS:
            if inp.startswith('ties_') and inp != 'ties_' + elem:
                continue
            for mode in MODES:
                out.append({'name': '%s/%s/%s' % (inp, elem, mode), 'input': inp, 'element': elem, 'mode': mode,
                            'quantizer': quantizer(elem, mode)})
    return out
