// fp4tk_e2m1_fast (schemes/fp4tk/scalar.hpp: integer comparisons and a 2^23 rint, no
// libm) against core's fp4tk_e2m1 (libm log2, the formula checked against
// fp4-trainkit's own code by tests/cli/test_fp4tk.py) as the oracle: the same
// float32 bits, sign of zero and NaN payload included.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/bits.hpp"
#include "schemes/fp4tk/scalar.hpp"

using namespace fp4lab;

namespace {

// Number of bit patterns t in [lo, hi) (stepping by `step`) where the two
// functions differ for the given noise; the first difference in *first_bad.
int64_t count_mismatches(uint64_t lo, uint64_t hi, uint64_t step, bool sr, float noise, uint32_t* first_bad) {
  int64_t bad = 0;
  for (uint64_t u = lo; u < hi; u += step) {
    const float t = bits_float(uint32_t(u));
    if (float_bits(fp4tk_e2m1_fast(t, sr, noise)) != float_bits(fp4tk_e2m1(t, sr, noise))) {
      if (bad == 0) *first_bad = uint32_t(u);
      ++bad;
    }
  }
  return bad;
}

// Mismatches over every significand near the ends of a binade and every 97th
// in between, for each of the 512 sign/exponent fields (zeros, subnormals,
// Inf and NaN included): ~45M patterns.
int64_t dense_mismatches(uint32_t* first_bad) {
  int64_t bad = 0;
  for (uint32_t se = 0; se < 512; ++se) {
    const uint64_t base = uint64_t(se) << 23, top = base + (1u << 23);
    bad += count_mismatches(base, base + 256, 1, false, 0.0f, first_bad);
    bad += count_mismatches(base + 256, top - 256, 97, false, 0.0f, first_bad);
    bad += count_mismatches(top - 256, top, 1, false, 0.0f, first_bad);
  }
  return bad;
}

}  // namespace

TEST_CASE("fp4tk_e2m1_fast = fp4tk_e2m1, round to nearest: ~45M patterns over all exponents and both signs") {
  uint32_t first = 0;
  const int64_t bad = dense_mismatches(&first);
  CAPTURE(first);
  CHECK(bad == 0);
}

TEST_CASE("fp4tk_e2m1_fast = fp4tk_e2m1, round to nearest: the binade and rounding boundaries exactly") {
  // Every pattern within 4096 ulps of each boundary of E2M1's grid in units of the scale (the binade edges 1,
  // 2, 4, the rounding midpoints, the clamp at 6, the eps floor 2^-23), both signs.
  const float edges[] = {fp4tk_eps, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.75f, 2.0f, 2.5f,
                         3.5f,      4.0f,  5.0f, 6.0f,  7.0f, 8.0f,  12.0f, 16.0f};
  for (const float e : edges) {
    for (const uint32_t sign : {0u, 0x80000000u}) {
      uint32_t first = 0;
      const uint64_t b = float_bits(e) | sign;
      CAPTURE(e);
      CHECK(count_mismatches(b - 4096, b + 4096, 1, false, 0.0f, &first) == 0);
    }
  }
}

TEST_CASE("fp4tk_e2m1_fast = fp4tk_e2m1, stochastic rounding: boundary noises on dense t, random (t, word) pairs") {
  // Noise u - 0.5 at its ends, at 0 and near the half steps, on every 251st t pattern of [2^-27, 16] (both
  // signs; below, t is under the eps floor), then 4M random pairs with t from every exponent or near 1.
  const uint32_t words[] = {0x00000000u, 0x00000100u, 0x3FFFFF00u, 0x40000000u, 0x7FFFFF00u, 0x80000000u,
                            0x80000100u, 0xBFFFFF00u, 0xC0000000u, 0xFFFFFF00u, 0x12345600u, 0xDEADBE00u};
  for (const uint32_t w : words) {
    for (const uint64_t sign : {0ull, 0x80000000ull}) {
      uint32_t first = 0;
      CAPTURE(w);
      const uint64_t lo = sign | float_bits(pow2f(-27)), hi = sign | (float_bits(16.0f) + 1);
      CHECK(count_mismatches(lo, hi, 251, true, fp4tk_noise(w), &first) == 0);
    }
  }
  std::mt19937 rng(32);
  int64_t bad = 0;
  for (int i = 0; i < (1 << 22); ++i) {
    const uint32_t u = rng(), w = rng();
    const float t = i % 2 ? bits_float(u) : bits_float((u & 0x807FFFFFu) | ((110 + u % 24) << 23));
    bad += float_bits(fp4tk_e2m1_fast(t, true, fp4tk_noise(w))) != float_bits(fp4tk_e2m1(t, true, fp4tk_noise(w)));
  }
  CHECK(bad == 0);
}

// Every float32 pattern (about a minute with 2 threads: libm's log2 in the
// oracle); run with `test_sim --no-skip -tc="*exhaustive*"`.
TEST_CASE("fp4tk_e2m1_fast = fp4tk_e2m1, round to nearest: exhaustive over all 2^32 patterns" * doctest::skip()) {
  int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
  for (int64_t hi = 0; hi < (int64_t(1) << 16); ++hi) {
    uint32_t first = 0;
    bad += count_mismatches(uint64_t(hi) << 16, uint64_t(hi + 1) << 16, 1, false, 0.0f, &first);
  }
  CHECK(bad == 0);
}
