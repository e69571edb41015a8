// FP8 block scaling (DeepSeek-V3: 1x128 activations and gradients, 128x128 weights), scalar by scalar (host
// and device): the `scale_rule`s deepgemm, te_fp8_block and amax_div of the standard block rule
// (sim/block_rule.hpp). Each turns a block's amax into the scale its dequantization multiplies by (stored as
// FP32 with `scale: f32`, or as an E8M0 code where the rule makes powers of two: `scale: e8m0`) and the
// element operand. Elements are encoded by the element encoder (RN; E4M3 or E5M2); dequant = decode(code) *
// scale. elem_max is the element's largest finite value (448 for E4M3).
//
// deepgemm: DeepGEMM's reference casts (github.com/deepseek-ai/DeepGEMM, deep_gemm/utils/math.py:
//   per_token_cast_to_fp8 / per_block_cast_to_fp8, what its tests quantize with), each line one FP32 op:
//     a   = max(amax, 1e-4f)                   torch.clamp(min=1e-4): a zero block gets 1e-4; NaN stays NaN
//     sf  = a * fl(1 / elem_max)               DeepGEMM's `x_amax / 448.0` on a CUDA tensor: PyTorch's GPU
//                                              division by a Python scalar multiplies by the scalar's float
//                                              reciprocal (ATen's div_true_kernel_cuda); its CPU division
//                                              divides, which differs in the last bit for some amax
//     sf  = ceil_to_ue8m0(sf)                  use_ue8m0 only (scale e8m0): exponent field + (mantissa != 0),
//                                              clamped to [1, 254], as a power of two (NaN -> 2^127)
//     y   = x * fl(1 / sf)                     stored scale: sf
//   Partial blocks: DeepGEMM pads with zeros (which do not change the amax): fp4lab's partial blocks equal it.
// te_fp8_block: TransformerEngine's Float8BlockScaling kernels (common/recipe/recipe_common.cuh
//   compute_scale_from_amax, quantize_transpose_{vector,square}_blockwise.cu), epsilon 0:
//     scale = 1 if amax is 0, Inf or NaN; else fl(elem_max / amax), FLT_MAX if that is Inf (the kernel's
//             value_for_inf for FP32 input; BF16 input would give BF16's max there)
//     scale = bits(scale) & 0xFF800000         power_2_scale (TE's default; scale e8m0): 2^floor(log2 scale)
//     y     = x * scale                        stored scale: scale_inv = fl(1 / scale)
//   TE's amax is an fmaxf reduction, which drops NaN (StandardRule::amax_drops_nan); its Python reference
//   (blockwise_quantizer_reference.py) differs only at the edges (an Inf amax: scale 0 there, 1 here).
//   `scale: f32` is TE's NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1, i.e. x * fl(elem_max / amax).
// amax_div: y = x / sf with sf = fl(amax / elem_max), the form of DeepSeek-V3's inference kernels
//   (inference/kernel.py act_quant / weight_quant: s = max|x| / 448; y = x / s) and torchao's blockwise FP8,
//   in IEEE division (Triton's `/` may be approximate there); a zero block gives sf 0 and NaN elements, as
//   theirs do.
#pragma once

#include <cstdint>

#include "core/bits.hpp"
#include "core/hd.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab {

struct Fp8BlockScale {
  float scale = 0;         // what dequant multiplies decode(code) by (QuantizedTensor::scales)
  float mult = 0;          // the element operand's factor: x * mult (amax_div: x / mult, mult == scale)
  uint32_t code = 0;       // its E8M0 code where it is a power of two (0 otherwise)
  bool underflow = false;  // deepgemm: a non-zero amax below the 1e-4 clamp
};

// DeepGEMM's ceil_to_ue8m0: the smallest power of two >= |x|, its biased exponent clamped to [1, 254].
FP4LAB_HD inline uint32_t deepgemm_ue8m0_exponent(float x) {
  const uint32_t bits = float_bits(x) & 0x7FFFFFFFu;
  uint32_t e = ((bits >> 23) & 0xFFu) + uint32_t((bits & 0x7FFFFFu) != 0);
  return e < 1 ? 1 : (e > 254 ? 254 : e);
}

FP4LAB_HD inline Fp8BlockScale deepgemm_block_scale(float amax, float elem_max, bool ue8m0) {
  Fp8BlockScale s;
  s.underflow = amax > 0.0f && amax < 1e-4f;
  const float a = amax < 1e-4f ? 1e-4f : amax;
  float sf = a * (1.0f / elem_max);
  if (ue8m0) {
    s.code = deepgemm_ue8m0_exponent(sf);
    sf = bits_float(s.code << 23);
  }
  s.scale = sf;
  s.mult = 1.0f / sf;
  return s;
}

FP4LAB_HD inline Fp8BlockScale te_fp8_block_scale(float amax, float elem_max, bool pow2) {
  Fp8BlockScale s;
  float scale = 1.0f;
  const bool degenerate = amax != amax || amax == 0.0f || amax > flt_max_f;
  if (!degenerate) {
    scale = elem_max / amax;
    if (scale > flt_max_f) scale = flt_max_f;
    if (pow2) scale = bits_float(float_bits(scale) & 0xFF800000u);
  }
  s.mult = scale;
  s.scale = 1.0f / scale;
  if (pow2) s.code = (float_bits(s.scale) >> 23) & 0xFFu;  // 2^-127 (0x00400000) has code 0
  return s;
}

FP4LAB_HD inline Fp8BlockScale amax_div_block_scale(float amax, float elem_max) {
  Fp8BlockScale s;
  s.scale = amax / elem_max;
  s.mult = s.scale;
  return s;
}

}  // namespace fp4lab
