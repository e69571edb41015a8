// Mixture-of-experts routing kernels (moe_ops.hpp).
#include "train/cuda/moe_ops.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "cuda/device.hpp"
#include "train/cuda/nn_device.cuh"

namespace fp4lab::cuda::nn {

namespace {

using detail::kThreads;

// Warp-per-row kernels: a block of kThreads holds kThreads / kWarp warps, warp w
// of block b takes rows b * per + w (+ a grid stride), and its lanes stride
// over the row's columns in units of V floats (V = 4 where every row start is
// 16-byte aligned, else 1). Each element's arithmetic is the CPU loop's, in the
// same order, so the bits do not depend on V or on the launch shape.
constexpr int kRowsPerBlock = kThreads / detail::kWarp;

template <int V>
struct Vec;
template <>
struct Vec<1> {
  using T = float;
};
template <>
struct Vec<4> {
  using T = float4;
};

__device__ __forceinline__ float& lane(float& v, int) { return v; }
__device__ __forceinline__ float& lane(float4& v, int i) { return (&v.x)[i]; }
__device__ __forceinline__ float lane(const float& v, int) { return v; }
__device__ __forceinline__ float lane(const float4& v, int i) { return (&v.x)[i]; }

__device__ __forceinline__ int64_t first_row() { return int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y; }
__device__ __forceinline__ int64_t row_stride() { return int64_t(gridDim.x) * kRowsPerBlock; }

template <int V>
__global__ void gather_indexed_kernel(const float* __restrict__ x, int64_t cols, const int32_t* __restrict__ idx,
                                      float* __restrict__ out, int64_t n) {
  using T = typename Vec<V>::T;
  const int64_t cv = cols / V;
  for (int64_t r = first_row(); r < n; r += row_stride()) {
    const int32_t from = idx[r];
    T* o = reinterpret_cast<T*>(out + r * cols);
    if (from < 0) {
      T z;
      for (int i = 0; i < V; ++i) lane(z, i) = 0.0f;
      for (int64_t c = threadIdx.x; c < cv; c += detail::kWarp) o[c] = z;
    } else {
      const T* in = reinterpret_cast<const T*>(x + int64_t(from) * cols);
      for (int64_t c = threadIdx.x; c < cv; c += detail::kWarp) o[c] = in[c];
    }
  }
}

template <int V>
__global__ void combine_kernel(const float* __restrict__ src, int64_t cols, const int32_t* __restrict__ pos,
                               const float* __restrict__ w, int64_t k, float* __restrict__ out, int64_t tokens) {
  using T = typename Vec<V>::T;
  const int64_t cv = cols / V;
  for (int64_t t = first_row(); t < tokens; t += row_stride()) {
    for (int64_t c = threadIdx.x; c < cv; c += detail::kWarp) {
      T acc;
      for (int i = 0; i < V; ++i) lane(acc, i) = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = pos[t * k + j];
        if (p < 0) continue;  // a dropped slot
        const T s = reinterpret_cast<const T*>(src + int64_t(p) * cols)[c];
        for (int i = 0; i < V; ++i)
          lane(acc, i) = w ? lane(acc, i) + w[t * k + j] * lane(s, i) : lane(acc, i) + lane(s, i);
      }
      reinterpret_cast<T*>(out + t * cols)[c] = acc;
    }
  }
}

template <int V>
__global__ void combine_dsrc_kernel(const float* __restrict__ dout, int64_t cols, const int32_t* __restrict__ pos,
                                    const float* __restrict__ w, int64_t k, int64_t slots, float* __restrict__ dsrc) {
  using T = typename Vec<V>::T;
  const int64_t cv = cols / V;
  for (int64_t s = first_row(); s < slots; s += row_stride()) {
    const int32_t p = pos[s];
    if (p < 0) continue;
    const float ws = w[s];
    const T* g = reinterpret_cast<const T*>(dout + (s / k) * cols);
    T* d = reinterpret_cast<T*>(dsrc + int64_t(p) * cols);
    for (int64_t c = threadIdx.x; c < cv; c += detail::kWarp) {
      T v = g[c];
      for (int i = 0; i < V; ++i) lane(v, i) = ws * lane(v, i);
      d[c] = v;
    }
  }
}

// dw[s]: the lanes load 32 consecutive columns at a time and form the
// products (a float x float product is exact in float64); every lane then adds
// the 32 products in column order (broadcast by shuffles), so the sum is the
// CPU's serial float64 loop over c, bit for bit.
__global__ void combine_dw_kernel(const float* __restrict__ dout, const float* __restrict__ src, int64_t cols,
                                  const int32_t* __restrict__ pos, int64_t k, int64_t slots, float* __restrict__ dw) {
  for (int64_t s = first_row(); s < slots; s += row_stride()) {
    const int32_t p = pos[s];
    if (p < 0) {
      if (threadIdx.x == 0) dw[s] = 0.0f;
      continue;
    }
    const float* g = dout + (s / k) * cols;
    const float* x = src + int64_t(p) * cols;
    double acc = 0.0;
    for (int64_t c0 = 0; c0 < cols; c0 += detail::kWarp) {
      const int64_t c = c0 + threadIdx.x;
      const double prod = c < cols ? double(g[c]) * double(x[c]) : 0.0;
      const int n = cols - c0 < detail::kWarp ? int(cols - c0) : detail::kWarp;
      for (int j = 0; j < n; ++j) acc += __shfl_sync(0xFFFFFFFFu, prod, j);
    }
    if (threadIdx.x == 0) dw[s] = float(acc);
  }
}

// Block j of row r for i = r * blocks + j (grid stride): mx_rows.hpp's encode of that block.
__global__ void encode_rows_mx_kernel(train::MxRows m, const float* __restrict__ x, int64_t rows,
                                      uint8_t* __restrict__ out) {
  const int64_t blocks = m.scales(), rb = m.row_bytes(), n = rows * blocks;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / blocks, j = i - r * blocks, c0 = j * m.block;
    const int64_t len = m.cols - c0 < m.block ? m.cols - c0 : m.block;
    out[r * rb + m.cols + j] = train::mx_encode_block(m, x + r * m.cols + c0, len, out + r * rb + c0);
  }
}

// Element c of row r for i = r * cols + c (grid stride): mx_rows.hpp's decode.
__global__ void decode_rows_mx_kernel(train::MxRows m, const uint8_t* __restrict__ in, int64_t rows,
                                      float* __restrict__ x) {
  const int64_t n = rows * m.cols, rb = m.row_bytes();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / m.cols, c = i - r * m.cols;
    x[i] = train::mx_decode_at(m, in + r * rb, c);
  }
}

// Rows of `cols` floats as float4 when every row start and base is 16-byte aligned.
bool rows_vec4(int64_t cols, std::initializer_list<const void*> bases) {
  if (cols % 4 != 0) return false;
  for (const void* b : bases)
    if (reinterpret_cast<uintptr_t>(b) % 16 != 0) return false;
  return true;
}

unsigned row_blocks(int64_t rows) {
  return unsigned(std::clamp<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, 1, 1 << 20));
}
const dim3 kRowBlock(detail::kWarp, kRowsPerBlock);

}  // namespace

void gather_rows_indexed(const float* x, int64_t cols, const int32_t* idx, float* out, int64_t n, cudaStream_t st) {
  if (n <= 0 || cols <= 0) return;
  if (rows_vec4(cols, {x, out}))
    gather_indexed_kernel<4><<<row_blocks(n), kRowBlock, 0, st>>>(x, cols, idx, out, n);
  else
    gather_indexed_kernel<1><<<row_blocks(n), kRowBlock, 0, st>>>(x, cols, idx, out, n);
  check_launch("gather_indexed_kernel");
}

void combine_rows(const float* src, int64_t cols, const int32_t* pos, const float* w, int64_t k, float* out,
                  int64_t tokens, cudaStream_t st) {
  if (tokens <= 0 || cols <= 0) return;
  if (rows_vec4(cols, {src, out}))
    combine_kernel<4><<<row_blocks(tokens), kRowBlock, 0, st>>>(src, cols, pos, w, k, out, tokens);
  else
    combine_kernel<1><<<row_blocks(tokens), kRowBlock, 0, st>>>(src, cols, pos, w, k, out, tokens);
  check_launch("combine_kernel");
}

void combine_rows_backward(const float* dout, const float* src, int64_t cols, const int32_t* pos, const float* w,
                           int64_t k, int64_t tokens, float* dsrc, int64_t src_rows, bool all_named, float* dw,
                           cudaStream_t st) {
  const int64_t slots = tokens * k;
  if (!all_named && src_rows * cols > 0)
    check(cudaMemsetAsync(dsrc, 0, size_t(src_rows * cols) * sizeof(float), st), "combine_rows_backward (zero dsrc)");
  if (slots <= 0 || cols <= 0) return;
  if (rows_vec4(cols, {dout, dsrc}))
    combine_dsrc_kernel<4><<<row_blocks(slots), kRowBlock, 0, st>>>(dout, cols, pos, w, k, slots, dsrc);
  else
    combine_dsrc_kernel<1><<<row_blocks(slots), kRowBlock, 0, st>>>(dout, cols, pos, w, k, slots, dsrc);
  check_launch("combine_dsrc_kernel");
  combine_dw_kernel<<<row_blocks(slots), kRowBlock, 0, st>>>(dout, src, cols, pos, k, slots, dw);
  check_launch("combine_dw_kernel");
}

void encode_rows_mx(const train::MxRows& m, const float* x, int64_t rows, uint8_t* out, cudaStream_t st) {
  if (rows <= 0 || m.cols <= 0) return;
  encode_rows_mx_kernel<<<detail::blocks_for(rows * m.scales()), kThreads, 0, st>>>(m, x, rows, out);
  check_launch("encode_rows_mx_kernel");
}

void decode_rows_mx(const train::MxRows& m, const uint8_t* in, int64_t rows, float* x, cudaStream_t st) {
  if (rows <= 0 || m.cols <= 0) return;
  decode_rows_mx_kernel<<<detail::blocks_for(rows * m.cols), kThreads, 0, st>>>(m, in, rows, x);
  check_launch("decode_rows_mx_kernel");
}

}  // namespace fp4lab::cuda::nn
