// Quantizers with `emulate: fp4tk` (sim/quantizer.hpp): fp4-trainkit's MXFP4
// and NVFP4 simulators computed with its own arithmetic (core/fp4tk.hpp has
// the scalar steps and their source), so that its results, and the collapse
// of its fp4_all_the_way recipe, can be reproduced and taken apart.
//
// Layout as every fp4lab quantizer: row-major [rows, cols] float32, 1-D blocks
// of K along rows ([1,K]) or columns ([K,1]). fp4-trainkit refuses a tensor
// whose block axis is not a multiple of K; here a partial last block follows
// fp4lab's rule (its amax over its valid elements), which fp4-trainkit would
// give if it padded with zeros.
//
// Codes: the element code is E2M1's code of the emulated value (always on the
// E2M1 grid); a NaN block gets E2M1 code 0x7 (E2M1 has no NaN; its dequant is
// NaN) and the scale format's NaN code. Scales are E8M0 codes of 2^e, or the
// E4M3 codes of the clamped amax / 6. Stochastic rounding takes element
// (r, c)'s random word as every per_element quantizer does (RandomStream) and
// uses its top 24 bits as torch.rand_like's uniform value.
#pragma once

#include <cmath>
#include <string>

#include "core/fp4tk.hpp"
#include "sim/block_scales.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

// Throws fp4lab::Error (prefixed by `where`) unless q is a spec fp4-trainkit
// has: e2m1 elements; scale e8m0 with rule ocp, ceil or tetrajet, or e4m3 /
// ue4m3 with nv_noglobal; a 1-D block; no global scale, no rht; round rn or
// rs with per_element bits; overflow saturate.
void validate_fp4tk(const QuantizerSpec& q, const std::string& where);

// Block scales as fp4-trainkit computes them (BlockScales::scales are the
// scales elements are divided by; `divide` is set). flag_underflow: a
// non-zero block whose scale the floor (2^-23 MX, 2^-9 NVFP4) raised;
// flag_overflow: an Inf amax, or an NVFP4 amax / 6 above 448; flag_nan.
BlockScales fp4tk_block_scales(const QuantizerSpec& q, MatrixView<const float> x);

// Elements of x with the scales b: dequant into dq_out (row stride
// out_stride) and, if codes_out is not null, the E2M1 codes (rows * cols).
void fp4tk_encode(const QuantizerSpec& q, const BlockScales& b, MatrixView<const float> x, RandomStream rs,
                  float* dq_out, int64_t out_stride, uint8_t* codes_out);

// core's fp4tk_e2m1 (the element rounding of t = x / s) with the same bits for
// every t and noise, but no libm log2 (which was 82% of an fp4tk recipe's
// training step) and every comparison on integer bit patterns (GCC does not
// if-convert float comparisons under -ftrapping-math), so fp4tk_encode's loop
// vectorises:
// - the binade floor(fl32(log2(a))) clamped to [0, 2] depends only on a >= 2
//   and a >= 4: fl32(log2(a)) never rounds up to 1 (or 2) for a below 2 (or 4),
//   since log2(2 - 2^-22) and log2(4 - 2^-21) lie more than half a float32 ulp
//   below 1 and 2; on |t|'s bits (non-negative floats order as their bits);
// - m = a / p is the exact product a * (1 / p) (p a power of two, a >= p);
// - rint (half to even) of v = 2 m is (|v| + 2^23) - 2^23 with v's sign put
//   back (rint(-0.3) is -0, which the clamp keeps, as core's does); exact for
//   |v| < 2^22, and v >= -1; a larger v gives a value >= 3, clamped to 1.5 as
//   rint(v) is;
// - the clamp of mq = r / 2 to [0, 1.5] on its bits: a negative non-zero mq
//   (bits above 0x80000000) becomes +0, a positive one above 1.5 becomes 1.5.
// tests/sim/test_fp4tk_bits.cpp compares it against fp4tk_e2m1 over every
// float32 t (round to nearest) and many (t, noise) pairs.
// c ? a : b on bit patterns, by a mask: no branch for the compiler to thread
// (a branch around float operations keeps GCC from vectorising the loop).
inline uint32_t fp4tk_select(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - uint32_t(c);
  return (a & m) | (b & ~m);
}

inline float fp4tk_e2m1_fast(float t, bool sr, float noise) {
  const uint32_t tb = float_bits(t), ub = tb & 0x7FFFFFFFu;
  const float sign = bits_float(fp4tk_select(ub == 0, 0u, (tb & 0x80000000u) | 0x3F800000u));  // sign(0) = 0
  const uint32_t eps_bits = float_bits(fp4tk_eps);
  const float a = bits_float(fp4tk_select(ub < eps_bits, eps_bits, ub));
  const uint32_t k = uint32_t(ub >= 0x40800000u) + uint32_t(ub >= 0x40000000u);  // a >= 4, a >= 2
  const float p = bits_float(0x3F800000u + (k << 23)), inv_p = bits_float(0x3F800000u - (k << 23));
  float m = a * inv_p;
  if (sr) m = m + noise;
  const float v = m * 2.0f;
  const float r = std::copysign((std::fabs(v) + 8388608.0f) - 8388608.0f, v);  // rint(v), 2^23
  uint32_t mq = float_bits(r / 2.0f);
  mq = fp4tk_select(mq > 0x80000000u, 0u, mq);                                // mq < 0 -> +0 (-0 stays)
  mq = fp4tk_select(mq < 0x80000000u && mq > 0x3FC00000u, 0x3FC00000u, mq);  // mq > 1.5 -> 1.5
  const float q = (sign * p) * bits_float(mq);
  return bits_float(fp4tk_select(ub > 0x7F800000u, tb, float_bits(q)));  // NaN as it came
}

}  // namespace fp4lab
