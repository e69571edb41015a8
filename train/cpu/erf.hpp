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
// are computed and then selected, so there is no control flow. Plain float
// multiplies and adds in a fixed order (no FMA contraction anywhere in
// fp4lab), so the result is the same in every build.
#pragma once

#include <cstdint>

#include "core/bits.hpp"

namespace fp4lab::train {

namespace erf_detail {
// Highest degree first.
inline constexpr float kSmall[7] = {7.875875063e-05f, -8.016864287e-04f, 5.189087423e-03f, -2.685421201e-02f,
                                    1.128359472e-01f, -3.761262667e-01f, 1.128379166e+00f};
inline constexpr float kMid[11] = {3.437174245e-04f,  -8.625054198e-04f, -6.756556648e-04f, 6.037038378e-03f,
                                   -8.976282550e-03f, -6.618595346e-03f, 4.810353205e-02f,  -9.015788450e-02f,
                                   9.235620577e-02f,  -5.277497884e-02f, 1.332832878e-02f};
inline constexpr float kLarge[11] = {-5.902226831e-07f, -2.073181804e-05f, 8.328211245e-05f, -1.730348395e-04f,
                                     2.631272808e-04f,  -3.130341510e-04f, 2.866095845e-04f, -1.958870516e-04f,
                                     9.486320117e-05f,  -2.918684269e-05f, 4.302779464e-06f};
}  // namespace erf_detail

// c ? a : b as a bit blend. A `?:` on floats keeps a branch under GCC's
// default trapping-math, and the loop then does not vectorise.
inline float select_f32(bool c, float a, float b) {
  const uint32_t m = 0u - uint32_t(c);
  return bits_float((float_bits(a) & m) | (float_bits(b) & ~m));
}

inline float erf_f32(float x) {
  using namespace erf_detail;
  const float a = bits_float(float_bits(x) & 0x7FFFFFFFu);
  // |x| < 1: x * P(x^2).
  const float t = a * a;
  float p = kSmall[0];
  for (int k = 1; k < 7; ++k) p = p * t + kSmall[k];
  const float small = a * p;
  // 1 <= |x|: 1 - erfc(|x|), erfc from one of two fits (selected per
  // coefficient). NaN compares false everywhere and is restored at the end.
  const bool large = a >= 2.5f;
  const float s = select_f32(a < 4.0f, a, 4.0f) - select_f32(large, 3.25f, 1.75f);
  float q = select_f32(large, kLarge[0], kMid[0]);
  for (int k = 1; k < 11; ++k) q = q * s + select_f32(large, kLarge[k], kMid[k]);
  const float r = select_f32(a < 1.0f, small, 1.0f - q);
  const float signed_r = bits_float(float_bits(r) | (float_bits(x) & 0x80000000u));
  return select_f32(x != x, x, signed_r);
}

}  // namespace fp4lab::train
