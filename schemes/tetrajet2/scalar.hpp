// TetraJet-v2's NVFP4 double-block quantizer (thu-ml/TetraJet-v2-NVFP4Training at ca5953f), forward round to
// nearest, scalar by scalar, host and device: 1x16 E4M3 inner blocks under a 1x128 FP32 outer scale (each row
// segment of 128 elements), `emulate: "tetrajet2_source" | "tetrajet2_triton" | "tetrajet2_kernel"`, three
// arithmetics of the same formulas (docs/log/2026-12-01-tetrajet2-quartet2-plan.md, sec. 1):
//   os  = a128 / 448 / 6, 1 if 0                    a128: max |x| over the element's 1x128 row segment
//   is  = a16 / os / 6                              a16: max |x| over its 1x16 block
//   is  = 2^-9 if 0 (source, kernel: before the cast; Triton's round-to-nearest kernel has no such floor)
//   s   = e4m3_rn_satfinite(is)                     the stored inner code (__nv_cvt_float_to_fp8 / float8e4nv)
//   sp  = os * dec(s)                               the block's dequantization scale
//   y   = x * (sp != 0 ? 1 / sp : 0)  (source, kernel)    or    y = sp == 0 ? 0 : x / sp  (triton)
//   q   = e2m1_rn_satfinite(y);  dequant = dec(q) * sp
// where the arithmetic is, per mode:
//   source  IEEE FP32, RN (the CUDA source read without its build flags)
//   kernel  its CUDA kernels as built (kernels/setup.py: --use_fast_math): `/` is div.approx.ftz.f32 =
//           mul.rn.ftz(a, rcp.approx.ftz(b)), `1.0f / x` rcp.approx.ftz.f32, `*` mul.rn.ftz, max.ftz drops a
//           subnormal magnitude to 0 (kernels/csrc/quant_fp4.cu, quant_fp4_from_reg; rcp(448) and rcp(6) equal
//           fl(1/448) and fl(1/6), so ptxas's folding of the constants cannot change them)
//   triton  its Triton baseline (kernels/baseline_fakequant/nvfp4_quant_fused_kernel.py,
//           _E2M1_DoubleScale_fake_quantize_fused_kernel): `/` is div.full.f32 (core/ptx_approx.hpp's div_full,
//           from ptxas's SASS), no 2^-9 floor, E2M1 by floor(log2) / rint (round to nearest even, clamp at 6)
// NaN and Inf inputs are outside all three (the kernels' max reductions treat them differently): not modelled.
// The CUDA kernels need rows and cols % 128 == 0 and the Triton kernel runs 1x128 segments of the flattened
// tensor; fp4lab takes any shape, a partial last segment or block covering the valid elements. Outputs: the
// inner codes as scale codes, sp as the decoded scales (so scales are not decode(code)), global decode 1; the
// outer scales os are not written out.
#pragma once

#include <cstdint>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/hd.hpp"
#include "core/ptx_approx.hpp"

namespace fp4lab {

enum class Tetrajet2Math : uint8_t { source, triton, kernel };

// a / b in the mode's arithmetic.
FP4LAB_HD inline float tetrajet2_div(Tetrajet2Math m, float a, float b) {
  if (m == Tetrajet2Math::triton) return div_full(a, b);
  if (m == Tetrajet2Math::kernel) return div_approx_ftz(a, b);
  return a / b;
}
FP4LAB_HD inline float tetrajet2_mul(Tetrajet2Math m, float a, float b) {
  return m == Tetrajet2Math::kernel ? mul_rn_ftz(a, b) : a * b;
}
// |x| as the mode's max reduction sees it (max.ftz flushes a subnormal magnitude).
FP4LAB_HD inline float tetrajet2_abs(Tetrajet2Math m, float x) {
  const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
  return m == Tetrajet2Math::kernel && a < 0x00800000u ? 0.0f : bits_float(a);
}

FP4LAB_HD inline float tetrajet2_outer_scale(Tetrajet2Math m, float a128) {
  const float os = tetrajet2_div(m, tetrajet2_div(m, a128, 448.0f), 6.0f);
  return os == 0.0f ? 1.0f : os;
}

struct Tetrajet2Block {
  uint32_t code = 0;  // the inner scale's E4M3 code
  float sp = 0;       // os * dec(code)
  float factor = 0;   // the element factor: 1 / sp (source, kernel), or sp, the divisor (triton)
  bool overflow = false;
};

FP4LAB_HD inline Tetrajet2Block tetrajet2_block(Tetrajet2Math m, float a16, float os) {
  constexpr Format e4m3 = float8_e4m3fn;  // a local copy: device code cannot refer to the host global
  float is = tetrajet2_div(m, tetrajet2_div(m, a16, os), 6.0f);
  if (m != Tetrajet2Math::triton && is == 0.0f) is = 0.001953125f;  // 2^-9, before the cast
  Tetrajet2Block b;
  b.code = encode_rn_f32<float8_e4m3fn>(is, Overflow::saturate);
  b.overflow = is == is && is_nan_code(e4m3, encode_rn_f32<float8_e4m3fn>(is, Overflow::nonsaturate));
  b.sp = tetrajet2_mul(m, os, decode(e4m3, b.code));
  if (m == Tetrajet2Math::triton)
    b.factor = b.sp;
  else if (m == Tetrajet2Math::kernel)
    b.factor = b.sp != 0.0f ? rcp_approx_ftz(b.sp) : 0.0f;
  else
    b.factor = b.sp != 0.0f ? 1.0f / b.sp : 0.0f;
  return b;
}

// The value the element's E2M1 code rounds (RN, saturating at 6 by the encoder).
FP4LAB_HD inline float tetrajet2_scaled(Tetrajet2Math m, float x, float factor) {
  if (m == Tetrajet2Math::triton) return factor == 0.0f ? x * 0.0f : div_full(x, factor);  // sp 0: +-0
  return tetrajet2_mul(m, x, factor);
}

}  // namespace fp4lab
