// RHT kernels (rht.hpp): sim/rht.hpp's chunk functions, one thread per chunk.
#include "cuda/rht.hpp"

#include <algorithm>
#include <array>
#include <string>

#include "core/error.hpp"
#include "cuda/device.hpp"
#include "core/bits.hpp"

namespace fp4lab::cuda {
namespace {

constexpr int kThreads = 256;

struct Signs {
  float s[16];
};

// Transforms chunk t (its 16 elements) from src into dst; returns the max of
// their |x| bit patterns.
template <bool Forward>
__device__ __forceinline__ uint32_t rht_chunk(const float* src, float* dst, int64_t t, int64_t cols, bool along_rows,
                                              const Signs& signs) {
  // Element i of the chunk lives at base + i * step.
  int64_t base, step;
  if (along_rows) {
    base = t * 16;  // cols % 16 == 0: a row's chunks are consecutive
    step = 1;
  } else {
    const int64_t k = t / cols, c = t - k * cols;  // rows % 16 == 0
    base = k * 16 * cols + c;
    step = cols;
  }
  float v[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = src[base + i * step];
  if constexpr (Forward) {
    rht16_forward(v, signs.s);
  } else {
    rht16_inverse(v, signs.s);
  }
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    dst[base + i * step] = v[i];  // src == dst: this chunk is already read
    m = umax(m, abs_bits(v[i]));
  }
  return m;
}

template <bool Forward>
__global__ void __launch_bounds__(kThreads) rht_kernel(const float* src, float* dst, int64_t rows, int64_t cols,
                                                       bool along_rows, const Signs signs, uint32_t* amax_bits) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t chunks = rows * cols / 16;
  uint32_t m = 0;
  if (t < chunks) m = rht_chunk<Forward>(src, dst, t, cols, along_rows, signs);
  if (amax_bits) {  // uniform across the grid: every lane reaches the reduction
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(amax_bits, m);
  }
}

template <bool Forward>
void launch(const float* src, float* dst, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed, cudaStream_t stream,
            uint32_t* amax_bits) {
  if (rows < 0 || cols < 0) throw Error("RHT (cuda): negative tensor shape");
  const bool along_rows = axis == RhtAxis::rows;
  const int64_t len = along_rows ? cols : rows;
  if (len % 16 != 0)
    throw Error("RHT: the tensor's " + std::string(along_rows ? "column count" : "row count") + " (" +
                std::to_string(len) + ") must be a multiple of 16 (the transform works on whole 16-element chunks)");
  const int64_t chunks = rows * cols / 16;
  if (amax_bits) check(cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream), "RHT (cuda): cudaMemsetAsync(amax)");
  if (chunks == 0) return;
  Signs s{};
  const std::array<float, 16> a = rht_signs(seed);
  std::copy(a.begin(), a.end(), s.s);
  const int64_t blocks = (chunks + kThreads - 1) / kThreads;
  if (blocks > 0x7FFFFFFF) throw Error("RHT (cuda): tensor too large");
  rht_kernel<Forward><<<unsigned(blocks), kThreads, 0, stream>>>(src, dst, rows, cols, along_rows, s, amax_bits);
  check_launch(Forward ? "rht_kernel<forward>" : "rht_kernel<inverse>");
}

}  // namespace

void rht_forward_device(float* x, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed, cudaStream_t stream) {
  launch<true>(x, x, rows, cols, axis, seed, stream, nullptr);
}
void rht_forward_device(const float* src, float* dst, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed,
                        cudaStream_t stream, uint32_t* amax_bits) {
  launch<true>(src, dst, rows, cols, axis, seed, stream, amax_bits);
}
void rht_inverse_device(float* x, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed, cudaStream_t stream) {
  launch<false>(x, x, rows, cols, axis, seed, stream, nullptr);
}

}  // namespace fp4lab::cuda
