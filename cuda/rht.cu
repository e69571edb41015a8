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
// Element i of src: FP32, or BF16 (its bits the top half of the FP32 value's).
template <bool Bf16In>
__device__ __forceinline__ float load_in(const void* src, int64_t i) {
  if constexpr (Bf16In)
    return bits_float(uint32_t(static_cast<const uint16_t*>(src)[i]) << 16);
  else
    return static_cast<const float*>(src)[i];
}

template <bool Forward, bool Bf16In = false>
__device__ __forceinline__ uint32_t rht_chunk(const void* src, float* dst, int64_t t, int64_t rows, int64_t cols,
                                              bool along_rows, const Signs& signs, RhtOutput out = RhtOutput::f32) {
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
      const float x = rht_output_value(out, load_in<Bf16In>(src, base + i * step));
      dst[base + i * step] = x;
      m = umax(m, abs_bits(x));
    }
    return m;
  }
  float v[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = load_in<Bf16In>(src, base + i * step);
  if constexpr (Forward) {
    rht16_forward(v, signs.s);
  } else {
    rht16_inverse(v, signs.s);
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    v[i] = rht_output_value(out, v[i]);
    dst[base + i * step] = v[i];  // src == dst: this chunk is already read
    m = umax(m, abs_bits(v[i]));
  }
  return m;
}

// The number of chunks, partial ones included.
FP4LAB_HD inline int64_t chunk_count(int64_t rows, int64_t cols, bool along_rows) {
  return along_rows ? rows * ((cols + 15) / 16) : ((rows + 15) / 16) * cols;
}

template <bool Forward, bool Bf16In = false>
__global__ void __launch_bounds__(kThreads)
    rht_kernel(const void* src, float* dst, int64_t rows, int64_t cols, bool along_rows, const Signs signs,
               uint32_t* amax_bits, RhtOutput out = RhtOutput::f32) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  uint32_t m = 0;
  if (t < chunk_count(rows, cols, along_rows))
    m = rht_chunk<Forward, Bf16In>(src, dst, t, rows, cols, along_rows, signs, out);
  if (amax_bits) {  // uniform across the grid: every lane reaches the reduction
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(amax_bits, m);
  }
}

template <bool Forward>
void launch(const void* src, bool bf16_in, float* dst, int64_t rows, int64_t cols, RhtAxis axis,
            const std::array<float, 16>& a, RhtOutput out, cudaStream_t stream, uint32_t* amax_bits) {
  if (rows < 0 || cols < 0) throw Error("RHT (cuda): negative tensor shape");
  const bool along_rows = axis == RhtAxis::rows;
  const int64_t chunks = chunk_count(rows, cols, along_rows);
  if (amax_bits) check(cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream), "RHT (cuda): cudaMemsetAsync(amax)");
  if (chunks == 0) return;
  Signs s{};
  std::copy(a.begin(), a.end(), s.s);
  const int64_t blocks = (chunks + kThreads - 1) / kThreads;
  if (blocks > 0x7FFFFFFF) throw Error("RHT (cuda): tensor too large");
  if (bf16_in)
    rht_kernel<Forward, true>
        <<<unsigned(blocks), kThreads, 0, stream>>>(src, dst, rows, cols, along_rows, s, amax_bits, out);
  else
    rht_kernel<Forward, false>
        <<<unsigned(blocks), kThreads, 0, stream>>>(src, dst, rows, cols, along_rows, s, amax_bits, out);
  check_launch(Forward ? "rht_kernel<forward>" : "rht_kernel<inverse>");
}
template <bool Forward>
void launch(const float* src, float* dst, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed, cudaStream_t stream,
            uint32_t* amax_bits) {
  launch<Forward>(src, false, dst, rows, cols, axis, rht_signs(seed), RhtOutput::f32, stream, amax_bits);
}

// Quartet II's 128-point rotation (sim/rht.hpp's rht128_quartet2_*): one thread per 128-chunk of a row
// (along_rows) or a column, a partial last chunk copied unchanged; FP64 sums in local memory.
struct Signs128 {
  float s[128];
};
template <bool Forward, bool Bf16In>
__global__ void __launch_bounds__(kThreads)
    rht128_kernel(const void* src, float* dst, int64_t rows, int64_t cols, bool along_rows, const Signs128 signs) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t len = along_rows ? cols : rows, per_line = (len + 127) / 128;
  if (t >= (along_rows ? rows : cols) * per_line) return;
  const int64_t line = t / per_line, k = t - line * per_line;
  const int64_t base = along_rows ? line * cols + k * 128 : k * 128 * cols + line, step = along_rows ? 1 : cols;
  const int64_t n = len - k * 128;
  if (n < 128) {
    for (int64_t i = 0; i < n; ++i) dst[base + i * step] = load_in<Bf16In>(src, base + i * step);
    return;
  }
  float v[128];
  for (int i = 0; i < 128; ++i) v[i] = load_in<Bf16In>(src, base + i * step);
  if constexpr (Forward) {
    rht128_quartet2_forward(v, signs.s);
  } else {
    rht128_quartet2_inverse(v, signs.s);
  }
  for (int i = 0; i < 128; ++i) dst[base + i * step] = v[i];
}

template <bool Forward>
void launch128(const void* src, bool bf16_in, float* dst, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed,
               cudaStream_t stream) {
  if (rows < 0 || cols < 0) throw Error("RHT (cuda): negative tensor shape");
  const bool along_rows = axis == RhtAxis::rows;
  const int64_t len = along_rows ? cols : rows, chunks = (along_rows ? rows : cols) * ((len + 127) / 128);
  if (chunks == 0) return;
  Signs128 s{};
  const std::array<float, 128> a = rht_signs128(seed);
  std::copy(a.begin(), a.end(), s.s);
  const int64_t blocks = (chunks + kThreads - 1) / kThreads;
  if (blocks > 0x7FFFFFFF) throw Error("RHT (cuda): tensor too large");
  if (bf16_in)
    rht128_kernel<Forward, true><<<unsigned(blocks), kThreads, 0, stream>>>(src, dst, rows, cols, along_rows, s);
  else
    rht128_kernel<Forward, false><<<unsigned(blocks), kThreads, 0, stream>>>(src, dst, rows, cols, along_rows, s);
  check_launch(Forward ? "rht128_kernel<forward>" : "rht128_kernel<inverse>");
}

}  // namespace

void rht_forward_device(float* x, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed, cudaStream_t stream) {
  launch<true>(x, x, rows, cols, axis, seed, stream, nullptr);
}
void rht_forward_device(const float* src, float* dst, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed,
                        cudaStream_t stream, uint32_t* amax_bits) {
  launch<true>(src, dst, rows, cols, axis, seed, stream, amax_bits);
}
void rht_forward_device(const float* src, float* dst, int64_t rows, int64_t cols, RhtAxis axis, RhtKind kind,
                        uint64_t seed, cudaStream_t stream) {
  if (kind == RhtKind::quartet2_128) return launch128<true>(src, false, dst, rows, cols, axis, seed, stream);
  launch<true>(src, dst, rows, cols, axis, seed, stream, nullptr);
}
void rht_inverse_device(float* x, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed, cudaStream_t stream) {
  launch<false>(x, x, rows, cols, axis, seed, stream, nullptr);
}
void rht_forward_device(const QuantizerSpec& q, const void* src, bool bf16_in, float* dst, int64_t rows, int64_t cols,
                        cudaStream_t stream) {
  if (q.rht_kind == RhtKind::quartet2_128)
    return launch128<true>(src, bf16_in, dst, rows, cols, q.block_rows == 1 ? RhtAxis::rows : RhtAxis::cols, q.rht_seed,
                           stream);
  launch<true>(src, bf16_in, dst, rows, cols, q.block_rows == 1 ? RhtAxis::rows : RhtAxis::cols,
               rht_signs(q.rht_signs, q.rht_seed), q.rht_output, stream, nullptr);
}
void rht_inverse_device(const QuantizerSpec& q, float* x, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (q.rht_kind == RhtKind::quartet2_128)
    return launch128<false>(x, false, x, rows, cols, q.block_rows == 1 ? RhtAxis::rows : RhtAxis::cols, q.rht_seed,
                            stream);
  launch<false>(x, false, x, rows, cols, q.block_rows == 1 ? RhtAxis::rows : RhtAxis::cols,
                rht_signs(q.rht_signs, q.rht_seed), RhtOutput::f32, stream, nullptr);
}

}  // namespace fp4lab::cuda
