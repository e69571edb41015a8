// Explicit instantiations, BF16 input: the [32,1] column kernels of the nvfp4 and runtime kinds (KernelKind,
// quantize_plan.hpp). Kernels: quantize_cols.cuh; dispatch: quantize_cols.cu; grouping rule:
// quantize_launch.cuh.
#include "cuda/quantize_cols.cuh"

namespace fp4lab::cuda::qk {

template void cols_launch<uint16_t, 32, KernelKind::nvfp4, false>(const KParams&, cudaStream_t);
template void cols_launch<uint16_t, 32, KernelKind::runtime, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
