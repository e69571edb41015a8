// GELU's scalar math, one implementation for both backends (the CPU's loops
// and the CUDA kernels, FP4LAB_HD): erf_f32, exp_f32 and the exact-erf GELU
// and its derivative built from them. Plain float multiplies and adds in a
// fixed order and bit blends, no libm, no FMA contraction (fp4lab builds
// without it: GCC's default for ISO C++ on x86-64, nvcc --fmad=false), no
// denormal flushing: the same bits on the CPU and the GPU.
//
// erf for float32 in the trainer's GELU, written so that loops over it
// vectorise (glibc's erff is a scalar call, ~20 ns per element, and was 5-6%
// of a CPU training step).
//
// Semantics: erf_f32(x) is within 3 ulp of the correctly rounded erf(x) for
// every float (tests/train/test_erf.cpp checks a dense sample of [-6, 6] and
// the specials against double-precision std::erf); erf(+-0) = +-0,
// erf(+-Inf) = +-1, NaN -> NaN. It is odd by construction.
// Method: on |x| < 1, x * P(x^2) (degree 6); on 1 <= |x| < 2.5 and 2.5 <=
// |x| <= 4, 1 - Q(|x| - c) with Q a degree-10 fit of erfc around c = 1.75 /
// 3.25 (|x| is clamped to 4, where 1 - erfc rounds to 1). Coefficients:
// Chebyshev fits (mpmath.chebyfit, 50 digits) rounded to float. All branches
// are computed and then selected, so there is no control flow.
//
// exp for float32 in the trainer's element-wise loops (GELU's derivative),
// written so that loops over it vectorise: glibc's expf is a scalar call, and
// in GELU backward it was 5-6% of a CPU training step (docs/results/cpu_trainer.md).
//
// Semantics: exp_f32(x) is within 2 ulp of the correctly rounded exp(x) where
// that is a normal float (x in [-87.33, 88.72]); results in the subnormal
// range are within 2 of its spacing (2^-149); exp_f32(x) = 0 for x <= -104,
// +Inf for x >= 88.73 and x = +Inf, 1 for x = +-0, NaN -> NaN.
// tests/train/test_exp.cpp checks a dense sample against double exp.
// Method (Cephes' expf): x = n ln2 + r with n = rint(x / ln2) and |r| <=
// ln2/2 (Cody-Waite: ln2 in two parts, n ln2_hi exact), exp(r) by a degree-7
// polynomial, then the product with 2^n as two exact factors 2^(n/2)
// 2^(n - n/2), so that subnormal and overflowing results come out of one
// multiply each; no control flow.
#pragma once

#include <cstdint>

#include "core/bits.hpp"
#include "core/hd.hpp"

namespace fp4lab::train {

// c ? a : b as a bit blend. A `?:` on floats keeps a branch under GCC's
// default trapping-math, and the loop then does not vectorise.
FP4LAB_HD inline float select_f32(bool c, float a, float b) {
  const uint32_t m = 0u - uint32_t(c);
  return bits_float((float_bits(a) & m) | (float_bits(b) & ~m));
}

FP4LAB_HD inline float erf_f32(float x) {
  const float a = bits_float(float_bits(x) & 0x7FFFFFFFu);
  // |x| < 1: x * P(x^2), Horner from the highest degree.
  const float t = a * a;
  float p = 7.875875063e-05f;
  p = p * t + -8.016864287e-04f;
  p = p * t + 5.189087423e-03f;
  p = p * t + -2.685421201e-02f;
  p = p * t + 1.128359472e-01f;
  p = p * t + -3.761262667e-01f;
  p = p * t + 1.128379166e+00f;
  const float small = a * p;
  // 1 <= |x|: 1 - erfc(|x|), erfc from one of two fits around 1.75 (mid) and
  // 3.25 (large), selected per coefficient (Horner from the highest degree).
  // NaN compares false everywhere and is restored at the end.
  const bool large = a >= 2.5f;
  const float s = select_f32(a < 4.0f, a, 4.0f) - select_f32(large, 3.25f, 1.75f);
  float q = select_f32(large, -5.902226831e-07f, 3.437174245e-04f);
  q = q * s + select_f32(large, -2.073181804e-05f, -8.625054198e-04f);
  q = q * s + select_f32(large, 8.328211245e-05f, -6.756556648e-04f);
  q = q * s + select_f32(large, -1.730348395e-04f, 6.037038378e-03f);
  q = q * s + select_f32(large, 2.631272808e-04f, -8.976282550e-03f);
  q = q * s + select_f32(large, -3.130341510e-04f, -6.618595346e-03f);
  q = q * s + select_f32(large, 2.866095845e-04f, 4.810353205e-02f);
  q = q * s + select_f32(large, -1.958870516e-04f, -9.015788450e-02f);
  q = q * s + select_f32(large, 9.486320117e-05f, 9.235620577e-02f);
  q = q * s + select_f32(large, -2.918684269e-05f, -5.277497884e-02f);
  q = q * s + select_f32(large, 4.302779464e-06f, 1.332832878e-02f);
  const float r = select_f32(a < 1.0f, small, 1.0f - q);
  const float signed_r = bits_float(float_bits(r) | (float_bits(x) & 0x80000000u));
  return select_f32(x != x, x, signed_r);
}

FP4LAB_HD inline float exp_f32(float x) {
  // Clamp to [-104, 88.75]: exp(-104) < 2^-150 rounds to 0, exp(88.75) > FLT_MAX
  // overflows to Inf in the final multiply. NaN compares false and stays NaN.
  const float xc = select_f32(x < -104.0f, -104.0f, select_f32(x > 88.75f, 88.75f, x));
  // n = rint(x / ln2) by the 1.5 * 2^23 trick (|x / ln2| < 2^22); its integer
  // value is the difference of the bit patterns (no float -> int conversion,
  // which NaN would make undefined).
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const float shifted = xc * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const int32_t ni = int32_t(float_bits(shifted)) - int32_t(float_bits(kRound));
  // r = x - n ln2, ln2 = 0.693359375 - 2.12194440e-4 (the first part has 9
  // significant bits, so n * it is exact for |n| < 2^15).
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  // exp(r) = 1 + r + r^2 P(r) on |r| <= ln2/2 (Cephes' coefficients).
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = (p * (r * r) + r) + 1.0f;
  // 2^n as 2^a 2^b, a = floor(n / 2), b = n - a: both in [-75, 64], normal.
  const int32_t a = ni >> 1, b = ni - a;
  const float result = (e * bits_float(uint32_t(a + 127) << 23)) * bits_float(uint32_t(b + 127) << 23);
  return select_f32(x != x, x, result);
}

// GELU, exact erf form (PyTorch nn.GELU()): y = x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2.
FP4LAB_HD inline float gelu_value(float v) { return 0.5f * v * (1.0f + erf_f32(v * 0.70710678118654752f)); }
// dy GELU'(x) = dy (Phi(x) + x phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
FP4LAB_HD inline float gelu_grad(float v, float dy) {
  const float cdf = 0.5f * (1.0f + erf_f32(v * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * exp_f32(-0.5f * v * v);
  return dy * (cdf + v * pdf);
}

}  // namespace fp4lab::train
