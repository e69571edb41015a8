// Dispatch of the column-block kernels ([16,1] and [32,1] blocks): the
// launcher of the block height, kind, RHT and input type. The kernels live in
// quantize_cols.cuh, compiled in cuda/inst/cols*.cu.
#include "cuda/quantize_kernels.cuh"
#include "cuda/quantize_launch.cuh"

namespace fp4lab::cuda::qk {
namespace {

template <class In>
void dispatch(const KParams& p, int br, bool rht, int kind, bool amax_only, cudaStream_t st) {
  if (amax_only) return cols_amax_launch<In>(p, st);
  if (br == 16) {
    if (rht) {
      if (kind == 1) return cols_launch<In, 16, 1, true>(p, st);
      return cols_launch<In, 16, 0, true>(p, st);
    }
    if (kind == 1) return cols_launch<In, 16, 1, false>(p, st);
    if (kind == 2) return cols_launch<In, 16, 2, false>(p, st);
    return cols_launch<In, 16, 0, false>(p, st);
  }
  switch (kind) {
    case 1: return cols_launch<In, 32, 1, false>(p, st);
    case 2: return cols_launch<In, 32, 2, false>(p, st);
    case 3: return cols_launch<In, 32, 3, false>(p, st);
    case 4: return cols_launch<In, 32, 4, false>(p, st);
    default: return cols_launch<In, 32, 0, false>(p, st);
  }
}

}  // namespace

void launch_cols(const KParams& p, int br, bool rht, int kind, InputType in, bool amax_only, cudaStream_t st) {
  if (in == InputType::bf16)
    dispatch<uint16_t>(p, br, rht, kind, amax_only, st);
  else
    dispatch<float>(p, br, rht, kind, amax_only, st);
}

}  // namespace fp4lab::cuda::qk
