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

#include <string>

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

}  // namespace fp4lab
