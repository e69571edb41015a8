// The loss and optimiser reductions of train/cuda/nn.hpp (cross_entropy_rows, sum_squares, clip_record), out of nn.cu for
// the house's file-size limit. Each mirrors the CPU backend's loop (train/cpu/backend.cpp).
#include <cmath>
#include <climits>
#include <cstdint>

#include "core/error.hpp"
#include "train/cuda/nn.hpp"
#include "train/cuda/nn_device.cuh"
#include "train/grad_clip.hpp"

namespace fp4lab::cuda::nn {

using namespace detail;

namespace {

constexpr int64_t kSumChunk = 16384;     // sum_squares: the CPU's chunk size
constexpr int64_t kNoIndex = INT64_MAX;  // cross-entropy argmax: "no element seen"

// ---- cross-entropy ---------------------------------------------------------------

constexpr int kCeThreads = 128;
// One block per row.
__global__ void ce_kernel(const float* logits, const int32_t* targets, int64_t v, float inv_n, float* dlogits,
                          double* loss_rows, uint8_t* ok_rows, bool round) {
  __shared__ double shd[kCeThreads];
  __shared__ float shv[kCeThreads];
  __shared__ int64_t shi[kCeThreads];
  const int64_t r = blockIdx.x;
  const float* l = logits + r * v;
  const int tid = threadIdx.x;
  // First maximum: each thread's first max over its stride, then a tree that
  // prefers the larger value and, on ties, the smaller index.
  float mx = -INFINITY;
  int64_t arg = kNoIndex;
  if (tid < v) mx = l[tid], arg = tid;
  for (int64_t j = tid + kCeThreads; j < v; j += kCeThreads)
    if (l[j] > mx) mx = l[j], arg = j;
  shv[tid] = mx;
  shi[tid] = arg;
  __syncthreads();
  for (int s = kCeThreads / 2; s > 0; s >>= 1) {
    if (tid < s) {
      const float ov = shv[tid + s];
      const int64_t oi = shi[tid + s];
      if (oi != kNoIndex && (shi[tid] == kNoIndex || ov > shv[tid] || (ov == shv[tid] && oi < shi[tid])))
        shv[tid] = ov, shi[tid] = oi;
    }
    __syncthreads();
  }
  mx = shv[0];
  arg = shi[0];
  double sum = 0.0;
  for (int64_t j = tid; j < v; j += kCeThreads) sum += exp(double(l[j] - mx));
  sum = block_sum<kCeThreads>(sum, shd);
  const double lse = double(mx) + log(sum);
  const int32_t t = targets[r];
  if (tid == 0) {
    loss_rows[r] = lse - double(l[t]);
    ok_rows[r] = arg == t;
  }
  if (dlogits) {
    float* d = dlogits + r * v;
    for (int64_t j = tid; j < v; j += kCeThreads) {
      float g = float(exp(double(l[j]) - lse)) * inv_n;
      if (j == t) g -= inv_n;
      d[j] = rounded_if(round, g);
    }
  }
}

// ---- sum of squares ----------------------------------------------------------------

__global__ void sumsq_chunk_kernel(const float* g, int64_t n, double* part) {
  __shared__ double sh[kThreads];
  const int64_t b = blockIdx.x;
  const int64_t i1 = min(n, (b + 1) * kSumChunk);
  double s = 0.0;
  for (int64_t i = b * kSumChunk + threadIdx.x; i < i1; i += kThreads) s += double(g[i]) * double(g[i]);
  s = block_sum<kThreads>(s, sh);
  if (threadIdx.x == 0) part[b] = s;
}
// The chunk sums' total in a fixed tree (one block): sum_squares's result.
__device__ __forceinline__ double final_sum(const double* part, int64_t nb) {
  __shared__ double sh[kThreads];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < nb; i += kThreads) s += part[i];
  return block_sum<kThreads>(s, sh);
}
__global__ void sum_final_kernel(const double* part, int64_t nb, double* out) {
  const double s = final_sum(part, nb);
  if (threadIdx.x == 0) *out = s;
}
// The same total, then the norm and the clip factor (IEEE float64 sqrt, add and divide: the host's bits).
__global__ void clip_final_kernel(const double* part, int64_t nb, double max_norm, ClipRecord* out) {
  const double s = final_sum(part, nb);
  if (threadIdx.x == 0) {
    const double norm = sqrt(s);
    out->norm = norm;
    out->grad_scale = train::clip_grad_scale(norm, max_norm);
  }
}

}  // namespace

void clip_record(const float* g, int64_t n, double max_norm, Scratch& scratch, ClipRecord* out, cudaStream_t st) {
  const int64_t nb = n > 0 ? (n + kSumChunk - 1) / kSumChunk : 0;
  double* part = scratch.get<double>(1, size_t(nb + 1));
  if (nb > 0) {
    sumsq_chunk_kernel<<<unsigned(nb), kThreads, 0, st>>>(g, n, part);
    check_launch("sumsq_chunk_kernel");
  }
  clip_final_kernel<<<1, kThreads, 0, st>>>(part, nb, max_norm, out);
  check_launch("clip_final_kernel");
}

void cross_entropy_rows(const float* logits, const int32_t* targets, int64_t n, int64_t v, float inv_n, float* dlogits,
                        double* loss_rows, uint8_t* ok_rows, cudaStream_t st, OutputRounding rounding) {
  if (n <= 0) return;
  if (v <= 0) throw Error("cross_entropy: logits have no columns");
  if (n > (int64_t(1) << 31) - 1) throw Error("cross_entropy: too many rows");
  ce_kernel<<<unsigned(n), kCeThreads, 0, st>>>(logits, targets, v, inv_n, dlogits, loss_rows, ok_rows,
                                                rounding == OutputRounding::bf16);
  check_launch("ce_kernel");
}

double sum_squares(const float* g, int64_t n, Scratch& scratch, cudaStream_t st) {
  if (n <= 0) return 0.0;
  const int64_t nb = (n + kSumChunk - 1) / kSumChunk;
  double* part = scratch.get<double>(1, size_t(nb + 1));
  sumsq_chunk_kernel<<<unsigned(nb), kThreads, 0, st>>>(g, n, part);
  check_launch("sumsq_chunk_kernel");
  sum_final_kernel<<<1, kThreads, 0, st>>>(part, nb, part + nb);
  check_launch("sum_final_kernel");
  double r = 0.0;
  check(cudaMemcpyAsync(&r, part + nb, sizeof r, cudaMemcpyDeviceToHost, st), "sum_squares (download)");
  check(cudaStreamSynchronize(st), "sum_squares (synchronise)");
  return r;
}

}  // namespace fp4lab::cuda::nn
