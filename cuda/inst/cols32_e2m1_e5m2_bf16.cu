// Explicit instantiations, BF16 input: the [32,1] column kernels of kinds 2 (E2M1 with a run-time scale) and 4
// (E5M2). Kernels: quantize_cols.cuh; dispatch: quantize_cols.cu; grouping: quantize_launch.cuh.
#include "cuda/quantize_cols.cuh"

namespace fp4lab::cuda::qk {

template void cols_launch<uint16_t, 32, 2, false>(const KParams&, cudaStream_t);
template void cols_launch<uint16_t, 32, 4, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
