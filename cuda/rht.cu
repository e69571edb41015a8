// RHT kernels (rht.hpp): sim/rht.hpp's chunk functions, one thread per chunk.
#include "cuda/rht.hpp"

#include <algorithm>
#include <array>

#include "core/error.hpp"
#include "cuda/device.hpp"
#include "core/bits.hpp"

namespace fp4lab::cuda {
namespace {

constexpr int kThreads = 256;

struct Signs {
  float s[16];
};

// Transforms chunk t from src into dst; returns the max of the written |x|
// bit patterns. Chunk t is chunk k of row r (along_rows: ceil(cols / 16)
// chunks a row) or of column c (ceil(rows / 16) chunks a column); a partial
// last chunk (fewer than 16 elements) is copied unchanged (sim/rht.hpp's rule).
template <bool Forward>
__device__ __forceinline__ uint32_t rht_chunk(const float* src, float* dst, int64_t t, int64_t rows, int64_t cols,
                                              bool along_rows, const Signs& signs) {
  // Element i of the chunk lives at base + i * step; n of its 16 exist.
  int64_t base, step, n;
  if (along_rows) {
    const int64_t per_row = (cols + 15) / 16, r = t / per_row, k = t - r * per_row;
    base = r * cols + k * 16;
    step = 1;
    n = cols - k * 16;
  } else {
    const int64_t k = t / cols, c = t - k * cols;
    base = k * 16 * cols + c;
    step = cols;
    n = rows - k * 16;
  }
  uint32_t m = 0;
  if (n < 16) {
    for (int64_t i = 0; i < n; ++i) {
      const float x = src[base + i * step];
      dst[base + i * step] = x;
      m = umax(m, abs_bits(x));
    }
    return m;
  }
  float v[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = src[base + i * step];
  if constexpr (Forward) {
    rht16_forward(v, signs.s);
  } else {
    rht16_inverse(v, signs.s);
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    dst[base + i * step] = v[i];  // src == dst: this chunk is already read
    m = umax(m, abs_bits(v[i]));
  }
  return m;
}

// The number of chunks, partial ones included.
FP4LAB_HD inline int64_t chunk_count(int64_t rows, int64_t cols, bool along_rows) {
  return along_rows ? rows * ((cols + 15) / 16) : ((rows + 15) / 16) * cols;
}

template <bool Forward>
__global__ void __launch_bounds__(kThreads) rht_kernel(const float* src, float* dst, int64_t rows, int64_t cols,
                                                       bool along_rows, const Signs signs, uint32_t* amax_bits) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  uint32_t m = 0;
  if (t < chunk_count(rows, cols, along_rows)) m = rht_chunk<Forward>(src, dst, t, rows, cols, along_rows, signs);
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
  const int64_t chunks = chunk_count(rows, cols, along_rows);
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
