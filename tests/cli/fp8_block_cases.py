"""The inputs and cases on which fp4lab's FP8 block-scaling rules are checked against their sources' own code
(Python stdlib only): DeepGEMM's reference casts (scale_rule deepgemm) and TransformerEngine's blockwise
quantizer reference (scale_rule te_fp8_block).

scripts/fp8_block_oracle.py runs those on these inputs (torch, on the GPU machine, on the GPU and on the CPU)
and records a SHA-256 of each output in tests/data/fp8_block_oracle.json; tests/cli/test_fp8_block.py
regenerates the same inputs, runs `fp4lab quantize` and compares the hashes. Inputs are built from fixed seeds
with Python's `random`, rounded to float32, finite (the sources' edges for NaN and Inf differ from their own
kernels': schemes/fp8_block/scalar.hpp).
"""
import hashlib
import random
import struct

from fp4tk_cases import bits, f32, from_bits, step  # noqa: F401 (float32 helpers)


def _varied(rng, rows, cols, lo, hi):
    """Gaussian values, each run of 128 of a row with its own magnitude 10^U(lo, hi); some runs all zero."""
    x = []
    for _ in range(rows):
        for c0 in range(0, cols, 128):
            n = min(128, cols - c0)
            if rng.random() < 0.03:
                x += [0.0] * n
                continue
            mag = 10.0 ** rng.uniform(lo, hi)
            x += [f32(rng.gauss(0, 1) * mag) for _ in range(n)]
    return x


def _amax_edges(rng, rows, cols):
    """Row blocks of 128 whose amax sits on and one or two ulps around 448 * 2^k and 57344 * 2^k (where
    amax / max crosses a power of two), around 1e-4 (DeepGEMM's clamp), and at values whose amax / 448 and
    amax * fl(1 / 448) round apart; the other elements amax * U(-1, 1)."""
    amaxes = []
    for k in range(-20, 20):
        for m in (448.0, 57344.0):
            base = f32(m * 2.0 ** k)
            for n in (-2, -1, 0, 1, 2):
                amaxes.append(step(base, n))
    for n in (-3, -1, 0, 1, 3):
        amaxes.append(step(f32(1e-4), n))
    while len(amaxes) < rows * (cols // 128):
        amaxes.append(f32(10.0 ** rng.uniform(-5, 5)))
    x = []
    for a in amaxes[:rows * (cols // 128)]:
        blk = [f32(a * rng.uniform(-1, 1)) for _ in range(128)]
        blk[rng.randrange(128)] = a if rng.random() < 0.5 else -a
        x += blk
    return x


def inputs():
    """name -> (rows, cols, float32 values row-major)."""
    out = {}
    rng = random.Random(20261201)
    out['varied'] = (256, 384, _varied(rng, 256, 384, -6, 3))
    out['odd'] = (130, 200, _varied(rng, 130, 200, -3, 2))
    out['edges'] = (256, 256, _amax_edges(rng, 256, 256))
    return out


# (name, source, block, scale, element): source deepgemm = DeepGEMM's per_token_cast_to_fp8 ([1,128]) /
# per_block_cast_to_fp8 ([128,128]) with use_ue8m0 = (scale == 'e8m0'); te = TransformerEngine's
# BlockwiseQuantizerReference with pow_2_scales = (scale == 'e8m0'), eps 0.
_QUANTIZERS = [
    ('dg_1x128_f32', 'deepgemm', [1, 128], 'f32', 'e4m3'),
    ('dg_1x128_ue8m0', 'deepgemm', [1, 128], 'e8m0', 'e4m3'),
    ('dg_128x128_f32', 'deepgemm', [128, 128], 'f32', 'e4m3'),
    ('dg_128x128_ue8m0', 'deepgemm', [128, 128], 'e8m0', 'e4m3'),
    ('te_1x128_f32', 'te', [1, 128], 'f32', 'e4m3'),
    ('te_1x128_pow2', 'te', [1, 128], 'e8m0', 'e4m3'),
    ('te_128x128_f32', 'te', [128, 128], 'f32', 'e4m3'),
    ('te_128x128_pow2', 'te', [128, 128], 'e8m0', 'e4m3'),
    ('te_1x128_pow2_e5m2', 'te', [1, 128], 'e8m0', 'e5m2'),
    ('te_128x128_f32_e5m2', 'te', [128, 128], 'f32', 'e5m2'),
]


def cases():
    out = []
    for inp in ('varied', 'odd', 'edges'):
        for name, source, block, scale, elem in _QUANTIZERS:
            rule = 'deepgemm' if source == 'deepgemm' else 'te_fp8_block'
            out.append({'name': inp + '/' + name, 'input': inp, 'source': source, 'block': block, 'scale': scale,
                        'element': elem,
                        'quantizer': {'element': elem, 'scale': scale, 'block': block, 'scale_rule': rule}})
    return out


def digest_bytes(b):
    return hashlib.sha256(bytes(b)).hexdigest()


def digest_f32(vals_bits):
    """SHA-256 of float32 bit patterns (little endian), every NaN written as 0x7FC00000."""
    buf = bytearray()
    for u in vals_bits:
        if (u & 0x7F800000) == 0x7F800000 and (u & 0x7FFFFF):
            u = 0x7FC00000
        buf += struct.pack('<I', u)
    return hashlib.sha256(bytes(buf)).hexdigest()


def e8m0_bits(code):
    """The float32 bits of E8M0 code c: 2^(c - 127); code 0 is the subnormal 2^-127."""
    return 0x00400000 if code == 0 else (0x7FC00000 if code == 255 else code << 23)
