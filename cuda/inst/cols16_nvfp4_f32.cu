// Explicit instantiations, FP32 input: the [16,1] column kernels of the nvfp4 and runtime kinds, no RHT
// (KernelKind, quantize_plan.hpp). Kernels: quantize_cols.cuh; dispatch: quantize_cols.cu; grouping rule:
// quantize_launch.cuh.
#include "cuda/quantize_cols.cuh"

namespace fp4lab::cuda::qk {

template void cols_launch<float, 16, KernelKind::nvfp4, false>(const KParams&, cudaStream_t);
template void cols_launch<float, 16, KernelKind::runtime, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
