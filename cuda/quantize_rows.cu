// Dispatch of the row-block kernels ([1,16] and [1,32] blocks): the launcher
// of the block width, kind, RHT and input type. The kernels live in
// quantize_rows.cuh, compiled in cuda/inst/rows*.cu.
#include "cuda/quantize_kernels.cuh"
#include "cuda/quantize_launch.cuh"

namespace fp4lab::cuda::qk {
namespace {

template <class In>
void dispatch(const KParams& p, int bc, bool rht, int kind, bool amax_only, cudaStream_t st) {
  if (amax_only) return rows_amax_launch<In>(p, st);
  if (bc == 16) {
    if (rht) {
      if (kind == 1) return rows_launch<In, 16, 1, true>(p, st);
      return rows_launch<In, 16, 0, true>(p, st);
    }
    if (kind == 1) return rows_launch<In, 16, 1, false>(p, st);
    if (kind == 2) return rows_launch<In, 16, 2, false>(p, st);
    return rows_launch<In, 16, 0, false>(p, st);
  }
  switch (kind) {
    case 1: return rows_launch<In, 32, 1, false>(p, st);
    case 2: return rows_launch<In, 32, 2, false>(p, st);
    case 3: return rows_launch<In, 32, 3, false>(p, st);
    case 4: return rows_launch<In, 32, 4, false>(p, st);
    default: return rows_launch<In, 32, 0, false>(p, st);
  }
}

}  // namespace

void launch_rows(const KParams& p, int bc, bool rht, int kind, InputType in, bool amax_only, cudaStream_t st) {
  if (in == InputType::bf16)
    dispatch<uint16_t>(p, bc, rht, kind, amax_only, st);
  else
    dispatch<float>(p, bc, rht, kind, amax_only, st);
}

}  // namespace fp4lab::cuda::qk
