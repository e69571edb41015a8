// Host cost of cublasGemmEx when the shape changes every call (a mixture of experts' token counts) against a
// fixed shape and against 16 recurring shapes: BF16 x BF16 -> FP32, n = 768, k = 384, 3000 calls each.
// Build and run on a GPU machine: nvcc -O2 -arch=sm_90a scripts/cublas_shape_probe.cu -lcublas -o probe && ./probe
// (2026-12-02, H200, CUDA 13.0: fixed 38 us a call (GPU-bound), random m 1000..3000 210 us (host-bound: the
// heuristic for each new shape), 16 recurring m 10 us; docs/log/2026-12-02-moe-grouped-and-routing.md).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
int main() {
  cublasHandle_t h; cublasCreate(&h);
  const int n = 768, k = 384, maxm = 4096;
  void *a, *b, *c; cudaMalloc(&a, size_t(maxm) * k * 2); cudaMalloc(&b, size_t(n) * k * 2); cudaMalloc(&c, size_t(maxm) * n * 4);
  cudaMemset(a, 0, size_t(maxm) * k * 2); cudaMemset(b, 0, size_t(n) * k * 2);
  std::mt19937 g(1); std::uniform_int_distribution<int> d(1000, 3000);
  float one = 1, zero = 0;
  for (int mode = 0; mode < 3; ++mode) {
    const int calls = 3000;
    cudaDeviceSynchronize();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      const int m = mode == 0 ? 2048 : mode == 1 ? d(g) : 1000 + (i % 16) * 128;
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_16BF, k, a, CUDA_R_16BF, k, &zero, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    auto t1 = std::chrono::steady_clock::now();
    cudaDeviceSynchronize();
    auto t2 = std::chrono::steady_clock::now();
    printf("%s: host %.2f us/call, total %.2f us/call\n", mode == 0 ? "fixed m" : mode == 1 ? "random m 1000..3000" : "16 distinct m",
           std::chrono::duration<double, std::micro>(t1 - t0).count() / calls, std::chrono::duration<double, std::micro>(t2 - t0).count() / calls);
  }
  return 0;
}
