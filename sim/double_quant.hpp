// Double quantization (TetraJet, Chen et al. 2025): a tensor quantized along
// one axis for one GEMM is dequantized and re-quantized along the other axis
// for the GEMM that reduces over that axis (e.g. W quantized [1,32] for the
// forward pass is re-quantized [32,1] from dq(W) for dgrad), so both GEMMs see
// the same first-stage rounding instead of two independent quantizations of
// the high-precision tensor.
//   double_quantize(first, second, x) = quantize(second, dq(quantize(first, x)))
// `second` is usually transposed_block(first) (optionally with SR).
#pragma once

#include "sim/quantizer.hpp"

namespace fp4lab {

// The same quantizer with its block shape transposed: [br, bc] -> [bc, br].
QuantizerSpec transposed_block(const QuantizerSpec& q);

QuantizedTensor double_quantize(const QuantizerSpec& first, const QuantizerSpec& second, MatrixView<const float> x,
                                RandomStream rs_first = {}, RandomStream rs_second = {});
// In place: x <- dq_second(dq_first(x)) (fake_quantize twice; with RHT each
// stage returns to x's domain).
void fake_double_quantize(const QuantizerSpec& first, const QuantizerSpec& second, MatrixView<float> x,
                          RandomStream rs_first = {}, RandomStream rs_second = {});

}  // namespace fp4lab
