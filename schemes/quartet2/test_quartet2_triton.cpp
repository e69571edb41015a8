// emulate 'quartet2_triton' (schemes/quartet2/triton.hpp) against Quartet II's Triton kernel transliterated: its
// rtn_fp4 as the threshold chain it writes (>= 5 -> 6, >= 3.5 -> 4, ...; sign x > 0 ? 1 : -1), its divisions by
// core/ptx_approx.hpp's div_full, E4M3 by tests/core/ref_format.hpp's brute-force encoder. Quartet II's own
// Triton kernel is the oracle once its GPU run is recorded (tests/cli/test_quartet2_triton.py).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "core/ptx_approx.hpp"
#include "core/ref_format.hpp"
#include "sim/block_rules.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;

namespace {

float rtn_fp4(float x) {  // nvfp4_triton.py's rtn_fp4, as written
  const float a = std::fabs(x), sign = x > 0 ? 1.0f : -1.0f;
  const float q = a >= 5       ? 6
                  : a >= 3.5f  ? 4
                  : a >= 2.5f  ? 3
                  : a >= 1.75f ? 2
                  : a >= 1.25f ? 1.5f
                  : a >= 0.75f ? 1
                  : a >= 0.25f ? 0.5f
                               : 0;
  return q * sign;
}

QuantizerSpec spec() {
  QuantizerSpec q = quantizer_by_name("nvfp4");
  q.emulate = Emulation::quartet2_triton;
  q.round = Round::rna;
  return q;
}

}  // namespace

TEST_CASE("quartet2_triton: dequant, scale codes and scales against the Triton kernel transliterated") {
  std::mt19937 g(61);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t rows = 11, cols = trial % 2 ? 40 : 64;
    std::vector<float> x(static_cast<size_t>(rows * cols));
    float mag = 1;
    for (size_t i = 0; i < x.size(); ++i) {
      if (i % 16 == 0) mag = g() % 9 == 0 ? 0.0f : std::ldexp(1.0f, int(g() % 61) - 30);
      x[i] = nd(g) * mag;
    }
    x[1] = 0.0f;  // a +0 inside a nonzero block: -0 out
    x[2] = -0.0f;
    const QuantizedTensor t = quantize(spec(), MatrixView<const float>(x.data(), rows, cols));
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float s_dec = amax == 0 ? 1.0f : div_full(div_full(amax, 448.0f), 6.0f);
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t bj = 0; bj * 16 < cols; ++bj) {
        const int64_t c0 = bj * 16, c1 = std::min(cols, c0 + 16);
        float a16 = 0;
        for (int64_t c = c0; c < c1; ++c) a16 = std::max(a16, std::fabs(x[size_t(r * cols + c)]));
        const uint32_t code = ref::encode_rn_sat(float8_e4m3fn, div_full(div_full(a16, 6.0f), s_dec));
        float s8 = float(ref::value_of(float8_e4m3fn, code));
        if (s8 == 0) s8 = 1;
        const float p = float(double(s8) * double(s_dec));
        bad += t.scale_codes[size_t(r * t.scale_cols + bj)] != code;
        bad += float_bits(t.scales[size_t(r * t.scale_cols + bj)]) != float_bits(p);
        for (int64_t c = c0; c < c1; ++c) {
          const float out = float(double(rtn_fp4(div_full(x[size_t(r * cols + c)], p))) * double(p));
          bad += float_bits(t.dequant[size_t(r * cols + c)]) != float_bits(out);
        }
      }
    INFO("trial ", trial);
    CHECK(bad == 0);
    CHECK(t.global_decode == 1.0f);
    CHECK(t.codes[1] == 8u);  // +0 became -0
  }
}

TEST_CASE("quartet2_triton: ties away from zero and the spec's checks") {
  // The element step alone (a scale product of 1: every value below is an exact E2M1 tie of the quotient).
  const float ties[] = {5.0f, 0.25f, 2.5f, 3.5f, 0.75f, 1.25f, 1.75f, -5.0f, -0.25f, 7.0f, 0.1f, -0.1f};
  const float away[] = {6.0f, 0.5f, 3.0f, 4.0f, 1.0f, 1.5f, 2.0f, -6.0f, -0.5f, 6.0f, 0.0f, -0.0f};
  BlockChoice one;
  one.mult = 1.0f;
  for (int i = 0; i < 12; ++i) {
    const Element e = Quartet2TritonRule::encode(Quartet2TritonRule::Params{}, one, ties[i], 0);
    CHECK(float_bits(e.value) == float_bits(away[i]));
    CHECK(float_bits(e.value) == float_bits(rtn_fp4(ties[i])));
  }
  CHECK(Quartet2TritonRule::encode(Quartet2TritonRule::Params{}, one, 0.0f, 0).code == 8u);  // +0 -> -0
  QuantizerSpec q = spec();
  CHECK_NOTHROW(validate(q, "q"));
  q.round = Round::rn;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("round must be rna"), Error);
  q = spec();
  q.scale_select = ScaleSelect::four_over_six;
  q.e4m3_max = 256;
  q.select_error = SelectError::mse;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("scale_select must be max"), Error);
  CHECK(quantizer_to_json(quantizer_from_json(quantizer_to_json(spec()), "j"))["emulate"] == "quartet2_triton");
}

TEST_CASE("quartet2_triton: rtn_fp4's threshold chain is E2M1 round-to-nearest-away, saturating, -0 for +0 and NaN") {
  // Against core's generic encoder (rna, saturate) on every float in [-8, 8] at a 2^-12 step, each threshold and
  // its float neighbours, 10^6 random bit patterns, and the special values.
  constexpr Format e2m1 = float4_e2m1fn;
  auto reference = [&](float y) -> uint32_t {
    return y > 0.0f || y < 0.0f ? fp4lab::encode(e2m1, y, Round::rna, Overflow::saturate, 0u, 32) : 8u;
  };
  std::vector<float> ys;
  for (int i = -8 * 4096; i <= 8 * 4096; ++i) ys.push_back(float(i) / 4096.0f);
  for (float t : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f})
    for (float s : {1.0f, -1.0f}) {
      ys.push_back(s * t);
      ys.push_back(std::nextafter(s * t, 0.0f));
      ys.push_back(std::nextafter(s * t, s * 100.0f));
    }
  std::mt19937 g(7);
  for (int i = 0; i < 1000000; ++i) ys.push_back(bits_float(uint32_t(g())));
  for (float v : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, -1e-45f, 3.4e38f}) ys.push_back(v);
  int64_t bad = 0;
  for (float y : ys) {
    const Element e = Quartet2TritonRule::rtn_fp4(y);
    const uint32_t want = reference(y);
    bad += e.code != want || float_bits(e.value) != float_bits(decode(e2m1, want));
  }
  CHECK(bad == 0);
}
