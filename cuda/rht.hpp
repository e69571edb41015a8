// The 16-point Random Hadamard Transform on the GPU, bit-identical to
// sim/rht.hpp's rht_forward / rht_inverse (the same FP4LAB_HD chunk functions
// rht16_forward / rht16_inverse, hence the same FP32 operation order; the
// library is built with --fmad=false, so nothing is contracted into an FMA).
//
// x is a row-major FP32 [rows, cols] device tensor, transformed in place:
//   RhtAxis::rows  chunks of 16 consecutive elements of a row
//   RhtAxis::cols  chunks of 16 consecutive elements of a column
// A partial last chunk (the axis length not a multiple of 16) is left as it is,
// as on the CPU (sim/rht.hpp). One thread per chunk; a column chunk's loads are coalesced across the threads of a warp
// (adjacent columns). Asynchronous on `stream`.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "sim/quantizer.hpp"
#include "sim/rht.hpp"

namespace fp4lab::cuda {

void rht_forward_device(float* x, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed,
                        cudaStream_t stream = nullptr);
// Out of place: dst = RHT(src), src unchanged (src == dst is the in-place form).
// With amax_bits (a device pointer), *amax_bits also receives the output's
// amax as tensor_amax_device gives it (the max over elements of |x|'s bit
// pattern, NaN patterns dominating): quantize_device takes it as
// tensor_amax_bits, so the two-level NVFP4 scale needs no extra pass. The
// integer max is order-independent, so the value does not depend on timing.
void rht_forward_device(const float* src, float* dst, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed,
                        cudaStream_t stream = nullptr, uint32_t* amax_bits = nullptr);
void rht_inverse_device(float* x, int64_t rows, int64_t cols, RhtAxis axis, uint64_t seed,
                        cudaStream_t stream = nullptr);
// The forward transform of kind (sim/rht.hpp's rht_forward(x, axis, kind, seed)), src to dst (src == dst: in
// place).
void rht_forward_device(const float* src, float* dst, int64_t rows, int64_t cols, RhtAxis axis, RhtKind kind,
                        uint64_t seed, cudaStream_t stream);

// The transform of a quantizer spec (sim/quantizer.cpp's rht_copy): its sign set (rht_signs, rht_seed), along
// its block axis, then its rht_output rounding (every element, a partial chunk's too). src is FP32, or BF16
// (uint16_t bits) with bf16_in; dst FP32 [rows, cols] (src itself when src is FP32: in place). The inverse: the spec's
// signs, no rounding.
void rht_forward_device(const QuantizerSpec& q, const void* src, bool bf16_in, float* dst, int64_t rows, int64_t cols,
                        cudaStream_t stream);
void rht_inverse_device(const QuantizerSpec& q, float* x, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace fp4lab::cuda
