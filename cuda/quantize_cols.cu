// Dispatch of the column-block kernels ([16,1] and [32,1] blocks): a plan's
// (quantize_plan.hpp) block size, kind, RHT and input type to their launcher.
// The plan has already reduced the kind to one these kernels have (no other
// choice is made here); the kernels live in quantize_cols.cuh, compiled in
// cuda/inst/cols*.cu.
#include "cuda/quantize_kernels.cuh"
#include "cuda/quantize_launch.cuh"

namespace fp4lab::cuda::qk {
namespace {

template <class In>
void dispatch(const KParams& p, int br, bool rht, KernelKind kind, cudaStream_t st) {
  using enum KernelKind;
  if (br == 16) {
    if (rht) {
      if (kind == nvfp4) return cols_launch<In, 16, nvfp4, true>(p, st);
      return cols_launch<In, 16, runtime, true>(p, st);
    }
    if (kind == nvfp4) return cols_launch<In, 16, nvfp4, false>(p, st);
    if (kind == e2m1) return cols_launch<In, 16, e2m1, false>(p, st);
    return cols_launch<In, 16, runtime, false>(p, st);
  }
  switch (kind) {
    case nvfp4: return cols_launch<In, 32, nvfp4, false>(p, st);
    case e2m1: return cols_launch<In, 32, e2m1, false>(p, st);
    case e4m3: return cols_launch<In, 32, e4m3, false>(p, st);
    case e5m2: return cols_launch<In, 32, e5m2, false>(p, st);
    default: return cols_launch<In, 32, runtime, false>(p, st);
  }
}

}  // namespace

void launch_cols(const KParams& p, int br, bool rht, KernelKind kind, InputType in, cudaStream_t st) {
  if (in == InputType::bf16)
    dispatch<uint16_t>(p, br, rht, kind, st);
  else
    dispatch<float>(p, br, rht, kind, st);
}

void launch_cols_amax(const KParams& p, InputType in, cudaStream_t st) {
  if (in == InputType::bf16)
    cols_amax_launch<uint16_t>(p, st);
  else
    cols_amax_launch<float>(p, st);
}

}  // namespace fp4lab::cuda::qk
