// Kernels of train/cuda/nn.hpp. Each mirrors the corresponding loop of the CPU
// backend (train/cpu/backend.cpp) operation for operation; the comments
// say where the summation order differs (never where it depends on timing).
#include "train/cuda/nn.hpp"

#include <algorithm>
#include <bit>
#include <climits>
#include <cstdint>
#include <cmath>
#include <limits>
#include <string>

#include "core/error.hpp"
#include "core/philox.hpp"
#include "cuda/amax_device.cuh"
#include "train/cuda/nn_device.cuh"
#include "train/gelu_math.hpp"

namespace fp4lab::cuda::nn {

using namespace detail;

namespace {

constexpr int64_t kRowBlock = 256;       // column reductions: the CPU's fixed row blocking

// ---- elementwise -------------------------------------------------------------

__global__ void fill_kernel(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}
// Elementwise kernels below: thread t handles the 4 consecutive elements
// 4t..4t+3 (grid-stride), with 16-byte accesses when every pointer is 16-byte
// aligned and the group is whole, scalar ones otherwise. Same arithmetic per
// element either way.
__device__ __forceinline__ float f4_at(const float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}
__device__ __forceinline__ void f4_set(float4& v, int k, float x) {
  if (k == 0)
    v.x = x;
  else if (k == 1)
    v.y = x;
  else if (k == 2)
    v.z = x;
  else
    v.w = x;
}
// 4 consecutive BF16 outputs at out_h + 4g: one 8-byte store where aligned.
__device__ __forceinline__ void store_bf16x4(uint16_t* out_h, int64_t g, const float4& r) {
  const uint2 w = make_uint2(bf16_rn(r.x) | bf16_rn(r.y) << 16, bf16_rn(r.z) | bf16_rn(r.w) << 16);
  if ((reinterpret_cast<uintptr_t>(out_h) & 7u) == 0) {
    reinterpret_cast<uint2*>(out_h)[g] = w;
  } else {
    uint16_t* d = out_h + 4 * g;
    d[0] = uint16_t(w.x), d[1] = uint16_t(w.x >> 16), d[2] = uint16_t(w.y), d[3] = uint16_t(w.y >> 16);
  }
}
// out[i] = f(a[i], b[i]) for every i < n (b may be null: f(a[i], 0)), and
// out_h[i] = its BF16 rounding when out_h is not null. out may be null when
// out_h is not (a tensor whose FP32 values were dropped: the BF16 output only).
template <class F>
__device__ __forceinline__ void map4(int64_t n, const float* a, const float* b, float* out, F f,
                                     uint16_t* out_h = nullptr) {
  const int64_t groups = (n + 3) / 4;
  const bool vec = aligned16(a) && (b == nullptr || aligned16(b)) && aligned16(out);
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    if (vec && g * 4 + 4 <= n) {
      const float4 va = reinterpret_cast<const float4*>(a)[g];
      const float4 vb = b ? reinterpret_cast<const float4*>(b)[g] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      float4 r;
#pragma unroll
      for (int k = 0; k < 4; ++k) f4_set(r, k, f(f4_at(va, k), f4_at(vb, k)));
      if (out) reinterpret_cast<float4*>(out)[g] = r;
      if (out_h) store_bf16x4(out_h, g, r);
      continue;
    }
    for (int64_t i = g * 4; i < g * 4 + 4 && i < n; ++i) {
      const float r = f(a[i], b ? b[i] : 0.0f);
      if (out) out[i] = r;
      if (out_h) out_h[i] = uint16_t(bf16_rn(r));
    }
  }
}
__global__ void add_kernel(float* y, const float* x, int64_t n) {
  map4(n, y, x, y, [](float yi, float xi) { return yi + xi; });
}
__global__ void scale_kernel(float* g, int64_t n, float s) {
  map4(n, g, nullptr, g, [s](float v, float) { return v * s; });
}
__global__ void copy_round_kernel(const float* src, float* dst, int64_t n) {
  map4(n, src, nullptr, dst, [](float v, float) { return bf16_round(v); });
}
__global__ void add_rounded_kernel(float* acc, const float* d, int64_t n) {
  map4(n, acc, d, acc, [](float a, float g) { return a + bf16_round(g); });
}
// GELU and its derivative: train/gelu_math.hpp, the CPU backend's, so the same bits.
using train::gelu_grad;
using train::gelu_value;
__global__ void gelu_fwd_kernel(const float* x, float* y, int64_t n, uint16_t* y_h, bool round) {
  map4(
      n, x, nullptr, y,
      [round](float v, float) { return rounded_if(round, gelu_value(v)); },
      y_h);
}
__global__ void gelu_bwd_kernel(const float* x, const float* dy, float* dx, int64_t n, uint16_t* dx_h, bool round) {
  map4(
      n, x, dy, dx,
      [round](float v, float d) { return rounded_if(round, gelu_grad(v, d)); },
      dx_h);
}

// Dropout kernels: one thread per group of 4 elements (one Philox call gives
// the 4 words); 16-byte vector loads and stores where the pointers allow (the
// group's 4 elements are consecutive and group-aligned), scalar ones otherwise
// and in the tail group.
// V (1, 2 or 4) consecutive floats at p + i (i % V == 0, p 16-byte aligned).
template <int V>
__device__ __forceinline__ void load_v(const float* p, int64_t i, float (&v)[V]) {
  if constexpr (V == 4) {
    const float4 u = reinterpret_cast<const float4*>(p)[i / 4];
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
  } else if constexpr (V == 2) {
    const float2 u = reinterpret_cast<const float2*>(p)[i / 2];
    v[0] = u.x, v[1] = u.y;
  } else {
    v[0] = p[i];
  }
}
// The same from BF16 bits (a tensor stored in BF16 alone; p 8-byte aligned), widened exactly.
template <int V>
__device__ __forceinline__ void load_h(const uint16_t* p, int64_t i, float (&v)[V]) {
  if constexpr (V == 4) {
    const uint2 u = reinterpret_cast<const uint2*>(p)[i / 4];
    v[0] = bf16_widen(u.x & 0xFFFFu), v[1] = bf16_widen(u.x >> 16);
    v[2] = bf16_widen(u.y & 0xFFFFu), v[3] = bf16_widen(u.y >> 16);
  } else if constexpr (V == 2) {
    const uint32_t u = reinterpret_cast<const uint32_t*>(p)[i / 2];
    v[0] = bf16_widen(u & 0xFFFFu), v[1] = bf16_widen(u >> 16);
  } else {
    v[0] = bf16_widen(p[i]);
  }
}
// The input of a producer: FP32 values, or (h not null) BF16 bits.
template <int V>
__device__ __forceinline__ void load_in(const float* p, const uint16_t* h, int64_t i, float (&v)[V]) {
  if (h)
    load_h<V>(h, i, v);
  else
    load_v<V>(p, i, v);
}
// The residual branch: out = drop(y) + add (the operations of dropout then add_inplace, so the same bits); round:
// out = r(drop(y)) + add (dropout's OutputRounding::bf16 then the FP32 add). drop false: no mask (p = 0). y read
// from y_h (BF16 bits, a linear output stored in BF16 alone) where not null, else from y; out may be y.
template <bool Drop, bool Round>
__global__ void dropout_add_kernel(const float* y, const uint16_t* y_h, float* out, const float* add, int64_t n,
                                   uint32_t thr, float keep_scale, uint64_t seed, uint64_t sid) {
  const int64_t groups = (n + 3) / 4;
  const bool vec = aligned16(out) && aligned16(add) && (y_h ? (reinterpret_cast<uintptr_t>(y_h) & 7u) == 0 : aligned16(y));
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    Philox4 r{};
    if constexpr (Drop) r = philox_group(seed, sid, uint64_t(g));
    const auto branch = [&](float v, int k) {
      if constexpr (Drop) v = drop1(v, r.v[k], thr, keep_scale);
      if constexpr (Round) v = bf16_round(v);
      return v;
    };
    if (vec && g * 4 + 4 <= n) {
      float v[4];
      load_in<4>(y, y_h, g * 4, v);
      const float4 a = reinterpret_cast<const float4*>(add)[g];
      reinterpret_cast<float4*>(out)[g] =
          make_float4(branch(v[0], 0) + a.x, branch(v[1], 1) + a.y, branch(v[2], 2) + a.z, branch(v[3], 3) + a.w);
      continue;
    }
    for (int k = 0; k < 4; ++k) {
      const int64_t i = g * 4 + k;
      if (i >= n) break;
      float v[1];
      load_in<1>(y, y_h, i, v);
      out[i] = branch(v[0], k) + add[i];
    }
  }
}
template <int V>
__device__ __forceinline__ void store_v(float* p, int64_t i, const float (&v)[V]) {
  if constexpr (V == 4)
    reinterpret_cast<float4*>(p)[i / 4] = make_float4(v[0], v[1], v[2], v[3]);
  else if constexpr (V == 1)
    p[i] = v[0];
  else
    reinterpret_cast<float2*>(p)[i / 2] = make_float2(v[0], v[1]);
}
// Their BF16 outputs at h + i.
template <int V>
__device__ __forceinline__ void store_bf16_v(uint16_t* h, int64_t i, const float (&v)[V]) {
  if constexpr (V == 4) {
    store_bf16x4(h, i / 4, make_float4(v[0], v[1], v[2], v[3]));
  } else if constexpr (V == 1) {
    h[i] = uint16_t(bf16_rn(v[0]));
  } else if ((reinterpret_cast<uintptr_t>(h) & 3u) == 0) {
    reinterpret_cast<uint32_t*>(h)[i / 2] = bf16_rn(v[0]) | bf16_rn(v[1]) << 16;
  } else {
    h[i] = uint16_t(bf16_rn(v[0])), h[i + 1] = uint16_t(bf16_rn(v[1]));
  }
}

// The producers' per-element operations on V consecutive elements from
// element i (i % V == 0, 16-byte aligned pointers), in two steps:
// op.load<V>(i, v) reads the inputs and computes what it can without
// writing; op.store<V>(i, v) writes the outputs and leaves in v the values
// written (the output tensor's). A kernel that works on several rows loads
// them all before it stores any: a store between two loads keeps the compiler
// from moving the second load above it (the pointers might alias), which
// chained the 16 rows of a strip one memory latency after another.
//
// dst = drop(y), y += x first (stored back) when x is not null; dst_h (may be
// null) the BF16 of dst. drop: false for p <= 0 (dst = y). dst may be y (the
// in-place dropout), or null when dst_h is not (the BF16 output only). Per
// element the operations of add_inplace, copy and dropout in place; round: dst = r(drop(y)).
struct DropoutTo {
  float* y;
  const float* x;
  float* dst;
  uint16_t* dst_h;
  bool round;
  bool drop;
  uint32_t thr;
  float keep_scale;
  uint64_t seed, sid;
  // v = y (+ x).
  template <int V>
  __device__ __forceinline__ void load(int64_t i, float (&v)[V]) const {
    load_v<V>(y, i, v);
    if (x) {
      float a[V];
      load_v<V>(x, i, a);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = v[k] + a[k];
    }
  }
  template <int V>
  __device__ __forceinline__ void store(int64_t i, float (&v)[V]) const {
    if (x) store_v<V>(y, i, v);
    if (drop) {
      const Philox4 r = philox_group(seed, sid, uint64_t(i) >> 2);  // the group of elements i .. i + V - 1
      const bool hi = V == 2 && (i & 2) != 0;                       // a pair's words: 0, 1 or 2, 3
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = drop1(v[k], hi ? r.v[k + 2] : r.v[k], thr, keep_scale);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = rounded_if(round, v[k]);
    if (dst) store_v<V>(dst, i, v);
    if (dst_h) store_bf16_v<V>(dst_h, i, v);
  }
};
__global__ void dropout_to_kernel(const DropoutTo op, int64_t n) {
  const int64_t groups = (n + 3) / 4;
  const bool vec = aligned16(op.y) && (op.x == nullptr || aligned16(op.x)) && aligned16(op.dst);
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    if (vec && g * 4 + 4 <= n) {
      float v[4];
      op.load<4>(g * 4, v);
      op.store<4>(g * 4, v);
      continue;
    }
    Philox4 r{};
    if (op.drop) r = philox_group(op.seed, op.sid, uint64_t(g));
    for (int k = 0; k < 4; ++k) {
      const int64_t i = g * 4 + k;
      if (i < n) {
        float v = op.y[i];
        if (op.x) op.y[i] = v = v + op.x[i];
        if (op.drop) v = drop1(v, r.v[k], op.thr, op.keep_scale);
        v = rounded_if(op.round, v);
        if (op.dst) op.dst[i] = v;
        if (op.dst_h) op.dst_h[i] = uint16_t(bf16_rn(v));
      }
    }
  }
}

// GELU forward / backward (the operations of map4's kernels above).
struct GeluFwd {
  const float* x;
  float* y;
  uint16_t* y_h;
  bool round;            // y = r(gelu(x))
  const uint16_t* x_bf;  // x in BF16 (x unused), or null
  template <int V>
  __device__ __forceinline__ void load(int64_t i, float (&r)[V]) const {
    load_in<V>(x, x_bf, i, r);
#pragma unroll
    for (int k = 0; k < V; ++k) r[k] = rounded_if(round, gelu_value(r[k]));
  }
  template <int V>
  __device__ __forceinline__ void store(int64_t i, float (&r)[V]) const {
    if (y) store_v<V>(y, i, r);
    if (y_h) store_bf16_v<V>(y_h, i, r);
  }
};
struct GeluBwd {
  const float *x, *dy;
  float* dx;
  uint16_t* dx_h;
  bool round;                     // dx = r(gelu'(x) dy)
  const uint16_t *x_bf, *dy_bf;  // x, dy in BF16 (x, dy unused), or null
  template <int V>
  __device__ __forceinline__ void load(int64_t i, float (&r)[V]) const {
    float d[V];
    load_in<V>(x, x_bf, i, r);
    load_in<V>(dy, dy_bf, i, d);
#pragma unroll
    for (int k = 0; k < V; ++k) r[k] = rounded_if(round, gelu_grad(r[k], d[k]));
  }
  template <int V>
  __device__ __forceinline__ void store(int64_t i, float (&r)[V]) const {
    if (dx) store_v<V>(dx, i, r);
    if (dx_h) store_bf16_v<V>(dx_h, i, r);
  }
};

// A producer op (load / store as above) over n elements, one thread per group of 4: whole groups with vector
// accesses where `vec` (every pointer aligned for them), element by element otherwise and in the tail.
template <class Op>
__global__ void op_kernel(const Op op, int64_t n, bool vec) {
  const int64_t groups = (n + 3) / 4;
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    if (vec && g * 4 + 4 <= n) {
      float v[4];
      op.template load<4>(g * 4, v);
      op.template store<4>(g * 4, v);
      continue;
    }
    for (int64_t i = g * 4; i < g * 4 + 4 && i < n; ++i) {
      float v[1];
      op.template load<1>(i, v);
      op.template store<1>(i, v);
    }
  }
}

// A producer with its ProducerAmax (nn.hpp): one thread per strip of 16 rows
// x kStripCols columns of the output [rows, cols]: op.load of every row, then
// op.store of every row, whose values strip_amaxes reduces (amax_device.cuh).
// Two columns: 32 values live per thread (four columns' 64 took 106-112
// registers, two blocks per SM).
constexpr int kStripCols = 2;
// Rows loaded before any of them is stored: four latency chains a strip
// instead of sixteen (8 or 16 rows at once spilled at 64-80 registers: the
// GELU's temporaries of every row in flight).
constexpr int kBatchRows = 4;
template <class Op, bool RHT>
__global__ void __launch_bounds__(kThreads, 4)
    producer_amax_kernel(const Op op, int64_t rows, int64_t cols, const ProducerAmax a) {
  constexpr int V = kStripCols;
  const int64_t ngroups = cols / V, strips = (rows / 16) * ngroups;
  const int64_t t = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  uint32_t m = 0, mt = 0;
  if (t < strips) {
    const int64_t i = t / ngroups, jg = t - i * ngroups;
    float v[16][V];
#pragma unroll
    for (int r0 = 0; r0 < 16; r0 += kBatchRows) {
#pragma unroll
      for (int rr = r0; rr < r0 + kBatchRows; ++rr) op.template load<V>((i * 16 + rr) * cols + jg * V, v[rr]);
#pragma unroll
      for (int rr = r0; rr < r0 + kBatchRows; ++rr) op.template store<V>((i * 16 + rr) * cols + jg * V, v[rr]);
    }
    strip_amaxes<V, RHT>(v, a.signs, m, mt);
  }
  amax_block_commit(m, a.words, RHT ? rht_quarter(mt) : m, a.words + 1);
}

}  // namespace

bool producer_amax_fits(int64_t rows, int64_t cols, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if ((reinterpret_cast<uintptr_t>(p) & 15u) != 0) return false;
  return rows % 16 == 0 && cols % 4 == 0;
}

namespace {

// Can op_kernel take vector accesses: the pointers (null ones skipped) 16-byte aligned and the BF16 outputs
// `halves` 8-byte aligned (BF16 inputs are among ptrs: 16 bytes is more than their 8)?
bool aligned_for_op(std::initializer_list<const void*> ptrs, std::initializer_list<const void*> halves) {
  for (const void* p : ptrs)
    if ((reinterpret_cast<uintptr_t>(p) & 15u) != 0) return false;
  for (const void* p : halves)
    if ((reinterpret_cast<uintptr_t>(p) & 7u) != 0) return false;
  return true;
}

// Checks a's preconditions for a producer of n values whose FP32 pointers are
// ptrs (null ones skipped), zeroes its words and launches producer_amax_kernel.
template <class Op>
void launch_producer_amax(const char* what, const Op& op, int64_t n, const ProducerAmax& a,
                          std::initializer_list<const void*> ptrs, cudaStream_t st) {
  if (a.words == nullptr || a.rows * a.cols != n || !producer_amax_fits(a.rows, a.cols, ptrs)) {
    const bool aligned = producer_amax_fits(0, 0, ptrs);  // the pointers alone
    throw Error(std::string(what) + ": its tensor amaxes need [rows, cols] with rows * cols = " + std::to_string(n) +
                ", rows % 16 == 0, cols % 4 == 0 and 16-byte aligned tensors; got [" + std::to_string(a.rows) + ", " +
                std::to_string(a.cols) + "]" + (aligned ? "" : ", a misaligned tensor") +
                (a.words ? "" : ", no amax words"));
  }
  check(cudaMemsetAsync(a.words, 0, 2 * sizeof(uint32_t), st), "cudaMemsetAsync (producer amax)");
  const int64_t strips = (a.rows / 16) * (a.cols / kStripCols);
  if (strips == 0) return;
  const unsigned blocks = unsigned((strips + kThreads - 1) / kThreads);
  if (a.rht)
    producer_amax_kernel<Op, true><<<blocks, kThreads, 0, st>>>(op, a.rows, a.cols, a);
  else
    producer_amax_kernel<Op, false><<<blocks, kThreads, 0, st>>>(op, a.rows, a.cols, a);
  check_launch(what);
}

// ---- LayerNorm ---------------------------------------------------------------

// One warp per row.
__global__ void ln_fwd_kernel(const float* x, const float* gamma, const float* beta, float eps, int64_t rows,
                              int64_t cols, float* y, float* mean, float* rstd, uint16_t* y_h, bool round) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const float* xr = x + r * cols;
  double s = 0.0;
  for (int64_t j = lane; j < cols; j += kWarp) s += xr[j];
  s = warp_sum(s);
  const double mu = s / double(cols);
  double v = 0.0;
  for (int64_t j = lane; j < cols; j += kWarp) v += (xr[j] - mu) * (xr[j] - mu);
  v = warp_sum(v);
  const float rs = float(1.0 / sqrt(v / double(cols) + double(eps)));
  const float m = float(mu);
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
  for (int64_t j = lane; j < cols; j += kWarp) {
    const float h = (xr[j] - m) * rs;
    const float v = rounded_if(round, h * gamma[j] + (beta ? beta[j] : 0.0f));
    if (y) y[r * cols + j] = v;  // null: the BF16 output only
    if (y_h) y_h[r * cols + j] = uint16_t(bf16_rn(v));
  }
}

// Element i of an input held as FP32 values (p), or as BF16 bits (h not null), widened.
__device__ __forceinline__ float in_at(const float* p, const uint16_t* h, int64_t i) {
  return h ? bf16_widen(h[i]) : p[i];
}

// dy_h (may be null): dy in BF16 bits (dy unused).
__global__ void ln_bwd_dx_kernel(const float* dy, const uint16_t* dy_h, const float* x, const float* gamma,
                                 const float* mean, const float* rstd, int64_t rows, int64_t cols,
                                 const float* residual, float* dx) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const float* xr = x + r * cols;
  const float* gr = dy_h ? nullptr : dy + r * cols;
  const uint16_t* hr = dy_h ? dy_h + r * cols : nullptr;
  const float m = mean[r], rs = rstd[r];
  double s1 = 0.0, s2 = 0.0;
  for (int64_t j = lane; j < cols; j += kWarp) {
    const float gg = in_at(gr, hr, j) * gamma[j];
    s1 += gg;
    s2 += double(gg) * double((xr[j] - m) * rs);
  }
  s1 = warp_sum(s1);
  s2 = warp_sum(s2);
  const float a = float(s1 / double(cols)), b = float(s2 / double(cols));
  float* dr = dx + r * cols;
  const float* res = residual ? residual + r * cols : nullptr;
  for (int64_t j = lane; j < cols; j += kWarp) {
    const float h = (xr[j] - m) * rs;
    const float d = rs * (in_at(gr, hr, j) * gamma[j] - a - h * b);
    dr[j] = res ? d + res[j] : d;
  }
}

// Column reductions: each column is summed in float64 over fixed blocks of
// kRowBlock rows in row order, then the block partials in block order (the CPU's
// order). Block (rb, cb) of col_partial_kernel takes rows rb*kRowBlock .. and
// columns cb*32 ..: its 8 warps first load every term of the tile into shared
// memory (32 independent loads a thread: the chains below wait on no global
// load), then warp 0 runs the 32 column chains over the tile's rows in order.
constexpr int kColTile = 32;      // columns per col_partial block (one warp's lanes)
constexpr int kColThreads = 256;  // threads per col_partial block
constexpr int kColRowsPerThread = kRowBlock * kColTile / kColThreads;
struct PlainTerm {
  const float* a;
  int64_t lda;
  const uint16_t* a_h = nullptr;  // a in BF16 bits (a unused), or null
  __device__ float operator()(int64_t r, int64_t c) const { return in_at(a, a_h, r * lda + c); }
};
struct LnGammaTerm {
  const float *dy, *x, *mean, *rstd;
  int64_t cols;
  const uint16_t* dy_h = nullptr;  // dy in BF16 bits (dy unused), or null
  __device__ float operator()(int64_t r, int64_t c) const {
    return in_at(dy, dy_h, r * cols + c) * ((x[r * cols + c] - mean[r]) * rstd[r]);
  }
};
template <class F>
__global__ void __launch_bounds__(kColThreads) col_partial_kernel(F f, int64_t rows, int64_t cols, double* part) {
  __shared__ float tile[kRowBlock][kColTile];
  const int lane = int(threadIdx.x) % kColTile, w = int(threadIdx.x) / kColTile;
  const int64_t r0 = int64_t(blockIdx.x) * kRowBlock, c = int64_t(blockIdx.y) * kColTile + lane;
  const int n = int(min(rows - r0, kRowBlock));
  if (c < cols) {
#pragma unroll
    for (int u = 0; u < kColRowsPerThread; ++u) {
      const int r = w + u * (kColThreads / kColTile);
      if (r < n) tile[r][lane] = f(r0 + r, c);
    }
  }
  __syncthreads();
  if (w != 0 || c >= cols) return;
  double p = 0.0;
#pragma unroll 16
  for (int r = 0; r < n; ++r) p += double(tile[r][lane]);
  part[int64_t(blockIdx.x) * cols + c] = p;
}
// out[c] += float(the block partials of column c added in block order).
__global__ void col_finish_kernel(const double* part, int64_t nb, int64_t cols, float* out) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  double s = 0.0;
  for (int64_t b = 0; b < nb; ++b) s += part[b * cols + c];
  out[c] += float(s);
}
template <class F>
void column_reduce(F f, int64_t rows, int64_t cols, float* out, Scratch& scratch, cudaStream_t st) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t nb = (rows + kRowBlock - 1) / kRowBlock;
  const int64_t ct = (cols + kColTile - 1) / kColTile;
  if (ct > 65535 || nb > (int64_t(1) << 31) - 1) throw Error("column reduction: tensor too large");
  double* part = scratch.get<double>(0, size_t(nb * cols));
  col_partial_kernel<<<dim3(unsigned(nb), unsigned(ct)), kColThreads, 0, st>>>(f, rows, cols, part);
  check_launch("col_partial_kernel");
  col_finish_kernel<<<blocks_for(cols), kThreads, 0, st>>>(part, nb, cols, out);
  check_launch("col_finish_kernel");
}

__global__ void rows_mod_kernel(const float* d, int64_t reps, int64_t cols, int64_t period, float* acc) {
  const int64_t n = period * cols;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / cols, c = e % cols;
    double s = 0.0;
    for (int64_t b = 0; b < reps; ++b) s += d[(b * period + t) * cols + c];
    acc[e] += float(s);
  }
}

}  // namespace

// ---- Scratch ------------------------------------------------------------------------

void* Scratch::get(int slot, size_t bytes) {
  if (slot < 0 || slot >= kSlots) throw Error("nn::Scratch: slot " + std::to_string(slot) + " out of range");
  auto& b = buf_[slot];
  if (b.size() < bytes) {
    // Grow geometrically so alternating sizes settle quickly.
    const size_t n = std::max<size_t>(bytes, b.size() + b.size() / 2);
    b.resize(0);
    b.resize(n);
  }
  return b.data();
}

// ---- host wrappers ------------------------------------------------------------------

void fill(float* p, int64_t n, float v, cudaStream_t st) {
  if (n <= 0) return;
  if (std::bit_cast<uint32_t>(v) == 0u) {  // +0.0f: all bytes zero
    check(cudaMemsetAsync(p, 0, size_t(n) * sizeof(float), st), "fill (cudaMemsetAsync)");
    return;
  }
  fill_kernel<<<blocks_for(n), kThreads, 0, st>>>(p, n, v);
  check_launch("fill_kernel");
}

void copy_cols(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t ncols,
               cudaStream_t st) {
  if (rows <= 0 || ncols <= 0) return;
  check(cudaMemcpy2DAsync(dst, size_t(dst_ld) * 4, src, size_t(src_ld) * 4, size_t(ncols) * 4, size_t(rows),
                          cudaMemcpyDeviceToDevice, st),
        "copy_cols (cudaMemcpy2DAsync)");
}

void gather_rows(const float* x, int64_t cols, int64_t stride, float* out, int64_t n, cudaStream_t st) {
  if (n <= 0 || cols <= 0) return;
  check(cudaMemcpy2DAsync(out, size_t(cols) * 4, x, size_t(stride * cols) * 4, size_t(cols) * 4, size_t(n),
                          cudaMemcpyDeviceToDevice, st),
        "gather_rows (cudaMemcpy2DAsync)");
}

void scatter_rows(const float* dout, int64_t n, int64_t cols, int64_t stride, float* dx, int64_t dx_rows,
                  cudaStream_t st) {
  fill(dx, dx_rows * cols, 0.0f, st);
  if (n <= 0 || cols <= 0) return;
  check(cudaMemcpy2DAsync(dx, size_t(stride * cols) * 4, dout, size_t(cols) * 4, size_t(cols) * 4, size_t(n),
                          cudaMemcpyDeviceToDevice, st),
        "scatter_rows (cudaMemcpy2DAsync)");
}

void add_inplace(float* y, const float* x, int64_t n, cudaStream_t st) {
  if (n <= 0) return;
  add_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(y, x, n);
  check_launch("add_kernel");
}

void round_bf16_inplace(float* x, int64_t n, cudaStream_t st) { copy_round_bf16(x, x, n, st); }

void copy_round_bf16(const float* src, float* dst, int64_t n, cudaStream_t st) {
  if (n <= 0) return;
  copy_round_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(src, dst, n);
  check_launch("copy_round_kernel");
}

void add_rounded_bf16(float* acc, const float* d, int64_t n, cudaStream_t st) {
  if (n <= 0) return;
  add_rounded_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(acc, d, n);
  check_launch("add_rounded_kernel");
}

void scale(float* g, int64_t n, float s, cudaStream_t st) {
  if (n <= 0) return;
  scale_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(g, n, s);
  check_launch("scale_kernel");
}

void gelu_forward(const float* x, float* y, int64_t n, uint16_t* y_bf16, cudaStream_t st, const ProducerAmax* amax,
                  OutputRounding rounding, const uint16_t* x_h) {
  const bool round = rounding == OutputRounding::bf16;
  const GeluFwd op{x, y, y_bf16, round, x_h};
  if (amax) return launch_producer_amax("gelu_forward", op, n, *amax, {x, y, x_h}, st);
  if (n <= 0) return;
  if (x_h) {  // a BF16 input: the producer op's kernel (the same per-element operations)
    op_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(op, n, aligned_for_op({y, x_h}, {y_bf16}));
    return check_launch("op_kernel (gelu_forward)");
  }
  gelu_fwd_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(x, y, n, y_bf16, round);
  check_launch("gelu_fwd_kernel");
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, uint16_t* dx_bf16, cudaStream_t st,
                   const ProducerAmax* amax, OutputRounding rounding, const uint16_t* x_h, const uint16_t* dy_h) {
  const bool round = rounding == OutputRounding::bf16;
  const GeluBwd op{x, dy, dx, dx_bf16, round, x_h, dy_h};
  if (amax) return launch_producer_amax("gelu_backward", op, n, *amax, {x, dy, dx, x_h, dy_h}, st);
  if (n <= 0) return;
  if (x_h || dy_h) {  // a BF16 input: the producer op's kernel (the same per-element operations)
    const bool vec = aligned_for_op({x_h ? nullptr : x, dy_h ? nullptr : dy, dx, x_h, dy_h}, {dx_bf16});
    op_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(op, n, vec);
    return check_launch("op_kernel (gelu_backward)");
  }
  gelu_bwd_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(x, dy, dx, n, dx_bf16, round);
  check_launch("gelu_bwd_kernel");
}

void dropout(float* x, int64_t n, float p, uint64_t seed, uint64_t sid, uint16_t* x_bf16, cudaStream_t st,
             OutputRounding rounding) {
  if (p <= 0.0f && x_bf16 == nullptr && rounding == OutputRounding::none) return;  // nothing to write
  dropout_to(x, nullptr, x, n, p, seed, sid, x_bf16, st, nullptr, rounding);
}

void dropout_add(float* y, const float* x, int64_t n, float p, uint64_t seed, uint64_t sid, cudaStream_t st,
                 OutputRounding rounding, const uint16_t* y_h, float* out) {
  const bool round = rounding == OutputRounding::bf16;
  if (!out) out = y;
  if (p <= 0.0f && !round && !y_h && out == y) return add_inplace(y, x, n, st);
  if (n <= 0) return;
  const uint32_t thr = p > 0.0f ? dropout_threshold(p) : 0u;
  const float keep_scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
  const auto launch = [&](auto kernel) {
    kernel<<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(y, y_h, out, x, n, thr, keep_scale, seed, sid);
  };
  if (p > 0.0f)
    round ? launch(dropout_add_kernel<true, true>) : launch(dropout_add_kernel<true, false>);
  else
    round ? launch(dropout_add_kernel<false, true>) : launch(dropout_add_kernel<false, false>);
  check_launch("dropout_add_kernel");
}

void dropout_to(float* y, const float* x, float* dst, int64_t n, float p, uint64_t seed, uint64_t sid,
                uint16_t* dst_bf16, cudaStream_t st, const ProducerAmax* amax, OutputRounding rounding) {
  const bool drop = p > 0.0f;
  const DropoutTo op{y,
                     x,
                     dst,
                     dst_bf16,
                     rounding == OutputRounding::bf16,
                     drop,
                     drop ? dropout_threshold(p) : 0u,
                     drop ? 1.0f / (1.0f - p) : 1.0f,
                     seed,
                     sid};
  if (amax) return launch_producer_amax("dropout_to", op, n, *amax, {y, x, dst}, st);
  if (n <= 0) return;
  dropout_to_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(op, n);
  check_launch("dropout_to_kernel");
}

void layernorm_forward(const float* x, const float* gamma, const float* beta, float eps, int64_t rows, int64_t cols,
                       float* y, float* mean, float* rstd, uint16_t* y_bf16, cudaStream_t st,
                       OutputRounding rounding) {
  if (rows <= 0) return;
  if (cols <= 0) throw Error("layernorm_forward: no columns");
  ln_fwd_kernel<<<warp_blocks(rows), kThreads, 0, st>>>(x, gamma, beta, eps, rows, cols, y, mean, rstd, y_bf16,
                                                        rounding == OutputRounding::bf16);
  check_launch("ln_fwd_kernel");
}

void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                        int64_t rows, int64_t cols, float* dx, float* dgamma_acc, float* dbeta_acc, Scratch& scratch,
                        const float* residual, cudaStream_t st, const uint16_t* dy_h) {
  if (rows <= 0) return;
  if (cols <= 0) throw Error("layernorm_backward: no columns");
  ln_bwd_dx_kernel<<<warp_blocks(rows), kThreads, 0, st>>>(dy, dy_h, x, gamma, mean, rstd, rows, cols, residual, dx);
  check_launch("ln_bwd_dx_kernel");
  if (dgamma_acc) column_reduce(LnGammaTerm{dy, x, mean, rstd, cols, dy_h}, rows, cols, dgamma_acc, scratch, st);
  if (dbeta_acc) column_reduce(PlainTerm{dy, cols, dy_h}, rows, cols, dbeta_acc, scratch, st);
}

void column_sum_acc(const float* a, int64_t lda, int64_t rows, int64_t cols, float* out, Scratch& scratch,
                    cudaStream_t st) {
  column_reduce(PlainTerm{a, lda}, rows, cols, out, scratch, st);
}

void rows_mod_sum_acc(const float* d, int64_t rows, int64_t cols, int64_t period, float* acc, cudaStream_t st) {
  if (period <= 0 || cols <= 0) return;
  if (rows % period != 0)
    throw Error("rows_mod_sum_acc: " + std::to_string(rows) + " rows is not a multiple of the period " +
                std::to_string(period));
  rows_mod_kernel<<<blocks_for(period * cols), kThreads, 0, st>>>(d, rows / period, cols, period, acc);
  check_launch("rows_mod_kernel");
}

}  // namespace fp4lab::cuda::nn
