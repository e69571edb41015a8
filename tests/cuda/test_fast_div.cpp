// FastDivU31 (cuda/fast_div.hpp) against the integer division: host only, runs without a GPU.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>

#include "cuda/fast_div.hpp"

using fp4lab::cuda::FastDivU31;

TEST_CASE("fast_div: floor(n / d) for every divisor shape and the dividends that stress it" *
          doctest::test_suite("host")) {
  std::mt19937_64 rng(7);
  auto check = [&](uint32_t d) {
    const FastDivU31 f = FastDivU31::of(d);
    constexpr uint32_t top = 0x7FFFFFFFu;  // largest dividend
    const uint32_t fixed[] = {0u, 1u, d - 1, d, d + 1, top, top - 1, top - (top % d), top - (top % d) - 1};
    for (uint32_t n : fixed) {
      if (n > top) continue;
      REQUIRE_MESSAGE(f.div(n) == n / d, "d=" << d << " n=" << n);
    }
    // Around every multiple of d near the top, and random dividends.
    for (int k = 0; k < 64; ++k) {
      const uint64_t q = top / d - uint64_t(k);
      for (int64_t e = -1; e <= 1; ++e) {
        const int64_t n = int64_t(q * d) + e;
        if (n < 0 || n > int64_t(top)) continue;
        REQUIRE_MESSAGE(f.div(uint32_t(n)) == uint32_t(n) / d, "d=" << d << " n=" << n);
      }
    }
    for (int k = 0; k < 256; ++k) {
      const uint32_t n = uint32_t(rng()) & top;
      REQUIRE_MESSAGE(f.div(n) == n / d, "d=" << d << " n=" << n);
    }
  };
  for (uint32_t d = 1; d <= 4096; ++d) check(d);
  for (int l = 12; l <= 31; ++l)
    for (int64_t e = -3; e <= 3; ++e) {
      const int64_t d = (int64_t(1) << l) + e;
      if (d >= 1 && d <= (int64_t(1) << 31)) check(uint32_t(d));
    }
  for (int k = 0; k < 2000; ++k) check(uint32_t(rng() % 0x80000000u) + 1);
}
