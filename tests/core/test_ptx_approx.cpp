// core/ptx_approx.hpp's host model of rcp.approx.ftz.f32, on the CPU: what can be checked without the GPU.
// The model's table is the GPU's measurement (scripts/ptx_approx_probe.cu; the GPU compared the model with the
// instruction on all 2^32 inputs, tests/data/ptx_approx_sm90.json, and test_cuda repeats that on samples), so
// here: the table is the one measured (its histogram of corrections), every result of the binade lies within
// one ulp of the exact 1/x (the PTX ISA's bound, against float64), the exponent rule and the special classes
// as the PTX ISA states them for .ftz.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>
#include <string>

#include "core/bits.hpp"
#include "core/ptx_approx.hpp"

using namespace fp4lab;

TEST_CASE("rcp.approx.ftz model: the measured table, within one ulp of 1/x, exponent rule, special classes") {
  int64_t hist[3] = {0, 0, 0};  // -1, 0, +1 ulp from the correctly rounded 1/x
  int64_t beyond = 0;
  for (uint32_t m = 0; m < (1u << 23); ++m) {
    const float x = bits_float(0x3F800000u | m);
    const float r = rcp_approx_ftz(x);
    const int64_t d = int64_t(float_bits(r)) - int64_t(float_bits(float(1.0 / double(x))));
    if (d < -1 || d > 1) {
      ++beyond;
      continue;
    }
    ++hist[d + 1];
    // Within one ulp of the exact reciprocal: r is one of the two floats around 1/x (or 1/x itself).
    const double exact = 1.0 / double(x), ulp = std::ldexp(1.0, std::ilogb(r) - 23);
    if (std::fabs(double(r) - exact) >= ulp) ++beyond;
  }
  CHECK(beyond == 0);
  const char* env = std::getenv("FP4LAB_TEST_DATA");  // tests/data (ctest sets it; else the build's path)
  const std::string dir = env ? env : FP4LAB_TEST_DATA_DIR;
  std::ifstream f(dir + "/ptx_approx_sm90.json");
  REQUIRE(f.good());
  const nlohmann::json probe = nlohmann::json::parse(f);
  CHECK(probe["rcp_all_inputs_vs_table_model"]["mismatches"] == 0);
  CHECK(probe["div_full_vs_model"]["mismatches"] == 0);  // the probe's 2^30 pairs, div.full.f32 against div_full
  const auto& h = probe["rcp_binade_delta_histogram"];
  CHECK(hist[0] == h["-1"].get<int64_t>());
  CHECK(hist[1] == h["0"].get<int64_t>());
  CHECK(hist[2] == h["1"].get<int64_t>());
  MESSAGE("corrections: -1 ulp " << hist[0] << ", 0 " << hist[1] << ", +1 ulp " << hist[2]);

  for (int e = -126; e <= 125; e += 7) {  // rcp(2^e m) = 2^-e rcp(m) where the result is normal
    const float m = 1.3712f;
    CHECK(float_bits(rcp_approx_ftz(std::ldexp(m, e))) == float_bits(std::ldexp(rcp_approx_ftz(m), -e)));
    CHECK(float_bits(rcp_approx_ftz(-std::ldexp(m, e))) == float_bits(-std::ldexp(rcp_approx_ftz(m), -e)));
  }
  CHECK(float_bits(rcp_approx_ftz(0.0f)) == 0x7F800000u);
  CHECK(float_bits(rcp_approx_ftz(-0.0f)) == 0xFF800000u);
  CHECK(float_bits(rcp_approx_ftz(bits_float(0x00400000u))) == 0x7F800000u);  // subnormal: flushed to +0 first
  CHECK(float_bits(rcp_approx_ftz(bits_float(0x80000001u))) == 0xFF800000u);
  CHECK(float_bits(rcp_approx_ftz(INFINITY)) == 0u);
  CHECK(float_bits(rcp_approx_ftz(-INFINITY)) == 0x80000000u);
  CHECK(std::isnan(rcp_approx_ftz(NAN)));
  CHECK(float_bits(rcp_approx_ftz(0x1.8p126f)) == 0u);          // 1/x below 2^-126: flushed
  CHECK(float_bits(rcp_approx_ftz(0x1p126f)) == 0x00800000u);   // exactly 2^-126: normal
  CHECK(float_bits(rcp_approx_ftz(0x1p127f)) == 0u);            // 2^-127 is subnormal: flushed
  CHECK(float_bits(rcp_approx_ftz(0x1p-126f)) == 0x7E800000u);  // 2^126
  CHECK(float_bits(rcp_approx_ftz(2.0f)) == 0x3F000000u);       // powers of two are exact
}

TEST_CASE("div.approx.ftz and div.full models: the PTX ISA's bounds and special cases") {
  std::mt19937 g(41);
  int64_t beyond = 0;
  for (int k = 0; k < 200000; ++k) {
    const float a = bits_float((g() & 0x807FFFFFu) | ((90u + g() % 76u) << 23));
    const float b = bits_float((g() & 0x807FFFFFu) | ((90u + g() % 76u) << 23));
    const double exact = double(a) / double(b);
    const double ulp = std::ldexp(1.0, std::ilogb(float(exact)) - 23);
    // Both are a * rcp(b) here: rcp's error (at most one ulp of rcp(b)) grows with a's mantissa, plus the
    // product's half ulp: up to about 2.03 ulp of the quotient (the PTX ISA states 2 for div.full; the H200
    // computes a * rcp(b), tests/data/ptx_approx_sm90.json).
    beyond += std::fabs(double(div_full(a, b)) - exact) > 2.5 * ulp;
    beyond += std::fabs(double(div_approx_ftz(a, b)) - exact) > 2.5 * ulp;
  }
  CHECK(beyond == 0);
  // div.full scales a tiny divisor up and a huge one down, so both stay finite where a / b is.
  CHECK(div_full(1e-30f, bits_float(0x00012345u)) > 0.0f);
  CHECK(std::isfinite(div_full(1e-30f, bits_float(0x00012345u))));
  CHECK(div_full(3e38f, 2e38f) > 1.4f);
  CHECK(std::isinf(div_full(1.0f, 0.0f)));
  CHECK(std::isnan(div_full(0.0f, 0.0f)));
  // div.approx.ftz flushes: a subnormal numerator is zero, a divisor above 2^126 gives zero.
  CHECK(float_bits(div_approx_ftz(bits_float(0x00000123u), 1.0f)) == 0u);
  CHECK(float_bits(div_approx_ftz(1.0f, 0x1.8p126f)) == 0u);
}
