// TetraJet double quantization (sim/double_quant.hpp).
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "sim/double_quant.hpp"

using namespace fp4lab;

TEST_CASE("double quantization: [1,32] then [32,1] from the dequantized tensor") {
  // Hand-worked 2 x 2 case with [1,2] then [2,1] blocks, mxfp4 elements:
  //   x = [[6, 1.2], [0.3, 0.7]]
  //   stage 1 (rows): row 0 amax 6 -> e = 0: [6, 1.0]; row 1 amax 0.7 -> e = -3: [0.3*8 = 2.4 -> 2, 0.7*8 = 5.6 -> 6] /
  //   8 = [0.25, 0.75] stage 2 (cols): col 0 = [6, 0.25], amax 6 -> e = 0: 0.25 -> tie 0/0.5 -> 0: [6, 0];
  //                   col 1 = [1.0, 0.75], amax 1 -> e = -2: [4, 3] / 4 = [1.0, 0.75]
  QuantizerSpec first = quantizer_by_name("mxfp4");
  first.block_cols = 2;
  const QuantizerSpec second = transposed_block(first);
  CHECK(second.block_rows == 2);
  CHECK(second.block_cols == 1);
  std::vector<float> x = {6.0f, 1.2f, 0.3f, 0.7f};
  QuantizedTensor q = double_quantize(first, second, MatrixView<const float>(x.data(), 2, 2));
  CHECK(q.dequant == std::vector<float>{6.0f, 1.0f, 0.0f, 0.75f});
  std::vector<float> f = x;
  fake_double_quantize(first, second, MatrixView<float>(f.data(), 2, 2));
  CHECK(f == q.dequant);
}

TEST_CASE("double quantization is idempotent under the second quantizer (ocp, RN)") {
  std::mt19937 g(1);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(64 * 96);
  for (auto& v : x) v = n(g);
  const QuantizerSpec first = quantizer_by_name("mxfp4");
  const QuantizerSpec second = transposed_block(first);
  QuantizedTensor q = double_quantize(first, second, MatrixView<const float>(x.data(), 64, 96));
  QuantizedTensor again = quantize(second, MatrixView<const float>(q.dequant.data(), 64, 96));
  CHECK(again.dequant == q.dequant);
  CHECK(again.codes == q.codes);
}
