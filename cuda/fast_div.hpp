// Division of 31-bit unsigned integers by a run-time divisor fixed for a
// kernel launch, as one 32x32->64-bit multiply and a shift (Granlund and
// Montgomery, "Division by invariant integers using multiplication", 1994),
// where the hardware's integer division is a ~20-instruction sequence.
// Host and device (FP4LAB_HD): the host computes the multiplier once.
#pragma once

#include <cstdint>

#include "core/hd.hpp"

namespace fp4lab::cuda {

// For a divisor d in [1, 2^31]: with l = ceil(log2 d) and
// m = floor(2^(31+l) / d) + 1 (< 2^32), floor(n m / 2^(31+l)) == floor(n / d)
// for every n in [0, 2^31).
struct FastDivU31 {
  uint32_t m = 0;
  uint32_t shift = 31;  // 31 + l

  static constexpr FastDivU31 of(uint32_t d) {
    uint32_t l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    FastDivU31 f;
    f.m = uint32_t((uint64_t(1) << (31 + l)) / d + 1);
    f.shift = 31 + l;
    return f;
  }
  // floor(n / d), n < 2^31.
  FP4LAB_HD constexpr uint32_t div(uint32_t n) const { return uint32_t((uint64_t(n) * m) >> shift); }
};

}  // namespace fp4lab::cuda
