// Parameter store (train/params.cpp): layout, names, reproducible init with the right statistics.
#include <doctest/doctest.h>

#include <cmath>

#include "train/params.hpp"
#include "core/error.hpp"

using namespace fp4lab::train;

TEST_CASE("flat buffer with named views; init statistics") {
  auto be = make_cpu_backend(1);
  ParamStore ps;
  const int a = ps.add("a", 100, 100, true, Init::normal, 0.02f);
  const int b = ps.add("b", 1, 10000, false, Init::uniform, 0.5f);
  const int c = ps.add("c", 50, 200, false, Init::trunc_normal, 1.5f);
  CHECK_THROWS_AS(ps.add("a", 1, 1, false, Init::zeros), fp4lab::Error);
  ps.finalize(*be, 7);
  CHECK(ps.size() == 30000);
  CHECK(ps.info(b).offset == 10000);
  CHECK(ps.index("c") == c);
  CHECK_THROWS_AS(ps.index("d"), fp4lab::Error);
  REQUIRE(ps.decay_ranges.size() == 1);
  CHECK(ps.decay_ranges[0] == IndexRange{0, 10000});
  double s2 = 0, mx = 0, umax = 0;
  for (int64_t i = 0; i < 10000; ++i) s2 += double(ps.value(a).data[i]) * ps.value(a).data[i];
  CHECK(std::sqrt(s2 / 10000) == doctest::Approx(0.02).epsilon(0.05));
  for (int64_t i = 0; i < 10000; ++i) umax = std::max(umax, double(std::abs(ps.value(b).data[i])));
  CHECK(umax <= 0.5);
  CHECK(umax > 0.49);
  for (int64_t i = 0; i < 10000; ++i) mx = std::max(mx, double(std::abs(ps.value(c).data[i])));
  CHECK(mx <= 2.0);  // truncated at +-2 (absolute)
  // Reproducible: the same seed gives the same values.
  ParamStore p2;
  p2.add("a", 100, 100, true, Init::normal, 0.02f);
  p2.finalize(*be, 7);
  CHECK(p2.value(0).data[1234] == ps.value(a).data[1234]);
}
