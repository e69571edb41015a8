// Explicit instantiations, BF16 input: the [1,32] row kernels of kinds 3 and 4 (E4M3 / E5M2 elements). Kernels:
// quantize_rows.cuh; dispatch: quantize_rows.cu; grouping: quantize_launch.cuh.
#include "cuda/quantize_rows.cuh"

namespace fp4lab::cuda::qk {

template void rows_launch<uint16_t, 32, 3, false>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 32, 4, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
