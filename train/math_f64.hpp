// exp and log in float64 for the MoE router's softmax and log-sum-exp
// (train/moe.cpp route()), one implementation for the host and the GPU
// (FP4LAB_HD), so that routing on the device can give the host's bits
// (docs/log/2026-12-01-grouped-linear-plan.md, step 6): glibc's exp and log
// cannot be reproduced on the GPU, and CUDA's cannot be run on the host.
//
// Semantics: exp_f64(x) within 2 ulp of exp(x) where that is a normal double
// (x in [-708.39, 709.78]), within 2 of the subnormal spacing below; 0 for x
// <= -746, +Inf for x >= 709.79 and +Inf, 1 for +-0, NaN -> NaN. log_f64(x)
// within 2 ulp of log(x) for every positive double (subnormals included);
// -Inf for +-0, NaN for x < 0 and NaN, +Inf for +Inf. tests/train/test_math_f64.cpp
// checks dense samples against long double expl / logl.
// Method (the classic fdlibm reductions): exp: x = n ln2 + r, |r| <= ln2/2
// (Cody-Waite, ln2 in two parts), exp(r) = 1 - ((r c)/(c - 2) - r) with c = r
// - r^2 P(r^2) (a degree-5 Remez fit), times 2^n as two exact factors. log: x =
// 2^k m with m in [sqrt(1/2), sqrt(2)), f = m - 1, s = f / (2 + f), log(m) = f
// - (f^2/2 - s (f^2/2 + R(s^2))) (a degree-7 fit), plus k ln2 in two parts.
// Plain double operations in a fixed order, no FMA contraction (fp4lab
// builds without it): the same bits on every build and device.
#pragma once

#include <cstdint>

#include "core/bits.hpp"
#include "core/hd.hpp"

namespace fp4lab::train {

namespace math_f64_detail {
inline constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 0x3FE62E42FEE00000: n * kLn2Hi exact, |n| < 2^11
inline constexpr double kLn2Lo = 1.90821492927058770002e-10;
FP4LAB_HD constexpr double pow2_f64(int64_t k) {  // 2^k for k in [-1022, 1023]
  return bits_double(uint64_t(k + 1023) << 52);
}
}  // namespace math_f64_detail

FP4LAB_HD inline double exp_f64(double x) {
  using namespace math_f64_detail;
  if (x != x) return x;
  if (x >= 709.79) return bits_double(0x7FF0000000000000ull);
  if (x <= -746.0) return 0.0;
  // n = rint(x / ln2) by the 1.5 * 2^52 trick; its integer value from the bit patterns.
  constexpr double kRound = 6755399441055744.0;
  const double shifted = x * 1.44269504088896338700e+00 + kRound;
  const double n = shifted - kRound;
  const int64_t ni = int64_t(double_bits(shifted)) - int64_t(double_bits(kRound));
  const double r = (x - n * kLn2Hi) - n * kLn2Lo;
  const double t = r * r;
  const double c =
      r - t * (1.66666666666666019037e-01 +
               t * (-2.77777777770155933842e-03 +
                    t * (6.61375632143793436117e-05 + t * (-1.65339022054652515390e-06 + t * 4.13813679705723846039e-08))));
  const double e = 1.0 - ((r * c) / (c - 2.0) - r);
  // 2^n as 2^a 2^b, a = floor(n / 2), b = n - a: both normal for n in [-1077, 1024].
  const int64_t a = ni >> 1, b = ni - a;
  return (e * pow2_f64(a)) * pow2_f64(b);
}

FP4LAB_HD inline double log_f64(double x) {
  using namespace math_f64_detail;
  if (x != x) return x;
  if (x < 0.0) return bits_double(0x7FF8000000000000ull);
  if (x == 0.0) return -bits_double(0x7FF0000000000000ull);
  if (x == bits_double(0x7FF0000000000000ull)) return x;
  uint64_t u = double_bits(x);
  int64_t k = 0;
  if (u < 0x0010000000000000ull) {  // subnormal: scale by 2^54 first
    u = double_bits(x * 18014398509481984.0);
    k = -54;
  }
  k += int64_t(u >> 52) - 1023;
  double m = bits_double((u & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);  // [1, 2)
  if (m > 1.41421356237309504880) m *= 0.5, k += 1;                            // [sqrt(1/2), sqrt(2))
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  const double R =
      z * (6.666666666666735130e-01 +
           z * (3.999999999940941908e-01 +
                z * (2.857142874366239149e-01 +
                     z * (2.222219843214978396e-01 +
                          z * (1.818357216161805012e-01 + z * (1.531383769920937332e-01 + z * 1.479819860511658591e-01))))));
  const double hfsq = 0.5 * f * f;
  const double lm = f - (hfsq - s * (hfsq + R));
  const double dk = double(k);
  return dk * kLn2Hi + (lm + dk * kLn2Lo);
}

}  // namespace fp4lab::train
