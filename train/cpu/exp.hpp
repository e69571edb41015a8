// exp for float32 in the trainer's element-wise loops (GELU's derivative),
// written so that loops over it vectorise: glibc's expf is a scalar call, and
// in GELU backward it was 5-6% of a CPU training step (docs/results/cpu_trainer.md).
//
// Semantics: exp_f32(x) is within 2 ulp of the correctly rounded exp(x) where
// that is a normal float (x in [-87.33, 88.72]); results in the subnormal
// range are within 2 of its spacing (2^-149); exp_f32(x) = 0 for x <= -104,
// +Inf for x >= 88.73 and x = +Inf, 1 for x = +-0, NaN -> NaN.
// tests/train/cpu/test_exp.cpp checks a dense sample against double exp.
// Method (Cephes' expf): x = n ln2 + r with n = rint(x / ln2) and |r| <=
// ln2/2 (Cody-Waite: ln2 in two parts, n ln2_hi exact), exp(r) by a degree-7
// polynomial, then the product with 2^n as two exact factors 2^(n/2)
// 2^(n - n/2), so that subnormal and overflowing results come out of one
// multiply each. Plain float multiplies and adds in a fixed order (no FMA
// contraction anywhere in fp4lab), no control flow, no libm: the same bits in
// every build.
#pragma once

#include <cstdint>

#include "core/bits.hpp"
#include "train/cpu/erf.hpp"  // select_f32

namespace fp4lab::train {

inline float exp_f32(float x) {
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

}  // namespace fp4lab::train
