// Explicit instantiations, BF16 input: the [1,32] row kernels of the e4m3 and e5m2 kinds (KernelKind,
// quantize_plan.hpp). Kernels: quantize_rows.cuh; dispatch: quantize_rows.cu; grouping rule:
// quantize_launch.cuh.
#include "cuda/quantize_rows.cuh"

namespace fp4lab::cuda::qk {

template void rows_launch<uint16_t, 32, KernelKind::e4m3, false>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 32, KernelKind::e5m2, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
