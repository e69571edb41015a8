// Instantiations of the grouped column kernels (quantize_cols_grouped.cuh) from bf16 input: [16,1] blocks with
// the RHT down each group's 16-row chunks (the nvfp4 and runtime kinds) and their per-group RHT amax pass.
#include "cuda/quantize_cols_grouped.cuh"

namespace fp4lab::cuda::qk {
template void cols_grouped_launch<uint16_t, 16, KernelKind::nvfp4, true>(const KParams&, const GroupTable&, int64_t,
                                                                         cudaStream_t);
template void cols_grouped_launch<uint16_t, 16, KernelKind::runtime, true>(const KParams&, const GroupTable&, int64_t,
                                                                           cudaStream_t);
template void cols_grouped_amax_launch<uint16_t>(const KParams&, const GroupTable&, const AmaxFinish&, int64_t,
                                                 cudaStream_t);
}  // namespace fp4lab::cuda::qk
