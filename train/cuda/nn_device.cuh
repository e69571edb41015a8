// Device helpers shared by the trainer's kernels (cuda/nn.cu, cuda/attention.cu):
// launch shapes, the fixed-order warp reductions, the dropout rule of one
// element and the BF16 rounding of companions. Internal to cuda/; include only
// from .cu files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/philox.hpp"

namespace fp4lab::cuda::nn::detail {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

// The BF16 companion of a float (Tensor::bf16 of the trainer): round to
// nearest even, as round_bf16_device.
__device__ __forceinline__ uint32_t bf16_rn(float v) { return encode_rn_f32<bfloat16>(v, Overflow::nonsaturate); }

inline void check_cublas_status(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuBLAS error in ") + what + ": " + cublasGetStatusString(s));
}

// 1-D grid of `threads` over n items (grid-stride loops cover the rest).
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(std::clamp<int64_t>(b, 1, 1 << 20));
}

// Warp-per-row launch shape.
inline unsigned warp_blocks(int64_t rows) {
  const int64_t per = kThreads / kWarp;
  return unsigned(std::max<int64_t>(1, (rows + per - 1) / per));
}

// The xor butterfly leaves the same value in every lane (IEEE addition is
// commutative, so lane i and lane i^m add the same two numbers), in a fixed order.
__device__ __forceinline__ double warp_sum(double v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, m);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, m));
  return v;
}

// The dropout rule of one element (random word `word`), as the CPU's: dropped
// iff word < thr (nn::dropout_threshold), kept ones scaled by 1 / (1 - p).
__device__ __forceinline__ float drop1(float v, uint32_t word, uint32_t thr, float keep_scale) {
  return word < thr ? 0.0f : v * keep_scale;
}

// The same for the four elements of one Philox group.
__device__ __forceinline__ float4 drop4(float4 v, const Philox4& r, uint32_t thr, float keep_scale) {
  return make_float4(drop1(v.x, r.v[0], thr, keep_scale), drop1(v.y, r.v[1], thr, keep_scale),
                     drop1(v.z, r.v[2], thr, keep_scale), drop1(v.w, r.v[3], thr, keep_scale));
}
__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace fp4lab::cuda::nn::detail
