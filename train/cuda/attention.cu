// Multi-head self-attention of the trainer's CUDA backend (train/cuda/nn.hpp,
// class Attention): two implementations of the same operation.
// - fused (attention_fused.cu): FP32 tiled kernels (64 query rows per block;
//   CUDA cores, explicit FMAs) that compute scores, softmax, dropout and P.V in
//   one kernel, and the backward in two (dQ per query tile; dK, dV per key
//   tile); key tiles above the causal diagonal are skipped. Head dims 16/32/64/128.
// - cublas (this file): batched pedantic-FP32 SGEMMs plus row-softmax and
//   dropout kernels (every other geometry).
// This file also holds the class's set-up and the choice between the two, and
// sends AttentionDims::bf16_flash calls to the BF16 tensor-core flash kernels
// (attention_flash.cu: another numerics, no [T, T] probabilities saved).
// Both give the probabilities the CPU gives up to summation order, with the
// CPU's dropout mask bit for bit.
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

// ---- attention -------------------------------------------------------------------

// Scaled, masked row softmax in place; one warp per row of probs [rows, T].
__global__ void softmax_fwd_kernel(float* probs, int64_t rows, int64_t T, bool causal, float scale) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  float* pr = probs + row * T;
  const int64_t i = row % T;
  const int64_t lim = causal ? i + 1 : T;
  float mx = -INFINITY;
  for (int64_t j = lane; j < lim; j += kWarp) {
    const float s = pr[j] * scale;
    pr[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = warp_max(mx);
  double sum = 0.0;
  for (int64_t j = lane; j < lim; j += kWarp) {
    const float e = expf(pr[j] - mx);
    pr[j] = e;
    sum += e;
  }
  sum = warp_sum(sum);
  const float inv = float(1.0 / sum);
  for (int64_t j = lane; j < lim; j += kWarp) pr[j] *= inv;
  for (int64_t j = lim + lane; j < T; j += kWarp) pr[j] = 0.0f;
}
// ds = p * (dp - sum_j dp p) * scale in place of dp; one warp per row.
__global__ void softmax_bwd_kernel(const float* probs, float* dp, int64_t rows, int64_t T, float scale) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const float* pr = probs + row * T;
  float* dr = dp + row * T;
  double dot = 0.0;
  for (int64_t j = lane; j < T; j += kWarp) dot += double(dr[j]) * double(pr[j]);
  dot = warp_sum(dot);
  const float d = float(dot);
  for (int64_t j = lane; j < T; j += kWarp) dr[j] = pr[j] * (dr[j] - d) * scale;
}

// Pointer arrays of the batched GEMMs: array a, entry b*H + h = base[a] +
// b*sb[a] + h*sh[a].
struct PtrSpec {
  float* base[6];
  int64_t sb[6], sh[6];
  int count;
};
__global__ void make_ptrs_kernel(PtrSpec s, int64_t B, int64_t H, float** out) {
  const int64_t BH = B * H;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < BH * s.count;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int a = int(e / BH);
    const int64_t bh = e % BH, b = bh / H, h = bh % H;
    out[e] = s.base[a] + b * s.sb[a] + h * s.sh[a];
  }
}

// pd = drop(p) (when pd is non-null) and dp = drop(dp), same mask.
__global__ void dropout_pair_kernel(const float* p, float* pd, float* dp, int64_t n, uint32_t thr, float keep_scale,
                                    uint64_t seed, uint64_t sid) {
  const int64_t groups = (n + 3) / 4;
  const bool vec = (pd == nullptr || (aligned16(p) && aligned16(pd))) && (dp == nullptr || aligned16(dp));
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const Philox4 r = philox_group(seed, sid, uint64_t(g));
    if (vec && g * 4 + 4 <= n) {
      if (pd) reinterpret_cast<float4*>(pd)[g] = drop4(reinterpret_cast<const float4*>(p)[g], r, thr, keep_scale);
      if (dp) {
        float4* d4 = reinterpret_cast<float4*>(dp) + g;
        *d4 = drop4(*d4, r, thr, keep_scale);
      }
      continue;
    }
    for (int k = 0; k < 4; ++k) {
      const int64_t i = g * 4 + k;
      if (i >= n) break;
      if (pd) pd[i] = drop1(p[i], r.v[k], thr, keep_scale);
      if (dp) dp[i] = drop1(dp[i], r.v[k], thr, keep_scale);
    }
  }
}

}  // namespace


// ---- Attention ------------------------------------------------------------------------

Attention::Attention(cudaStream_t stream, AttentionPath path) : stream_(stream), path_(path) {
  check_cublas_status(cublasCreate(&h_), "cublasCreate (attention)");
  try {
    check_cublas_status(cublasSetStream(h_, stream_), "cublasSetStream (attention)");
    // Pedantic FP32: no TF32 tensor cores, whatever NVIDIA_TF32_OVERRIDE says.
    check_cublas_status(cublasSetMathMode(h_, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode (attention)");
    check_cublas_status(cublasSetPointerMode(h_, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode (attention)");
  } catch (...) {
    cublasDestroy(h_);
    throw;
  }
}

Attention::~Attention() {
  if (h_) cublasDestroy(h_);
}

void Attention::check_dims(const AttentionDims& d) const {
  const int64_t imax = std::numeric_limits<int>::max();
  if (d.batch < 0 || d.seq < 0 || d.heads <= 0 || d.width <= 0 || d.width % d.heads != 0)
    throw Error("attention: width " + std::to_string(d.width) + " is not a positive multiple of heads " +
                std::to_string(d.heads));
  if (d.seq > imax || 3 * d.width > imax || d.batch * d.heads > imax)
    throw Error("attention: dimensions exceed cuBLAS's int range");
}

namespace {
// Column-major view used below: a row-major [T, hd] block with row stride ld is
// the column-major [hd, T] matrix with leading dimension ld.
void sgemm_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                   float* const* A, int64_t lda, float* const* B, int64_t ldb, float* const* C, int64_t ldc,
                   int64_t count, const char* what) {
  const float one = 1.0f, zero = 0.0f;
  check_cublas_status(cublasSgemmBatched(h, ta, tb, int(m), int(n), int(k), &one, A, int(lda), B, int(ldb), &zero, C,
                                         int(ldc), int(count)),
                      what);
}
// Entries 0, 1, 2 of s: the per-head Q, K, V blocks of a [B, T, 3C] tensor
// (row stride 3C; head h starts h * hd columns into its third).
void set_qkv(PtrSpec& s, float* qkv, int64_t T, int64_t C, int64_t hd) {
  for (int j = 0; j < 3; ++j) s.base[j] = qkv + j * C, s.sb[j] = T * 3 * C, s.sh[j] = hd;
}
}  // namespace

void Attention::forward_cublas(const AttentionDims& d, const float* qkv, float* out, float* probs) {
  const int64_t B = d.batch, T = d.seq, H = d.heads, C = d.width, hd = C / H, BH = B * H, ld = 3 * C;
  const DropoutParams drop = dropout_params(d.dropout);
  const uint32_t thr = drop.thr;
  if (thr != 0) pd_.at_least(size_t(BH * T * T));
  float* q = const_cast<float*>(qkv);
  // Arrays: 0 Q, 1 K, 2 V, 3 probs, 4 (dropped) probs used by P.V, 5 out.
  PtrSpec s{};
  s.count = 6;
  set_qkv(s, q, T, C, hd);
  s.base[3] = probs, s.sb[3] = H * T * T, s.sh[3] = T * T;
  s.base[4] = thr ? pd_.data() : probs, s.sb[4] = H * T * T, s.sh[4] = T * T;
  s.base[5] = out, s.sb[5] = T * C, s.sh[5] = hd;
  float** P = ptrs_.at_least(size_t(6 * BH));
  make_ptrs_kernel<<<blocks_for(6 * BH), kThreads, 0, stream_>>>(s, B, H, P);
  check_launch("make_ptrs_kernel");
  // probs^T (col-major [T, T]) = K Q^T: S[i][j] = q_i . k_j, unscaled (the
  // softmax kernel scales, as the CPU does after its GEMM).
  sgemm_batched(h_, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, P + 1 * BH, ld, P + 0 * BH, ld, P + 3 * BH, T, BH,
                "cublasSgemmBatched (attention scores)");
  softmax_fwd_kernel<<<warp_blocks(BH * T), kThreads, 0, stream_>>>(probs, BH * T, T, d.causal, d.scale);
  check_launch("softmax_fwd_kernel");
  if (thr != 0) {
    const int64_t n = BH * T * T;
    dropout_pair_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, stream_>>>(probs, pd_.data(), nullptr, n, thr,
                                                                           drop.keep_scale, d.seed, d.stream_id);
    check_launch("dropout_pair_kernel");
  }
  // out^T (col-major [hd, T], ld C) = V^T P^T.
  sgemm_batched(h_, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, P + 2 * BH, ld, P + 4 * BH, T, P + 5 * BH, C, BH,
                "cublasSgemmBatched (attention P.V)");
}

void Attention::backward_cublas(const AttentionDims& d, const float* qkv, const float* probs, const float* dout,
                                float* dqkv) {
  const int64_t B = d.batch, T = d.seq, H = d.heads, C = d.width, hd = C / H, BH = B * H, ld = 3 * C;
  const DropoutParams drop = dropout_params(d.dropout);
  const uint32_t thr = drop.thr;
  const size_t nn = size_t(BH * T * T);
  dp_.at_least(nn);
  if (thr != 0) pd_.at_least(nn);
  float* q = const_cast<float*>(qkv);
  // Two sets of arrays. Set 1: 0 Q, 1 K, 2 V, 3 dout, 4 dp/ds, 5 (dropped) probs.
  // Set 2: 0 dQ, 1 dK, 2 dV.
  PtrSpec s{};
  s.count = 6;
  set_qkv(s, q, T, C, hd);
  s.base[3] = const_cast<float*>(dout), s.sb[3] = T * C, s.sh[3] = hd;
  s.base[4] = dp_.data(), s.sb[4] = H * T * T, s.sh[4] = T * T;
  s.base[5] = thr ? pd_.data() : const_cast<float*>(probs), s.sb[5] = H * T * T, s.sh[5] = T * T;
  PtrSpec g{};
  g.count = 3;
  set_qkv(g, dqkv, T, C, hd);
  float** P = ptrs_.at_least(size_t(9 * BH));
  float** G = P + 6 * BH;
  make_ptrs_kernel<<<blocks_for(6 * BH), kThreads, 0, stream_>>>(s, B, H, P);
  check_launch("make_ptrs_kernel");
  make_ptrs_kernel<<<blocks_for(3 * BH), kThreads, 0, stream_>>>(g, B, H, G);
  check_launch("make_ptrs_kernel");
  // dp^T (col-major [T, T]) = V dout^T: dp[i][j] = dout_i . v_j.
  sgemm_batched(h_, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, P + 2 * BH, ld, P + 3 * BH, C, P + 4 * BH, T, BH,
                "cublasSgemmBatched (attention dP)");
  if (thr != 0) {
    const int64_t n = BH * T * T;
    dropout_pair_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, stream_>>>(probs, pd_.data(), dp_.data(), n, thr,
                                                                           drop.keep_scale, d.seed, d.stream_id);
    check_launch("dropout_pair_kernel");
  }
  // dv^T (col-major [hd, T], ld 3C) = dout^T Pd.
  sgemm_batched(h_, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, P + 3 * BH, C, P + 5 * BH, T, G + 2 * BH, ld, BH,
                "cublasSgemmBatched (attention dV)");
  softmax_bwd_kernel<<<warp_blocks(BH * T), kThreads, 0, stream_>>>(probs, dp_.data(), BH * T, T, d.scale);
  check_launch("softmax_bwd_kernel");
  // dq^T = K^T ds^T: col-major [hd, T] = Kc (hd x T) * dsc (T x T).
  sgemm_batched(h_, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, P + 1 * BH, ld, P + 4 * BH, T, G + 0 * BH, ld, BH,
                "cublasSgemmBatched (attention dQ)");
  // dk^T = Q^T ds: Qc (hd x T) * dsc^T.
  sgemm_batched(h_, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, P + 0 * BH, ld, P + 4 * BH, T, G + 1 * BH, ld, BH,
                "cublasSgemmBatched (attention dK)");
}

// ---- dispatch and the fused path ------------------------------------------------------

bool Attention::use_fused(const AttentionDims& d, std::initializer_list<const void*> ptrs) const {
  if (path_ == AttentionPath::cublas) return false;
  const std::string why = fused_unsupported(d, ptrs);
  if (why.empty()) return true;
  if (path_ == AttentionPath::fused) throw Error("attention: the fused path cannot run " + why);
  return false;
}

const float* Attention::widened(const uint16_t* h, int64_t n, int slot) {
  float* w = widen_[slot].at_least(size_t(n));
  bf16_to_f32_device(h, n, nullptr, w, stream_);
  return w;
}

void Attention::forward(const AttentionDims& d, const float* qkv, float* out, float* probs, uint16_t* out_bf16,
                        const uint16_t* qkv_h) {
  check_dims(d);
  if (!out && !out_bf16) throw Error("attention forward: no output (out and out_bf16 both null)");
  if (d.batch * d.seq == 0) return;
  if (d.bf16_flash) {
    forward_flash(d, qkv, qkv_h, out, probs, out_bf16);
    return;
  }
  if (qkv_h) qkv = widened(qkv_h, d.batch * d.seq * 3 * d.width, 0);  // the FP32 paths read FP32
  if (use_fused(d, {qkv, out, probs})) {
    forward_fused(d, qkv, out, probs, out_bf16);
  } else {
    const int64_t n = d.batch * d.seq * d.width;
    float* o = out ? out : f32_out_.at_least(size_t(n));  // the BF16 output only: FP32 in scratch first
    forward_cublas(d, qkv, o, probs);
    if (out_bf16) round_bf16_device(o, n, out_bf16, stream_);
  }
}

void Attention::backward(const AttentionDims& d, const float* qkv, const float* probs, const float* dout, float* dqkv,
                         uint16_t* dqkv_bf16, const uint16_t* qkv_h, const uint16_t* dout_h) {
  check_dims(d);
  if (!dqkv && !dqkv_bf16) throw Error("attention backward: no output (dqkv and dqkv_bf16 both null)");
  if (d.batch * d.seq == 0) return;
  if (d.bf16_flash) {
    backward_flash(d, qkv, qkv_h, probs, dout, dout_h, dqkv, dqkv_bf16);
    return;
  }
  if (qkv_h) qkv = widened(qkv_h, d.batch * d.seq * 3 * d.width, 0);  // the FP32 paths read FP32
  if (dout_h) dout = widened(dout_h, d.batch * d.seq * d.width, 1);
  if (use_fused(d, {qkv, probs, dout, dqkv})) {
    backward_fused(d, qkv, probs, dout, dqkv, dqkv_bf16);
  } else {
    const int64_t n = d.batch * d.seq * 3 * d.width;
    float* o = dqkv ? dqkv : f32_out_.at_least(size_t(n));  // the BF16 output only: FP32 in scratch first
    backward_cublas(d, qkv, probs, dout, o);
    if (dqkv_bf16) round_bf16_device(o, n, dqkv_bf16, stream_);
  }
}

}  // namespace fp4lab::cuda::nn
