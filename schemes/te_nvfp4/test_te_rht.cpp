// TransformerEngine's NVFP4 + RHT arithmetic (docs/log/2026-12-01-te-rht-cast-fusion.md): TE's fixed sign set
// (rht_signs "te"), the BF16 rounding of its RHT output (rht_output "bf16": the default build's columnwise
// operand is nv on bf16_rn(RHT(x))), and the fused kernels' fast-math arithmetic (emulate
// "te_fused_fast_math"). Against constructions from a different path: TE's sign vector as its source writes
// it, the transform as a float64 matrix product of diag(s) H16 / 4 (exact for the inputs used: multiples of
// 2^-4 below 16, whose sums FP32 holds exactly, as TE's tensor-core sums then are), BF16 by bits, products in
// float64 rounded once, E4M3 / E2M1 by nearest-value search; rcp.approx.ftz by core's model (measured on the
// GPU, tests/cuda/test_ptx_approx.cpp).
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
#include "sim/rht.hpp"

using namespace fp4lab;

namespace {

// TE d0067d0da, transformer_engine/pytorch/tensor/nvfp4_tensor.py, get_wgrad_sign_vector ("xkcd 221").
const int kTeSigns[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};

int hadamard(int r, int c) { return __builtin_popcount(unsigned(r & c)) % 2 ? -1 : 1; }  // Sylvester H16

// y = diag(s) H16 / 4 applied down each 16-row chunk of every column ([16,1] blocks), in float64.
std::vector<double> te_rht_cols(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<double> y(x.size());
  for (int64_t k = 0; k < rows / 16; ++k)
    for (int64_t c = 0; c < cols; ++c)
      for (int n = 0; n < 16; ++n) {
        double s = 0;
        for (int i = 0; i < 16; ++i) s += double(x[size_t((16 * k + i) * cols + c)]) * kTeSigns[i] * hadamard(i, n);
        y[size_t((16 * k + n) * cols + c)] = s * 0.25;
      }
  return y;
}

std::vector<float> multiples_of_sixteenth(int64_t n, uint32_t seed) {  // k * 2^-4, |k| < 256
  std::mt19937 g(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = float(int(g() % 511) - 255) / 16.0f;
  return x;
}

}  // namespace

TEST_CASE("rht_signs te: TransformerEngine's fixed vector, mask 0xD7E8") {
  const std::array<float, 16> s = rht_signs(RhtSigns::te, 12345);
  for (int i = 0; i < 16; ++i) CHECK(s[size_t(i)] == float(kTeSigns[i]));
  CHECK(rht_signs(RhtSigns::philox, 7) == rht_signs(7));
}

TEST_CASE("rht_output bf16 with TE's signs: the quantizer sees bf16_rn(diag(s) H16 / 4 x)") {
  const int64_t rows = 64, cols = 24;
  const std::vector<float> x = multiples_of_sixteenth(rows * cols, 3);
  const std::vector<double> y = te_rht_cols(x, rows, cols);
  std::vector<float> yb(y.size());
  for (size_t i = 0; i < y.size(); ++i) yb[i] = ref::round_rn_sat(bfloat16, float(y[i]));  // exact in FP32, then BF16
  QuantizerSpec te = quantizer_by_name("nvfp4_col");
  te.rht = true;
  te.rht_signs = RhtSigns::te;
  te.rht_output = RhtOutput::bf16;
  const QuantizedTensor a = quantize(te, MatrixView<const float>(x.data(), rows, cols));
  const QuantizedTensor b = quantize(quantizer_by_name("nvfp4_col"), MatrixView<const float>(yb.data(), rows, cols));
  CHECK(a.codes == b.codes);
  CHECK(a.scale_codes == b.scale_codes);
  CHECK(float_bits(a.global_decode) == float_bits(b.global_decode));
  CHECK(a.dequant == b.dequant);
  int64_t rounded = 0;
  for (size_t i = 0; i < y.size(); ++i) rounded += double(yb[i]) != y[i];
  MESSAGE(rounded << " of " << y.size() << " transformed values changed by the BF16 rounding");
  CHECK(rounded > 0);
  // Without the rounding (rht_output f32) the transform is y itself.
  te.rht_output = RhtOutput::f32;
  const std::vector<float> dom = quantizer_domain(te, MatrixView<const float>(x.data(), rows, cols));
  int64_t bad = 0;
  for (size_t i = 0; i < y.size(); ++i) bad += double(dom[i]) != y[i];
  CHECK(bad == 0);
  // JSON: the keys round-trip, and are written only where set.
  te.rht_output = RhtOutput::bf16;
  const nlohmann::json j = quantizer_to_json(te);
  CHECK(j["rht_signs"] == "te");
  CHECK(j["rht_output"] == "bf16");
  CHECK(quantizer_from_json(j, "j") == te);
  CHECK_FALSE(quantizer_to_json(quantizer_by_name("nvfp4")).contains("rht_signs"));
  QuantizerSpec bad_spec = quantizer_by_name("nvfp4");
  bad_spec.rht_output = RhtOutput::bf16;
  CHECK_THROWS_WITH_AS(validate(bad_spec, "q"), doctest::Contains("need rht true"), Error);
}

TEST_CASE("te_fused_fast_math: rowwise on BF16 input and columnwise after TE's RHT, against a construction") {
  for (bool rht : {false, true}) {
    const int64_t rows = 48, cols = 32;
    std::vector<float> x = multiples_of_sixteenth(rows * cols, rht ? 11 : 12);
    for (int64_t c = 0; c < cols; ++c) x[size_t(5 * cols + c)] *= 1.0f / 1024;  // small blocks: scale range
    x[7] = -0.0f;
    QuantizerSpec q = quantizer_by_name(rht ? "nvfp4_col" : "nvfp4");
    q.emulate = Emulation::te_fused_fast_math;
    if (rht) {
      q.rht = true;
      q.rht_signs = RhtSigns::te;
    }
    const QuantizedTensor t = quantize(q, MatrixView<const float>(x.data(), rows, cols));
    std::vector<float> v(x.size());  // the values the kernel casts: BF16 input, or the RHT's exact FP32 sums
    if (rht) {
      const std::vector<double> y = te_rht_cols(x, rows, cols);
      for (size_t i = 0; i < y.size(); ++i) v[i] = float(y[i]);
    } else {
      v = x;
    }
    double amax = 0;
    for (float e : v) amax = std::max(amax, std::fabs(double(e)));
    const float a = ref::round_rn_sat(bfloat16, float(amax));  // the amax kernel's, over BF16 values
    const float s_enc = float(2688.0 / double(a)), g_dec = float(1.0 / double(s_enc));
    const float mult = float(double(s_enc) * double(float(1.0 / 6.0)));
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t bi = rht ? r / 16 : r, bj = rht ? c : c / 16;
        double vmax = 0;
        for (int64_t k = 0; k < 16; ++k) {
          const int64_t rr = rht ? bi * 16 + k : r, cc = rht ? c : bj * 16 + k;
          vmax = std::max(vmax, std::fabs(double(v[size_t(rr * cols + cc)])));
        }
        const float sdec = ref::round_rn_sat(float8_e4m3fn, double(float(vmax * double(mult))));
        const float qd = float(double(sdec) * double(g_dec));
        const float e = std::min(rcp_approx_ftz(qd), 3.4028234663852886e38f);
        const float y = float(double(v[size_t(r * cols + c)]) * double(e));
        const uint32_t code = ref::encode_rn_sat(float4_e2m1fn, y);
        bad += t.codes[size_t(r * cols + c)] != code;
        bad += t.scales[size_t(bi * t.scale_cols + bj)] != sdec;
        const float dq = float(double(float(ref::value_of(float4_e2m1fn, code) * double(sdec))) * double(g_dec));
        bad += float_bits(t.dequant[size_t(r * cols + c)]) != float_bits(dq);
      }
    INFO((rht ? "columnwise, RHT" : "rowwise"));
    CHECK(bad == 0);
    CHECK(float_bits(t.global_decode) == float_bits(g_dec));
  }
}

TEST_CASE("te_fused_fast_math: the rcp.approx factor changes codes against the default build (nv)") {
  std::mt19937 g(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(size_t(128 * 64));
  for (float& v : x) v = ref::round_rn_sat(bfloat16, u(g) * std::ldexp(1.0f, int(g() % 8)));
  QuantizerSpec fast = quantizer_by_name("nvfp4");
  fast.emulate = Emulation::te_fused_fast_math;
  const MatrixView<const float> v(x.data(), 128, 64);
  const QuantizedTensor a = quantize(fast, v), b = quantize(quantizer_by_name("nvfp4"), v);
  int64_t differ = 0;
  for (size_t i = 0; i < a.codes.size(); ++i) differ += a.codes[i] != b.codes[i];
  MESSAGE("te_fused_fast_math vs nv: " << differ << " of " << a.codes.size() << " codes differ");
  CHECK(a.scale_codes == b.scale_codes);
  CHECK(differ > 0);
}

TEST_CASE("te_fused_fast_math and te_fast_math with an RHT: the spec's checks") {
  QuantizerSpec q = quantizer_by_name("nvfp4_col");
  q.emulate = Emulation::te_fused_fast_math;
  q.rht = true;
  CHECK_NOTHROW(validate(q, "q"));
  q.rht_output = RhtOutput::bf16;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("rht_output must be 'f32'"), Error);
  q = quantizer_by_name("nvfp4_2d");
  q.emulate = Emulation::te_fused_fast_math;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("[1,16] or [16,1]"), Error);
  q = quantizer_by_name("nvfp4_col");
  q.emulate = Emulation::te_fast_math;
  q.rht = true;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("rht_output must be 'bf16'"), Error);
  q.rht_output = RhtOutput::bf16;
  CHECK_NOTHROW(validate(q, "q"));
  CHECK(quantizer_to_json(quantizer_from_json(quantizer_to_json(q), "j"))["emulate"] == "te_fast_math");
}
