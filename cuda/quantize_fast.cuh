// The fast rn and SR forms of the quantization kernels, private to cuda/:
// codes computed straight into packed words (encode_store_rn_fast,
// encode_store_rs_fast) from core's float-rounding magnitude forms, equal to
// encode_rn_f32 / encode_rs_f32 for the blocks they admit (no NaN product),
// and the FULL column kernels' strip stores. Part of quantize_kernels.cuh.
#pragma once

#include "cuda/quantize_encode.cuh"
#include "cuda/quantize_io.cuh"
#include "cuda/quantize_params.cuh"

namespace fp4lab::cuda::qk {

// Every requested output of a whole R-row strip of 4 columns from (r0, c0)
// (the FULL column kernels' rn form), output by output: each output's check
// once per strip, not once per row (re-testing the output pointers and the
// code layout every row is a large share of a row's instructions). words[rr]: row rr's 4 codes (E2M1, < 16) as bytes,
// pack_codes4<false>'s (one register a row, not four).
template <KernelKind K, int R>
__device__ __forceinline__ void store_strip_full(const KParams& p, const Format& f, const NvGlobal& g, int64_t r0,
                                                 int64_t c0, const uint32_t (&words)[R], const BlockParams (&bp)[4]) {
  static_assert(e2m1_kind(K));
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

// How kind K's codes pack into 32-bit words (every kind but runtime): FP4 8 nibbles a word,
// element 0 in the low nibble; FP8 4 bytes.
template <KernelKind K>
struct CodeWords {
  static_assert(K != KernelKind::runtime);
  static constexpr bool fp4 = e2m1_kind(K);
  static constexpr int per_word = fp4 ? 8 : 4, bits = 32 / per_word;
};

// The codes of N consecutive elements of row r from column c0, packed in
// words w as the output's layout has them (CodeWords), stored, then every other requested
// output (encode_store_rn_fast, encode_store_rs_fast).
template <KernelKind K, int N, bool FULL>
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
      // A partial last byte of FP4 codes gets a zero high nibble (sim's
      // packing): the element past `valid` (a zero) need not have code 0 (SR
      // of 0 * a non-finite multiplier is NaN's code).
      const int nbytes = fp4 ? (valid + 1) / 2 : valid;
      const uint32_t last_mask = fp4 && valid % 2 ? 0x0Fu : 0xFFu;
#pragma unroll
      for (int b = 0; b < nbytes_full; ++b)
        if (b < nbytes) dst[b] = uint8_t((w[b / 4] >> (8 * (b % 4))) & (b == nbytes - 1 ? last_mask : 0xFFu));
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
template <KernelKind K, int N, bool FULL = false>
__device__ __forceinline__ void encode_store_rn_fast(const KParams& p, const Format& f, const NvGlobal& g, int64_t r,
                                                     int64_t c0, const float (&v)[N], const BlockParams (&bp)[1],
                                                     int valid) {
  constexpr bool fp4 = CodeWords<K>::fp4;
  constexpr int per_word = CodeWords<K>::per_word, bits = CodeWords<K>::bits;
  static_assert(K != KernelKind::runtime && N % per_word == 0);
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
template <KernelKind K, int N, bool FULL = false>
__device__ __forceinline__ void encode_store_rn(const KParams& p, const Format& f, const NvGlobal& g, int64_t r,
                                                int64_t c0, const float (&v)[N], const BlockParams (&bp)[1], int valid,
                                                uint32_t amax) {
  if (rn_fast_block(amax, bp[0].mult)) return encode_store_rn_fast<K, N, FULL>(p, f, g, r, c0, v, bp, valid);
  uint32_t code[N];
#pragma unroll
  for (int j = 0; j < N; ++j) code[j] = encode_rn<K>(f, v[j] * bp[0].mult, p.overflow);
  store_outputs<K, N, 1>(p, f, g, r, c0, code, bp, valid, true);
}

// SR codes of one row block (multiplier bp.mult, amax bits amax) of a
// fast_rs_applies() kind: per_element one Philox group per 4 elements (core's
// philox_group of element index / 4, word index % 4: random_bits()); X4
// (ptx_x4) the block's words first (sr_x4_values: one Philox call per 16
// elements, 8 bits an element). The codes added into packed words, then every
// requested output. E2M1 blocks that rn_fast_block() admits (no NaN product)
// take core's e2m1_rs_magnitude capped at 7, the signs gathered by byte
// permutes (encode_store_rn_fast's way): no per-element NaN select or sign
// shift (the integer ALU pipe bounds these kernels); other blocks and kinds
// core's encode_rs_f32 per element.
template <KernelKind K, int N, bool FULL = false, bool X4 = false>
__device__ __forceinline__ void encode_store_rs_fast(const KParams& p, const Format& f, const NvGlobal& g, int64_t r,
                                                     int64_t c0, const float (&v)[N], const BlockParams (&bp)[1],
                                                     int valid, uint32_t amax) {
  constexpr bool fp4 = CodeWords<K>::fp4;
  constexpr int per_word = CodeWords<K>::per_word, bits = CodeWords<K>::bits;
  static_assert(N % per_word == 0 && N % 4 == 0);
  constexpr int W = X4 ? kX4Width<K> : 32;  // the random values' width (core/sr.hpp)
  uint32_t rv[X4 ? N : 1];
  if constexpr (X4) sr_x4_values<K, N, FULL>(p, r, c0, rv);
  const uint64_t group0 = uint64_t(elem_index<FULL>(p, r, c0)) >> 2;  // per_element: (r * cols + c0) % 4 == 0
  // The random values of elements 4q .. 4q + 3 of the run.
  auto values4 = [&](int q, uint32_t(&rb)[4]) {
    if constexpr (X4) {
#pragma unroll
      for (int k = 0; k < 4; ++k) rb[k] = rv[4 * q + k];
    } else {
      const Philox4 grp = philox_group(p.seed, p.stream, group0 + q);
#pragma unroll
      for (int k = 0; k < 4; ++k) rb[k] = grp.v[k];
    }
  };
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
          uint32_t rb[4];
          values4(2 * q + h, rb);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float y = v[8 * q + 4 * h + k] * bp[0].mult;
            yb[4 * h + k] = float_bits(y);
            w[q] += umin(e2m1_rs_magnitude<W>(yb[4 * h + k], rb[k]), 7u) * (1u << (4 * (4 * h + k)));
          }
        }
        w[q] |= e2m1_signs8(yb);
      }
      return store_code_words<K, N, FULL>(p, f, g, r, c0, w, bp, valid);
    }
  }
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    uint32_t rb[4];
    values4(q, rb);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int j = 4 * q + k;
      const uint32_t code = encode_rs<K, W>(f, v[j] * bp[0].mult, p.overflow, rb[k]);
      w[j / per_word] += code * (1u << (bits * (j % per_word)));
    }
  }
  store_code_words<K, N, FULL>(p, f, g, r, c0, w, bp, valid);
}

}  // namespace fp4lab::cuda::qk
