// Small kernels of the trainer's quantized linear layer
// (train/cuda/linear.hpp): bfloat16 operands, bias and the
// GEMM scalars. Device pointers; asynchronous on `stream`.
#pragma once

#include <cstdint>
#include <span>

#include <cuda_runtime.h>

#include "cuda/device.hpp"

namespace fp4lab::cuda {

// bits[i] = bfloat16 code of x[i], round-to-nearest-even, Inf/NaN kept
// (core's encode_rn_f32<bfloat16>(x, nonsaturate): the CPU layer's bf16 rounding).
void round_bf16_device(const float* x, int64_t n, uint16_t* bits, cudaStream_t stream = nullptr);

// round_bf16_device(src, n, dst) of every slice, kBf16SlicesPerLaunch slices a
// launch (a grouped linear's groups: one launch for up to that many).
struct Bf16Slice {
  const float* src = nullptr;
  uint16_t* dst = nullptr;
  int64_t n = 0;
};
inline constexpr int kBf16SlicesPerLaunch = 64;
void round_bf16_slices_device(std::span<const Bf16Slice> slices, cudaStream_t stream = nullptr);

// out[i] = decode(bfloat16, bits[i]) * (*scale) in FP32 (one multiply, RN); a
// null `scale` (device pointer) means no multiply. With bits a quantizer's BF16
// GEMM operand (decode(code) * block_scale, exact) and scale its g_dec, this is
// the quantizer's FP32 dequantized value bit for bit.
void bf16_to_f32_device(const uint16_t* bits, int64_t n, const float* scale, float* out, cudaStream_t stream = nullptr);

// y[r, c] += b[c] for a row-major [rows, cols] y (one FP32 add per element).
void add_bias_device(float* y, const float* b, int64_t rows, int64_t cols, cudaStream_t stream = nullptr);
// The BF16-activation form (train/backend.hpp): y[r, c] = r(y[r, c] + r(b[c])), r() the round to the nearest BF16
// (ties to even) widened back, as decode(bfloat16, encode_rn_f32<bfloat16>(v)).
void add_bias_bf16_device(float* y, const float* b, int64_t rows, int64_t cols, cudaStream_t stream = nullptr);

// Its BF16-storage form: out[r, c] = the BF16 bits of r(y[r, c] + r(b[c])) (b null: of r(y[r, c])), y left
// unchanged: the bits add_bias_bf16_device (round_bf16_inplace) leaves in y, in BF16.
void bias_round_bf16_device(const float* y, const float* b, int64_t rows, int64_t cols, uint16_t* out,
                            cudaStream_t stream = nullptr);

// out[0] = (ga ? *ga : 1) * (gb ? *gb : 1), out[1] = beta: the {alpha, beta}
// of a GEMM in cuBLAS's device pointer mode.
void alpha_beta_device(const float* ga, const float* gb, float beta, float* out, cudaStream_t stream = nullptr);

}  // namespace fp4lab::cuda
