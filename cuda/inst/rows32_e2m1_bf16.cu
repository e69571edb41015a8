// Explicit instantiations, BF16 input: the [1,32] row kernels of the nvfp4, e2m1 and runtime kinds (KernelKind,
// quantize_plan.hpp). Kernels: quantize_rows.cuh; dispatch: quantize_rows.cu; grouping rule:
// quantize_launch.cuh.
#include "cuda/quantize_rows.cuh"

namespace fp4lab::cuda::qk {

template void rows_launch<uint16_t, 32, KernelKind::nvfp4, false>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 32, KernelKind::e2m1, false>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 32, KernelKind::runtime, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
