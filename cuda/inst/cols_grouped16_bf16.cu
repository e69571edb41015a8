// Instantiations of the grouped column kernels (quantize_cols_grouped.cuh) from bf16 input: [16,1] blocks
// without RHT of the nvfp4, e2m1 and runtime kinds (quantize_cols.cu's kinds).
#include "cuda/quantize_cols_grouped.cuh"

namespace fp4lab::cuda::qk {
template void cols_grouped_launch<uint16_t, 16, KernelKind::nvfp4, false>(const KParams&, const GroupTable&, int64_t,
                                                                          cudaStream_t);
template void cols_grouped_launch<uint16_t, 16, KernelKind::e2m1, false>(const KParams&, const GroupTable&, int64_t,
                                                                         cudaStream_t);
template void cols_grouped_launch<uint16_t, 16, KernelKind::runtime, false>(const KParams&, const GroupTable&, int64_t,
                                                                            cudaStream_t);
}  // namespace fp4lab::cuda::qk
