// The 16x16 tile kernels' shared part, private to cuda/: what a tile kernel
// does after its loads (tile_encode), used by quantize.cu's tile_kernel and by
// the grouped tile kernel (quantize_grouped.cu), so that both run one code.
#pragma once

#include "cuda/quantize_kernels.cuh"

namespace fp4lab::cuda::qk {

// The part of a tile kernel after its loads, for tile (tr, tc) of p, the lane's
// row r and first column c0, its values v (amax bits a, `valid` of them): the
// tile's amax by one warp reduction (the other tile's lanes contribute 0), its
// scale, and its elements. Every lane of the warp calls it.
template <KernelKind K, Fast FM, bool FULL>
__device__ __forceinline__ void tile_encode(const KParams& p, const Format& f, const Format& sf, const NvGlobal& g,
                                            int64_t tr, int64_t tc, int64_t r, int64_t c0, float (&v)[16], uint32_t a,
                                            int valid) {
  const int lane = threadIdx.x & 31, half = lane >> 4;
  const int64_t tiles_c = (p.cols + 15) / 16;
  const uint32_t m0 = __reduce_max_sync(0xFFFFFFFFu, half ? 0u : a), m1 = __reduce_max_sync(0xFFFFFFFFu, half ? a : 0u);
  const uint32_t m = half ? m1 : m0;
  BlockParams bp[1] = {block_params<K>(p, f, sf, m, g)};
  if ((lane & 15) == 0 && tc < tiles_c) {
    const int64_t si = tr * p.nbc + tc;
    if (p.out.scale_codes) p.out.scale_codes[si] = uint8_t(bp[0].code);
    if (p.out.scales) p.out.scales[si] = bp[0].scale;
  }
  if (valid <= 0) return;
  if constexpr (FM == Fast::rn) {
    encode_store_rn<K, 16, FULL>(p, f, g, r, c0, v, bp, valid, m);
  } else {
    encode_and_store<K, 16, 1>(p, f, g, r, c0, v, bp, valid);
  }
}

}  // namespace fp4lab::cuda::qk
