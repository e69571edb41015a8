// Dequantized GEMM simulation with Eigen (gemm.hpp).
#include "sim/gemm.hpp"

#include <Eigen/Core>

#include "core/error.hpp"
#include "sim/gemm_tiled.hpp"

namespace fp4lab {

std::string_view accum_model_name(AccumModel m) {
  switch (m) {
    case AccumModel::fp32_eigen: return "fp32_eigen";
  }
  return "?";
}

namespace {
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using Map = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
}  // namespace

void gemm_nt(MatrixView<const float> a, MatrixView<const float> b, MatrixView<float> y, AccumModel) {
  if (a.cols != b.cols || y.rows != a.rows || y.cols != b.rows)
    throw Error("gemm_nt: shapes do not match: a [" + std::to_string(a.rows) + ", " + std::to_string(a.cols) +
                "], b [" + std::to_string(b.rows) + ", " + std::to_string(b.cols) + "], y [" + std::to_string(y.rows) +
                ", " + std::to_string(y.cols) + "] (want y [a.rows, b.rows], a.cols == b.cols)");
  ConstMap am(a.data, a.rows, a.cols, Eigen::OuterStride<>(a.stride));
  ConstMap bm(b.data, b.rows, b.cols, Eigen::OuterStride<>(b.stride));
  RowMat out;
  gemm_tiled(out, am, bm.transpose());
  Map ym(y.data, y.rows, y.cols, Eigen::OuterStride<>(y.stride));
  ym = out;
}

Tensor<float> quantized_gemm(const QuantizerSpec& qa, MatrixView<const float> a, const QuantizerSpec& qb,
                             MatrixView<const float> b, RandomStream rs_a, RandomStream rs_b, AccumModel model) {
  const QuantizedTensor ta = quantize(qa, a, rs_a);
  const QuantizedTensor tb = quantize(qb, b, rs_b);
  Tensor<float> y({a.rows, b.rows});
  gemm_nt(MatrixView<const float>(ta.dequant.data(), a.rows, a.cols),
          MatrixView<const float>(tb.dequant.data(), b.rows, b.cols), MatrixView<float>(y.data.data(), a.rows, b.rows),
          model);
  return y;
}

}  // namespace fp4lab
