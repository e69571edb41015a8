// fp4-trainkit's quantizer arithmetic (schemes/fp4tk/scalar.hpp, rule.hpp). The
// bit-exact proof against fp4-trainkit's own code is tests/cli/test_fp4tk.py
// (its outputs' hashes); here: its documented departures from the recipes'
// intent, computed by hand from its source, the partial-block rule against a
// zero-padded tensor (a different path), and the spec's checks.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "schemes/fp4tk/scalar.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;

namespace {

// Dequantized values of a [1, n] row under q with given random words.
std::vector<float> row_dq(const QuantizerSpec& q, const std::vector<float>& x, const uint32_t* words = nullptr) {
  return quantize(q, MatrixView<const float>(x.data(), 1, int64_t(x.size())), RandomStream{0, 0, words}).dequant;
}

QuantizerSpec mx_rule(ScaleRule r) {
  QuantizerSpec q = quantizer_by_name("fp4tk_mxfp4");
  q.scale_rule = r;
  return q;
}

}  // namespace

TEST_CASE("fp4tk RN: no carry into the next binade ([1.75, 2) -> 1.5, [3.5, 4) -> 3), RNE elsewhere, saturation") {
  // amax 6 in every block: every rule's scale is 1, so the block shows E2M1's rounding itself.
  const std::vector<std::pair<float, float>> expect = {
      {0.2f, 0.0f},  {0.25f, 0.0f}, {0.26f, 0.5f}, {0.75f, 1.0f}, {1.25f, 1.0f},  {1.74f, 1.5f},
      {1.75f, 1.5f}, {1.9f, 1.5f},  {1.99f, 1.5f}, {2.0f, 2.0f},  {2.5f, 2.0f},   {2.6f, 3.0f},
      {3.49f, 3.0f}, {3.5f, 3.0f},  {3.99f, 3.0f}, {4.0f, 4.0f},  {5.0f, 4.0f},   {5.01f, 6.0f},
      {6.0f, 6.0f},  {-1.8f, -1.5f}, {-3.7f, -3.0f}, {0.0f, 0.0f}, {1e-30f, 0.0f}, {-0.3f, -0.5f}};
  for (const ScaleRule r : {ScaleRule::ocp, ScaleRule::ceil, ScaleRule::tetrajet, ScaleRule::nv_noglobal}) {
    CAPTURE(scale_rule_name(r));
    const QuantizerSpec q = r == ScaleRule::nv_noglobal ? quantizer_by_name("fp4tk_nvfp4") : mx_rule(r);
    for (const auto& [in, want] : expect) {
      CAPTURE(in);
      std::vector<float> x(size_t(q.block_cols), 0.0f);
      x[0] = 6.0f;
      x[1] = in;
      CHECK(row_dq(q, x)[1] == want);
    }
  }
  // fp4lab's own mxfp4 carries (true RNE): the difference is the emulation's.
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f;
  x[1] = 1.9f;
  CHECK(row_dq(quantizer_by_name("mxfp4"), x)[1] == 2.0f);
}

TEST_CASE("fp4tk SR: noise U[-0.5, 0.5) on the mantissa after the binade is fixed (two grid steps), clamped") {
  const QuantizerSpec q = [] {
    QuantizerSpec s = mx_rule(ScaleRule::ocp);
    s.round = Round::rs;
    return s;
  }();
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f;  // scale 1
  auto at = [&](float v, uint32_t word) {
    std::vector<uint32_t> w(32, 0x80000000u);
    w[1] = word;
    x[1] = v;
    return row_dq(q, x, w.data())[1];
  };
  // u = word / 2^32 (top 24 bits); m = 4 / 4 = 1 in binade 2 (on the grid): m + u - 0.5 spans
  // [0.5, 1.5): rint(2m) in {1, 2, 3} -> {2, 4, 6}, so a grid point moves with probability 1/2.
  CHECK(at(4.0f, 0x00000000u) == 2.0f);   // m = 0.5 -> rint(1) = 1 -> 0.5 * 4
  CHECK(at(4.0f, 0x80000000u) == 4.0f);   // u = 0.5: no noise
  CHECK(at(4.0f, 0xFFFFFFFFu) == 6.0f);   // m -> 1.5 - 2^-24 -> rint(3) = 3 -> 1.5 * 4
  // The top of a binade can not carry: 1.9 + noise never gives 2.
  for (uint32_t k = 0; k < 256; ++k) CHECK(at(1.9f, k << 24) <= 1.5f);
  // The bottom edge: a tiny positive value becomes 0.5 * scale with probability ~1/4 and never negative.
  int half = 0;
  for (uint32_t k = 0; k < 1024; ++k) {
    const float d = at(1e-3f, k << 22);
    CHECK((d == 0.0f || d == 0.5f));
    half += d == 0.5f;
  }
  CHECK(half == 257);  // 2 (1e-3 + u - 0.5) > 0.5 (a tie goes to 0): u > 0.749, k >= 767 of 1024
  // Zero stays zero (sign(0) = 0) whatever the noise.
  CHECK(at(0.0f, 0xFFFFFFFFu) == 0.0f);
}

TEST_CASE("fp4tk SR expectation: biased at the clamps (E[Q(a)] = a/2 + 1/8 near 0, 5.5 at 6), unbiased inside") {
  // The expectation over every 2^-24-step noise value, exactly (16M draws of one element each).
  auto expectation = [](float a) {
    double s = 0;
    const int n = 1 << 16;
    for (int k = 0; k < n; ++k) s += fp4tk_e2m1(a, true, float(k) * float(1.0 / n) - 0.5f);
    return s / n;
  };
  CHECK(expectation(1e-4f) == doctest::Approx(1e-4 / 2 + 0.125).epsilon(1e-3));
  CHECK(expectation(6.0f) == doctest::Approx(5.5).epsilon(1e-4));
  CHECK(expectation(1.9f) == doctest::Approx(1.5).epsilon(1e-6));
  CHECK(expectation(4.5f) == doctest::Approx(4.5).epsilon(1e-4));
  CHECK(expectation(0.7f) == doctest::Approx(0.7).epsilon(1e-4));
}

TEST_CASE("fp4tk scales: the eps floor 2^-23 (MX) and 2^-9 (NVFP4), tetrajet's amax * 2 overflow, NaN and Inf") {
  // MX: a block of amax 1e-9 gets scale 2^-23 (floor(log2(max(amax / 4, eps)))), not 2^-32.
  std::vector<float> tiny(32, 0.0f);
  tiny[0] = 1e-9f;
  const QuantizedTensor t = quantize(mx_rule(ScaleRule::ocp), MatrixView<const float>(tiny.data(), 1, 32));
  CHECK(t.scales[0] == pow2f(-23));
  CHECK(t.scale_codes[0] == 127 - 23);
  CHECK(t.dequant[0] == 0.0f);
  // NVFP4: amax / 6 below 2^-9 is clamped up to 2^-9, no per-tensor scale.
  std::vector<float> g(16, 0.0f);
  g[0] = 1e-3f;
  g[1] = 9e-4f;
  const QuantizedTensor n = quantize(quantizer_by_name("fp4tk_nvfp4"), MatrixView<const float>(g.data(), 1, 16));
  CHECK(n.scales[0] == pow2f(-9));
  CHECK(n.dequant[0] == 0.5f * pow2f(-9));  // 1e-3 / 2^-9 = 0.512 -> 0.5
  // Tetrajet computes (amax * 2) / 12: amax >= 2^127 overflows to Inf -> scale 2^127; ceil gives 2^126.
  std::vector<float> big(32, 1.0f);
  big[0] = 3e38f;
  CHECK(quantize(mx_rule(ScaleRule::tetrajet), MatrixView<const float>(big.data(), 1, 32)).scales[0] == pow2f(127));
  CHECK(quantize(mx_rule(ScaleRule::ceil), MatrixView<const float>(big.data(), 1, 32)).scales[0] == pow2f(126));
  // NaN: the whole block NaN. Inf: MX keeps Inf, NVFP4's clamped scale 448 gives 2688.
  std::vector<float> s(32, 1.0f);
  s[3] = std::nanf("");
  for (float v : row_dq(mx_rule(ScaleRule::ocp), s)) CHECK(std::isnan(v));
  s[3] = -INFINITY;
  const std::vector<float> mi = row_dq(mx_rule(ScaleRule::ocp), s);
  CHECK(mi[3] == -INFINITY);
  CHECK(mi[0] == 0.0f);
  const std::vector<float> ni = row_dq(quantizer_by_name("fp4tk_nvfp4"), s);
  CHECK(ni[3] == -2688.0f);
}

TEST_CASE("fp4tk partial blocks: equal to the zero-padded tensor's quantization, cropped") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const char* name : {"fp4tk_mxfp4", "fp4tk_nvfp4"}) {
    for (const bool cols : {false, true}) {
      QuantizerSpec q = quantizer_by_name(name);
      if (cols) std::swap(q.block_rows, q.block_cols);
      const int64_t R = 37, C = 45, K = q.block_rows * q.block_cols;
      const int64_t PR = cols ? (R + K - 1) / K * K : R, PC = cols ? C : (C + K - 1) / K * K;
      std::vector<float> x(size_t(R * C)), p(size_t(PR * PC), 0.0f);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) p[size_t(r * PC + c)] = x[size_t(r * C + c)] = nd(rng) * 0.01f;
      const QuantizedTensor a = quantize(q, MatrixView<const float>(x.data(), R, C));
      const QuantizedTensor b = quantize(q, MatrixView<const float>(p.data(), PR, PC));
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
          REQUIRE(float_bits(a.dequant[size_t(r * C + c)]) == float_bits(b.dequant[size_t(r * PC + c)]));
          REQUIRE(a.codes[size_t(r * C + c)] == b.codes[size_t(r * PC + c)]);
        }
    }
  }
}

TEST_CASE("fp4tk spec: canned names, JSON round trip, one clear error for what fp4-trainkit does not have") {
  for (const char* name : {"fp4tk_mxfp4", "fp4tk_nvfp4"}) {
    const QuantizerSpec q = quantizer_by_name(name);
    CHECK(q.emulate == Emulation::fp4tk);
    CHECK(quantizer_from_json(quantizer_to_json(q), "q") == q);
    CHECK(describe(q).find("fp4tk") != std::string::npos);
  }
  auto err = [](const std::string& j) {
    try {
      parse_quantizer(j);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string base = R"({"element":"e2m1","scale":"e8m0","block":[1,32],"scale_rule":"ocp","emulate":"fp4tk")";
  CHECK(err(R"({"element":"e2m1","scale":"ue4m3","block":[1,16],"scale_rule":"nv_noglobal","emulate":"fp4tk",)"
            R"("rht":true})")
            .find("rht must be false") != std::string::npos);
  CHECK(err(base + R"(,"round":"rz"})").find("round must be rn or rs") != std::string::npos);
  CHECK(err(R"({"element":"e4m3","scale":"e8m0","block":[1,32],"emulate":"fp4tk"})").find("e2m1") != std::string::npos);
  CHECK(err(R"({"element":"e2m1","scale":"e8m0","block":[4,8],"emulate":"fp4tk"})").find("1-D") != std::string::npos);
  CHECK(err(R"({"element":"e2m1","scale":"ue4m3","block":[1,16],"scale_rule":"nv","global_scale":"tensor_amax",)"
            R"("emulate":"fp4tk"})")
            .find("nv_noglobal") != std::string::npos);
  CHECK(err(base + R"(,"emulate":"fp4-trainkit"})").find("valid: none, fp4tk") != std::string::npos);
}
