// TransformerEngine's 4/6 and row-scaled NVFP4 on the GPU (schemes/te_nvfp4/rule.hpp): the generic
// pipeline's kernels (cuda/quantize_rule.cuh) instantiated on TeNvfp4Rule; the scale pass reads each block's
// elements for 4/6's two candidates.
#include "cuda/quantize_rule_kernels.cuh"

namespace fp4lab::cuda::qk {

template void run_rule<TeNvfp4Rule>(KParams&, const TeNvfp4Rule::Params&, const BlockGrid&, InputType, QuantWorkspace&,
                                    cudaStream_t);

}  // namespace fp4lab::cuda::qk
