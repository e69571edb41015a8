"""The inputs and cases on which fp4lab's NVFP4 quantizers (nv rule; the RHT with TransformerEngine's signs and
BF16 output) are checked against TransformerEngine's own Python reference quantizer (Python stdlib only).

scripts/te_nvfp4_oracle.py runs TE d0067d0da's NVFP4QuantizerRef (transformer_engine/pytorch/custom_recipes/
reference_nvfp4.py) on these inputs (torch, BF16 tensors, on the CPU and on the GPU) and records a SHA-256 of
each output in tests/data/te_nvfp4_oracle.json; tests/cli/test_te_nvfp4.py regenerates the same inputs, runs
`fp4lab quantize` and compares the hashes.

Every input is BF16-valued (TE's RHT takes BF16 only), finite, built from fixed seeds with Python's `random`,
and holds no -0.0 except input `negzero`. Outputs, per input (TE's quantizer -> fp4lab's quantizer):
  row      NVFP4QuantizerRef(tile (1,16), rowwise)                         -> nvfp4     ([1,16])
  row_2d   NVFP4QuantizerRef(tile (16,16), rowwise)                        -> nvfp4_2d  ([16,16])
  col      NVFP4QuantizerRef(tile (1,16), columnwise, no RHT): X^T's rows  -> nvfp4_col ([16,1] on X)
  col_rht  NVFP4QuantizerRef(tile (1,16), columnwise, with_rht, TE's sign mask): rowwise 1x16 blocks of
           bf16(X^T.view(-1,16) @ (diag(s) H16 / 4))                       -> COL_RHT   ([16,1] on X)
TE's reference needs rows % 16 == 0 for the RHT (it raises otherwise) and trims its packed codes to
(rows, cols // 2), so a row output needs an even cols and a col output an even rows. Partial blocks and tiles
(cols or rows not a multiple of 16) TE pads with zeros, which leaves every block amax unchanged.

The RHT's sums on the GPU are cuBLAS BF16 tensor-core GEMMs (FP32 accumulate, one BF16 rounding); fp4lab's are
RN butterflies. They agree wherever the exact sum fits FP32, i.e. where the nonzero elements of each 16-token
chunk (16 consecutive rows of one column) span at most 12 binades (docs/log/2026-12-01-te-rht-cast-fusion.md,
section 2). `chunk_spread(input)` is the largest such span; a col_rht case is exact by construction iff it is
<= 12.

Known differences, predicted by reading TE's reference (the test checks them as predicted, not as failures):
  - an all-zero tensor: TE's reference takes S_enc = min(2688 / 0, FLT_MAX) = FLT_MAX (it resets S_enc to 1
    only when S_enc == 0), so its global decode scale is fl(1 / FLT_MAX) = 2^-128; fp4lab (and TE's kernels)
    take S_enc = 1, decode scale 1. Element and scale codes are all 0 on both.
  - -0.0 inputs: TE's reference cast_to_fp4x2 maps -0.0 to code 0x0 (`x >= 0.0` holds for -0.0) where fp4lab
    (and TE's kernels, whose y = x * e keeps -0) write 0x8. Non-RHT outputs only (the RHT's sums have no -0).
"""
import hashlib
import json
import math
import random
import struct
from oracle_common import bits, digest_bytes, digest_input, f32_bytes, from_bits  # noqa: F401 (re-exported to the oracle scripts)

COL_RHT = {'element': 'e2m1', 'scale': 'ue4m3', 'block': [16, 1], 'scale_rule': 'nv',
           'global_scale': 'tensor_amax', 'rht': True, 'rht_signs': 'te', 'rht_output': 'bf16'}
QUANTIZERS = {'row': 'nvfp4', 'row_2d': 'nvfp4_2d', 'col': 'nvfp4_col', 'col_rht': COL_RHT}
# output -> (block rows, block cols) of fp4lab's scale grid on X
BLOCKS = {'row': (1, 16), 'row_2d': (16, 16), 'col': (16, 1), 'col_rht': (16, 1)}
EXACT_SPREAD = 12
FLT_MAX = struct.unpack('<f', struct.pack('<I', 0x7F7FFFFF))[0]


def bf16(v):
    """v (a Python float, finite, within float32's range) rounded to float32, then to BF16 (nearest even)."""
    u = bits(struct.unpack('<f', struct.pack('<f', v))[0])
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    r = from_bits(u)
    return 0.0 if r == 0.0 else r  # no -0.0


def _grid_value(rng, scale=1.0, zero=0.1):
    """A multiple of 2^-4 in (-16, 16) (8 significant bits: exact in BF16), times a power of two; +0 w.p. zero."""
    if rng.random() < zero:
        return 0.0
    k = rng.randrange(1, 256)
    return (k / 16.0) * scale * (1 if rng.random() < 0.5 else -1)


def _grid(rng, rows, cols):
    return [_grid_value(rng) for _ in range(rows * cols)]


def _bands(rng, rows, cols):
    """Bands of 16 rows, each of grid values times its own power of two: 2^8 (the global amax, up to 4080),
    2^-12 (block amaxes 2^-20 of the global one: the E4M3 block scale underflows to 0), all zero, 2^-11 and
    2^-10 (block scales around E4M3's smallest subnormal 2^-9 and its half), then 2^0. In the other bands some
    [1,16] row blocks, [16,16] tiles and 16-token column chunks are zero. Each 16-token chunk lies in one band, so
    its spread is the grid's (<= 7 binades): the RHT is exact."""
    scales = [2.0 ** 8, 2.0 ** -12, 0.0, 2.0 ** -11, 2.0 ** -10, 1.0]
    x = []
    for r in range(rows):
        s = scales[(r // 16) % len(scales)]
        x += [_grid_value(rng, s) if s else 0.0 for _ in range(cols)]
    for r in range(rows):
        if r % 5 == 1:
            c0 = 16 * rng.randrange(cols // 16)
            for c in range(c0, c0 + 16):
                x[r * cols + c] = 0.0   # a zero row block
    for b in range(rows // 16):
        c0 = 16 * rng.randrange(cols // 16)
        for r in range(16 * b, 16 * b + 16):
            for c in range(c0, c0 + 16):
                x[r * cols + c] = 0.0   # a zero tile (and 16 zero column chunks)
        c = rng.randrange(cols)
        for r in range(16 * b, 16 * b + 16):
            x[r * cols + c] = 0.0       # a zero column chunk
    return x


def _normal(rng, rows, cols):
    return [bf16(rng.gauss(0, 1)) for _ in range(rows * cols)]


def _narrow(rng, rows, cols):
    """Gaussian values with |x| raised to at least 2^-7: every 16-token chunk spans <= 10 binades (the RHT is
    exact) while the mantissas are arbitrary BF16 ones (the RHT's BF16 rounding matters)."""
    return [bf16(math.copysign(max(abs(g), 2.0 ** -7), g)) for g in (rng.gauss(0, 1) for _ in range(rows * cols))]


def _wide(rng, rows, cols):
    """Gaussian values, each row with its own magnitude 10^U(-4, 4): row blocks whose scale underflows,
    16-token chunks spanning far more than 12 binades (the RHT is not exact by construction)."""
    x = []
    for _ in range(rows):
        mag = 10.0 ** rng.uniform(-4, 4)
        x += [bf16(rng.gauss(0, 1) * mag) for _ in range(cols)]
    return x


def _negzero(rng, rows, cols):
    x = _grid(rng, rows, cols)
    for i in range(len(x)):
        if rng.random() < 0.15:
            x[i] = -0.0
    return x


def inputs():
    """name -> (rows, cols, BF16 values as Python floats, row-major)."""
    out = {}
    rng = random.Random(20261215)
    out['grid'] = (64, 48, _grid(rng, 64, 48))
    out['bands'] = (96, 64, _bands(rng, 96, 64))
    out['randn'] = (128, 64, _normal(rng, 128, 64))
    out['narrow'] = (64, 64, _narrow(rng, 64, 64))
    out['wide'] = (64, 64, _wide(rng, 64, 64))
    out['odd_cols'] = (48, 40, _normal(rng, 48, 40))      # partial row blocks and tiles; RHT fine
    out['odd_rows'] = (37, 50, _normal(rng, 37, 50))      # partial tiles; no RHT (rows % 16), no col (odd rows)
    out['zeros'] = (32, 32, [0.0] * (32 * 32))
    out['negzero'] = (16, 32, _negzero(rng, 16, 32))
    return out


_OUTPUTS = {
    'grid': ['row', 'row_2d', 'col', 'col_rht'],
    'bands': ['row', 'row_2d', 'col', 'col_rht'],
    'randn': ['row', 'row_2d', 'col', 'col_rht'],
    'narrow': ['row', 'row_2d', 'col', 'col_rht'],
    'wide': ['row', 'row_2d', 'col', 'col_rht'],
    'odd_cols': ['row', 'row_2d', 'col', 'col_rht'],
    'odd_rows': ['row', 'row_2d'],
    'zeros': ['row', 'row_2d', 'col', 'col_rht'],
    'negzero': ['row', 'row_2d', 'col'],
}


def chunk_spread(rows, cols, vals):
    """The largest exponent span (floor(log2|x|), max - min) over the nonzero elements of any 16-token chunk
    (rows 16b..16b+15 of one column); 0 for chunks with fewer than two nonzero elements."""
    worst = 0
    for b in range(rows // 16):
        for c in range(cols):
            e = [math.frexp(vals[r * cols + c])[1] for r in range(16 * b, 16 * b + 16) if vals[r * cols + c] != 0.0]
            if len(e) > 1:
                worst = max(worst, max(e) - min(e))
    return worst


def cases():
    """[{name, input, output, quantizer, exact, known}]: exact is False only for a col_rht case whose chunks span
    more than 12 binades; known names a difference predicted by reading (module docstring) or is None."""
    ins = inputs()
    out = []
    for name in ins:
        rows, cols, vals = ins[name]
        spread = chunk_spread(rows, cols, vals)
        for o in _OUTPUTS[name]:
            known = None
            if name == 'zeros':
                known = 'zero_tensor_global'
            elif name == 'negzero' and o != 'col_rht':
                known = 'negzero_codes'
            out.append({'name': name + '/' + o, 'input': name, 'output': o, 'quantizer': QUANTIZERS[o],
                        'exact': o != 'col_rht' or spread <= EXACT_SPREAD, 'spread': spread if o == 'col_rht' else None,
                        'known': known})
    return out


def quantizer_arg(q):
    """fp4lab quantize's --quantizer argument: a canned name as it is, a spec as JSON."""
    return q if isinstance(q, str) else json.dumps(q, sort_keys=True)


def scale_shape(rows, cols, output):
    br, bc = BLOCKS[output]
    return (rows + br - 1) // br, (cols + bc - 1) // bc


def digest_f32(vals):
    """SHA-256 of float32 values' little-endian bytes (every NaN as 0x7FC00000)."""
    return hashlib.sha256(b''.join(struct.pack('<I', 0x7FC00000 if v != v else bits(v)) for v in vals)).hexdigest()


def predicted_zero_tensor_global():
    """TE's reference's global decode scale for an all-zero tensor: fl(1 / FLT_MAX) (float32)."""
    return struct.unpack('<f', struct.pack('<f', 1.0 / FLT_MAX))[0]
