// Per-layer numerics statistics on the GPU (train/numerics.hpp defines them):
// the CUDA twin of train::operand_numerics, for the CUDA linear layer's
// measuring steps (output.numerics_interval). Beside the layer's own
// quantization, not in it: on a measuring step the operand is made again from
// its source by the plan's steps (copy, pre: fake_quantize_device, wgrad RHT:
// rht_forward_device, the quantizer's own RHT along its block axis, then
// quantize_device into scratch codes / scale codes / dequant; each step
// bit-identical to sim's), and reduction kernels count (numerics.cu).
// Off-steps run none of this. Every count, amax and float64 sum equals the
// CPU's bit for bit (the same FP4LAB_HD rules; the sums in numerics.hpp's lane
// order and tree; --fmad=false).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include <cuda_runtime.h>

#include "recipes/linear_plan.hpp"
#include "train/numerics.hpp"

namespace fp4lab::train {

// Scratch of the device measurement (grown on demand, reused).
struct NumericsWorkspace;
struct NumericsWorkspaceDeleter {
  void operator()(NumericsWorkspace* w) const;
};
using NumericsWorkspacePtr = std::unique_ptr<NumericsWorkspace, NumericsWorkspaceDeleter>;
NumericsWorkspacePtr make_numerics_workspace();

// src: the operand's FP32 source [rows, cols] on the device. Synchronises
// `stream` (the counts come back to the host).
NumericsCounts operand_numerics_device(const OperandPlan& p, const float* src, int64_t rows, int64_t cols,
                                       NumericsWorkspace& ws, cudaStream_t stream = nullptr);

// The same without waiting: the work is enqueued on `stream`, the counts land
// in a slot of ws (slots are reused from the first after begin_measuring);
// the returned function reads them back (synchronising `stream`), valid until
// the next begin_measuring(ws) and while ws lives.
std::function<NumericsCounts()> operand_numerics_device_async(const OperandPlan& p, const float* src, int64_t rows,
                                                              int64_t cols, NumericsWorkspace& ws,
                                                              cudaStream_t stream);
// A new measuring step: the slots of earlier steps (all read) are free again.
void begin_measuring(NumericsWorkspace& ws);

}  // namespace fp4lab::train
