// Counter-based Philox4x32-10 (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", SC'11), the generator of cuRAND and Random123.
//
// fp4lab draws the random bits of stochastic rounding from it so that any
// thread, on the CPU or the GPU, can compute the bits of any element directly:
//   key     = (seed low 32 bits, seed high 32 bits)
//   counter = (group low, group high, stream low, stream high), group = index / 4
//   bits of element `index` = word (index % 4) of philox4x32_10(counter, key).
// `stream` separates independent uses under one seed (a tensor, a layer's
// operand at a training step...). Checked against Random123's known-answer
// vectors in tests/core/test_philox.cpp.
#pragma once

#include <cstdint>

#include "core/hd.hpp"

namespace fp4lab {

struct Philox4 {
  uint32_t v[4];
};

FP4LAB_HD constexpr Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
#if defined(__CUDA_ARCH__)
    // The same products as the 64-bit form below, in 32-bit operations (NVVM
    // keeps the 64-bit form's XORs and multiplies 64 bits wide).
    const uint32_t hi0 = __umulhi(M0, ctr.v[0]), lo0 = M0 * ctr.v[0];
    const uint32_t hi1 = __umulhi(M1, ctr.v[2]), lo1 = M1 * ctr.v[2];
#else
    const uint64_t p0 = uint64_t(M0) * ctr.v[0];
    const uint64_t p1 = uint64_t(M1) * ctr.v[2];
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
#endif
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += W0;
    k1 += W1;
  }
  return ctr;
}

// The four 32-bit words of group `index / 4` of (seed, stream).
FP4LAB_HD constexpr Philox4 philox_group(uint64_t seed, uint64_t stream, uint64_t group) {
  return philox4x32_10(Philox4{{uint32_t(group), uint32_t(group >> 32), uint32_t(stream), uint32_t(stream >> 32)}},
                       uint32_t(seed), uint32_t(seed >> 32));
}

// The 32 random bits of element `index` of (seed, stream).
FP4LAB_HD constexpr uint32_t random_bits(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox_group(seed, stream, index >> 2).v[index & 3u];
}

// The trainers' dropout rule (CPU and CUDA backends): an element whose random
// word w (random_bits of its index) is < dropout_threshold(p) is dropped.
// floor(p * 2^32) clamped to [0, 2^32 - 1] (p <= 0: 0, nothing dropped; p >= 1:
// 2^32 - 1, all but the word 2^32 - 1).
FP4LAB_HD constexpr uint32_t dropout_threshold(float p) {
  const double t = double(p) * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : (t <= 0.0 ? 0u : uint32_t(t));
}

// The words of `count` consecutive groups g0, g0+1, ... of (seed, stream) into
// out[4 * count] (group g's four words at out[4 (g - g0)]); the group index
// wraps modulo 2^64 as philox_group's does. Host only. On x86-64 CPUs with AVX2
// (checked at run time, whatever the build flags) eight groups go through the
// rounds at once in 256-bit lanes; the words are identical to philox_group's
// (tests/core/test_philox.cpp checks both paths).
void philox_groups(uint64_t seed, uint64_t stream, uint64_t g0, uint64_t count, uint32_t* out);

// Which implementation philox_groups uses on this CPU: "avx2" or "scalar".
const char* philox_groups_path();

// The scalar reference of philox_groups (also its tail and its fallback).
inline void philox_groups_scalar(uint64_t seed, uint64_t stream, uint64_t g0, uint64_t count, uint32_t* out) {
  for (uint64_t g = 0; g < count; ++g) {
    const Philox4 p = philox_group(seed, stream, g0 + g);
    for (int k = 0; k < 4; ++k) out[4 * g + uint64_t(k)] = p.v[k];
  }
}

// random_bits(seed, stream, first + i) for i < n into out[n]. `scratch` must
// hold 4 * ((n + 3) / 4 + 1) words.
inline void random_words(uint64_t seed, uint64_t stream, uint64_t first, uint64_t n, uint32_t* out, uint32_t* scratch) {
  if (n == 0) return;
  const uint64_t g0 = first >> 2, g1 = (first + n + 3) >> 2;
  philox_groups(seed, stream, g0, g1 - g0, scratch);
  const uint32_t* w = scratch + (first & 3u);
  for (uint64_t i = 0; i < n; ++i) out[i] = w[i];
}

}  // namespace fp4lab
