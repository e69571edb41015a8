// emulate 'te_reference' (schemes/te_nvfp4/reference.hpp): TE's Python reference quantizer is the standard nv
// rule except for an all-zero tensor's global scale (fl(1 / FLT_MAX) = 2^-128) and a -0 product (code 0x0).
// Checked here against the standard rule on general data and on those two cases; TE's own reference quantizer is
// the oracle (tests/cli/test_te_nvfp4.py, every case bit-equal under te_reference).
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;

namespace {

QuantizerSpec reference_of(QuantizerSpec q) {
  q.emulate = Emulation::te_reference;
  return q;
}

QuantizerSpec col_rht() {
  QuantizerSpec q = quantizer_by_name("nvfp4_col");
  q.rht = true;
  q.rht_signs = RhtSigns::te;
  q.rht_output = RhtOutput::bf16;
  return q;
}

}  // namespace

TEST_CASE("te_reference: the standard nv rule on general data, [1,16], [16,1], [16,16] and TE's RHT") {
  std::mt19937 g(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const QuantizerSpec& base :
       {quantizer_by_name("nvfp4"), quantizer_by_name("nvfp4_col"), quantizer_by_name("nvfp4_2d"), col_rht()}) {
    const int64_t rows = 48, cols = 80;
    std::vector<float> x(size_t(rows * cols));
    for (size_t i = 0; i < x.size(); ++i) x[i] = nd(g) * std::ldexp(1.0f, int(i / 16 % 9) - 4);
    const MatrixView<const float> v(x.data(), rows, cols);
    const QuantizedTensor a = quantize(base, v), b = quantize(reference_of(base), v);
    CHECK(a.codes == b.codes);
    CHECK(a.scale_codes == b.scale_codes);
    CHECK(float_bits(a.global_decode) == float_bits(b.global_decode));
    int64_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) bad += float_bits(a.dequant[i]) != float_bits(b.dequant[i]);
    CHECK(bad == 0);
  }
}

TEST_CASE("te_reference: an all-zero tensor's global scale 2^-128 and -0 written as code 0") {
  const std::vector<float> zeros(64, 0.0f);
  const QuantizedTensor z =
      quantize(reference_of(quantizer_by_name("nvfp4")), MatrixView<const float>(zeros.data(), 2, 32));
  CHECK(float_bits(z.global_decode) == 0x00200000u);  // 2^-128, a subnormal: fl(1 / FLT_MAX)
  CHECK(float_bits(quantize(quantizer_by_name("nvfp4"), MatrixView<const float>(zeros.data(), 2, 32)).global_decode) ==
        float_bits(1.0f));
  for (uint32_t c : z.codes) CHECK(c == 0u);
  // -0.0 inputs, and a negative input whose product underflows to -0 beside a huge one.
  std::vector<float> x(32, 1.0f);
  x[3] = -0.0f;
  x[20] = -1e-45f;
  x[21] = 1e30f;
  const MatrixView<const float> v(x.data(), 1, 32);
  const QuantizedTensor s = quantize(quantizer_by_name("nvfp4"), v);
  const QuantizedTensor r = quantize(reference_of(quantizer_by_name("nvfp4")), v);
  CHECK(s.codes[3] == 8u);
  CHECK(r.codes[3] == 0u);
  CHECK(s.codes[20] == 8u);
  CHECK(r.codes[20] == 0u);
  CHECK(float_bits(r.dequant[3]) == 0u);
  for (size_t i = 0; i < x.size(); ++i)
    if (i != 3 && i != 20) CHECK(s.codes[i] == r.codes[i]);
}

TEST_CASE("te_reference: the spec's checks") {
  QuantizerSpec q = reference_of(quantizer_by_name("nvfp4"));
  CHECK_NOTHROW(validate(q, "q"));
  q.round = Round::rs;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("round must be rn"), Error);
  q = reference_of(quantizer_by_name("mxfp4"));
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("scale must be ue4m3"), Error);
  q = reference_of(quantizer_by_name("nvfp4"));
  q.block_cols = 32;
  CHECK_THROWS_AS(validate(q, "q"), Error);
  CHECK(quantizer_to_json(reference_of(quantizer_by_name("nvfp4_2d")))["emulate"] == "te_reference");
}
