// The kernels of distributed.reduce "bf16" on the CUDA backend (Backend::round_bf16_codes and sum_bf16_codes;
// train/dist/grad_reduce.hpp states the reduction): train/bf16_codes.hpp's element rules, one thread an
// element, so the codes and sums are the CPU backend's bit for bit. Device pointers; the checks of the sizes
// (check_bf16_codes) run on the host first, naming `what`.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace fp4lab::cuda::nn {

// codes[i] = reduce_bf16_code(x[i]) for i < n; `code_bytes`: the bytes at codes.
void round_bf16_codes(const char* what, const float* x, int64_t n, uint16_t* codes, int64_t code_bytes,
                      cudaStream_t stream = nullptr);
// out[i] = reduce_bf16_sum(codes, rows, k, i) for i < k: rank r's code of element i at codes[r k + i].
void sum_bf16_codes(const char* what, const uint16_t* codes, int64_t code_bytes, int64_t rows, int64_t k, float* out,
                    cudaStream_t stream = nullptr);

}  // namespace fp4lab::cuda::nn
