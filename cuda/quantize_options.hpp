// quantize_device's path for TransformerEngine's NVFP4 options
// (sim/nvfp4_options.hpp: scale_select four_over_six, global_scale row_amax),
// private to cuda/: the block rule sim uses (nvfp4_option_block,
// core/nvfp4_options.hpp) on the GPU, bit for bit. Three kernels: one thread
// per block for the block amax (the tensor's and each row's by atomicMax);
// one thread per block for the 4/6 choice or the row-scaled scale; one thread
// per pair of columns of a row for the elements. Every QuantOutputs form is
// written (global decode 1: the scales are TE's final dequantization scales).
#pragma once

#include <cstdint>

#include "cuda/quantize.hpp"

namespace fp4lab::cuda {

void quantize_options_device(const QuantizerSpec& q, const void* x, InputType type, int64_t rows, int64_t cols,
                             const QuantOutputs& out, QuantWorkspace& ws, cudaStream_t stream);

}  // namespace fp4lab::cuda
