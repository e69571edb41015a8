// CUDA benchmarks called from the `fp4lab bench` CLI (apps/). Only compiled when
// the CUDA backend is built: callers include this under #ifdef FP4LAB_WITH_CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp4lab::cuda {

// `fp4lab bench quantize --backend cuda`.
// Quantizes a rows x cols row-major tensor (random normal data, generated on the
// device) with each quantizer in `quantizers` (canned names such as "mxfp4",
// "nvfp4", "nvfp4_2d", or JSON quantizer objects, as accepted by sim's
// parse_quantizer), once with a BF16 input and once with an FP32 input.
// Prints, per quantizer and input type, the median kernel time over `repeats`
// timed launches (after warm-up, cudaEvent timing), the effective bandwidth
// (bytes read + bytes written, GB/s) and that bandwidth as a fraction of a
// device-to-device cudaMemcpy of the same input measured in the same run.
// An empty `quantizers` list means every canned quantizer.
// Returns 0 on success; throws fp4lab::Error on a bad quantizer or when no GPU
// is present (the message says so).
int bench_quantize(int64_t rows, int64_t cols, const std::vector<std::string>& quantizers, int repeats);

// `fp4lab bench gemm --backend cuda`: TFLOP/s of cuBLAS BF16, the NVFP4/MXFP4
// simulated GEMMs (quantize both operands + dequantize + BF16 tensor-core GEMM)
// and the MXFP8 GEMM at m x n x k, all in the same run. Returns 0 on success.
int bench_gemm(int64_t m, int64_t n, int64_t k, int repeats);

// `fp4lab bench grouped-gemm --backend cuda` (bench_grouped.cu): a mixture of
// experts' forward product y_g = x_g W_g^T (K = N = hidden) for every
// combination of `experts`, `tokens` and `hidden`, with balanced and skewed
// (Zipf-like, some experts empty, fixed seed) tokens per expert: median ms and
// TFLOP/s of (a) cuBLAS's grouped BF16 GEMM (one cublasGemmGroupedBatchedEx),
// (b) a loop of per-expert cuBLAS GEMMs, (c) fp4lab's NVFP4 grouped
// quantization of x (nvfp4 per expert's tokens) and W (nvfp4_2d per expert) +
// the grouped GEMM of (a) on the exact BF16 operands, (c)'s GEMM alone, and
// (c)/(a). `out`: "bf16" or "f32" output. Returns 0; throws fp4lab::Error
// without a GPU (the message says so).
int bench_grouped_gemm(const std::vector<int64_t>& experts, const std::vector<int64_t>& tokens,
                       const std::vector<int64_t>& hidden, const std::string& out, int repeats);

// `fp4lab bench attention --backend cuda`: the trainer's attention (nn::Attention)
// at batch x seq x heads x head_dim, forward and backward, on the fused FP32
// kernels and on the cuBLAS (pedantic SGEMM) path, in one run. Prints the median
// ms of each and its TFLOP/s counting only the products a causal mask leaves
// (4 B H hd T(T+1)/2 forward, twice that backward; T^2 without the mask).
// Returns 0 on success; throws fp4lab::Error without a GPU.
int bench_attention(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, bool causal, float dropout,
                    int repeats);

}  // namespace fp4lab::cuda
