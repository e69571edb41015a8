"""The inputs and cases on which fp4lab's emulation of Quartet II's Triton backward MS-EDEN quantizer (emulate
quartet2_eden_triton) is checked against the Triton kernel itself (Python stdlib only).

scripts/quartet2_eden_oracle.py launches `eden_1x16s_fp4_kernel` of IST-DASLab/Quartet-II
(src/models/quantization/schemes/quartet_2.py) on these inputs on the GPU and records, per case, the SHA-256 of
its bfloat16 output (the bit patterns as little-endian uint16, row-major) in tests/data/quartet2_eden_oracle.json;
tests/cli/test_quartet2_eden.py regenerates the same inputs, runs
`fp4lab quantize IN.npy --quantizer <json> --dequant OUT.npy --seed <seed> --stream 0`, rounds the float32
dequant to bfloat16 (nearest even) and compares the hashes of the same bytes. Inputs are built from fixed seeds
with Python's `random` and are bfloat16 values (the kernel's operand is the bf16 gradient), held as float32 in the
.npy fp4lab reads; the oracle file records each input's SHA-256, so a Python whose `random` draws differently is
named as such and not taken for a disagreement.

What the kernel computes (BLOCK_SIZE elements of the flattened tensor a program; every input has cols % 128 == 0,
so each 128-element chunk is a chunk of one row and each group of 16 a 1x16 block of one row):
  x_had = x_chunk @ Hk (tl.dot, bf16 operands, FP32 accumulation), Hk the 128x128 bf16 matrix it is given;
  s_dec = amax / 255.99 / val_max (1 if amax == 0), amax the FP32 value it is given, val_max = 6 / scale_override,
  scale_override = (17 / 16) * 0.93 (Quartet_II_fn.backward_scale_override);
  s = e4m3((amax16 / val_max) / s_dec), replaced by 1 if 0; q = x_had / (s * s_dec); q_fp4 = rtn_fp4(q) (|q| >= 5,
  3.5, 2.5, 1.75, 1.25, 0.75, 0.25 -> 6, 4, 3, 2, 1.5, 1, 0.5, else 0: ties away from zero; negated unless q > 0,
  so q = +-0 gives -0); per 128-chunk the EDEN correction sum(q^2) / sum(q q_fp4) (1 if the
  denominator is 0) multiplies the chunk's 8 scales; each corrected scale is rounded stochastically to one of its
  two E4M3 neighbours with tl.rand(seed, group index over the whole tensor); out = bf16(q_fp4 * scale' * s_dec).
The oracle passes, as the Quartet II backward would: Hk = (H @ diag(d)).T in bf16 with H = hadamard(128) / sqrt(128)
(scipy.linalg.hadamard: Sylvester, natural order; get_hadamard_matrix, rerotate_hadamard, the wrapper's
.T.contiguous()), d the 128 signs fp4lab draws from rht_seed (`signs` below) in place of its torch.randint draw;
or Hk = the identity for the cases without a transform. Either way x @ Hk is chunk-wise
y_j = sum_i x_i d_i H[i][j] c, c = bf16(128^-0.5) = 181 * 2^-11: fp4lab's rht_kind quartet2_128 (sim/rht.hpp).
amax = max |x @ Hk|, computed here exactly (`amax`) and rounded to FP32, as fp4lab's tensor_amax sees it.

Cases without a transform: Gaussian 4x128 (one partial program), 32x256 and 64x512; rows and groups of widely
varying magnitude (block scales from 256 down to E4M3 subnormals and to 0, hence 1); scattered +-0, an all-zero
128-chunk and an all -0 group; an all-zero tensor (amax 0, s_dec 1); near-ties (bf16 cannot hold x = t * sp for a
scale sp = fl(s s_dec) of 24 significant bits, so each E2M1 tie t of a group is bracketed by the two bf16 values
around t * sp, sp the group's scale in FP64, and each E4M3 midpoint m of (amax16 / val_max) / s_dec by the two bf16
amax16 around m val_max s_dec); tiny values (amax near 2^-100) and values under which s_dec is an FP32 subnormal
(amax near 2^-118). Cases with the transform: x = n * 2^k with |n| <= 15 and one k per 128-chunk (several shapes,
per-row k, a sparse input with an all-zero chunk and one-hot chunks), for which every product and partial sum of
the transform is an integer multiple of 2^(k-11) below 1920 * 181 < 2^19 of them: exact in FP32 in any order, so
the tensor core's accumulation order cannot matter and fp4lab's FP64 transform gives the same values.
"""
import math
import random
import struct

from fp4tk_cases import bits, f32, from_bits
from oracle_common import digest_bytes, digest_input, e4m3_values, f32_bytes  # noqa: F401 (re-exported to the oracle scripts)

INNER = 16
CHUNK = 128
C128 = 181 * 2.0 ** -11  # bf16(128^-0.5)
VAL_MAX = 6.0 / ((17 / 16) * 0.93)
SCALE_MAX = 255.99
QUANTIZER = {'element': 'e2m1', 'scale': 'e4m3', 'block': [1, INNER], 'scale_rule': 'nv',
             'global_scale': 'tensor_amax', 'round': 'rna', 'overflow': 'saturate', 'emulate': 'quartet2_eden_triton'}
E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
RHT_SIGN_STREAM = 0x524854  # sim/rht.hpp rht_sign_stream ("RHT")

# Random123 1.14's philox4x32-10 known-answer vectors, as tests/core/test_philox.cpp holds them:
# (counter, key, output).
PHILOX_KATS = (
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff),
     (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
)
M32 = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    """Philox4x32-10 of the 4-word counter under the 2-word key (core/philox.hpp)."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def random_bits(seed, stream, index):
    """fp4lab's random_bits: word index % 4 of Philox at counter (index / 4, stream), key seed."""
    g = index >> 2
    ctr = (g & M32, (g >> 32) & M32, stream & M32, (stream >> 32) & M32)
    return philox4x32_10(ctr, (seed & M32, (seed >> 32) & M32))[index & 3]


for _ctr, _key, _out in PHILOX_KATS:
    assert philox4x32_10(_ctr, _key) == _out, 'philox4x32_10 misses a Random123 known answer'
assert random_bits(0, 0, 3) == 0x9b00dbd8  # test_philox.cpp's static_assert
# test_philox.cpp's (seed, stream, index) -> (key, counter) check: the third vector through random_bits.
assert [random_bits(0x299f31d0a4093822, 0x0370734413198a2e, (0x85a308d3243f6a88 << 2) | w) for w in (0, 3)] == \
    [0xd16cfe09, 0x24126ea1]


def signs(rht_seed):
    """The 128 signs fp4lab's quartet2_128 rotation draws from rht_seed (sim/rht.hpp rht_sign): -1 iff bit 0 of
    random_bits(rht_seed, "RHT", i) is set."""
    return [-1 if random_bits(rht_seed, RHT_SIGN_STREAM, i) & 1 else 1 for i in range(CHUNK)]


def sylvester(i, j):
    """scipy.linalg.hadamard(128)[i][j]."""
    return -1 if bin(i & j).count('1') & 1 else 1


def kernel_matrix(rht_seed):
    """The 128x128 matrix Hk the kernel multiplies (x @ Hk), row-major: d_i H[i][j] c, or the identity when
    rht_seed is None."""
    if rht_seed is None:
        return [1.0 if i == j else 0.0 for i in range(CHUNK) for j in range(CHUNK)]
    d = signs(rht_seed)
    return [d[i] * sylvester(i, j) * C128 for i in range(CHUNK) for j in range(CHUNK)]


def transformed(cols, vals, rht_seed):
    """x @ Hk chunk by chunk (row-major values), exact (FP64 sums of these inputs are), asserted FP32-exact."""
    if rht_seed is None:
        return list(vals)
    d = signs(rht_seed)
    out = []
    for k0 in range(0, len(vals), CHUNK):
        t = [vals[k0 + i] * d[i] for i in range(CHUNK)]
        h = 1
        while h < CHUNK:
            for i in range(CHUNK):
                if not i & h:
                    t[i], t[i + h] = t[i] + t[i + h], t[i] - t[i + h]
            h <<= 1
        out += [v * C128 for v in t]
    assert all(f32(v) == v for v in out), 'a transformed value is not exact in FP32'
    return out


def amax(cols, vals, rht_seed):
    """The FP32 amax the kernel is given: max |x @ Hk|."""
    return f32(max(abs(v) for v in transformed(cols, vals, rht_seed)))


def bf16_bits(u):
    """The bf16 bit pattern of the float32 bits u, rounded to nearest even (NaN kept quiet, its sign kept)."""
    if (u & 0x7F800000) == 0x7F800000 and u & 0x7FFFFF:
        return (u >> 16) | 0x40
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


def bf16(v):
    """v rounded to float32, then to bf16 (nearest even), as a Python float."""
    return from_bits(bf16_bits(bits(f32(v))) << 16)


def bf16_step(v, n):
    """The bf16 n ulps above (n > 0) or below the bf16 v > 0."""
    return from_bits(((bits(v) >> 16) + n) << 16)


def bf16_around(t):
    """(lo, hi): the bf16 values with lo <= t < hi, t > 0."""
    b = bf16(t)
    return (b, bf16_step(b, 1)) if b <= t else (bf16_step(b, -1), b)


def bf16_bytes(f32_data):
    """Little-endian float32 bytes -> the little-endian uint16 bytes of their bf16 roundings."""
    n = len(f32_data) // 4
    return struct.pack('<%dH' % n, *(bf16_bits(u) for u in struct.unpack('<%dI' % n, f32_data)))


def _e4m3_nearest(r):
    return min(e4m3_values(), key=lambda v: abs(v - r))


def _signed(rng, v):
    return v if rng.random() < 0.5 else -v


def _zero(rng):
    return 0.0 if rng.random() < 0.5 else -0.0


def _gauss_group(rng, mag):
    return [bf16(rng.gauss(0, 1) * mag) for _ in range(INNER)]


def _below(rng, top, n):
    """n bf16 values of magnitude below top, random signs."""
    return [_signed(rng, bf16(top * rng.uniform(0, 0.999))) for _ in range(n)]


def _rows(groups, rows, cols):
    x = [v for g in groups for v in g]
    assert all(len(g) == INNER for g in groups)
    assert len(x) == rows * cols, (len(x), rows, cols)
    return rows, cols, x


def _randn(rng, rows, cols, lo, hi):
    """Gaussian groups of magnitude 2^U(lo, hi) each."""
    return _rows([_gauss_group(rng, 2.0 ** rng.uniform(lo, hi)) for _ in range(rows * cols // INNER)], rows, cols)


def _loguniform(rng, rows, cols, lo, hi):
    """+-2^U(lo, hi), each value on its own (all bf16 normals for lo >= -126)."""
    return rows, cols, [_signed(rng, bf16(2.0 ** rng.uniform(lo, hi))) for _ in range(rows * cols)]


def _rowscales(rng, rows, cols):
    """Row r at 2^-U(0, 24) (row 0 at 1, holding the amax), each group a further 2^U(-3, 3)."""
    x = []
    for r in range(rows):
        m = 1.0 if r == 0 else 2.0 ** -rng.uniform(0, 24)
        for _ in range(cols // INNER):
            x += _gauss_group(rng, m * 2.0 ** rng.uniform(-3, 3))
    return rows, cols, x


def _zeros(rng, rows, cols):
    """Gaussian with 10% +-0, row 2's second 128-chunk all +0 and row 5's group 3 all -0."""
    x = [_zero(rng) if rng.random() < 0.1 else bf16(rng.gauss(0, 1)) for _ in range(rows * cols)]
    x[2 * cols + CHUNK:2 * cols + 2 * CHUNK] = [0.0] * CHUNK
    x[5 * cols + 3 * INNER:5 * cols + 4 * INNER] = [-0.0] * INNER
    return rows, cols, x


def _ties(rng, rows, cols):
    """Group 0 holds the tensor's amax top; then, for a spread of E4M3 block scales s, a group of amax16 ~ s val_max
    s_dec holding the bf16 values around each E2M1 tie times the group's scale; then, for every third E4M3
    midpoint m up to 248, the two groups whose amax16 are the bf16 values around m val_max s_dec; then Gaussian
    groups. The scales and s_dec are the FP64 model of the kernel's (its FP32 roundings move t * sp by ulps of
    FP32, the bracketing bf16 values lie an ulp of bf16 apart)."""
    top = bf16(5.5)
    s_dec = top / SCALE_MAX / VAL_MAX
    groups = [[top] + _below(rng, top, INNER - 1)]
    for s in (256.0, 240.0, 208.0, 96.0, 44.0, 13.0, 7.5, 1.875, 1.0, 0.40625, 0.0546875, 2.0 ** -6, 7 * 2.0 ** -9,
              3 * 2.0 ** -9, 2.0 ** -9):
        a16 = min(top, bf16(s * VAL_MAX * s_dec))
        sc = _e4m3_nearest(a16 / VAL_MAX / s_dec) or 1.0
        g = [_signed(rng, a16), _zero(rng)]
        for t in E2M1_TIES:
            g += [_signed(rng, v) for v in bf16_around(t * sc * s_dec)]
        rng.shuffle(g)
        groups.append(g)
    e = e4m3_values()
    for m in [(a + b) / 2 for a, b in zip(e, e[1:])][::3]:
        if m > 248:
            continue
        for a16 in bf16_around(m * VAL_MAX * s_dec):
            g = [_signed(rng, a16)] + _below(rng, a16, INNER - 1)
            rng.shuffle(g)
            groups.append(g)
    assert len(groups) <= rows * cols // INNER, len(groups)
    while len(groups) < rows * cols // INNER:
        groups.append(_gauss_group(rng, top * 2.0 ** -rng.uniform(1, 12)))
    return _rows(groups, rows, cols)


def _ints(rng, rows, cols, k, zeros=0.0):
    """n 2^k, n uniform in [-15, 15] (a fraction `zeros` of them 0); k an int, or a list of one per row."""
    x = []
    for r in range(rows):
        kr = k[r] if isinstance(k, list) else k
        x += [0.0 if rng.random() < zeros else float(rng.randint(-15, 15)) * 2.0 ** kr for _ in range(cols)]
    return rows, cols, x


def _sparse_ints(rng, rows, cols):
    """70% zeros; row 1's first chunk all zero; row 3's chunks one-hot (one n 2^-2 each: all 128 outputs of one
    magnitude)."""
    rows, cols, x = _ints(rng, rows, cols, -2, zeros=0.7)
    x[cols:cols + CHUNK] = [0.0] * CHUNK
    for k0 in range(3 * cols, 4 * cols, CHUNK):
        x[k0:k0 + CHUNK] = [0.0] * CHUNK
        x[k0 + rng.randrange(CHUNK)] = float(rng.choice((-15, -7, 1, 9))) * 0.25
    return rows, cols, x


def inputs():
    """name -> (rows, cols, bf16 values row-major)."""
    rng = random.Random(20261205)
    out = {
        'randn_4x128': _randn(rng, 4, 128, -4, 4),
        'randn_32x256': _randn(rng, 32, 256, -2, 2),
        'randn_64x512': _randn(rng, 64, 512, -8, 8),
        'rowscales_16x256': _rowscales(rng, 16, 256),
        'zeros_8x256': _zeros(rng, 8, 256),
        'allzero_2x128': (2, 128, [_zero(rng) for _ in range(256)]),
        'ties_16x128': _ties(rng, 16, 128),
        'tiny_8x128': _randn(rng, 8, 128, -104, -100),
        'subnormal_sdec_4x128': _loguniform(rng, 4, 128, -126, -118),
        'ints_4x128': _ints(rng, 4, 128, -3),
        'ints_32x256': _ints(rng, 32, 256, -10),
        'ints_64x512': _ints(rng, 64, 512, 4),
        'ints_rowscales_16x384': _ints(rng, 16, 384, [rng.randint(-12, 12) for _ in range(16)]),
        'ints_sparse_8x256': _sparse_ints(rng, 8, 256),
    }
    for name, (rows, cols, x) in out.items():
        assert len(x) == rows * cols and cols % CHUNK == 0, name
        assert all(bf16(v) == v and math.isfinite(v) for v in x), name
    return out


def quantizer(rht_seed):
    """fp4lab's quantizer of a case: QUANTIZER, with Quartet II's 128-point rotation of rht_seed unless None."""
    if rht_seed is None:
        return dict(QUANTIZER)
    return dict(QUANTIZER, rht=True, rht_kind='quartet2_128', rht_seed=rht_seed)


def cases():
    """One case per input: (input, rht_seed or None, the SR seed of the kernel's tl.rand and fp4lab's --seed)."""
    table = (('randn_4x128', None, 12345), ('randn_32x256', None, 12345), ('randn_64x512', None, 777),
             ('rowscales_16x256', None, 424242), ('zeros_8x256', None, 12345), ('allzero_2x128', None, 99),
             ('ties_16x128', None, 12345), ('tiny_8x128', None, 31337), ('subnormal_sdec_4x128', None, 12345),
             ('ints_4x128', 1, 12345), ('ints_32x256', 7, 12345), ('ints_64x512', 2024, 999999),
             ('ints_rowscales_16x384', 5, 777), ('ints_sparse_8x256', 3, 12345))
    return [{'name': name, 'input': name, 'rht_seed': rs, 'seed': seed, 'quantizer': quantizer(rs)}
            for name, rs, seed in table]
