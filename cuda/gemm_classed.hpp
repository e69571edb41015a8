// cuBLAS's BF16 GEMM with its algorithm chosen once per shape class.
//
// cublasGemmEx picks its kernel by the exact shape, and a shape it has not
// seen costs the heuristic on the host: on an H200 (CUDA 13.0, BF16 x BF16 ->
// FP32, n = 768, k = 384) 210 us a call when m is drawn from 1000..3000,
// against 10 us a call when 16 values of m recur (.oracle-style probe, logged
// in docs/log/2026-12-02-moe-grouped-and-routing.md). A mixture of experts pays
// it on every expert's GEMMs every step, since the experts' token counts change.
//
// ClassedGemm asks cuBLASLt's heuristic once per shape class and runs the
// answer on the actual shape. The class of a dimension v is v rounded up to
// a multiple of 2^(floor(log2 v) - 2) (four classes an octave; v <= 8 is its
// own class): 768 and 384 are their own classes, 2500 falls in 2560's. The
// key is (transa, transb, the classes of m, n and k, the three pointers'
// alignments up to 256 bytes, device or host scalars); the
// heuristic sees the class shape with leading dimensions at their minimum
// and the workspace of the Blas. The same shape runs the same algorithm every
// time (on one GPU model and cuBLAS version), so the bits repeat run to run;
// where an algorithm refuses the actual shape, the exact shape's own answer
// runs (and is kept).
//
// Semantics are cublasGemmEx's: column-major C [m, n] = alpha op(A) op(B) +
// beta C, A and B BF16, C FP32, FP32 accumulation (CUBLAS_COMPUTE_32F), on
// the Blas's stream and workspace. alpha/beta point to host floats, or to
// device floats with `device_scalars`. Errors throw (check_cublas).
#pragma once

#include <cstdint>
#include <map>
#include <tuple>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "cuda/gemm.hpp"

namespace fp4lab::cuda {

// The class of a GEMM dimension (see above).
int64_t gemm_shape_class(int64_t v);

class ClassedGemm {
 public:
  void bf16_f32(Blas& blas, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                const float* alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, const float* beta,
                float* c, int64_t ldc, bool device_scalars);
  // The same with C BF16 (the BF16 storage of a layer's output under bf16 activations): beta 0 (a host or
  // device zero), each element of C the round to nearest even of the FP32 alpha * sum, as the FP32-output
  // GEMM's then rounded (scripts/bf16_out_gemm_probe.cu found the two equal bit for bit on an H200 for alpha 1;
  // tests/train/cuda/test_bf16_storage.cpp checks the trainer's scaled NVFP4/MX GEMMs). bias (may be null): a
  // BF16 vector [m] added to every column by cuBLASLt's BIAS epilogue (the bias vector has D's type, here BF16)
  // before the rounding; not r(acc + bias) bit for bit for every algorithm (train/cuda/linear_impl.hpp
  // kBf16BiasEpilogue, which keeps the trainer's bias out of it).
  void bf16_bf16(Blas& blas, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                 const float* alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, const float* beta,
                 uint16_t* c, int64_t ldc, bool device_scalars, const uint16_t* bias);
  // Shape classes asked of the heuristic so far (tests, benches).
  size_t classes() const { return algos_.size(); }

 private:
  void run(Blas& blas, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
           const float* alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, const float* beta,
           void* c, cudaDataType_t ctype, int64_t ldc, bool device_scalars, const uint16_t* bias);
  // (transa, transb, the classes of m, n, k, the alignments of A, B, C, device scalars, the output form)
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int, int, int, bool, int>;
  std::map<Key, cublasLtMatmulAlgo_t> algos_;
};

}  // namespace fp4lab::cuda
