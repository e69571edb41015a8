// fp4-trainkit's quantizer arithmetic, scalar by scalar: what its float32 path
// computes, bit for bit, including where it departs from the recipes' intent.
//
// Source: github.com/vuiseng9/fp4-trainkit at a50163221f49 (the quantizer code
// last changed in 8d0e99843b70), src/fp4tk/quantizer/{mxfp4,nvfp4}.py, read
// line by line in docs/log/research_fp4trainkit.md. Only its float32 path is
// emulated (its example trains in float32; bf16 inputs would run the same code
// in bf16, with eps 2^-7 and bf16 roundings).
//
// Per block of K elements (1-D, along the block axis), amax = max |x| (NaN
// propagates):
//   scale, MX (E8M0), with eps = 2^-23 and log2 correctly rounded to float32:
//     ocp       s = 2^clamp(floor(log2(max(amax / 4, eps))), -127, 127)
//     ceil      s = 2^clamp(ceil(log2(max(amax / 6, eps))), -127, 127)       ("Nvidia_To_Infinity")
//     tetrajet  s = 2^clamp(ceil(log2(max((amax * 2) / 12, eps))), -127, 127)
//               (equal to ceil except that amax * 2 overflows to Inf for amax
//               >= 2^127, giving 2^127 where ceil gives at most 2^126)
//   scale, NVFP4 (E4M3, no per-tensor scale):
//     s = e4m3_rne(clamp(amax / 6, 2^-9, 448))
//   element, t = x / s (float32 division), a = |t|:
//     e  = clamp(floor(log2(max(a, eps))), 0, 2)      the binade, fixed first
//     m  = max(a, eps) / 2^e                          (exact)
//     m  = m + (u - 0.5)      stochastic rounding only, u uniform in [0, 1)
//                             with 24 bits (torch.rand_like): the noise is two
//                             grid steps wide, added after the binade is fixed
//     mq = min(max(rint(2 m) / 2, 0), 1.5)            rint: half to even. A
//                             mantissa that rounds up to 2 is clamped back to
//                             1.5, never carried into the next binade, so
//                             [1.75, 2) gives 1.5 and [3.5, 4) gives 3
//     q  = (sign(t) * 2^e) * mq                       sign(0) = 0
//   dequant = s * q (exact)
// NaN anywhere in a block makes the whole block NaN. Inf: MX gives s = 2^127
// and the Inf element Inf (6 * 2^127), NVFP4 gives s = 448 and the Inf element
// +-2688.
//
// log2 is evaluated as float32(log2(double(v))): what fp4-trainkit's CPU path
// (torch's CPU log2) gives on every input of the oracle test
// (tests/cli/test_fp4tk.py). Its CUDA path (CUDA's log2f, not correctly
// rounded) moves some ceil scales just above powers of two one step up, and
// PyTorch's CUDA division by a Python scalar multiplies by the reciprocal:
// fp4lab emulates the CPU path.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/bits.hpp"
#include "core/hd.hpp"

namespace fp4lab {

// torch.finfo(torch.float32).eps, fp4-trainkit's floor before every log2.
inline constexpr float fp4tk_eps = 1.1920928955078125e-07f;  // 2^-23

// float32 log2 of v > 0 (correctly rounded but for the double rounding, which
// no float32 input reaches).
FP4LAB_HD inline float fp4tk_log2(float v) { return static_cast<float>(::log2(static_cast<double>(v))); }

// The MX scale exponent rules (the clamp to [-127, 127] included); NaN amax
// gives NaN. `v` is the rule's argument before the eps clamp.
enum class Fp4tkMxRule : uint8_t { ocp, ceil, tetrajet };
FP4LAB_HD inline float fp4tk_mx_scale(float amax, Fp4tkMxRule rule) {
  float v;
  switch (rule) {
    case Fp4tkMxRule::ocp:
      v = amax / 4.0f;
      break;
    case Fp4tkMxRule::ceil:
      v = amax / 6.0f;
      break;
    default:
      v = (amax * 2.0f) / 12.0f;
      break;
  }
  if (v != v) return quiet_nan_f();
  v = v < fp4tk_eps ? fp4tk_eps : v;
  const float l = fp4tk_log2(v);
  float e = rule == Fp4tkMxRule::ocp ? ::floorf(l) : ::ceilf(l);
  e = e < -127.0f ? -127.0f : (e > 127.0f ? 127.0f : e);
  return pow2f(static_cast<int>(e));
}

// The NVFP4 block scale before its E4M3 cast: clamp(amax / 6, 2^-9, 448)
// (NaN stays NaN; the cast is core's encode_rn_f32<float8_e4m3fn>, RNE).
FP4LAB_HD inline float fp4tk_nv_scale_f(float amax) {
  float s = amax / 6.0f;
  if (s != s) return s;
  s = s < 0.001953125f ? 0.001953125f : s;  // 2^-9
  return s > 448.0f ? 448.0f : s;
}

// The element rounding of t = x / s: the E2M1 value q (in units of the
// scale). `noise` is u - 0.5 for stochastic rounding (sr true), ignored for
// round to nearest.
FP4LAB_HD inline float fp4tk_e2m1(float t, bool sr, float noise) {
  if (t != t) return t;
  const float sign = t > 0.0f ? 1.0f : (t < 0.0f ? -1.0f : 0.0f);
  float a = ::fabsf(t);
  a = a < fp4tk_eps ? fp4tk_eps : a;
  float e = ::floorf(fp4tk_log2(a));
  e = e < 0.0f ? 0.0f : (e > 2.0f ? 2.0f : e);
  const float p = e == 0.0f ? 1.0f : (e == 1.0f ? 2.0f : 4.0f);
  float m = a / p;
  if (sr) m = m + noise;
  float mq = ::rintf(m * 2.0f) / 2.0f;
  mq = mq < 0.0f ? 0.0f : (mq > 1.5f ? 1.5f : mq);
  return (sign * p) * mq;
}

// torch.rand's float32 in [0, 1) from 24 random bits (the top 24 of a word),
// minus 0.5: fp4-trainkit's noise, equal in distribution.
FP4LAB_HD inline float fp4tk_noise(uint32_t word) {
  return static_cast<float>(word >> 8) * 5.9604644775390625e-08f - 0.5f;  // * 2^-24
}

// fp4tk_e2m1 (the element rounding of t = x / s) with the same bits for
// every t and noise, but no libm log2 (which was 82% of an fp4tk recipe's
// training step) and every comparison on integer bit patterns (GCC does not
// if-convert float comparisons under -ftrapping-math), so the CPU rows' loop (schemes/fp4tk/cpu_rows.cpp)
// vectorises:
// - the binade floor(fl32(log2(a))) clamped to [0, 2] depends only on a >= 2
//   and a >= 4: fl32(log2(a)) never rounds up to 1 (or 2) for a below 2 (or 4),
//   since log2(2 - 2^-22) and log2(4 - 2^-21) lie more than half a float32 ulp
//   below 1 and 2; on |t|'s bits (non-negative floats order as their bits);
// - m = a / p is the exact product a * (1 / p) (p a power of two, a >= p);
// - rint (half to even) of v = 2 m is (|v| + 2^23) - 2^23 with v's sign put
//   back (rint(-0.3) is -0, which the clamp keeps, as core's does); exact for
//   |v| < 2^22, and v >= -1; a larger v gives a value >= 3, clamped to 1.5 as
//   rint(v) is;
// - the clamp of mq = r / 2 to [0, 1.5] on its bits: a negative non-zero mq
//   (bits above 0x80000000) becomes +0, a positive one above 1.5 becomes 1.5.
// schemes/fp4tk/test_fp4tk_bits.cpp compares it against fp4tk_e2m1 over every
// float32 t (round to nearest) and many (t, noise) pairs.
// c ? a : b on bit patterns, by a mask: no branch for the compiler to thread
// (a branch around float operations keeps GCC from vectorising the loop).
inline uint32_t fp4tk_select(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - uint32_t(c);
  return (a & m) | (b & ~m);
}

inline float fp4tk_e2m1_fast(float t, bool sr, float noise) {
  const uint32_t tb = float_bits(t), ub = tb & 0x7FFFFFFFu;
  const float sign = bits_float(fp4tk_select(ub == 0, 0u, (tb & 0x80000000u) | 0x3F800000u));  // sign(0) = 0
  const uint32_t eps_bits = float_bits(fp4tk_eps);
  const float a = bits_float(fp4tk_select(ub < eps_bits, eps_bits, ub));
  const uint32_t k = uint32_t(ub >= 0x40800000u) + uint32_t(ub >= 0x40000000u);  // a >= 4, a >= 2
  const float p = bits_float(0x3F800000u + (k << 23)), inv_p = bits_float(0x3F800000u - (k << 23));
  float m = a * inv_p;
  if (sr) m = m + noise;
  const float v = m * 2.0f;
  const float r = std::copysign((std::fabs(v) + 8388608.0f) - 8388608.0f, v);  // rint(v), 2^23
  uint32_t mq = float_bits(r / 2.0f);
  mq = fp4tk_select(mq > 0x80000000u, 0u, mq);                                // mq < 0 -> +0 (-0 stays)
  mq = fp4tk_select(mq < 0x80000000u && mq > 0x3FC00000u, 0x3FC00000u, mq);  // mq > 1.5 -> 1.5
  const float q = (sign * p) * bits_float(mq);
  return bits_float(fp4tk_select(ub > 0x7F800000u, tb, float_bits(q)));  // NaN as it came
}

}  // namespace fp4lab
