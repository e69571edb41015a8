// Block parameters and element encoding of the quantization kernels, private
// to cuda/: sim's block scale rules per block (block_params), element codes in
// every mode (encode_and_store: the form of every kernel, and the BF16 value
// forms), decoding, and every requested output of a run of codes
// (store_outputs). The same FP4LAB_HD functions as sim/quantizer.cpp. Part of
// quantize_kernels.cuh.
#pragma once

#include "cuda/quantize_io.cuh"
#include "cuda/quantize_params.cuh"
#include "sim/block_rule.hpp"

namespace fp4lab::cuda::qk {

template <KernelKind K>
__device__ __forceinline__ uint32_t encode_rn(const Format& f, float y, Overflow o) {
  if constexpr (K != KernelKind::runtime) {
    return encode_rn_f32<kind_format<K>()>(y, o);
  } else {
    return encode(f, y, Round::rn, o);
  }
}

// Stochastic rounding with a W-bit random value (core/sr.hpp's sr_width: 32
// per_element, 8 ptx_x4): core's branch-free encode_rs_f32 (== encode(rs))
// for the compile-time formats, the generic encoder otherwise.
template <KernelKind K, int W = 32>
__device__ __forceinline__ uint32_t encode_rs(const Format& f, float y, Overflow o, uint32_t rbits) {
  if constexpr (K != KernelKind::runtime) {
    return encode_rs_f32<kind_format<K>(), W>(y, rbits, o);
  } else {
    return encode(f, y, Round::rs, o, rbits, W);
  }
}

// ---- random values of stochastic rounding (core/sr.hpp, KParams::sr) -------
// An element's value is sr_word_bits of its group's word, with the lsb step
// and width that sr.hpp gives for the element format (sr_layout on the host,
// KParams::sr), i.e. sr_element_bits.

// ptx_x4 groups 4 consecutive columns of a row on one word for the kinds'
// element formats (every block element cvt.rs converts to): the fast forms
// below rely on it.
constexpr int kX4Group = 4;
static_assert(sr_group(SrBits::ptx_x4, float4_e2m1fn) == kX4Group &&
              sr_group(SrBits::ptx_x4, float8_e4m3fn) == kX4Group && sr_group(SrBits::ptx_x4, float8_e5m2) == kX4Group);
// W of kind K's elements under ptx_x4, and element k's lsb in its word: k times this.
template <KernelKind K>
constexpr int kX4Width = sr_width(SrBits::ptx_x4, kind_format<K>());
template <KernelKind K>
constexpr int kX4LsbStep = sr_lsb(SrBits::ptx_x4, kind_format<K>(), 1);

// ptx_x4: the word index of row r's group of columns from c0 (c0 % 4 == 0):
// r * ceil(cols / 4) + c0 / 4. FULL: in 32 bits (r * cols + c0 < 2^31 bounds it).
template <bool FULL>
__device__ __forceinline__ uint64_t sr_x4_word(const KParams& p, int64_t r, int64_t c0) {
  if constexpr (FULL) return uint32_t(r) * uint32_t(p.sr.words_per_row) + uint32_t(c0) / kX4Group;
  return uint64_t(r) * uint64_t(p.sr.words_per_row) + uint64_t(c0) / kX4Group;
}

// NW consecutive random words from word index w0 (word w is random_bits(seed,
// stream, w): word w % 4 of Philox group w / 4): the groups covering them,
// one Philox call per 4 words where w0 % 4 == 0 (rows of a multiple of 16
// columns), one more call otherwise, the words then picked by selects (no run-time
// indexing: registers, not local memory).
template <int NW>
__device__ __forceinline__ void sr_words(const KParams& p, uint64_t w0, uint32_t (&w)[NW]) {
  constexpr int NG = (NW + 3) / 4;
  const uint64_t g0 = w0 >> 2;
  const uint32_t off = uint32_t(w0) & 3u;
  uint32_t all[4 * (NG + 1)];
#pragma unroll
  for (int q = 0; q < NG; ++q) {
    const Philox4 grp = philox_group(p.seed, p.stream, g0 + q);
#pragma unroll
    for (int k = 0; k < 4; ++k) all[4 * q + k] = grp.v[k];
  }
  Philox4 extra{};
  if constexpr (NW + 3 > 4 * NG)  // a run of NW words from off <= 3 may reach group NG
    if (off + NW > 4 * NG) extra = philox_group(p.seed, p.stream, g0 + NG);
#pragma unroll
  for (int k = 0; k < 4; ++k) all[4 * NG + k] = extra.v[k];
#pragma unroll
  for (int j = 0; j < NW; ++j) w[j] = off == 0 ? all[j] : off == 1 ? all[j + 1] : off == 2 ? all[j + 2] : all[j + 3];
}

// ptx_x4: the random values (sr_element_bits: kX4Width<K> bits,
// right-aligned) of the N consecutive elements of row r from column c0 of a
// compile-time kind K. N >= 4: c0 % 4 == 0 (every fused kernel's runs: row
// blocks, tiles, 4-column strips); N < 4: the run within one group (the
// 2-column strips: c0 even).
template <KernelKind K, int N, bool FULL>
__device__ __forceinline__ void sr_x4_values(const KParams& p, int64_t r, int64_t c0, uint32_t (&rv)[N]) {
  static_assert(K != KernelKind::runtime && (N % kX4Group == 0 || N < kX4Group));
  constexpr int NW = (N + kX4Group - 1) / kX4Group, W = kX4Width<K>, step = kX4LsbStep<K>;
  uint32_t w[NW];
  sr_words<NW>(p, sr_x4_word<FULL>(p, r, c0), w);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if constexpr (N >= kX4Group)
      rv[j] = sr_word_bits(w[j / kX4Group], step * (j % kX4Group), W);
    else
      rv[j] = sr_word_bits(w[0], step * (int(c0 % kX4Group) + j), W);
  }
}

// The random value of element (r, c) under p's contract (encode()'s rbits of
// p.sr.width bits): per_element word r * cols + c whole, ptx_x4 word
// r * words_per_row + c / G's share. One Philox call: the form of every mode
// (runtime formats, runs the fast forms do not take).
__device__ __forceinline__ uint32_t sr_value(const KParams& p, int64_t r, int64_t c) {
  if (p.sr.bits == SrBits::per_element) return random_bits(p.seed, p.stream, uint64_t(r * p.cols + c));
  const int64_t g = p.sr.group;
  const uint64_t w = uint64_t(r) * uint64_t(p.sr.words_per_row) + uint64_t(c / g);
  const uint32_t word = random_bits(p.seed, p.stream, w);
  return sr_word_bits(word, p.sr.lsb_step * int(c % g), p.sr.width);
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

// The standard block rule's choice (sim/block_rule.hpp) with run-time formats.
__device__ __forceinline__ BlockParams block_params_impl(const Format& elem, const Format& sfmt, ScaleRule rule,
                                                         uint32_t amax, const NvGlobal& g) {
  const StandardRule::Params p{elem, sfmt, rule, Round::rn, Overflow::saturate, false, 32, StdScaleForm::generic};
  const BlockChoice c = StandardRule::choose(p, g, amax);
  return BlockParams{c.code, c.scale, c.mult};
}
// Out of line for runtime formats (compile time: encode() is large).
__device__ __noinline__ inline BlockParams block_params_rt(const Format elem, const Format sfmt, ScaleRule rule,
                                                           uint32_t amax, const NvGlobal g) {
  return block_params_impl(elem, sfmt, rule, amax, g);
}
template <KernelKind K>
__device__ __forceinline__ BlockParams block_params(const KParams& p, const Format& elem, const Format& sfmt,
                                                    uint32_t amax, const NvGlobal& g) {
  if constexpr (K == KernelKind::nvfp4) {
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
  } else if constexpr (K != KernelKind::runtime) {
    if (p.rule == ScaleRule::ocp) return block_params_impl(elem, sfmt, ScaleRule::ocp, amax, g);
  }
  return block_params_rt(elem, sfmt, p.rule, amax, g);
}

// Element code of x in a block with multiplier `mult`: the standard rule's element encoder (sim/block_rule.hpp's
// MultEncoder); SR with the random value rbits of sr_width bits (KParams::sr.width).
__device__ __noinline__ inline uint32_t encode_element_rt(const Format f, ScaleRule rule, Round round,
                                                          Overflow overflow, float x, float mult, uint32_t rbits,
                                                          int sr_width) {
  // The fused kernels' scale rules only (quantize_plan.cpp's fused_family): the scale format does not matter.
  const StandardRule::Params p{f, f, rule, round, overflow, false, sr_width, StdScaleForm::generic};
  return StandardRule::mult_encoder(p).code(mult, x, rbits);
}

// decode() of an element code; core's branch-free decode_f32 for the
// compile-time formats.
template <KernelKind K>
__device__ __forceinline__ float decode_elem(const Format& f, uint32_t code) {
  if constexpr (K != KernelKind::runtime) {
    return decode_f32<kind_format<K>()>(code);
  } else {
    return decode(f, code);
  }
}

__device__ __forceinline__ uint32_t pick(const Philox4& g, uint32_t k) {
  return k == 0 ? g.v[0] : k == 1 ? g.v[1] : k == 2 ? g.v[2] : g.v[3];
}

__device__ __forceinline__ uint32_t to_bf16(float v) { return encode_rn_f32<bfloat16>(v, Overflow::nonsaturate); }


template <KernelKind K, int N, int NB, bool FULL = false>
__device__ __forceinline__ void store_outputs(const KParams& p, const Format& f, const NvGlobal& g, int64_t r,
                                              int64_t c0, const uint32_t (&code)[N], const BlockParams (&bp)[NB],
                                              int valid, bool codes);

// Encodes N consecutive elements of row r from column c0 with block parameters
// bp (one per element via bidx), writes every requested output. FM != none:
// the caller guarantees that mode (rn / rs, with a kind other than runtime and not the
// nv_noglobal rule; rs: N % 4 == 0, N <= 16 and (r * cols + c0) % 4 == 0; the
// _x4 forms: KParams::sr.bits ptx_x4), and only that mode's code is compiled.
// SR under ptx_x4: c0 % 4 == 0 for N >= 4, an even c0 for N == 2
// (sr_x4_values). FULL: as store_outputs'.
template <KernelKind K, int N, int NB, Fast FM = Fast::none, bool FULL = false>
__device__ __forceinline__ void encode_and_store(const KParams& p, const Format& f, const NvGlobal& g, int64_t r,
                                                 int64_t c0, const float (&v)[N], const BlockParams (&bp)[NB],
                                                 int valid) {
  // Block of element j: bp[j * NB / N] (NB == 1: one block; NB == N: one per element).
  const int64_t base = elem_index<FULL>(p, r, c0);
  if constexpr (value_form(FM)) {
    // The BF16 operand straight from each element's rounded value (no code,
    // no decode: e2m1_rn_value_bits / e2m1_rs_value_bits, and for E4M3 / E5M2
    // (the e4m3, e5m2 kinds; rn, saturating) rn_sat_value_bits), in groups of G elements
    // (a Philox group with SR). A group holding a NaN product takes the code
    // path (E2M1 maps NaN to +6, whatever its sign). E2M1 values (at most 2
    // significant bits) times a UE4M3 or E8M0 scale are exact in BF16 wherever
    // the FP32 product is finite, so their operand is the product's top half,
    // which store_outputs' rounding gives; FP8 values (up to 4 significant
    // bits) times an E8M0 scale can fall below BF16's subnormal quantum: rounded.
    constexpr bool sr = value_form_sr(FM), div = value_form_div(FM);
    constexpr bool e2m1 = e2m1_kind(K);
    static_assert(!div || K == KernelKind::nvfp4);
    // SR with N == 2 (the [32,1] column kernels' 2-column strips): the run
    // starts on an even element index (the caller's fast_rs_applies: cols % 4
    // == 0, even c0), so it lies in one Philox group (per_element) or one
    // word (ptx_x4, any cols).
    constexpr int G = N < 4 ? N : 4;
    static_assert(K != KernelKind::runtime && N % G == 0 && (!sr || (e2m1 && (G == 4 || G == 2) && N <= 16)));
    // ptx_x4 (the _x4 forms): every element's 8-bit value up front, from
    // one Philox call per 16 elements (sr_x4_values).
    constexpr bool x4 = x4_form(FM);
    constexpr int W = x4 ? kX4Width<K> : 32;
    uint32_t rv[x4 ? N : 1];
    if constexpr (x4) sr_x4_values<K, N, FULL>(p, r, c0, rv);
    auto operand_bits = [](float value, float scale) {
      return e2m1 ? float_bits(value * scale) >> 16 : to_bf16(value * scale);
    };
    uint32_t h[N];
#pragma unroll
    for (int q = 0; q < N / G; ++q) {
      Philox4 grp{};
      if constexpr (sr && !x4) grp = philox_group(p.seed, p.stream, uint64_t(base >> 2) + q);
      auto rbits = [&](int k) {
        if constexpr (x4) return rv[G * q + k];
        return G == 4 ? grp.v[k] : pick(grp, uint32_t(base & 3) + uint32_t(k));
      };
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
            value = e2m1_rs_value_bits<W>(yb[k], rbits(k));
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
          const uint32_t code = sr ? encode_rs<K, W>(f, y, p.overflow, rbits(k)) : encode_rn<K>(f, y, p.overflow);
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
                (K != KernelKind::runtime && (FM == Fast::rn || (N % 4 == 0 && N <= 16))));
  // The rn and SR branches serve either rule: fp4-trainkit's nv_noglobal
  // (eq. 3) divides by the block scale (encode_element_rt), the others multiply.
  const bool div = FM == Fast::none && p.rule == ScaleRule::nv_noglobal;
  auto operand = [&](float x, float mult) { return div ? x / mult : x * mult; };
  // The per_element SR branches below (their Philox groups are element indices).
  const bool per_element = p.sr.bits == SrBits::per_element;
  if (FM == Fast::rn || (FM == Fast::none && K != KernelKind::runtime && p.round == Round::rn)) {
#pragma unroll
    for (int j = 0; j < N; ++j) code[j] = encode_rn<K>(f, operand(v[j], bp[j * NB / N].mult), p.overflow);
  } else if (FM == Fast::rs_x4 ||
             (FM == Fast::none && K != KernelKind::runtime && p.round == Round::rs && !per_element && N <= 16)) {
    // ptx_x4: the run's words (one Philox call per 16 elements), 8 bits an element.
    if constexpr (K != KernelKind::runtime) {
      uint32_t rv[N];
      sr_x4_values<K, N, FULL>(p, r, c0, rv);
#pragma unroll
      for (int j = 0; j < N; ++j)
        code[j] = encode_rs<K, kX4Width<K>>(f, operand(v[j], bp[j * NB / N].mult), p.overflow, rv[j]);
    }
  } else if (FM == Fast::rs || (FM == Fast::none && K != KernelKind::runtime && p.round == Round::rs && per_element &&
                                N % 4 == 0 && N <= 16 && (base & 3) == 0)) {
    // Up to 4 Philox groups unrolled (branch-free encode_rs_f32: about 1000
    // instructions), so that nothing is indexed at run time (local memory).
#pragma unroll
    for (int q = 0; q < N / 4; ++q) {
      const Philox4 grp = philox_group(p.seed, p.stream, uint64_t(base >> 2) + q);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        code[4 * q + k] = encode_rs<K>(f, operand(v[4 * q + k], bp[(4 * q + k) * NB / N].mult), p.overflow, grp.v[k]);
    }
  } else if (K != KernelKind::runtime && p.round == Round::rs && per_element && N < 4) {
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
  } else if (K != KernelKind::runtime && p.round == Round::rs && per_element && N % 4 == 0 && (base & 3) == 0) {
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
    // Every mode, either contract (sr_value: one Philox call an element).
    const bool sr = p.round == Round::rs;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const uint32_t rb = sr ? sr_value(p, r, c0 + j) : 0u;
      code[j] = encode_element_rt(f, p.rule, p.round, p.overflow, v[j], bp[j * NB / N].mult, rb, p.sr.width);
    }
  }
  // (A value form returned above; its FULL kernels may have N == 2, which
  // store_outputs' FULL stores do not take.)
  if constexpr (!value_form(FM)) store_outputs<K, N, NB, FULL>(p, f, g, r, c0, code, bp, valid, true);
}

// The FP32 dequantized values of N codes: (decode(code) * scale) * g_dec.
template <KernelKind K, int N, int NB>
__device__ __forceinline__ void dequant_f32(const Format& f, const NvGlobal& g, const uint32_t (&code)[N],
                                            const BlockParams (&bp)[NB], float (&d)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) d[j] = (decode_elem<K>(f, code[j]) * bp[j * NB / N].scale) * g.g_dec;
}
// The BF16 output bits of N codes (QuantOutputs::dequant_bf16).
template <KernelKind K, int N, int NB>
__device__ __forceinline__ void dequant_bf16(const QuantOutputs& o, const Format& f, const NvGlobal& g,
                                             const uint32_t (&code)[N], const BlockParams (&bp)[NB], uint32_t (&h)[N]) {
  if (K == KernelKind::nvfp4 && o.bf16_gemm_operand) {
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
template <KernelKind K, int N, int NB, bool FULL>
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

}  // namespace fp4lab::cuda::qk
