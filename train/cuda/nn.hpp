// Neural-network kernels of the trainer's CUDA backend (train/cuda/backend.cpp),
// behind a plain device-pointer API: every pointer below is a DEVICE pointer
// unless it says "host"; every matrix is row-major float32 with the stated
// shape and no padding (leading dimension = column count unless an `ld` is
// given). Work is queued on `stream` (the legacy default stream when null);
// functions return without synchronising unless they return a host value.
//
// Numerics (the CPU backend, train/cpu/backend.cpp, is the reference):
// - IEEE FP32 everywhere: nvcc compiles this with --fmad=false -prec-div=true
//   -ftz=false, so an expression evaluates as the same sequence of FP32
//   operations as its C++ twin on the CPU; the exceptions are the libm
//   functions (erff/expf on the GPU are within 2 ulp of glibc's).
// - Attention products are FP32 FMAs: the fused kernels' explicit fmaf, or
//   cuBLAS in pedantic FP32 (CUBLAS_PEDANTIC_MATH: no TF32, no reduced-precision
//   reductions); only the summation order differs from the CPU's Eigen GEMMs.
// - Every reduction has a fixed order that does not depend on timing: per-row
//   reductions use a fixed lane-strided split plus a fixed shuffle/shared-memory
//   tree; column reductions and scatter-adds loop over rows in row order. No
//   floating-point atomics anywhere, so every call gives the same bits run to
//   run. Where the CPU accumulates in float64, so does the GPU.
// - Dropout draws the CPU's mask bit for bit (core/philox.hpp, see dropout()).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/philox.hpp"
#include "cuda/device.hpp"

namespace fp4lab::cuda::nn {

// Grow-only device scratch in a few independent slots (one owner, one stream).
// Growing frees the old block (cudaFree synchronises the device first).
class Scratch {
 public:
  static constexpr int kSlots = 4;
  // At least `bytes` bytes of slot `slot`, 256-byte aligned.
  void* get(int slot, size_t bytes);
  template <class T>
  T* get(int slot, size_t n) {
    return static_cast<T*>(get(slot, n * sizeof(T)));
  }

 private:
  DeviceBuffer<uint8_t> buf_[kSlots];
};

// ---- memory ----------------------------------------------------------------
// p[i] = v for i < n.
void fill(float* p, int64_t n, float v, cudaStream_t stream = nullptr);
// dst[r, 0..ncols) = src[r, 0..ncols) for r < rows; rows are `src_ld` / `dst_ld`
// floats apart (offset the pointers to start at a column).
void copy_cols(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t ncols,
               cudaStream_t stream = nullptr);
// out [n, cols] row r = x row r*stride (x has at least (n-1)*stride+1 rows).
void gather_rows(const float* x, int64_t cols, int64_t stride, float* out, int64_t n, cudaStream_t stream = nullptr);
// dx [dx_rows, cols] = 0 except row r*stride = dout row r (r < n).
void scatter_rows(const float* dout, int64_t n, int64_t cols, int64_t stride, float* dx, int64_t dx_rows,
                  cudaStream_t stream = nullptr);

// How a producer stores its FP32 output: as computed, or as r(v), its value rounded to the nearest BF16 (ties to
// even) and widened back (the BF16-activation rule of train/backend.hpp; the CPU's round_bf16_f32 bits). r() is
// applied in the producer's own pass; its `*_bf16` output and amaxes are then those of r(v), which are v's BF16
// bits anyway (r is idempotent).
enum class OutputRounding : uint8_t { none, bf16 };

// ---- elementwise -----------------------------------------------------------
// x[i] = r(x[i]) for i < n, in one pass (OutputRounding::bf16's r).
void round_bf16_inplace(float* x, int64_t n, cudaStream_t stream = nullptr);
// dst[i] = r(src[i]) for i < n (src and dst may be the same).
void copy_round_bf16(const float* src, float* dst, int64_t n, cudaStream_t stream = nullptr);
// acc[i] += r(d[i]) for i < n: a BF16 gradient widened into its FP32 accumulator.
void add_rounded_bf16(float* acc, const float* d, int64_t n, cudaStream_t stream = nullptr);
void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream = nullptr);  // y += x
void scale(float* g, int64_t n, float s, cudaStream_t stream = nullptr);               // g *= s
// The functions below that take a `*_bf16` pointer also write there (when not
// null) the round-to-nearest-even BF16 of every float they write, in the same
// pass: the BF16 GEMM operand of the trainer's next linear layer. With a
// `*_bf16` pointer, the FP32 output (y, dx, dst; LayerNorm's y; Attention's
// out and dqkv) may be null: only the BF16 values are written (a tensor
// whose FP32 values nothing reads).
//
// The functions below that take a `ProducerAmax*` also compute, when it is
// not null, the two tensor amaxes that the NVFP4 quantization of what they
// write needs (cuda/quantize.hpp quantize_dual_device's amax_given), in the
// same pass: words[0] = the max over the output of abs_bits (the float bits
// with the sign cleared: NaN bits above Inf's), words[1] = the same over its
// RHT (sim/rht.hpp rht16_forward with `signs`) down each 16-row chunk of
// every column of the output viewed as [rows, cols] (rht false: words[1] =
// words[0]). They zero words first. Needs rows * cols == n, rows % 16 == 0,
// cols % 4 == 0 and 16-byte aligned FP32 pointers (else Error).
struct ProducerAmax {
  uint32_t* words = nullptr;  // device, 2 words
  int64_t rows = 0, cols = 0;
  bool rht = false;
  float signs[16] = {};
};
// Can a producer of a [rows, cols] output whose FP32 tensors are at ptrs (null
// ones skipped) compute its amaxes (the preconditions above but the words)?
bool producer_amax_fits(int64_t rows, int64_t cols, std::initializer_list<const void*> ptrs);
// GELU, exact erf form: y = 0.5 x (1 + erf(x / sqrt 2)).
// x_h (may be null; x is then ignored): x in BF16 bits (a linear layer's output stored in BF16 alone under bf16
// activations), read widened: the bits of an FP32 x holding those values.
void gelu_forward(const float* x, float* y, int64_t n, uint16_t* y_bf16 = nullptr, cudaStream_t stream = nullptr,
                  const ProducerAmax* amax = nullptr, OutputRounding rounding = OutputRounding::none,
                  const uint16_t* x_h = nullptr);
// dx = dy * (Phi(x) + x phi(x)). x_h, dy_h: BF16 inputs, as gelu_forward's x_h.
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, uint16_t* dx_bf16 = nullptr,
                   cudaStream_t stream = nullptr, const ProducerAmax* amax = nullptr,
                   OutputRounding rounding = OutputRounding::none, const uint16_t* x_h = nullptr,
                   const uint16_t* dy_h = nullptr);

// Dropout: element i is dropped iff random_bits(seed, stream_id, i) <
// dropout_threshold(p) (core/philox.hpp, the CPU backend's rule).
using fp4lab::dropout_threshold;
// Inverted dropout in place on x[0..n): dropped elements become 0, the others
// x * (1 / (1 - p)). The element index i is x's linear index. p <= 0: no-op.
// x_bf16 is written for p <= 0 too.
void dropout(float* x, int64_t n, float p, uint64_t seed, uint64_t stream_id, uint16_t* x_bf16 = nullptr,
             cudaStream_t stream = nullptr, OutputRounding rounding = OutputRounding::none);
// The residual branch in one pass: y = dropout(y) + x, the operations (and
// bits) of dropout(y, ...) followed by add_inplace(y, x, ...); rounding: the
// dropped branch's (y = r(drop(y)) + x, the sum FP32). y_h (may be null; y is then not read): the branch in
// BF16 bits (a linear output stored in BF16 alone), read widened; out (null: y) receives the sum.
void dropout_add(float* y, const float* x, int64_t n, float p, uint64_t seed, uint64_t stream_id,
                 cudaStream_t stream = nullptr, OutputRounding rounding = OutputRounding::none,
                 const uint16_t* y_h = nullptr, float* out = nullptr);

// dst = dropout(y) out of place (y + x first, stored back into y, when x is
// not null; p <= 0: dst = y): the operations and bits of add_inplace(y, x),
// a copy of y into dst and dropout(dst, ...), in one pass. The mask index is
// the element's linear index. dst_bf16: dst's BF16 output; amax: dst's amaxes (ProducerOutputs); rounding: dst's
// (y, the residual sum, stays FP32).
void dropout_to(float* y, const float* x, float* dst, int64_t n, float p, uint64_t seed, uint64_t stream_id,
                uint16_t* dst_bf16 = nullptr, cudaStream_t stream = nullptr, const ProducerAmax* amax = nullptr,
                OutputRounding rounding = OutputRounding::none);

// ---- LayerNorm ---------------------------------------------------------------
// Per row of x [rows, cols]: mean and variance in float64 (two passes, like the
// CPU), rstd = float(1 / sqrt(var + eps)), y = (x - mean) * rstd * gamma + beta.
// gamma [cols]; beta [cols] or null; mean, rstd [rows] written.
void layernorm_forward(const float* x, const float* gamma, const float* beta, float eps, int64_t rows, int64_t cols,
                       float* y, float* mean, float* rstd, uint16_t* y_bf16 = nullptr, cudaStream_t stream = nullptr,
                       OutputRounding rounding = OutputRounding::none);
// dx [rows, cols] written (plus residual [rows, cols], one float add, where
// not null); dgamma_acc [cols] += sum_r dy * xhat and dbeta_acc [cols] (null:
// skipped) += sum_r dy, each column summed in float64 over fixed blocks of 256
// rows in row order, then the blocks in order (the CPU's order). dy_h (may be null; dy is then not read): dy in
// BF16 bits (a linear layer's dx stored in BF16 alone), read widened.
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                        int64_t rows, int64_t cols, float* dx, float* dgamma_acc, float* dbeta_acc, Scratch& scratch,
                        const float* residual = nullptr, cudaStream_t stream = nullptr,
                        const uint16_t* dy_h = nullptr);

// ---- reductions over rows ---------------------------------------------------
// out[c] += float(sum over r < rows of a[r*lda + c]) for c < cols (float64,
// fixed 256-row blocks, as layernorm_backward's dgamma).
void column_sum_acc(const float* a, int64_t lda, int64_t rows, int64_t cols, float* out, Scratch& scratch,
                    cudaStream_t stream = nullptr);
// acc [period, cols] row t += float(sum over b of d row b*period + t), b in
// increasing order, float64 (rows must be a multiple of period).
void rows_mod_sum_acc(const float* d, int64_t rows, int64_t cols, int64_t period, float* acc,
                      cudaStream_t stream = nullptr);

// ---- embeddings -------------------------------------------------------------
// out [batch*seq, C] row i = wte row idx[i] + wpe row (i % seq); idx [batch*seq]
// device int32 (the caller has range-checked it).
void embed_forward(const int32_t* idx, int64_t batch, int64_t seq, const float* wte, const float* wpe, int64_t C,
                   float* out, cudaStream_t stream = nullptr);
// Token-embedding gradient as a grouped scatter-add: for each group g <
// ngroups, row `rows[g]` of dwte_acc [*, C] += dout rows positions[offsets[g] ..
// offsets[g+1]), added one at a time in that order in float32. With positions
// increasing within a group this is the CPU's row-order scatter-add, bit for
// bit, with no atomics (one thread per (group, column)).
void embed_backward_grouped(const int32_t* rows, const int32_t* offsets, const int32_t* positions, int64_t ngroups,
                            const float* dout, int64_t C, float* dwte_acc, cudaStream_t stream = nullptr);
// ViT tokens: out [batch*(P+1), C]: row b*(P+1) = cls + pos row 0; row
// b*(P+1)+1+p = patches row b*P+p + pos row 1+p. cls [C], pos [P+1, C].
void vit_tokens_forward(const float* patches, int64_t batch, int64_t P, int64_t C, const float* cls, const float* pos,
                        float* out, cudaStream_t stream = nullptr);

// ---- softmax cross-entropy ---------------------------------------------------
// Per row r of logits [n, v] with target t = targets[r] (device, in range):
// m = the row max, arg = its first index, lse = m + log(sum_j exp(double(l_j - m))),
// loss_rows[r] = lse - l_t (float64), ok_rows[r] = (arg == t); when dlogits is
// non-null, dlogits[r, j] = float(exp(double(l_j) - lse)) * inv_n, minus inv_n at t (then rounded by `rounding`).
void cross_entropy_rows(const float* logits, const int32_t* targets, int64_t n, int64_t v, float inv_n, float* dlogits,
                        double* loss_rows, uint8_t* ok_rows, cudaStream_t stream = nullptr,
                        OutputRounding rounding = OutputRounding::none);

// ---- optimiser ---------------------------------------------------------------
// sum of g[i]^2 in float64: fixed 16384-element chunks (tree-summed), then the
// chunk sums in a fixed tree. Synchronises; returns the host value.
double sum_squares(const float* g, int64_t n, Scratch& scratch, cudaStream_t stream = nullptr);
// One step's gradient clipping, in device memory and without a host read: norm = sqrt of sum_squares's sum (the
// same order and bits) and grad_scale = clip_grad_scale(norm, max_norm) (train/grad_clip.hpp), both computed on
// the device by the host's float64 operations. Backend::adamw_step_clipped.
struct ClipRecord {
  double norm;
  float grad_scale;
};
void clip_record(const float* g, int64_t n, double max_norm, Scratch& scratch, ClipRecord* out,
                 cudaStream_t stream = nullptr);

// One AdamW step over n elements with the host-computed constants of the CPU
// backend: shrink = 1 - lr*wd (applied where decay[i] != 0 when apply_decay),
// step = lr / (1 - b1^t), bc2s = sqrt(1 - b2^t):
//   m = m + (g - m) (1 - b1);  v = v b2 + (1 - b2) g g;
//   p = p - step * (m / (sqrt(v) / bc2s + eps)).
// One AdamW step over n floats (Backend::adamw_step: g read as g * grad_scale,
// left unchanged); decay: a byte per element, nonzero where weight decay applies.
struct AdamWConstants {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float shrink = 1.0f, step = 0.0f, bc2s = 1.0f;
  float grad_scale = 1.0f;
  bool apply_decay = false;
  // m and v hold packed BF16 (MomentStorage::bf16, train/backend.hpp): read widened, stored RNE.
  bool bf16_moments = false;
};
// m, v: n floats, or with k.bf16_moments n BF16 values (2n bytes). grad_scale (device memory, may be null):
// the factor read in place of k.grad_scale (clip_record's).
void adamw_step(float* p, const float* g, void* m, void* v, const uint8_t* decay, int64_t n, const AdamWConstants& k,
                cudaStream_t stream = nullptr, const float* grad_scale = nullptr);

// ---- multi-head self-attention -------------------------------------------------
// Geometry of qkv [batch*seq, 3*width] = q | k | v column blocks; head h is
// columns h*hd .. (h+1)*hd of each block, hd = width / heads.
struct AttentionDims {
  int64_t batch = 0, seq = 0, heads = 0, width = 0;
  bool causal = false;
  float scale = 1.0f;    // multiplies q.k
  float dropout = 0.0f;  // on the probabilities (inverted dropout)
  uint64_t seed = 0, stream_id = 0;
  // The BF16 flash path (model.attention "bf16_flash"; attention_flash.cu)
  // instead of the FP32 ones: Q, K, V, dout rounded to BF16, tensor-core
  // products with FP32 accumulation, P and dS rounded to BF16 for their
  // products, online softmax; the saved tensor is the output rows and the
  // log-sum-exp (saved_floats), never the [T, T] probabilities.
  bool bf16_flash = false;
};

// Which implementation Attention runs (train/cuda/attention.cu):
// - fused: FP32 tiled kernels on the CUDA cores (explicit FMAs): one kernel for
//   scores + softmax + dropout + P.V, two for the backward (dQ per query tile;
//   dK, dV per key tile); tiles above the causal diagonal are skipped. Needs a
//   head dim of 16, 32, 64 or 128, T small enough for a 64-row tile of scores in
//   shared memory (T <= 704 / 640 / 576 / 448 at head dim 16 / 32 / 64 / 128),
//   16-byte aligned pointers.
// - cublas: batched cuBLAS SGEMMs in pedantic FP32 plus row-softmax and dropout
//   kernels; any geometry.
// - automatic: fused where it applies, cublas otherwise.
// Both give the CPU's results up to summation order (the softmax reductions of
// the fused path split each row over 4 threads instead of 32 lanes) and the
// CPU's dropout mask bit for bit; each is deterministic run to run.
// The path applies to the FP32 numerics; AttentionDims::bf16_flash selects the
// BF16 flash kernels whatever the path (a different numerics, not another
// implementation of the same one).
enum class AttentionPath { automatic, fused, cublas };

// Materialised-probability attention: the probabilities are written for the
// backward (as the CPU backend keeps them). Owns its cuBLAS handle and scratch
// (pointer arrays, [batch*heads*seq, seq] buffers for the dropped probabilities
// and the score gradient).
class Attention {
 public:
  explicit Attention(cudaStream_t stream = nullptr, AttentionPath path = AttentionPath::automatic);
  ~Attention();
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  // probs [B*H*T, T] (row (b*H + h)*T + i) = softmax over j of scale * q_i.k_j
  // (j <= i when causal; zeros beyond), the row max subtracted first and the
  // normaliser summed in float64. out [B*T, C] head h columns = drop(probs) v,
  // where element e of probs (its linear index) is dropped iff
  // random_bits(seed, stream_id, e) < dropout_threshold(dropout).
  // out_bf16 (may be null): out's BF16 output (ProducerOutputs), written in the same pass
  // (fused path) or by one rounding pass after (cuBLAS path).
  // qkv_h (may be null; qkv is then ignored): qkv in BF16 (a linear layer's output stored in BF16 alone), the
  // values an FP32 qkv holding them gives: the flash kernels load it as it is (they round on load anyway), the
  // FP32 paths read it widened into scratch.
  void forward(const AttentionDims& d, const float* qkv, float* out, float* probs, uint16_t* out_bf16 = nullptr,
               const uint16_t* qkv_h = nullptr);
  // dqkv [B*T, 3C] (every column written) from dout [B*T, C] and the saved
  // probs: dp = drop(dout v^T), ds = p * (dp - sum_j dp p) * scale (float64
  // dot), dq = ds k, dk = ds^T q, dv = drop(p)^T dout.
  // dqkv_bf16 (may be null): dqkv's BF16 output, as forward's out_bf16. qkv_h, dout_h: BF16 inputs, as
  // forward's qkv_h (the flash kernels take one element type: a BF16 input beside an FP32 one is widened).
  void backward(const AttentionDims& d, const float* qkv, const float* probs, const float* dout, float* dqkv,
                uint16_t* dqkv_bf16 = nullptr, const uint16_t* qkv_h = nullptr, const uint16_t* dout_h = nullptr);
  // With d.bf16_flash, `probs` of forward and backward is the flash path's
  // saved tensor instead (saved_floats(d) floats): the output rows in FP32 as
  // [B*H][T][hd], then the base-2 log-sum-exp of every row [B*H*T] (the
  // trainer allocates it as [B*H*T, hd + 1]). The outputs are the definition
  // above computed from BF16-rounded Q, K, V and dout with P (and dS) rounded
  // to BF16 before their products, FP32 accumulation (attention_flash.cu);
  // the same dropout mask; deterministic run to run (no atomics).
  // Floats of forward's saved tensor: B*H*T*T, or B*H*T*(hd + 1) with bf16_flash.
  static int64_t saved_floats(const AttentionDims& d);
  // Whether the flash kernels can run d with these pointers; empty when they
  // can, else the reason (head dim 16, 32, 64 or 128; 16-byte aligned pointers).
  static std::string flash_unsupported(const AttentionDims& d, std::initializer_list<const void*> ptrs);

  // Whether the fused kernels can run d with these pointers (all device pointers
  // the call will use); empty when they can, else the reason.
  static std::string fused_unsupported(const AttentionDims& d, std::initializer_list<const void*> ptrs);

 private:
  void check_dims(const AttentionDims& d) const;
  bool use_fused(const AttentionDims& d, std::initializer_list<const void*> ptrs) const;
  void forward_cublas(const AttentionDims& d, const float* qkv, float* out, float* probs);
  void backward_cublas(const AttentionDims& d, const float* qkv, const float* probs, const float* dout, float* dqkv);
  void forward_fused(const AttentionDims& d, const float* qkv, float* out, float* probs, uint16_t* out_h);
  void backward_fused(const AttentionDims& d, const float* qkv, const float* probs, const float* dout, float* dqkv,
                      uint16_t* dqkv_h);
  void forward_flash(const AttentionDims& d, const float* qkv, const uint16_t* qkv_h, float* out, float* saved,
                     uint16_t* out_h);
  void backward_flash(const AttentionDims& d, const float* qkv, const uint16_t* qkv_h, const float* saved,
                      const float* dout, const uint16_t* dout_h, float* dqkv, uint16_t* dqkv_h);
  // The FP32 values of n BF16 values at h, in scratch slot `slot` (0: qkv, 1: dout).
  const float* widened(const uint16_t* h, int64_t n, int slot);
  cublasHandle_t h_ = nullptr;
  cudaStream_t stream_ = nullptr;
  AttentionPath path_ = AttentionPath::automatic;
  DeviceBuffer<float*> ptrs_;
  DeviceBuffer<float> pd_, dp_;
  DeviceBuffer<float> f32_out_;  // the cuBLAS path's FP32 output where only the BF16 output is asked for
  DeviceBuffer<float> dlt_;      // the flash backward's D = rowsum(dout * out) [B*H*T]
  DeviceBuffer<float> widen_[2];  // widened BF16 inputs (widened)
};

}  // namespace fp4lab::cuda::nn
