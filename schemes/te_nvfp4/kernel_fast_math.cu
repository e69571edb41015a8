// TransformerEngine's NVFP4 fast-math kernel arithmetic on the GPU (schemes/te_nvfp4/fast_math.hpp): the
// generic pipeline's kernels (cuda/quantize_rule.cuh) instantiated on TeFastMathRule.
#include "cuda/quantize_rule_kernels.cuh"

namespace fp4lab::cuda::qk {

template void run_rule<TeFastMathRule>(KParams&, const TeFastMathRule::Params&, const BlockGrid&, InputType,
                                       QuantWorkspace&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
