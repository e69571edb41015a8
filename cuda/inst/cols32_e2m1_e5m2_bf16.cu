// Explicit instantiations, BF16 input: the [32,1] column kernels of the e2m1 and e5m2 kinds (KernelKind,
// quantize_plan.hpp). Kernels: quantize_cols.cuh; dispatch: quantize_cols.cu; grouping rule:
// quantize_launch.cuh.
#include "cuda/quantize_cols.cuh"

namespace fp4lab::cuda::qk {

template void cols_launch<uint16_t, 32, KernelKind::e2m1, false>(const KParams&, cudaStream_t);
template void cols_launch<uint16_t, 32, KernelKind::e5m2, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
