// Explicit instantiations, FP32 input: the [16,1] column kernels of the e2m1 kind and [32,1] ones of the e4m3
// kind (KernelKind, quantize_plan.hpp). Kernels: quantize_cols.cuh; dispatch: quantize_cols.cu; grouping rule:
// quantize_launch.cuh.
#include "cuda/quantize_cols.cuh"

namespace fp4lab::cuda::qk {

template void cols_launch<float, 16, KernelKind::e2m1, false>(const KParams&, cudaStream_t);
template void cols_launch<float, 32, KernelKind::e4m3, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
