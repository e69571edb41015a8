// Quartet II's forward NVFP4 quantizer (IST-DASLab, Quartet-II, CUDA kernels), scalar by scalar, host and
// device: `emulate: "quartet2"` with scale_select max (round-to-nearest) or four_over_six (its 4/6).
//
// Source: github.com/IST-DASLab/Quartet-II at 8776a90b, kernels/csrc/round_four_six.cu (quantize,
// quant_error, four_six_fp4_kernel<6> and <6, 4>), utils.cuh (vecReduceAbsMax, reciprocal_approximate_ftz),
// kernels/python/quartet2/linear.py (the forward's amax, scale_override 1, the GEMM's alpha). Read, not
// run: its kernels build for sm_100a / sm_120a only. Per tensor, one FP32 operation a line, RN:
//   k   = fl(1/448), or fl(1/256) for 4/6                         (inv_scales_max)
//   S   = amax == 0 ? 1 : fl(fl(amax * k) * fl(1/6))             the tensor scale (stored; the GEMM's alpha)
//   iS  = rcp(S)                                                  rcp = rcp.approx.ftz.f32 (core/ptx_approx.hpp)
// Per block of 16 (amax a of its BF16 magnitudes, NaN left out) and candidate V (6; for 4/6 then 4):
//   s8  = e4m3_rn_satfinite(fl(fl(a * fl(1/V)) * iS))             the block scale code (stored, even when 0)
//   f   = rcp(fl((s8 == 0 ? 1 : dec(s8)) * S))                    the element factor
//   q_t = e2m1_rn_satfinite(fl(x_t * f))                          the element codes
//   err = (Le + Lo) + (Le' + Lo')                                 4/6's score: fma chains over d_t =
//         fma(dec(q_t), -fl(dec(s8) * S), x_t), Le = fma(d6, d6, fma(d4, d4, fma(d2, d2, fma(d0, d0, 0)))) over
//         the even t of elements 0-7, Lo over the odd ones, Le', Lo' the same over elements 8-15
// The first candidate with err < (the best so far, from +Inf) is kept: 4 must be strictly better than 6.
// Dequant = (dec(q_t) * dec(s8)) * S, the stored codes' (Quartet II's _dq_fp4 and its GEMM's factorisation).
// Where no candidate's error is below +Inf (an error that overflows, or NaN) Quartet II leaves its result
// uninitialised; fp4lab keeps the first candidate there and flags the block as an overflow.
// The tensor amax is torch's x.abs().max() of the BF16 input, which propagates NaN (every output of a tensor
// holding NaN is then NaN-derived); fp4lab leaves NaN out at both levels and quantizes the rest.
// The kernel reads BF16: FP32 input that is not BF16-valued is quantized as given (Quartet II has no such
// path). Its layout needs cols % 128 == 0 and writes the scales swizzled for its GEMM; fp4lab takes any shape
// and writes scales row-major.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/hd.hpp"
#include "core/ptx_approx.hpp"

namespace fp4lab {

struct Quartet2Tensor {
  float s = 1.0f;      // S, the tensor scale (the dequantization's global factor)
  float inv_s = 1.0f;  // rcp(S)
};

FP4LAB_HD inline Quartet2Tensor quartet2_tensor(float amax, bool four_six) {
  constexpr float inv_scales_max_6 = 1.0f / 448.0f, inv_scales_max_46 = 1.0f / 256.0f, one_over_six = 1.0f / 6.0f;
  const float inv_val_max = 1.0f * one_over_six;  // scale_override (1 in the forward) * fl(1/6)
  Quartet2Tensor t;
  t.s = amax == 0.0f ? 1.0f : (amax * (four_six ? inv_scales_max_46 : inv_scales_max_6)) * inv_val_max;
  t.inv_s = rcp_approx_ftz(t.s);
  return t;
}

// One candidate's block scale: its E4M3 code, the element factor, and whether the scale rounded past 448.
struct Quartet2Scale {
  uint32_t code = 0;
  float factor = 0;
  bool overflow = false;
};

// inv_v = fl(1/V): fl(1/6) or 0.25.
FP4LAB_HD inline Quartet2Scale quartet2_scale(float block_amax, float inv_v, const Quartet2Tensor& t) {
  constexpr Format e4m3 = float8_e4m3fn;  // a local copy: device code cannot refer to the host global
  const float raw = (block_amax * inv_v) * t.inv_s;
  Quartet2Scale s;
  s.code = encode_rn_f32<float8_e4m3fn>(raw, Overflow::saturate);
  s.overflow = raw == raw && is_nan_code(e4m3, encode_rn_f32<float8_e4m3fn>(raw, Overflow::nonsaturate));
  const float d = decode(e4m3, s.code);
  s.factor = rcp_approx_ftz((d == 0.0f ? 1.0f : d) * t.s);
  return s;
}

// The 4/6 score of one candidate: x(t) reads the block's element t (t < n <= 16; missing elements of a
// partial block count as 0, whose d is 0), value(t) its E2M1 value under the candidate, descale fl(dec(s8) * S).
template <class X, class V>
FP4LAB_HD inline float quartet2_error(const X& x, const V& value, int n, float descale) {
  float half[2];
  for (int h = 0; h < 2; ++h) {  // the two threads of a block, elements 8h .. 8h + 7
    float even = 0.0f, odd = 0.0f;
    for (int t = 8 * h; t < 8 * h + 8; t += 2) {
      const float de = t < n ? fmaf(value(t), -descale, x(t)) : 0.0f;
      const float dd = t + 1 < n ? fmaf(value(t + 1), -descale, x(t + 1)) : 0.0f;
      even = fmaf(de, de, even);
      odd = fmaf(dd, dd, odd);
    }
    half[h] = even + odd;
  }
  return half[0] + half[1];
}

}  // namespace fp4lab
