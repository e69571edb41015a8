// Quartet II's forward NVFP4 kernel arithmetic on the GPU (schemes/quartet2/scalar.hpp): the generic
// pipeline's kernels (cuda/quantize_rule.cuh) instantiated on Quartet2Rule; rcp.approx.ftz is the instruction.
#include "cuda/quantize_rule_kernels.cuh"

namespace fp4lab::cuda::qk {

template void run_rule<Quartet2Rule>(KParams&, const Quartet2Rule::Params&, const BlockGrid&, InputType,
                                     QuantWorkspace&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
