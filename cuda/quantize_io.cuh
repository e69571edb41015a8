// Loads and stores of the quantization kernels, private to cuda/: vectorised
// loads of FP32 / BF16 rows and strips (widened exactly to float), element
// indices, and the stores of codes, FP32 and BF16 values with their aligned
// fast paths (FULL: no checks). Part of quantize_kernels.cuh.
#pragma once

#include <type_traits>

#include "cuda/quantize_params.cuh"

namespace fp4lab::cuda::qk {

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
// branch, so a loop of load_n calls waits for each row's load before issuing
// the next one: 16 memory latencies in a row per strip of a column kernel.
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

// Element index of (row r, column c0). FULL forms hold fewer than 2^31
// elements (index32_fits), so the index is formed in 32 bits, which
// the compiler strength-reduces across a kernel's unrolled rows (a 64-bit
// product is several integer instructions per row of a column strip).
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

// The per-element outputs of the one-thread-a-column-pair kernels (generic,
// TE options, fp4tk): element i's code (byte layout), its FP32 value and its
// BF16 value (each kernel says which value that is: with or without g_dec).
__device__ __forceinline__ void store_element(const QuantOutputs& o, int64_t i, uint32_t code, float dq, float dq_bf16) {
  if (o.codes && o.code_layout == CodeLayout::bytes) o.codes[i] = uint8_t(code);
  if (o.dequant) o.dequant[i] = dq;
  if (o.dequant_bf16) o.dequant_bf16[i] = uint16_t(encode_rn_f32<bfloat16>(dq_bf16, Overflow::nonsaturate));
}
// The packed4 byte of columns (c0, c0 + 1) of row r (a row holds `pairs` bytes).
__device__ __forceinline__ void store_code_pair(const QuantOutputs& o, int64_t r, int64_t pairs, int64_t c0,
                                                const uint32_t (&codes)[2]) {
  if (o.codes && o.code_layout == CodeLayout::packed4)
    o.codes[r * pairs + c0 / 2] = uint8_t((codes[0] & 0xFu) | ((codes[1] & 0xFu) << 4));
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

}  // namespace fp4lab::cuda::qk
