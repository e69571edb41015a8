// emulate 'quartet2_eden_triton' (schemes/quartet2/eden_triton.hpp) and rht_kind 'quartet2_128' (sim/rht.hpp)
// against Quartet II's eden_1x16s_fp4_kernel transliterated the way it is written: the operand flattened as the
// GEMM reads it (a [16,1] quantizer's operand transposed first), cut into flat chunks of 128, each chunk's
// groups, sums and stochastic scale choice as array steps; the rotation as the matrix product x diag(d) H0 with
// H0 = bf16(hadamard(128) / sqrt(128)) built entry by entry; tl.rand from core/philox.hpp's bare rounds (counter
// (o, 0, 0, 0)); E4M3 by tests/core/ref_format.hpp's brute-force encoder. Its own Triton kernel is the oracle
// once its GPU run is recorded (tests/cli/test_quartet2_eden.py).
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "core/philox.hpp"
#include "core/ptx_approx.hpp"
#include "core/ref_format.hpp"
#include "sim/block_rules.hpp"
#include "sim/quantizer.hpp"
#include "sim/rht.hpp"

using namespace fp4lab;

namespace {

float rtn_fp4(float x) {  // nvfp4_triton.py's rtn_fp4 as quartet_2.py repeats it
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

float bf16(float v) {  // RN to BF16 by the reference encoder
  return float(ref::value_of(bfloat16, ref::encode_rn_sat(bfloat16, v)));
}

float e4m3_of_bits(uint32_t b) { return float(ref::value_of(float8_e4m3fn, b & 0xFFu)); }

// tl.rand(seed, o): Philox4x32-10 of counter (o, 0, 0, 0), key (seed lo, seed hi), word 0, as random.py maps it.
float tl_rand(uint64_t seed, uint64_t o) {
  const Philox4 w = philox4x32_10(Philox4{{uint32_t(o), 0u, 0u, 0u}}, uint32_t(seed), uint32_t(seed >> 32));
  int32_t x = int32_t(w.v[0]);
  x = x < 0 ? -x - 1 : x;
  return float(x) * 4.6566127342e-10f;
}

// eden_1x16s_fp4_kernel on a flat operand (n a multiple of 128), as written; amax given as the peer passes it.
std::vector<float> eden_kernel(const std::vector<float>& x, float amax, uint64_t seed) {
  const float scales_max = 255.99f, val_max = float(6.0 / ((17.0 / 16.0) * 0.93));
  const float s_dec = amax == 0.0f ? 1.0f : div_full(div_full(amax, scales_max), val_max);
  std::vector<float> out(x.size());
  for (size_t c0 = 0; c0 < x.size(); c0 += 128) {
    float xs[128], q[128], s8[8];
    for (int g = 0; g < 8; ++g) {
      float m = 0;
      for (int i = 0; i < 16; ++i) m = std::max(m, std::fabs(x[c0 + size_t(g * 16 + i)]));
      const float sb = div_full(m, val_max);
      float e = e4m3_of_bits(ref::encode_rn_sat(float8_e4m3fn, div_full(sb, s_dec)));
      s8[g] = e == 0.0f ? 1.0f : e;
      for (int i = 0; i < 16; ++i) {
        xs[g * 16 + i] = div_full(x[c0 + size_t(g * 16 + i)], s8[g] * s_dec);
        q[g * 16 + i] = rtn_fp4(xs[g * 16 + i]);
      }
    }
    float num = 0, den = 0;
    for (int i = 0; i < 128; ++i) {
      num += xs[i] * xs[i];
      den += xs[i] * q[i];
    }
    const float corr = den == 0.0f ? 1.0f : div_full(num, den);
    for (int g = 0; g < 8; ++g) {
      const float cs = s8[g] * corr;
      const uint32_t bits = ref::encode_rn_sat(float8_e4m3fn, cs);
      const float prev = e4m3_of_bits(bits - 1u), curr = e4m3_of_bits(bits), next = e4m3_of_bits(bits + 1u);
      const float up = curr > cs ? curr : next, down = curr > cs ? prev : curr;
      const float prob_up = div_full(cs - down, up - down);
      const float scale = tl_rand(seed, (c0 / 16) + size_t(g)) < prob_up ? up : down;
      for (int i = 0; i < 16; ++i) out[c0 + size_t(g * 16 + i)] = q[g * 16 + i] * scale * s_dec;
    }
  }
  return out;
}

// x_chunk @ (H0 diag(d))^T = x diag(d) H0 for each 128-chunk of each row of a bf16 [rows, cols] operand, as an
// exact sum (long double: every term x_i * c has 16 significant bits and the tests keep a chunk's span short).
std::vector<float> rotate_rows(const std::vector<float>& x, int64_t rows, int64_t cols, uint64_t seed) {
  const std::array<float, 128> d = rht_signs128(seed);
  const float c = bf16(float(1.0 / std::sqrt(128.0)));
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k0 = 0; k0 + 128 <= cols; k0 += 128)
      for (int j = 0; j < 128; ++j) {
        long double s = 0;
        for (int i = 0; i < 128; ++i) {
          const float h = (__builtin_popcount(unsigned(i & j)) & 1) ? -c : c;  // Sylvester: (-1)^<i,j>
          s += (long double)(bf16(x[size_t(r * cols + k0 + i)]) * d[size_t(i)]) * (long double)h;
        }
        y[size_t(r * cols + k0 + j)] = float(s);
      }
  return y;
}

QuantizerSpec spec(bool cols_axis, bool rht, uint64_t rht_seed) {
  QuantizerSpec q = quantizer_by_name(cols_axis ? "nvfp4_col" : "nvfp4");
  q.emulate = Emulation::quartet2_eden_triton;
  q.round = Round::rna;
  q.rht = rht;
  if (rht) {
    q.rht_kind = RhtKind::quartet2_128;
    q.rht_seed = rht_seed;
  }
  return q;
}

std::vector<float> randn_bf16(int64_t n, uint32_t seed, bool ints) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  float mag = 1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (i % 16 == 0) mag = std::ldexp(1.0f, int(g() % 9) - 4);
    x[i] = ints ? float(int(g() % 31) - 15) * 0.125f : bf16(nd(g) * mag);
  }
  return x;
}

}  // namespace

TEST_CASE("rht_kind quartet2_128: the rotation is x diag(d) H0 with BF16 H0, exact where the sum is") {
  for (const bool ints : {false, true}) {
    const int64_t rows = 5, cols = 384;
    const std::vector<float> x = randn_bf16(rows * cols, ints ? 3 : 4, ints);
    std::vector<float> y = x;
    rht128_quartet2(MatrixView<float>(y.data(), rows, cols), RhtAxis::rows, 77, true);
    const std::vector<float> want = rotate_rows(x, rows, cols, 77);
    int64_t bad = 0;
    for (size_t i = 0; i < y.size(); ++i) bad += float_bits(y[i]) != float_bits(want[i]);
    CHECK(bad == 0);
    // Along columns: the transpose's rows.
    std::vector<float> xt(x.size()), yt(x.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) xt[size_t(c * rows + r)] = x[size_t(r * cols + c)];
    rht128_quartet2(MatrixView<float>(xt.data(), cols, rows), RhtAxis::cols, 77, true);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) yt[size_t(r * cols + c)] = xt[size_t(c * rows + r)];
    bad = 0;
    for (size_t i = 0; i < y.size(); ++i) bad += float_bits(yt[i]) != float_bits(want[i]);
    CHECK(bad == 0);
  }
  // The first 16 signs are the 16-point transform's; the scale is BF16's 181 * 2^-11; inverse(forward) scales
  // by c^2 * 128 (exactly, for these integer inputs).
  const std::array<float, 16> s16 = rht_signs(uint64_t(9));
  const std::array<float, 128> s128 = rht_signs128(9);
  for (int i = 0; i < 16; ++i) CHECK(s16[size_t(i)] == s128[size_t(i)]);
  CHECK(quartet2_rht_scale == bf16(float(1.0 / std::sqrt(128.0))));
  CHECK(quartet2_rht_scale == 181.0f / 2048.0f);
  std::vector<float> v(128);
  for (int i = 0; i < 128; ++i) v[size_t(i)] = float(i % 7 - 3);
  std::vector<float> w = v;
  rht128_quartet2(MatrixView<float>(w.data(), 1, 128), RhtAxis::rows, 9, true);
  rht128_quartet2(MatrixView<float>(w.data(), 1, 128), RhtAxis::rows, 9, false);
  const double k = double(quartet2_rht_scale) * double(quartet2_rht_scale) * 128.0;
  for (int i = 0; i < 128; ++i) CHECK(double(w[size_t(i)]) == doctest::Approx(double(v[size_t(i)]) * k).epsilon(1e-6));
  // A partial chunk stays as it is.
  std::vector<float> p(200, 1.5f);
  rht128_quartet2(MatrixView<float>(p.data(), 1, 200), RhtAxis::rows, 9, true);
  for (int i = 128; i < 200; ++i) CHECK(p[size_t(i)] == 1.5f);
}

TEST_CASE("quartet2_eden_triton: dequant against eden_1x16s_fp4_kernel transliterated, rows and columns") {
  int64_t cases = 0;
  for (const bool cols_axis : {false, true})
    for (const bool rht : {false, true})
      for (int trial = 0; trial < 3; ++trial) {
        const int64_t rows = cols_axis ? 256 : 6, cols = cols_axis ? 6 : 256;
        std::vector<float> x = randn_bf16(rows * cols, uint32_t(100 + trial), rht && trial == 2);
        if (trial == 1) {  // a zero 16-group, and a +0 and a -0 inside a nonzero one
          for (int i = 0; i < 16; ++i) x[size_t(cols_axis ? i * cols : i)] = 0.0f;
          x[size_t(cols_axis ? 20 * cols : 20)] = -0.0f;
        }
        const uint64_t seed = 1000 + uint64_t(trial), rht_seed = 5 + uint64_t(trial);
        const QuantizerSpec q = spec(cols_axis, rht, rht_seed);
        const QuantizedTensor t = quantize(q, MatrixView<const float>(x.data(), rows, cols), RandomStream{seed, 0});
        // The peer's operand: the GEMM-ordered layout ([16,1]: the transpose), rotated, flat.
        const int64_t R = cols_axis ? cols : rows, C = cols_axis ? rows : cols;
        std::vector<float> op(x.size());
        for (int64_t r = 0; r < R; ++r)
          for (int64_t c = 0; c < C; ++c)
            op[size_t(r * C + c)] = cols_axis ? x[size_t(c * cols + r)] : x[size_t(r * cols + c)];
        if (rht) op = rotate_rows(op, R, C, rht_seed);
        float amax = 0;
        for (float v : op) amax = std::max(amax, std::fabs(v));
        const std::vector<float> want = eden_kernel(op, amax, seed);
        int64_t bad = 0;
        for (int64_t r = 0; r < R; ++r)
          for (int64_t c = 0; c < C; ++c) {
            const float got = cols_axis ? t.dequant[size_t(c * cols + r)] : t.dequant[size_t(r * cols + c)];
            bad += float_bits(got) != float_bits(want[size_t(r * C + c)]);
          }
        INFO("cols_axis ", cols_axis, " rht ", rht, " trial ", trial);
        CHECK(bad == 0);
        ++cases;
      }
  CHECK(cases == 12);
}

TEST_CASE("quartet2_eden_triton: the scale is rounded stochastically, unbiased over seeds; the spec's checks") {
  // One chunk of a fixed tensor under many SR seeds: each group's scale takes its two neighbours, and their
  // mean approaches the EDEN-corrected scale c.
  const std::vector<float> x = randn_bf16(128, 11, false);
  const QuantizerSpec q = spec(false, false, 0);
  std::vector<double> mean(8, 0.0);
  std::vector<std::set<float>> seen(8);
  const int n = 4000;
  for (int s = 0; s < n; ++s) {
    const QuantizedTensor t = quantize(q, MatrixView<const float>(x.data(), 1, 128), RandomStream{uint64_t(s), 0});
    for (int g = 0; g < 8; ++g) {
      mean[size_t(g)] += t.scales[size_t(g)] / n;
      seen[size_t(g)].insert(t.scales[size_t(g)]);
    }
  }
  // c from the transliteration's first steps (u = 0 never rounds up: prob > 0 picks up with u < prob).
  const Quartet2EdenTritonRule::Params p = Quartet2EdenTritonRule::params(q);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const Quartet2EdenTritonRule::Global g = Quartet2EdenTritonRule::global(p, float_bits(amax));
  float num = 0, den = 0, s8[8];
  for (int k = 0; k < 8; ++k) {
    float m = 0;
    for (int i = 0; i < 16; ++i) m = std::max(m, std::fabs(x[size_t(k * 16 + i)]));
    s8[k] = Quartet2EdenTritonRule::group_s8(p, g, m);
    for (int i = 0; i < 16; ++i) {
      const float y = div_full(x[size_t(k * 16 + i)], s8[k] * g.s_dec);
      num += y * y;
      den += y * rtn_fp4(y);
    }
  }
  const float corr = div_full(num, den);
  for (int k = 0; k < 8; ++k) {
    const double c = double(s8[k] * corr);
    CHECK(seen[size_t(k)].size() <= 2);
    CHECK(mean[size_t(k)] == doctest::Approx(c).epsilon(0.01));
  }
  QuantizerSpec b = spec(false, false, 0);
  CHECK_NOTHROW(validate(b, "q"));
  b.round = Round::rn;
  CHECK_THROWS_WITH_AS(validate(b, "q"), doctest::Contains("round must be rna"), Error);
  b = spec(false, true, 1);
  b.rht_kind = RhtKind::rht16;
  CHECK_THROWS_WITH_AS(validate(b, "q"), doctest::Contains("rht_kind 'quartet2_128'"), Error);
  b = quantizer_by_name("nvfp4");
  b.rht_kind = RhtKind::quartet2_128;
  CHECK_THROWS_WITH_AS(validate(b, "q"), doctest::Contains("need rht true"), Error);
  b.rht = true;
  b.rht_signs = RhtSigns::te;
  CHECK_THROWS_WITH_AS(validate(b, "q"), doctest::Contains("rht_signs must be philox"), Error);
  const nlohmann::json j = quantizer_to_json(spec(true, true, 3));
  CHECK(j["emulate"] == "quartet2_eden_triton");
  CHECK(j["rht_kind"] == "quartet2_128");
  CHECK(quantizer_from_json(j, "j") == spec(true, true, 3));
  CHECK(!quantizer_to_json(quantizer_by_name("nvfp4")).contains("rht_kind"));  // old JSON unchanged
}
