// MXFP8 GEMM on the FP8 tensor cores with per-32-block promotion into FP32
// (gemm.hpp, GemmPath::hopper_fp8).
//
// Each MX block is 32 elements of k, exactly the k of one FP8 mma.sync
// (m16n8k32). For every k-block the tensor cores form the partial product of the
// raw E4M3/E5M2 codes with a zero accumulator; the CUDA cores then promote it:
//   acc[i][j] += partial[i][j] * scale_a[i][kb] * scale_b[j][kb]   (FP32)
// Both scales are powers of two (E8M0), so the promotion multiplies are exact
// (within FP32's range) and only the additions round. What the tensor cores do
// inside one k32 partial (the alignment and width of their adder) is the
// hardware's: on Hopper it is narrower than FP32 (DeepGEMM measured ~14 bits
// for wgmma), which is why the partial covers a single block and is promoted.
//
// Tiling: a CTA computes a 128 x 128 tile of y with 8 warps (2 along m, 4 along
// n; 64 x 32 per warp), k in steps of 128 bytes (4 MX blocks) through a
// 3-stage cp.async pipeline. Shared-memory rows are 128 bytes with the 16-byte
// chunks XOR-swizzled by (row & 7), so the ldmatrix reads of 8 rows hit 8
// distinct bank groups. The k tail is zero-filled (code 0 is +0 in E4M3 and
// E5M2), and the scales of blocks past k are 0.
#include <string>

#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "cuda/gemm.hpp"

namespace fp4lab::cuda {

namespace {

constexpr int kTileM = 128, kTileN = 128, kTileK = 128;  // kTileK in bytes = elements
constexpr int kStages = 3, kWarps = 8, kThreadsFp8 = kWarps * 32;
constexpr int kBlocksPerTile = kTileK / 32;  // MX blocks per k tile
constexpr int kCodeBytes = kTileM * kTileK + kTileN * kTileK;
constexpr int kScaleFloats = kBlocksPerTile * (kTileM + kTileN);
constexpr int kStageBytes = kCodeBytes + kScaleFloats * 4;
constexpr int kSmemBytes = kStages * kStageBytes + 256 * 4;  // + the E8M0 decode table

static_assert(kTileM == kTileN, "the loaders below use one row count for both operands");

// Byte offset of (row, byte) in a 128-byte-row tile with 16-byte chunks
// swizzled by row.
__device__ __forceinline__ uint32_t swz(int row, int byte) {
  return uint32_t(row * kTileK + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15)));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// d = a * b + 0 with FP8 operands (A row-major 16 x 32, B "col" = [n][k]).
template <bool AE5M2, bool BE5M2>
__device__ __forceinline__ void mma_fp8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const float z = 0.0f;
#define FP4LAB_MMA_FP8(TA, TB)                                                              \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." TA "." TB                           \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};\n" \
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                             \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z))
  if constexpr (!AE5M2 && !BE5M2)
    FP4LAB_MMA_FP8("e4m3", "e4m3");
  else if constexpr (!AE5M2 && BE5M2)
    FP4LAB_MMA_FP8("e4m3", "e5m2");
  else if constexpr (AE5M2 && !BE5M2)
    FP4LAB_MMA_FP8("e5m2", "e4m3");
  else
    FP4LAB_MMA_FP8("e5m2", "e5m2");
#undef FP4LAB_MMA_FP8
#else
  // Never launched below sm_89 (the host refuses); keeps older targets compiling.
  (void)a, (void)b0, (void)b1;
  d[0] = d[1] = d[2] = d[3] = __int_as_float(0x7FC00000);
#endif
}

struct Fp8GemmParams {
  const uint8_t *a, *b;    // codes, row-major [m, k] and [n, k]
  const uint8_t *sa, *sb;  // E8M0 scale codes, row-major [m, kb] and [n, kb]
  const float* alpha;      // device float (g_dec(A) g_dec(B)); null = 1
  void* y;                 // [m, n], FP32 or BF16
  int64_t m, n, k, kb;     // kb = ceil(k / 32)
  bool out_bf16;
  Format e8m0;  // float8_e8m0fnu (passed by value: core's codec runs on the device)
};

// Loads k tile `kt` of both operands (codes by cp.async, scales decoded by
// plain stores) into one pipeline stage.
__device__ __forceinline__ void load_stage(const Fp8GemmParams& p, uint8_t* stage, const float* e8m0, int64_t m0,
                                           int64_t n0, int64_t kt) {
  const int tid = threadIdx.x;
  const uint32_t s_a = uint32_t(__cvta_generic_to_shared(stage));
  const uint32_t s_b = s_a + kTileM * kTileK;
  const int64_t k0 = kt * kTileK;
  // 128 rows x 8 chunks per operand = 1024 chunks, 4 per thread.
#pragma unroll
  for (int i = 0; i < (kTileM * kTileK / 16) / kThreadsFp8; ++i) {
    const int c = tid + i * kThreadsFp8;
    const int row = c >> 3, ch = c & 7;
    const int64_t kc = k0 + ch * 16;
    {
      const int64_t gr = m0 + row;
      const bool ok = gr < p.m && kc < p.k;
      cp_async_16(s_a + swz(row, ch * 16), ok ? p.a + gr * p.k + kc : p.a, ok ? 16 : 0);
    }
    {
      const int64_t gr = n0 + row;
      const bool ok = gr < p.n && kc < p.k;
      cp_async_16(s_b + swz(row, ch * 16), ok ? p.b + gr * p.k + kc : p.b, ok ? 16 : 0);
    }
  }
  // Scales, [kb][row] floats: 4 x 128 per operand, 2 per thread each.
  float* fa = reinterpret_cast<float*>(stage + kCodeBytes);
  float* fb = fa + kBlocksPerTile * kTileM;
#pragma unroll
  for (int i = 0; i < (kBlocksPerTile * kTileM) / kThreadsFp8; ++i) {
    const int e = tid + i * kThreadsFp8;
    const int row = e % kTileM, blk = e / kTileM;
    const int64_t gkb = kt * kBlocksPerTile + blk;
    const int64_t ra = m0 + row, rb = n0 + row;
    fa[e] = (ra < p.m && gkb < p.kb) ? e8m0[p.sa[ra * p.kb + gkb]] : 0.0f;
    fb[e] = (rb < p.n && gkb < p.kb) ? e8m0[p.sb[rb * p.kb + gkb]] : 0.0f;
  }
}

template <bool AE5M2, bool BE5M2>
__global__ void __launch_bounds__(kThreadsFp8, 1) mxfp8_gemm_kernel(const Fp8GemmParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  float* e8m0 = reinterpret_cast<float*>(smem + kStages * kStageBytes);
  for (int c = threadIdx.x; c < 256; c += kThreadsFp8) e8m0[c] = decode(p.e8m0, uint32_t(c));
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;  // warp's tile origin in the CTA tile
  const int64_t m0 = int64_t(blockIdx.y) * kTileM, n0 = int64_t(blockIdx.x) * kTileN;
  const int64_t ktiles = (p.k + kTileK - 1) / kTileK;

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(p, smem + s * kStageBytes, e8m0, m0, n0, s);
    cp_async_commit();
  }

  // ldmatrix row/byte of this lane within a 16-row x 32-byte fragment.
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_byte = (lane >> 4) * 16;
  const int b_row = (lane & 7) + (lane >> 4) * 8, b_byte = ((lane >> 3) & 1) * 16;
  const int g = lane >> 2, t4 = lane & 3;  // mma accumulator: rows g, g + 8; cols 2 t4, 2 t4 + 1

  for (int64_t kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    {
      const int64_t next = kt + kStages - 1;
      if (next < ktiles) load_stage(p, smem + (next % kStages) * kStageBytes, e8m0, m0, n0, next);
      cp_async_commit();
    }
    uint8_t* stage = smem + (kt % kStages) * kStageBytes;
    const uint32_t s_a = uint32_t(__cvta_generic_to_shared(stage));
    const uint32_t s_b = s_a + kTileM * kTileK;
    const float* fa = reinterpret_cast<const float*>(stage + kCodeBytes);
    const float* fb = fa + kBlocksPerTile * kTileM;

#pragma unroll
    for (int blk = 0; blk < kBlocksPerTile; ++blk) {
      const int kb0 = blk * 32;
      uint32_t af[4][4], bf[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        ldmatrix_x4(s_a + swz(wm + i * 16 + a_row, kb0 + a_byte), af[i][0], af[i][1], af[i][2], af[i][3]);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        ldmatrix_x4(s_b + swz(wn + j * 16 + b_row, kb0 + b_byte), bf[2 * j][0], bf[2 * j][1], bf[2 * j + 1][0],
                    bf[2 * j + 1][1]);
      float sa[4][2], sb[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sa[i][0] = fa[blk * kTileM + wm + i * 16 + g];
        sa[i][1] = fa[blk * kTileM + wm + i * 16 + g + 8];
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sb[j][0] = fb[blk * kTileN + wn + j * 8 + 2 * t4];
        sb[j][1] = fb[blk * kTileN + wn + j * 8 + 2 * t4 + 1];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float part[4];
          mma_fp8<AE5M2, BE5M2>(part, af[i], bf[j][0], bf[j][1]);
          // Promotion: both scales are powers of two, so part * sa * sb is
          // exact; the fma rounds once, in the addition.
#pragma unroll
          for (int v = 0; v < 4; ++v) acc[i][j][v] = __fmaf_rn(part[v] * sa[i][v >> 1], sb[j][v & 1], acc[i][j][v]);
        }
    }
  }
  cp_async_wait<0>();

  const float alpha = p.alpha ? *p.alpha : 1.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int64_t r = m0 + wm + i * 16 + g + (v >> 1) * 8, c = n0 + wn + j * 8 + 2 * t4 + (v & 1);
        if (r >= p.m || c >= p.n) continue;
        const float val = alpha * acc[i][j][v];
        if (p.out_bf16)
          static_cast<uint16_t*>(p.y)[r * p.n + c] = uint16_t(encode_rn_f32<bfloat16>(val, Overflow::nonsaturate));
        else
          static_cast<float*>(p.y)[r * p.n + c] = val;
      }
}

template <bool AE5M2, bool BE5M2>
void launch(const Fp8GemmParams& p, cudaStream_t stream) {
  // Per call: the attribute is per device, and setting it costs no synchronization.
  check(cudaFuncSetAttribute(mxfp8_gemm_kernel<AE5M2, BE5M2>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
        "cudaFuncSetAttribute (mxfp8_gemm_kernel shared memory)");
  const dim3 grid(unsigned((p.n + kTileN - 1) / kTileN), unsigned((p.m + kTileM - 1) / kTileM));
  mxfp8_gemm_kernel<AE5M2, BE5M2><<<grid, kThreadsFp8, kSmemBytes, stream>>>(p);
  check_launch("mxfp8_gemm_kernel");
}

}  // namespace

void mxfp8_gemm_fp8_tensor_cores(const QuantOperand& a, const QuantOperand& b, void* y, OutType out,
                                 const float* alpha_dev, cudaStream_t stream) {
  if (!fp8_tensor_core_supported(a.spec, b.spec))
    throw Error("MXFP8 FP8-tensor-core GEMM: takes MX [1,32] E8M0-scaled e4m3/e5m2 operands without RHT, got " +
                describe(a.spec) + " x " + describe(b.spec));
  if (a.layout != CodeLayout::bytes || b.layout != CodeLayout::bytes || !a.scale_codes || !b.scale_codes)
    throw Error("MXFP8 FP8-tensor-core GEMM: operands need byte codes and E8M0 scale codes");
  if (a.cols != b.cols)
    throw Error("MXFP8 FP8-tensor-core GEMM: A has k=" + std::to_string(a.cols) + ", B k=" + std::to_string(b.cols));
  if (a.cols % 16 != 0)
    throw Error("MXFP8 FP8-tensor-core GEMM: k=" + std::to_string(a.cols) +
                " is not a multiple of 16 (rows are copied in 16-byte chunks); use the BF16 path");
  if ((reinterpret_cast<uintptr_t>(a.codes) | reinterpret_cast<uintptr_t>(b.codes)) % 16 != 0)
    throw Error("MXFP8 FP8-tensor-core GEMM: code buffers must be 16-byte aligned");
  if (compute_capability() < 89)
    throw Error("MXFP8 FP8-tensor-core GEMM: needs FP8 mma (sm_89 or newer); this GPU is sm_" +
                std::to_string(compute_capability()));
  if (a.rows == 0 || b.rows == 0) return;
  if (a.rows > int64_t(65535) * kTileM) throw Error("MXFP8 FP8-tensor-core GEMM: m is too large for the grid");
  Fp8GemmParams p{a.codes, b.codes, a.scale_codes,      b.scale_codes,        alpha_dev,     y, a.rows,
                  b.rows,  a.cols,  (a.cols + 31) / 32, out == OutType::bf16, float8_e8m0fnu};
  const bool ae = a.spec.element == &float8_e5m2, be = b.spec.element == &float8_e5m2;
  if (!ae && !be)
    launch<false, false>(p, stream);
  else if (!ae && be)
    launch<false, true>(p, stream);
  else if (ae && !be)
    launch<true, false>(p, stream);
  else
    launch<true, true>(p, stream);
}

}  // namespace fp4lab::cuda
