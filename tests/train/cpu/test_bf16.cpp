// round_bf16_f32 (train/cpu/bf16.hpp) against core's scalar bfloat16 codec.
#include <doctest/doctest.h>

#include <cstdint>
#include <ios>

#include "train/cpu/bf16.hpp"
#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/format.hpp"

namespace {
uint32_t reference(uint32_t u) {
  using namespace fp4lab;
  return float_bits(decode(bfloat16, encode_rn_f32<bfloat16>(bits_float(u), Overflow::nonsaturate)));
}
uint32_t fast(uint32_t u) { return fp4lab::float_bits(fp4lab::train::round_bf16_f32(fp4lab::bits_float(u))); }
}  // namespace

TEST_CASE("round_bf16_f32: the bits of core's bfloat16 encode + decode") {
  int64_t mismatches = 0;
  uint32_t first_bad = 0;
  auto visit = [&](uint32_t u) {
    if (fast(u) != reference(u) && mismatches++ == 0) first_bad = u;
  };
  // Every 61st pattern (both signs, all exponents), and every pattern of the
  // low 17 bits (ties, carries into the exponent) at a few exponents,
  // subnormals, the largest finites and NaN payloads.
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 61) visit(uint32_t(u));
  for (uint32_t hi : {0x00000000u, 0x3F800000u, 0x3FFE0000u, 0x7F7E0000u, 0x7F800000u, 0x7FC00000u, 0x80000000u,
                      0xBF800000u, 0xFF7E0000u, 0xFF800000u})
    for (uint32_t lo = 0; lo < 0x40000u; ++lo) visit(hi + lo);
  INFO("first mismatch at 0x" << std::hex << first_bad);
  CHECK(mismatches == 0);
}
