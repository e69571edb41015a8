// Quartet II's Triton simulation of its backward MS-EDEN quantizer on the GPU (schemes/quartet2/eden_triton.hpp):
// the generic pipeline's kernels (cuda/quantize_rule.cuh) instantiated on Quartet2EdenTritonRule; div.full is the
// instruction, the scale's random word the same Philox word as on the CPU.
#include "cuda/quantize_rule_kernels.cuh"

namespace fp4lab::cuda::qk {

template void run_rule<Quartet2EdenTritonRule>(KParams&, const Quartet2EdenTritonRule::Params&, const BlockGrid&,
                                               InputType, QuantWorkspace&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
