// Explicit instantiations, BF16 input: the [1,32] row kernels of kinds 1 and 2 (E2M1 elements) and the runtime
// kind. Kernels: quantize_rows.cuh; dispatch: quantize_rows.cu; grouping: quantize_launch.cuh.
#include "cuda/quantize_rows.cuh"

namespace fp4lab::cuda::qk {

template void rows_launch<uint16_t, 32, 1, false>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 32, 2, false>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 32, 0, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
