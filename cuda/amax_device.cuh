// Device pieces of a tensor-amax pass, shared by the quantization kernels
// (quantize*.cu: the amax passes ahead of NVFP4's global scale) and the
// producers that compute the amaxes of what they write (nn.cu, nn.hpp
// ProducerAmax). Private to cuda/.
#pragma once

#include <cstdint>

#include "core/bits.hpp"
#include "sim/rht.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab::cuda {

__device__ __forceinline__ uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

// Block-level part of a tensor-amax pass: the block's max |x| bits m (and m2,
// of a pass computing two amaxes) into *gamax (*gamax2) by one atomicMax of
// thread 0 each. Every thread of the block must call it (it synchronises the
// block). No fence here: thread 0 itself reports the block to
// amax_pass_done (its fence orders these atomics before that report), the
// cooperative tile kernel's grid sync orders them before its reads, and a
// kernel's end orders them before the next kernel. (A fence after each warp's
// atomic, as before, stalled the amax passes' warps on memory barriers for
// half their cycles.)
__device__ __forceinline__ void amax_block_commit(uint32_t m, uint32_t* gamax, uint32_t m2 = 0,
                                                  uint32_t* gamax2 = nullptr) {
  __shared__ uint32_t part[2][32];
  m = __reduce_max_sync(0xFFFFFFFFu, m);
  m2 = __reduce_max_sync(0xFFFFFFFFu, m2);
  if ((threadIdx.x & 31) == 0) {
    part[0][threadIdx.x >> 5] = m;
    part[1][threadIdx.x >> 5] = m2;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t a = 0, b = 0;
    for (unsigned w = 0; w < (blockDim.x + 31) / 32; ++w) {
      a = umax(a, part[0][w]);
      b = umax(b, part[1][w]);
    }
    if (a != 0) atomicMax(gamax, a);
    if (gamax2 != nullptr && b != 0) atomicMax(gamax2, b);
  }
}

// The amaxes of a strip of 16 rows x V columns: m = max over its values of
// abs_bits, and (RHT) t = the same over their RHT down each column (sim's
// rht16_forward) but for its final * 0.25f, which rht_quarter applies once
// to the max instead: RN is monotone, so max |fl(t / 4)| == fl(max |t| / 4);
// the GPU's arithmetic NaNs are all 0x7FFFFFFF either way, and Inf stays Inf.
// Both accumulate into m and t.
template <int V, bool RHT>
__device__ __forceinline__ void strip_amaxes(const float (&v)[16][V], const float* signs, uint32_t& m, uint32_t& t) {
#pragma unroll
  for (int cc = 0; cc < V; ++cc) {
    float col[16];
#pragma unroll
    for (int rr = 0; rr < 16; ++rr) {
      m = umax(m, abs_bits(v[rr][cc]));
      col[rr] = v[rr][cc] * signs[rr];
    }
    if constexpr (RHT) {
      rht16_butterflies(col);
#pragma unroll
      for (int rr = 0; rr < 16; ++rr) t = umax(t, abs_bits(col[rr]));
    }
  }
}
__device__ __forceinline__ uint32_t rht_quarter(uint32_t t) { return float_bits(bits_float(t) * 0.25f); }

}  // namespace fp4lab::cuda
