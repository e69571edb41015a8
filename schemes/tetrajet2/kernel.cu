// TetraJet-v2's double-block quantizer on the GPU (schemes/tetrajet2/scalar.hpp): the generic pipeline's kernels
// (cuda/quantize_rule.cuh) instantiated on Tetrajet2Rule; div.full / div.approx / rcp are the instructions.
#include "cuda/quantize_rule_kernels.cuh"

namespace fp4lab::cuda::qk {

template void run_rule<Tetrajet2Rule>(KParams&, const Tetrajet2Rule::Params&, const BlockGrid&, InputType,
                                      QuantWorkspace&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
