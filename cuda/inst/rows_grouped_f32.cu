// Instantiations of the grouped row kernels (quantize_rows_grouped.cuh) from
// f32 input: [1,16] blocks of the nvfp4, e2m1 and runtime kinds, [1,32]
// blocks of the e2m1, e4m3 and runtime kinds (quantize_plan.cpp's kinds of
// the rows family, e5m2 and nvfp4-[1,32] through the runtime kind).
#include "cuda/quantize_rows_grouped.cuh"

namespace fp4lab::cuda::qk {
template void rows_grouped_launch<float, 16, KernelKind::nvfp4>(const KParams&, const GroupTable&, cudaStream_t);
template void rows_grouped_launch<float, 16, KernelKind::e2m1>(const KParams&, const GroupTable&, cudaStream_t);
template void rows_grouped_launch<float, 16, KernelKind::runtime>(const KParams&, const GroupTable&, cudaStream_t);
template void rows_grouped_launch<float, 32, KernelKind::e2m1>(const KParams&, const GroupTable&, cudaStream_t);
template void rows_grouped_launch<float, 32, KernelKind::e4m3>(const KParams&, const GroupTable&, cudaStream_t);
template void rows_grouped_launch<float, 32, KernelKind::runtime>(const KParams&, const GroupTable&, cudaStream_t);
}  // namespace fp4lab::cuda::qk
