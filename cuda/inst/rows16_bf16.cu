// Explicit instantiations, BF16 input: the [1,16] row kernels: kind 1 (NVFP4) and the runtime kind, each with
// and without the block's RHT, and kind 2 (E2M1 with a run-time scale). Kernels: quantize_rows.cuh; dispatch:
// quantize_rows.cu; grouping: quantize_launch.cuh.
#include "cuda/quantize_rows.cuh"

namespace fp4lab::cuda::qk {

template void rows_launch<uint16_t, 16, 1, true>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 16, 0, true>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 16, 1, false>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 16, 2, false>(const KParams&, cudaStream_t);
template void rows_launch<uint16_t, 16, 0, false>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
