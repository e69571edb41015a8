// emulate 'te_fast_math' (schemes/te_nvfp4/fast_math.hpp) against a construction from a different path: the
// E4M3, BF16 and E2M1 roundings by nearest-value search over each format's values (ties to the even code),
// the divisions and products in float64 rounded once; the mode's departures from the nv rule (the BF16
// coefficient, +0 for -0) shown on inputs where they change codes; and the spec's checks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/bits.hpp"
#include "core/ref_format.hpp"
#include "core/error.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;

namespace {


}  // namespace

TEST_CASE("te_fast_math: codes, scales and dequant against a float64 construction, BF16 input") {
  std::mt19937 g(17);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t rows = 33, cols = 48;
    std::vector<float> x(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      const float mag = std::ldexp(1.0f, int(g() % 40) - 20);
      for (int64_t c = 0; c < cols; ++c) x[size_t(r * cols + c)] = ref::round_rn_sat(bfloat16, n(g) * mag);
    }
    x[5] = -0.0f;
    x[7] = 0.0f;
    for (bool col : {false, true}) {
      QuantizerSpec q = quantizer_by_name("nvfp4");
      q.emulate = Emulation::te_fast_math;
      if (col) std::swap(q.block_rows, q.block_cols);
      const QuantizedTensor t = quantize(q, MatrixView<const float>(x.data(), rows, cols));
      float gamax = 0;
      for (float v : x) gamax = std::max(gamax, std::fabs(v));
      float s_enc = float(2688.0 / double(gamax));
      const float s_dec = float(1.0 / double(s_enc));
      const float m6 = float(double(s_enc) * double(float(1.0 / 6.0)));
      int64_t bad = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t bi = col ? r / 16 : r, bj = col ? c : c / 16;
          float amax = 0;
          for (int64_t k = 0; k < 16; ++k) {
            const int64_t rr = col ? bi * 16 + k : r, cc = col ? c : bj * 16 + k;
            if (rr < rows && cc < cols) amax = std::max(amax, std::fabs(x[size_t(rr * cols + cc)]));
          }
          const float sdec = ref::round_rn_sat(float8_e4m3fn, double(float(double(amax) * double(m6))));
          const double qd = double(s_enc) / double(sdec);
          const float coeff =
              ref::round_rn_sat(bfloat16, qd > 3.3895313892515355e38 ? 3.3895313892515355e38f : float(qd));
          const float xv = x[size_t(r * cols + c)];
          const float y = xv == 0.0f ? 0.0f : float(double(xv) * double(coeff));
          const uint32_t code = ref::encode_rn_sat(float4_e2m1fn, y);
          const float dq = float(double(float(ref::value_of(float4_e2m1fn, code) * double(sdec))) * double(s_dec));
          bad += t.codes[size_t(r * cols + c)] != code;
          bad += float_bits(t.dequant[size_t(r * cols + c)]) != float_bits(dq);
          bad += t.scales[size_t(bi * t.scale_cols + bj)] != sdec;
        }
      INFO("trial ", trial, col ? " columns" : " rows");
      CHECK(bad == 0);
      CHECK(t.codes[5] == 0u);  // -0 becomes +0 (fma with a +0 addend)
    }
  }
}

TEST_CASE("te_fast_math: the BF16 coefficient changes codes against TE's reference arithmetic (nv)") {
  std::mt19937 g(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(size_t(64 * 64));
  for (float& v : x) v = ref::round_rn_sat(bfloat16, u(g) * std::ldexp(1.0f, int(g() % 8)));
  QuantizerSpec fast = quantizer_by_name("nvfp4");
  fast.emulate = Emulation::te_fast_math;
  const MatrixView<const float> v(x.data(), 64, 64);
  const QuantizedTensor a = quantize(fast, v), b = quantize(quantizer_by_name("nvfp4"), v);
  int64_t differ = 0;
  for (size_t i = 0; i < a.codes.size(); ++i) differ += a.codes[i] != b.codes[i];
  MESSAGE("te_fast_math vs nv: " << differ << " of " << a.codes.size() << " codes differ");
  CHECK(a.scale_codes == b.scale_codes);  // the block scales are the same
  CHECK(differ > 0);
}

TEST_CASE("te_fast_math: the spec's checks") {
  QuantizerSpec q = quantizer_by_name("nvfp4_2d");
  q.emulate = Emulation::te_fast_math;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("[1,16] or [16,1]"), Error);
  q = quantizer_by_name("nvfp4");
  q.emulate = Emulation::te_fast_math;
  q.round = Round::rs;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("ptx_x4"), Error);
  q.sr_bits = SrBits::ptx_x4;
  CHECK_NOTHROW(validate(q, "q"));
  q.rht = true;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("rht_output must be 'bf16'"), Error);
  q.rht = false;
  CHECK(quantizer_to_json(quantizer_from_json(quantizer_to_json(q), "j"))["emulate"] == "te_fast_math");
}
