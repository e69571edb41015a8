// Dequantized GEMM simulation ("fake quantization"): y = dq(A) dq(B)^T in FP32.
//
// Operands are row-major A [m, k] and B [n, k] (both blocked along k, the
// reduction axis, as the hardware GEMM consumes them). dq() is the exact FP32
// dequantized tensor of sim/quantizer.hpp (for NVFP4 including the global
// decode scale; with RHT, in the transformed domain: transforming both
// operands along k preserves the product). The product is formed with Eigen in
// FP32.
//
// Accumulation model (named, because it decides the low bits of y):
//   fp32_eigen  every product dq(a) * dq(b) rounded to FP32, summed in FP32 in
//               Eigen 3.4's blocked GEMM order within fixed output tiles
//               (sim/gemm_tiled.hpp; the order depends on Eigen's version and
//               SIMD width, not on the number of threads). The trainer's CPU
//               linear layer uses the same GEMM. Not the accumulation order of
//               a tensor-core GEMM: compare with hardware at a tolerance, never
//               bitwise.
#pragma once

#include <string_view>

#include "core/tensor.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

enum class AccumModel : uint8_t { fp32_eigen };
std::string_view accum_model_name(AccumModel m);

// y [m, n] = a [m, k] * b [n, k]^T, FP32 (no quantization).
void gemm_nt(MatrixView<const float> a, MatrixView<const float> b, MatrixView<float> y,
             AccumModel model = AccumModel::fp32_eigen);

// Quantizes a with qa and b with qb (blocks along k), then y = dq(a) dq(b)^T.
Tensor<float> quantized_gemm(const QuantizerSpec& qa, MatrixView<const float> a, const QuantizerSpec& qb,
                             MatrixView<const float> b, RandomStream rs_a = {}, RandomStream rs_b = {},
                             AccumModel model = AccumModel::fp32_eigen);

}  // namespace fp4lab
