// The element rules of distributed.reduce "bf16" (train/dist/grad_reduce.hpp states the reduction): the
// rounding of one FP32 gradient element to its BF16 code, and the FP32 sum, in rank order, of one element's
// codes from every rank. One implementation of each: FP4LAB_HD, so that the CPU backend's loops
// (train/cpu/backend.cpp) and the CUDA backend's kernels (train/cuda/grad_reduce_ops.cu) call these same
// functions (Backend::round_bf16_codes, Backend::sum_bf16_codes). No FMA can arise: the rounding is integer
// work and the sum single adds (and CUDA is built with --fmad=false).
// A code buffer holds 16-bit codes, code i at bytes [2i, 2i + 2) (little-endian), in a backend's byte tensor.
#pragma once

#include <cstdint>
#include <string>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/hd.hpp"

namespace fp4lab::train {

// x rounded once to BF16: round to nearest, ties to even, by core's codec; Overflow::nonsaturate (past BF16's
// largest finite gives +-Inf); every NaN gives core's NaN code 0x7FFF, so a NaN stays a NaN.
FP4LAB_HD inline uint16_t reduce_bf16_code(float x) {
  return uint16_t(encode_rn_f32<bfloat16>(x, Overflow::nonsaturate));
}

// The exact float of a BF16 code: its bits << 16 (0x7FFF: 0x7FFF0000, a quiet NaN).
FP4LAB_HD inline float reduce_bf16_value(uint16_t c) { return bits_float(uint32_t(c) << 16); }

// Element i of a shard of k elements summed over `rows` (>= 1) ranks' codes, rank r's at codes[r k + i]:
// s = c_0, then s = s + c_r for r = 1 .. rows - 1, each add rounded to FP32. A NaN sum is written as the NaN
// code's float, 0x7FFF0000: IEEE leaves a NaN result's sign and payload to the hardware (x86 gives 0xFFC00000
// for Inf + -Inf and passes an operand's NaN on; a GPU gives 0x7FFFFFFF), so the rule fixes them and every
// backend writes the same bits. (A NaN stays a NaN from then on, so checking the end suffices.)
FP4LAB_HD inline float reduce_bf16_sum(const uint16_t* codes, int64_t rows, int64_t k, int64_t i) {
  float s = reduce_bf16_value(codes[i]);
  for (int64_t r = 1; r < rows; ++r) s = s + reduce_bf16_value(codes[r * k + i]);
  return abs_bits(s) > 0x7F800000u ? reduce_bf16_value(0x7FFFu) : s;
}

// Throws fp4lab::Error naming `what` unless a code buffer of `bytes` bytes holds rows (>= 1) x n codes.
inline void check_bf16_codes(const char* what, int64_t bytes, int64_t rows, int64_t n) {
  if (rows < 1 || n < 0 || bytes < 2 * rows * n)
    throw Error(std::string(what) + ": " + std::to_string(rows) + " rows of " + std::to_string(n) +
                " BF16 codes in a buffer of " + std::to_string(bytes) + " bytes (needs rows >= 1 and 2 rows n bytes)");
}

}  // namespace fp4lab::train
