// The AdamW step of train/cuda/nn.hpp (nn::adamw_step): the CPU backend's
// update (train/cpu/backend.cpp adamw_step) element for element, the clip
// factor (AdamWConstants::grad_scale, or a device word: clip_record's) applied as the gradient is read, FP32 or
// BF16 moments (MomentStorage, train/backend.hpp).
#include <cstdint>

#include "core/error.hpp"
#include "train/cuda/nn.hpp"
#include "train/cuda/nn_device.cuh"

namespace fp4lab::cuda::nn {

using namespace detail;

namespace {

// A moment as FP32: a float, or a packed BF16 (MomentStorage::bf16) widened.
template <bool kBf16>
__device__ __forceinline__ float load_moment(const void* x, int64_t i) {
  if constexpr (kBf16) return bf16_widen(static_cast<const uint16_t*>(x)[i]);
  else return static_cast<const float*>(x)[i];
}
template <bool kBf16>
__device__ __forceinline__ void store_moment(void* x, int64_t i, float v) {
  if constexpr (kBf16) static_cast<uint16_t*>(x)[i] = uint16_t(bf16_rn(v));
  else static_cast<float*>(x)[i] = v;
}

// One element of the AdamW step: the CPU backend's operations in its order
// (no FMA contraction: --fmad=false, CMakeLists.txt). m and v in and out as FP32
// (the caller widens and rounds bf16 moments).
__device__ __forceinline__ void adamw_one(float& p, float g, float& m, float& v, bool decay, const AdamWConstants& k) {
  const float x = decay ? p * k.shrink : p;
  const float gi = g * k.grad_scale;
  const float mi = m + (gi - m) * (1.0f - k.beta1);  // torch lerp
  const float vi = v * k.beta2 + (1.0f - k.beta2) * gi * gi;
  m = mi;
  v = vi;
  const float denom = sqrtf(vi) / k.bc2s + k.eps;
  p = x - k.step * (mi / denom);
}
// Groups of 4 elements: 16-byte loads and stores of p, g and FP32 moments where
// all are 16-byte aligned (the flat buffers are), scalar ones otherwise, for
// BF16 moments and in the tail.
template <bool kBf16>
__global__ void adamw_kernel(float* p, const float* g, void* m, void* v, const uint8_t* decay, int64_t n,
                             AdamWConstants k, const float* grad_scale) {
  if (grad_scale) k.grad_scale = *grad_scale;
  const int64_t groups = (n + 3) / 4;
  const bool vec = !kBf16 && aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v);
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < groups; q += int64_t(gridDim.x) * blockDim.x) {
    if (vec && q * 4 + 4 <= n) {
      float4 p4 = reinterpret_cast<const float4*>(p)[q], m4 = static_cast<const float4*>(m)[q],
             v4 = static_cast<const float4*>(v)[q];
      const float4 g4 = reinterpret_cast<const float4*>(g)[q];
      uchar4 d4 = make_uchar4(0, 0, 0, 0);
      if (k.apply_decay) d4 = make_uchar4(decay[4 * q], decay[4 * q + 1], decay[4 * q + 2], decay[4 * q + 3]);
      adamw_one(p4.x, g4.x, m4.x, v4.x, d4.x != 0, k);
      adamw_one(p4.y, g4.y, m4.y, v4.y, d4.y != 0, k);
      adamw_one(p4.z, g4.z, m4.z, v4.z, d4.z != 0, k);
      adamw_one(p4.w, g4.w, m4.w, v4.w, d4.w != 0, k);
      reinterpret_cast<float4*>(p)[q] = p4;
      static_cast<float4*>(m)[q] = m4;
      static_cast<float4*>(v)[q] = v4;
      continue;
    }
    for (int64_t i = 4 * q; i < 4 * q + 4 && i < n; ++i) {
      float mi = load_moment<kBf16>(m, i), vi = load_moment<kBf16>(v, i);
      adamw_one(p[i], g[i], mi, vi, k.apply_decay && decay[i] != 0, k);
      store_moment<kBf16>(m, i, mi);
      store_moment<kBf16>(v, i, vi);
    }
  }
}

}  // namespace

void adamw_step(float* p, const float* g, void* m, void* v, const uint8_t* decay, int64_t n, const AdamWConstants& k,
                cudaStream_t st, const float* grad_scale) {
  if (n <= 0) return;
  if (k.apply_decay && !decay) throw Error("adamw_step: weight decay without a decay mask");
  if (k.bf16_moments)
    adamw_kernel<true><<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(p, g, m, v, decay, n, k, grad_scale);
  else
    adamw_kernel<false><<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(p, g, m, v, decay, n, k, grad_scale);
  check_launch("adamw_kernel");
}

}  // namespace fp4lab::cuda::nn
