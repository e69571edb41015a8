// The approximate PTX arithmetic that peers' kernels use, bit for bit: on the device the instruction itself, on
// the host a model measured on the GPU (scripts/ptx_approx_probe.cu; docs/DESIGN.md, "Approximate PTX").
//
//   rcp_approx_ftz(x)  rcp.approx.ftz.f32: 1/x with at most one unit in the last place of error.
//                      +-0 and subnormal x give +-Inf, +-Inf gives +-0, NaN gives NaN, a result below 2^-126
//                      in magnitude is flushed to +-0. Elsewhere rcp(2^e * m) = 2^-e * rcp(m) for m in [1, 2),
//                      and rcp(m) is fl(1/m) (correctly rounded) plus a measured correction of -1, 0 or +1 ulp
//                      (core/ptx_approx.cpp's table; every input of every exponent checked on an H200, sm_90).
//                      Used by TransformerEngine's fast-math RHT cast, Quartet II's kernels, and TetraJet-v2's
//                      `1.0f / x` under --use_fast_math.
//   div_approx_ftz(a,b) div.approx.ftz.f32: mul.rn.ftz(a, rcp_approx_ftz(b)) (equal on 2^30 sampled pairs on the
//                      H200; PTX defines it so). TetraJet-v2's `/` under --use_fast_math.
//   div_full(a, b)     div.full.f32 (Triton's fp32 `/`), as ptxas 13.0 compiles it for sm_90 (read from its SASS):
//                      s = |b| > 2^126 ? 1/4 : |b| < 2^-126 ? 2^24 : 1 (zero and subnormal b scaled up), then
//                      fl(rcp(fl(b s)) * fl(a s)), the product not flushed. Not yet compared with the
//                      instruction on the GPU (scripts/ptx_approx_probe.cu's next run does).
#pragma once

#include <cstdint>

#include "core/bits.hpp"
#include "core/hd.hpp"

namespace fp4lab {

float rcp_approx_ftz_model(float x);  // the host model (core/ptx_approx.cpp)

// mul.rn.ftz.f32: a subnormal input counts as zero of its sign, a subnormal result is flushed to zero of its
// sign (the host has no such multiply).
FP4LAB_HD inline float mul_rn_ftz(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  auto flush = [](float v) {
    const uint32_t u = float_bits(v);
    return (u & 0x7F800000u) == 0 ? bits_float(u & 0x80000000u) : v;
  };
  return flush(flush(a) * flush(b));
#endif
}

FP4LAB_HD inline float rcp_approx_ftz(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return rcp_approx_ftz_model(x);
#endif
}

FP4LAB_HD inline float div_approx_ftz(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return mul_rn_ftz(a, rcp_approx_ftz(b));
#endif
}

FP4LAB_HD inline float div_full(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  const float m = bits_float(float_bits(b) & 0x7FFFFFFFu);
  const float s = m > 0x1p126f ? 0.25f : (m < 0x1p-126f ? 16777216.0f : 1.0f);
  return rcp_approx_ftz(b * s) * (a * s);  // b * s is normal, zero, Inf or NaN: the ftz model is MUFU.RCP's
#endif
}

}  // namespace fp4lab
