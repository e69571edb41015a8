// TransformerEngine's fused RHT-cast NVFP4 kernel arithmetic under fast math on the GPU
// (schemes/te_nvfp4/fused_fast_math.hpp): the generic pipeline's kernels (cuda/quantize_rule.cuh) instantiated
// on TeFusedFastMathRule; rcp.approx.ftz is the instruction.
#include "cuda/quantize_rule_kernels.cuh"

namespace fp4lab::cuda::qk {

template void run_rule<TeFusedFastMathRule>(KParams&, const TeFusedFastMathRule::Params&, const BlockGrid&, InputType,
                                            QuantWorkspace&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
