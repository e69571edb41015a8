// GEMMs (gemm.hpp): cuBLAS BF16, dequantization to the BF16 operand, and the
// cuBLASLt block-scaled path for Blackwell.
#include "cuda/gemm.hpp"

#include <algorithm>
#include <string>

#include "core/encode.hpp"
#include "core/format.hpp"
#include "cuda/packing.hpp"
#include "sim/block_scales.hpp"
#include "sim/block_rules.hpp"

namespace fp4lab::cuda {

// cuBLAS's failures by core/error.hpp's taxonomy: no memory or no library state: the environment's (exit 1);
// anything else: an internal error (the callers validate shapes and types first).
void check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  const std::string msg = std::string("cuBLAS error in ") + what + ": status " + std::to_string(int(s)) + " (" +
                          cublasGetStatusString(s) + ")";
  if (s == CUBLAS_STATUS_ALLOC_FAILED || s == CUBLAS_STATUS_NOT_INITIALIZED || s == CUBLAS_STATUS_ARCH_MISMATCH)
    throw EnvironmentError(msg);
  throw InternalError("internal error: " + msg + "; please report it");
}

Blas::Blas(cudaStream_t stream) : stream_(stream) {
  check_cublas(cublasCreate(&h_), "cublasCreate");
  check_cublas(cublasLtCreate(&lt_), "cublasLtCreate");
  check_cublas(cublasSetStream(h_, stream), "cublasSetStream");
  ws_.resize(size_t(64) << 20);  // 64 MiB: cuBLASLt's recommendation for Hopper/Blackwell is >= 32 MiB
  check_cublas(cublasSetWorkspace(h_, ws_.data(), ws_.bytes()), "cublasSetWorkspace");
}

Blas::~Blas() {
  if (lt_) cublasLtDestroy(lt_);
  if (h_) cublasDestroy(h_);
}

void gemm_bf16_nt(Blas& blas, const uint16_t* a, const uint16_t* b, void* y, OutType out, int64_t m, int64_t n,
                  int64_t k, float alpha, const float* alpha_beta_dev) {
  // Row-major y = A B^T is column-major y^T = B A^T: cuBLAS's A is our B
  // (k x n column-major, transposed), its B our A (k x m, not transposed).
  const float beta = 0.0f;
  const cudaDataType_t ct = out == OutType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  check_cublas(
      cublasSetPointerMode(blas.handle(), alpha_beta_dev ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST),
      "cublasSetPointerMode");
  const void* al = alpha_beta_dev ? static_cast<const void*>(alpha_beta_dev) : &alpha;
  const void* be = alpha_beta_dev ? static_cast<const void*>(alpha_beta_dev + 1) : &beta;
  check_cublas(cublasGemmEx(blas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), al, b, CUDA_R_16BF, int(k),
                            a, CUDA_R_16BF, int(k), be, y, ct, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (bf16)");
  check_cublas(cublasSetPointerMode(blas.handle(), CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
}

LtGemmNT::LtGemmNT(cudaDataType_t a_type, cudaDataType_t b_type, cudaDataType_t y_type, int64_t m, int64_t n,
                   int64_t k) {
  try {
    check_cublas(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta, "TRANSA");
    set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb, "TRANSB");
    check_cublas(cublasLtMatrixLayoutCreate(&la_, b_type, uint64_t(k), uint64_t(n), k), "cublasLtMatrixLayoutCreate A");
    check_cublas(cublasLtMatrixLayoutCreate(&lb_, a_type, uint64_t(k), uint64_t(m), k), "cublasLtMatrixLayoutCreate B");
    check_cublas(cublasLtMatrixLayoutCreate(&ly_, y_type, uint64_t(n), uint64_t(m), n), "cublasLtMatrixLayoutCreate C");
  } catch (...) {
    release();
    throw;
  }
}

LtGemmNT::~LtGemmNT() { release(); }

void LtGemmNT::release() {
  if (ly_) cublasLtMatrixLayoutDestroy(ly_);
  if (lb_) cublasLtMatrixLayoutDestroy(lb_);
  if (la_) cublasLtMatrixLayoutDestroy(la_);
  if (op_) cublasLtMatmulDescDestroy(op_);
  ly_ = lb_ = la_ = nullptr;
  op_ = nullptr;
}

void LtGemmNT::set(cublasLtMatmulDescAttributes_t attr, const void* value, size_t bytes, const char* what) {
  check_cublas(cublasLtMatmulDescSetAttribute(op_, attr, value, bytes), what);
}

void LtGemmNT::run(Blas& blas, const void* alpha, const void* a, const void* b, const void* beta, void* y,
                   const char* what) const {
  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const size_t wsb = blas.workspace_bytes();
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(blas.lt(), op_, la_, lb_, ly_, ly_, pref, 1, &heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check_cublas(st, (std::string("cuBLASLt heuristic (") + what + ")").c_str());
  if (found == 0) throw Error(std::string("cuBLASLt found no ") + what + " matmul algorithm for this shape/type");
  // cuBLAS's A is our B.
  check_cublas(cublasLtMatmul(blas.lt(), op_, alpha, b, la_, a, lb_, beta, y, ly_, y, ly_, &heur.algo, blas.workspace(),
                              wsb, blas.stream()),
               (std::string("cublasLtMatmul (") + what + ")").c_str());
}

namespace {

constexpr int kThreads = 256;

// decode() caches in shared memory (a cache of core's decode, as sim's decode_table).
struct DequantParams {
  Format elem, sfmt;
  bool float_scales;
  const uint8_t* codes;
  const uint8_t* scodes;
  const float* scales;
  int64_t rows, cols, br, bc, nbc;
  uint16_t* out;
  // codes and out aligned for the vector forms (4 / 8 bytes of codes, 16 of out): a QuantOperand's codes need not
  // be (a view of one tensor in a packed buffer of several: cuda/packed_operand.hpp); else element by element.
  bool vec;
};

template <bool Packed>
__global__ void __launch_bounds__(kThreads) dequant_kernel(const DequantParams p) {
  __shared__ float tab_e[256], tab_s[256];
  for (int c = threadIdx.x; c < 256; c += kThreads) {
    tab_e[c] = uint32_t(c) < p.elem.code_count() ? decode(p.elem, uint32_t(c)) : 0.0f;
    tab_s[c] = (!p.float_scales && uint32_t(c) < p.sfmt.code_count()) ? decode(p.sfmt, uint32_t(c)) : 0.0f;
  }
  __syncthreads();
  const int64_t chunks_per_row = (p.cols + 7) / 8;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t total = p.rows * chunks_per_row;
  if (t >= total) return;
  const int64_t r = total < (int64_t(1) << 32) ? int64_t(uint32_t(t) / uint32_t(chunks_per_row)) : t / chunks_per_row;
  const int64_t c0 = (t - r * chunks_per_row) * 8;
  const bool full = p.vec && c0 + 8 <= p.cols && (p.cols & 7) == 0;
  uint32_t code[8];
  if constexpr (Packed) {
    const int64_t pc = (p.cols + 1) / 2;
    const uint8_t* src = p.codes + r * pc + c0 / 2;
    if (full) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(src);
#pragma unroll
      for (int j = 0; j < 8; ++j) code[j] = (w >> (4 * j)) & 0xFu;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) code[j] = c0 + j < p.cols ? (src[j / 2] >> (4 * (j & 1))) & 0xFu : 0u;
    }
  } else {
    const uint8_t* src = p.codes + r * p.cols + c0;
    if (full) {
      const uint2 w = *reinterpret_cast<const uint2*>(src);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        code[j] = (w.x >> (8 * j)) & 0xFFu;
        code[j + 4] = (w.y >> (8 * j)) & 0xFFu;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) code[j] = c0 + j < p.cols ? src[j] : 0u;
    }
  }
  const int64_t srow = (r / p.br) * p.nbc;
  uint32_t h[8];
  if (p.bc % 8 == 0) {
    // The 8 elements (c0 is a multiple of 8) share one block.
    const int64_t si = srow + c0 / p.bc;
    const float s = p.float_scales ? p.scales[si] : tab_s[p.scodes[si]];
#pragma unroll
    for (int j = 0; j < 8; ++j) h[j] = encode_rn_f32<bfloat16>(tab_e[code[j]] * s, Overflow::nonsaturate);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t blk = (c0 + j) / p.bc;
      const int64_t si = srow + (blk < p.nbc ? blk : p.nbc - 1);
      const float s = p.float_scales ? p.scales[si] : tab_s[p.scodes[si]];
      h[j] = encode_rn_f32<bfloat16>(tab_e[code[j]] * s, Overflow::nonsaturate);
    }
  }
  uint16_t* dst = p.out + r * p.cols + c0;
  if (full) {
    *reinterpret_cast<uint4*>(dst) =
        make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (c0 + j < p.cols) dst[j] = uint16_t(h[j]);
  }
}

__global__ void alpha_kernel(const float* ga, const float* gb, float* ab) {
  ab[0] = (ga ? *ga : 1.0f) * (gb ? *gb : 1.0f);
  ab[1] = 0.0f;
}

// NVFP4 operands for cuBLASLt's VEC16_UE4M3 mode: E2M1 codes with E4M3 scales
// in [1,16] blocks, or in [16,16] tiles (the NVIDIA recipe's weights), a
// tile's scale being each of its rows' [1,16] scale.
// (Not a rule whose scales are not decode(code), such as TE's NVFP4 options: their per-row amax or E4M3_MAX
// 256 is not a scalar g_dec of the codes' scale, schemes/te_nvfp4/rule.hpp.)
bool is_nvfp4_blocks(const QuantizerSpec& q, int block_rows) {
  return q.element == &float4_e2m1fn && (q.scale == &ufloat8_e4m3 || q.scale == &float8_e4m3fn) &&
         q.block_rows == block_rows && q.block_cols == 16 && !q.rht && block_rule_traits(q).scales_from_codes;
}
bool is_nvfp4_native(const QuantizerSpec& q) { return is_nvfp4_blocks(q, 1) || is_nvfp4_blocks(q, 16); }
bool is_mx_1x32(const QuantizerSpec& q) {
  return (q.element == &float4_e2m1fn || q.element == &float8_e4m3fn || q.element == &float8_e5m2) &&
         q.scale == &float8_e8m0fnu && q.block_rows == 1 && q.block_cols == 32 && !q.rht;
}

cudaDataType_t lt_type(const Format* f) {
  if (f == &float4_e2m1fn) return CUDA_R_4F_E2M1;
  if (f == &float8_e4m3fn) return CUDA_R_8F_E4M3;
  return CUDA_R_8F_E5M2;
}

// cuBLASLt block-scaled matmul (Blackwell). NOT RUN (no sm_100 GPU available).
void blackwell_gemm(Blas& blas, const QuantOperand& a, const QuantOperand& b, void* y, OutType out, GemmWorkspace& ws) {
  const int64_t m = a.rows, n = b.rows, k = a.cols;
  const bool nv = is_nvfp4_native(a.spec);
  const int64_t bk = nv ? 16 : 32;
  const int64_t kb = (k + bk - 1) / bk;
  // Swizzle both operands' scales (tested packing kernels); [16,16] tiles'
  // scales expand to their rows' [1,16] scales on the way.
  ws.a_sw.at_least(size_t(swizzled_scale_bytes(m, kb)));
  ws.b_sw.at_least(size_t(swizzled_scale_bytes(n, kb)));
  swizzle_scales_device(a.scale_codes, m, kb, ws.a_sw.data(), blas.stream(), a.spec.block_rows);
  swizzle_scales_device(b.scale_codes, n, kb, ws.b_sw.data(), blas.stream(), b.spec.block_rows);

  const cudaDataType_t ct = out == OutType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  LtGemmNT g(lt_type(a.spec.element), lt_type(b.spec.element), ct, m, n, k);
  const cublasLtMatmulMatrixScale_t mode =
      nv ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
  g.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode, "A_SCALE_MODE");
  g.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode, "B_SCALE_MODE");
  // cuBLAS's A is our B (y^T = B A^T in column-major terms).
  const void* sa = ws.b_sw.data();
  const void* sb = ws.a_sw.data();
  g.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa, "A_SCALE_POINTER");
  g.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb, "B_SCALE_POINTER");
  const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
  g.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm, "POINTER_MODE");
  const float* ab = ws.alpha.data();
  g.run(blas, ab, a.codes, b.codes, ab + 1, y, "block-scaled");
}

// FP8 block scaling (schemes/fp8_block): E4M3 / E5M2 with FP32 (or power-of-two E8M0) scales in blocks of
// 128 along k, [1,128] or [128,128].
bool is_fp8_block(const QuantizerSpec& q) {
  return StandardRule::fp8_block_rule(q.scale_rule) && (q.element == &float8_e4m3fn || q.element == &float8_e5m2) &&
         q.block_cols == 128 && (q.block_rows == 1 || q.block_rows == 128) && !q.rht;
}

// An operand's block scales in cuBLASLt's FP32 layouts (TransformerEngine's CuBLASScaleMunger):
//   [1,128] blocks (VEC128_32F): [kb][ld] with ld = rows rounded up to 4 (each k block's rows contiguous);
//   [128,128] blocks (BLK128x128_32F): [ceil(rows/128)][ld] with ld = kb rounded up to 4.
// s: the float32 scales [sr, kb] (row-major), or null with codes: E8M0 codes decoded (2^(c - 127); 0 is 2^-127).
__global__ void fp8_block_scales_kernel(const float* s, const uint8_t* codes, int64_t sr, int64_t kb, bool vec,
                                        int64_t ld, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= sr * kb) return;
  const int64_t r = i / kb, j = i - r * kb;
  constexpr Format e8m0 = float8_e8m0fnu;  // a local copy: device code cannot refer to the host global
  out[vec ? j * ld + r : r * ld + j] = s ? s[i] : decode(e8m0, codes[i]);
}

int64_t round_up4(int64_t v) { return (v + 3) / 4 * 4; }

// Lays out q's scales for cuBLASLt into buf (resized); returns the device pointer.
const float* fp8_block_scales(const QuantOperand& q, DeviceBuffer<float>& buf, cudaStream_t stream) {
  const int64_t kb = (q.cols + 127) / 128;
  const bool vec = q.spec.block_rows == 1;
  const int64_t sr = vec ? q.rows : (q.rows + 127) / 128;
  const int64_t ld = vec ? round_up4(q.rows) : round_up4(kb);
  const int64_t words = vec ? kb * ld : sr * ld;
  buf.resize(size_t(words));
  check(cudaMemsetAsync(buf.data(), 0, size_t(words) * sizeof(float), stream), "cudaMemsetAsync (fp8 block scales)");
  if (sr * kb == 0) return buf.data();
  const int threads = 256;
  fp8_block_scales_kernel<<<unsigned((sr * kb + threads - 1) / threads), threads, 0, stream>>>(
      q.scale_codes ? nullptr : q.scales, q.scale_codes, sr, kb, vec, ld, buf.data());
  check_launch("fp8_block_scales_kernel");
  return buf.data();
}

// cuBLASLt's block-scaled FP8 matmul on Hopper (CUDA 12.9+: VEC128_32F, BLK128x128_32F scale modes), split
// accumulation (no fast accumulation), as TransformerEngine's Float8BlockScaling GEMMs.
void fp8_block_gemm(Blas& blas, const QuantOperand& a, const QuantOperand& b, void* y, OutType out, GemmWorkspace& ws) {
  const int64_t m = a.rows, n = b.rows, k = a.cols;
  const float* sa_ours = fp8_block_scales(a, ws.a_scales, blas.stream());
  const float* sb_ours = fp8_block_scales(b, ws.b_scales, blas.stream());
  const cudaDataType_t ct = out == OutType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  LtGemmNT g(lt_type(a.spec.element), lt_type(b.spec.element), ct, m, n, k);
  auto mode_of = [](const QuantizerSpec& q) {
    return q.block_rows == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  };
  // cuBLAS's A is our B (y^T = B A^T in column-major terms).
  const cublasLtMatmulMatrixScale_t mode_a = mode_of(b.spec), mode_b = mode_of(a.spec);
  g.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a, "A_SCALE_MODE");
  g.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b, "B_SCALE_MODE");
  g.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb_ours, sizeof sb_ours, "A_SCALE_POINTER");
  g.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa_ours, sizeof sa_ours, "B_SCALE_POINTER");
  const int8_t fast_accum = 0;
  g.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum, "FAST_ACCUM");
  const float alpha = 1.0f, beta = 0.0f;
  g.run(blas, &alpha, a.codes, b.codes, &beta, y, "FP8 block-scaled");
}

}  // namespace

bool fp8_block_gemm_supported(const QuantizerSpec& qa, const QuantizerSpec& qb) {
  return is_fp8_block(qa) && qa.block_rows == 1 && is_fp8_block(qb) &&
         !(qa.element == &float8_e5m2 && qb.element == &float8_e5m2);
}

void dequant_operand_bf16(const QuantOperand& q, uint16_t* out, cudaStream_t stream) {
  if (q.layout == CodeLayout::packed4 && q.spec.element->bits() != 4)
    throw Error("dequant_operand_bf16: packed4 codes need a 4-bit element");
  if (!q.scale_codes && !q.scales) throw Error("dequant_operand_bf16: the operand has neither scale codes nor scales");
  // A rule whose decoded scales are not decode(code) (TE's NVFP4 options: the final dequantization scales,
  // schemes/te_nvfp4/rule.hpp): the scale codes alone do not give them.
  const bool final_scales = !block_rule_traits(q.spec).scales_from_codes;
  if (final_scales && !q.scales)
    throw Error("dequant_operand_bf16: " + describe(q.spec) + " needs its decoded scales (QuantOperand::scales)");
  const BlockGrid g = block_grid(q.spec, q.rows, q.cols);
  DequantParams p{*q.spec.element,
                  *q.spec.scale,
                  q.scale_codes == nullptr || final_scales,
                  q.codes,
                  q.scale_codes,
                  q.scales,
                  q.rows,
                  q.cols,
                  g.br,
                  g.bc,
                  g.nbc,
                  out,
                  reinterpret_cast<uintptr_t>(q.codes) % (q.layout == CodeLayout::packed4 ? 4 : 8) == 0 &&
                      reinterpret_cast<uintptr_t>(out) % 16 == 0};
  const int64_t n = q.rows * ((q.cols + 7) / 8);
  if (n == 0) return;
  const unsigned blocks = unsigned((n + kThreads - 1) / kThreads);
  if (q.layout == CodeLayout::packed4)
    dequant_kernel<true><<<blocks, kThreads, 0, stream>>>(p);
  else
    dequant_kernel<false><<<blocks, kThreads, 0, stream>>>(p);
  check_launch("dequant_kernel");
}

void set_alpha_device(const float* ga, const float* gb, float* alpha_beta, cudaStream_t stream) {
  alpha_kernel<<<1, 1, 0, stream>>>(ga, gb, alpha_beta);
  check_launch("alpha_kernel");
}

bool fp8_tensor_core_supported(const QuantizerSpec& qa, const QuantizerSpec& qb) {
  return is_mx_1x32(qa) && is_mx_1x32(qb) && qa.element->bits() == 8 && qb.element->bits() == 8;
}

bool blackwell_native_supported(const QuantizerSpec& qa, const QuantizerSpec& qb) {
  return (is_nvfp4_native(qa) && is_nvfp4_native(qb)) || (is_mx_1x32(qa) && is_mx_1x32(qb));
}

GemmPath quantized_gemm_device(Blas& blas, const QuantOperand& a, const QuantOperand& b, void* y, OutType out,
                               GemmWorkspace& ws, GemmPath path) {
  if (a.cols != b.cols)
    throw Error("quantized GEMM: A is [" + std::to_string(a.rows) + ", " + std::to_string(a.cols) + "] and B [" +
                std::to_string(b.rows) + ", " + std::to_string(b.cols) + "]; both need the same k (columns)");
  if (path == GemmPath::automatic)
    path = (compute_capability() >= 100 && blackwell_native_supported(a.spec, b.spec) && a.scale_codes && b.scale_codes)
               ? GemmPath::blackwell_native
               : GemmPath::hopper_bf16;
  ws.alpha.resize(2);
  set_alpha_device(a.global_decode, b.global_decode, ws.alpha.data(), blas.stream());
  if (path == GemmPath::blackwell_native) {
    if (!blackwell_native_supported(a.spec, b.spec))
      throw Error("quantized GEMM: the Blackwell path takes NVFP4 [1,16] / [16,16] or MX [1,32] operands, got " +
                  describe(a.spec) + " x " + describe(b.spec));
    if (compute_capability() < 100)
      throw Error("quantized GEMM: the Blackwell block-scaled path needs sm_100 or newer; this GPU is sm_" +
                  std::to_string(compute_capability()));
    blackwell_gemm(blas, a, b, y, out, ws);
    return path;
  }
  if (path == GemmPath::hopper_fp8) {
    mxfp8_gemm_fp8_tensor_cores(a, b, y, out, ws.alpha.data(), blas.stream());
    return path;
  }
  if (path == GemmPath::hopper_fp8_block) {
    if (!fp8_block_gemm_supported(a.spec, b.spec))
      throw Error(
          "quantized GEMM: the FP8 block-scaled path takes A in [1,128] and B in [1,128] or [128,128] blocks "
          "of an FP8 block-scaling rule (not both e5m2), got " +
          describe(a.spec) + " x " + describe(b.spec));
    if (a.layout != CodeLayout::bytes || b.layout != CodeLayout::bytes)
      throw Error("quantized GEMM: the FP8 block-scaled path takes byte codes");
    if (compute_capability() < 90)
      throw Error("quantized GEMM: the FP8 block-scaled path needs sm_90 or newer; this GPU is sm_" +
                  std::to_string(compute_capability()));
    fp8_block_gemm(blas, a, b, y, out, ws);
    return path;
  }
  ws.a16.at_least(size_t(a.rows * a.cols));
  ws.b16.at_least(size_t(b.rows * b.cols));
  dequant_operand_bf16(a, ws.a16.data(), blas.stream());
  dequant_operand_bf16(b, ws.b16.data(), blas.stream());
  gemm_bf16_nt(blas, ws.a16.data(), ws.b16.data(), y, out, a.rows, b.rows, a.cols, 1.0f, ws.alpha.data());
  return path;
}

Tensor<float> quantized_gemm_gpu(const QuantizerSpec& qa, MatrixView<const float> a, const QuantizerSpec& qb,
                                 MatrixView<const float> b, RandomStream rs_a, RandomStream rs_b, GemmPath path) {
  struct Side {
    DeviceBuffer<float> x;
    DeviceBuffer<uint8_t> codes, scodes;
    DeviceBuffer<float> scales, gdec;
    QuantOperand op;
  };
  auto prepare = [](Side& s, const QuantizerSpec& q, MatrixView<const float> m, RandomStream rs) {
    std::vector<float> h(static_cast<size_t>(m.rows * m.cols));
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t c = 0; c < m.cols; ++c) h[size_t(r * m.cols + c)] = m(r, c);
    s.x.upload(h);
    int64_t sr = 0, sc = 0;
    scale_grid(q, m.rows, m.cols, sr, sc);
    const bool packed = q.element->bits() == 4;
    s.codes.resize(size_t(packed ? m.rows * ((m.cols + 1) / 2) : m.rows * m.cols));
    s.scodes.resize(size_t(sr * sc));
    s.scales.resize(size_t(sr * sc));
    s.gdec.resize(1);
    QuantOutputs o;
    o.codes = s.codes.data();
    o.code_layout = packed ? CodeLayout::packed4 : CodeLayout::bytes;
    const bool has_codes = q.scale != &float32;
    o.scale_codes = has_codes ? s.scodes.data() : nullptr;
    o.scales = s.scales.data();
    o.global_decode = s.gdec.data();
    QuantWorkspace qws;
    quantize_device(q, s.x.data(), InputType::f32, m.rows, m.cols, rs, o, qws);
    check(cudaDeviceSynchronize(), "quantize");
    s.op.spec = q;
    s.op.rows = m.rows;
    s.op.cols = m.cols;
    s.op.codes = s.codes.data();
    s.op.layout = o.code_layout;
    s.op.scale_codes = o.scale_codes;
    s.op.scales = has_codes ? nullptr : s.scales.data();
    s.op.global_decode = s.gdec.data();
  };
  Side sa, sb;
  prepare(sa, qa, a, rs_a);
  prepare(sb, qb, b, rs_b);
  Blas blas;
  GemmWorkspace ws;
  DeviceBuffer<float> y(static_cast<size_t>(a.rows * b.rows));
  quantized_gemm_device(blas, sa.op, sb.op, y.data(), OutType::f32, ws, path);
  check(cudaDeviceSynchronize(), "quantized_gemm_gpu");
  return Tensor<float>(Shape{a.rows, b.rows}, y.download());
}

}  // namespace fp4lab::cuda
