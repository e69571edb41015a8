// Tensor-amax passes and RHT helpers of the quantization kernels, private to
// cuda/: the grid-wide amax commit and its finish (the global scale written by
// the last block, the amax words re-armed), per-thread amax of registers, and
// the RHT down the columns of a strip. Part of quantize_kernels.cuh.
#pragma once

#include "cuda/quantize_params.cuh"

namespace fp4lab::cuda::qk {

// The block index a kernel works on: reversed in amax passes, so that the
// last bytes an amax pass reads are the tensor's first, which the quantization
// pass that follows reads first, while they are still in L2.
template <bool AMAX_PASS>
__device__ __forceinline__ unsigned amax_pass_block() {
  return AMAX_PASS ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
}

// The grid's one write of g_dec (by one thread) into o.global_decode, and of
// the GEMM alpha g_dec * other g_dec into o.gemm_alpha (QuantOutputs).
__device__ __forceinline__ void store_global_decode(const QuantOutputs& o, float g_dec) {
  if (o.global_decode) *o.global_decode = g_dec;
  if (o.gemm_alpha) *o.gemm_alpha = o.gemm_alpha_other ? g_dec * *o.gemm_alpha_other : g_dec;
}

// nv_global() of the final amax bits at *gamax (read at L2) into fin.out.
__device__ __forceinline__ void store_nv_global(const AmaxFinish& fin, uint32_t* gamax) {
  const uint32_t a = atomicOr(gamax, 0u);
  const NvGlobal g = nv_global(bits_float(a), max_finite(fin.sfmt), max_finite(fin.elem));
  fin.out[0] = g.g_enc;
  fin.out[1] = g.g_dec;
  fin.out[2] = g.mult;
}

// Every thread of every block calls this once it is done with what the grid's
// last block will change: true in the grid's last block to arrive at the
// block counter *done (every thread of it), after a fence; false elsewhere.
__device__ __forceinline__ bool last_block_to_arrive(uint32_t* done) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  return last;
}

// Every thread of every block calls this after amax_block_commit. With fin.out
// or fin2.out set, the grid's last block to arrive computes nv_global() of
// the final amax (what nv_global_kernel computes from it; sim/scale_rules.hpp)
// into fin.out, and the same for a second amax (fin2, of a pass computing
// two), then re-arms the counter and the amax words (gamax, gamax2: back to
// zero, QuantWorkspace::amax_armed): the quantization pass then reads the
// global scale without a launch in between, and the next amax pass needs no
// memset.
__device__ __forceinline__ void amax_pass_done(const AmaxFinish& fin, uint32_t* gamax,
                                               const AmaxFinish& fin2 = AmaxFinish{}, uint32_t* gamax2 = nullptr) {
  uint32_t* const done = fin.out ? fin.done : fin2.done;
  if (done == nullptr) return;  // uniform across the grid
  if (last_block_to_arrive(done) && threadIdx.x == 0) {
    __threadfence();
    if (fin.out) store_nv_global(fin, gamax);
    if (fin2.out) store_nv_global(fin2, gamax2);
    *gamax = 0;
    if (gamax2) *gamax2 = 0;
    *done = 0;
  }
}

// Max |x| bits of values (NaN bits propagate, as a max of abs_bits()), added
// one at a time (AmaxBits) or N at once (amax_bits): the unsigned max of the raw
// bits is the negative value of largest magnitude when there is one, the signed
// max the largest positive, so no per-element abs.
struct AmaxBits {
  uint32_t umx = 0;
  int32_t smx = 0;
  __device__ __forceinline__ void add(float x) {
    umx = umax(umx, float_bits(x));
    smx = max(smx, int32_t(float_bits(x)));
  }
  __device__ __forceinline__ uint32_t bits() const { return umax(umx & 0x7FFFFFFFu, uint32_t(smx)); }
};
template <int N>
__device__ __forceinline__ uint32_t amax_bits(const float (&v)[N]) {
  AmaxBits m;
#pragma unroll
  for (int j = 0; j < N; ++j) m.add(v[j]);
  return m.bits();
}

// The RHT (sim's rht16_forward) down each of the V columns of a 16-row strip,
// in place. PRESIGNED: v holds d_i * v_i already (load_rows' FLIP with
// rht_sign_flips()), so only the butterflies and the * 0.25f remain.
template <int V, bool PRESIGNED = false>
__device__ __forceinline__ void rht_columns(float (&v)[16][V], const float* signs) {
#pragma unroll
  for (int cc = 0; cc < V; ++cc) {
    float col[16];
#pragma unroll
    for (int rr = 0; rr < 16; ++rr) col[rr] = v[rr][cc];
    if constexpr (PRESIGNED) {
      rht16_butterflies(col);
#pragma unroll
      for (int rr = 0; rr < 16; ++rr) col[rr] = col[rr] * 0.25f;
    } else {
      rht16_forward(col, signs);
    }
#pragma unroll
    for (int rr = 0; rr < 16; ++rr) v[rr][cc] = col[rr];
  }
}
// The sign bits of the RHT's d_i (+-1.0f): x * d_i == x with its sign bit xor'ed
// by flip[i], exactly (a NaN's payload aside, which the butterflies' first add
// replaces by the GPU's canonical NaN either way).
__device__ __forceinline__ void rht_sign_flips(const float* signs, uint32_t (&flip)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) flip[i] = float_bits(signs[i]) & 0x80000000u;
}

}  // namespace fp4lab::cuda::qk
