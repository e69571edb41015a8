// TetraJet double quantization (double_quant.hpp).
#include "sim/double_quant.hpp"

namespace fp4lab {

QuantizerSpec transposed_block(const QuantizerSpec& q) {
  QuantizerSpec t = q;
  t.block_rows = q.block_cols;
  t.block_cols = q.block_rows;
  return t;
}

QuantizedTensor double_quantize(const QuantizerSpec& first, const QuantizerSpec& second, MatrixView<const float> x,
                                RandomStream rs_first, RandomStream rs_second) {
  std::vector<float> stage(static_cast<size_t>(x.rows * x.cols));
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) stage[size_t(r * x.cols + c)] = x(r, c);
  MatrixView<float> sv(stage.data(), x.rows, x.cols);
  fake_quantize(first, sv, rs_first);
  return quantize(second, MatrixView<const float>(stage.data(), x.rows, x.cols), rs_second);
}

void fake_double_quantize(const QuantizerSpec& first, const QuantizerSpec& second, MatrixView<float> x,
                          RandomStream rs_first, RandomStream rs_second) {
  fake_quantize(first, x, rs_first);
  fake_quantize(second, x, rs_second);
}

}  // namespace fp4lab
