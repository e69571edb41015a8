// The BF16 gradient reduction's kernels (grad_reduce_ops.hpp).
#include "train/cuda/grad_reduce_ops.hpp"

#include "cuda/device.hpp"
#include "train/bf16_codes.hpp"
#include "train/cuda/nn_device.cuh"

namespace fp4lab::cuda::nn {

namespace {

using detail::kThreads;

__global__ void round_bf16_codes_kernel(const float* __restrict__ x, int64_t n, uint16_t* __restrict__ codes) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    codes[i] = train::reduce_bf16_code(x[i]);
}

// Thread i reads code i of every row: each row's reads are coalesced.
__global__ void sum_bf16_codes_kernel(const uint16_t* __restrict__ codes, int64_t rows, int64_t k,
                                      float* __restrict__ out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < k; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = train::reduce_bf16_sum(codes, rows, k, i);
}

}  // namespace

void round_bf16_codes(const char* what, const float* x, int64_t n, uint16_t* codes, int64_t code_bytes,
                      cudaStream_t st) {
  train::check_bf16_codes(what, code_bytes, 1, n);
  if (n <= 0) return;
  round_bf16_codes_kernel<<<detail::blocks_for(n), kThreads, 0, st>>>(x, n, codes);
  check_launch("round_bf16_codes_kernel");
}

void sum_bf16_codes(const char* what, const uint16_t* codes, int64_t code_bytes, int64_t rows, int64_t k, float* out,
                    cudaStream_t st) {
  train::check_bf16_codes(what, code_bytes, rows, k);
  if (k <= 0) return;
  sum_bf16_codes_kernel<<<detail::blocks_for(k), kThreads, 0, st>>>(codes, rows, k, out);
  check_launch("sum_bf16_codes_kernel");
}

}  // namespace fp4lab::cuda::nn
