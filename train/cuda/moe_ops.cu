// Mixture-of-experts routing kernels (moe_ops.hpp).
#include "train/cuda/moe_ops.hpp"

#include "cuda/device.hpp"
#include "train/cuda/nn_device.cuh"

namespace fp4lab::cuda::nn {

namespace {

using detail::blocks_for;
using detail::kThreads;

__global__ void gather_indexed_kernel(const float* __restrict__ x, int64_t cols, const int32_t* __restrict__ idx,
                                      float* __restrict__ out, int64_t n) {
  const int64_t total = n * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    out[i] = idx[r] < 0 ? 0.0f : x[int64_t(idx[r]) * cols + c];
  }
}

__global__ void combine_kernel(const float* __restrict__ src, int64_t cols, const int32_t* __restrict__ pos,
                               const float* __restrict__ w, int64_t k, float* __restrict__ out, int64_t tokens) {
  const int64_t total = tokens * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / cols, c = i - t * cols;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      if (pos[t * k + j] < 0) continue;  // a dropped slot
      const float s = src[int64_t(pos[t * k + j]) * cols + c];
      acc = w ? acc + w[t * k + j] * s : acc + s;
    }
    out[i] = acc;
  }
}

__global__ void combine_dsrc_kernel(const float* __restrict__ dout, int64_t cols, const int32_t* __restrict__ pos,
                                    const float* __restrict__ w, int64_t k, int64_t slots, float* __restrict__ dsrc) {
  const int64_t total = slots * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / cols, c = i - s * cols;
    if (pos[s] >= 0) dsrc[int64_t(pos[s]) * cols + c] = w[s] * dout[(s / k) * cols + c];
  }
}

__global__ void combine_dw_kernel(const float* __restrict__ dout, const float* __restrict__ src, int64_t cols,
                                  const int32_t* __restrict__ pos, int64_t k, int64_t slots, float* __restrict__ dw) {
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < slots; s += int64_t(gridDim.x) * blockDim.x) {
    if (pos[s] < 0) {
      dw[s] = 0.0f;
      continue;
    }
    const float* g = dout + (s / k) * cols;
    const float* x = src + int64_t(pos[s]) * cols;
    double acc = 0.0;
    for (int64_t c = 0; c < cols; ++c) acc += double(g[c]) * double(x[c]);
    dw[s] = float(acc);
  }
}

}  // namespace

void gather_rows_indexed(const float* x, int64_t cols, const int32_t* idx, float* out, int64_t n, cudaStream_t st) {
  if (n <= 0 || cols <= 0) return;
  gather_indexed_kernel<<<blocks_for(n * cols), kThreads, 0, st>>>(x, cols, idx, out, n);
  check_launch("gather_indexed_kernel");
}

void combine_rows(const float* src, int64_t cols, const int32_t* pos, const float* w, int64_t k, float* out,
                  int64_t tokens, cudaStream_t st) {
  if (tokens <= 0 || cols <= 0) return;
  combine_kernel<<<blocks_for(tokens * cols), kThreads, 0, st>>>(src, cols, pos, w, k, out, tokens);
  check_launch("combine_kernel");
}

void combine_rows_backward(const float* dout, const float* src, int64_t cols, const int32_t* pos, const float* w,
                           int64_t k, int64_t tokens, float* dsrc, int64_t src_rows, bool all_named, float* dw,
                           cudaStream_t st) {
  const int64_t slots = tokens * k;
  if (!all_named && src_rows * cols > 0)
    check(cudaMemsetAsync(dsrc, 0, size_t(src_rows * cols) * sizeof(float), st), "combine_rows_backward (zero dsrc)");
  if (slots <= 0 || cols <= 0) return;
  combine_dsrc_kernel<<<blocks_for(slots * cols), kThreads, 0, st>>>(dout, cols, pos, w, k, slots, dsrc);
  check_launch("combine_dsrc_kernel");
  combine_dw_kernel<<<blocks_for(slots, 128), 128, 0, st>>>(dout, src, cols, pos, k, slots, dw);
  check_launch("combine_dw_kernel");
}

}  // namespace fp4lab::cuda::nn
