// The fused attention kernels of class Attention (train/cuda/nn.hpp;
// attention.cu chooses between them and the cuBLAS path): FP32 tiled kernels
// (64 query rows per block; CUDA cores, explicit FMAs) that compute scores,
// softmax, dropout and P.V in one kernel, and the backward in two (dQ per
// query tile; dK, dV per key tile); key tiles above the causal diagonal are
// skipped. Head dims 16/32/64/128.
#include <cstdint>
#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "core/philox.hpp"
#include "train/cuda/linear_ops.hpp"
#include "train/cuda/nn.hpp"
#include "train/cuda/nn_device.cuh"

namespace fp4lab::cuda::nn {

using namespace detail;

namespace {
// ---- fused attention ---------------------------------------------------------------
// Block = one (sequence, head) and one tile of kTile query rows (forward, dQ) or
// key columns (dK, dV); 256 threads as 16 x 16, thread (ty, tx) owning rows
// 4ty..4ty+3 of every output tile. Products accumulate with explicit FMAs in
// increasing k order. Row passes (softmax, the dropout mask, the dS row dot)
// give kParts threads to each row: thread part takes the column groups
// 4 (part + kParts c) .. +3, and the kParts partial results are combined by a
// fixed shuffle butterfly (parts_sum); reductions in float64 like the CPU's.
constexpr int kTile = 64;       // rows per block, columns per key tile
constexpr int kLd = kTile + 4;  // row length of transposed tiles (16-byte rows)
constexpr int kFusedThreads = 256;
constexpr int kParts = kFusedThreads / kTile;  // threads per row in the row passes
constexpr size_t kFusedMaxSmem = 200 * 1024;   // bytes of shared memory a fused block may use

struct FusedArgs {
  const float* qkv;  // [B*T, 3C]
  int64_t T, H, C;
  float scale;
  bool causal;
  uint32_t thr;  // dropout threshold; 0: no dropout
  float keep_scale;
  uint64_t seed, sid;
  bool vec_rows;    // T % 4 == 0 and the [*, T] tensors 16-byte aligned: float4 row accesses
  uint16_t* out_h;  // null, or the BF16 output (ProducerOutputs) of the output (out; dqkv): same layout
};

template <int N>
__device__ __forceinline__ void lds(const float* p, float (&v)[N]) {
  if constexpr (N == 1) {
    v[0] = p[0];
  } else if constexpr (N == 2) {
    const float2 t = *reinterpret_cast<const float2*>(p);
    v[0] = t.x, v[1] = t.y;
  } else {
#pragma unroll
    for (int c = 0; c < N; c += 4) {
      const float4 t = *reinterpret_cast<const float4*>(p + c);
      v[c] = t.x, v[c + 1] = t.y, v[c + 2] = t.z, v[c + 3] = t.w;
    }
  }
}

// acc[i][j] += sum over k < K of A[k][m0 + i] * B[k][n0 + j] (i < 4, j < N),
// one FMA per term in increasing k. A and B in shared memory, rows lda / ldb apart.
template <int N, int K>
__device__ __forceinline__ void mma_tile(const float* A, int lda, const float* B, int ldb, int m0, int n0,
                                         float (&acc)[4][N]) {
#pragma unroll 8
  for (int k = 0; k < K; ++k) {
    float a[4], b[N];
    lds<4>(A + k * lda + m0, a);
    lds<N>(B + k * ldb + n0, b);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < N; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

// Tiles of kTile rows x HD columns go global -> registers -> shared memory, so
// that the next tile's loads are in flight while the current one is used:
// fetch() reads rows row0 .. row0+kTile-1 (zero from row T on) of a row-major
// source with rows `ld` floats apart; stash_transposed() writes them as
// dst[d][r] (rows kLd apart), stash_rows() as dst[r][d] (rows HD apart).
template <int HD>
struct TileRegs {
  static constexpr int kVecs = kTile * HD / 4 / kFusedThreads;
  float4 v[kVecs];
};
// Row r and first column d of vector idx (< kTile * HD / 4) of a tile. Row
// order runs along d (whole rows per warp). Transposed order gives each warp 8
// rows x 4 vectors (64 contiguous bytes per row; its shared stores dst[d][r]
// then hit 16 banks twice instead of 2 banks 16 times).
template <int HD, bool kTransposed>
__device__ __forceinline__ void transposed_slot(int idx, int& r, int& d) {
  if constexpr (kTransposed) {
    const int lane = idx % 32, unit = idx / 32;  // unit: 8 rows x 4 vectors
    r = 8 * (unit % (kTile / 8)) + lane % 8;
    d = 4 * (4 * (unit / (kTile / 8)) + lane / 8);
  } else {
    r = idx / (HD / 4);
    d = 4 * (idx % (HD / 4));
  }
}
template <int HD, bool kTransposed>
__device__ __forceinline__ void fetch(TileRegs<HD>& t, const float* src, int64_t ld, int64_t row0, int64_t T) {
#pragma unroll
  for (int k = 0; k < TileRegs<HD>::kVecs; ++k) {
    const int idx = int(threadIdx.x) + k * kFusedThreads;
    int r, d;
    transposed_slot<HD, kTransposed>(idx, r, d);
    t.v[k] = row0 + r < T ? *reinterpret_cast<const float4*>(src + (row0 + r) * ld + d)
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}
template <int HD>
__device__ __forceinline__ void stash_transposed(const TileRegs<HD>& t, float* dst) {
#pragma unroll
  for (int k = 0; k < TileRegs<HD>::kVecs; ++k) {
    const int idx = int(threadIdx.x) + k * kFusedThreads;
    int r, d;
    transposed_slot<HD, true>(idx, r, d);
    dst[(d + 0) * kLd + r] = t.v[k].x;
    dst[(d + 1) * kLd + r] = t.v[k].y;
    dst[(d + 2) * kLd + r] = t.v[k].z;
    dst[(d + 3) * kLd + r] = t.v[k].w;
  }
}
template <int HD>
__device__ __forceinline__ void stash_rows(const TileRegs<HD>& t, float* dst) {
#pragma unroll
  for (int k = 0; k < TileRegs<HD>::kVecs; ++k) {
    const int idx = int(threadIdx.x) + k * kFusedThreads;
    *reinterpret_cast<float4*>(dst + (idx / (HD / 4)) * HD + 4 * (idx % (HD / 4))) = t.v[k];
  }
}
template <int HD>
__device__ __forceinline__ void load_transposed(float* dst, const float* src, int64_t ld, int64_t row0, int64_t T) {
  TileRegs<HD> t;
  fetch<HD, true>(t, src, ld, row0, T);
  stash_transposed<HD>(t, dst);
}

// Thread (ty, tx) of the 16 x 16 output layout: warp w holds ty = 4 (w / 2) ..
// +3 and tx = 8 (w % 2) .. +7, so one k step of mma_tile reads 4 distinct A
// and 8 distinct B vectors per warp (one shared-memory wavefront each).
__device__ __forceinline__ int tile_ty() { return 4 * int(threadIdx.x / 64) + int(threadIdx.x % 32) / 8; }
__device__ __forceinline__ int tile_tx() { return 8 * int((threadIdx.x / 32) % 2) + int(threadIdx.x % 8); }

// Thread of the row passes: warp w takes rows 8w .. 8w+7, lane l row 8w + l % 8
// and part l / 8, so one warp access covers 64 contiguous bytes of 8 rows (global
// memory) and 16 banks twice (the transposed shared tiles).
__device__ __forceinline__ int pass_row() { return 8 * int(threadIdx.x / 32) + int(threadIdx.x % 8); }
__device__ __forceinline__ int pass_part() { return int(threadIdx.x % 32) / 8; }
// Sum over the kParts threads of a row (lanes 8 apart), the same bits in each.
__device__ __forceinline__ double parts_sum(double v) {
  v += __shfl_xor_sync(0xFFFFFFFFu, v, 8);
  v += __shfl_xor_sync(0xFFFFFFFFu, v, 16);
  return v;
}

// The 4 elements p[e .. e+3] of a row-major [*, T] tensor, zero from column T on
// (j = e's column).
__device__ __forceinline__ void load_row4(const float* p, int64_t e, int64_t j, int64_t T, bool vec, float (&v)[4]) {
  if (vec && j + 4 <= T) {
    const float4 t = *reinterpret_cast<const float4*>(p + e);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = j + k < T ? p[e + k] : 0.0f;
}
__device__ __forceinline__ void store_row4(float* p, int64_t e, int64_t j, int64_t T, bool vec, const float (&v)[4]) {
  if (vec && j + 4 <= T) {
    *reinterpret_cast<float4*>(p + e) = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (j + k < T) p[e + k] = v[k];
}

// Columns query row `row` sees: 0 for padding rows (row >= T), row + 1 when
// causal, else T.
__device__ __forceinline__ int64_t row_limit(int64_t row, int64_t T, bool causal) {
  return row >= T ? 0 : (causal ? row + 1 : T);
}

// The query tile of this block (forward, dQ): (sequence, head) from blockIdx.x,
// the longest causal rows first along blockIdx.y, and the number of key tiles it
// needs (all of them, or up to its last row when causal).
struct QueryTile {
  int64_t bh, b, h, q0;
  int nk;
};
__device__ __forceinline__ QueryTile query_tile(const FusedArgs& g) {
  QueryTile t;
  t.bh = blockIdx.x, t.b = t.bh / g.H, t.h = t.bh % g.H;
  t.q0 = (int64_t(gridDim.y) - 1 - blockIdx.y) * kTile;
  const int64_t kend = g.causal ? (t.q0 + kTile < g.T ? t.q0 + kTile : g.T) : g.T;
  t.nk = int((kend + kTile - 1) / kTile);
  return t;
}

// S^T [nk * kTile][kLd] = (A B^T)^T for the query tile q0: At = A^T [HD][kLd]
// is in shared memory; B's rows (key tile kt) are staged transposed in Bt. With
// kScaled, S is multiplied by `scale` as it is stored, and rowmax[i] becomes
// the max of row 4ty+i over its columns below lim (the causal/sequence limit).
template <int HD, bool kScaled>
__device__ __forceinline__ void scores_tiles(const float* At, float* Bt, const float* bsrc, int64_t ld, int64_t T,
                                             int nk, float* St, float scale, bool causal, int64_t q0,
                                             float (&rowmax)[4]) {
  const int ty = tile_ty(), tx = tile_tx();
  TileRegs<HD> next;
  fetch<HD, true>(next, bsrc, ld, 0, T);
  for (int kt = 0; kt < nk; ++kt) {
    __syncthreads();  // Bt free
    stash_transposed<HD>(next, Bt);
    __syncthreads();
    if (kt + 1 < nk) fetch<HD, true>(next, bsrc, ld, int64_t(kt + 1) * kTile, T);
    float acc[4][4] = {};
    mma_tile<4, HD>(At, kLd, Bt, kLd, 4 * ty, 4 * tx, acc);
    if constexpr (kScaled) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t lim = row_limit(q0 + 4 * ty + i, T, causal);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[i][j] *= scale;
          if (kt * kTile + 4 * tx + j < lim) rowmax[i] = fmaxf(rowmax[i], acc[i][j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
      *reinterpret_cast<float4*>(St + (kt * kTile + 4 * tx + j) * kLd + 4 * ty) =
          make_float4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]);
  }
  __syncthreads();
}

// out rows of the tile [kTile][HD] = P B, P^T = St [nk * kTile][kLd] in shared
// memory, B's rows (key tile kt) loaded into Bs [kTile][HD]. Rows >= T skipped.
// kH: out_h is out's BF16 output (same offsets), written too, and out may
// be null (the BF16 output only); else out_h is unused (a kernel without
// BF16 outputs holds none of their code).
template <int HD, bool kH>
__device__ __forceinline__ void product_tiles(const float* St, float* Bs, const float* bsrc, int64_t ld, int64_t T,
                                              int nk, float* out, int64_t out_ld, int64_t q0, uint16_t* out_h) {
  constexpr int N = HD / 16;
  const int ty = tile_ty(), tx = tile_tx();
  float acc[4][N] = {};
  TileRegs<HD> next;
  fetch<HD, false>(next, bsrc, ld, 0, T);
  for (int kt = 0; kt < nk; ++kt) {
    __syncthreads();  // St complete, Bs free
    stash_rows<HD>(next, Bs);
    __syncthreads();
    if (kt + 1 < nk) fetch<HD, false>(next, bsrc, ld, int64_t(kt + 1) * kTile, T);
    mma_tile<N, kTile>(St + kt * kTile * kLd, kLd, Bs, HD, 4 * ty, N * tx, acc);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = q0 + 4 * ty + i;
    if (row >= T) continue;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if (!kH || out) out[row * out_ld + N * tx + j] = acc[i][j];
      if constexpr (kH) out_h[row * out_ld + N * tx + j] = uint16_t(bf16_rn(acc[i][j]));
    }
  }
}

// Forward. probs [BH*T, T] written whole (zeros beyond the causal limit); out
// [B*T, C] head h columns = drop(probs) V. grid (BH, query tiles).
template <int HD, bool kH>
__global__ void __launch_bounds__(kFusedThreads) attn_fwd_fused(FusedArgs g, float* out, float* probs) {
  extern __shared__ float4 smem_f4[];
  float* const Qt = reinterpret_cast<float*>(smem_f4);  // [HD][kLd] query tile, transposed
  float* const Kb = Qt + HD * kLd;                      // K^T tile / V tile / row partials
  float* const St = Kb + HD * kLd;                      // [nk*kTile][kLd] scores -> dropped probs, transposed
  const int64_t T = g.T, C = g.C, ld = 3 * C;
  const auto [bh, b, h, q0, nk] = query_tile(g);
  const float* qb = g.qkv + b * T * ld + h * HD;  // Q of (b, h); K at +C, V at +2C

  load_transposed<HD>(Qt, qb, ld, q0, T);
  float rowmax[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  scores_tiles<HD, true>(Qt, Kb, qb + C, ld, T, nk, St, g.scale, g.causal, q0, rowmax);

  // Row passes, as softmax_fwd_kernel per element: s = S * scale (stored by
  // scores_tiles, with each thread's row maxima), m = the row max, e = exp(s -
  // m), sum in float64, p = e * float(1 / sum).
  float* const redf = Kb;  // [2][kTile]: row maxima of the two column halves
  {
    const int ty = tile_ty(), half = int((threadIdx.x / 32) % 2);
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) {
      float m = rowmax[ii];
      for (int o = 1; o < 8; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));  // the 8 tx of a warp
      if (threadIdx.x % 8 == 0) redf[half * kTile + 4 * ty + ii] = m;
    }
  }
  __syncthreads();
  const int r = pass_row(), part = pass_part();
  const int64_t i = q0 + r;
  const int64_t lim = row_limit(i, T, g.causal);
  const float mx = fmaxf(redf[r], redf[kTile + r]);
  double sums[4] = {0.0, 0.0, 0.0, 0.0};  // one per column of a group: shorter dependency chains
#pragma unroll 2
  for (int64_t j0 = 4 * part; j0 < lim; j0 += 4 * kParts)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (j0 + k < lim) {
        float* s = St + (j0 + k) * kLd + r;
        const float e = expf(*s - mx);
        *s = e;
        sums[k] += e;
      }
  const double sum = parts_sum((sums[0] + sums[1]) + (sums[2] + sums[3]));
  const float inv = float(1.0 / sum);
  const int64_t scols = int64_t(nk) * kTile;
  const int64_t jend = scols > T ? scols : T;
  const int64_t e_row = (bh * T + i) * T;  // probs' linear index of (row i, column 0)
  for (int64_t j0 = 4 * part; j0 < jend; j0 += 4 * kParts) {
    float p[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) p[k] = j0 + k < lim ? St[(j0 + k) * kLd + r] * inv : 0.0f;
    if (i < T && j0 < T) store_row4(probs, e_row + j0, j0, T, g.vec_rows, p);
    if (j0 < scols) {
      if (g.thr != 0 && j0 < lim) {
        const Philox4 w = words4(g.seed, g.sid, uint64_t(e_row + j0));
#pragma unroll
        for (int k = 0; k < 4; ++k) p[k] = drop1(p[k], w.v[k], g.thr, g.keep_scale);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) St[(j0 + k) * kLd + r] = p[k];
    }
  }
  const int64_t o0 = b * T * C + h * HD;
  product_tiles<HD, kH>(St, Kb, qb + 2 * C, ld, T, nk, out ? out + o0 : nullptr, C, q0, g.out_h + o0);
}

// Backward, per query tile: dP = dout V^T, dropped with the forward's mask; dS =
// p (dP - sum_j dP p) scale (float64 dot) written to ds [BH*T, T] (columns below
// the tile's key end; the rest is never read); dQ = dS K into dqkv.
template <int HD, bool kH>
__global__ void __launch_bounds__(kFusedThreads)
    attn_bwd_dq_fused(FusedArgs g, const float* probs, const float* dout, float* ds, float* dqkv) {
  extern __shared__ float4 smem_f4[];
  float* const Ot = reinterpret_cast<float*>(smem_f4);  // [HD][kLd] dout tile, transposed
  float* const Kb = Ot + HD * kLd;                      // V^T tile / K tile / row partials
  float* const St = Kb + HD * kLd;                      // [nk*kTile][kLd] dP -> dS, transposed
  const int64_t T = g.T, C = g.C, ld = 3 * C;
  const auto [bh, b, h, q0, nk] = query_tile(g);
  const float* qb = g.qkv + b * T * ld + h * HD;

  load_transposed<HD>(Ot, dout + b * T * C + h * HD, C, q0, T);
  float unused[4];
  scores_tiles<HD, false>(Ot, Kb, qb + 2 * C, ld, T, nk, St, 1.0f, g.causal, q0, unused);

  const int r = pass_row(), part = pass_part();
  const int64_t i = q0 + r;
  const int64_t lim = row_limit(i, T, g.causal);
  const int64_t e_row = (bh * T + i) * T;
  // Loads of kBatch groups are issued before any is used (latency overlap).
  constexpr int kBatch = 4;
  constexpr int64_t kStep = 4 * kParts;   // columns between a thread's groups
  double dots[4] = {0.0, 0.0, 0.0, 0.0};  // one per column of a group
  for (int64_t jb = 4 * part; jb < lim; jb += kStep * kBatch) {
    float p[kBatch][4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (jb + u * kStep < lim) load_row4(probs, e_row + jb + u * kStep, jb + u * kStep, T, g.vec_rows, p[u]);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t j0 = jb + u * kStep;
      if (j0 >= lim) break;
      Philox4 w{};
      if (g.thr != 0) w = words4(g.seed, g.sid, uint64_t(e_row + j0));
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (j0 + k < lim) {
          float* s = St + (j0 + k) * kLd + r;
          const float dpd = g.thr != 0 ? drop1(*s, w.v[k], g.thr, g.keep_scale) : *s;
          *s = dpd;
          dots[k] += double(dpd) * double(p[u][k]);
        }
    }
  }
  const float dd = float(parts_sum((dots[0] + dots[1]) + (dots[2] + dots[3])));
  const int64_t scols = int64_t(nk) * kTile;
  for (int64_t jb = 4 * part; jb < scols; jb += kStep * kBatch) {
    float p[kBatch][4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t j0 = jb + u * kStep;
      if (j0 < lim)
        load_row4(probs, e_row + j0, j0, T, g.vec_rows, p[u]);
      else
        p[u][0] = p[u][1] = p[u][2] = p[u][3] = 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t j0 = jb + u * kStep;
      if (j0 >= scols) break;
      float v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float* s = St + (j0 + k) * kLd + r;
        v[k] = j0 + k < lim ? p[u][k] * (*s - dd) * g.scale : 0.0f;
        *s = v[k];
      }
      if (i < T && j0 < T) store_row4(ds, e_row + j0, j0, T, g.vec_rows, v);
    }
  }
  const int64_t o0 = b * T * ld + h * HD;
  product_tiles<HD, kH>(St, Kb, qb + C, ld, T, nk, dqkv ? dqkv + o0 : nullptr, ld, q0, g.out_h + o0);
}

// The operands of one step of attn_bwd_dkv_fused (query rows i0 .. i0+kTile-1
// against key columns j0 ..), in registers while the previous step's products
// run: P and dS [kTile][kTile] as loaded (the dropout mask is applied when they
// are stashed), dout and Q rows [kTile][HD].
template <int HD>
struct DkvRegs {
  static constexpr int kVecs = kTile * kTile / 4 / kFusedThreads;
  float p[kVecs][4], d[kVecs][4];
  TileRegs<HD> o, q;
};
template <int HD>
__device__ __forceinline__ void fetch_dkv(DkvRegs<HD>& t, const FusedArgs& g, const float* probs, const float* ds,
                                          const float* ob, const float* qb, int64_t bh, int64_t i0, int64_t j0) {
  const int64_t T = g.T;
#pragma unroll
  for (int u = 0; u < DkvRegs<HD>::kVecs; ++u) {
    const int idx = int(threadIdx.x) + u * kFusedThreads;
    const int64_t i = i0 + idx / (kTile / 4), j = j0 + 4 * (idx % (kTile / 4));
    const int64_t e = (bh * T + i) * T + j;
    if (i < T && j < T) {
      load_row4(probs, e, j, T, g.vec_rows, t.p[u]);
      load_row4(ds, e, j, T, g.vec_rows, t.d[u]);
    } else {
      t.p[u][0] = t.p[u][1] = t.p[u][2] = t.p[u][3] = 0.0f;
      t.d[u][0] = t.d[u][1] = t.d[u][2] = t.d[u][3] = 0.0f;
    }
  }
  fetch<HD, false>(t.o, ob, g.C, i0, T);
  fetch<HD, false>(t.q, qb, 3 * g.C, i0, T);
}
template <int HD>
__device__ __forceinline__ void stash_dkv(DkvRegs<HD>& t, const FusedArgs& g, int64_t bh, int64_t i0, int64_t j0,
                                          float* Ps, float* Ds, float* Os, float* Qs) {
  const int64_t T = g.T;
#pragma unroll
  for (int u = 0; u < DkvRegs<HD>::kVecs; ++u) {
    const int idx = int(threadIdx.x) + u * kFusedThreads;
    const int ii = idx / (kTile / 4), c = 4 * (idx % (kTile / 4));
    const int64_t i = i0 + ii, j = j0 + c;
    if (g.thr != 0 && i < T && j < T) {
      const Philox4 w = words4(g.seed, g.sid, uint64_t((bh * T + i) * T + j));
#pragma unroll
      for (int k = 0; k < 4; ++k) t.p[u][k] = drop1(t.p[u][k], w.v[k], g.thr, g.keep_scale);
    }
    *reinterpret_cast<float4*>(Ps + ii * kTile + c) = make_float4(t.p[u][0], t.p[u][1], t.p[u][2], t.p[u][3]);
    *reinterpret_cast<float4*>(Ds + ii * kTile + c) = make_float4(t.d[u][0], t.d[u][1], t.d[u][2], t.d[u][3]);
  }
  stash_rows<HD>(t.o, Os);
  stash_rows<HD>(t.q, Qs);
}

// Backward, per key tile j0: dV = drop(P)^T dout and dK = dS^T Q over the
// query rows that see these keys (all, or i >= j0 when causal), in row order.
// The next step's operands are loaded while the current step's products run.
template <int HD, bool kH>
__global__ void __launch_bounds__(kFusedThreads)
    attn_bwd_dkv_fused(FusedArgs g, const float* probs, const float* ds, const float* dout, float* dqkv) {
  constexpr int N = HD / 16;
  extern __shared__ float4 smem_f4[];
  float* const Ps = reinterpret_cast<float*>(smem_f4);  // [kTile][kTile] drop(P) rows i, columns j
  float* const Ds = Ps + kTile * kTile;                 // [kTile][kTile] dS
  float* const Os = Ds + kTile * kTile;                 // [kTile][HD] dout rows
  float* const Qs = Os + kTile * HD;                    // [kTile][HD] Q rows
  const int64_t T = g.T, C = g.C, ld = 3 * C;
  const int64_t bh = blockIdx.x, b = bh / g.H, h = bh % g.H;
  const int64_t j0 = int64_t(blockIdx.y) * kTile;  // causal: the first key tiles see the most rows
  const int ty = tile_ty(), tx = tile_tx();
  const float* qb = g.qkv + b * T * ld + h * HD;
  const float* ob = dout + b * T * C + h * HD;
  float acc_v[4][N] = {}, acc_k[4][N] = {};
  const int64_t first = g.causal ? j0 : 0;
  DkvRegs<HD> next;
  if (first < T) fetch_dkv<HD>(next, g, probs, ds, ob, qb, bh, first, j0);
  for (int64_t i0 = first; i0 < T; i0 += kTile) {
    __syncthreads();  // the previous step's products are done with the tiles
    stash_dkv<HD>(next, g, bh, i0, j0, Ps, Ds, Os, Qs);
    __syncthreads();
    if (i0 + kTile < T) fetch_dkv<HD>(next, g, probs, ds, ob, qb, bh, i0 + kTile, j0);
    mma_tile<N, kTile>(Ps, kTile, Os, HD, 4 * ty, N * tx, acc_v);
    mma_tile<N, kTile>(Ds, kTile, Qs, HD, 4 * ty, N * tx, acc_k);
  }
  const int64_t k0 = b * T * ld + C + h * HD;    // dK's offset; dV's is k0 + C
  float* const dk = dqkv ? dqkv + k0 : nullptr;  // null: the BF16 output only (kH)
  float* const dv = dqkv ? dk + C : nullptr;
  uint16_t* const dk_h = g.out_h + k0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = j0 + 4 * ty + i;
    if (row >= T) continue;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int64_t e = row * ld + N * tx + j;
      if (!kH || dqkv) {
        dk[e] = acc_k[i][j];
        dv[e] = acc_v[i][j];
      }
      if constexpr (kH) {
        dk_h[e] = uint16_t(bf16_rn(acc_k[i][j]));
        dk_h[e + C] = uint16_t(bf16_rn(acc_v[i][j]));
      }
    }
  }
}

// Shared memory of the fused kernels (bytes).
size_t fused_rows_smem(int64_t T, int64_t hd) {
  const int64_t nk = (T + kTile - 1) / kTile;
  return size_t(2 * hd * kLd + nk * kTile * kLd) * sizeof(float);
}
size_t fused_dkv_smem(int64_t hd) { return size_t(2 * kTile * kTile + 2 * kTile * hd) * sizeof(float); }

// Launches Kernel with `smem` bytes of dynamic shared memory (opting in to more
// than 48 KB once per kernel, on the device current at the first launch).
template <auto Kernel, class... Args>
void launch_fused(dim3 grid, size_t smem, cudaStream_t st, const char* name, Args... args) {
  static std::once_flag once;
  std::call_once(once, [&] {
    check(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kFusedMaxSmem)), name);
  });
  Kernel<<<grid, kFusedThreads, smem, st>>>(args...);
  check_launch(name);
}

}  // namespace

std::string Attention::fused_unsupported(const AttentionDims& d, std::initializer_list<const void*> ptrs) {
  const int64_t hd = d.heads > 0 ? d.width / d.heads : 0;
  if (hd != 16 && hd != 32 && hd != 64 && hd != 128)
    return "head dim " + std::to_string(hd) + " (the fused kernels take 16, 32, 64 or 128)";
  if (fused_rows_smem(d.seq, hd) > kFusedMaxSmem)
    return "sequence length " + std::to_string(d.seq) + " (a 64-row tile of scores does not fit in shared memory)";
  if ((d.seq + kTile - 1) / kTile > 65535) return "sequence length " + std::to_string(d.seq);
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return "a pointer that is not 16-byte aligned";
  return {};
}

namespace {
FusedArgs fused_args(const AttentionDims& d, const float* qkv, uint16_t* out_h) {
  FusedArgs g{};
  g.out_h = out_h;
  g.qkv = qkv;
  g.T = d.seq, g.H = d.heads, g.C = d.width;
  g.scale = d.scale;
  g.causal = d.causal;
  const DropoutParams dp = dropout_params(d.dropout);
  g.thr = dp.thr;
  g.keep_scale = dp.keep_scale;
  g.seed = d.seed, g.sid = d.stream_id;
  g.vec_rows = d.seq % 4 == 0;  // the [*, T] tensors' alignment is checked by fused_unsupported
  return g;
}

template <int HD, bool kH>
void run_fused_forward(const FusedArgs& g, int64_t BH, float* out, float* probs, cudaStream_t st) {
  const dim3 grid(unsigned(BH), unsigned((g.T + kTile - 1) / kTile));
  launch_fused<attn_fwd_fused<HD, kH>>(grid, fused_rows_smem(g.T, HD), st, "attn_fwd_fused", g, out, probs);
}
template <int HD, bool kH>
void run_fused_backward(const FusedArgs& g, int64_t BH, const float* probs, const float* dout, float* ds, float* dqkv,
                        cudaStream_t st) {
  const dim3 grid(unsigned(BH), unsigned((g.T + kTile - 1) / kTile));
  launch_fused<attn_bwd_dq_fused<HD, kH>>(grid, fused_rows_smem(g.T, HD), st, "attn_bwd_dq_fused", g, probs, dout, ds,
                                          dqkv);
  launch_fused<attn_bwd_dkv_fused<HD, kH>>(grid, fused_dkv_smem(HD), st, "attn_bwd_dkv_fused", g, probs,
                                           static_cast<const float*>(ds), dout, dqkv);
}
}  // namespace

namespace {
// f(std::integral_constant<int, HD>) for the head dims of the fused kernels
// (fused_unsupported has checked that hd is one of them).
template <class F>
void with_head_dim(int64_t hd, F&& f) {
  switch (hd) {
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    default: return f(std::integral_constant<int, 128>{});
  }
}
}  // namespace

void Attention::forward_fused(const AttentionDims& d, const float* qkv, float* out, float* probs, uint16_t* out_h) {
  const FusedArgs g = fused_args(d, qkv, out_h);
  const int64_t BH = d.batch * d.heads;
  with_head_dim(d.width / d.heads, [&](auto hd) {
    if (out_h)
      run_fused_forward<hd.value, true>(g, BH, out, probs, stream_);
    else
      run_fused_forward<hd.value, false>(g, BH, out, probs, stream_);
  });
}

void Attention::backward_fused(const AttentionDims& d, const float* qkv, const float* probs, const float* dout,
                               float* dqkv, uint16_t* dqkv_h) {
  const FusedArgs g = fused_args(d, qkv, dqkv_h);
  const int64_t BH = d.batch * d.heads;
  float* ds = dp_.at_least(size_t(BH * d.seq * d.seq));
  with_head_dim(d.width / d.heads, [&](auto hd) {
    if (dqkv_h)
      run_fused_backward<hd.value, true>(g, BH, probs, dout, ds, dqkv, stream_);
    else
      run_fused_backward<hd.value, false>(g, BH, probs, dout, ds, dqkv, stream_);
  });
}

}  // namespace fp4lab::cuda::nn
