// The BF16 flash attention of class Attention (train/cuda/nn.hpp; attention.cu
// dispatches to it when AttentionDims::bf16_flash is set): FlashAttention-2
// style forward and backward on the BF16 tensor cores (mma.sync m16n8k16 from
// inline PTX, operands through ldmatrix), FP32 accumulation, no [T, T] matrix
// in device memory.
//
// - Q, K, V (and dout in the backward) are read from the FP32 tensors and
//   rounded to BF16 (round to nearest even) as their tiles enter shared memory,
//   or from BF16 tensors (a linear layer's output stored in BF16 alone under
//   bf16 activations: In = uint16_t), widened as they load: the same tiles
//   where the FP32 tensor held those BF16 values (r is idempotent).
// - Forward, one block per (sequence, head) and 64 query rows (4 warps of 16
//   rows): the online softmax over key tiles (running row max m and sum l in
//   FP32, exp2 with the scale folded into log2 e), P rounded to BF16 for P.V,
//   key tiles above the causal diagonal skipped. Saves, for the backward, the
//   output rows (FP32) and the base-2 log-sum-exp lse2 = m + log2(l) of each
//   row: `saved` [B*H*T, hd + 1] = O as [B*H][T][hd], then lse2 [B*H*T].
// - Backward, two kernels and no atomics (the same bits run to run):
//   dQ per query tile (also writes D = rowsum(dout * O) for the other kernel),
//   then dK, dV per key tile; each recomputes P = exp2(s - lse2) from Q, K.
//   dS = P (dP - D) scale is rounded to BF16 for dQ = dS K and dK = dS^T Q,
//   drop(P) to BF16 for dV = drop(P)^T dout.
// - Dropout: element e = (bh T + i) T + j of the probabilities (row i, key j)
//   is dropped iff random_bits(seed, stream_id, e) < threshold, the FP32
//   paths' mask bit for bit. The threads of a quad share the Philox groups of
//   their fragment (each computes one group, the words go by shuffles).
//   dropout 0 skips all of it (a uniform branch).
// - Head dims 16, 32, 64, 128; any T (partial tiles masked); 16-byte aligned
//   FP32 pointers.
#include <cuda_bf16.h>

#include <cstdint>
#include <cmath>
#include <mutex>
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "core/philox.hpp"
#include "train/attention_flash.hpp"
#include "train/cuda/nn.hpp"
#include "train/cuda/nn_device.cuh"

namespace fp4lab::cuda::nn {

using namespace detail;

namespace {
namespace flash {

constexpr int kThreads = 128;  // 4 warps
constexpr int kRows = 64;      // query rows of a forward / dQ block; key rows of a dK, dV block
constexpr float kLog2e = train::kFlashLog2e;
constexpr size_t kMaxSmem = 100 * 1024;

// Key columns per step of the forward kernel (the backward kernels: kBwdStep):
// train/attention_flash.hpp, which the CPU twin reads too (the step decides
// where P is rounded against the running max).
template <int HD>
constexpr int kStep = train::flash_forward_key_step(HD);
// The same for the backward kernels (dQ: key columns; dK, dV: query rows),
// 32 from head dim 64 on: their S, dP and dS fragments at 64 took 252-254
// registers a thread at head dim 64, two blocks an SM (ptxas -v, ncu: 12.5%
// occupancy on an H200, 2026-12-01). The step does not change the bits: every
// product accumulates its 16-wide k-chunks in ascending order either way, and
// masking and dropout are by absolute index.
template <int HD>
constexpr int kBwdStep = HD >= 64 ? 32 : 64;
// Blocks an SM the backward kernels are compiled for (__launch_bounds__:
// registers capped at 65536 / (128 blocks)); 0: no minimum. 3 at head dim 64:
// 168 registers, no spills (2 blocks by registers before). The forward at 64
// would spill 152 bytes at 168, so it has no minimum.
template <int HD>
constexpr int kMinBlocks = HD == 64 ? 3 : 0;
// Row length (BF16 elements) of a shared-memory tile: 16 bytes of padding, so
// that the 8 row addresses of an ldmatrix hit 8 different 16-byte bank groups.
template <int HD>
constexpr int kLds = HD + 8;

struct Args {
  const void* qkv;  // [B*T, 3C] of the kernels' element type In (float or BF16 bits)
  int64_t T, H, C;
  float scale;   // multiplies q.k
  float scale2;  // scale * log2(e): exp(scale s) = exp2(scale2 s)
  bool causal;
  uint32_t thr;  // dropout threshold; 0: no dropout
  float keep_scale;
  uint64_t seed, sid;
};

// ---- PTX ----------------------------------------------------------------------------
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}
// c += a b: a 16x16 row-major BF16, b 16x8 (column-major) BF16, c 16x8 FP32.
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const uint16_t* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void ldsm4_t(uint32_t (&r)[4], const uint16_t* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Fragment addresses (lane l) of a 16x16 tile at (r0, c0) of a row-major
// shared tile with rows `lds` apart:
// - A operand (rows r0.., k = columns c0..): ldsm4 -> a[0..3].
__device__ __forceinline__ const uint16_t* a_addr(const uint16_t* s, int lds, int r0, int c0, int lane) {
  return s + (r0 + (lane % 16)) * lds + c0 + (lane / 16) * 8;
}
// - B operands of two n-tiles from rows r0..r0+15 (n = rows, k = columns c0..):
//   ldsm4 -> {b0, b1} of n-tile r0..r0+7, {b2, b3} of n-tile r0+8..
__device__ __forceinline__ const uint16_t* bn_addr(const uint16_t* s, int lds, int r0, int c0, int lane) {
  return s + (r0 + (lane % 8) + (lane / 16) * 8) * lds + c0 + ((lane / 8) % 2) * 8;
}
// - B operands of two n-tiles from columns c0..c0+15 (k = rows r0.., n =
//   columns): ldsm4_t -> {b0, b1} of columns c0..c0+7, {b2, b3} of c0+8..
__device__ __forceinline__ const uint16_t* bt_addr(const uint16_t* s, int lds, int r0, int c0, int lane) {
  return s + (r0 + (lane % 8) + ((lane / 8) % 2) * 8) * lds + c0 + (lane / 16) * 8;
}

// ---- warp products (the three kernels' mma loops; each the body of a loop over kk) ----
// The B fragments of n-tiles 2 j and 2 j + 1 at k-step kk (k = 16 kk .. +15) of
// a row-major shared tile bs with rows LDS apart: its rows are n and its
// columns k (ldsm4: S = Q K^T, dP = dout V^T), or, TRANS, its rows are k and
// its columns n (ldsm4_t: O = P V, dQ = dS K, dV, dK).
template <bool TRANS, int LDS>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const uint16_t* bs, int j, int kk, int lane) {
  if constexpr (TRANS)
    ldsm4_t(b, bt_addr(bs, LDS, 16 * kk, 16 * j, lane));
  else
    ldsm4(b, bn_addr(bs, LDS, 16 * j, 16 * kk, lane));
}
// One k-step of acc += A B over the N n-tiles of acc: A the warp's 16-row
// fragment `a` of k-step kk, B from bs as load_b reads it.
template <bool TRANS, int LDS, int N>
__device__ __forceinline__ void mma_kstep(float (&acc)[N][4], const uint32_t (&a)[4], const uint16_t* bs, int kk,
                                          int lane) {
#pragma unroll
  for (int j = 0; j < N / 2; ++j) {
    uint32_t b[4];
    load_b<TRANS, LDS>(b, bs, j, kk, lane);
    mma(acc[2 * j], a, b[0], b[1]);
    mma(acc[2 * j + 1], a, b[2], b[3]);
  }
}
// Two such products in one pass (acc1 += a1 B1, acc2 += a2 B2), their loads
// and mmas interleaved in this order: S and dP of the backward kernels, dV and dK.
template <bool TRANS, int LDS, int N>
__device__ __forceinline__ void mma_kstep2(float (&acc1)[N][4], const uint32_t (&a1)[4], const uint16_t* b1,
                                           float (&acc2)[N][4], const uint32_t (&a2)[4], const uint16_t* b2, int kk,
                                           int lane) {
#pragma unroll
  for (int j = 0; j < N / 2; ++j) {
    uint32_t x[4], y[4];
    load_b<TRANS, LDS>(x, b1, j, kk, lane);
    load_b<TRANS, LDS>(y, b2, j, kk, lane);
    mma(acc1[2 * j], a1, x[0], x[1]);
    mma(acc1[2 * j + 1], a1, x[2], x[3]);
    mma(acc2[2 * j], a2, y[0], y[1]);
    mma(acc2[2 * j + 1], a2, y[2], y[3]);
  }
}
// The four values v of accumulator n-tile n (rows g, g + 8; columns 2 t, 2 t + 1)
// rounded to BF16 into the A fragments of the next product, whose k runs over
// the n-tiles' columns: n-tiles 2 j and 2 j + 1 make fragment j.
template <int KT>
__device__ __forceinline__ void pack_a(uint32_t (&frag)[KT][4], int n, const float (&v)[4]) {
  frag[n / 2][2 * (n % 2)] = pack_bf16(v[0], v[1]);
  frag[n / 2][2 * (n % 2) + 1] = pack_bf16(v[2], v[3]);
}

// ---- tiles: global FP32 or BF16 -> registers -> shared BF16 ---------------------------------
// A stage holds 4 consecutive elements a vector: an FP32 source's floats (16-byte load), rounded to BF16 as
// they go to shared memory; a BF16 source's codes as loaded (8-byte load), stored as they are. The shared
// tiles are the same: for every non-NaN code c, pack_bf16 of c's exact float is c, and the only NaN the
// trainer stores (r()'s, 0x7FFF) is pack_bf16's NaN too. Converting each BF16 element to float and back cost
// the BF16-source kernels as much as the FP32 ones' whole loads (they are issue-bound).
template <class In>
using StageVec = std::conditional_t<std::is_same_v<In, float>, float4, uint2>;
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ uint2 load4(const uint16_t* p) { return *reinterpret_cast<const uint2*>(p); }
// The 4 values as floats (exact).
__device__ __forceinline__ float4 widen4(const float4& v) { return v; }
__device__ __forceinline__ float4 widen4(const uint2& u) {
  return make_float4(bf16_widen(u.x), bf16_widen(u.x >> 16), bf16_widen(u.y), bf16_widen(u.y >> 16));
}
// The 4 values as BF16 codes (two a word).
__device__ __forceinline__ uint2 bf16x4(const float4& v) { return make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w)); }
__device__ __forceinline__ uint2 bf16x4(const uint2& u) { return u; }
template <int R, int HD, class In>
struct Stage {
  static constexpr int kVecs = R * HD / 4 / kThreads;
  static_assert(kVecs >= 1 && R * HD / 4 % kThreads == 0);
  StageVec<In> v[kVecs];
};
template <int HD>
__device__ __forceinline__ void slot(int idx, int& r, int& c) {
  r = idx / (HD / 4);
  c = 4 * (idx % (HD / 4));
}
// Rows r0 .. r0+R-1 (zero from row T on) of a row-major source, rows ld elements apart.
template <int R, int HD, class In>
__device__ __forceinline__ void g_load(Stage<R, HD, In>& s, const In* src, int64_t ld, int64_t r0, int64_t T) {
#pragma unroll
  for (int k = 0; k < Stage<R, HD, In>::kVecs; ++k) {
    int r, c;
    slot<HD>(int(threadIdx.x) + k * kThreads, r, c);
    s.v[k] = r0 + r < T ? load4(src + (r0 + r) * ld + c) : StageVec<In>{};  // zeros: +0 in both forms
  }
}
template <int R, int HD, class In>
__device__ __forceinline__ void s_store(const Stage<R, HD, In>& s, uint16_t* dst) {
#pragma unroll
  for (int k = 0; k < Stage<R, HD, In>::kVecs; ++k) {
    int r, c;
    slot<HD>(int(threadIdx.x) + k * kThreads, r, c);
    *reinterpret_cast<uint2*>(dst + r * kLds<HD> + c) = bf16x4(s.v[k]);
  }
}
template <int R, int HD, class In>
__device__ __forceinline__ void load_tile(uint16_t* dst, const In* src, int64_t ld, int64_t r0, int64_t T) {
  Stage<R, HD, In> s;
  g_load<R, HD>(s, src, ld, r0, T);
  s_store<R, HD>(s, dst);
}

// ---- dropout words ----------------------------------------------------------------------
// words4 (the random words of 4 consecutive elements, any alignment): nn_device.cuh.
__device__ __forceinline__ uint32_t shfl(uint32_t v, int src) { return __shfl_sync(0xFFFFFFFFu, v, src); }

// Row layout (forward, dQ): the words of this thread's 4 elements of an
// accumulator n-tile, rows row0 = first row of the warp's 16, columns col0 ..
// col0+7: bits[e] of element (row0 + g + 8 (e / 2), col0 + 2 t + e % 2). Thread
// t of the quad draws the group of row g + 8 (t / 2), columns col0 + 4 (t % 2) ..
// +3.
__device__ __forceinline__ void row_bits(const Args& a, int64_t bh, int64_t row0, int64_t col0, int lane,
                                         uint32_t (&bits)[4]) {
  const int g = lane >> 2, t = lane & 3;
  const int64_t row = row0 + g + 8 * (t >> 1);
  const Philox4 w = words4(a.seed, a.sid, uint64_t((bh * a.T + row) * a.T + col0 + 4 * (t & 1)));
  const int lo = (lane & ~3) | (t >> 1), hi = lo + 2;
  const bool second = (t & 1) != 0;
  const uint32_t l0 = shfl(w.v[0], lo), l1 = shfl(w.v[1], lo), l2 = shfl(w.v[2], lo), l3 = shfl(w.v[3], lo);
  const uint32_t h0 = shfl(w.v[0], hi), h1 = shfl(w.v[1], hi), h2 = shfl(w.v[2], hi), h3 = shfl(w.v[3], hi);
  bits[0] = second ? l2 : l0;
  bits[1] = second ? l3 : l1;
  bits[2] = second ? h2 : h0;
  bits[3] = second ? h3 : h1;
}
// Transposed layout (dK, dV: rows are keys, columns queries): bits[e] of
// element (key key0 + g + 8 (e / 2), query q0 + 2 t + e % 2), whose index is
// (bh T + query) T + key. Lane L draws the group of query q0 + L % 8, keys
// key0 + 4 (L / 8) .. +3.
__device__ __forceinline__ void col_bits(const Args& a, int64_t bh, int64_t key0, int64_t q0, int lane,
                                         uint32_t (&bits)[4]) {
  const int g = lane >> 2, t = lane & 3;
  const Philox4 w = words4(a.seed, a.sid, uint64_t((bh * a.T + q0 + (lane & 7)) * a.T + key0 + 4 * (lane >> 3)));
  const int which = g & 3;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int src = (2 * t + (e & 1)) + 8 * ((g >> 2) + 2 * (e >> 1));
    const uint32_t v0 = shfl(w.v[0], src), v1 = shfl(w.v[1], src), v2 = shfl(w.v[2], src), v3 = shfl(w.v[3], src);
    bits[e] = which == 0 ? v0 : which == 1 ? v1 : which == 2 ? v2 : v3;
  }
}

// ---- key range and mask of a query tile (forward, dQ) ---------------------------------------
// Key tiles of BK keys that query tile q0 .. q0 + kRows - 1 visits: all of
// them, or (causal) those up to the tile's last row.
template <int BK>
__device__ __forceinline__ int key_tiles(bool causal, int64_t q0, int64_t T) {
  const int64_t kend = causal ? (q0 + kRows < T ? q0 + kRows : T) : T;
  return int((kend + BK - 1) / BK);
}
// May a score of the warp's rows w0 .. w0 + 15 against keys k0 .. k0 + BK - 1
// be masked (a key at T or past it; causal: a key after a row)?
template <int BK>
__device__ __forceinline__ bool tile_needs_mask(bool causal, int64_t w0, int64_t k0, int64_t T) {
  return (causal && k0 + BK - 1 > w0) || k0 + BK > T;
}
// Is the score of element e of accumulator n-tile n masked: row w0 + gq +
// 8 (e / 2) against key k0 + 8 n + 2 tq + e % 2 (gq = lane / 4, tq = lane % 4)?
__device__ __forceinline__ bool score_masked(bool causal, int64_t T, int64_t w0, int64_t k0, int n, int e, int gq,
                                             int tq) {
  const int key = int(k0) + 8 * n + 2 * tq + (e & 1), row = int(w0) + gq + 8 * (e >> 1);
  return key >= int(T) || (causal && key > row);
}

// ---- forward ------------------------------------------------------------------------------
// grid (B*H, query tiles), the longest causal tiles first.
template <int HD, class In>
__global__ void __launch_bounds__(kThreads) fwd_kernel(Args a, float* out, uint16_t* out_h, float* saved) {
  constexpr int BK = kStep<HD>, LDS = kLds<HD>, NT = BK / 8, DT = HD / 8;
  __shared__ __align__(16) uint16_t sm[2 * (BK > kRows / 2 ? BK : kRows / 2) * LDS];
  uint16_t* const Ks = sm;             // [BK][LDS]
  uint16_t* const Vs = sm + BK * LDS;  // [BK][LDS]; the Q tile [64][LDS] at sm first
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, gq = lane >> 2, tq = lane & 3;
  const int64_t T = a.T, C = a.C, ld = 3 * C, BH = gridDim.x;
  const int64_t bh = blockIdx.x, b = bh / a.H, h = bh % a.H;
  const int64_t q0 = (int64_t(gridDim.y) - 1 - blockIdx.y) * kRows, w0 = q0 + 16 * warp;
  const In* qb = static_cast<const In*>(a.qkv) + b * T * ld + h * HD;  // Q of (b, h); K at +C, V at +2C

  load_tile<kRows, HD>(sm, qb, ld, q0, T);
  __syncthreads();
  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) ldsm4(qf[kk], a_addr(sm, LDS, 16 * warp, 16 * kk, lane));
  __syncthreads();

  const int nk = key_tiles<BK>(a.causal, q0, T);
  Stage<BK, HD, In> st;
  load_tile<BK, HD>(Ks, qb + C, ld, 0, T);
  __syncthreads();
  float o[DT][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int kt = 0; kt < nk; ++kt) {
    const int64_t k0 = int64_t(kt) * BK;
    g_load<BK, HD>(st, qb + 2 * C, ld, k0, T);  // V of this tile, in flight during S
    float s[NT][4] = {};
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) mma_kstep<false, LDS>(s, qf[kk], Ks, kk, lane);
    // Scale, mask, online softmax (rows w0 + gq and w0 + gq + 8).
    const bool need_mask = tile_needs_mask<BK>(a.causal, w0, k0, T);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[n][e] * a.scale2;
        // Nested, not `need_mask && score_masked(...)`: nvcc 13 compiles the
        // && form of this test into larger fwd / dQ kernels (seen in their SASS).
        if (need_mask) {
          if (score_masked(a.causal, T, w0, k0, n, e, gq, tq)) v = -INFINITY;
        }
        s[n][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    float mu[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 2));
      const float mn = fmaxf(m[r], mx[r]);
      mu[r] = mn == -INFINITY ? 0.f : mn;  // a row with nothing seen yet: exp2(-inf - 0) = 0
      const float alpha = fast_exp2(m[r] - mu[r]);
      m[r] = mn;
      l[r] *= alpha;
#pragma unroll
      for (int d = 0; d < DT; ++d) o[d][2 * r] *= alpha, o[d][2 * r + 1] *= alpha;
    }
    uint32_t pa[BK / 16][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[e] = fast_exp2(s[n][e] - mu[e >> 1]);
        l[e >> 1] += p[e];
      }
      if (a.thr != 0) {
        uint32_t bits[4];
        row_bits(a, bh, w0, k0 + 8 * n, lane, bits);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (bits[e] < a.thr) p[e] = 0.f;
      }
      pack_a(pa, n, p);
    }
    s_store<BK, HD>(st, Vs);
    __syncthreads();  // V in place; every warp is done with K
    if (kt + 1 < nk) g_load<BK, HD>(st, qb + C, ld, k0 + BK, T);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) mma_kstep<true, LDS>(o, pa[kk], Vs, kk, lane);
    if (kt + 1 < nk) s_store<BK, HD>(st, Ks);
    __syncthreads();  // next K in place; every warp is done with V
  }
  // Normalise, write out (and its BF16 output), O and lse2 for the backward.
  float f[2];
  int64_t rows[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 1);
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 2);
    f[r] = (a.thr != 0 ? a.keep_scale : 1.f) / l[r];
    rows[r] = w0 + gq + 8 * r;
    if (tq == 0 && rows[r] < T) saved[BH * T * HD + bh * T + rows[r]] = m[r] + log2f(l[r]);
  }
  float* const so = saved + bh * T * HD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= T) continue;
    const int64_t oo = (b * T + rows[r]) * C + h * HD;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
      const int col = 8 * d + 2 * tq;
      const float2 v = make_float2(o[d][2 * r] * f[r], o[d][2 * r + 1] * f[r]);
      *reinterpret_cast<float2*>(so + rows[r] * HD + col) = v;
      if (out) *reinterpret_cast<float2*>(out + oo + col) = v;
      if (out_h) *reinterpret_cast<uint32_t*>(out_h + oo + col) = pack_bf16(v.x, v.y);
    }
  }
}

// ---- backward: dQ (and D) per query tile ------------------------------------------------------
template <int HD, class In>
__global__ void __launch_bounds__(kThreads, kMinBlocks<HD>)
    dq_kernel(Args a, const float* saved, const In* dout, float* dlt, float* dqkv, uint16_t* dqkv_h) {
  constexpr int BK = kBwdStep<HD>, LDS = kLds<HD>, NT = BK / 8, DT = HD / 8;
  constexpr int R = 2 * (BK > kRows ? BK : kRows);
  __shared__ __align__(16) uint16_t sm[R * LDS];
  __shared__ float Ds[kRows];
  uint16_t* const Ks = sm;             // [BK][LDS]
  uint16_t* const Vs = sm + BK * LDS;  // [BK][LDS]; Q [64][LDS] and dout [64][LDS] at sm first
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, gq = lane >> 2, tq = lane & 3;
  const int64_t T = a.T, C = a.C, ld = 3 * C, BH = gridDim.x;
  const int64_t bh = blockIdx.x, b = bh / a.H, h = bh % a.H;
  const int64_t q0 = (int64_t(gridDim.y) - 1 - blockIdx.y) * kRows, w0 = q0 + 16 * warp;
  const In* qb = static_cast<const In*>(a.qkv) + b * T * ld + h * HD;
  const In* ob = dout + b * T * C + h * HD;

  load_tile<kRows, HD>(sm, qb, ld, q0, T);
  {
    // dout's tile, and D = rowsum(dout * O) from the FP32 values.
    Stage<kRows, HD, In> s;
    g_load<kRows, HD>(s, ob, C, q0, T);
    const float* so = saved + bh * T * HD;
#pragma unroll
    for (int k = 0; k < Stage<kRows, HD, In>::kVecs; ++k) {
      int r, c;
      slot<HD>(int(threadIdx.x) + k * kThreads, r, c);
      float dot = 0.f;
      if (q0 + r < T) {
        const float4 ov = *reinterpret_cast<const float4*>(so + (q0 + r) * HD + c);
        const float4 dv = widen4(s.v[k]);
        dot = dv.x * ov.x + dv.y * ov.y + dv.z * ov.z + dv.w * ov.w;
      }
#pragma unroll
      for (int o = 1; o < HD / 4; o <<= 1) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, o);
      if (c == 0) {
        Ds[r] = dot;
        if (q0 + r < T) dlt[bh * T + q0 + r] = dot;
      }
    }
    s_store<kRows, HD>(s, sm + kRows * LDS);
  }
  __syncthreads();
  uint32_t qf[HD / 16][4], of[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    ldsm4(qf[kk], a_addr(sm, LDS, 16 * warp, 16 * kk, lane));
    ldsm4(of[kk], a_addr(sm + kRows * LDS, LDS, 16 * warp, 16 * kk, lane));
  }
  float lse[2], dd[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = w0 + gq + 8 * r;
    lse[r] = row < T ? saved[BH * T * HD + bh * T + row] : 0.f;
    dd[r] = Ds[16 * warp + gq + 8 * r];
  }

  const int nk = key_tiles<BK>(a.causal, q0, T);
  float dq[DT][4] = {};
  for (int kt = 0; kt < nk; ++kt) {
    const int64_t k0 = int64_t(kt) * BK;
    __syncthreads();  // the previous tiles (or Q, dout) are done with
    {
      Stage<BK, HD, In> sk, sv;
      g_load<BK, HD>(sk, qb + C, ld, k0, T);
      g_load<BK, HD>(sv, qb + 2 * C, ld, k0, T);
      s_store<BK, HD>(sk, Ks);
      s_store<BK, HD>(sv, Vs);
    }
    __syncthreads();
    float s[NT][4] = {}, dp[NT][4] = {};
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) mma_kstep2<false, LDS>(s, qf[kk], Ks, dp, of[kk], Vs, kk, lane);
    const bool need_mask = tile_needs_mask<BK>(a.causal, w0, k0, T);
    uint32_t da[BK / 16][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      uint32_t bits[4] = {};
      if (a.thr != 0) row_bits(a, bh, w0, k0 + 8 * n, lane, bits);
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float p = fast_exp2(s[n][e] * a.scale2 - lse[r]);
        if (need_mask) {  // nested, as the forward's
          if (score_masked(a.causal, T, w0, k0, n, e, gq, tq)) p = 0.f;
        }
        float g = dp[n][e];
        if (a.thr != 0) g = bits[e] < a.thr ? 0.f : g * a.keep_scale;
        ds[e] = p * (g - dd[r]) * a.scale;
      }
      pack_a(da, n, ds);
    }
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) mma_kstep<true, LDS>(dq, da[kk], Ks, kk, lane);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = w0 + gq + 8 * r;
    if (row >= T) continue;
    const int64_t oo = (b * T + row) * ld + h * HD;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
      const int col = 8 * d + 2 * tq;
      if (dqkv) *reinterpret_cast<float2*>(dqkv + oo + col) = make_float2(dq[d][2 * r], dq[d][2 * r + 1]);
      if (dqkv_h) *reinterpret_cast<uint32_t*>(dqkv_h + oo + col) = pack_bf16(dq[d][2 * r], dq[d][2 * r + 1]);
    }
  }
}

// ---- backward: dK, dV per key tile ---------------------------------------------------------------
// Rows are keys (each warp 16 of the block's 64), columns the queries of a
// step of BQ rows: S^T = K Q^T, dP^T = V dout^T, dV += drop(P)^T dout, dK +=
// dS^T Q. Query steps from the key tile's first row when causal.
template <int HD, class In>
__global__ void __launch_bounds__(kThreads, kMinBlocks<HD>)
    dkv_kernel(Args a, const float* saved, const In* dout, const float* dlt, float* dqkv, uint16_t* dqkv_h) {
  constexpr int BQ = kBwdStep<HD>, LDS = kLds<HD>, NT = BQ / 8, DT = HD / 8;
  extern __shared__ float4 flash_smem[];
  uint16_t* const Ks = reinterpret_cast<uint16_t*>(flash_smem);  // [64][LDS]
  uint16_t* const Vs = Ks + kRows * LDS;                      // [64][LDS]
  uint16_t* const Qs = Vs + kRows * LDS;                      // [BQ][LDS]
  uint16_t* const Os = Qs + BQ * LDS;                         // [BQ][LDS] dout
  float* const Ls = reinterpret_cast<float*>(Os + BQ * LDS);  // [BQ] lse2
  float* const Ds = Ls + BQ;                                  // [BQ] D
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, gq = lane >> 2, tq = lane & 3;
  const int64_t T = a.T, C = a.C, ld = 3 * C, BH = gridDim.x;
  const int64_t bh = blockIdx.x, b = bh / a.H, h = bh % a.H;
  const int64_t j0 = int64_t(blockIdx.y) * kRows, w0 = j0 + 16 * warp;
  const In* qb = static_cast<const In*>(a.qkv) + b * T * ld + h * HD;
  const In* ob = dout + b * T * C + h * HD;

  load_tile<kRows, HD>(Ks, qb + C, ld, j0, T);
  load_tile<kRows, HD>(Vs, qb + 2 * C, ld, j0, T);
  float dk[DT][4] = {}, dv[DT][4] = {};
  const int64_t first = a.causal ? j0 : 0;
  for (int64_t i0 = first; i0 < T; i0 += BQ) {
    __syncthreads();  // the previous step is done with Qs, Os, Ls, Ds
    load_tile<BQ, HD>(Qs, qb, ld, i0, T);
    load_tile<BQ, HD>(Os, ob, C, i0, T);
    for (int r = int(threadIdx.x); r < BQ; r += kThreads) {
      const bool in = i0 + r < T;
      Ls[r] = in ? saved[BH * T * HD + bh * T + i0 + r] : 0.f;
      Ds[r] = in ? dlt[bh * T + i0 + r] : 0.f;
    }
    __syncthreads();
    float s[NT][4] = {}, dp[NT][4] = {};
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t kf[4], vf[4];
      ldsm4(kf, a_addr(Ks, LDS, 16 * warp, 16 * kk, lane));
      ldsm4(vf, a_addr(Vs, LDS, 16 * warp, 16 * kk, lane));
      mma_kstep2<false, LDS>(s, kf, Qs, dp, vf, Os, kk, lane);
    }
    const bool need_mask = (a.causal && w0 + 15 > i0) || i0 + BQ > T;
    uint32_t pa[BQ / 16][4], da[BQ / 16][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      uint32_t bits[4] = {};
      if (a.thr != 0) col_bits(a, bh, w0, i0 + 8 * n, lane, bits);
      float pd[4], ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = 8 * n + 2 * tq + (e & 1);  // query within the step
        float p = fast_exp2(s[n][e] * a.scale2 - Ls[qi]);
        if (need_mask) {
          const int key = int(w0) + gq + 8 * (e >> 1), q = int(i0) + qi;
          if (q >= int(T) || (a.causal && key > q)) p = 0.f;
        }
        float g = dp[n][e];
        pd[e] = p;
        if (a.thr != 0 && bits[e] < a.thr) pd[e] = 0.f, g = 0.f;
        if (a.thr != 0) g *= a.keep_scale;
        ds[e] = p * (g - Ds[qi]) * a.scale;
      }
      pack_a(pa, n, pd);
      pack_a(da, n, ds);
    }
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) mma_kstep2<true, LDS>(dv, pa[kk], Os, dk, da[kk], Qs, kk, lane);
  }
  const float vs = a.thr != 0 ? a.keep_scale : 1.f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = w0 + gq + 8 * r;
    if (row >= T) continue;
    const int64_t oo = (b * T + row) * ld + C + h * HD;  // dK; dV at + C
#pragma unroll
    for (int d = 0; d < DT; ++d) {
      const int col = 8 * d + 2 * tq;
      const float2 k2 = make_float2(dk[d][2 * r], dk[d][2 * r + 1]);
      const float2 v2 = make_float2(dv[d][2 * r] * vs, dv[d][2 * r + 1] * vs);
      if (dqkv) {
        *reinterpret_cast<float2*>(dqkv + oo + col) = k2;
        *reinterpret_cast<float2*>(dqkv + oo + C + col) = v2;
      }
      if (dqkv_h) {
        *reinterpret_cast<uint32_t*>(dqkv_h + oo + col) = pack_bf16(k2.x, k2.y);
        *reinterpret_cast<uint32_t*>(dqkv_h + oo + C + col) = pack_bf16(v2.x, v2.y);
      }
    }
  }
}
template <int HD>
constexpr size_t dkv_smem() {
  return size_t(2 * kRows + 2 * kBwdStep<HD>) * kLds<HD> * 2 + 2 * kBwdStep<HD> * sizeof(float);
}

Args make_args(const AttentionDims& d, const void* qkv) {
  Args a{};
  a.qkv = qkv;
  a.T = d.seq, a.H = d.heads, a.C = d.width;
  a.scale = d.scale;
  a.scale2 = d.scale * kLog2e;
  a.causal = d.causal;
  const DropoutParams dp = dropout_params(d.dropout);
  a.thr = dp.thr;
  a.keep_scale = dp.keep_scale;
  a.seed = d.seed, a.sid = d.stream_id;
  return a;
}

template <class F>
void with_head_dim(int64_t hd, F&& f) {
  switch (hd) {
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    default: return f(std::integral_constant<int, 128>{});
  }
}

dim3 grid_of(const AttentionDims& d) {
  return dim3(unsigned(d.batch * d.heads), unsigned((d.seq + kRows - 1) / kRows));
}

// The kernels on sources of element type In (float: FP32 tensors; uint16_t: BF16 tensors).
template <class In>
void forward_with(const AttentionDims& d, const In* qkv, float* out, float* saved, uint16_t* out_h, cudaStream_t st) {
  const Args a = make_args(d, qkv);
  with_head_dim(d.width / d.heads, [&](auto hd) {
    fwd_kernel<hd.value, In><<<grid_of(d), kThreads, 0, st>>>(a, out, out_h, saved);
    check_launch("flash fwd_kernel");
  });
}
template <class In>
void backward_with(const AttentionDims& d, const In* qkv, const float* saved, const In* dout, float* dlt, float* dqkv,
                   uint16_t* dqkv_h, cudaStream_t st) {
  const Args a = make_args(d, qkv);
  with_head_dim(d.width / d.heads, [&](auto hd) {
    constexpr int HD = hd.value;
    dq_kernel<HD, In><<<grid_of(d), kThreads, 0, st>>>(a, saved, dout, dlt, dqkv, dqkv_h);
    check_launch("flash dq_kernel");
    constexpr size_t smem = dkv_smem<HD>();
    static_assert(smem <= kMaxSmem);
    static std::once_flag once;  // one per (In, HD) instantiation
    std::call_once(once, [&] {
      check(cudaFuncSetAttribute(dkv_kernel<HD, In>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
            "flash dkv_kernel smem");
    });
    dkv_kernel<HD, In><<<grid_of(d), kThreads, smem, st>>>(a, saved, dout, dlt, dqkv, dqkv_h);
    check_launch("flash dkv_kernel");
  });
}

}  // namespace flash
}  // namespace

std::string Attention::flash_unsupported(const AttentionDims& d, std::initializer_list<const void*> ptrs) {
  const int64_t hd = d.heads > 0 ? d.width / d.heads : 0;
  if (!train::flash_head_dim_ok(hd))
    return "head dim " + std::to_string(hd) + " (bf16_flash takes 16, 32, 64 or 128)";
  if ((d.seq + flash::kRows - 1) / flash::kRows > 65535) return "sequence length " + std::to_string(d.seq);
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return "a pointer that is not 16-byte aligned";
  return {};
}

int64_t Attention::saved_floats(const AttentionDims& d) {
  const int64_t rows = d.batch * d.heads * d.seq;
  return d.bf16_flash ? rows * (d.width / d.heads + 1) : rows * d.seq;
}

void Attention::forward_flash(const AttentionDims& d, const float* qkv, const uint16_t* qkv_h, float* out, float* saved,
                              uint16_t* out_h) {
  const std::string why = flash_unsupported(d, {qkv, qkv_h, out, saved});
  if (!why.empty()) throw Error("attention: bf16_flash cannot run " + why);
  if (qkv_h)
    flash::forward_with(d, qkv_h, out, saved, out_h, stream_);
  else
    flash::forward_with(d, qkv, out, saved, out_h, stream_);
}

void Attention::backward_flash(const AttentionDims& d, const float* qkv, const uint16_t* qkv_h, const float* saved,
                               const float* dout, const uint16_t* dout_h, float* dqkv, uint16_t* dqkv_h) {
  const std::string why = flash_unsupported(d, {qkv, qkv_h, saved, dout, dout_h, dqkv});
  if (!why.empty()) throw Error("attention: bf16_flash cannot run " + why);
  float* dlt = dlt_.at_least(size_t(d.batch * d.heads * d.seq));
  // One element type for both sources: a BF16 one beside an FP32 one is widened first (the same values).
  if (qkv_h && !dout_h) {
    qkv = widened(qkv_h, d.batch * d.seq * 3 * d.width, 0);
    qkv_h = nullptr;
  } else if (dout_h && !qkv_h) {
    dout = widened(dout_h, d.batch * d.seq * d.width, 1);
    dout_h = nullptr;
  }
  if (qkv_h)
    flash::backward_with(d, qkv_h, saved, dout_h, dlt, dqkv, dqkv_h, stream_);
  else
    flash::backward_with(d, qkv, saved, dout, dlt, dqkv, dqkv_h, stream_);
}

}  // namespace fp4lab::cuda::nn
