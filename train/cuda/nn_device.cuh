// Device helpers shared by the trainer's kernels (cuda/nn.cu, cuda/attention*.cu,
// cuda/moe_ops.cu): launch shapes, the fixed-order warp reductions, the dropout
// rule of one element, its threshold and scale (dropout_params) and the Philox
// words of 4 elements at any offset (words4, the attention kernels' mask), and
// the BF16 rounding of producers' BF16 outputs. Internal to cuda/; include only from .cu files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/error.hpp"
#include "core/philox.hpp"

namespace fp4lab::cuda::nn::detail {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

// The BF16 output of a float (ProducerOutputs::bf16 of the trainer): round to
// nearest even, as round_bf16_device.
__device__ __forceinline__ uint32_t bf16_rn(float v) { return encode_rn_f32<bfloat16>(v, Overflow::nonsaturate); }
// The FP32 value of BF16 bits h (bits above 16 ignored; a tensor stored in BF16 alone, read by its consumer):
// core's decode(bfloat16, h) (NaN: the canonical quiet NaN) in a short form. bfloat16 has float32's exponent
// field and bias, so every non-NaN code is the float32 whose upper half it is (subnormals and Inf included):
// a shift and the NaN select, where decode_f32's general form took a dozen integer operations an element and
// made the BF16-reading flash and GELU kernels about twice as slow as their FP32 forms (ncu, H200, 2026-12-03).
// tests/train/cuda/test_bf16_storage.cpp checks every code against decode().
__device__ __forceinline__ float bf16_widen(uint32_t h) {
  h &= 0xFFFFu;
  return (h & 0x7FFFu) > 0x7F80u ? quiet_nan_f() : __uint_as_float(h << 16);
}
// r(v) of OutputRounding::bf16 (nn.hpp): bf16_rn(v) decoded by core's codec (round_bf16_device then
// bf16_to_f32_device, the passes this replaces, gave these bits; bf16_widen is that decode).
__device__ __forceinline__ float bf16_round(float v) { return bf16_widen(bf16_rn(v)); }
// A producer's output under its OutputRounding (round: bf16): r(v), else v.
__device__ __forceinline__ float rounded_if(bool round, float v) { return round ? bf16_round(v) : v; }

// Fixed-shape shared-memory tree over blockDim.x (a power of two) doubles.
// Returns the total in thread 0 (and in every thread after the final sync).
template <int N>
__device__ __forceinline__ double block_sum(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = N / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

inline void check_cublas_status(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuBLAS error in ") + what + ": " + cublasGetStatusString(s));
}

// 1-D grid of `threads` over n items (grid-stride loops cover the rest).
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(std::clamp<int64_t>(b, 1, 1 << 20));
}

// Warp-per-row launch shape.
inline unsigned warp_blocks(int64_t rows) {
  const int64_t per = kThreads / kWarp;
  return unsigned(std::max<int64_t>(1, (rows + per - 1) / per));
}

// The xor butterfly leaves the same value in every lane (IEEE addition is
// commutative, so lane i and lane i^m add the same two numbers), in a fixed order.
__device__ __forceinline__ double warp_sum(double v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, m);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, m));
  return v;
}

// The dropout rule of one element (random word `word`), as the CPU's: dropped
// iff word < thr (nn::dropout_threshold), kept ones scaled by 1 / (1 - p).
__device__ __forceinline__ float drop1(float v, uint32_t word, uint32_t thr, float keep_scale) {
  return word < thr ? 0.0f : v * keep_scale;
}

// The same for the four elements of one Philox group.
__device__ __forceinline__ float4 drop4(float4 v, const Philox4& r, uint32_t thr, float keep_scale) {
  return make_float4(drop1(v.x, r.v[0], thr, keep_scale), drop1(v.y, r.v[1], thr, keep_scale),
                     drop1(v.z, r.v[2], thr, keep_scale), drop1(v.w, r.v[3], thr, keep_scale));
}
__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The kernels' form of dropout probability p (host side): thr, the threshold
// of drop1 (dropout_threshold(p), core/philox.hpp; 0 for p = 0, which the
// kernels read as "no dropout"), and keep_scale = 1 / (1 - p) (1 for p = 0).
struct DropoutParams {
  uint32_t thr = 0;
  float keep_scale = 1.0f;
};
inline DropoutParams dropout_params(float p) {
  DropoutParams d;
  if (p > 0.0f) {
    d.thr = dropout_threshold(p);
    d.keep_scale = 1.0f / (1.0f - p);
  }
  return d;
}

// The random words of the 4 consecutive elements e0 .. e0+3 of a Philox
// stream (any alignment: element e is word e % 4 of group e / 4, so an
// unaligned run spans two groups). The attention kernels' dropout mask
// (fused FP32 and BF16 flash: the same words, hence the same mask).
__device__ __forceinline__ Philox4 words4(uint64_t seed, uint64_t sid, uint64_t e0) {
  const Philox4 a = philox_group(seed, sid, e0 >> 2);
  const unsigned off = unsigned(e0 & 3u);
  if (off == 0) return a;
  const Philox4 b = philox_group(seed, sid, (e0 >> 2) + 1);
  Philox4 w;
#pragma unroll
  for (unsigned k = 0; k < 4; ++k) {
    const unsigned s = off + k;  // 1 .. 6
    w.v[k] = s == 1 ? a.v[1] : s == 2 ? a.v[2] : s == 3 ? a.v[3] : s == 4 ? b.v[0] : s == 5 ? b.v[1] : b.v[2];
  }
  return w;
}

}  // namespace fp4lab::cuda::nn::detail
