// Explicit instantiations, FP32 input: the [16,1] column kernels of kind 1 (NVFP4) and of the runtime kind, no
// RHT. Kernels: quantize_cols.cuh; dispatch: quantize_cols.cu; grouping: quantize_launch.cuh.
#include "cuda/quantize_cols.cuh"

namespace fp4lab::cuda::qk {

template void cols_launch<float, 16, 1, false>(const KParams&, cudaStream_t);
template void cols_launch<float, 16, 0, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
