// GPU block quantization (quantize.hpp). Every numeric step calls the same
// FP4LAB_HD functions as sim/quantizer.cpp: core's encode()/encode_rn_f32()/
// decode()/random_bits(), sim/scale_rules.hpp and sim/rht.hpp's sign rule.
// Built with --fmad=false so no FP32 sequence is contracted into an FMA.
#include "cuda/quantize.hpp"

#include <algorithm>
#include <array>
#include <string>

#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/philox.hpp"
#include "sim/quantizer_internal.hpp"
#include "sim/rht.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab::cuda {
namespace {

constexpr int kThreads = 256;

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
  float signs[16];        // RHT signs (sim/rht.hpp rht_sign)
  uint32_t* gamax;        // tensor amax bits (read by nv+global; written by amax passes)
  uint32_t* block_amax;   // generic path [nbr*nbc]
  float* block_mult;      // generic path
  float* block_scale;     // generic path
  QuantOutputs out;
};

// ---- element format: compile-time for the hot ones, else the runtime value --
// EID 0 = runtime (p.elem), 1 = e2m1, 2 = e4m3fn, 3 = e5m2.
template <int EID>
__device__ __forceinline__ Format elem_format(const KParams& p) {
  if constexpr (EID == 1) {
    constexpr Format f = float4_e2m1fn;
    return f;
  } else if constexpr (EID == 2) {
    constexpr Format f = float8_e4m3fn;
    return f;
  } else if constexpr (EID == 3) {
    constexpr Format f = float8_e5m2;
    return f;
  } else {
    return p.elem;
  }
}

template <int EID>
__device__ __forceinline__ uint32_t encode_rn(const Format& f, float y, Overflow o) {
  if constexpr (EID == 1) {
    return encode_rn_f32<float4_e2m1fn>(y, o);
  } else if constexpr (EID == 2) {
    return encode_rn_f32<float8_e4m3fn>(y, o);
  } else if constexpr (EID == 3) {
    return encode_rn_f32<float8_e5m2>(y, o);
  } else {
    return encode(f, y, Round::rn, o);
  }
}

// ---- block parameters: compute_block_scales() of sim, per block ------------
struct BlockParams {
  uint32_t code = 0;  // scale-format code (unused for float32 scales)
  float scale = 0;    // decoded scale
  float mult = 0;     // element operand: x * mult, or x / mult when divide
};

__device__ __forceinline__ NvGlobal nv_global_of(const KParams& p) {
  const float elem_max = max_finite(p.elem);
  if (p.rule == ScaleRule::nv && p.global) return nv_global(bits_float(*p.gamax), max_finite(p.sfmt), elem_max);
  return nv_no_global(elem_max);
}

__device__ __noinline__ BlockParams block_params_rt(const Format elem, const Format sfmt, ScaleRule rule, uint32_t amax,
                                                   const NvGlobal g) {
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

__device__ __forceinline__ BlockParams block_params(const KParams& p, uint32_t amax, const NvGlobal& g) {
  return block_params_rt(p.elem, p.sfmt, p.rule, amax, g);
}

// Element code of x in a block with multiplier `mult` (sim's row_generic /
// row_rn_fast). The runtime-format and rarely used modes go through one
// out-of-line function (compile time: encode() is large once inlined 8x).
__device__ __noinline__ uint32_t encode_element_rt(const Format f, ScaleRule rule, Round round, Overflow overflow,
                                                   float x, float mult, uint32_t rbits) {
  const bool pow2 = rule == ScaleRule::ocp || rule == ScaleRule::ceil || rule == ScaleRule::tetrajet;
  if (pow2 && (round == Round::rp || round == Round::rm)) {
    // sim: the exact float64 product, so directed rounding below FP32's normal
    // range sees the true value.
    return encode(f, double(x) * double(mult), round, overflow, rbits);
  }
  const float y = rule == ScaleRule::nv_noglobal ? x / mult : x * mult;
  return encode(f, y, round, overflow, rbits);
}

template <int EID>
__device__ __forceinline__ uint32_t encode_element(const KParams& p, const Format& f, float x, float mult,
                                                   uint32_t rbits) {
  if constexpr (EID != 0) {
    if (p.round == Round::rn || p.round == Round::rs) {
      const float y = p.rule == ScaleRule::nv_noglobal ? x / mult : x * mult;
      if (p.round == Round::rn) return encode_rn<EID>(f, y, p.overflow);
      return encode(f, y, Round::rs, p.overflow, rbits);
    }
  }
  return encode_element_rt(f, p.rule, p.round, p.overflow, x, mult, rbits);
}

__device__ __forceinline__ uint32_t pick(const Philox4& g, uint32_t k) {
  return k == 0 ? g.v[0] : k == 1 ? g.v[1] : k == 2 ? g.v[2] : g.v[3];
}

__device__ __forceinline__ uint16_t to_bf16(float v) { return uint16_t(encode_rn_f32<bfloat16>(v, Overflow::nonsaturate)); }

template <class In>
__device__ __forceinline__ float load1(const void* x, int64_t i) {
  if constexpr (sizeof(In) == 2) {
    // bfloat16 is the top half of a float32: widening is exact bit placement.
    return bits_float(uint32_t(static_cast<const uint16_t*>(x)[i]) << 16);
  } else {
    return static_cast<const float*>(x)[i];
  }
}

// Loads the 8 elements (r, c0..c0+7); zero where outside the tensor.
template <class In>
__device__ __forceinline__ void load8(const KParams& p, int64_t r, int64_t c0, bool row_ok, float (&v)[8]) {
  const int64_t base = r * p.cols + c0;
  const bool full = row_ok && c0 + 8 <= p.cols;
  if constexpr (sizeof(In) == 2) {
    if (full && (p.cols & 7) == 0) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.x) + base));
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        v[2 * k] = bits_float(w[k] << 16);
        v[2 * k + 1] = bits_float(w[k] & 0xFFFF0000u);
      }
      return;
    }
  } else {
    if (full && (p.cols & 3) == 0) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + base));
      const float4 b = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + base + 4));
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = (row_ok && c0 + j < p.cols) ? load1<In>(p.x, base + j) : 0.0f;
}

// ---- fused kernel ------------------------------------------------------------
// A warp covers LR rows x (8 * LC) columns; each lane 8 consecutive elements of
// one row (lane = row_in_tile * LC + chunk).
enum class Shape : uint8_t { r16, r32, t16, c16, c32 };
template <Shape S>
struct Geo;
template <>
struct Geo<Shape::r16> {
  static constexpr int LR = 1, LC = 32, BR = 1, BC = 16;
};
template <>
struct Geo<Shape::r32> {
  static constexpr int LR = 1, LC = 32, BR = 1, BC = 32;
};
template <>
struct Geo<Shape::t16> {
  static constexpr int LR = 16, LC = 2, BR = 16, BC = 16;
};
template <>
struct Geo<Shape::c16> {
  static constexpr int LR = 16, LC = 2, BR = 16, BC = 1;
};
template <>
struct Geo<Shape::c32> {
  static constexpr int LR = 32, LC = 1, BR = 32, BC = 1;
};

__device__ __forceinline__ uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

// Forward RHT of the 16-element chunks held by the warp (sim/rht.hpp order:
// signs, butterflies h = 1, 2, 4, 8, then * 0.25f).
template <Shape S>
__device__ __forceinline__ void rht_forward_warp(const KParams& p, int lane, int64_t c0, float (&v)[8]) {
  if constexpr (S == Shape::r16) {
    // A chunk is two lanes (lane ^ 1): positions 0..7 in the even one.
    const int pos0 = int(c0 & 8);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] * p.signs[pos0 + j];
#pragma unroll
    for (int h = 1; h < 8; h <<= 1) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (i & h) continue;
        const float a = v[i], b = v[i + h];
        v[i] = a + b;
        v[i + h] = a - b;
      }
    }
    const bool upper = pos0 != 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, v[j], 1);
      v[j] = upper ? other - v[j] : v[j] + other;
    }
  } else {
    static_assert(S == Shape::c16);
    // A chunk is one column of the warp's 16 rows; position = row in tile.
    constexpr int LC = Geo<S>::LC;
    const int pos = lane / LC;
    const float sgn = p.signs[pos];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] * sgn;
#pragma unroll
    for (int h = 1; h < 16; h <<= 1) {
      const bool upper = (pos & h) != 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float other = __shfl_xor_sync(0xFFFFFFFFu, v[j], h * LC);
        v[j] = upper ? other - v[j] : v[j] + other;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = v[j] * 0.25f;
}

template <class In, Shape S, int EID, bool RHT, bool AMAX_ONLY>
__global__ void __launch_bounds__(kThreads) fused_kernel(const KParams p) {
  using G = Geo<S>;
  constexpr int LR = G::LR, LC = G::LC, BR = G::BR, BC = G::BC;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int64_t tiles_c = (p.cols + 8 * LC - 1) / (8 * LC);
  const int64_t tr = warp / tiles_c, tc = warp - tr * tiles_c;
  if (tr * LR >= p.rows) return;  // warp-uniform
  const int64_t r = tr * LR + lane / LC;
  const int64_t c0 = (tc * LC + lane % LC) * 8;
  const bool row_ok = r < p.rows;

  float v[8];
  load8<In>(p, r, c0, row_ok, v);
  if constexpr (RHT) rht_forward_warp<S>(p, lane, c0, v);

  uint32_t a[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) a[j] = abs_bits(v[j]);  // 0 outside the tensor

  if constexpr (AMAX_ONLY) {
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) m = umax(m, a[j]);
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    if (lane == 0 && m != 0) atomicMax(p.gamax, m);
    return;
  } else {
    const Format f = elem_format<EID>(p);
    const NvGlobal g = nv_global_of(p);
    if (p.out.global_decode && blockIdx.x == 0 && threadIdx.x == 0) *p.out.global_decode = g.g_dec;
    constexpr bool col_blocks = BC == 1;

    // Block amax and parameters.
    BlockParams bp[col_blocks ? 8 : 1];
    if constexpr (!col_blocks) {
      uint32_t m = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) m = umax(m, a[j]);
      constexpr int lanes = (BR * BC) / 8;  // lanes sharing a block (2, 4 or 32)
#pragma unroll
      for (int off = 1; off < lanes; off <<= 1) m = umax(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
      bp[0] = block_params(p, m, g);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t m = a[j];
#pragma unroll
        for (int off = LC; off < 32; off <<= 1) m = umax(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
        bp[j] = block_params(p, m, g);
      }
    }

    // Scales: one writer per block.
    if (p.out.scale_codes || p.out.scales) {
      if constexpr (!col_blocks) {
        constexpr int lanes_per_block_row = BC / 8;
        const bool writer = (S == Shape::t16) ? lane == 0 : (lane % lanes_per_block_row) == 0;
        if (writer && row_ok && c0 < p.cols) {
          const int64_t si = (r / BR) * p.nbc + c0 / BC;
          if (p.out.scale_codes) p.out.scale_codes[si] = uint8_t(bp[0].code);
          if (p.out.scales) p.out.scales[si] = bp[0].scale;
        }
      } else {
        if (lane / LC == 0) {
          const int64_t si = tr * p.nbc + c0;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            if (c0 + j < p.cols) {
              if (p.out.scale_codes) p.out.scale_codes[si + j] = uint8_t(bp[j].code);
              if (p.out.scales) p.out.scales[si + j] = bp[j].scale;
            }
          }
        }
      }
    }
    if (!row_ok || c0 >= p.cols) return;  // no more shuffles below

    // Elements.
    const int64_t base = r * p.cols + c0;
    uint32_t code[8];
    float dq[8];
    const bool sr = p.round == Round::rs;
    Philox4 grp{};
    uint64_t gid = ~uint64_t(0);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const BlockParams& b = bp[col_blocks ? j : 0];
      uint32_t rbits = 0;
      if (sr) {
        const uint64_t idx = uint64_t(base + j);
        if ((idx >> 2) != gid) {
          gid = idx >> 2;
          grp = philox_group(p.seed, p.stream, gid);
        }
        rbits = pick(grp, uint32_t(idx & 3u));
      }
      code[j] = encode_element<EID>(p, f, v[j], b.mult, rbits);
      dq[j] = decode(f, code[j]) * b.scale;  // times g_dec below
    }
    const bool full = c0 + 8 <= p.cols;
    const QuantOutputs& o = p.out;
    if (o.codes) {
      if (o.code_layout == CodeLayout::packed4) {
        const int64_t pstride = (p.cols + 1) / 2;
        uint8_t* dst = o.codes + r * pstride + c0 / 2;
        if (full && (pstride & 3) == 0) {
          uint32_t w = 0;
#pragma unroll
          for (int j = 0; j < 8; ++j) w |= (code[j] & 0xFu) << (4 * j);
          *reinterpret_cast<uint32_t*>(dst) = w;
        } else {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            if (c0 + 2 * k < p.cols) {
              const uint32_t hi = c0 + 2 * k + 1 < p.cols ? (code[2 * k + 1] & 0xFu) << 4 : 0u;
              dst[k] = uint8_t((code[2 * k] & 0xFu) | hi);
            }
          }
        }
      } else {
        uint8_t* dst = o.codes + base;
        if (full && (p.cols & 7) == 0) {
          uint2 w;
          w.x = code[0] | code[1] << 8 | code[2] << 16 | code[3] << 24;
          w.y = code[4] | code[5] << 8 | code[6] << 16 | code[7] << 24;
          *reinterpret_cast<uint2*>(dst) = w;
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j)
            if (c0 + j < p.cols) dst[j] = uint8_t(code[j]);
        }
      }
    }
    if (o.dequant) {
      float d[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) d[j] = dq[j] * g.g_dec;
      float* dst = o.dequant + base;
      if (full && (p.cols & 3) == 0) {
        reinterpret_cast<float4*>(dst)[0] = make_float4(d[0], d[1], d[2], d[3]);
        reinterpret_cast<float4*>(dst)[1] = make_float4(d[4], d[5], d[6], d[7]);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (c0 + j < p.cols) dst[j] = d[j];
      }
    }
    if (o.dequant_bf16) {
      uint32_t h[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) h[j] = to_bf16(o.bf16_gemm_operand ? dq[j] : dq[j] * g.g_dec);
      uint16_t* dst = o.dequant_bf16 + base;
      if (full && (p.cols & 7) == 0) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16,
                                                    h[6] | h[7] << 16);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (c0 + j < p.cols) dst[j] = uint16_t(h[j]);
      }
    }
  }
}

// ---- tensor amax ---------------------------------------------------------------
template <class In>
__global__ void __launch_bounds__(kThreads) amax_kernel(const void* x, int64_t n, uint32_t* out) {
  uint32_t m = 0;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if constexpr (sizeof(In) == 2) {
    const int64_t nv = n / 8;  // 16-byte vectors
    const uint4* xv = static_cast<const uint4*>(x);
    for (int64_t k = i; k < nv; k += stride) {
      const uint4 u = __ldg(xv + k);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) m = umax(m, umax((w[q] << 16) & 0x7FFF0000u, w[q] & 0x7FFF0000u));
    }
    for (int64_t k = nv * 8 + i; k < n; k += stride) m = umax(m, abs_bits(load1<In>(x, k)));
  } else {
    const int64_t nv = n / 4;
    const float4* xv = static_cast<const float4*>(x);
    for (int64_t k = i; k < nv; k += stride) {
      const float4 u = __ldg(xv + k);
      m = umax(m, umax(umax(abs_bits(u.x), abs_bits(u.y)), umax(abs_bits(u.z), abs_bits(u.w))));
    }
    for (int64_t k = nv * 4 + i; k < n; k += stride) m = umax(m, abs_bits(load1<In>(x, k)));
  }
  m = __reduce_max_sync(0xFFFFFFFFu, m);
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(out, m);
}

// ---- generic path ---------------------------------------------------------------
// 1. block amax (and the tensor amax in *gamax) for any block shape.
template <class In>
__global__ void __launch_bounds__(kThreads) generic_amax_kernel(const KParams p) {
  const int64_t n = p.rows * p.cols;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i0 = int64_t(blockIdx.x) * kThreads; i0 < n; i0 += stride) {  // block-uniform loop
    const int64_t i = i0 + threadIdx.x;
    const bool ok = i < n;
    const int64_t r = ok ? i / p.cols : 0, c = ok ? i - r * p.cols : 0;
    const long long bid = ok ? (long long)((r / p.br) * p.nbc + c / p.bc) : -1;
    const uint32_t a = ok ? abs_bits(load1<In>(p.x, i)) : 0u;
    const unsigned group = __match_any_sync(0xFFFFFFFFu, bid);
    const uint32_t m = __reduce_max_sync(group, a);
    const int leader = __ffs(group) - 1;
    if (ok && (threadIdx.x & 31) == leader && m != 0) {
      atomicMax(p.block_amax + bid, m);
      atomicMax(p.gamax, m);
    }
  }
}

// 2. per-block parameters.
__global__ void __launch_bounds__(kThreads) generic_scale_kernel(const KParams p, int64_t nblocks) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const NvGlobal g = nv_global_of(p);
  if (i == 0 && p.out.global_decode) *p.out.global_decode = g.g_dec;
  if (i >= nblocks) return;
  const BlockParams b = block_params(p, p.block_amax[i], g);
  p.block_mult[i] = b.mult;
  p.block_scale[i] = b.scale;
  if (p.out.scale_codes) p.out.scale_codes[i] = uint8_t(b.code);
  if (p.out.scales) p.out.scales[i] = b.scale;
}

// 3. elements: one thread per pair of columns (c = 2k, 2k + 1) of a row.
template <class In>
__global__ void __launch_bounds__(kThreads) generic_element_kernel(const KParams p) {
  const int64_t pairs = (p.cols + 1) / 2;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= p.rows * pairs) return;
  const int64_t r = t / pairs, c0 = (t - r * pairs) * 2;
  const NvGlobal g = nv_global_of(p);
  const QuantOutputs& o = p.out;
  uint32_t codes[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const int64_t c = c0 + k;
    if (c >= p.cols) break;
    const int64_t i = r * p.cols + c;
    const int64_t bid = (r / p.br) * p.nbc + c / p.bc;
    const float x = load1<In>(p.x, i);
    const uint32_t rbits = p.round == Round::rs ? random_bits(p.seed, p.stream, uint64_t(i)) : 0u;
    const uint32_t code = encode_element<0>(p, p.elem, x, p.block_mult[bid], rbits);
    codes[k] = code;
    const float d = decode(p.elem, code) * p.block_scale[bid];
    if (o.codes && o.code_layout == CodeLayout::bytes) o.codes[i] = uint8_t(code);
    if (o.dequant) o.dequant[i] = d * g.g_dec;
    if (o.dequant_bf16) o.dequant_bf16[i] = to_bf16(o.bf16_gemm_operand ? d : d * g.g_dec);
  }
  if (o.codes && o.code_layout == CodeLayout::packed4)
    o.codes[r * pairs + c0 / 2] = uint8_t((codes[0] & 0xFu) | ((codes[1] & 0xFu) << 4));
}

// ---- host side ----------------------------------------------------------------
int elem_id(const Format* f) {
  if (f == &float4_e2m1fn) return 1;
  if (f == &float8_e4m3fn) return 2;
  if (f == &float8_e5m2) return 3;
  return 0;
}

bool shape_of(const QuantizerSpec& q, Shape& s) {
  const int br = q.block_rows, bc = q.block_cols;
  if (br == 1 && bc == 16) s = Shape::r16;
  else if (br == 1 && bc == 32) s = Shape::r32;
  else if (br == 16 && bc == 16) s = Shape::t16;
  else if (br == 16 && bc == 1) s = Shape::c16;
  else if (br == 32 && bc == 1) s = Shape::c32;
  else return false;
  return true;
}

template <class In, Shape S, int EID, bool RHT, bool AMAX>
void launch_fused(const KParams& p, cudaStream_t st) {
  using G = Geo<S>;
  const int64_t tiles = ((p.rows + G::LR - 1) / G::LR) * ((p.cols + 8 * G::LC - 1) / (8 * G::LC));
  const int64_t blocks = (tiles * 32 + kThreads - 1) / kThreads;
  if (blocks > 0) fused_kernel<In, S, EID, RHT, AMAX><<<unsigned(blocks), kThreads, 0, st>>>(p);
  check_launch("fused_kernel");
}

// Instantiated element ids: e2m1 on every shape, e4m3/e5m2 on [1,32] and [32,1]
// (MXFP8), the runtime format everywhere else.
template <class In, Shape S, bool RHT>
void dispatch_eid(const KParams& p, int eid, cudaStream_t st) {
  if (eid == 1) return launch_fused<In, S, 1, RHT, false>(p, st);
  if constexpr (S == Shape::r32 || S == Shape::c32) {
    if (eid == 2) return launch_fused<In, S, 2, RHT, false>(p, st);
    if (eid == 3) return launch_fused<In, S, 3, RHT, false>(p, st);
  }
  launch_fused<In, S, 0, RHT, false>(p, st);
}

template <class In>
void run_fused(const KParams& p, Shape s, bool rht, int eid, cudaStream_t st) {
  switch (s) {
    case Shape::r16:
      if (rht) return dispatch_eid<In, Shape::r16, true>(p, eid, st);
      return dispatch_eid<In, Shape::r16, false>(p, eid, st);
    case Shape::r32: return dispatch_eid<In, Shape::r32, false>(p, eid, st);
    case Shape::t16: return dispatch_eid<In, Shape::t16, false>(p, eid, st);
    case Shape::c16:
      if (rht) return dispatch_eid<In, Shape::c16, true>(p, eid, st);
      return dispatch_eid<In, Shape::c16, false>(p, eid, st);
    case Shape::c32: return dispatch_eid<In, Shape::c32, false>(p, eid, st);
  }
}

template <class In>
void run_rht_amax(const KParams& p, Shape s, cudaStream_t st) {
  if (s == Shape::r16) return launch_fused<In, Shape::r16, 0, true, true>(p, st);
  launch_fused<In, Shape::c16, 0, true, true>(p, st);
}

unsigned grid_for(int64_t work, int64_t per_block = kThreads) {
  const int64_t b = (work + per_block - 1) / per_block;
  return unsigned(std::clamp<int64_t>(b, 1, 1 << 20));
}

}  // namespace

void scale_grid(const QuantizerSpec& q, int64_t rows, int64_t cols, int64_t& scale_rows, int64_t& scale_cols) {
  const BlockGrid g = block_grid(q, rows, cols);
  scale_rows = g.nbr;
  scale_cols = g.nbc;
}

bool fused_supported(const QuantizerSpec& q) {
  Shape s;
  if (!shape_of(q, s)) return false;
  return !q.rht || s == Shape::r16 || s == Shape::c16;
}

void tensor_amax_device(const void* x, InputType type, int64_t n, uint32_t* amax_bits, cudaStream_t stream) {
  check(cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync(amax)");
  if (n <= 0) return;
  static int sms = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 132;
  }();
  const unsigned blocks = unsigned(std::min<int64_t>(int64_t(sms) * 8, (n / 8 + kThreads - 1) / kThreads + 1));
  if (type == InputType::bf16) {
    amax_kernel<uint16_t><<<blocks, kThreads, 0, stream>>>(x, n, amax_bits);
  } else {
    amax_kernel<float><<<blocks, kThreads, 0, stream>>>(x, n, amax_bits);
  }
  check_launch("amax_kernel");
}

void quantize_device(const QuantizerSpec& q, const void* x, InputType type, int64_t rows, int64_t cols,
                     RandomStream rs, const QuantOutputs& out, QuantWorkspace& ws, cudaStream_t stream,
                     QuantPath path, const uint32_t* tensor_amax_bits) {
  validate(q, "quantize (cuda)");
  if (rows < 0 || cols < 0) throw Error("quantize (cuda): negative shape");
  if (out.code_layout == CodeLayout::packed4 && out.codes && q.element->bits() != 4)
    throw Error("quantize (cuda): packed4 code layout needs a 4-bit element, got '" + std::string(q.element->name) + "'");
  if (q.rht) {
    const bool along_rows = q.block_rows == 1;
    const int64_t len = along_rows ? cols : rows;
    if (len % 16 != 0)
      throw Error("RHT: the tensor's " + std::string(along_rows ? "column count" : "row count") + " (" +
                  std::to_string(len) + ") must be a multiple of 16 (the transform works on whole 16-element chunks)");
  }
  Shape shape{};
  const bool can_fuse = fused_supported(q) && shape_of(q, shape);
  if (path == QuantPath::fused && !can_fuse)
    throw Error("quantize (cuda): the fused kernel handles blocks [1,16], [1,32], [16,16], [16,1], [32,1] (RHT on "
                "[1,16]/[16,1]); got " + describe(q));
  if (path == QuantPath::generic && q.rht)
    throw Error("quantize (cuda): the generic path has no RHT; use the fused path for " + describe(q));
  const bool fused = path == QuantPath::fused || (path == QuantPath::automatic && can_fuse);

  const BlockGrid grid = block_grid(q, rows, cols);
  const int64_t nblocks = grid.nbr * grid.nbc;
  KParams p{};
  p.elem = *q.element;
  p.sfmt = *q.scale;
  p.rule = q.scale_rule;
  p.round = q.round;
  p.overflow = q.overflow;
  p.global = q.global_scale == GlobalScale::tensor_amax;
  p.rows = rows;
  p.cols = cols;
  p.nbc = grid.nbc;
  p.br = grid.br;
  p.bc = grid.bc;
  p.x = x;
  p.seed = rs.seed;
  p.stream = rs.stream;
  if (q.rht) {
    const std::array<float, 16> s = rht_signs(q.rht_seed);
    std::copy(s.begin(), s.end(), p.signs);
  }
  p.out = out;
  ws.amax.resize(std::max<size_t>(ws.amax.size(), size_t(1 + (fused ? 0 : nblocks))));
  p.gamax = ws.amax.data();
  if (rows == 0 || cols == 0) return;

  if (fused) {
    const bool need_amax = q.scale_rule == ScaleRule::nv && p.global;
    if (need_amax && tensor_amax_bits) {
      p.gamax = const_cast<uint32_t*>(tensor_amax_bits);  // only read by the quantize pass
    } else if (need_amax) {
      if (q.rht) {
        check(cudaMemsetAsync(p.gamax, 0, sizeof(uint32_t), stream), "cudaMemsetAsync(amax)");
        if (type == InputType::bf16) run_rht_amax<uint16_t>(p, shape, stream);
        else run_rht_amax<float>(p, shape, stream);
      } else {
        tensor_amax_device(x, type, rows * cols, p.gamax, stream);
      }
    }
    const int eid = elem_id(q.element);
    if (type == InputType::bf16) run_fused<uint16_t>(p, shape, q.rht, eid, stream);
    else run_fused<float>(p, shape, q.rht, eid, stream);
    return;
  }

  // Generic path.
  ws.mult.resize(std::max<size_t>(ws.mult.size(), size_t(nblocks)));
  ws.scale.resize(std::max<size_t>(ws.scale.size(), size_t(nblocks)));
  p.block_amax = ws.amax.data() + 1;
  p.block_mult = ws.mult.data();
  p.block_scale = ws.scale.data();
  check(cudaMemsetAsync(ws.amax.data(), 0, size_t(1 + nblocks) * sizeof(uint32_t), stream), "cudaMemsetAsync");
  const int64_t n = rows * cols;
  if (nblocks == 1) {
    // One block ([0,0], or a block larger than the tensor): the tensor amax
    // kernel (per-warp atomics on one word would serialise).
    tensor_amax_device(x, type, n, ws.amax.data(), stream);
    check(cudaMemcpyAsync(ws.amax.data() + 1, ws.amax.data(), sizeof(uint32_t), cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync(amax)");
  } else {
    if (type == InputType::bf16) generic_amax_kernel<uint16_t><<<grid_for(n), kThreads, 0, stream>>>(p);
    else generic_amax_kernel<float><<<grid_for(n), kThreads, 0, stream>>>(p);
    check_launch("generic_amax_kernel");
  }
  generic_scale_kernel<<<grid_for(nblocks), kThreads, 0, stream>>>(p, nblocks);
  check_launch("generic_scale_kernel");
  const int64_t threads = rows * ((cols + 1) / 2);
  if (type == InputType::bf16) generic_element_kernel<uint16_t><<<grid_for(threads), kThreads, 0, stream>>>(p);
  else generic_element_kernel<float><<<grid_for(threads), kThreads, 0, stream>>>(p);
  check_launch("generic_element_kernel");
}

QuantizedTensor quantize_gpu(const QuantizerSpec& q, MatrixView<const float> x, RandomStream rs, QuantPath path,
                             bool bf16_input) {
  const int64_t rows = x.rows, cols = x.cols, n = rows * cols;
  std::vector<float> host(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) host[size_t(r * cols + c)] = x(r, c);
  DeviceBuffer<float> dx32;
  DeviceBuffer<uint16_t> dx16;
  const void* dx;
  if (bf16_input) {
    std::vector<uint16_t> h16(host.size());
    for (size_t i = 0; i < h16.size(); ++i) {
      const uint32_t b = float_bits(host[i]);
      if ((b & 0xFFFFu) != 0) throw Error("quantize_gpu: bf16_input but element " + std::to_string(i) + " is not a bfloat16 value");
      h16[i] = uint16_t(b >> 16);
    }
    dx16.upload(h16);
    dx = dx16.data();
  } else {
    dx32.upload(host);
    dx = dx32.data();
  }
  int64_t sr = 0, sc = 0;
  scale_grid(q, rows, cols, sr, sc);
  const bool has_codes = q.scale != &float32;
  DeviceBuffer<uint8_t> codes(static_cast<size_t>(n)), scodes(has_codes ? static_cast<size_t>(sr * sc) : 0);
  DeviceBuffer<float> scales(static_cast<size_t>(sr * sc)), dq(static_cast<size_t>(n)), gdec(1);
  // Poison the outputs so that an unwritten element cannot pass.
  codes.fill_bytes(0xA5);
  scodes.fill_bytes(0xA5);
  scales.fill_bytes(0xA5);
  dq.fill_bytes(0xA5);
  gdec.fill_bytes(0xA5);
  QuantOutputs o;
  o.codes = codes.data();
  o.scale_codes = has_codes ? scodes.data() : nullptr;
  o.scales = scales.data();
  o.dequant = dq.data();
  o.global_decode = gdec.data();
  QuantWorkspace ws;
  quantize_device(q, dx, bf16_input ? InputType::bf16 : InputType::f32, rows, cols, rs, o, ws, nullptr, path);
  check(cudaDeviceSynchronize(), "quantize_gpu");
  QuantizedTensor t;
  t.spec = q;
  t.rows = rows;
  t.cols = cols;
  t.codes = codes.download();
  t.scale_rows = sr;
  t.scale_cols = sc;
  if (has_codes) t.scale_codes = scodes.download();
  t.scales = scales.download();
  t.global_decode = gdec.download()[0];
  t.dequant = dq.download();
  return t;
}

}  // namespace fp4lab::cuda
