// exp_f64 and log_f64 (train/math_f64.hpp) against long double expl / logl
// (x86's 64-bit significand: an independent reference 11 bits finer than double).
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>

#include "train/math_f64.hpp"

using fp4lab::train::exp_f64;
using fp4lab::train::log_f64;

namespace {

// |got - ref| in units of the spacing of doubles at ref (rounded to double); the
// subnormal spacing where ref is below the normal range.
double ulps(double got, long double ref) {
  const double r = double(ref);
  const double a = std::fabs(r);
  const double spacing = a < DBL_MIN ? std::numeric_limits<double>::denorm_min()
                                     : std::nextafter(a, std::numeric_limits<double>::infinity()) - a;
  return double(std::fabs((long double)got - ref) / (long double)spacing);
}

}  // namespace

TEST_CASE("exp_f64: within 2 ulp of expl on a dense sample of [-745, 709.7], and its specials") {
  double worst = 0, at = 0;
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(-745.0, 709.7), small(-1.0, 1.0);
  for (int i = 0; i < 400000; ++i) {
    const double x = i % 4 == 0 ? small(rng) : u(rng);
    const double e = ulps(exp_f64(x), expl((long double)x));
    if (e > worst) worst = e, at = x;
  }
  MESSAGE("largest error ", worst, " ulp at x = ", at);
  CHECK(worst <= 2.0);
  CHECK(exp_f64(0.0) == 1.0);
  CHECK(exp_f64(-0.0) == 1.0);
  CHECK(exp_f64(-746.0) == 0.0);
  CHECK(exp_f64(-std::numeric_limits<double>::infinity()) == 0.0);
  CHECK(exp_f64(709.79) == std::numeric_limits<double>::infinity());
  CHECK(exp_f64(std::numeric_limits<double>::infinity()) == std::numeric_limits<double>::infinity());
  CHECK(std::isnan(exp_f64(std::nan(""))));
  CHECK(exp_f64(-745.0) > 0.0);  // subnormal, not flushed
  CHECK(ulps(exp_f64(709.78), expl((long double)709.78)) <= 2.0);  // the largest finite results
}

TEST_CASE("log_f64: within 2 ulp of logl on dense samples (near 1, the router's [1, 4096], every binade), and its specials") {
  double worst = 0, at = 0;
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> near1(0.5, 2.0), sums(1.0, 4096.0), expo(-1074.0, 1023.9);
  for (int i = 0; i < 400000; ++i) {
    const double x = i % 3 == 0 ? near1(rng) : i % 3 == 1 ? sums(rng) : std::exp2(expo(rng));
    if (!(x > 0)) continue;
    const double e = ulps(log_f64(x), logl((long double)x));
    if (e > worst) worst = e, at = x;
  }
  MESSAGE("largest error ", worst, " ulp at x = ", at);
  CHECK(worst <= 2.0);
  CHECK(log_f64(1.0) == 0.0);
  CHECK(log_f64(0.0) == -std::numeric_limits<double>::infinity());
  CHECK(log_f64(-0.0) == -std::numeric_limits<double>::infinity());
  CHECK(std::isnan(log_f64(-1.0)));
  CHECK(std::isnan(log_f64(std::nan(""))));
  CHECK(log_f64(std::numeric_limits<double>::infinity()) == std::numeric_limits<double>::infinity());
  CHECK(ulps(log_f64(std::numeric_limits<double>::denorm_min()),
             logl((long double)std::numeric_limits<double>::denorm_min())) <= 2.0);
}
