// Explicit instantiations, BF16 input: the [16,1] column kernels with the RHT down each column: kind 1 (NVFP4)
// and the runtime kind. Kernels: quantize_cols.cuh; dispatch: quantize_cols.cu; grouping: quantize_launch.cuh.
#include "cuda/quantize_cols.cuh"

namespace fp4lab::cuda::qk {

template void cols_launch<uint16_t, 16, 1, true>(const KParams&, cudaStream_t);
template void cols_launch<uint16_t, 16, 0, true>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
