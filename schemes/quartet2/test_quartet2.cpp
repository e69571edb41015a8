// emulate 'quartet2' (schemes/quartet2/scalar.hpp) against a construction from a different path: Quartet II's
// kernel transliterated thread by thread (two threads of 8 BF16 elements a block, float2 lanes of even and odd
// elements, the pair's sum), E4M3 and E2M1 roundings by nearest-value search over each format's values (ties
// to the even code), products in float64 rounded once, fma by std::fma; rcp.approx.ftz by core's model, which
// the GPU checks against the instruction (test_quartet2_cuda.cpp, tests/cuda/test_ptx_approx.cpp). Also the
// spec's checks, and what 4/6 and NaN do.
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
#include "sim/quantizer.hpp"

using namespace fp4lab;

namespace {

float mul(float a, float b) { return float(double(a) * double(b)); }  // exact product, rounded once

struct Block {
  std::vector<uint32_t> codes;
  uint32_t scale_code;
  float scale;
};

// One block of Quartet II's four_six_fp4_kernel<6> or <6, 4> (round_four_six.cu), x: 16 BF16 values.
Block quartet2_block(const float* x, int n, float S, bool four_six) {
  float amax = 0;
  for (int t = 0; t < n; ++t) amax = std::fmax(amax, std::fabs(x[t]));  // NaN left out
  const float inv_s = rcp_approx_ftz(S);
  const float inv_vals[2] = {float(1.0 / 6.0), 0.25f};
  Block best_block;
  float best = INFINITY;
  for (int i = 0; i < (four_six ? 2 : 1); ++i) {
    const float raw = mul(mul(amax, inv_vals[i]), inv_s);
    const uint32_t s8_code = ref::encode_rn_sat(float8_e4m3fn, raw);
    const float s8 = float(ref::value_of(float8_e4m3fn, s8_code));
    const float sr = s8 == 0 ? 1.0f : s8;
    const float f = rcp_approx_ftz(mul(sr, S));
    Block b;
    for (int t = 0; t < n; ++t) {
      b.codes.push_back(ref::encode_rn_sat(float4_e2m1fn, mul(x[t], f)));
    }
    b.scale = s8;
    b.scale_code = s8_code;
    // quant_error: each thread's float2 sum over its 8 elements (x: even, y: odd), then the pair's.
    const float descale = mul(s8, S);
    float thread[2];
    for (int h = 0; h < 2; ++h) {
      float sx = 0, sy = 0;
      for (int k = 0; k < 4; ++k) {
        const int t0 = 8 * h + 2 * k, t1 = t0 + 1;
        const float q0 = t0 < n ? float(ref::value_of(float4_e2m1fn, b.codes[t0])) : 0.f;
        const float q1 = t1 < n ? float(ref::value_of(float4_e2m1fn, b.codes[t1])) : 0.f;
        const float d0 = std::fma(q0, -descale, t0 < n ? x[t0] : 0.f),
                    d1 = std::fma(q1, -descale, t1 < n ? x[t1] : 0.f);
        sx = std::fma(d0, d0, sx);
        sy = std::fma(d1, d1, sy);
      }
      thread[h] = sx + sy;
    }
    const float score = thread[0] + thread[1];
    if (!four_six || score < best) {
      best = score;
      best_block = b;
    }
  }
  return best_block;
}

QuantizerSpec quartet2_spec(bool four_six) {
  QuantizerSpec q = quantizer_by_name("nvfp4");
  q.emulate = Emulation::quartet2;
  if (four_six) {
    q.scale_select = ScaleSelect::four_over_six;
    q.select_error = SelectError::mse;
    q.e4m3_max = 256;
  }
  return q;
}

}  // namespace

TEST_CASE("quartet2: codes, scale codes, tensor scale and dequant against Quartet II's kernel transliterated") {
  std::mt19937 g(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int64_t picked4 = 0, blocks = 0;
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t rows = 19, cols = trial % 2 ? 40 : 64;  // 40: a partial last block
    std::vector<float> x(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      const float mag = std::ldexp(1.0f, int(g() % 60) - 30);
      for (int64_t c = 0; c < cols; ++c) x[size_t(r * cols + c)] = ref::round_rn_sat(bfloat16, nd(g) * mag);
    }
    for (int c = 0; c < 16; ++c) x[size_t(2 * cols + c)] = 0.0f;                  // a zero block
    for (int c = 0; c < 16; ++c)
      x[size_t(3 * cols + c)] = ref::round_rn_sat(bfloat16, 1e-30f * c);  // its scale underflows
    x[size_t(4 * cols)] = -0.0f;
    for (bool four_six : {false, true}) {
      const QuantizerSpec q = quartet2_spec(four_six);
      const QuantizedTensor t = quantize(q, MatrixView<const float>(x.data(), rows, cols));
      float amax = 0;
      for (float v : x) amax = std::fmax(amax, std::fabs(v));
      const float S = amax == 0 ? 1.0f : mul(mul(amax, four_six ? float(1.0 / 256) : float(1.0 / 448)), float(1.0 / 6));
      CHECK(float_bits(t.global_decode) == float_bits(S));
      int64_t bad = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t bj = 0; bj * 16 < cols; ++bj) {
          const int n = int(std::min<int64_t>(16, cols - bj * 16));
          const float* xb = x.data() + r * cols + bj * 16;
          const Block b = quartet2_block(xb, n, S, four_six);
          const size_t si = size_t(r * t.scale_cols + bj);
          bad += t.scale_codes[si] != b.scale_code;
          bad += float_bits(t.scales[si]) != float_bits(b.scale);
          float a = 0;
          for (int k = 0; k < n; ++k) a = std::fmax(a, std::fabs(xb[k]));
          if (four_six) {
            const float s6 = ref::round_rn_sat(float8_e4m3fn, mul(mul(a, float(1.0 / 6.0)), rcp_approx_ftz(S)));
            picked4 += b.scale != s6;
            blocks += 1;
          }
          for (int k = 0; k < n; ++k) {
            const size_t i = size_t(r * cols + bj * 16 + k);
            const float v = float(ref::value_of(float4_e2m1fn, b.codes[k]));
            bad += t.codes[i] != b.codes[k];
            bad += float_bits(t.dequant[i]) != float_bits(mul(mul(v, b.scale), S));
          }
        }
      INFO("trial ", trial, four_six ? " 4/6" : " rtn");
      CHECK(bad == 0);
      CHECK(t.codes[size_t(4 * cols)] == 8u);  // -0 keeps its sign (a product, no +0 addend)
    }
  }
  MESSAGE("4/6 chose map-to-4 in " << picked4 << " of " << blocks << " blocks");
  CHECK(picked4 > 0);
  CHECK(picked4 < blocks);
}

TEST_CASE("quartet2: NaN is left out of both amaxes; the blocks without it are as without the NaN") {
  std::vector<float> x(size_t(4 * 32));
  for (size_t i = 0; i < x.size(); ++i) x[i] = ref::round_rn_sat(bfloat16, std::sin(float(i)) * 3.0f);
  std::vector<float> y = x;
  x[5] = NAN;
  y[5] = 0.0f;
  for (bool four_six : {false, true}) {
    const QuantizerSpec q = quartet2_spec(four_six);
    const QuantizedTensor a = quantize(q, MatrixView<const float>(x.data(), 4, 32));
    const QuantizedTensor b = quantize(q, MatrixView<const float>(y.data(), 4, 32));
    CHECK(float_bits(a.global_decode) == float_bits(b.global_decode));
    for (size_t i = 16; i < x.size(); ++i) CHECK(a.codes[i] == b.codes[i]);
    for (size_t s = 1; s < a.scale_codes.size(); ++s) CHECK(a.scale_codes[s] == b.scale_codes[s]);
  }
}

TEST_CASE("quartet2: the spec's checks") {
  QuantizerSpec q = quartet2_spec(false);
  CHECK_NOTHROW(validate(q, "q"));
  q.block_rows = 16;
  q.block_cols = 1;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("[1,16]"), Error);
  q = quartet2_spec(true);
  CHECK_NOTHROW(validate(q, "q"));
  q.e4m3_max = 448;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("e4m3_max must be 256"), Error);
  q = quartet2_spec(true);
  q.select_error = SelectError::mae;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("select_error must be 'mse'"), Error);
  q = quartet2_spec(false);
  q.round = Round::rs;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("round must be rn"), Error);
  q = quartet2_spec(false);
  q.rht = true;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("MS-EDEN"), Error);
  q = quartet2_spec(true);
  CHECK(quantizer_to_json(quantizer_from_json(quantizer_to_json(q), "j"))["emulate"] == "quartet2");
}
