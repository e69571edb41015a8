// TransformerEngine's Python reference NVFP4 quantizer on the GPU (schemes/te_nvfp4/reference.hpp): the generic
// pipeline's kernels (cuda/quantize_rule.cuh) instantiated on TeReferenceRule.
#include "cuda/quantize_rule_kernels.cuh"

namespace fp4lab::cuda::qk {

template void run_rule<TeReferenceRule>(KParams&, const TeReferenceRule::Params&, const BlockGrid&, InputType,
                                        QuantWorkspace&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
