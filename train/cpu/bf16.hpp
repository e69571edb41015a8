// Rounding a float32 to bfloat16 (nearest, ties to even), as a float32: the
// operand rounding of the recipes' high-precision mode "bf16" on the CPU.
//
// Semantics: round_bf16_f32(x) has the bits of
//   decode(bfloat16, encode_rn_f32<bfloat16>(x, Overflow::nonsaturate))
// (core's scalar codec) for every float x: finite values round to nearest
// even on the 16 dropped bits (subnormals too: bfloat16 has float32's
// exponent range), values past bfloat16's largest finite round to +-Inf,
// Inf stays Inf, every NaN becomes the quiet NaN 0x7FC00000.
// tests/train/cpu/test_bf16.cpp checks it against core's codec.
// Written with integer operations and a bit blend only, so that loops over it
// vectorise (core's codec in that loop was half of a bf16 training step).
#pragma once

#include <cstdint>

#include "core/bits.hpp"

namespace fp4lab::train {

inline float round_bf16_f32(float x) {
  const uint32_t u = float_bits(x);
  // Adding 0x7FFF plus the kept lowest bit carries into the kept bits exactly
  // when the dropped half is above a tie, or a tie with an odd kept part.
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  const uint32_t nan_mask = 0u - uint32_t((u & 0x7FFFFFFFu) > 0x7F800000u);
  return bits_float((rounded & ~nan_mask) | (0x7FC00000u & nan_mask));
}

}  // namespace fp4lab::train
