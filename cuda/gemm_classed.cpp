// ClassedGemm (gemm_classed.hpp).
#include "cuda/gemm_classed.hpp"

#include <algorithm>
#include <bit>
#include <string>

#include "core/error.hpp"

namespace fp4lab::cuda {

int64_t gemm_shape_class(int64_t v) {
  if (v <= 8) return v;
  const int64_t step = int64_t(1) << (std::bit_width(uint64_t(v)) - 1 - 2);
  return (v + step - 1) / step * step;
}

namespace {

// The alignment of p in bytes, up to 256.
int alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256 : int(std::min<uintptr_t>(a & (~a + 1), 256));
}

// One matmul's descriptors (destroyed with the object).
struct LtDesc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  // ctype: C's (and D's) type; bias (CUDA_R_16BF output only): the BIAS epilogue's vector [m], of C's type.
  LtDesc(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
         int64_t ldc, bool device_scalars, cudaDataType_t ctype = CUDA_R_32F, const void* bias = nullptr) {
    try {
      check_cublas(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
      check_cublas(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
      check_cublas(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
      const cublasLtPointerMode_t pm = device_scalars ? CUBLASLT_POINTER_MODE_DEVICE : CUBLASLT_POINTER_MODE_HOST;
      check_cublas(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm),
                   "POINTER_MODE");
      // Stored (column-major) shapes: op(A) is [m, k], so A is [m, k] or [k, m]; likewise B.
      const bool at = ta != CUBLAS_OP_N, bt = tb != CUBLAS_OP_N;
      check_cublas(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, uint64_t(at ? k : m), uint64_t(at ? m : k), lda),
                   "cublasLtMatrixLayoutCreate A");
      check_cublas(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, uint64_t(bt ? n : k), uint64_t(bt ? k : n), ldb),
                   "cublasLtMatrixLayoutCreate B");
      check_cublas(cublasLtMatrixLayoutCreate(&lc, ctype, uint64_t(m), uint64_t(n), ldc),
                   "cublasLtMatrixLayoutCreate C");
      if (bias) {
        const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        check_cublas(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep), "EPILOGUE");
        check_cublas(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                     "BIAS_POINTER");
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ~LtDesc() { release(); }
  LtDesc(const LtDesc&) = delete;
  LtDesc& operator=(const LtDesc&) = delete;
  void release() {
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    lc = lb = la = nullptr;
    op = nullptr;
  }
};

// The heuristic's first algorithm for d within blas's workspace and the given alignments.
cublasLtMatmulAlgo_t first_algo(Blas& blas, const LtDesc& d, int align_a, int align_b, int align_c) {
  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const size_t wsb = blas.workspace_bytes();
  const uint32_t aa = uint32_t(align_a), ab = uint32_t(align_b), ac = uint32_t(align_c);
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(blas.lt(), d.op, d.la, d.lb, d.lc, d.lc, pref, 1, &heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check_cublas(st, "cuBLASLt heuristic (classed BF16 GEMM)");
  if (found == 0) throw InternalError("internal error: cuBLASLt found no BF16 matmul algorithm for this shape");
  return heur.algo;
}

}  // namespace

void ClassedGemm::bf16_f32(Blas& blas, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                           const float* alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                           const float* beta, float* c, int64_t ldc, bool device_scalars) {
  run(blas, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, CUDA_R_32F, ldc, device_scalars, nullptr);
}

void ClassedGemm::bf16_bf16(Blas& blas, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                            const float* alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                            const float* beta, uint16_t* c, int64_t ldc, bool device_scalars, const uint16_t* bias) {
  run(blas, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, CUDA_R_16BF, ldc, device_scalars, bias);
}

void ClassedGemm::run(Blas& blas, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                      const float* alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                      const float* beta, void* c, cudaDataType_t ctype, int64_t ldc, bool device_scalars,
                      const uint16_t* bias) {
  const int aa = alignment(a), ab = alignment(b), ac = alignment(c);
  const int64_t mc = gemm_shape_class(m), nc = gemm_shape_class(n), kc = gemm_shape_class(k);
  // The output form (type, bias and the bias's alignment) is part of the key: another epilogue, another algorithm.
  const int form = int(ctype) * 1024 + (bias ? 512 + alignment(bias) : 0);
  const Key key{int(ta), int(tb), mc, nc, kc, aa, ab, ac, device_scalars, form};
  const LtDesc d(ta, tb, m, n, k, lda, ldb, ldc, device_scalars, ctype, bias);
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    const bool at = ta != CUBLAS_OP_N, bt = tb != CUBLAS_OP_N;
    const LtDesc dc(ta, tb, mc, nc, kc, at ? kc : mc, bt ? nc : kc, mc, device_scalars, ctype, bias);
    it = algos_.emplace(key, first_algo(blas, dc, aa, ab, ac)).first;
  }
  cublasStatus_t st = cublasLtMatmul(blas.lt(), d.op, alpha, a, d.la, b, d.lb, beta, c, d.lc, c, d.lc, &it->second,
                                     blas.workspace(), blas.workspace_bytes(), blas.stream());
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    // The class's algorithm refuses this shape: the shape's own (kept under its exact key).
    const Key exact{int(ta), int(tb), -m, -n, -k, aa, ab, ac, device_scalars, form};
    auto e = algos_.find(exact);
    if (e == algos_.end()) e = algos_.emplace(exact, first_algo(blas, d, aa, ab, ac)).first;
    st = cublasLtMatmul(blas.lt(), d.op, alpha, a, d.la, b, d.lb, beta, c, d.lc, c, d.lc, &e->second,
                        blas.workspace(), blas.workspace_bytes(), blas.stream());
  }
  check_cublas(st, "cublasLtMatmul (classed BF16 GEMM, fp32 accumulation)");
}

}  // namespace fp4lab::cuda
