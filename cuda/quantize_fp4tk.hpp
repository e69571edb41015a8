// quantize_device's path for quantizers with `emulate: fp4tk` (sim/fp4tk.hpp),
// private to cuda/: fp4-trainkit's arithmetic (core/fp4tk.hpp) on the GPU, bit
// for bit the CPU emulation's. Two kernels: one thread per block computes the
// block's amax and scale; one thread per pair of columns of a row encodes.
// Every QuantOutputs form is written (global decode 1: no global scale).
#pragma once

#include <cstdint>

#include "cuda/quantize.hpp"

namespace fp4lab::cuda {

void quantize_fp4tk_device(const QuantizerSpec& q, const void* x, InputType type, int64_t rows, int64_t cols,
                           RandomStream rs, const QuantOutputs& out, QuantWorkspace& ws, cudaStream_t stream);

}  // namespace fp4lab::cuda
