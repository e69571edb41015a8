// Block-scale rules: how a block's scale is derived from its amax.
//
// Header-only and FP4LAB_HD (host + device): the CPU simulator (sim/quantizer.cpp)
// and the CUDA kernels (cuda/) call these same functions; there is no second
// implementation. Every function is exact integer/bit arithmetic or a fixed,
// documented sequence of single FP32 operations (round to nearest even), so the
// result is bit-identical wherever it runs. Compile without fast-math and with
// -ffp-contract=off (nvcc: --fmad=false for code calling nv_* functions), or the
// FP32 sequences below could be fused.
//
// amax is passed as the float32 bit pattern of max |x| over the block's valid
// elements with the sign bit cleared (`amax_bits`). The maximum of these
// unsigned patterns is the bit pattern of the maximum magnitude, NaN patterns
// (> 0x7F800000) dominate Inf (== 0x7F800000), so `max(bits & 0x7FFFFFFF)` over
// a block is an exact, order-independent amax that propagates NaN.
//
// ---- power-of-two (MX) rules: result is an E8M0 exponent e, scale = 2^e ----
//  ocp       OCP Microscaling Formats (MX) v1.0 sec. 6.3 (fp4-trainkit eq. 1):
//              e = floor(log2(amax)) - emax(element)
//            emax(element) = exponent of the largest power of two <= max finite
//            (e2m1: 2, e2m3: 2, e3m2: 4, e4m3: 8, e5m2: 15, int8: 0). Elements
//            x / 2^e above the element's max saturate (or follow `overflow`).
//  ceil      round-to-infinity (Mishra et al. 2025, "Recipes for Pre-training
//            LLMs with MXFP8", the scale of NVIDIA's MXFP8 recipe):
//              e = ceil(log2(amax / max_finite(element)))
//            computed EXACTLY: the smallest e with amax <= max_finite * 2^e (we
//            compare significands; no FP32 division). Never clamps an element
//            (except when e is clamped at +127). TransformerEngine computes
//            fl(amax * fl(1/max)) rounded up to a power of two instead; the two
//            can differ only when amax is within ~1 ulp above max * 2^k.
//  tetrajet  TetraJet (Chen et al. 2025, sec. 3.2, "truncation-free scaling"):
//              e = ceil(log2(2 * amax / (Qmax - Qmin)))
//            as fp4-trainkit's ScaleImpl.TetraJet writes it. For the symmetric
//            element formats here (Qmin = -Qmax) this is exactly the `ceil` rule,
//            and it is computed by the same exact comparison. (The paper text
//            itself could not be retrieved with the project's search tool; the
//            definition follows fp4-trainkit's implementation of it.)
//  E8M0 range: e is clamped to [-127, 127]. Clamping up (e < -127 needed) is a
//  scale underflow, clamping down a scale overflow (counted in QuantStats).
//  amax == 0: e = -127 (E8M0 code 0; every element is 0 anyway; not counted as
//  underflow). amax NaN or Inf: the scale is NaN (E8M0 code 0xFF), following
//  OCP MX v1.0 sec. 6.3 for a block holding NaN/Inf; every element of such a
//  block encodes NaN (e2m1/e2m3/e3m2/int8 have no NaN: core's encode() gives
//  +max) and dequantizes to NaN (NaN scale).
//  Element encoding: x * 2^-e. This is exact in FP32 unless it falls below
//  2^-126 (FP32 subnormals); there every rounding mode but rp/rm gives the same
//  code as on the exact quotient (the value is far below half the element's
//  smallest subnormal), and the simulator uses the exact float64 product for
//  rp/rm.
//
// ---- NVFP4 (`nv`), TransformerEngine's two-level scaling --------------------
//  Source: TransformerEngine common/cast/nvfp4/core_nvfp4.cuh
//  (compute_global_encode_scaling_factor_FP4, compute_decoding_scaling_factor,
//  compute_scaling_coefficient<float>) and its Python reference
//  pytorch/custom_recipes/quantization_nvfp4.py (_quantize_blockwise_reference).
//  With S = max_finite(scale format) (448 for ue4m3) and E = max_finite(element)
//  (6 for e2m1); each line one FP32 operation, RN:
//    g_enc = (S * E) / amax_tensor          (S * E = 2688, exact)
//    g_enc = min(g_enc, FLT_MAX)            (amax_tensor == 0 gives Inf -> FLT_MAX)
//    g_enc = 1 if amax_tensor == 0 or g_enc == 0 (amax Inf)    [TE's CUDA kernel]
//    g_dec = 1 / g_enc
//    mult  = g_enc * fl(1 / E)              (fl(1/6) = 0x3E2AAAAB)
//    s_f   = min(amax_block * mult, FLT_MAX)
//    s     = encode(ue4m3, s_f, rn, saturate)   (s_f > 448 -> 448)
//    e     = min(1 / (decode(s) * g_dec), FLT_MAX)   (s == 0 -> FLT_MAX)
//    code  = encode(element, x * e, round, overflow)  (saturate == TE's clamp to +-E)
//    dequant = (decode(code) * decode(s)) * g_dec
//  DESIGN.md sec. 3 states the same order. One difference between TE's two
//  sources: for amax_tensor == 0 the Python reference keeps g_enc = FLT_MAX, the
//  CUDA kernel (and DESIGN.md) use 1; we follow the kernel. Only g_dec differs;
//  codes, block scales and dequantized values (all 0) are the same.
//  NaN anywhere in the tensor makes g_enc NaN and every block scale NaN (code
//  0x7F), so every dequantized value is NaN (as TE's Python reference, whose
//  torch.max propagates NaN; TE's kernels reduce amax with fmaxf, which skips
//  NaN). Inf in the tensor: g_enc = 1, the Inf block's scale saturates to 448,
//  Inf elements saturate to +-E.
//  Scale underflow: s == 0 while amax_block > 0 (the block flushes to zero).
//  Scale overflow: s_f rounds beyond 448 (s_f >= 464), so the saturation
//  changes the scale (with a global scale only for an Inf amax).
//
// ---- `nv_noglobal`: fp4-trainkit eq. 3 (its "FP4 all the way" NVFP4) -------
//    s_f  = amax_block / E                          (FP32 division)
//    s_f  = clamp(s_f, 2^-9, 448)                   (fp4-trainkit clamps to
//                                                    [SCALE_MIN_VAL, SCALE_MAX_VAL])
//    s    = encode(ue4m3, s_f, rn, saturate)
//    code = encode(element, x / decode(s), round, overflow)   (FP32 division)
//    dequant = decode(code) * decode(s)
//  With no per-tensor scale, a block whose amax is below 6 * 2^-9 (~0.0117,
//  typical of gradients) gets the smallest scale 2^-9, and its elements with
//  |x| <= 2^-11 (x / 2^-9 <= 0.25) round to zero under rn: the underflow that
//  broke fp4-trainkit's NVFP4 runs (a block with amax <= 2^-11 flushes whole).
//  Counted as a scale underflow when amax_block / E < 2^-9 and amax_block > 0.
//
// ---- per-tensor (`tensor_amax`, FP8 current scaling as TE) ------------------
//    enc = max_finite(element) / amax_tensor   (FP32)
//    enc = 1 if amax_tensor is 0, Inf or NaN; FLT_MAX if enc is Inf
//    code = encode(element, x * enc, round, overflow)
//    dec = 1 / enc; dequant = decode(code) * dec
//  Source: TransformerEngine common/recipe/recipe_common.cuh compute_scale_from_amax
//  (epsilon 0, no power-of-two forcing).
#pragma once

#include <cstdint>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/hd.hpp"

namespace fp4lab {

inline constexpr int e8m0_min_exp = -127;
inline constexpr int e8m0_max_exp = 127;
inline constexpr float flt_max_f = 3.40282346638528859811704183484516925440e+38f;

// Outcome of a power-of-two rule for one block.
struct MxScale {
  int exp = 0;             // scale = 2^exp, in [-127, 127] (undefined if nan)
  bool nan = false;        // amax was NaN or Inf
  bool underflow = false;  // the rule wanted exp < -127 for a non-zero amax
  bool overflow = false;   // the rule wanted exp > 127
  FP4LAB_HD constexpr uint32_t code() const { return nan ? 0xFFu : uint32_t(exp + 127); }
};

// floor(log2(a)) and the significand of a (as a 24-bit integer in
// [2^23, 2^24)) for finite, non-zero float bits a (sign cleared). Exact,
// subnormals included.
FP4LAB_HD constexpr int floor_log2_bits(uint32_t a) {
  const uint32_t e = a >> 23;
  if (e != 0) return int(e) - 127;
  return (63 - clz64(uint64_t(a))) - 149;  // subnormal: a = m * 2^-149
}
FP4LAB_HD constexpr uint32_t significand24(uint32_t a) {
  const uint32_t e = a >> 23;
  if (e != 0) return (a & 0x7FFFFFu) | 0x800000u;
  return a << (clz64(uint64_t(a)) - 40);  // normalise m so bit 23 is the top
}

namespace detail {
FP4LAB_HD constexpr MxScale clamp_mx(int e, bool amax_zero) {
  MxScale s;
  if (e < e8m0_min_exp) {
    s.exp = e8m0_min_exp;
    s.underflow = !amax_zero;
  } else if (e > e8m0_max_exp) {
    s.exp = e8m0_max_exp;
    s.overflow = true;
  } else {
    s.exp = e;
  }
  return s;
}
}  // namespace detail

// OCP MX v1.0: e = floor(log2(amax)) - emax(element), clamped to E8M0.
FP4LAB_HD constexpr MxScale mx_scale_ocp(uint32_t amax_bits, const Format& element) {
  if (amax_bits >= 0x7F800000u) return MxScale{0, true, false, false};
  if (amax_bits == 0) return detail::clamp_mx(e8m0_min_exp, true);
  return detail::clamp_mx(floor_log2_bits(amax_bits) - emax(element), false);
}

// Round-to-infinity: the smallest e with amax <= max_finite(element) * 2^e,
// clamped to E8M0. Exact (significand comparison, no division).
FP4LAB_HD constexpr MxScale mx_scale_ceil(uint32_t amax_bits, const Format& element) {
  if (amax_bits >= 0x7F800000u) return MxScale{0, true, false, false};
  if (amax_bits == 0) return detail::clamp_mx(e8m0_min_exp, true);
  const uint32_t max_bits = float_bits(max_finite(element));
  int e = floor_log2_bits(amax_bits) - floor_log2_bits(max_bits);
  if (significand24(amax_bits) > significand24(max_bits)) e += 1;
  return detail::clamp_mx(e, false);
}

// TetraJet truncation-free scaling: ceil(log2(2 amax / (Qmax - Qmin))). All
// element formats here are symmetric (Qmin = -Qmax), so it is mx_scale_ceil.
FP4LAB_HD constexpr MxScale mx_scale_tetrajet(uint32_t amax_bits, const Format& element) {
  return mx_scale_ceil(amax_bits, element);
}

// ---- NVFP4 ------------------------------------------------------------------

struct NvGlobal {
  float g_enc = 1.0f;  // global encode scale
  float g_dec = 1.0f;  // global decode scale (what the GEMM multiplies by)
  float mult = 1.0f;   // g_enc * fl(1/E): block amax -> block scale
};

// TE's compute_global_encode_scaling_factor_FP4 and the per-block multiplier.
// `scale_max` = max_finite(scale format), `elem_max` = max_finite(element).
FP4LAB_HD constexpr NvGlobal nv_global(float amax_tensor, float scale_max, float elem_max) {
  NvGlobal g;
  float enc = (scale_max * elem_max) / amax_tensor;
  enc = enc > flt_max_f ? flt_max_f : enc;  // NaN stays NaN (not fminf)
  if (amax_tensor == 0.0f || enc == 0.0f) enc = 1.0f;
  g.g_enc = enc;
  g.g_dec = 1.0f / enc;
  g.mult = enc * (1.0f / elem_max);
  return g;
}
// Global scale "none": the same formulas with g_enc = 1.
FP4LAB_HD constexpr NvGlobal nv_no_global(float elem_max) { return NvGlobal{1.0f, 1.0f, 1.0f * (1.0f / elem_max)}; }

struct NvBlockScale {
  uint32_t code = 0;    // scale-format code (ue4m3)
  float scale = 0.0f;   // decode(code)
  float encode = 0.0f;  // e: element code = encode(x * e)
  bool underflow = false, overflow = false;
};

FP4LAB_HD constexpr NvBlockScale nv_block_scale(float amax_block, const NvGlobal& g, const Format& scale_format) {
  NvBlockScale b;
  float s_f = amax_block * g.mult;
  s_f = s_f > flt_max_f ? flt_max_f : s_f;
  // Overflow: s_f rounds (RN) beyond the largest finite scale, i.e. the
  // saturation changes the scale (not a mere rounding to 448).
  b.overflow = is_nan_code(scale_format, encode(scale_format, s_f, Round::rn, Overflow::nonsaturate)) && s_f == s_f;
  b.code = encode(scale_format, s_f, Round::rn, Overflow::saturate);
  b.scale = decode(scale_format, b.code);
  b.underflow = b.scale == 0.0f && amax_block > 0.0f;
  const float e = 1.0f / (b.scale * g.g_dec);
  b.encode = e > flt_max_f ? flt_max_f : e;
  return b;
}
// The same with an E4M3 scale format known at compile time (ue4m3 or e4m3fn),
// through core's branch-free encode_rn_f32 (equal to encode(..., rn, ...) by
// core's contract). s_f is >= 0 or NaN, and for those inputs float8_e4m3fn and
// ufloat8_e4m3 have the same codes (sign bit 0, NaN 0x7F), so the signed
// encoder serves both.
template <const Format& S>
FP4LAB_HD constexpr NvBlockScale nv_block_scale(float amax_block, const NvGlobal& g) {
  static_assert(S.exp_bits == 4 && S.man_bits == 3 && S.bias == 7 && S.special == Special::fn);
  NvBlockScale b;
  float s_f = amax_block * g.mult;
  s_f = s_f > flt_max_f ? flt_max_f : s_f;
  constexpr Format scale_format = S;  // a local copy: device code cannot refer to the host global S
  b.overflow = is_nan_code(scale_format, encode_rn_f32<float8_e4m3fn>(s_f, Overflow::nonsaturate)) && s_f == s_f;
  b.code = encode_rn_f32<float8_e4m3fn>(s_f, Overflow::saturate);
  b.scale = decode_f32<S>(b.code);
  b.underflow = b.scale == 0.0f && amax_block > 0.0f;
  const float e = 1.0f / (b.scale * g.g_dec);
  b.encode = e > flt_max_f ? flt_max_f : e;
  return b;
}

// fp4-trainkit eq. 3 (no global scale). `encode` is unused (elements divide
// by `scale`), kept 0. First step, shared by both forms below: s_f = amax /
// elem_max clamped to the scale format's [min_subnormal, max_finite] (NaN
// stays NaN), with the under/overflow flags set in b.
FP4LAB_HD constexpr float nv_noglobal_clamped(float amax_block, float elem_max, float lo, float hi, NvBlockScale& b) {
  const float s_f = amax_block / elem_max;
  b.underflow = s_f < lo && amax_block > 0.0f;
  b.overflow = s_f > hi;
  return s_f < lo ? lo : (s_f > hi ? hi : s_f);
}
FP4LAB_HD constexpr NvBlockScale nv_noglobal_block_scale(float amax_block, float elem_max, const Format& scale_format) {
  NvBlockScale b;
  const float s_f = nv_noglobal_clamped(amax_block, elem_max, min_subnormal(scale_format), max_finite(scale_format), b);
  b.code = encode(scale_format, s_f, Round::rn, Overflow::saturate);
  b.scale = decode(scale_format, b.code);
  return b;
}
// The same with an E4M3 scale format known at compile time (ue4m3 or e4m3fn;
// see nv_block_scale<S>), through core's branch-free encode_rn_f32.
template <const Format& S>
FP4LAB_HD constexpr NvBlockScale nv_noglobal_block_scale(float amax_block, float elem_max) {
  static_assert(S.exp_bits == 4 && S.man_bits == 3 && S.bias == 7 && S.special == Special::fn);
  NvBlockScale b;
  const float s_f = nv_noglobal_clamped(amax_block, elem_max, min_subnormal(S), max_finite(S), b);
  b.code = encode_rn_f32<float8_e4m3fn>(s_f, Overflow::saturate);
  b.scale = decode_f32<S>(b.code);
  return b;
}

// ---- per-tensor FP8 current scaling -----------------------------------------
struct TensorScale {
  float encode = 1.0f;  // x * encode is encoded
  float decode = 1.0f;  // 1 / encode: dequant = decode(code) * decode
};
FP4LAB_HD constexpr TensorScale tensor_amax_scale(float amax_tensor, float elem_max) {
  TensorScale t;
  const bool degenerate = !(amax_tensor > 0.0f) || amax_tensor > flt_max_f;  // 0, NaN, Inf
  float enc = degenerate ? 1.0f : elem_max / amax_tensor;
  enc = enc > flt_max_f ? flt_max_f : enc;
  t.encode = enc;
  t.decode = 1.0f / enc;
  return t;
}

}  // namespace fp4lab
