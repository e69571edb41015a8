"""The inputs and cases on which fp4lab's emulation of TetraJet-v2's Triton baseline NVFP4 fake quantizer
(emulate tetrajet2_triton) is checked against the Triton kernel itself (Python stdlib only).

scripts/tetrajet2_oracle.py runs `_E2M1_DoubleScale_fake_quantize_fused_kernel` (round to nearest) of
thu-ml/TetraJet-v2-NVFP4Training (kernels/baseline_fakequant/nvfp4_quant_fused_kernel.py, launched by its
nvfp4_double_quantize_fused) on these float32 inputs on the GPU and records, per case, the SHA-256 of the float32
output bytes (row-major) in tests/data/tetrajet2_oracle.json; tests/cli/test_tetrajet2.py regenerates the same
inputs, runs `fp4lab quantize --dequant` and compares the hashes. Inputs are built from fixed seeds with Python's
`random` and exact float32 values; the oracle file records each input's SHA-256, so a Python whose `random` draws
differently is named as such and not taken for a disagreement.

The kernel's outer 1x128 blocks run along the flattened tensor; every input has cols % 128 == 0, so each outer
block is 128 consecutive elements of one row (a "segment" below), holding 8 inner 1x16 blocks. Per segment
  sg = amax128 / 448 / 6 (1 if 0); s = e4m3_rn_satfinite(amax16 / sg / 6); sp = s * sg; q = x / sp (0 if sp == 0)
and q is rounded to E2M1 by floor(log2) / rint of the doubled fraction, clamped to 6, times sp, times the sign.
Triton's fp32 `/` is PTX div.full.f32, not IEEE division. The constructions below aim at exact ties *under the
div.full model of core/ptx_approx.hpp* (fl(a * rcp(b)) for normal b): for the divisors they use (448, 6, and
the scale products sg and s * sg of amaxes 2688 * 2^k and their ulp neighbours) `_RCP_CORR` holds the
measured rcp.approx corrections (core/data/rcp_approx_ftz_sm90), so `_div_full` is that model exactly. Under that model sg(2688 * 2^k) = (1 + 2^-23) 2^k (never exactly 2^k: IEEE
division would give 2^k), and the E2M1 and E4M3 ties are placed where the model lands exactly on them, with
their 1-ulp neighbours beside them. Where the GPU disagrees with the model the inputs still test fp4lab; only
the tie coverage is weaker.

Segments (each 128 values): Gaussian with per-row and per-segment magnitudes 2^-40 .. 2^40 (per-16 relative
magnitudes too, some blocks far below the segment's amax, scattered +-0); all +0, all -0, mixed +-0 with a tiny
negative; inner blocks that underflow E4M3 (amax16 / sg / 6 at, just below and above 2^-10, and far below);
inner blocks whose amax16 / sg / 6 is at every E4M3 midpoint (ties of the e4m3 cast), 448 and the saturating
top; E2M1 ties 0.25 0.75 1.25 1.75 2.5 3.5 5 (and 1-ulp neighbours) times the block's scale product, for scales
over the E4M3 range (subnormal ones too) and k = -100 .. 100; -0.0 values; FLT_MAX and the largest floats
(whose rescaled 6 * sp may overflow to Inf in the kernel); float32 subnormal and near-subnormal segments. No
NaN or Inf inputs (fp4lab does not model them for this quantizer).
"""
import random

from fp4tk_cases import bits, f32, from_bits  # noqa: F401 (float32 helpers)
from oracle_common import digest_bytes, digest_input, e4m3_values, f32_bytes  # noqa: F401 (re-exported to the oracle scripts)

OUTER = 128
INNER = 16
FLT_MAX = from_bits(0x7F7FFFFF)
QUANTIZER = {'element': 'e2m1', 'scale': 'ue4m3', 'block': [1, INNER], 'scale_rule': 'nv', 'global_scale': 'none',
             'round': 'rn', 'overflow': 'saturate', 'emulate': 'tetrajet2_triton'}
E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# rcp.approx.f32's measured correction (core/data/rcp_approx_ftz_sm90: rcp(b) - fl(1/b) in ulps) for the
# mantissas (bits 0..22) of the divisors the constructions use: 448, 6, powers of two, the model sg of the
# amaxes 2688 * 2^k moved -4 .. 4 ulps, and that sg times the 8 E4M3 mantissas.
_RCP_CORR = {0x0: 0, 0x400000: 0, 0x600000: 0,
             0x1: 0, 0x2: 0, 0x3: 0, 0x4: 0, 0xffffd: 0, 0xffffe: 0, 0xfffff: 0, 0x100001: 0, 0x100002: 0,
             0x100003: 0, 0x100004: -1, 0x1ffffd: 0, 0x1ffffe: 1, 0x1fffff: 0, 0x200001: 0, 0x200002: 0,
             0x200004: 0, 0x200005: 0, 0x2ffffd: 0, 0x2fffff: 0, 0x300001: 0, 0x300003: 1, 0x300004: 1,
             0x300006: 0, 0x3ffffc: 0, 0x3ffffd: 0, 0x3ffffe: 1, 0x3fffff: 0, 0x400002: 0, 0x400003: 0,
             0x400004: 0, 0x400006: 0, 0x4ffffc: 0, 0x4ffffd: 0, 0x4ffffe: 1, 0x4fffff: 1, 0x500002: 0,
             0x500003: 0, 0x500005: 0, 0x500006: 0, 0x5ffffc: 0, 0x5ffffe: 0, 0x5fffff: 0, 0x600002: 0,
             0x600004: 0, 0x600005: 0, 0x600007: 0, 0x6ffffb: 0, 0x6ffffc: 0, 0x6ffffe: -1, 0x6fffff: 0,
             0x700002: 0, 0x700004: 0, 0x700006: 0, 0x700008: 0, 0x7ffffb: 0, 0x7ffffc: 0, 0x7ffffe: 0,
             0x7fffff: 0}


def ulps(v, n):
    """The float32 n ulps above (n > 0) or below the float32 v >= 0; None outside [0, FLT_MAX]."""
    u = bits(v) + n
    return from_bits(u) if 0 <= u <= 0x7F7FFFFF else None


def _div_full(a, b):
    """The model of div.full.f32(a, b) for a >= 0 and b in [2^-126, 2^126] of a mantissa above:
    fl(a * rcp.approx(b))."""
    assert 2.0 ** -126 <= b <= 2.0 ** 126, b
    r = from_bits(bits(f32(1.0 / b)) + _RCP_CORR[bits(b) & 0x7FFFFF])
    return f32(a * r)


def e4m3_midpoints():
    v = e4m3_values()
    return [(a + b) / 2 for a, b in zip(v, v[1:])]


def outer_amax(k):
    """2688 * 2^k: the model's sg is (1 + 2^-23) 2^k."""
    return f32(2688.0 * 2.0 ** k)


def model_sg(a):
    return _div_full(_div_full(a, 448.0), 6.0)


def _aim(target, approx, fn, span=6):
    """The float32 x within `span` ulps of approx (nearest first) whose fn(x) == target; approx if none."""
    for d in [0] + [s * i for i in range(1, span + 1) for s in (1, -1)]:
        x = ulps(approx, d)
        if x is not None and x > 0 and fn(x) == target:
            return x
    return approx


def _signed(rng, v):
    return v if rng.random() < 0.5 else -v


def _pad(rng, blk, amax):
    """Fill the block to 16 with values of magnitude below amax, then shuffle."""
    while len(blk) < INNER:
        blk.append(_signed(rng, f32(amax * rng.uniform(0, 1))))
    rng.shuffle(blk)
    return blk


def _tie_block(rng, k, sg, s):
    """A 1x16 block of scale s (amax16 = 6 s 2^k, whose model ratio rounds to s) holding the E2M1 ties times
    sp = fl(s * sg), aimed so that the model's x / sp is the tie exactly, and 1-ulp neighbours of each."""
    sp = f32(s * sg)
    amax16 = f32(6.0 * s * 2.0 ** k)
    blk = [_signed(rng, amax16)]
    for i, m in enumerate(E2M1_TIES):
        x = _aim(m, f32(m * sp), lambda v: _div_full(v, sp))
        blk.append(_signed(rng, x))
        n = ulps(x, 1 if i % 2 else -1)
        if n is not None and n < amax16:
            blk.append(_signed(rng, n))
    blk.append(_signed(rng, f32(E2M1_VALUES[rng.randrange(1, 8)] * sp)))
    return _pad(rng, blk[:INNER], amax16)


TIE_SCALES = [448.0, 1.0, 2.0 ** -9, 3 * 2.0 ** -9, 7 * 2.0 ** -9, 2.0 ** -6, 1.125, 1.75, 0.9375, 416.0, 240.0,
              1.375, 0.0546875, 13.0, 96.0, 0.5, 1.875, 5 * 2.0 ** -9]


def _ties_segment(rng, k, scales):
    """Block 0 carries the outer amax 2688 * 2^k (its scale 448) and ties at scale 448; blocks 1..7 ties at the
    given scales."""
    sg = model_sg(outer_amax(k))
    blocks = [_tie_block(rng, k, sg, 448.0)]  # its amax16 6 * 448 * 2^k is the outer amax
    for s in scales[:7]:
        blocks.append(_tie_block(rng, k, sg, s))
    return [v for b in blocks for v in b]


def _ratio_block(rng, k, sg, t, nudge=0):
    """A block whose amax16 makes the model's amax16 / sg / 6 equal t (then moved `nudge` ulps)."""
    a = _aim(t, f32(6.0 * t * 2.0 ** k), lambda v: _div_full(_div_full(v, sg), 6.0), span=8)
    if nudge:
        a = ulps(a, nudge)
    return _pad(rng, [_signed(rng, a)], a)


def _e4m3_segment(rng, k, ts):
    """Block 0 the outer amax 2688 * 2^k; blocks 1..7 with amax16 / sg / 6 on the given E4M3 ties / edges."""
    a = outer_amax(k)
    sg = model_sg(a)
    blocks = [_pad(rng, [_signed(rng, a)], a)]
    for t in ts[:7]:
        blocks.append(_ratio_block(rng, k, sg, t))
    while len(blocks) < 8:
        blocks.append(_ratio_block(rng, k, sg, 448.0))
    return [v for b in blocks for v in b]


def _top_segment(rng, k, n):
    """The saturation end: outer amax 2688 * 2^k moved n ulps (its own ratio just above or below 448), other
    blocks with amax16 = the outer amax, its ulp neighbours below, and ratios 432 (the 416 | 448 tie), 440, 447."""
    a = ulps(outer_amax(k), n)
    sg = model_sg(a)
    blocks = [_pad(rng, [_signed(rng, a)], a), _pad(rng, [_signed(rng, a)], a),
              _pad(rng, [_signed(rng, ulps(a, -1))], a), _pad(rng, [_signed(rng, ulps(a, -3))], a)]
    for t in (432.0, 440.0, 447.0, 416.0):
        blocks.append(_ratio_block(rng, k, sg, t))
    return [v for b in blocks for v in b]


def _underflow_segment(rng, k):
    """Inner blocks whose amax16 / sg / 6 is below 2^-10 (E4M3 0: the block quantizes to +-0), exactly 2^-10
    (the tie of 0 and 2^-9: to 0), one ulp either side, 3 * 2^-10 (tie of 2^-9 and 2^-8), and far below."""
    a = outer_amax(k)
    sg = model_sg(a)
    blocks = [_pad(rng, [_signed(rng, a)], a),
              _ratio_block(rng, k, sg, 2.0 ** -10),
              _ratio_block(rng, k, sg, 2.0 ** -10, nudge=-1),
              _ratio_block(rng, k, sg, 2.0 ** -10, nudge=1),
              _ratio_block(rng, k, sg, 3 * 2.0 ** -10),
              _ratio_block(rng, k, sg, 2.0 ** -11),
              _pad(rng, [_signed(rng, f32(a * 2.0 ** -30))], f32(a * 2.0 ** -30)),
              _pad(rng, [-0.0, 0.0, _signed(rng, f32(a * 2.0 ** -24))], f32(a * 2.0 ** -24))]
    return [v for b in blocks for v in b]


def _randn_segment(rng, mag, zeros=0.01):
    """Gaussian values of magnitude mag; each 1x16 block scaled by 2^-U(0, 12) (1 in 16: 2^-U(18, 26), blocks
    that underflow the E4M3 scale), about `zeros` of the values +0 or -0."""
    x = []
    for _ in range(OUTER // INNER):
        rel = 2.0 ** -rng.uniform(18, 26) if rng.random() < 1 / 16 else 2.0 ** -rng.uniform(0, 12)
        for _ in range(INNER):
            if rng.random() < zeros:
                x.append(0.0 if rng.random() < 0.5 else -0.0)
            else:
                x.append(f32(rng.gauss(0, 1) * mag * rel))
    return x


def _zero_segments():
    mixed = [0.0 if i % 3 else -0.0 for i in range(OUTER)]
    mixed[77] = -(2.0 ** -149)
    return [[0.0] * OUTER, [-0.0] * OUTER, mixed]


def _fltmax_segments(rng):
    """FLT_MAX and the largest floats: a segment with +-FLT_MAX among values 2^U(100, 128); one all +-FLT_MAX;
    one whose amax is 2^127 with blocks at the ulps below FLT_MAX in another segment's place."""
    s1 = []
    for b in range(8):
        blk = [_signed(rng, f32(2.0 ** rng.uniform(100, 127.9))) for _ in range(INNER)]
        if b in (0, 5):
            blk[rng.randrange(INNER)] = _signed(rng, FLT_MAX)
        if b == 3:
            blk[rng.randrange(INNER)] = _signed(rng, ulps(FLT_MAX, -1))
        s1 += blk
    s2 = [FLT_MAX if i % 2 else -FLT_MAX for i in range(OUTER)]
    s3 = []
    for b in range(8):
        top = [ulps(FLT_MAX, -n) for n in (0, 1, 2, 7)][b % 4] if b < 4 else f32(2.0 ** 127 * rng.uniform(0.5, 1))
        s3 += _pad(rng, [_signed(rng, top)], top)
    return [s1, s2, s3]


def _tiny_segments(rng):
    """float32 subnormal and near-subnormal segments (sg and the scale products subnormal or zero)."""
    out = []
    for lo, hi in ((-149, -126), (-140, -112), (-130, -100)):
        out.append([_signed(rng, f32(2.0 ** rng.uniform(lo, hi))) for _ in range(OUTER)])
    return out


def _rows(segs, cols):
    per = cols // OUTER
    assert len(segs) % per == 0, (len(segs), per)
    x = [v for s in segs for v in s]
    assert all(len(s) == OUTER for s in segs)
    return len(segs) // per, cols, x


def inputs():
    """name -> (rows, cols, float32 values row-major)."""
    rng = random.Random(20261203)
    out = {}
    out['ties_1x128'] = _rows([_ties_segment(rng, 0, TIE_SCALES[1:8])], 128)

    mixed = [_randn_segment(rng, 2.0 ** 10), _zero_segments()[1], _zero_segments()[2], _underflow_segment(rng, 3),
             _e4m3_segment(rng, -5, [2.0 ** -10, 432.0, 15 * 2.0 ** -10, 1.0625, 240.0, 0.96875, 2.0 ** -6]),
             _ties_segment(rng, 20, TIE_SCALES[8:15]), _fltmax_segments(rng)[0], _tiny_segments(rng)[1]]
    out['mixed_4x256'] = _rows(mixed, 256)

    segs = []
    for _ in range(32):
        row_mag = rng.uniform(-30, 30)
        for _ in range(3):
            segs.append(_randn_segment(rng, 2.0 ** max(-40.0, min(40.0, row_mag + rng.uniform(-10, 10)))))
    out['randn_32x384'] = _rows(segs, 384)

    segs = []
    for i, k in enumerate(range(-100, 101, 10)):  # 21 E2M1 tie segments, scales rotating
        segs.append(_ties_segment(rng, k, [TIE_SCALES[(i * 7 + j) % len(TIE_SCALES)] for j in range(7)]))
    mids = e4m3_midpoints() + [448.0, 2.0 ** -9, 2.0 ** -6]
    ks = [-90, -61, -33, -7, 0, 4, 17, 29, 45, 58, 71, 88, 99, -120, 110, -2, 9, 33, 63]
    for i in range(0, len(mids), 7):  # 19 segments: every E4M3 midpoint once
        segs.append(_e4m3_segment(rng, ks[(i // 7) % len(ks)], mids[i:i + 7]))
    for k, n in ((0, 1), (0, -1), (37, 2), (-44, -2), (110, 1)):
        segs.append(_top_segment(rng, k, n))
    for k in (-80, 0, 60):
        segs.append(_underflow_segment(rng, k))
    segs += _zero_segments() + _fltmax_segments(rng) + _tiny_segments(rng)
    while len(segs) < 64:
        segs.append(_randn_segment(rng, 2.0 ** rng.uniform(-40, 40), zeros=0.05))
    out['edges_64x128'] = _rows(segs, 128)
    for name, (rows, cols, x) in out.items():
        assert len(x) == rows * cols and cols % OUTER == 0, name
        assert all(f32(v) == v and abs(v) <= FLT_MAX for v in x), name
    return out


def cases():
    """One case per input, all under the one quantizer."""
    return [{'name': name, 'input': name, 'quantizer': QUANTIZER}
            for name in ('ties_1x128', 'mixed_4x256', 'randn_32x384', 'edges_64x128')]
