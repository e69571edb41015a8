// erf_f32 (train/gelu_math.hpp) against double-precision std::erf (glibc's
// erf is accurate to < 1 ulp in double, far below a float ulp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "train/gelu_math.hpp"
#include "core/bits.hpp"

using fp4lab::bits_float;
using fp4lab::train::erf_f32;

namespace {
// |erf_f32(x) - erf(x)| in units of the ulp of the float nearest erf(x)
// (below 1 for results that round to 1, the ulp of 1 - 2^-24).
double ulp_error(float x) {
  const double ref = std::erf(double(x));
  const float rf = float(ref);
  double ulp = std::fabs(double(std::nextafter(rf, INFINITY)) - double(rf));
  if (std::fabs(rf) == 1.0f) ulp = 0x1p-24;
  if (rf == 0.0f) ulp = 0x1p-149;
  return std::fabs(double(erf_f32(x)) - ref) / ulp;
}
}  // namespace

TEST_CASE("erf_f32: within 3 ulp of erf on a dense sample of [-6, 6] and on every float near the seams") {
  double worst = 0;
  float worst_x = 0;
  auto visit = [&](uint32_t bits) {
    for (float x : {bits_float(bits), -bits_float(bits)}) {
      const double u = ulp_error(x);
      if (!(u <= worst)) worst = u, worst_x = x;
    }
  };
  for (uint32_t b = 0; b <= 0x40C00000u; b += 97) visit(b);  // every 97th float in [0, 6]: subnormals to 6
  // Every float around the region boundaries 1, 2.5 and 4.
  for (float lo : {0.98f, 2.48f, 3.9f}) {
    const uint32_t b0 = fp4lab::float_bits(lo);
    for (uint32_t b = b0; b < b0 + 400000u; ++b) visit(b);
  }
  MESSAGE("largest error " << worst << " ulp at x = " << worst_x);
  CHECK(worst <= 3.0);
}

TEST_CASE("erf_f32: specials, oddness, saturation") {
  CHECK(erf_f32(0.0f) == 0.0f);
  CHECK(std::signbit(erf_f32(-0.0f)));
  CHECK(erf_f32(INFINITY) == 1.0f);
  CHECK(erf_f32(-INFINITY) == -1.0f);
  CHECK(std::isnan(erf_f32(NAN)));
  CHECK(erf_f32(4.0f) == 1.0f);
  CHECK(erf_f32(1e30f) == 1.0f);
  CHECK(erf_f32(1e-40f) == doctest::Approx(1.1283791670955126 * 1e-40).epsilon(1e-6));  // subnormal slope 2/sqrt(pi)
  for (float x : {0.1f, 0.7f, 1.0f, 1.3f, 2.5f, 3.3f, 5.0f}) CHECK(erf_f32(-x) == -erf_f32(x));
}
