// TransformerEngine's NVFP4 kernels under NVTE_USE_FAST_MATH=1, 1-D blocks of BF16 input (`emulate:
// "te_fast_math"`): the kernel arithmetic a golden reference must name apart from TE's Python reference.
//
// Source: github.com/NVIDIA/TransformerEngine at d0067d0da,
// common/cast/nvfp4/specialized/quantize_transpose_nvfp4_tuned_1D.cuh (compute_nvfp4_scaling_coefficient<bf16>,
// rowwise_scaling / colwise_scaling), core_nvfp4.cuh (compute_global_encode_scaling_factor_FP4,
// compute_decoding_scaling_factor), util/ptx_arch_spec.cuh (mul_cvt_bf16_to_fp4_8x_round_to_nearest /
// _stochastic_rounding with a bf16 coefficient). Per tensor and block, one FP32 operation a line, RN:
//   S_enc = fl(2688 / global_amax), FLT_MAX if Inf, 1 for an amax of 0 or Inf      (the nv rule's g_enc)
//   sdec  = e4m3_rn_satfinite(block_amax * fl(S_enc * fl(1/6)))                     (the nv rule's block scale)
//   coeff = bf16_rn(fminf(S_enc / float(sdec), bf16_max))     a DIVISION, rounded to BF16, where TE's default
//                                                             (and its Python reference, fp4lab's nv) takes
//                                                             fl(1 / (sdec * fl(1 / S_enc))) in FP32
//   y     = fma.rn.f32.bf16(x, coeff, +0)                     x BF16: the product is exact in FP32 (one
//                                                             rounding below FP32's normal range); the +0
//                                                             turns an x of -0 into +0 (E2M1 code 0, not 8)
//   code  = cvt.rn|rs.satfinite.e2m1(y)                       SR: the ptx_x4 random-bit contract
// The amaxes are max.xorsign.abs reductions, which leave NaN out (the rule's NaN-dropping amax); dequant is
// the nv rule's (decode(code) * sdec) * fl(1/S_enc). Valid with e2m1 elements, a ue4m3 / e4m3 scale, the
// tensor's global scale, blocks [1,16] or [16,1] (the tuned 1-D kernel's rowwise and columnwise outputs), an
// RHT only with rht_output bf16 (TE's unfused path: its BF16 RHT output cast by this kernel; the fused RHT-cast
// kernels' arithmetic is schemes/te_nvfp4/fused_fast_math.hpp), round rn or rs. The kernel runs on BF16 input:
// FP32 input that is not BF16-valued is quantized as given (TE has no such path).
#pragma once

#include <cstdint>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/hd.hpp"
#include "sim/block_rule.hpp"

namespace fp4lab {

// bf16_rn(fminf(S_enc / sdec, bf16_max)) as a float: fminf takes the non-NaN operand.
FP4LAB_HD inline float te_fast_math_coefficient(float s_enc, float sdec) {
  constexpr float bf16_max = 3.38953138925153547590470800371487866880e+38f;  // 0x7F7F
  const float q = s_enc / sdec;
  const float c = q != q ? bf16_max : (q < bf16_max ? q : bf16_max);
  return bits_float(encode_rn_f32<bfloat16>(c, Overflow::saturate) << 16);
}

struct TeFastMathRule {
  static constexpr BlockRuleId id = BlockRuleId::te_fast_math;
  struct Params {
    Round round;
    Overflow overflow;
    int sr_width;
    bool ue4m3;  // else e4m3fn (the same codes for the non-negative scales)
  };
  using Global = NvGlobal;

  static Params params(const QuantizerSpec& q) {
    return Params{q.round, q.overflow, sr_width(q.sr_bits, *q.element), q.scale == &ufloat8_e4m3};
  }
  FP4LAB_HD static OuterAmax outer(const Params&) { return OuterAmax::tensor; }
  FP4LAB_HD static NvGlobal global(const Params&, uint32_t amax_bits) {
    return nv_global(bits_float(amax_bits), 448.0f, 6.0f);
  }
  FP4LAB_HD static float g_dec(const NvGlobal& g) { return g.g_dec; }
  FP4LAB_HD static constexpr bool amax_drops_nan(const Params&) { return true; }

  template <class X>
  FP4LAB_HD static BlockChoice choose(const Params& p, const NvGlobal& g, uint32_t amax, const X& /*view*/,
                                      const BlockAt& /*at*/) {
    const float a = bits_float(amax);
    const NvBlockScale s = p.ue4m3 ? nv_block_scale<ufloat8_e4m3>(a, g) : nv_block_scale<float8_e4m3fn>(a, g);
    return StandardRule::nv_choice(s, te_fast_math_coefficient(g.g_enc, s.scale), 0);
  }
  FP4LAB_HD static Element encode(const Params& p, const BlockChoice& c, float x, uint32_t rbits) {
    constexpr Format e2m1 = float4_e2m1fn;  // a local copy: device code cannot refer to the host global
    const float y = x == 0.0f ? 0.0f : x * c.mult;
    const uint32_t code = fp4lab::encode(e2m1, y, p.round, p.overflow, rbits, p.sr_width);
    return Element{code, decode(e2m1, code)};
  }
};

}  // namespace fp4lab
