// Device building blocks shared by the quantization kernels (quantize*.cu).
// Private to cuda/. Every numeric step calls the same FP4LAB_HD functions as
// sim/quantizer.cpp (core's encode()/encode_rn_f32()/decode()/random_bits(),
// sim/scale_rules.hpp, sim/rht.hpp); nothing here is a second implementation.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/philox.hpp"
#include "cuda/amax_device.cuh"
#include "cuda/fast_div.hpp"
#include "cuda/quantize.hpp"
#include "sim/rht.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab::cuda::qk {

constexpr int kThreads = 256;

// Optional end of a tensor-amax pass (amax_pass_done below): where the grid's
// last block writes NvGlobal of the final amax (out[0..2] = g_enc, g_dec,
// mult), and the block counter it uses (zero between passes). out == null: off.
struct AmaxFinish {
  Format elem, sfmt;
  float* out = nullptr;
  uint32_t* done = nullptr;
};

// Everything a quantization kernel needs, passed by value (kernel parameter
// space). Formats travel by value: their constexpr globals are host objects.
struct KParams {
  Format elem, sfmt;
  ScaleRule rule;
  Round round;
  Overflow overflow;
  bool global;  // nv rule with global_scale tensor_amax
  int64_t rows, cols, nbc;
  int64_t br, bc;  // generic path block shape (whole tensor for [0,0])
  const void* x;
  uint64_t seed, stream;
  float signs[16];       // RHT signs (sim/rht.hpp rht_sign)
  uint32_t* gamax;       // tensor amax bits (read by nv+global; written by amax passes)
  const float* gparams;  // optional precomputed NvGlobal {g_enc, g_dec, mult} of *gamax
  uint32_t* block_amax;  // generic path [nbr*nbc]
  float* block_mult;     // generic path
  float* block_scale;    // generic path
  AmaxFinish fin;        // amax passes: NvGlobal of the result by the last block
  QuantOutputs out;
  // FULL kernel forms (full_params): the count of work units (row-kernel
  // threads, tile-kernel warps) and the division of a unit index by the units
  // per row (of elements, or of tiles).
  uint32_t units = 0;
  FastDivU31 unit_div;
};

__device__ __forceinline__ uint32_t umin(uint32_t a, uint32_t b) { return a < b ? a : b; }

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

// Compile-time formats of the hot quantizers ("kinds"); the rest is runtime.
//   0 runtime element and scale     1 e2m1 + ue4m3 (NVFP4)     2 e2m1 + runtime scale (MXFP4...)
//   3 e4m3fn + runtime scale        4 e5m2 + runtime scale
// kind_format<K>() is kind K's element format (K != 0): the one place that maps
// a kind to it; the codec helpers below take it as a template argument.
template <int K>
FP4LAB_HD constexpr const Format& kind_format() {
  static_assert(K >= 1 && K <= 4, "kind 0 has a run-time format");
  if constexpr (K == 1 || K == 2) {
    return float4_e2m1fn;
  } else if constexpr (K == 3) {
    return float8_e4m3fn;
  } else {
    return float8_e5m2;
  }
}
template <int K>
__device__ __forceinline__ Format kind_elem(const KParams& p) {
  if constexpr (K != 0) {
    constexpr Format f = kind_format<K>();
    return f;
  } else {
    return p.elem;
  }
}
template <int K>
__device__ __forceinline__ Format kind_scale(const KParams& p) {
  if constexpr (K == 1) {
    constexpr Format f = ufloat8_e4m3;
    return f;
  } else {
    return p.sfmt;
  }
}
inline int kind_of(const QuantizerSpec& q) {
  if (q.element == &float4_e2m1fn) return q.scale == &ufloat8_e4m3 ? 1 : 2;
  if (q.element == &float8_e4m3fn) return 3;
  if (q.element == &float8_e5m2) return 4;
  return 0;
}

template <int K>
__device__ __forceinline__ uint32_t encode_rn(const Format& f, float y, Overflow o) {
  if constexpr (K != 0) {
    return encode_rn_f32<kind_format<K>()>(y, o);
  } else {
    return encode(f, y, Round::rn, o);
  }
}

// Stochastic rounding: core's branch-free encode_rs_f32 (== encode(rs)) for the
// compile-time formats, the generic encoder otherwise.
template <int K>
__device__ __forceinline__ uint32_t encode_rs(const Format& f, float y, Overflow o, uint32_t rbits) {
  if constexpr (K != 0) {
    return encode_rs_f32<kind_format<K>()>(y, rbits, o);
  } else {
    return encode(f, y, Round::rs, o, rbits);
  }
}

// ---- block parameters: compute_block_scales() of sim, per block ------------
struct BlockParams {
  uint32_t code = 0;  // scale-format code (unused for float32 scales)
  float scale = 0;    // decoded scale
  float mult = 0;     // element operand: x * mult, or x / mult for nv_noglobal
};

__device__ __forceinline__ NvGlobal nv_global_of(const KParams& p, const Format& elem, const Format& sfmt) {
  if (p.gparams) return NvGlobal{p.gparams[0], p.gparams[1], p.gparams[2]};
  const float elem_max = max_finite(elem);
  if (p.rule == ScaleRule::nv && p.global) return nv_global(bits_float(*p.gamax), max_finite(sfmt), elem_max);
  return nv_no_global(elem_max);
}

__device__ __forceinline__ BlockParams block_params_impl(const Format& elem, const Format& sfmt, ScaleRule rule,
                                                         uint32_t amax, const NvGlobal& g) {
  BlockParams b;
  switch (rule) {
    case ScaleRule::ocp:
    case ScaleRule::ceil:
    case ScaleRule::tetrajet: {
      const MxScale s = rule == ScaleRule::ocp    ? mx_scale_ocp(amax, elem)
                        : rule == ScaleRule::ceil ? mx_scale_ceil(amax, elem)
                                                  : mx_scale_tetrajet(amax, elem);
      b.code = s.code();
      b.scale = s.nan ? quiet_nan_f() : pow2f(s.exp);
      b.mult = s.nan ? quiet_nan_f() : pow2f(-s.exp);
      break;
    }
    case ScaleRule::nv: {
      const NvBlockScale s = nv_block_scale(bits_float(amax), g, sfmt);
      b.code = s.code;
      b.scale = s.scale;
      b.mult = s.encode;
      break;
    }
    case ScaleRule::nv_noglobal: {
      const NvBlockScale s = nv_noglobal_block_scale(bits_float(amax), max_finite(elem), sfmt);
      b.code = s.code;
      b.scale = s.scale;
      b.mult = s.scale;
      break;
    }
    case ScaleRule::tensor_amax: {
      const TensorScale t = tensor_amax_scale(bits_float(amax), max_finite(elem));
      b.scale = t.decode;
      b.mult = t.encode;
      break;
    }
  }
  return b;
}
// Out of line for runtime formats (compile time: encode() is large).
__device__ __noinline__ inline BlockParams block_params_rt(const Format elem, const Format sfmt, ScaleRule rule,
                                                           uint32_t amax, const NvGlobal g) {
  return block_params_impl(elem, sfmt, rule, amax, g);
}
template <int K>
__device__ __forceinline__ BlockParams block_params(const KParams& p, const Format& elem, const Format& sfmt,
                                                    uint32_t amax, const NvGlobal& g) {
  if constexpr (K == 1) {
    // NVFP4's scale format is ufloat8_e4m3: sim's compile-time E4M3 forms
    // (branch-free encode_rn_f32 / decode_f32, equal to the generic rule by test).
    if (p.rule == ScaleRule::nv) {
      const NvBlockScale s = nv_block_scale<ufloat8_e4m3>(bits_float(amax), g);
      return BlockParams{s.code, s.scale, s.encode};
    }
    if (p.rule == ScaleRule::nv_noglobal) {
      const NvBlockScale s = nv_noglobal_block_scale<ufloat8_e4m3>(bits_float(amax), max_finite(elem));
      return BlockParams{s.code, s.scale, s.scale};
    }
  } else if constexpr (K != 0) {
    if (p.rule == ScaleRule::ocp) return block_params_impl(elem, sfmt, ScaleRule::ocp, amax, g);
  }
  return block_params_rt(elem, sfmt, p.rule, amax, g);
}

// Element code of x in a block with multiplier `mult` (sim's row_generic /
// row_rn_fast; the float64 product for MX rules with rp/rm as sim).
__device__ __noinline__ inline uint32_t encode_element_rt(const Format f, ScaleRule rule, Round round,
                                                          Overflow overflow, float x, float mult, uint32_t rbits) {
  const bool pow2 = rule == ScaleRule::ocp || rule == ScaleRule::ceil || rule == ScaleRule::tetrajet;
  if (pow2 && (round == Round::rp || round == Round::rm))
    return encode(f, double(x) * double(mult), round, overflow, rbits);
  const float y = rule == ScaleRule::nv_noglobal ? x / mult : x * mult;
  return encode(f, y, round, overflow, rbits);
}
template <int K>
__device__ __forceinline__ uint32_t encode_element(const KParams& p, const Format& f, float x, float mult,
                                                   uint32_t rbits) {
  if constexpr (K != 0) {
    if (p.rule != ScaleRule::nv_noglobal) {
      if (p.round == Round::rn) return encode_rn<K>(f, x * mult, p.overflow);
      if (p.round == Round::rs) return encode_rs<K>(f, x * mult, p.overflow, rbits);
    }
  }
  return encode_element_rt(f, p.rule, p.round, p.overflow, x, mult, rbits);
}

// decode() of an element code; core's branch-free decode_f32 for the
// compile-time formats.
template <int K>
__device__ __forceinline__ float decode_elem(const Format& f, uint32_t code) {
  if constexpr (K != 0) {
    return decode_f32<kind_format<K>()>(code);
  } else {
    return decode(f, code);
  }
}

__device__ __forceinline__ uint32_t pick(const Philox4& g, uint32_t k) {
  return k == 0 ? g.v[0] : k == 1 ? g.v[1] : k == 2 ? g.v[2] : g.v[3];
}

__device__ __forceinline__ uint32_t to_bf16(float v) { return encode_rn_f32<bfloat16>(v, Overflow::nonsaturate); }

template <class In>
__device__ __forceinline__ float load1(const void* x, int64_t i) {
  if constexpr (sizeof(In) == 2) {
    // bfloat16 is the top half of a float32: widening is exact bit placement.
    return bits_float(uint32_t(static_cast<const uint16_t*>(x)[i]) << 16);
  } else {
    return static_cast<const float*>(x)[i];
  }
}

template <int W>
__device__ __forceinline__ bool aligned(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & (W - 1)) == 0;
}

// Loads N consecutive elements starting at element index i (valid = how many
// are inside the tensor; the rest read as 0). Vector loads when possible; FULL:
// the caller guarantees valid == N and a 16-byte aligned start (no checks).
template <class In, int N, bool FULL = false>
__device__ __forceinline__ void load_n(const void* x, int64_t i, int valid, float (&v)[N]) {
  static_assert(!FULL || N % (16 / sizeof(In)) == 0);
  if constexpr (sizeof(In) == 2) {
    const uint16_t* s = static_cast<const uint16_t*>(x) + i;
    if constexpr (N % 8 == 0) {
      if (FULL || (valid == N && aligned<16>(s))) {
#pragma unroll
        for (int k = 0; k < N / 8; ++k) {
          const uint4 u = __ldg(reinterpret_cast<const uint4*>(s) + k);
          const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            v[8 * k + 2 * q] = bits_float(w[q] << 16);
            v[8 * k + 2 * q + 1] = bits_float(w[q] & 0xFFFF0000u);
          }
        }
        return;
      }
    }
    if constexpr (N == 4) {
      if (valid == 4 && aligned<8>(s)) {
        const uint2 u = __ldg(reinterpret_cast<const uint2*>(s));
        v[0] = bits_float(u.x << 16), v[1] = bits_float(u.x & 0xFFFF0000u);
        v[2] = bits_float(u.y << 16), v[3] = bits_float(u.y & 0xFFFF0000u);
        return;
      }
    }
    if constexpr (N == 2) {
      if (valid == 2 && aligned<4>(s)) {
        const uint32_t u = __ldg(reinterpret_cast<const unsigned int*>(s));
        v[0] = bits_float(u << 16), v[1] = bits_float(u & 0xFFFF0000u);
        return;
      }
    }
  } else {
    const float* s = static_cast<const float*>(x) + i;
    if constexpr (N % 4 == 0) {
      if (FULL || (valid == N && aligned<16>(s))) {
#pragma unroll
        for (int k = 0; k < N / 4; ++k) {
          const float4 u = __ldg(reinterpret_cast<const float4*>(s) + k);
          v[4 * k] = u.x, v[4 * k + 1] = u.y, v[4 * k + 2] = u.z, v[4 * k + 3] = u.w;
        }
        return;
      }
    }
    if constexpr (N == 2) {
      if (valid == 2 && aligned<8>(s)) {
        const float2 u = __ldg(reinterpret_cast<const float2*>(s));
        v[0] = u.x, v[1] = u.y;
        return;
      }
    }
  }
  if constexpr (!FULL) {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = j < valid ? load1<In>(x, i + j) : 0.0f;
  }
}

// Loads R rows of N consecutive elements, row rr from element index i0 + rr *
// stride (rows from rows_valid on, and elements from valid on, read as 0), as
// load_n does row by row, except that with N == 2 or 4 a whole strip (every
// row in range, one 4- or 8-byte load each from BF16, 8 or 16 from FP32) issues all R loads before
// it widens any of them. load_n's widening sits inside its per-row alignment
// branch, so a loop of load_n calls waited for each row's load before issuing
// the next one: the column kernels ran 16 memory latencies in a row per strip
// (ncu: a [16,1] amax pass from BF16 at IPC 1.2 and 36% of DRAM bandwidth,
// slower than the same pass from FP32).
// FLIP: row rr's values come out with their sign bits xor'ed with flip[rr] (0
// or 0x80000000), the RHT's exact d_i * v_i folded into the BF16 widening (one
// shift-and-add or mask-and-xor per value either way).
template <class In, int R, int N, bool FLIP = false>
__device__ __forceinline__ void load_rows(const void* x, int64_t i0, int64_t stride, int rows_valid, int valid,
                                          float (&v)[R][N], const uint32_t* flip = nullptr) {
  if constexpr (sizeof(In) == 2 && (N == 2 || N == 4)) {
    using Raw = std::conditional_t<N == 4, uint2, uint32_t>;
    const uint16_t* s = static_cast<const uint16_t*>(x) + i0;
    if (rows_valid >= R && valid == N && stride % N == 0 && aligned<sizeof(Raw)>(s)) {
      Raw raw[R];
#pragma unroll
      for (int rr = 0; rr < R; ++rr) raw[rr] = __ldg(reinterpret_cast<const Raw*>(s + rr * stride));
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        const uint32_t* w = reinterpret_cast<const uint32_t*>(&raw[rr]);
        const uint32_t m = FLIP ? flip[rr] : 0u;
#pragma unroll
        for (int q = 0; q < N / 2; ++q) {
          v[rr][2 * q] = bits_float((w[q] << 16) + m);  // + m: m's one bit, above the 16 zeros
          v[rr][2 * q + 1] = bits_float((w[q] & 0xFFFF0000u) ^ m);
        }
      }
      return;
    }
  }
  bool whole = false;
  if constexpr (sizeof(In) == 4 && (N == 2 || N == 4)) {
    // FP32 the same way: one alignment check for the strip, not one a row.
    using Raw = std::conditional_t<N == 4, float4, float2>;
    const float* s = static_cast<const float*>(x) + i0;
    whole = rows_valid >= R && valid == N && stride % N == 0 && aligned<sizeof(Raw)>(s);
    if (whole) {
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        const Raw u = __ldg(reinterpret_cast<const Raw*>(s + rr * stride));
        const float* f = reinterpret_cast<const float*>(&u);
#pragma unroll
        for (int j = 0; j < N; ++j) v[rr][j] = f[j];
      }
    }
  }
  if (!whole) {
#pragma unroll
    for (int rr = 0; rr < R; ++rr) load_n<In, N>(x, i0 + rr * stride, rr < rows_valid ? valid : 0, v[rr]);
  }
  if constexpr (FLIP) {  // after every row's load: a use between them serialises their latencies
#pragma unroll
    for (int rr = 0; rr < R; ++rr)
#pragma unroll
      for (int j = 0; j < N; ++j) v[rr][j] = bits_float(float_bits(v[rr][j]) ^ flip[rr]);
  }
}

// Stores N bytes (the first `valid` of them) at dst, vectorised when aligned.
template <int N>
__device__ __forceinline__ void store_bytes(uint8_t* dst, const uint32_t (&b)[N], int valid) {
  if (valid == N) {
    if constexpr (N % 4 == 0) {
      uint32_t w[N / 4];
#pragma unroll
      for (int k = 0; k < N / 4; ++k)
        w[k] = (b[4 * k] & 0xFFu) | (b[4 * k + 1] & 0xFFu) << 8 | (b[4 * k + 2] & 0xFFu) << 16 |
               (b[4 * k + 3] & 0xFFu) << 24;
      if constexpr (N == 16) {
        if (aligned<16>(dst)) {
          *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
          return;
        }
      }
      if constexpr (N % 8 == 0) {
        if (aligned<8>(dst)) {
#pragma unroll
          for (int k = 0; k < N / 8; ++k) reinterpret_cast<uint2*>(dst)[k] = make_uint2(w[2 * k], w[2 * k + 1]);
          return;
        }
      }
      if (aligned<4>(dst)) {
#pragma unroll
        for (int k = 0; k < N / 4; ++k) reinterpret_cast<uint32_t*>(dst)[k] = w[k];
        return;
      }
    }
    if constexpr (N == 2) {
      if (aligned<2>(dst)) {
        *reinterpret_cast<uint16_t*>(dst) = uint16_t((b[0] & 0xFFu) | (b[1] & 0xFFu) << 8);
        return;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j)
    if (j < valid) dst[j] = uint8_t(b[j]);
}

// Does p's tensor hold fewer than 2^31 elements (every FULL form's host
// condition, so that elem_index<true> and the strip indices fit 32 bits)?
inline bool index32_fits(const KParams& p) { return p.rows * p.cols < (int64_t(1) << 31); }

// Element index of (row r, column c0). FULL forms hold fewer than 2^31
// elements (index32_fits), so the index is formed in 32 bits, which
// the compiler strength-reduces across a kernel's unrolled rows (the 64-bit
// product cost ~10 integer instructions per row of a column strip).
template <bool FULL>
__device__ __forceinline__ int64_t elem_index(const KParams& p, int64_t r, int64_t c0) {
  if constexpr (FULL) return int64_t(uint32_t(r) * uint32_t(p.cols) + uint32_t(c0));
  return r * p.cols + c0;
}

// 4 codes in one word: PACKED4 nibbles (code 0 lowest), else bytes.
template <bool PACKED4>
__device__ __forceinline__ uint32_t pack_codes4(const uint32_t (&c)[4]) {
  if constexpr (PACKED4) return (c[0] & 0xFu) | (c[1] & 0xFu) << 4 | (c[2] & 0xFu) << 8 | (c[3] & 0xFu) << 12;
  return (c[0] & 0xFFu) | (c[1] & 0xFFu) << 8 | (c[2] & 0xFFu) << 16 | (c[3] & 0xFFu) << 24;
}

// Codes of N consecutive columns starting at column c0 of row r (c0 even for
// packed4), in the output's layout. FULL with N == 4 (the column and dual
// kernels' 4-column strips): valid == 4, cols even and the destination
// aligned (2 bytes packed, 4 bytes as bytes): one store, no checks.
template <int N, bool FULL = false>
__device__ __forceinline__ void store_codes(const KParams& p, int64_t r, int64_t c0, const uint32_t (&code)[N],
                                            int valid) {
  const QuantOutputs& o = p.out;
  if constexpr (FULL && N == 4) {
    const int64_t i = elem_index<true>(p, r, c0);
    if (o.code_layout == CodeLayout::packed4)
      *reinterpret_cast<uint16_t*>(o.codes + i / 2) = uint16_t(pack_codes4<true>(code));
    else
      *reinterpret_cast<uint32_t*>(o.codes + i) = pack_codes4<false>(code);
    return;
  }
  if (o.code_layout == CodeLayout::packed4) {
    constexpr int NB = (N + 1) / 2;
    uint32_t b[NB];
#pragma unroll
    for (int k = 0; k < NB; ++k) {
      const uint32_t lo = 2 * k < valid ? code[2 * k] & 0xFu : 0u;
      const uint32_t hi = (2 * k + 1 < N && 2 * k + 1 < valid) ? (code[2 * k + 1] & 0xFu) << 4 : 0u;
      b[k] = lo | hi;
    }
    store_bytes<NB>(o.codes + r * ((p.cols + 1) / 2) + c0 / 2, b, (valid + 1) / 2);
  } else {
    store_bytes<N>(o.codes + r * p.cols + c0, code, valid);
  }
}

// FULL (store_f32, store_bf16, store_outputs, encode_store_rn_fast): the
// caller guarantees valid == N and destinations aligned for their vector
// stores (16 bytes; 8 for 4 BF16 values or 16 FP4 codes, 4 for 2 BF16
// values): no checks.
template <int N, bool FULL = false>
__device__ __forceinline__ void store_f32(float* dst, const float (&v)[N], int valid) {
  static_assert(!FULL || N % 4 == 0);
  if constexpr (N % 4 == 0) {
    if (FULL || (valid == N && aligned<16>(dst))) {
#pragma unroll
      for (int k = 0; k < N / 4; ++k)
        reinterpret_cast<float4*>(dst)[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
      return;
    }
  }
  if constexpr (!FULL) {
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (j < valid) dst[j] = v[j];
  }
}
template <int N, bool FULL = false>
__device__ __forceinline__ void store_bf16(uint16_t* dst, const uint32_t (&h)[N], int valid) {
  static_assert(!FULL || N % 8 == 0 || N == 4 || N == 2);
  if constexpr (N % 8 == 0) {
    if (FULL || (valid == N && aligned<16>(dst))) {
#pragma unroll
      for (int k = 0; k < N / 8; ++k)
        reinterpret_cast<uint4*>(dst)[k] =
            make_uint4(h[8 * k] | h[8 * k + 1] << 16, h[8 * k + 2] | h[8 * k + 3] << 16,
                       h[8 * k + 4] | h[8 * k + 5] << 16, h[8 * k + 6] | h[8 * k + 7] << 16);
      return;
    }
  }
  if constexpr (N == 4) {
    if (FULL || (valid == 4 && aligned<8>(dst))) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
      return;
    }
  }
  if constexpr (N == 2) {
    if (FULL || (valid == 2 && aligned<4>(dst))) {
      *reinterpret_cast<uint32_t*>(dst) = h[0] | h[1] << 16;
      return;
    }
  }
  if constexpr (!FULL) {
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (j < valid) dst[j] = uint16_t(h[j]);
  }
}

template <int K, int N, int NB, bool FULL = false>
__device__ __forceinline__ void store_outputs(const KParams& p, const Format& f, const NvGlobal& g, int64_t r,
                                              int64_t c0, const uint32_t (&code)[N], const BlockParams (&bp)[NB],
                                              int valid, bool codes);

// The fast forms of a kernel (template argument): none (every mode), rn, rs
// (the row kernels' encode_store_rn / encode_store_rs_fast; encode_and_store's
// FM), rn_bf16 / rs_bf16 (rn / rs, E2M1 elements with UE4M3 or E8M0 scales
// (kinds 1, 2), rn_bf16 also E4M3 / E5M2 (kinds 3, 4, saturating), and the
// one element output is the BF16 GEMM operand: the trainer's;
// encode_and_store only). A kernel compiled for one fast form holds none of
// the other modes' code, so that its register count, and with it its
// occupancy, is its own.
enum class Fast { none, rn, rs, rn_bf16, rs_bf16, rn_bf16_div, rs_bf16_div };
// The value forms; _div: fp4-trainkit's nv_noglobal rule (x / scale; E2M1 with
// UE4M3 scales, kind 1), which the other fast forms exclude.
FP4LAB_HD constexpr bool value_form(Fast fm) {
  return fm == Fast::rn_bf16 || fm == Fast::rs_bf16 || fm == Fast::rn_bf16_div || fm == Fast::rs_bf16_div;
}
FP4LAB_HD constexpr bool value_form_sr(Fast fm) { return fm == Fast::rs_bf16 || fm == Fast::rs_bf16_div; }
FP4LAB_HD constexpr bool value_form_div(Fast fm) { return fm == Fast::rn_bf16_div || fm == Fast::rs_bf16_div; }

// Is p's one element output the BF16 GEMM operand (the condition of the
// _bf16 fast forms on the outputs)?
inline bool bf16_operand_only(const KParams& p) {
  const QuantOutputs& o = p.out;
  return o.dequant_bf16 && o.bf16_gemm_operand && !o.codes && !o.dequant;
}

// Encodes N consecutive elements of row r from column c0 with block parameters
// bp (one per element via bidx), writes every requested output. FM != none:
// the caller guarantees that mode (rn / rs, with a kind K != 0 and not the
// nv_noglobal rule; rs: N % 4 == 0, N <= 16 and (r * cols + c0) % 4 == 0), and
// only that mode's code is compiled. FULL: as store_outputs'.
template <int K, int N, int NB, Fast FM = Fast::none, bool FULL = false>
__device__ __forceinline__ void encode_and_store(const KParams& p, const Format& f, const NvGlobal& g, int64_t r,
                                                 int64_t c0, const float (&v)[N], const BlockParams (&bp)[NB],
                                                 int valid) {
  // Block of element j: bp[j * NB / N] (NB == 1: one block; NB == N: one per element).
  const int64_t base = elem_index<FULL>(p, r, c0);
  if constexpr (value_form(FM)) {
    // The BF16 operand straight from each element's rounded value (no code,
    // no decode: e2m1_rn_value_bits / e2m1_rs_value_bits, and for E4M3 / E5M2
    // (kinds 3, 4; rn, saturating) rn_sat_value_bits), in groups of G elements
    // (a Philox group with SR). A group holding a NaN product takes the code
    // path (E2M1 maps NaN to +6, whatever its sign). E2M1 values (at most 2
    // significant bits) times a UE4M3 or E8M0 scale are exact in BF16 wherever
    // the FP32 product is finite, so their operand is the product's top half,
    // which store_outputs' rounding gives; FP8 values (up to 4 significant
    // bits) times an E8M0 scale can fall below BF16's subnormal quantum: rounded.
    constexpr bool sr = value_form_sr(FM), div = value_form_div(FM);
    constexpr bool e2m1 = K == 1 || K == 2;
    static_assert(!div || K == 1);
    // SR with N == 2 (the [32,1] column kernels' 2-column strips): the run
    // starts on an even element index (the caller's fast_rs_applies: cols % 4
    // == 0, even c0), so it lies in one Philox group.
    constexpr int G = N < 4 ? N : 4;
    static_assert(K >= 1 && K <= 4 && N % G == 0 && (!sr || (e2m1 && (G == 4 || G == 2) && N <= 16)));
    auto operand_bits = [](float value, float scale) {
      return e2m1 ? float_bits(value * scale) >> 16 : to_bf16(value * scale);
    };
    uint32_t h[N];
#pragma unroll
    for (int q = 0; q < N / G; ++q) {
      Philox4 grp{};
      if constexpr (sr) grp = philox_group(p.seed, p.stream, uint64_t(base >> 2) + q);
      auto rbits = [&](int k) { return G == 4 ? grp.v[k] : pick(grp, uint32_t(base & 3) + uint32_t(k)); };
      uint32_t yb[G], amax = 0;
#pragma unroll
      for (int k = 0; k < G; ++k) {
        const float x = v[G * q + k], m = bp[(G * q + k) * NB / N].mult;
        yb[k] = float_bits(div ? x / m : x * m);
        amax = umax(amax, yb[k] & 0x7FFFFFFFu);
      }
      if (amax <= 0x7F800000u) {
#pragma unroll
        for (int k = 0; k < G; ++k) {
          uint32_t value;
          if constexpr (sr)
            value = e2m1_rs_value_bits(yb[k], rbits(k));
          else if constexpr (e2m1)
            value = e2m1_rn_value_bits(yb[k]);
          else
            value = rn_sat_value_bits<kind_format<K>()>(yb[k]);
          h[G * q + k] = operand_bits(bits_float(value), bp[(G * q + k) * NB / N].scale);
        }
      } else {
#pragma unroll
        for (int k = 0; k < G; ++k) {
          const float y = bits_float(yb[k]);
          const uint32_t code = sr ? encode_rs<K>(f, y, p.overflow, rbits(k)) : encode_rn<K>(f, y, p.overflow);
          h[G * q + k] = operand_bits(decode_elem<K>(f, code), bp[(G * q + k) * NB / N].scale);
        }
      }
    }
    store_bf16<N, FULL>(p.out.dequant_bf16 + base, h, valid);
    return;
  }
  uint32_t code[N];
  // One branch per thread, each mode's loop contiguous in the binary (an
  // element loop with the modes interleaved thrashed the instruction cache).
  static_assert(FM == Fast::none || value_form(FM) ||  // (returned above)
                (K != 0 && (FM == Fast::rn || (N % 4 == 0 && N <= 16))));
  // The rn and SR branches serve either rule: fp4-trainkit's nv_noglobal
  // (eq. 3) divides by the block scale (encode_element_rt), the others multiply.
  const bool div = FM == Fast::none && p.rule == ScaleRule::nv_noglobal;
  auto operand = [&](float x, float mult) { return div ? x / mult : x * mult; };
  if (FM == Fast::rn || (FM == Fast::none && K != 0 && p.round == Round::rn)) {
#pragma unroll
    for (int j = 0; j < N; ++j) code[j] = encode_rn<K>(f, operand(v[j], bp[j * NB / N].mult), p.overflow);
  } else if (FM == Fast::rs ||
             (FM == Fast::none && K != 0 && p.round == Round::rs && N % 4 == 0 && N <= 16 && (base & 3) == 0)) {
    // Up to 4 Philox groups unrolled (branch-free encode_rs_f32: about 1000
    // instructions), so that nothing is indexed at run time (local memory).
#pragma unroll
    for (int q = 0; q < N / 4; ++q) {
      const Philox4 grp = philox_group(p.seed, p.stream, uint64_t(base >> 2) + q);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        code[4 * q + k] = encode_rs<K>(f, operand(v[4 * q + k], bp[(4 * q + k) * NB / N].mult), p.overflow, grp.v[k]);
    }
  } else if (K != 0 && p.round == Round::rs && N < 4) {
    // Runs shorter than a Philox group (the [32,1] column kernels' 2-column
    // strips): the one or two groups the run touches, not one per element.
    const uint64_t g0 = uint64_t(base) >> 2;
    const Philox4 ga = philox_group(p.seed, p.stream, g0);
    Philox4 gb = ga;
    if (((uint64_t(base) + N - 1) >> 2) != g0) gb = philox_group(p.seed, p.stream, g0 + 1);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const uint64_t idx = uint64_t(base) + j;
      const uint32_t rb = pick((idx >> 2) == g0 ? ga : gb, uint32_t(idx & 3u));
      code[j] = encode_rs<K>(f, operand(v[j], bp[j * NB / N].mult), p.overflow, rb);
    }
  } else if (K != 0 && p.round == Round::rs && N % 4 == 0 && (base & 3) == 0) {
    // A rolled loop over Philox groups for longer runs: fully unrolled, the SR
    // path was too large for the instruction cache. vs/ms/cs are indexed at
    // run time (local memory).
    float vs[N], ms[N];
    uint32_t cs[N];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      vs[j] = v[j];
      ms[j] = bp[j * NB / N].mult;
    }
#pragma unroll 1
    for (int q = 0; q < N / 4; ++q) {
      const Philox4 grp = philox_group(p.seed, p.stream, uint64_t(base >> 2) + q);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        cs[4 * q + k] = encode_rs<K>(f, operand(vs[4 * q + k], ms[4 * q + k]), p.overflow, grp.v[k]);
    }
#pragma unroll
    for (int j = 0; j < N; ++j) code[j] = cs[j];
  } else {
    const bool sr = p.round == Round::rs;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const uint32_t rb = sr ? random_bits(p.seed, p.stream, uint64_t(base + j)) : 0u;
      code[j] = encode_element_rt(f, p.rule, p.round, p.overflow, v[j], bp[j * NB / N].mult, rb);
    }
  }
  // (A value form returned above; its FULL kernels may have N == 2, which
  // store_outputs' FULL stores do not take.)
  if constexpr (!value_form(FM)) store_outputs<K, N, NB, FULL>(p, f, g, r, c0, code, bp, valid, true);
}

// The FP32 dequantized values of N codes: (decode(code) * scale) * g_dec.
template <int K, int N, int NB>
__device__ __forceinline__ void dequant_f32(const Format& f, const NvGlobal& g, const uint32_t (&code)[N],
                                            const BlockParams (&bp)[NB], float (&d)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) d[j] = (decode_elem<K>(f, code[j]) * bp[j * NB / N].scale) * g.g_dec;
}
// The BF16 output bits of N codes (QuantOutputs::dequant_bf16).
template <int K, int N, int NB>
__device__ __forceinline__ void dequant_bf16(const QuantOutputs& o, const Format& f, const NvGlobal& g,
                                             const uint32_t (&code)[N], const BlockParams (&bp)[NB], uint32_t (&h)[N]) {
  if (K == 1 && o.bf16_gemm_operand) {
    // e2m1 x ue4m3 is exact in BF16 (<= 5 significant bits, 2^-10..2688),
    // and rounding an exactly representable value is truncation.
#pragma unroll
    for (int j = 0; j < N; ++j) h[j] = float_bits(decode_elem<K>(f, code[j]) * bp[j * NB / N].scale) >> 16;
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float d = decode_elem<K>(f, code[j]) * bp[j * NB / N].scale;
      h[j] = to_bf16(o.bf16_gemm_operand ? d : d * g.g_dec);
    }
  }
}

// Every requested output of N consecutive element codes of row r from column
// c0 (the codes themselves only if `codes`).
template <int K, int N, int NB, bool FULL>
__device__ __forceinline__ void store_outputs(const KParams& p, const Format& f, const NvGlobal& g, int64_t r,
                                              int64_t c0, const uint32_t (&code)[N], const BlockParams (&bp)[NB],
                                              int valid, bool codes) {
  const int64_t base = elem_index<FULL>(p, r, c0);
  const QuantOutputs& o = p.out;
  if (codes && o.codes) store_codes<N, FULL>(p, r, c0, code, valid);
  if (o.dequant) {
    float d[N];
    dequant_f32<K>(f, g, code, bp, d);
    store_f32<N, FULL>(o.dequant + base, d, valid);
  }
  if (o.dequant_bf16) {
    uint32_t h[N];
    dequant_bf16<K>(o, f, g, code, bp, h);
    store_bf16<N, FULL>(o.dequant_bf16 + base, h, valid);
  }
}

// Every requested output of a whole R-row strip of 4 columns from (r0, c0)
// (the FULL column kernels' rn form), output by output: each output's check
// once per strip, not once per row (ncu, the [16,1] rn kernel from BF16: ~13
// instructions a row of 4 elements went to re-testing the output pointers and
// the code layout). words[rr]: row rr's 4 codes (E2M1, < 16) as bytes,
// pack_codes4<false>'s (one register a row, not four).
template <int K, int R>
__device__ __forceinline__ void store_strip_full(const KParams& p, const Format& f, const NvGlobal& g, int64_t r0,
                                                 int64_t c0, const uint32_t (&words)[R], const BlockParams (&bp)[4]) {
  static_assert(K == 1 || K == 2);
  const QuantOutputs& o = p.out;
  // Row rr of an output at its strip's base plus rr times its row pitch, the
  // product in 32 bits (a whole tensor holds fewer than 2^31 elements): one
  // wide multiply-add a row, not a 64-bit index update.
  const uint32_t cols = uint32_t(p.cols);
  const size_t i0 = size_t(elem_index<true>(p, r0, c0));
  auto codes_of = [&](int rr, uint32_t(&c)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] = (words[rr] >> (8 * j)) & 0xFFu;
  };
  if (o.codes) {
    if (o.code_layout == CodeLayout::packed4) {
      uint8_t* base = o.codes + i0 / 2;
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        const uint32_t x = words[rr] | words[rr] >> 4;  // bytes 0 and 2: codes 0|1 and 2|3 as nibbles
        *reinterpret_cast<uint16_t*>(base + uint32_t(rr) * (cols / 2)) = uint16_t(__byte_perm(x, 0u, 0x0020));
      }
    } else {
      uint8_t* base = o.codes + i0;
#pragma unroll
      for (int rr = 0; rr < R; ++rr) *reinterpret_cast<uint32_t*>(base + uint32_t(rr) * cols) = words[rr];
    }
  }
  if (o.dequant) {
    float* base = o.dequant + i0;
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      uint32_t c[4];
      codes_of(rr, c);
      float d[4];
      dequant_f32<K>(f, g, c, bp, d);
      store_f32<4, true>(base + uint32_t(rr) * cols, d, 4);
    }
  }
  if (o.dequant_bf16) {
    uint16_t* base = o.dequant_bf16 + i0;
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      uint32_t c[4], h[4];
      codes_of(rr, c);
      dequant_bf16<K>(o, f, g, c, bp, h);
      store_bf16<4, true>(base + uint32_t(rr) * cols, h, 4);
    }
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

// Kinds with a fast rn path (encode_store_rn_fast): E2M1 (1, 2) under either
// policy (it always saturates), E4M3FN / E5M2 (3, 4) when saturating.
inline bool fast_rn_applies(int kind, const KParams& p) {
  return kind >= 1 && kind <= 4 && p.round == Round::rn && p.rule != ScaleRule::nv_noglobal &&
         (kind <= 2 || p.overflow == Overflow::saturate);
}
// Are the input and every requested output of p 16-byte aligned?
inline bool bases_aligned16(const KParams& p) {
  auto aligned16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  const QuantOutputs& o = p.out;
  return aligned16(p.x) && (!o.codes || aligned16(o.codes)) && (!o.dequant || aligned16(o.dequant)) &&
         (!o.dequant_bf16 || aligned16(o.dequant_bf16));
}

// May a fast-form kernel (Fast::rn / Fast::rs) whose threads each take `elems`
// consecutive elements of a row take its FULL form (no bounds or alignment
// checks, 32-bit indices)?
// Whole thread spans (cols % elems == 0, elems a multiple of 16: then every
// span of every output starts aligned for its vector stores given 16-byte
// aligned bases: 16 bytes, or 8 for the 8 bytes of 16 FP4 codes), aligned
// bases, fewer than 2^31 elements.
inline bool full_spans_apply(const KParams& p, int elems) {
  return elems % 16 == 0 && p.cols % elems == 0 && index32_fits(p) && bases_aligned16(p);
}

// p for a FULL kernel form of `units` work units, `per_row` of them per row
// (full_spans_apply() holds, so both fit in 31 bits).
inline KParams full_params(const KParams& p, int64_t units, int64_t per_row) {
  KParams f = p;
  f.units = uint32_t(units);
  f.unit_div = FastDivU31::of(uint32_t(per_row));
  return f;
}

// Per block: may encode_store_rn_fast take a block of amax bits `amax` and
// multiplier `mult`? Then no product x * mult is NaN: every x is finite and
// mult is finite.
__device__ __forceinline__ bool rn_fast_block(uint32_t amax, float mult) {
  return amax < 0x7F800000u && fabsf(mult) < inf_f();
}

// The top bytes of four floats (each its sign in bit 7) as the bytes of one
// word, a first in byte 0: three byte permutes instead of a shift and insert each.
__device__ __forceinline__ uint32_t top_bytes4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return __byte_perm(__byte_perm(a, b, 0x0073u), __byte_perm(c, d, 0x7300u), 0x7610u);
}

// The sign bits of 8 E2M1 codes packed as nibbles (element j in nibble j), from
// their products' float bits yb: bit 3 of each nibble. Even elements' top bytes
// -> bits 7, 15, 23, 31, shifted to their nibbles' bit 3; odd elements' land on
// bits 7, 15, 23, 31: their nibbles' bit 3.
__device__ __forceinline__ uint32_t e2m1_signs8(const uint32_t (&yb)[8]) {
  const uint32_t even = top_bytes4(yb[0], yb[2], yb[4], yb[6]);
  const uint32_t odd = top_bytes4(yb[1], yb[3], yb[5], yb[7]);
  return ((even >> 4) & 0x08080808u) | (odd & 0x80808080u);
}

// The E2M1 rn codes of v[j] * mult[j] (j < 4) as bytes (pack_codes4<false>'s
// layout), by encode_store_rn_fast's arithmetic: core's
// e2m1_rn_magnitude_biased summed into the word, the signs gathered by byte
// permutes. For blocks that rn_fast_block() admits (no product is NaN; an
// infinite one saturates as encode_rn_f32's does).
__device__ __forceinline__ uint32_t e2m1_rn_bytes4(const float (&v)[4], const float (&mult)[4]) {
  uint32_t w = 0u - kE2m1MagnitudeBase * 0x01010101u, yb[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float y = v[j] * mult[j];
    yb[j] = float_bits(y);
    w += e2m1_rn_magnitude_biased(fabsf(y)) << (8 * j);
  }
  // Each product's sign from bit 7 of byte j to bit 3 of it.
  return w | ((top_bytes4(yb[0], yb[1], yb[2], yb[3]) >> 4) & 0x08080808u);
}

// How kind K's codes pack into 32-bit words (K 1-4): FP4 8 nibbles a word,
// element 0 in the low nibble; FP8 4 bytes.
template <int K>
struct CodeWords {
  static_assert(K >= 1 && K <= 4);
  static constexpr bool fp4 = K == 1 || K == 2;
  static constexpr int per_word = fp4 ? 8 : 4, bits = 32 / per_word;
};

// The codes of N consecutive elements of row r from column c0, packed in
// words w as the output's layout has them (CodeWords), stored, then every other requested
// output (encode_store_rn_fast, encode_store_rs_fast).
template <int K, int N, bool FULL>
__device__ __forceinline__ void store_code_words(const KParams& p, const Format& f, const NvGlobal& g, int64_t r,
                                                 int64_t c0, const uint32_t (&w)[N / CodeWords<K>::per_word],
                                                 const BlockParams (&bp)[1], int valid) {
  constexpr bool fp4 = CodeWords<K>::fp4;
  constexpr int per_word = CodeWords<K>::per_word, bits = CodeWords<K>::bits;
  const QuantOutputs& o = p.out;
  const bool packed = fp4 && o.codes && o.code_layout == CodeLayout::packed4;
  const bool words = packed || (!fp4 && o.codes);  // the codes' layout is w's
  if (words) {
    constexpr int nbytes_full = fp4 ? N / 2 : N;
    uint8_t* dst = fp4 ? o.codes + r * ((p.cols + 1) / 2) + c0 / 2 : o.codes + r * p.cols + c0;
    if (nbytes_full % 16 == 0 && (FULL || (valid == N && aligned<16>(dst)))) {
#pragma unroll
      for (int k = 0; k < nbytes_full / 16; ++k)
        reinterpret_cast<uint4*>(dst)[k] = make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
    } else if (nbytes_full % 8 == 0 && (FULL || (valid == N && aligned<8>(dst)))) {
#pragma unroll
      for (int k = 0; k < nbytes_full / 8; ++k) reinterpret_cast<uint2*>(dst)[k] = make_uint2(w[2 * k], w[2 * k + 1]);
    } else if (valid == N && aligned<4>(dst)) {
#pragma unroll
      for (int k = 0; k < nbytes_full / 4; ++k) reinterpret_cast<uint32_t*>(dst)[k] = w[k];
    } else {
      const int nbytes = fp4 ? (valid + 1) / 2 : valid;  // elements past `valid` are zeros: code 0
#pragma unroll
      for (int b = 0; b < nbytes_full; ++b)
        if (b < nbytes) dst[b] = uint8_t(w[b / 4] >> (8 * (b % 4)));
    }
  }
  if (o.dequant || o.dequant_bf16 || (o.codes && !words)) {
    uint32_t code[N];
#pragma unroll
    for (int j = 0; j < N; ++j) code[j] = (w[j / per_word] >> (bits * (j % per_word))) & ((1u << bits) - 1u);
    store_outputs<K, N, 1, FULL>(p, f, g, r, c0, code, bp, valid, !words);
  }
}

// rn codes of one row block (multiplier bp.mult) of a fast_rn_applies() kind,
// straight into packed words, then every requested output. Per element: the
// magnitude code by core's float-rounding forms (e2m1_rn_magnitude_biased for
// E2M1: three float roundings and two integer minimums; rn_magnitude_code for
// FP8, clamped to the largest finite code: saturation), added into the word by
// integer multiply-adds (the FMA pipe: the integer ALU pipe is what bounds
// these kernels); the sign bits of a word at once by byte permutes. Equal to
// encode_rn_f32<F>() of x * mult for non-NaN products (rn_fast_block()).
template <int K, int N, bool FULL = false>
__device__ __forceinline__ void encode_store_rn_fast(const KParams& p, const Format& f, const NvGlobal& g, int64_t r,
                                                     int64_t c0, const float (&v)[N], const BlockParams (&bp)[1],
                                                     int valid) {
  constexpr bool fp4 = CodeWords<K>::fp4;
  constexpr int per_word = CodeWords<K>::per_word, bits = CodeWords<K>::bits;
  static_assert(K >= 1 && K <= 4 && N % per_word == 0);
  // E2M1: the words start at minus kE2m1MagnitudeBase in every nibble.
  constexpr uint32_t init = fp4 ? 0u - kE2m1MagnitudeBase * 0x11111111u : 0u;
  constexpr Format F = kind_format<K>();
  uint32_t w[N / per_word];
#pragma unroll
  for (int q = 0; q < N / per_word; ++q) {
    uint32_t yb[per_word];  // float bits of the products
    w[q] = init;
#pragma unroll
    for (int k = 0; k < per_word; ++k) {
      const float y = v[per_word * q + k] * bp[0].mult;
      yb[k] = float_bits(y);
      uint32_t mag;
      if constexpr (fp4) {
        mag = e2m1_rn_magnitude_biased(fabsf(y));
      } else {
        mag = umin(rn_magnitude_code<kind_format<K>()>(yb[k] & 0x7FFFFFFFu), F.max_magnitude_code());
      }
      w[q] += mag * (1u << (bits * k));
    }
    // The sign bits, gathered with byte permutes (each float's top byte holds
    // its sign in bit 7) instead of one shift and insert per element.
    if constexpr (fp4) {
      w[q] |= e2m1_signs8(yb);
    } else {
      w[q] |= top_bytes4(yb[0], yb[1], yb[2], yb[3]) & 0x80808080u;
    }
  }
  store_code_words<K, N, FULL>(p, f, g, r, c0, w, bp, valid);
}

// The rn codes and outputs of one block of a fast_rn_applies() kind (amax:
// the block's amax bits): encode_store_rn_fast, or for a block with NaN or Inf
// (or a non-finite multiplier) core's encode_rn_f32 per element.
template <int K, int N, bool FULL = false>
__device__ __forceinline__ void encode_store_rn(const KParams& p, const Format& f, const NvGlobal& g, int64_t r,
                                                int64_t c0, const float (&v)[N], const BlockParams (&bp)[1], int valid,
                                                uint32_t amax) {
  if (rn_fast_block(amax, bp[0].mult)) return encode_store_rn_fast<K, N, FULL>(p, f, g, r, c0, v, bp, valid);
  uint32_t code[N];
#pragma unroll
  for (int j = 0; j < N; ++j) code[j] = encode_rn<K>(f, v[j] * bp[0].mult, p.overflow);
  store_outputs<K, N, 1>(p, f, g, r, c0, code, bp, valid, true);
}

// Kinds with a fast SR path (encode_store_rs_fast): 1-4 under rs (not the
// nv_noglobal rule, which divides), on rows whose element indices keep the
// 4-element Philox groups aligned (cols % 4 == 0).
inline bool fast_rs_applies(int kind, const KParams& p) {
  return kind >= 1 && kind <= 4 && p.round == Round::rs && p.rule != ScaleRule::nv_noglobal && p.cols % 4 == 0;
}

// SR codes of one row block (multiplier bp.mult, amax bits amax) of a
// fast_rs_applies() kind: one Philox group per 4 elements (core's philox_group
// of element index / 4, word index % 4: random_bits()), the codes added into
// packed words, then every requested output. E2M1 blocks that rn_fast_block()
// admits (no NaN product) take core's e2m1_rs_magnitude capped at 7, the
// signs gathered by byte permutes (encode_store_rn_fast's way): no per-element
// NaN select or sign shift (the integer ALU pipe bounds these kernels); other
// blocks and kinds core's encode_rs_f32 per element.
template <int K, int N, bool FULL = false>
__device__ __forceinline__ void encode_store_rs_fast(const KParams& p, const Format& f, const NvGlobal& g, int64_t r,
                                                     int64_t c0, const float (&v)[N], const BlockParams (&bp)[1],
                                                     int valid, uint32_t amax) {
  constexpr bool fp4 = CodeWords<K>::fp4;
  constexpr int per_word = CodeWords<K>::per_word, bits = CodeWords<K>::bits;
  static_assert(N % per_word == 0 && N % 4 == 0);
  const uint64_t group0 = uint64_t(elem_index<FULL>(p, r, c0)) >> 2;  // (r * cols + c0) % 4 == 0
  uint32_t w[N / per_word];
#pragma unroll
  for (int k = 0; k < N / per_word; ++k) w[k] = 0;
  if constexpr (fp4) {
    if (rn_fast_block(amax, bp[0].mult)) {
#pragma unroll
      for (int q = 0; q < N / 8; ++q) {
        uint32_t yb[8];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const Philox4 grp = philox_group(p.seed, p.stream, group0 + 2 * q + h);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float y = v[8 * q + 4 * h + k] * bp[0].mult;
            yb[4 * h + k] = float_bits(y);
            w[q] += umin(e2m1_rs_magnitude(yb[4 * h + k], grp.v[k]), 7u) * (1u << (4 * (4 * h + k)));
          }
        }
        w[q] |= e2m1_signs8(yb);
      }
      return store_code_words<K, N, FULL>(p, f, g, r, c0, w, bp, valid);
    }
  }
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const Philox4 grp = philox_group(p.seed, p.stream, group0 + q);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int j = 4 * q + k;
      const uint32_t code = encode_rs<K>(f, v[j] * bp[0].mult, p.overflow, grp.v[k]);
      w[j / per_word] += code * (1u << (bits * (j % per_word)));
    }
  }
  store_code_words<K, N, FULL>(p, f, g, r, c0, w, bp, valid);
}

// The strip (i, jg) of thread t in a grid of nstrips x ngroups strips, row
// major (quantize_cols.cu, quantize_dual.cu); (0, 0) when t is past the end
// (ok = false). A 32-bit division where the thread count allows.
__device__ __forceinline__ bool strip_of(int64_t t, int64_t nstrips, int64_t ngroups, int64_t& i, int64_t& jg) {
  const bool ok = t < nstrips * ngroups;
  i = 0;
  jg = 0;
  if (ok) {
    if (nstrips * ngroups < (int64_t(1) << 32)) {
      i = uint32_t(t) / uint32_t(ngroups);
    } else {
      i = t / ngroups;
    }
    jg = t - i * ngroups;
  }
  return ok;
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

// How many blocks of kThreads threads (no dynamic shared memory) of `kernel`
// the GPU holds at once: SMs x resident blocks per SM (0 if it cannot run),
// the size of a cooperative or persistent grid. Callers keep it (static).
template <class Kernel>
int64_t resident_blocks(Kernel kernel) {
  int dev = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  return int64_t(sms) * per_sm;
}

// Lets Kernel take `bytes` (> 48 KB) of dynamic shared memory: the attribute
// is set on the first call only (it applies to every later launch).
template <auto Kernel>
void allow_dynamic_smem(size_t bytes, const char* what) {
  static const cudaError_t e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  check(e, what);
}

// Launchers (quantize_rows.cu, quantize_cols.cu): row blocks [1,BC] with one
// thread per block; column blocks [BR,1] with one thread per BR x V strip.
// amax_only: only atomicMax the (RHT-transformed) tensor amax into *p.gamax.
void launch_rows(const KParams& p, int bc, bool rht, int kind, InputType in, bool amax_only, cudaStream_t st);
void launch_cols(const KParams& p, int br, bool rht, int kind, InputType in, bool amax_only, cudaStream_t st);
// quantize_dual.cu: pr ([1,16] blocks) and pc ([16,1] blocks, RHT when rht)
// of the same input in one pass; amax_only: both tensor amaxes (pc's of the
// RHT output) into pr.gamax / pc.gamax, finished by pr.fin / pc.fin.
void launch_dual(const KParams& pr, const KParams& pc, bool rht, InputType in, bool amax_only, cudaStream_t st);

}  // namespace fp4lab::cuda::qk
