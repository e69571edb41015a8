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

// Quartet II's 128-point rotation (sim/rht.hpp's rht128_quartet2_*), a warp per 128-chunk: lane L holds
// elements 4L..4L+3 in FP64; butterflies h = 1, 2 within the lane, h = 4 .. 64 across lanes (shfl_xor of lane
// bit h/4), the lower index taking a + b and the upper a - b: the same FP64 operation on the same operands as
// sim's rht128_butterflies (a + b commutes exactly), so the same bits. Along rows a warp reads its chunk
// directly (coalesced); along columns a block stages a tile of 128 rows x 32 columns in shared memory. Partial
// chunks (the axis not a multiple of 128) are copied unchanged (rht128_tail_kernel).
struct Signs128 {
  float s[128];
};
constexpr int kTileCols = 32;

template <bool Forward>
__device__ __forceinline__ void rht128_lane(float (&v)[4], int lane, const Signs128& signs) {
  double t[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    t[j] = Forward ? double(rht_output_value(RhtOutput::bf16, v[j])) * double(signs.s[4 * lane + j]) : double(v[j]);
#pragma unroll
  for (int h = 1; h < 4; h <<= 1)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (!(j & h)) {
        const double a = t[j], b = t[j + h];
        t[j] = a + b;
        t[j + h] = a - b;
      }
#pragma unroll
  for (int m = 1; m < 32; m <<= 1)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const double p = __shfl_xor_sync(0xFFFFFFFFu, t[j], m);
      t[j] = (lane & m) ? p - t[j] : t[j] + p;
    }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float y = float(t[j] * double(quartet2_rht_scale));
    v[j] = Forward ? y : y * signs.s[4 * lane + j];
  }
}

// Along rows: warp w of the grid takes whole chunk w (row w / per_row, chunk w % per_row).
template <bool Forward, bool Bf16In>
__global__ void __launch_bounds__(kThreads)
    rht128_rows_kernel(const void* src, float* dst, int64_t rows, int64_t cols, const Signs128 signs) {
  const int64_t per_row = cols / 128, w = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = int(threadIdx.x & 31);
  if (w >= rows * per_row) return;  // warp-uniform
  const int64_t base = (w / per_row) * cols + (w % per_row) * 128 + 4 * lane;
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = load_in<Bf16In>(src, base + j);
  rht128_lane<Forward>(v, lane, signs);
#pragma unroll
  for (int j = 0; j < 4; ++j) dst[base + j] = v[j];
}

// Along columns: block (k, tile) takes rows 128k .. 128k + 127 of columns 32 tile .. 32 tile + 31; its 8 warps
// take 4 columns each.
template <bool Forward, bool Bf16In>
__global__ void __launch_bounds__(kThreads)
    rht128_cols_kernel(const void* src, float* dst, int64_t cols, int64_t tiles, const Signs128 signs) {
  __shared__ float s[128][kTileCols + 1];
  const int64_t k = blockIdx.x / tiles, c0 = (blockIdx.x % tiles) * kTileCols;
  const int tc = int(threadIdx.x % kTileCols), tr = int(threadIdx.x / kTileCols), lane = int(threadIdx.x & 31);
  const bool in = c0 + tc < cols;
  for (int r = tr; r < 128; r += kThreads / kTileCols)
    s[r][tc] = in ? load_in<Bf16In>(src, (k * 128 + r) * cols + c0 + tc) : 0.0f;
  __syncthreads();
  for (int c = int(threadIdx.x / 32); c < kTileCols; c += kThreads / 32) {  // warp-uniform
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = s[4 * lane + j][c];
    rht128_lane<Forward>(v, lane, signs);
#pragma unroll
    for (int j = 0; j < 4; ++j) s[4 * lane + j][c] = v[j];
  }
  __syncthreads();
  if (in)
    for (int r = tr; r < 128; r += kThreads / kTileCols) dst[(k * 128 + r) * cols + c0 + tc] = s[r][tc];
}

// The partial chunks' elements, copied (FP32, or BF16 expanded): along rows the last cols % 128 columns of every
// row, along columns the last rows % 128 rows.
template <bool Bf16In>
__global__ void __launch_bounds__(kThreads)
    rht128_tail_kernel(const void* src, float* dst, int64_t rows, int64_t cols, bool along_rows) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t tail = along_rows ? cols % 128 : rows % 128;
  const int64_t n = along_rows ? rows * tail : tail * cols;
  if (t >= n) return;
  const int64_t i = along_rows ? (t / tail) * cols + (cols - tail) + t % tail : (rows - tail) * cols + t;
  dst[i] = load_in<Bf16In>(src, i);
}

template <bool Forward, bool Bf16In>
void launch128_typed(const void* src, float* dst, int64_t rows, int64_t cols, bool along_rows, const Signs128& s,
                     cudaStream_t stream) {
  const int64_t len = along_rows ? cols : rows, whole = len / 128;
  if (whole > 0) {
    if (along_rows) {
      const int64_t blocks = (rows * whole * 32 + kThreads - 1) / kThreads;
      if (blocks > 0x7FFFFFFF) throw Error("RHT (cuda): tensor too large");
      rht128_rows_kernel<Forward, Bf16In><<<unsigned(blocks), kThreads, 0, stream>>>(src, dst, rows, cols, s);
    } else {
      const int64_t tiles = (cols + kTileCols - 1) / kTileCols, blocks = whole * tiles;
      if (blocks > 0x7FFFFFFF) throw Error("RHT (cuda): tensor too large");
      rht128_cols_kernel<Forward, Bf16In><<<unsigned(blocks), kThreads, 0, stream>>>(src, dst, cols, tiles, s);
    }
    check_launch(Forward ? "rht128_kernel<forward>" : "rht128_kernel<inverse>");
  }
  const int64_t tail = len % 128, n = tail * (along_rows ? rows : cols);
  if (n > 0 && (Bf16In || src != dst)) {  // in place, FP32: the tail stays as it is
    rht128_tail_kernel<Bf16In>
        <<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(src, dst, rows, cols, along_rows);
    check_launch("rht128_tail_kernel");
  }
}

template <bool Forward>
void launch128(const void* src, bool bf16_in, float* dst, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed,
               cudaStream_t stream) {
  if (rows < 0 || cols < 0) throw Error("RHT (cuda): negative tensor shape");
  if (rows == 0 || cols == 0) return;
  Signs128 s{};
  const std::array<float, 128> a = rht_signs128(seed);
  std::copy(a.begin(), a.end(), s.s);
  const bool along_rows = axis == RhtAxis::rows;
  if (bf16_in)
    launch128_typed<Forward, true>(src, dst, rows, cols, along_rows, s, stream);
  else
    launch128_typed<Forward, false>(src, dst, rows, cols, along_rows, s, stream);
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
