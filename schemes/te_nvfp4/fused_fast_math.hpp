// TransformerEngine's fused RHT-cast NVFP4 kernels under NVTE_USE_FAST_MATH=1 (`emulate:
// "te_fused_fast_math"`): the arithmetic of TE's row_cast_col_hadamard_transform_cast_fusion.cu and its grouped
// variants (paths P1, P3, P6 of docs/log/2026-12-01-te-rht-cast-fusion.md, sec. 4a), which quantize both the
// rowwise output of x / dy and, after the RHT, the columnwise one. Without fast math those kernels are exactly
// the standard rule's nv (on bf16_rn of the RHT output: rht_output "bf16"); with it they differ from it, and
// from the tuned 1-D kernel that te_fast_math models, in the element factor:
//   a     = bf16_rn(global amax)                   the amax kernel's max over BF16 values (the RHT's rounded
//                                                  ones for the columnwise output: max |bf16_rn(v)| =
//                                                  bf16_rn(max |v|), so the FP32 values' amax gives it)
//   S_enc = a > 0 ? min(fl(2688 / a), FLT_MAX) : 1  (an amax of Inf gives 0: every later value NaN)
//   g_dec = fl(1 / S_enc), mult = fl(S_enc * fl(1/6))
//   sdec  = e4m3_rn_satfinite(fl(vmax * mult))      vmax: max.NaN over the block's FP32 values (NaN kept)
//   e     = min.NaN(rcp(fl(sdec * g_dec)), FLT_MAX)  rcp = rcp.approx.ftz.f32 (core/ptx_approx.hpp); TE's
//                                                  default build takes fl(1 / ...) here: the nv rule
//   y     = fl(v * e)                              a plain product: -0 stays -0
//   code  = cvt.rn|rs.satfinite.e2m1(y)            SR: the ptx_x4 random-bit contract
// v is the BF16 input's value for the rowwise output and the FP32 tensor-core sum of the RHT (not rounded to
// BF16 under fast math: rht_output "f32", TE's fixed signs: rht_signs "te") for the columnwise one. fp4lab's
// RHT sums a chunk by butterflies; TE's MMA gives the same FP32 value wherever the exact sum fits FP32 (a
// chunk whose exponents span at most 12 binades; beyond that the tensor core's alignment is unpublished).
// Dequant: (decode(code) * sdec) * g_dec. Departures: TE's amax kernel leaves NaN out of the global amax while
// its block amaxes keep it; fp4lab keeps it in both, so a NaN gives S_enc 1 here (TE: the amax of the rest).
// TE's kernels run on Blackwell (sm_100-sm_110) only: not runnable on the lent H200s, so this rule is read from
// TE's source (d0067d0da) and checked against a construction and CPU = CUDA, not against TE's output.
#pragma once

#include <cstdint>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/hd.hpp"
#include "core/ptx_approx.hpp"
#include "sim/block_rule.hpp"

namespace fp4lab {

FP4LAB_HD inline NvGlobal te_fused_global(float amax) {
  constexpr Format bf16 = bfloat16;  // a local copy: device code cannot refer to the host global
  const float a = decode(bf16, encode_rn_f32<bfloat16>(amax, Overflow::nonsaturate));
  NvGlobal g;
  const float q = 2688.0f / a;
  g.g_enc = a > 0.0f ? (q < flt_max_f ? q : flt_max_f) : 1.0f;
  g.g_dec = 1.0f / g.g_enc;
  g.mult = g.g_enc * (1.0f / 6.0f);
  return g;
}

// min.NaN(rcp(fl(sdec * g_dec)), FLT_MAX): NaN stays NaN.
FP4LAB_HD inline float te_fused_fast_math_factor(float sdec, float g_dec) {
  const float e = rcp_approx_ftz(sdec * g_dec);
  return e > flt_max_f ? flt_max_f : e;
}

struct TeFusedFastMathRule {
  static constexpr BlockRuleId id = BlockRuleId::te_fused_fast_math;
  struct Params {
    Round round;
    int sr_width;
    bool ue4m3;  // else e4m3fn (the same codes for the non-negative scales)
  };
  using Global = NvGlobal;

  static Params params(const QuantizerSpec& q) {
    return Params{q.round, sr_width(q.sr_bits, *q.element), q.scale == &ufloat8_e4m3};
  }
  FP4LAB_HD static OuterAmax outer(const Params&) { return OuterAmax::tensor; }
  FP4LAB_HD static NvGlobal global(const Params&, uint32_t amax_bits) { return te_fused_global(bits_float(amax_bits)); }
  FP4LAB_HD static float g_dec(const NvGlobal& g) { return g.g_dec; }

  template <class X>
  FP4LAB_HD static BlockChoice choose(const Params& p, const NvGlobal& g, uint32_t amax, const X& /*view*/,
                                      const BlockAt& /*at*/) {
    const float a = bits_float(amax);
    const NvBlockScale s = p.ue4m3 ? nv_block_scale<ufloat8_e4m3>(a, g) : nv_block_scale<float8_e4m3fn>(a, g);
    return StandardRule::nv_choice(s, te_fused_fast_math_factor(s.scale, g.g_dec), amax > 0x7F800000u ? flag_nan : 0);
  }
  FP4LAB_HD static MultEncoder mult_encoder(const Params& p) {
    constexpr Format e2m1 = float4_e2m1fn;  // a local copy: device code cannot refer to the host global
    return MultEncoder{e2m1, p.round, Overflow::saturate, false, false, p.sr_width};
  }
  FP4LAB_HD static Element encode(const Params& p, const BlockChoice& c, float x, uint32_t rbits) {
    return mult_encoder(p).element(c.mult, x, rbits);
  }
};

}  // namespace fp4lab
