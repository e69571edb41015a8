// The random-bit contracts of stochastic rounding (core/sr.hpp) and encode()'s
// W-bit rule, against a reference built from the decode tables: the two grid
// points around |x|, the residual f = (|x| - lo) / (hi - lo) as an exact
// double, round up iff floor(f * 2^W) + r >= 2^W.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/sr.hpp"

using namespace fp4lab;

namespace {

const Format* const kPtxFormats[] = {&float4_e2m1fn, &float6_e2m3fn, &float6_e3m2fn, &float8_e4m3fn,
                                     &float8_e5m2,   &float16,       &bfloat16};

// The finite non-negative grid of f, ascending (decoded codes).
std::vector<double> grid(const Format& f) {
  std::vector<double> g;
  const uint32_t max_code = f.max_magnitude_code();
  for (uint32_t c = 0; c <= max_code; ++c) {
    const double v = double(decode(f, c));
    if (std::isfinite(v)) g.push_back(v);
  }
  return g;
}

// The code of grid[i]: codes 0 .. max_magnitude_code are the grid in order
// (checked once per format in grid_codes_ascend).
bool grid_codes_ascend(const Format& f, const std::vector<double>& g) {
  for (size_t i = 0; i < g.size(); ++i)
    if (double(decode(f, uint32_t(i))) != g[i]) return false;
  return g.size() == f.max_magnitude_code() + 1u;
}

// Reference SR of a finite x with |x| <= max under a W-bit random value r:
// lo <= |x| < hi the neighbouring grid points; up iff floor(f 2^W) + r >= 2^W.
uint32_t reference_sr(const Format& f, const std::vector<double>& g, float x, uint32_t r, int W) {
  const double a = std::fabs(double(x));
  size_t i = size_t(std::upper_bound(g.begin(), g.end(), a) - g.begin()) - 1;  // g[i] <= a < g[i + 1]
  if (g[i] != a && i + 1 < g.size()) {
    const double frac = (a - g[i]) / (g[i + 1] - g[i]);  // exact: a power-of-two quantum
    const double top = std::floor(std::ldexp(frac, W));
    if (top + double(r) >= std::ldexp(1.0, W)) ++i;
  }
  const uint32_t c = uint32_t(i);
  return (std::signbit(x) && f.is_signed && !(c == 0 && !f.has_negative_zero())) ? (c | f.sign_bit()) : c;
}

}  // namespace

TEST_CASE("sr split: every bit of a word reaches exactly the element the table names") {
  for (const Format* f : kPtxFormats) {
    CAPTURE(f->name);
    const int G = sr_group(SrBits::ptx_x4, *f), W = sr_width(SrBits::ptx_x4, *f);
    CHECK(G == (f == &float16 || f == &bfloat16 ? 2 : 4));
    CHECK(W == (f == &float16 ? 13 : f == &bfloat16 ? 16 : 8));
    int used = 0;
    for (int j = 0; j < 32; ++j) {
      // The element whose bit j is (by the table: 32 / G bits a slot, the low W used).
      const int slot = j / (32 / G), pos = j % (32 / G);
      for (int k = 0; k < G; ++k) {
        const uint32_t r = sr_element_bits(SrBits::ptx_x4, *f, 1u << j, k);
        const uint32_t want = (k == slot && pos < W) ? 1u << pos : 0u;
        CHECK_MESSAGE(r == want, "bit " << j << " element " << k);
        used += r != 0;
      }
    }
    CHECK(used == G * W);  // f16: bits 13-15 and 29-31 unused
  }
  // per_element: the whole word, groups of one.
  CHECK(sr_element_bits(SrBits::per_element, float4_e2m1fn, 0xDEADBEEFu, 0) == 0xDEADBEEFu);
  CHECK(sr_group(SrBits::per_element, float8_e4m3fn) == 1);
  CHECK(sr_words_per_row(SrBits::ptx_x4, float4_e2m1fn, 45) == 12);  // a partial group of one
  CHECK(sr_words_per_row(SrBits::ptx_x4, bfloat16, 45) == 23);
  CHECK(sr_words_per_row(SrBits::per_element, bfloat16, 45) == 45);
}

TEST_CASE("sr_bits names and the formats ptx_x4 serves") {
  CHECK(parse_sr_bits("ptx_x4") == SrBits::ptx_x4);
  CHECK(parse_sr_bits("per_element") == SrBits::per_element);
  CHECK(!parse_sr_bits("ptx").has_value());
  CHECK(std::string(sr_bits_name(SrBits::ptx_x4)) == "ptx_x4");
  for (const Format* f : kPtxFormats) CHECK_NOTHROW(check_sr_bits(SrBits::ptx_x4, *f, "t"));
  CHECK_THROWS_AS(check_sr_bits(SrBits::ptx_x4, int8_mx, "t"), Error);
  CHECK_THROWS_AS(check_sr_bits(SrBits::ptx_x4, float8_e4m3fnuz, "t"), Error);
  CHECK_NOTHROW(check_sr_bits(SrBits::per_element, int8_mx, "t"));
}

TEST_CASE("W-bit SR against the decode-table reference: every random value, residuals around multiples of 2^-W") {
  std::mt19937 rng(5);
  for (const Format* f : kPtxFormats) {
    CAPTURE(f->name);
    const std::vector<double> g = grid(*f);
    REQUIRE(grid_codes_ascend(*f, g));
    const int W = sr_width(SrBits::ptx_x4, *f);
    const uint32_t nr = 1u << W;
    // Cells: the first (subnormal targets), one per binade, the last below max.
    std::vector<size_t> cells = {0, 1, 2, g.size() / 3, g.size() / 2, g.size() - 2};
    std::vector<float> xs;
    for (size_t i : cells) {
      const double lo = g[i], step = g[i + 1] - g[i];
      for (uint32_t m : {0u, 1u, nr / 2 - 1, nr / 2, nr - 1}) {
        const float at = float(lo + step * std::ldexp(double(m), -W));
        xs.push_back(at);
        xs.push_back(std::nextafter(at, 0.0f));         // just below a multiple of 2^-W of a step
        xs.push_back(std::nextafter(at, float(lo + step)));  // just above
      }
      xs.push_back(float(lo + step * 0.3));
    }
    // Residual below 2^-W of a step: never rounds up under W bits.
    xs.push_back(float(g[1] * std::ldexp(1.0, -W - 3)));
    xs.push_back(1e-42f);  // an FP32 subnormal input
    int64_t bad = 0, n = 0;
    for (float x0 : xs)
      for (float x : {x0, -x0}) {
        if (!(std::fabs(double(x)) <= g.back())) continue;
        // Every random value for 8 bits; 4096 of them (edges included) for 13 and 16.
        for (uint32_t k = 0; k < (W == 8 ? nr : 4096u); ++k) {
          const uint32_t r = W == 8 ? k : (k < 4 ? (k < 2 ? k : nr - 5 + k) : uint32_t(rng()) & (nr - 1));
          const uint32_t got = encode(*f, x, Round::rs, Overflow::saturate, r, W);
          const uint32_t want = reference_sr(*f, g, x, r, W);
          ++n;
          if (got != want && bad++ < 5) MESSAGE("x ", x, " r ", r, " got ", got, " want ", want);
        }
      }
    CHECK(bad == 0);
    CHECK(n > 1000);
  }
}

TEST_CASE("W-bit SR: the mean over all 2^W random values is lo + step * floor(2^W f) / 2^W (the predicted bias)") {
  const Format& f = float4_e2m1fn;
  for (double a : {0.0009, 0.001953125, 0.25, 0.3, 1.2, 2.0 + 1.0 / 512, 2.5, 4.7, 5.999}) {
    CAPTURE(a);
    const float x = float(a);
    const double lo = a < 2 ? std::floor(a * 2) / 2 : a < 4 ? std::floor(a) : std::floor(a / 2) * 2;
    const double step = a < 2 ? 0.5 : a < 4 ? 1.0 : 2.0;
    const double frac = (double(x) - lo) / step;
    double sum8 = 0;
    for (uint32_t r = 0; r < 256; ++r)
      sum8 += double(decode(f, encode(f, x, Round::rs, Overflow::saturate, r, 8)));
    const double mean8 = sum8 / 256, predicted = lo + step * std::floor(frac * 256) / 256;
    CHECK(mean8 == predicted);  // exact: sums of grid values over 256
    // 32 bits: unbiased (a fixed-seed sample of 2^16 words; 5 standard errors).
    std::mt19937 rng(uint32_t(a * 1000));
    double sum32 = 0;
    const int n = 1 << 16;
    for (int i = 0; i < n; ++i) sum32 += double(decode(f, encode(f, x, Round::rs, Overflow::saturate, rng())));
    CHECK(std::fabs(sum32 / n - double(x)) <= 5 * step * 0.5 / std::sqrt(double(n)));
    if (frac > 0 && frac < 1.0 / 256) CHECK(mean8 == lo);  // 8 bits: flushed, 32 bits: dithered
    if (frac > 0 && frac < 1.0 / 256) CHECK(sum32 > lo * n);
  }
  // Saturation (.satfinite): beyond the largest finite value, Inf included, every r gives +-max.
  for (uint32_t r = 0; r < 256; ++r) {
    CHECK(encode(f, 7.5f, Round::rs, Overflow::saturate, r, 8) == 0x7u);
    CHECK(encode(f, -INFINITY, Round::rs, Overflow::saturate, r, 8) == 0xFu);
    CHECK(encode(float8_e4m3fn, 470.0f, Round::rs, Overflow::saturate, r, 8) == 0x7Eu);
  }
  // The flush: a residual below 1/256 of a step never rounds up under 8 bits.
  for (uint32_t r = 0; r < 256; ++r) CHECK(encode(f, 0.0009f, Round::rs, Overflow::saturate, r, 8) == 0u);
}

TEST_CASE("e2m1_rs_value_bits<8>: the value of the 8-bit encode, every exponent field, sampled significands") {
  std::mt19937 rng(8);
  int64_t bad = 0, n = 0;
  for (uint32_t e = 0; e < 256; ++e)
    for (uint32_t m = 0; m < (1u << 23); m += 4099)
      for (uint32_t sign : {0u, 0x80000000u}) {
        const uint32_t yb = sign | (e << 23) | m;
        const float y = bits_float(yb);
        if (std::isnan(y)) continue;
        for (uint32_t w : {0u, 0xFFu, 0x80u, uint32_t(rng())}) {
          const uint32_t want =
              float_bits(decode(float4_e2m1fn, encode(float4_e2m1fn, y, Round::rs, Overflow::saturate, w, 8)));
          ++n;
          if (e2m1_rs_value_bits<8>(yb, w) != want && bad++ < 5) MESSAGE("y ", yb, " w ", w);
        }
      }
  CHECK(n > 500000);
  CHECK(bad == 0);
}
