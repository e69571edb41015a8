// Explicit instantiations, BF16 input: the [1,16] row kernels: the nvfp4 and runtime kinds, each with and
// without the block's RHT, and the e2m1 kind (KernelKind, quantize_plan.hpp). Kernels: quantize_rows.cuh;
// dispatch: quantize_rows.cu; grouping rule: quantize_launch.cuh.
#include "cuda/quantize_rows.cuh"

namespace fp4lab::cuda::qk {

template void rows_launch<uint16_t, 16, KernelKind::nvfp4, true>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 16, KernelKind::runtime, true>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 16, KernelKind::nvfp4, false>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 16, KernelKind::e2m1, false>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 16, KernelKind::runtime, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
