"""The inputs and cases on which fp4lab's emulation of Quartet II's Triton forward round-to-nearest NVFP4 fake
quantizer (emulate quartet2_triton) is checked against the Triton kernel itself (Python stdlib only).

scripts/quartet2_triton_oracle.py runs `rtn_1x16s_fp4_kernel_wrapper(x, 1.0, 16, False)` of IST-DASLab/Quartet-II
(src/models/quantization/quantizers/nvfp4_triton.py) on these float32 inputs on the GPU and records, per case, the
SHA-256 of the float32 output bytes (row-major) in tests/data/quartet2_triton_oracle.json;
tests/cli/test_quartet2_triton.py regenerates the same inputs, runs `fp4lab quantize --dequant` and compares the
hashes. Inputs are built from fixed seeds with Python's `random` and exact float32 values; the oracle file records
each input's SHA-256, so a Python whose `random` draws differently is named as such and not taken for a
disagreement.

The kernel groups 16 consecutive elements of the flattened tensor; every input has cols % 16 == 0, so each group
is a 1x16 block of one row. With amax = max |x| over the whole tensor (torch's x.abs().max(), exact):
  s_dec = amax / 448 / 6 (1 if amax == 0); s = e4m3_rn_satfinite((amax16 / 6) / s_dec), replaced by 1 if 0;
  sp = s * s_dec; q = x / sp; |q| >= 5, 3.5, 2.5, 1.75, 1.25, 0.75, 0.25 -> 6, 4, 3, 2, 1.5, 1, 0.5, else 0
  (ties away from zero); out = (that * (q > 0 ? 1 : -1)) * sp  (so a quotient of +-0 gives -0).
Triton's fp32 `/` is PTX div.full.f32. `model()` below is that arithmetic with div.full modelled as in
core/ptx_approx.hpp (fl(rcp.approx(b s) * (a s)), s scaling tiny and huge b, the product not flushed), the
rcp.approx corrections read from core/data/rcp_approx_ftz_sm90.tar.xz (the whole measured table). The E2M1 and
E4M3 ties are aimed so that this model lands exactly on them, with 1-ulp neighbours beside them; where the GPU
disagrees with the model the inputs still test fp4lab, only the tie coverage is weaker (the oracle records how
many outputs differ from the model).

Inputs: a single 1x16 block of E2M1 ties at the saturated scale; Gaussian blocks of per-block magnitudes within the
E4M3 range of the tensor's amax (8x64) and of per-block magnitudes 2^-30 .. 2^30 (64x256, most small blocks
underflowing the E4M3 scale: scale 1, outputs +-0); a 33x128 of edges (E2M1 ties and neighbours at every nonzero
E4M3 scale, a block on every E4M3 midpoint of amax16 / 6 / s_dec, the 2^-10 underflow tie and its neighbours,
saturation at 448 from the amax and its ulps below, all +0 / all -0 / mixed zero blocks, +0 and -0 inside nonzero
blocks); an 8x64 of the largest finite floats (amax FLT_MAX, where 6 * sp may round past FLT_MAX). No NaN or Inf.
"""
import os
import random
import tarfile

from fp4tk_cases import bits, f32 as _f32_small, from_bits  # noqa: F401 (float32 helpers)
from oracle_common import digest_bytes, digest_input, e4m3_values, f32_bytes  # noqa: F401 (re-exported to the oracle scripts)

INNER = 16
FLT_MAX = from_bits(0x7F7FFFFF)
QUANTIZER = {'element': 'e2m1', 'scale': 'ue4m3', 'block': [1, INNER], 'scale_rule': 'nv',
             'global_scale': 'tensor_amax', 'round': 'rna', 'overflow': 'saturate', 'emulate': 'quartet2_triton'}
E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'core', 'data',
                     'rcp_approx_ftz_sm90.tar.xz')
_table = []


def f32(v):
    """v rounded to float32 (nearest even), overflowing to +-Inf, as a Python float."""
    if abs(v) <= FLT_MAX:
        return _f32_small(v)
    if abs(v) >= 2.0 ** 128 - 2.0 ** 103:  # FLT_MAX + half an ulp and beyond
        return float('inf') if v > 0 else float('-inf')
    return FLT_MAX if v > 0 else -FLT_MAX


def ulps(v, n):
    """The float32 n ulps above (n > 0) or below the float32 v >= 0; None outside [0, FLT_MAX]."""
    u = bits(v) + n
    return from_bits(u) if 0 <= u <= 0x7F7FFFFF else None


def _corr(m):
    """rcp.approx's measured correction (ulps) for the mantissa m (core/ptx_approx.cpp's table)."""
    if not _table:
        with tarfile.open(TABLE, 'r:xz') as t:
            _table.append(t.extractfile('rcp_approx_ftz_sm90.bin').read())
    return (0, 1, -1, 0)[(_table[0][m >> 2] >> (2 * (m & 3))) & 3]


def rcp(b):
    """The model of rcp.approx.ftz.f32(b) (core/ptx_approx.cpp)."""
    u = bits(b)
    s, e, m = u & 0x80000000, (u >> 23) & 0xFF, u & 0x7FFFFF
    assert e != 0xFF
    if e == 0:
        return from_bits(s | 0x7F800000)
    r1 = bits(_f32_small(1.0 / from_bits(0x3F800000 | m))) + _corr(m)
    re = ((r1 >> 23) & 0xFF) + 127 - e
    return from_bits(s) if re <= 0 else from_bits(s | (re << 23) | (r1 & 0x7FFFFF))


def div_full(a, b):
    """The model of div.full.f32(a, b) (core/ptx_approx.hpp): fl(rcp(fl(b s)) * fl(a s))."""
    ab = abs(b)
    s = 0.25 if ab > 2.0 ** 126 else (2.0 ** 24 if ab < 2.0 ** -126 else 1.0)
    return f32(rcp(f32(b * s)) * f32(a * s))


def e4m3_rn_satfinite(r):
    """cvt.rn.satfinite.e4m3x2.f32 of r >= 0, as a float."""
    if r >= 448.0:
        return 448.0
    if r < 2.0 ** -6:
        return round(r / 2.0 ** -9) * 2.0 ** -9
    e = 0
    while 2.0 ** (e + 1) <= r:
        e += 1
    while 2.0 ** e > r:
        e -= 1
    st = 2.0 ** (e - 3)
    return min(448.0, round(r / st) * st)


def s_dec_of(amax):
    return 1.0 if amax == 0 else div_full(div_full(amax, 448.0), 6.0)


def block_scale(amax16, s_dec):
    s = e4m3_rn_satfinite(div_full(div_full(amax16, 6.0), s_dec))
    return 1.0 if s == 0 else s


def rtn(q):
    a = abs(q)
    for t, v in ((5, 6.0), (3.5, 4.0), (2.5, 3.0), (1.75, 2.0), (1.25, 1.5), (0.75, 1.0), (0.25, 0.5)):
        if a >= t:
            return v * (1 if q > 0 else -1)
    return 0.0 * (1 if q > 0 else -1)


def model(vals):
    """The kernel's output (float32 values, flattened) under the div.full model above."""
    amax = max(abs(v) for v in vals) if vals else 0.0
    s_dec = s_dec_of(amax)
    out = []
    for i in range(0, len(vals), INNER):
        blk = vals[i:i + INNER]
        sp = f32(block_scale(max(abs(v) for v in blk), s_dec) * s_dec)
        out += [f32(rtn(div_full(v, sp)) * sp) for v in blk]
    return out


def e4m3_midpoints():
    v = e4m3_values()
    return [(a + b) / 2 for a, b in zip(v, v[1:])]


def _aim(target, approx, fn, span=8):
    """The float32 x within `span` ulps of approx (nearest first) whose fn(x) == target; approx if none."""
    for d in [0] + [s * i for i in range(1, span + 1) for s in (1, -1)]:
        x = ulps(approx, d)
        if x is not None and x > 0 and fn(x) == target:
            return x
    return approx


def _signed(rng, v):
    return v if rng.random() < 0.5 else -v


def _pad(rng, blk, amax16, zeros=0):
    """Fill the block to 16 with values of magnitude below amax16 (`zeros` of them +0 / -0), then shuffle."""
    for _ in range(zeros):
        if len(blk) < INNER:
            blk.append(0.0 if rng.random() < 0.5 else -0.0)
    while len(blk) < INNER:
        blk.append(_signed(rng, f32(amax16 * rng.uniform(0, 1))))
    rng.shuffle(blk)
    return blk


def _amax_for_ratio(t, s_dec, top):
    """An amax16 <= top whose model ratio (amax16 / 6) / s_dec is t (nearest found)."""
    a = _aim(t, f32(min(top, 6.0 * t * s_dec)), lambda v: div_full(div_full(v, 6.0), s_dec))
    return min(a, top)


def _tie_block(rng, s_dec, s, top):
    """A 1x16 block of scale s (amax16 aimed at ratio s, at most the tensor's amax `top`) holding the E2M1 ties
    times sp = fl(s' s_dec) (s' the block's scale under the model), aimed so that the model's x / sp is the tie
    exactly, and 1-ulp neighbours of each, plus a +0 or -0."""
    amax16 = _amax_for_ratio(s, s_dec, top)
    sp = f32(block_scale(amax16, s_dec) * s_dec)
    blk = [_signed(rng, amax16)]
    for i, m in enumerate(E2M1_TIES):
        x = _aim(m, f32(m * sp), lambda v: div_full(v, sp))
        if x >= amax16:
            continue
        blk.append(_signed(rng, x))
        n = ulps(x, 1 if i % 2 else -1)
        if n is not None and 0 < n < amax16:
            blk.append(_signed(rng, n))
    blk = blk[:INNER - 1] + [0.0 if rng.random() < 0.5 else -0.0]
    return _pad(rng, blk, amax16)


def _ratio_block(rng, s_dec, t, top, nudge=0):
    """A block whose amax16 puts the model's ratio at t (then moved `nudge` ulps)."""
    a = _amax_for_ratio(t, s_dec, top)
    if nudge:
        a = min(top, ulps(a, nudge))
    return _pad(rng, [_signed(rng, a)], a, zeros=rng.randrange(3))


def _randn_block(rng, mag, zeros=0.01):
    return [(0.0 if rng.random() < 0.5 else -0.0) if rng.random() < zeros else f32(rng.gauss(0, 1) * mag)
            for _ in range(INNER)]


def _zero_blocks():
    mixed = [0.0 if i % 3 else -0.0 for i in range(INNER)]
    return [[0.0] * INNER, [-0.0] * INNER, mixed]


def _rows(blocks, rows, cols):
    x = [v for b in blocks for v in b]
    assert all(len(b) == INNER for b in blocks)
    assert len(x) == rows * cols, (len(x), rows, cols)
    return rows, cols, x


def _fill(rng, blocks, n, mag):
    assert len(blocks) <= n, (len(blocks), n)
    while len(blocks) < n:
        blocks.append(_randn_block(rng, mag * 2.0 ** -rng.uniform(0, 14), zeros=0.05))
    return blocks


def _ties_1x16():
    """One block: the amax 2688 + 35 ulps (ratio ~448, the saturated scale; chosen so that the model hits all 7
    ties exactly), the 7 ties times sp and a neighbour of each, and -0.0."""
    rng = random.Random(1)
    amax = ulps(2688.0, 35)
    s_dec = s_dec_of(amax)
    sp = f32(block_scale(amax, s_dec) * s_dec)
    blk = [amax]
    for i, m in enumerate(E2M1_TIES):
        x = _aim(m, f32(m * sp), lambda v: div_full(v, sp))
        blk += [_signed(rng, x), _signed(rng, ulps(x, 1 if i % 2 else -1))]
    blk.append(-0.0)
    rng.shuffle(blk)
    return _rows([blk], 1, 16)


def _edges_33x128(rng):
    """264 blocks under amax 336 = 2688 / 8 (block 0 holds it)."""
    amax = f32(2688.0 * 2.0 ** -3)
    s_dec = s_dec_of(amax)
    blocks = [_pad(rng, [_signed(rng, amax)], amax, zeros=2)]
    for s in e4m3_values()[1:]:  # 126 tie blocks: every nonzero E4M3 scale
        blocks.append(_tie_block(rng, s_dec, s, amax))
    for t in e4m3_midpoints():  # 126 ratio ties, 2^-10 (0 | 2^-9) .. 432 (416 | 448)
        blocks.append(_ratio_block(rng, s_dec, t, amax))
    for t, n in ((2.0 ** -10, -1), (2.0 ** -10, 1), (2.0 ** -11, 0), (2.0 ** -30, 0)):
        blocks.append(_ratio_block(rng, s_dec, t, amax, nudge=n))
    for n in (0, -1, -2, -3):  # saturation: amax16 at the tensor's amax and its ulps below (ratio ~448)
        a = ulps(amax, n)
        blocks.append(_pad(rng, [_signed(rng, a)], a))
    blocks += _zero_blocks()
    return _rows(_fill(rng, blocks, 33 * 128 // INNER, amax), 33, 128)


def _fltmax_8x64(rng):
    """32 blocks under amax FLT_MAX: the largest floats, ties at large scales, zeros, underflow."""
    s_dec = s_dec_of(FLT_MAX)
    blocks = [_pad(rng, [_signed(rng, FLT_MAX)], FLT_MAX, zeros=1),
              [FLT_MAX if i % 2 else -FLT_MAX for i in range(INNER)]]
    for n in (1, 2, 7, 100):
        a = ulps(FLT_MAX, -n)
        blocks.append(_pad(rng, [_signed(rng, a), _signed(rng, ulps(a, -1))], a))
    for _ in range(4):
        blocks.append([_signed(rng, f32(2.0 ** rng.uniform(100, 127.99))) for _ in range(INNER)])
    for s in (448.0, 416.0, 1.0, 13.0, 240.0, 2.0 ** -9, 0.0546875, 1.875):
        blocks.append(_tie_block(rng, s_dec, s, FLT_MAX))
    for t in (432.0, 2.0 ** -10, 3 * 2.0 ** -10, 0.96875):
        blocks.append(_ratio_block(rng, s_dec, t, FLT_MAX))
    blocks += _zero_blocks()
    return _rows(_fill(rng, blocks, 8 * 64 // INNER, 2.0 ** 126), 8, 64)


def _randn(rng, rows, cols, lo, hi, zeros=0.01, zero_blocks=0.0):
    """Gaussian blocks of magnitude 2^U(lo, hi) each; `zero_blocks` of them all +-0; `zeros` of values +-0."""
    blocks = []
    for _ in range(rows * cols // INNER):
        if rng.random() < zero_blocks:
            blocks.append(_zero_blocks()[rng.randrange(3)])
        else:
            blocks.append(_randn_block(rng, 2.0 ** rng.uniform(lo, hi), zeros))
    return _rows(blocks, rows, cols)


def inputs():
    """name -> (rows, cols, float32 values row-major)."""
    rng = random.Random(20261204)
    out = {'ties_1x16': _ties_1x16()}
    k = rng.uniform(-30, 30)
    out['randn_8x64'] = _randn(rng, 8, 64, k - 16, k, zeros=0.03, zero_blocks=1 / 32)
    out['fltmax_8x64'] = _fltmax_8x64(rng)
    out['edges_33x128'] = _edges_33x128(rng)
    out['randn_64x256'] = _randn(rng, 64, 256, -30, 30, zeros=0.01, zero_blocks=1 / 64)
    for name, (rows, cols, x) in out.items():
        assert len(x) == rows * cols and cols % INNER == 0, name
        assert all(f32(v) == v and abs(v) <= FLT_MAX for v in x), name
    return out


def cases():
    """One case per input, all under the one quantizer."""
    return [{'name': name, 'input': name, 'quantizer': QUANTIZER}
            for name in ('ties_1x16', 'randn_8x64', 'fltmax_8x64', 'edges_33x128', 'randn_64x256')]
