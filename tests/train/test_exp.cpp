// exp_f32 (train/gelu_math.hpp) against double-precision std::exp (glibc's exp
// is accurate to < 1 ulp in double, far below a float ulp).
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "train/gelu_math.hpp"
#include "core/bits.hpp"

using fp4lab::bits_float;
using fp4lab::train::exp_f32;

namespace {
// |exp_f32(x) - exp(x)| in units of the spacing of floats at exp(x) (2^-149
// in the subnormal range).
double ulp_error(float x) {
  const double ref = std::exp(double(x));
  const float rf = float(ref);
  double ulp = std::fabs(double(std::nextafter(rf, INFINITY)) - double(rf));
  if (rf < FLT_MIN) ulp = 0x1p-149;
  return std::fabs(double(exp_f32(x)) - ref) / ulp;
}
}  // namespace

TEST_CASE("exp_f32: within 2 ulp of exp on a dense sample of [-104, 88.7]") {
  double worst = 0;
  float worst_x = 0;
  auto visit = [&](float x) {
    const double u = ulp_error(x);
    if (!(u <= worst)) worst = u, worst_x = x;
  };
  // Every 61st float of [0, 88.7] and of [-104, 0] (subnormal inputs included).
  for (uint32_t b = 0; b <= fp4lab::float_bits(88.7f); b += 61) visit(bits_float(b));
  for (uint32_t b = 0; b <= fp4lab::float_bits(104.0f); b += 61) visit(-bits_float(b));
  MESSAGE("largest error " << worst << " ulp at x = " << worst_x);
  CHECK(worst <= 2.0);
}

TEST_CASE("exp_f32: specials, underflow, overflow") {
  CHECK(exp_f32(0.0f) == 1.0f);
  CHECK(exp_f32(-0.0f) == 1.0f);
  CHECK(exp_f32(INFINITY) == INFINITY);
  CHECK(exp_f32(89.0f) == INFINITY);
  CHECK(exp_f32(1e30f) == INFINITY);
  CHECK(exp_f32(-INFINITY) == 0.0f);
  CHECK(exp_f32(-104.0f) == 0.0f);
  CHECK(exp_f32(-1e30f) == 0.0f);
  CHECK(std::isnan(exp_f32(NAN)));
  CHECK(std::isnan(exp_f32(-NAN)));
  CHECK(exp_f32(88.72f) == doctest::Approx(std::exp(double(88.72f))).epsilon(1e-6));  // largest finite results
  CHECK(exp_f32(-100.0f) > 0.0f);                                            // subnormal, not flushed
  CHECK(exp_f32(1.0f) == doctest::Approx(2.718281828459045).epsilon(1e-7));
}
