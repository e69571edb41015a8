// Explicit instantiations: the RHT amax passes of [1,16] and [16,1] blocks (the transformed tensor's amax), FP32
// and BF16 input, together so that the amax helpers' shared variables stay module-wide as in one unit of several
// kernels. Kernels: quantize_rows.cuh, quantize_cols.cuh.
#include "cuda/quantize_cols.cuh"
#include "cuda/quantize_rows.cuh"

namespace fp4lab::cuda::qk {

template void rows_amax_launch<float>(const KParams&, cudaStream_t);
template void rows_amax_launch<uint16_t>(const KParams&, cudaStream_t);
template void cols_amax_launch<float>(const KParams&, cudaStream_t);
template void cols_amax_launch<uint16_t>(const KParams&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
