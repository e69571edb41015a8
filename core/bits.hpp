// Bit-level helpers shared by host and device code: bit casts, exact powers of
// two, Inf/NaN constants. All are exact (no rounding anywhere).
#pragma once

#include <bit>
#include <cstdint>

#include "core/hd.hpp"

namespace fp4lab {

// __builtin_bit_cast (what std::bit_cast is built on) is constexpr under g++,
// clang and nvcc, on the host and in device code; the CUDA intrinsics
// (__float_as_uint...) are not constexpr, which broke the static_asserts of
// format.hpp in nvcc's device pass.
FP4LAB_HD constexpr uint32_t float_bits(float x) { return __builtin_bit_cast(uint32_t, x); }
FP4LAB_HD constexpr float bits_float(uint32_t u) { return __builtin_bit_cast(float, u); }
FP4LAB_HD constexpr uint64_t double_bits(double x) { return __builtin_bit_cast(uint64_t, x); }
FP4LAB_HD constexpr double bits_double(uint64_t u) { return __builtin_bit_cast(double, u); }
// Bits of |x| (the sign bit cleared; NaN patterns stay above every finite and
// infinite magnitude, so an unsigned maximum of these is an amax).
FP4LAB_HD constexpr uint32_t abs_bits(float x) { return float_bits(x) & 0x7FFFFFFFu; }

// 2^k as a float32, exact for -149 <= k <= 127 (subnormal results included).
FP4LAB_HD constexpr float pow2f(int k) {
  if (k >= -126) return bits_float(uint32_t(k + 127) << 23);
  return bits_float(1u << (k + 149));  // float32 subnormal
}
// 2^k as a float64, exact for -1022 <= k <= 1023.
FP4LAB_HD constexpr double pow2d(int k) { return bits_double(uint64_t(k + 1023) << 52); }

FP4LAB_HD constexpr float inf_f() { return bits_float(0x7F800000u); }
FP4LAB_HD constexpr float quiet_nan_f() { return bits_float(0x7FC00000u); }

// Shifts whose count saturates as PTX's shl.b32 / shr.u32 do: a count of 32 or
// more (a negative int converted, too) gives 0, where C++'s << and >> are
// undefined. In device code one PTX shift each (nvcc would add a compare and a
// select to the C++ form).
template <bool kLeft>
FP4LAB_HD constexpr uint32_t shift_clamped(uint32_t x, uint32_t n) {
#if defined(__CUDA_ARCH__)
  if (!__builtin_is_constant_evaluated()) {
    uint32_t r;
    if constexpr (kLeft)
      asm("shl.b32 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(n));
    else
      asm("shr.u32 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(n));
    return r;
  }
#endif
  return n >= 32 ? 0u : kLeft ? x << n : x >> n;
}
FP4LAB_HD constexpr uint32_t shl_clamped(uint32_t x, uint32_t n) { return shift_clamped<true>(x, n); }
FP4LAB_HD constexpr uint32_t shr_clamped(uint32_t x, uint32_t n) { return shift_clamped<false>(x, n); }

// Number of leading zero bits of a 64-bit value (64 for 0).
FP4LAB_HD constexpr int clz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  if (!__builtin_is_constant_evaluated()) return __clzll(static_cast<long long>(x));
  int n = 0;
  for (uint64_t bit = uint64_t(1) << 63; bit != 0 && (x & bit) == 0; bit >>= 1) ++n;
  return n;
#else
  return x == 0 ? 64 : std::countl_zero(x);
#endif
}

}  // namespace fp4lab
