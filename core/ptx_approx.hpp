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
#pragma once

#include "core/hd.hpp"

namespace fp4lab {

float rcp_approx_ftz_model(float x);  // the host model (core/ptx_approx.cpp)

FP4LAB_HD inline float rcp_approx_ftz(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return rcp_approx_ftz_model(x);
#endif
}

}  // namespace fp4lab
