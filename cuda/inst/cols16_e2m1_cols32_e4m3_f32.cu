// Explicit instantiations, FP32 input: the [16,1] column kernels of kind 2 (E2M1 with a run-time scale) and
// [32,1] ones of kind 3 (E4M3). Kernels: quantize_cols.cuh; dispatch: quantize_cols.cu; grouping:
// quantize_launch.cuh.
#include "cuda/quantize_cols.cuh"

namespace fp4lab::cuda::qk {

template void cols_launch<float, 16, 2, false>(const KParams&, cudaStream_t);
template void cols_launch<float, 32, 3, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
