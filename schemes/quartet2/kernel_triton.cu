// Quartet II's Triton simulation of its forward quantizer on the GPU (schemes/quartet2/triton.hpp): the generic
// pipeline's kernels (cuda/quantize_rule.cuh) instantiated on Quartet2TritonRule; div.full is the instruction.
#include "cuda/quantize_rule_kernels.cuh"

namespace fp4lab::cuda::qk {

template void run_rule<Quartet2TritonRule>(KParams&, const Quartet2TritonRule::Params&, const BlockGrid&, InputType,
                                           QuantWorkspace&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
