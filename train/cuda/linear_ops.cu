// Kernels of linear_ops.hpp.
#include "train/cuda/linear_ops.hpp"

#include <algorithm>
#include <string>

#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "train/cuda/nn_device.cuh"

namespace fp4lab::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t work, const char* what) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  if (b > 0x7FFFFFFF) throw Error(std::string(what) + " (cuda): tensor too large");
  return unsigned(std::max<int64_t>(b, 1));
}

// One thread per 4 consecutive elements: a 16-byte load and an 8-byte store
// where the pointers allow, scalar accesses otherwise and in the tail.
__device__ void round_bf16_four(const float* x, int64_t n, uint16_t* bits, int64_t g) {
  const int64_t i0 = g * 4;
  if (i0 >= n) return;
  auto rn = [](float v) { return encode_rn_f32<bfloat16>(v, Overflow::nonsaturate); };
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15u) == 0 && (reinterpret_cast<uintptr_t>(bits) & 7u) == 0;
  if (vec && i0 + 4 <= n) {
    const float4 v = reinterpret_cast<const float4*>(x)[g];
    reinterpret_cast<uint2*>(bits)[g] = make_uint2(rn(v.x) | rn(v.y) << 16, rn(v.z) | rn(v.w) << 16);
    return;
  }
  for (int64_t i = i0; i < i0 + 4 && i < n; ++i) bits[i] = uint16_t(rn(x[i]));
}

__global__ void round_bf16_kernel(const float* x, int64_t n, uint16_t* bits) {
  round_bf16_four(x, n, bits, int64_t(blockIdx.x) * kThreads + threadIdx.x);
}

// Slices by value (blockIdx.y: the slice; blocks stride over its quads).
struct Bf16SliceBatch {
  Bf16Slice s[kBf16SlicesPerLaunch];
};
__global__ void round_bf16_slices_kernel(Bf16SliceBatch b) {
  const Bf16Slice& sl = b.s[blockIdx.y];
  for (int64_t g = int64_t(blockIdx.x) * kThreads + threadIdx.x; g * 4 < sl.n; g += int64_t(gridDim.x) * kThreads)
    round_bf16_four(sl.src, sl.n, sl.dst, g);
}

__global__ void bf16_to_f32_kernel(const uint16_t* bits, int64_t n, const float* scale, float* out) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  constexpr Format bf = bfloat16;  // a local copy: the namespace-scope descriptor is host data
  const float v = decode(bf, bits[i]);
  out[i] = scale ? v * *scale : v;
}

__global__ void add_bias_kernel(float* y, const float* b, int64_t rows, int64_t cols) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < rows * cols) y[i] = y[i] + b[i % cols];
}

__global__ void add_bias_bf16_kernel(float* y, const float* b, int64_t rows, int64_t cols) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < rows * cols) y[i] = nn::detail::bf16_round(y[i] + nn::detail::bf16_round(b[i % cols]));
}

__global__ void bias_round_bf16_kernel(const float* y, const float* b, int64_t rows, int64_t cols, uint16_t* out) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < rows * cols)
    out[i] = uint16_t(nn::detail::bf16_rn(b ? y[i] + nn::detail::bf16_round(b[i % cols]) : y[i]));
}

__global__ void alpha_beta_kernel(const float* ga, const float* gb, float beta, float* out) {
  out[0] = (ga ? *ga : 1.0f) * (gb ? *gb : 1.0f);
  out[1] = beta;
}

}  // namespace

void round_bf16_device(const float* x, int64_t n, uint16_t* bits, cudaStream_t stream) {
  if (n <= 0) return;
  round_bf16_kernel<<<blocks_for((n + 3) / 4, "round_bf16"), kThreads, 0, stream>>>(x, n, bits);
  check_launch("round_bf16_kernel");
}

void round_bf16_slices_device(std::span<const Bf16Slice> slices, cudaStream_t stream) {
  for (size_t first = 0; first < slices.size(); first += kBf16SlicesPerLaunch) {
    Bf16SliceBatch b{};
    const size_t count = std::min(slices.size() - first, size_t(kBf16SlicesPerLaunch));
    int64_t most = 0;
    for (size_t i = 0; i < count; ++i) b.s[i] = slices[first + i], most = std::max(most, b.s[i].n);
    if (most <= 0) continue;
    const unsigned blocks = std::min(blocks_for((most + 3) / 4, "round_bf16_slices"), 4096u);
    round_bf16_slices_kernel<<<dim3(blocks, unsigned(count)), kThreads, 0, stream>>>(b);
    check_launch("round_bf16_slices_kernel");
  }
}

void bf16_to_f32_device(const uint16_t* bits, int64_t n, const float* scale, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<blocks_for(n, "bf16_to_f32"), kThreads, 0, stream>>>(bits, n, scale, out);
  check_launch("bf16_to_f32_kernel");
}

void add_bias_device(float* y, const float* b, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  add_bias_kernel<<<blocks_for(rows * cols, "add_bias"), kThreads, 0, stream>>>(y, b, rows, cols);
  check_launch("add_bias_kernel");
}

void add_bias_bf16_device(float* y, const float* b, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  add_bias_bf16_kernel<<<blocks_for(rows * cols, "add_bias_bf16"), kThreads, 0, stream>>>(y, b, rows, cols);
  check_launch("add_bias_bf16_kernel");
}

void bias_round_bf16_device(const float* y, const float* b, int64_t rows, int64_t cols, uint16_t* out,
                            cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  bias_round_bf16_kernel<<<blocks_for(rows * cols, "bias_round_bf16"), kThreads, 0, stream>>>(y, b, rows, cols, out);
  check_launch("bias_round_bf16_kernel");
}

void alpha_beta_device(const float* ga, const float* gb, float beta, float* out, cudaStream_t stream) {
  alpha_beta_kernel<<<1, 1, 0, stream>>>(ga, gb, beta, out);
  check_launch("alpha_beta_kernel");
}

}  // namespace fp4lab::cuda
