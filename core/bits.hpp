// Bit-level helpers shared by host and device code: bit casts, exact powers of
// two, Inf/NaN constants. All are exact (no rounding anywhere).
#pragma once

#include <bit>
#include <cstdint>

#include "core/hd.hpp"

namespace fp4lab {

FP4LAB_HD constexpr uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return std::bit_cast<uint32_t>(x);
#endif
}
FP4LAB_HD constexpr float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}
FP4LAB_HD constexpr uint64_t double_bits(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  return std::bit_cast<uint64_t>(x);
#endif
}
FP4LAB_HD constexpr double bits_double(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  return std::bit_cast<double>(u);
#endif
}

// 2^k as a float32, exact for -149 <= k <= 127 (subnormal results included).
FP4LAB_HD constexpr float pow2f(int k) {
  if (k >= -126) return bits_float(uint32_t(k + 127) << 23);
  return bits_float(1u << (k + 149));  // float32 subnormal
}
// 2^k as a float64, exact for -1022 <= k <= 1023.
FP4LAB_HD constexpr double pow2d(int k) { return bits_double(uint64_t(k + 1023) << 52); }

FP4LAB_HD constexpr float inf_f() { return bits_float(0x7F800000u); }
FP4LAB_HD constexpr float quiet_nan_f() { return bits_float(0x7FC00000u); }

// Number of leading zero bits of a 64-bit value (64 for 0).
FP4LAB_HD constexpr int clz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(x));
#else
  return x == 0 ? 64 : std::countl_zero(x);
#endif
}

}  // namespace fp4lab
