// Array encode/decode: a runtime Format applied to whole arrays.
//
// These helpers are what the CLI (`fp4lab cast`, `fp4lab decode`), the
// benchmarks and the simulator use to convert many elements at once. They call
// the scalar codecs of format.hpp / encode.hpp element by element and add no
// arithmetic of their own:
//   - Round::rn on float32 input dispatches to encode_rn_f32<F> (branch-free,
//     vectorised) where the format supports it, else to encode();
//   - every other mode, and float64 input, use the generic encode();
//   - Round::rs draws the random bits of element i (its index in the array
//     plus `CastOptions::index_offset`) as random_bits(seed, stream, i) from
//     philox.hpp, so a CUDA kernel drawing the same bits gets the same codes;
//     under SrBits::ptx_x4 (core/sr.hpp) element i of a row of `row_length`
//     elements (r = i / row_length, c = i % row_length) uses word
//     r * ceil(row_length / G) + c / G, bits as sr_element_bits gives them;
//     `words` replaces Philox by given words (one per word index).
// The loops run in parallel with OpenMP; every element's code depends only on
// that element and its index, so the result is the same for any thread count.
//
// Code storage: one code per element, right-aligned, in uint8_t for formats of
// up to 8 bits and uint16_t for bfloat16/float16 (`code_bytes`). float32 is a
// valid Format but has 32-bit codes, which these helpers do not store.
//
// Example:
//   std::vector<float> x = {0.3f, -7.0f};
//   std::vector<uint8_t> c(2);
//   encode_array(float4_e2m1fn, x.data(), c.data(), 2, {});   // c = {0x1, 0xF}
//   (0.3 -> 0.5 = code 1 under rn; -7 saturates to -6 = code 0xF)
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/sr.hpp"

namespace fp4lab {

struct CastOptions {
  Round round = Round::rn;
  Overflow overflow = Overflow::saturate;
  uint64_t seed = 0;          // Philox key for Round::rs (ignored otherwise)
  uint64_t stream = 0;        // Philox stream for Round::rs
  uint64_t index_offset = 0;  // element i draws random_bits(seed, stream, index_offset + i)
  SrBits sr_bits = SrBits::per_element;  // the random-bit contract (core/sr.hpp)
  uint64_t row_length = 0;               // elements a row for ptx_x4's groups (0: the whole array is one row)
  const uint32_t* words = nullptr;       // given random words (indexed by word index) instead of Philox
};

// The number of random words an array of n elements takes under opt (one per
// element, or per group of G of a row): what `words` must hold.
uint64_t sr_word_count(const Format& f, uint64_t n, const CastOptions& opt);

// Bytes per stored code of format f: 1 (<= 8 bits), 2 (16 bits), 0 if these
// helpers cannot store it (float32).
constexpr int code_bytes(const Format& f) { return f.bits() <= 8 ? 1 : (f.bits() <= 16 ? 2 : 0); }

// Encode n values. The code type must match code_bytes(f) (uint8_t for 1,
// uint16_t for 2); otherwise fp4lab::Error is thrown naming the format.
void encode_array(const Format& f, const float* x, uint8_t* codes, size_t n, const CastOptions& opt);
void encode_array(const Format& f, const double* x, uint8_t* codes, size_t n, const CastOptions& opt);
void encode_array(const Format& f, const float* x, uint16_t* codes, size_t n, const CastOptions& opt);
void encode_array(const Format& f, const double* x, uint16_t* codes, size_t n, const CastOptions& opt);

// Decode n codes to float32 (exact). Code bits above f.bits() are ignored;
// callers that must reject them check with first_invalid_code().
void decode_array(const Format& f, const uint8_t* codes, float* out, size_t n);
void decode_array(const Format& f, const uint16_t* codes, float* out, size_t n);

// Index of the first code >= f.code_count(), or n if every code is valid.
size_t first_invalid_code(const Format& f, const uint8_t* codes, size_t n);
size_t first_invalid_code(const Format& f, const uint16_t* codes, size_t n);

}  // namespace fp4lab
