// TransformerEngine's 2026 NVFP4 options, scalar by scalar (host and device):
// "Four Over Six" block-scale selection (TE PR #2972, its FP16 error path
// #3068) and the dequantization scale of its NVFP4 tensors, which row-scaled
// NVFP4 (TE PR #2931, one amax per tensor row) shares. The block-level use
// (which amax, which elements, the 16x16 tree) is schemes/te_nvfp4/rule.hpp.
//
// Source: github.com/NVIDIA/TransformerEngine at d0067d0da (2026-08-22):
// common/cast/nvfp4/quantize_4over6_nvfp4.cuh (compute_scale_pair,
// cvt_fp32_to_fp4_8x_with_error, accumulate_dequant_error,
// accumulate_fp16_scaled_error_pair, reduce_group_sum_16),
// core_nvfp4.cuh (compute_global_encode_scaling_factor_FP4<E4M3_MAX>),
// dequantize_nvfp4.cuh (dequantize_fp4_kernel); the research note
// docs/log/research_te_nvfp4_options.md. Each line is one FP32 operation, RN
// (compile without FMA contraction: -ffp-contract=off, nvcc --fmad=false):
//   S_enc = (E4M3_MAX * 6) / global_amax        E4M3_MAX = 448 or 256 (e4m3_max)
//   S_enc = min(S_enc, FLT_MAX); S_enc = 1 if global_amax == 0 or S_enc == 0
//   S_dec = 1 / S_enc
//   base  = (block_amax / 6) * S_enc             divide, then multiply (the
//                                                nv rule: amax * (S_enc * fl(1/6)))
//   sf4   = e4m3_rn_satfinite(min(base * 1.5, 448))   map-to-4 (448 also when E4M3_MAX = 256)
//   sf6   = e4m3_rn_satfinite(min(base, 448))         map-to-6 (the usual scale)
//   inv_c = min(1 / (sf_c * S_dec), FLT_MAX)          (sf 0 -> FLT_MAX)
//   q_c   = e2m1_rn_satfinite(x * inv_c)
//   err_c = err_c + e over the elements in order, from 0, with
//     exact path (mae, mse):  diff = (((q * sf) * global_amax) / (6 * E4M3_MAX)) - x
//     fp16 path (mae_fp16, mse_fp16; TE's NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH):
//                             diff = (q * sf) - (x * S_enc)
//                             (TE multiplies q and sf in FP16: the product has
//                             at most 6 significant bits and lies in [2^-10,
//                             2688], exact there and in FP32 alike)
//     e = |diff| (mae) or diff * diff (mse)
//   16x16 tiles: err_c of each of the 16 rows (lines), then TE's shuffle tree
//     a_i = r_i + r_{i+8}, b_i = a_i + a_{i+4}, c_i = b_i + b_{i+2}, err = c_0 + c_1
//   map-to-4 iff err4 < err6 (strict: ties and NaN take map-to-6)
//   dequantization: final = (sf * amax) * fl(1 / (6 * E4M3_MAX)); value = q * final
// NaN: TE's kernels drop NaN from amax (fmaxf); here the min()s are comparisons
// that keep a NaN operand, so a NaN amax gives NaN scales and values (the nv
// rule's convention; NaN input is outside TE's bit-exact contract).
#pragma once

#include <cstdint>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/hd.hpp"

namespace fp4lab {

// How a 4/6 candidate's error is measured (TE's nvfp4_4over6_err_mode MAE /
// MSE, and its fast-math FP16 path).
enum class SelectError : uint8_t { mae, mse, mae_fp16, mse_fp16 };
FP4LAB_HD constexpr bool select_error_fp16(SelectError m) {
  return m == SelectError::mae_fp16 || m == SelectError::mse_fp16;
}
FP4LAB_HD constexpr bool select_error_squared(SelectError m) {
  return m == SelectError::mse || m == SelectError::mse_fp16;
}

inline constexpr float te_flt_max = 3.40282346638528859811704183484516925440e+38f;

// min(a, b) as TE's fminf for every non-NaN a; a NaN a stays NaN.
FP4LAB_HD constexpr float te_min(float a, float b) { return a > b ? b : a; }

// compute_global_encode_scaling_factor_FP4<E4M3_MAX>(global_amax).
FP4LAB_HD constexpr float te_global_encode(float global_amax, float e4m3_max) {
  float enc = (e4m3_max * 6.0f) / global_amax;
  enc = enc > te_flt_max ? te_flt_max : enc;
  if (global_amax == 0.0f || enc == 0.0f) enc = 1.0f;
  return enc;
}

// dequantize_fp4_kernel's final scale of a block: float(sf) * amax * factor_inv,
// factor_inv = 1.0f / (6.0f * E4M3_MAX), left to right.
FP4LAB_HD constexpr float te_dequant_scale(float sf, float amax, float e4m3_max) {
  const float factor_inv = 1.0f / (6.0f * e4m3_max);
  return (sf * amax) * factor_inv;
}

// One candidate block scale.
struct FosCandidate {
  uint32_t code = 0;  // E4M3 code (e4m3fn and ue4m3 agree on it: sf >= 0 or NaN)
  float scale = 0;    // its value
  float inv = 0;      // element operand: x * inv
  float raw = 0;      // the scale before the 448 clamp (base or base * 1.5)
};
FP4LAB_HD constexpr FosCandidate fos_candidate(float raw, float s_dec) {
  FosCandidate c;
  c.raw = raw;
  c.code = encode_rn_f32<float8_e4m3fn>(te_min(raw, 448.0f), Overflow::saturate);
  c.scale = decode_f32<float8_e4m3fn>(c.code);
  const float inv = 1.0f / (c.scale * s_dec);
  c.inv = inv > te_flt_max ? te_flt_max : inv;
  return c;
}

// compute_scale_pair<E4M3_MAX>: both candidates of a block.
struct FosPair {
  FosCandidate map4, map6;
};
FP4LAB_HD constexpr FosPair fos_candidates(float block_amax, float s_enc) {
  const float base = (block_amax / 6.0f) * s_enc;
  const float s_dec = 1.0f / s_enc;
  return FosPair{fos_candidate(base * 1.5f, s_dec), fos_candidate(base, s_dec)};
}

// What a candidate's error needs besides the element: the global amax behind
// S_enc (the tensor's, or the row's), 6 * E4M3_MAX, S_enc and the measure.
struct FosErrorArgs {
  float global_amax = 0, denom = 2688.0f, s_enc = 1.0f;
  SelectError mode = SelectError::mae;
};
// The error of element x encoded as E2M1 code `code` under block scale sf.
FP4LAB_HD constexpr float fos_error_term(float x, uint32_t code, float sf, const FosErrorArgs& k) {
  const float q = decode_f32<float4_e2m1fn>(code);
  float diff;
  if (select_error_fp16(k.mode)) {
    diff = (q * sf) - (x * k.s_enc);
  } else {
    diff = (((q * sf) * k.global_amax) / k.denom) - x;
  }
  return select_error_squared(k.mode) ? diff * diff : bits_float(float_bits(diff) & 0x7FFFFFFFu);
}

// Both candidates' errors over one line of n elements, x(i) the i-th in order.
template <class Line>
FP4LAB_HD constexpr void fos_line_errors(const Line& x, int n, const FosPair& c, const FosErrorArgs& k, float& e4,
                                         float& e6) {
  e4 = 0.0f;
  e6 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float v = x(i);
    const uint32_t q4 = encode_rn_f32<float4_e2m1fn>(v * c.map4.inv, Overflow::saturate);
    const uint32_t q6 = encode_rn_f32<float4_e2m1fn>(v * c.map6.inv, Overflow::saturate);
    e4 = e4 + fos_error_term(v, q4, c.map4.scale, k);
    e6 = e6 + fos_error_term(v, q6, c.map6.scale, k);
  }
}

// reduce_group_sum_16: __shfl_down_sync at offsets 8, 4, 2, 1 over 16 lanes,
// lane 0's sum.
FP4LAB_HD constexpr float fos_tree16(const float (&r)[16]) {
  float a[8] = {}, b[4] = {}, c[2] = {};
  for (int i = 0; i < 8; ++i) a[i] = r[i] + r[i + 8];
  for (int i = 0; i < 4; ++i) b[i] = a[i] + a[i + 4];
  for (int i = 0; i < 2; ++i) c[i] = b[i] + b[i + 2];
  return c[0] + c[1];
}

// The selection of one block. x(l, i): element i of line l, for lines
// l < lines of len elements each (1 line for 1-D blocks; the valid rows of a
// 16x16 tile when `tile`, whose absent rows add 0 to the tree, as absent
// elements add nothing to a line: TE's zero padding, whose error is 0).
struct FosChoice {
  FosCandidate pick;
  bool map4 = false;
  float err4 = 0, err6 = 0;
};
template <class X>
FP4LAB_HD constexpr FosChoice fos_select(const X& x, int lines, int len, bool tile, float block_amax,
                                         const FosErrorArgs& k) {
  const FosPair c = fos_candidates(block_amax, k.s_enc);
  FosChoice ch;
  if (!tile) {
    fos_line_errors([&](int i) { return x(0, i); }, len, c, k, ch.err4, ch.err6);
  } else {
    float r4[16] = {}, r6[16] = {};
    for (int l = 0; l < lines && l < 16; ++l)
      fos_line_errors([&](int i) { return x(l, i); }, len, c, k, r4[l], r6[l]);
    ch.err4 = fos_tree16(r4);
    ch.err6 = fos_tree16(r6);
  }
  ch.map4 = ch.err4 < ch.err6;
  ch.pick = ch.map4 ? c.map4 : c.map6;
  return ch;
}

}  // namespace fp4lab
