// Explicit instantiation: the generic pipeline's kernels on the standard rule (cuda/quantize_rule.cuh),
// FP32 and BF16 input.
#include "cuda/quantize_rule_kernels.cuh"

namespace fp4lab::cuda::qk {

template void run_rule<StandardRule>(KParams&, const StandardRule::Params&, const BlockGrid&, InputType,
                                     QuantWorkspace&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
