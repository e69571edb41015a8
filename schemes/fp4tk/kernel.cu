// fp4-trainkit's arithmetic on the GPU (schemes/fp4tk/rule.hpp): the generic pipeline's kernels
// (cuda/quantize_rule.cuh) instantiated on Fp4tkRule, bit for bit the CPU's rows.
#include "cuda/quantize_rule_kernels.cuh"

namespace fp4lab::cuda::qk {

template void run_rule<Fp4tkRule>(KParams&, const Fp4tkRule::Params&, const BlockGrid&, InputType, QuantWorkspace&,
                                  cudaStream_t);

}  // namespace fp4lab::cuda::qk
