// Does cuBLAS's BF16-output GEMM give the BF16 rounding (RNE) of its FP32-output GEMM? The question behind
// BF16 storage of GEMM outputs under precision.activations "bf16" (y = r(acc), dx = r(acc): docs/DESIGN.md,
// "BF16 activations"): if D_bf16 == r(D_f32) bit for bit, a GEMM writing BF16 keeps today's bits and drops
// the rounding pass. Shapes: the trainer's GEMMs at gpt_shakespeare_char (N = 16384 tokens, C = 384) and
// gpt2_small_char (N = 8192, C = 768), forward (y^T = W x^T), dgrad and wgrad forms; BF16 operands drawn from
// N(0,1); cuBLASLt with the heuristic's first answer for each output type (the trainer's ClassedGemm asks
// Lt), and cublasGemmEx. Prints, per shape and API: elements differing, the largest difference in BF16 ulps,
// whether the two heuristics chose the same algorithm id, and the time of each GEMM.
// Build and run on a GPU machine: nvcc -O2 -std=c++17 -arch=sm_90a scripts/bf16_out_gemm_probe.cu -lcublasLt -lcublas -o probe && ./probe
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

static uint16_t rne(float f) {  // FP32 -> BF16, round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static float widen(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
#define CK(x) do { auto e_ = (x); if (int(e_) != 0) { std::printf("%s failed (%d) at line %d\n", #x, int(e_), __LINE__); return 1; } } while (0)

struct Shape { const char* name; cublasOperation_t ta, tb; int m, n, k; };

int main() {
  const Shape shapes[] = {
      {"shakespeare c_attn fwd", CUBLAS_OP_T, CUBLAS_OP_N, 1152, 16384, 384},
      {"shakespeare c_fc fwd", CUBLAS_OP_T, CUBLAS_OP_N, 1536, 16384, 384},
      {"shakespeare mlp_proj fwd", CUBLAS_OP_T, CUBLAS_OP_N, 384, 16384, 1536},
      {"shakespeare mlp_proj dgrad", CUBLAS_OP_N, CUBLAS_OP_N, 1536, 16384, 384},
      {"shakespeare c_fc wgrad", CUBLAS_OP_N, CUBLAS_OP_T, 384, 1536, 16384},
      {"gpt2 c_fc fwd", CUBLAS_OP_T, CUBLAS_OP_N, 3072, 8192, 768},
      {"gpt2 mlp_proj fwd", CUBLAS_OP_T, CUBLAS_OP_N, 768, 8192, 3072},
      {"gpt2 c_attn dgrad", CUBLAS_OP_N, CUBLAS_OP_N, 768, 8192, 2304},
      {"odd 1000x777x333", CUBLAS_OP_T, CUBLAS_OP_N, 1000, 777, 336},
  };
  cublasLtHandle_t lt;
  cublasHandle_t h;
  CK(cublasLtCreate(&lt));
  CK(cublasCreate(&h));
  void* ws;
  const size_t ws_bytes = size_t(64) << 20;
  CK(cudaMalloc(&ws, ws_bytes));
  CK(cublasSetWorkspace(h, ws, ws_bytes));
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  int bad_total = 0;
  for (const Shape& s : shapes) {
    const int64_t arows = s.ta == CUBLAS_OP_N ? s.m : s.k, acols = s.ta == CUBLAS_OP_N ? s.k : s.m;
    const int64_t brows = s.tb == CUBLAS_OP_N ? s.k : s.n, bcols = s.tb == CUBLAS_OP_N ? s.n : s.k;
    std::vector<uint16_t> ha(size_t(arows * acols)), hb(size_t(brows * bcols));
    for (auto& v : ha) v = rne(nd(g));
    for (auto& v : hb) v = rne(nd(g));
    void *a, *b, *cf, *ch;
    CK(cudaMalloc(&a, ha.size() * 2));
    CK(cudaMalloc(&b, hb.size() * 2));
    CK(cudaMalloc(&cf, size_t(s.m) * s.n * 4));
    CK(cudaMalloc(&ch, size_t(s.m) * s.n * 2));
    CK(cudaMemcpy(a, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
    const float one = 1.f, zero = 0.f;
    for (int api = 0; api < 2; ++api) {
      float ms[2] = {0, 0};
      int algo_id[2] = {-1, -1};
      for (int out = 0; out < 2; ++out) {  // 0: FP32 D, 1: BF16 D
        void* c = out ? ch : cf;
        const cudaDataType_t ct = out ? CUDA_R_16BF : CUDA_R_32F;
        auto run = [&]() -> int {
          if (api == 1) {
            CK(cublasGemmEx(h, s.ta, s.tb, s.m, s.n, s.k, &one, a, CUDA_R_16BF, int(arows), b, CUDA_R_16BF, int(brows),
                            &zero, c, ct, s.m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            return 0;
          }
          cublasLtMatmulDesc_t op;
          CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
          CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &s.ta, sizeof s.ta));
          CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &s.tb, sizeof s.tb));
          cublasLtMatrixLayout_t la, lb, lc;
          CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, arows, acols, arows));
          CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, brows, bcols, brows));
          CK(cublasLtMatrixLayoutCreate(&lc, ct, s.m, s.n, s.m));
          cublasLtMatmulPreference_t pref;
          CK(cublasLtMatmulPreferenceCreate(&pref));
          CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
          cublasLtMatmulHeuristicResult_t res{};
          int found = 0;
          CK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &found));
          if (found == 0) { std::printf("no algorithm\n"); return 1; }
          int id = -1;
          size_t wr = 0;
          cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &wr);
          algo_id[out] = id;
          CK(cublasLtMatmul(lt, op, &one, a, la, b, lb, &zero, c, lc, c, lc, &res.algo, ws, ws_bytes, nullptr));
          cublasLtMatmulPreferenceDestroy(pref);
          cublasLtMatrixLayoutDestroy(la);
          cublasLtMatrixLayoutDestroy(lb);
          cublasLtMatrixLayoutDestroy(lc);
          cublasLtMatmulDescDestroy(op);
          return 0;
        };
        if (run()) return 1;  // warm-up, and the result compared below
        CK(cudaDeviceSynchronize());
        cudaEventRecord(e0);
        for (int r = 0; r < 10; ++r)
          if (run()) return 1;
        cudaEventRecord(e1);
        CK(cudaEventSynchronize(e1));
        cudaEventElapsedTime(&ms[out], e0, e1);
      }
      std::vector<float> df(size_t(s.m) * s.n);
      std::vector<uint16_t> dh(df.size());
      CK(cudaMemcpy(df.data(), cf, df.size() * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(dh.data(), ch, dh.size() * 2, cudaMemcpyDeviceToHost));
      int64_t diff = 0;
      int max_ulps = 0;
      for (size_t i = 0; i < df.size(); ++i) {
        const uint16_t r = rne(df[i]);
        if (r != dh[i]) {
          ++diff;
          const int u = std::abs(int(int16_t(r)) - int(int16_t(dh[i])));
          if (u > max_ulps) max_ulps = u;
        }
      }
      (void)widen;
      bad_total += diff != 0;
      std::printf("%-28s %-7s m %5d n %5d k %5d: %9lld of %10zu differ (max %d ulps); algo f32 %d bf16 %d; f32 %.3f ms, bf16 %.3f ms\n",
                  s.name, api ? "GemmEx" : "Lt", s.m, s.n, s.k, (long long)diff, df.size(), max_ulps, algo_id[0], algo_id[1],
                  ms[0] / 10, ms[1] / 10);
    }
    cudaFree(a);
    cudaFree(b);
    cudaFree(cf);
    cudaFree(ch);
  }
  std::printf("shapes x APIs with a difference: %d\n", bad_total);
  return 0;
}
