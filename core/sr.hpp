// Random-bit contracts of stochastic rounding (Round::rs): which random word
// an element of a [rows, cols] row-major tensor uses, and which of its bits.
//
//   per_element  fp4lab's contract (the default): element (r, c) uses all 32
//                bits of word r * cols + c. Unbiased down to 2^-32 of a quantum.
//   ptx_x4       the PTX cvt.rs contract: the elements of a row in groups of
//                G consecutive columns (G = 4; 2 for float16 / bfloat16
//                targets, the .f16x2 / .bf16x2 forms) share one 32-bit word,
//                word r * ceil(cols / G) + c / G (a partial group at a row's
//                end uses the same layout); element k = c % G of the group
//                uses W bits of it from bit lo_k (below), aligned by
//                core/encode.hpp's rule (r's top bit right below the target's
//                last kept bit; the discarded bits beneath it are truncated).
//
// ptx_x4's split of the word (sr_width, sr_lsb), element k in memory order,
// which PTX names f, e, b, a for k = 0..3 (every caller passes {v3, v2, v1, v0};
// d packs element k into nibble / byte k):
//   e2m1, e2m3, e3m2, e4m3, e5m2   W = 8,  lo_k = 8k  (byte k, bits in order)
//   float16                        W = 13, lo_k = 16k (bits [16k, 16k + 13))
//   bfloat16                       W = 16, lo_k = 16k
// Sources (PTX ISA 9.7.9.21 "cvt", rbits paragraph; its figures 38-41 hold
// the exact layout as images): f16x2 / bf16x2 are stated in the text ("13
// LSBs from upper 16-bits ... operand a", "upper 16-bits ... operand a, lower
// ... operand b") and agree with Dao-AILab/quack's probes (quack/rounding.py).
// For the x4 forms the text gives only halves ("upper 16 bits are used for
// operands a, b", e2m1x4: "upper 8-bits from both 16-bits half ... a, b").
// fp4lab follows TransformerEngine's software reading of e2m1x4
// (transformer_engine/common/util/ptx.cuh stochastic_round_fp4_e2m1, PR #3281:
// element k gets rbits >> 8k, 8 bits, used directly), which is also quack's
// B200 (sm_100a) probe for e4m3x4 / e5m2x4 (byte k, straight). Open: quack
// reports a different e2m1 order on B300 (sm_103a: v0 <- bits 23:16, v1 <- bit-
// reversed 7:0, v2 <- 31:24, v3 <- bit-reversed 15:8), FlashInfer 16-bit halves
// for e4m3x4; nobody has published an sm_100a e2m1x4 probe. Should hardware
// prove otherwise, sr_lsb (and a bit reversal in sr_element_bits) is the one
// place to change. No GPU lent to fp4lab so far runs cvt.rs (sm_90 has none).
// The W = 8 arithmetic differs from TE's fma fallback t = fmaf(r/256, step,
// |x|) only where that fma rounds up (|x| < 0.5 within 2^-32 of a step below
// a grid point): the integer carry here is the instruction's rule.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/format.hpp"
#include "core/hd.hpp"

namespace fp4lab {

enum class SrBits : uint8_t { per_element, ptx_x4 };

// "per_element", "ptx_x4".
const char* sr_bits_name(SrBits b);
std::optional<SrBits> parse_sr_bits(std::string_view s);
inline constexpr const char* sr_bits_names = "per_element, ptx_x4";

// Same encoding (fields, not names: device code compares its own copies).
FP4LAB_HD constexpr bool same_encoding(const Format& a, const Format& b) {
  return a.exp_bits == b.exp_bits && a.man_bits == b.man_bits && a.bias == b.bias && a.is_signed == b.is_signed &&
         a.special == b.special && a.is_int == b.is_int;
}
// float16 / bfloat16: the .f16x2 / .bf16x2 forms. (Local copies of the
// formats: device code cannot refer to the host globals.)
FP4LAB_HD constexpr bool sr_x2_format(const Format& f) {
  constexpr Format f16 = float16, bf16 = bfloat16;
  return same_encoding(f, f16) || same_encoding(f, bf16);
}
// True if PTX cvt.rs converts to f (the formats of the table above).
FP4LAB_HD constexpr bool sr_ptx_format(const Format& f) {
  constexpr Format e2m1 = float4_e2m1fn, e2m3 = float6_e2m3fn, e3m2 = float6_e3m2fn, e4m3 = float8_e4m3fn,
                   e5m2 = float8_e5m2;
  return same_encoding(f, e2m1) || same_encoding(f, e2m3) || same_encoding(f, e3m2) || same_encoding(f, e4m3) ||
         same_encoding(f, e5m2) || sr_x2_format(f);
}
// Elements sharing one random word (1 for per_element).
FP4LAB_HD constexpr int sr_group(SrBits b, const Format& f) {
  if (b == SrBits::per_element) return 1;
  return sr_x2_format(f) ? 2 : 4;
}
// Random bits an element sees (W).
FP4LAB_HD constexpr int sr_width(SrBits b, const Format& f) {
  if (b == SrBits::per_element) return 32;
  constexpr Format f16 = float16, bf16 = bfloat16;
  return same_encoding(f, f16) ? 13 : same_encoding(f, bf16) ? 16 : 8;
}
// The lowest bit of element k's random value within its group's word.
FP4LAB_HD constexpr int sr_lsb(SrBits b, const Format& f, int k) {
  if (b == SrBits::per_element) return 0;
  return k * (sr_x2_format(f) ? 16 : 8);
}
// Bits [lsb, lsb + width) of word, right-aligned (width 32: the word): the
// extraction itself, for kernels that take lsb and width from the host.
FP4LAB_HD constexpr uint32_t sr_word_bits(uint32_t word, int lsb, int width) {
  return width == 32 ? word : (word >> lsb) & ((1u << width) - 1u);
}
// Element k's random value (right-aligned; encode()'s rbits with sr_width).
FP4LAB_HD constexpr uint32_t sr_element_bits(SrBits b, const Format& f, uint32_t word, int k) {
  return sr_word_bits(word, sr_lsb(b, f, k), sr_width(b, f));
}
// Words of one row of `cols` elements: ceil(cols / G).
FP4LAB_HD constexpr int64_t sr_words_per_row(SrBits b, const Format& f, int64_t cols) {
  const int g = sr_group(b, f);
  return (cols + g - 1) / g;
}

// Throws fp4lab::Error naming `where` if contract b cannot serve format f
// (ptx_x4 needs a cvt.rs target format).
void check_sr_bits(SrBits b, const Format& f, const std::string& where);

}  // namespace fp4lab
