// Instantiations of the grouped column kernels (quantize_cols_grouped.cuh) from bf16 input: [32,1] blocks of
// the nvfp4, e2m1, e4m3, e5m2 and runtime kinds (quantize_cols.cu's kinds).
#include "cuda/quantize_cols_grouped.cuh"

namespace fp4lab::cuda::qk {
template void cols_grouped_launch<uint16_t, 32, KernelKind::nvfp4, false>(const KParams&, const GroupTable&, int64_t,
                                                                          cudaStream_t);
template void cols_grouped_launch<uint16_t, 32, KernelKind::e2m1, false>(const KParams&, const GroupTable&, int64_t,
                                                                         cudaStream_t);
template void cols_grouped_launch<uint16_t, 32, KernelKind::e4m3, false>(const KParams&, const GroupTable&, int64_t,
                                                                         cudaStream_t);
template void cols_grouped_launch<uint16_t, 32, KernelKind::e5m2, false>(const KParams&, const GroupTable&, int64_t,
                                                                         cudaStream_t);
template void cols_grouped_launch<uint16_t, 32, KernelKind::runtime, false>(const KParams&, const GroupTable&, int64_t,
                                                                            cudaStream_t);
}  // namespace fp4lab::cuda::qk
