// The quantized linear layer y = x W^T + b (CPU reference), forward and
// backward, computing its three GEMMs on the recipe's fake-quantized operands
// (dequantized exactly to FP32, multiplied with Eigen in FP32: accumulation
// model "fp32_eigen", see sim/gemm.hpp).
//
// Shapes (row-major): x [B, in], W [out, in], b [out], y [B, out].
// Stochastic rounding streams: every quantization draws from
//   RandomStream{seed, stream_id(layer_id, operand, step)}
// so runs are reproducible per layer, per operand and per step.
#pragma once

#include <cstdint>
#include <string>

#include <Eigen/Core>

#include "recipes/recipe.hpp"

namespace fp4lab {

using MatrixRM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

uint64_t stream_id(uint64_t layer_id, Operand op, uint64_t step);

struct LinearContext {
  const Recipe* recipe = nullptr;  // nullptr or a keep-high-precision layer = plain FP32
  uint64_t seed = 0;
  uint64_t layer_id = 0;
  uint64_t step = 0;
};

// Forward. Keeps what backward needs in `saved` (the quantized operands when
// the recipe needs them again).
struct LinearSaved {
  MatrixRM x;  // input as given (backward re-quantizes it for wgrad)
};
void linear_forward(const LinearContext& ctx, const MatrixRM& x, const MatrixRM& w, const float* bias /*[out] or null*/,
                    MatrixRM& y, LinearSaved& saved);
// Backward: given dy [B, out], writes dx [B, in], dW [out, in] and db [out]
// (db may be null; dx/dW are resized).
void linear_backward(const LinearContext& ctx, const LinearSaved& saved, const MatrixRM& w, const MatrixRM& dy,
                     MatrixRM& dx, MatrixRM& dw, float* db);

}  // namespace fp4lab
