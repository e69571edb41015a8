// FP8 block scaling (schemes/fp8_block/scalar.hpp). The bit-exact proof against DeepGEMM's and
// TransformerEngine's own code is tests/cli/test_fp8_block.py (hashes of their outputs); here: each rule's
// scale against a float64 construction, partial blocks against the zero-padded tensor (DeepGEMM's and TE's
// padding, a different path) and TE's NaN-free amax.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "schemes/fp8_block/scalar.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;

namespace {

std::vector<float> amax_samples() {
  std::vector<float> v = {0.0f, 1e-30f, 1e-5f, 9.9999e-5f, 1e-4f, 1.0001e-4f, 1.0f, 448.0f, 3e38f, 0x1p-149f};
  std::mt19937 g(3);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t b = g() % 0x7F800000u;
    v.push_back(bits_float(b));
  }
  for (int k = -140; k < 128; ++k)
    for (int n = -2; n <= 2; ++n) {
      const float base = std::ldexp(448.0f, k);
      if (std::isfinite(base) && base > 0) v.push_back(bits_float(uint32_t(int64_t(float_bits(base)) + n)));
    }
  return v;
}

}  // namespace

TEST_CASE("fp8 block: each rule's scale against a float64 construction") {
  const float fmax = 448.0f;
  for (float a : amax_samples()) {
    // DeepGEMM: sf = fl(max(a, 1e-4) * fl(1/448)); ue8m0: the smallest power of two >= sf, in [2^-126, 2^127].
    const float clamped = std::max(a, 1e-4f);
    const float sf = float(double(clamped) * double(1.0f / fmax));  // one rounding of the exact product
    const Fp8BlockScale d = deepgemm_block_scale(a, fmax, false);
    CHECK(d.scale == sf);
    CHECK(d.mult == float(1.0 / double(sf)));
    int k = 0;
    const double m = std::frexp(double(sf), &k);
    const int up = m == 0.5 ? k - 1 : k;
    const Fp8BlockScale du = deepgemm_block_scale(a, fmax, true);
    CHECK(du.scale == float(std::ldexp(1.0, std::min(127, std::max(-126, up)))));
    CHECK(du.code == uint32_t(std::min(127, std::max(-126, up)) + 127));
    // TE: scale = fl(448 / a) (1 for 0), FLT_MAX for Inf; pow2: the largest power of two <= it.
    const Fp8BlockScale t = te_fp8_block_scale(a, fmax, false);
    const double q = a == 0 ? 1.0 : double(fmax) / double(a);
    const float s = q > double(flt_max_f) ? flt_max_f : float(q);
    CHECK(t.mult == s);
    CHECK(t.scale == float(1.0 / double(s)));
    const Fp8BlockScale tp = te_fp8_block_scale(a, fmax, true);
    CHECK(tp.mult == float(std::ldexp(1.0, int(std::floor(std::log2(double(s)))))));
    CHECK(bits_float(tp.code == 0 ? 0x00400000u : tp.code << 23) == tp.scale);
    // amax_div: sf = fl(a / 448), x / sf.
    CHECK(amax_div_block_scale(a, fmax).scale == float(double(a) / double(fmax)));
  }
  // The degenerate amaxes: TE's kernel gives scale 1 for 0, Inf and NaN.
  for (float a : {0.0f, INFINITY, NAN}) CHECK(te_fp8_block_scale(a, fmax, true).mult == 1.0f);
}

TEST_CASE("fp8 block: partial blocks equal the zero-padded tensor's quantization, cropped") {
  std::mt19937 g(11);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int64_t rows = 150, cols = 200, pr = 256, pc = 256;
  std::vector<float> x(size_t(rows * cols)), xp(size_t(pr * pc), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::ldexp(1.0f, int(g() % 30) - 15);
    for (int64_t c = 0; c < cols; ++c) xp[size_t(r * pc + c)] = x[size_t(r * cols + c)] = n(g) * mag;
  }
  for (const char* name : {"fp8_block_1x128", "fp8_block_128x128", "te_fp8_block_1x128", "te_fp8_block_128x128"})
    for (bool col : {false, true}) {
      QuantizerSpec q = quantizer_by_name(name);
      if (col) std::swap(q.block_rows, q.block_cols);
      const QuantizedTensor a = quantize(q, MatrixView<const float>(x.data(), rows, cols));
      const QuantizedTensor b = quantize(q, MatrixView<const float>(xp.data(), pr, pc));
      int64_t bad = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          bad += a.codes[size_t(r * cols + c)] != b.codes[size_t(r * pc + c)] ||
                 float_bits(a.dequant[size_t(r * cols + c)]) != float_bits(b.dequant[size_t(r * pc + c)]);
      for (int64_t i = 0; i < a.scale_rows; ++i)
        for (int64_t j = 0; j < a.scale_cols; ++j)
          bad +=
              float_bits(a.scales[size_t(i * a.scale_cols + j)]) != float_bits(b.scales[size_t(i * b.scale_cols + j)]);
      INFO(name, col ? " columns" : " rows");
      CHECK(bad == 0);
    }
}

TEST_CASE("fp8 block: DeepGEMM's zero blocks and TE's NaN-free amax") {
  std::vector<float> x(2 * 128, 0.0f);
  for (int c = 0; c < 128; ++c) x[size_t(128 + c)] = float(c) / 16.0f;
  x[size_t(128 + 3)] = NAN;
  const MatrixView<const float> v(x.data(), 2, 128);
  const QuantizedTensor dg = quantize(quantizer_by_name("fp8_block_1x128"), v);
  CHECK(dg.scales[0] == float(double(1e-4f) * double(1.0f / 448.0f)));  // zero row: amax clamped at 1e-4
  CHECK(std::isnan(dg.scales[1]));                                      // DeepGEMM's NaN propagates
  const QuantizedTensor te = quantize(quantizer_by_name("te_fp8_block_1x128"), v);
  CHECK(te.scales[0] == 1.0f);  // zero block: scale 1
  // NaN left out: amax 127/16, scale 2^floor(log2(448 * 16 / 127)) = 32, scale_inv 1/32.
  CHECK(te.scales[1] == 0.03125f);
  CHECK(std::isnan(te.dequant[size_t(128 + 3)]));
  CHECK(te.dequant[size_t(128 + 64)] == 4.0f);
}
