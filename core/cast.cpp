#include "core/cast.hpp"

#include <algorithm>
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "core/format_dispatch.hpp"
#include "core/philox.hpp"

namespace fp4lab {

namespace {

// Work is split into fixed blocks of elements; OpenMP hands whole blocks to
// threads. Results never depend on the split (each code is a pure function of
// its element and index); blocks only bound scheduling overhead.
constexpr size_t kBlock = 1 << 14;
constexpr size_t kParallelMin = 1 << 16;

template <class Body>
void for_blocks(size_t n, Body body) {
  const int64_t nblocks = int64_t((n + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < nblocks; ++b) {
    const size_t lo = size_t(b) * kBlock;
    body(lo, std::min(n, lo + kBlock));
  }
}

// One block of the fast path. The pointers are plain (restrict) parameters,
// not lambda captures: a uint8_t store may alias anything, including a
// captured pointer, which would force a reload per element and defeat the
// vectoriser. The overflow policy is a template argument so that the loop
// body is a straight-line, branch-free function of x[i].
// Built twice (ifunc dispatch at load time): for AVX2 where the CPU has it
// (2-3x faster: 8-lane integer ops and cheap narrowing to bytes) and for the
// baseline x86-64. Both compute the same integer function of x[i].
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FP4LAB_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FP4LAB_SIMD_CLONES
#endif
template <const Format& F, Overflow O, class C>
FP4LAB_SIMD_CLONES void encode_rn_block(const float* __restrict x, C* __restrict codes, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) codes[i] = C(encode_rn_f32<F>(x[i], O));
}

template <const Format& F, class C>
void encode_rn_fast(const float* x, C* codes, size_t n, Overflow o) {
  for_blocks(n, [x, codes, o](size_t lo, size_t hi) {
    if (o == Overflow::saturate)
      encode_rn_block<F, Overflow::saturate>(x + lo, codes + lo, hi - lo);
    else
      encode_rn_block<F, Overflow::nonsaturate>(x + lo, codes + lo, hi - lo);
  });
}

// Stochastic rounding, float32 in: the words of a chunk are drawn first
// (philox_groups), then encoded branch-free (encode_rs_f32 == encode(rs)).
template <const Format& F, Overflow O, class C>
FP4LAB_SIMD_CLONES void encode_rs_block(const float* __restrict x, const uint32_t* __restrict w, C* __restrict codes,
                                        size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) codes[i] = C(encode_rs_f32<F>(x[i], w[i], O));
}

template <const Format& F, class C>
void encode_rs_fast(const float* x, C* codes, size_t n, const CastOptions& opt) {
  for_blocks(n, [x, codes, &opt](size_t lo, size_t hi) {
    constexpr size_t K = 1024;
    uint32_t words[K], scratch[K + 8];
    for (size_t c0 = lo; c0 < hi; c0 += K) {
      const size_t len = std::min(K, hi - c0);
      random_words(opt.seed, opt.stream, opt.index_offset + c0, len, words, scratch);
      if (opt.overflow == Overflow::saturate)
        encode_rs_block<F, Overflow::saturate>(x + c0, words, codes + c0, len);
      else
        encode_rs_block<F, Overflow::nonsaturate>(x + c0, words, codes + c0, len);
    }
  });
}

// The random values (right-aligned, sr_width bits) of elements
// opt.index_offset + i0 .. + len - 1 under opt's contract and source.
void random_values(const Format& f, const CastOptions& opt, size_t i0, size_t len, uint32_t* out) {
  const int G = sr_group(opt.sr_bits, f);
  const uint64_t L = opt.row_length, per_row = L ? (L + uint64_t(G) - 1) / uint64_t(G) : 0;
  uint64_t group = ~uint64_t(0);
  Philox4 p{};
  for (size_t k = 0; k < len; ++k) {
    const uint64_t i = opt.index_offset + i0 + k;
    const uint64_t r = L ? i / L : 0, c = L ? i % L : i;
    const uint64_t w = r * per_row + c / uint64_t(G);
    uint32_t word;
    if (opt.words) {
      word = opt.words[w];
    } else {
      if ((w >> 2) != group) {
        group = w >> 2;
        p = philox_group(opt.seed, opt.stream, group);
      }
      word = p.v[w & 3u];
    }
    out[k] = sr_element_bits(opt.sr_bits, f, word, int(c % uint64_t(G)));
  }
}

// Stochastic rounding from random_values (the ptx_x4 contract, or given
// words): float32 through encode_rs_f32<F, W>, W = the contract's width.
template <const Format& F, class C>
void encode_rs_values(const float* x, C* codes, size_t n, const CastOptions& opt) {
  for_blocks(n, [x, codes, &opt](size_t lo, size_t hi) {
    constexpr size_t K = 1024;
    uint32_t v[K];
    for (size_t c0 = lo; c0 < hi; c0 += K) {
      const size_t len = std::min(K, hi - c0);
      random_values(F, opt, c0, len, v);
      constexpr int Wp = sr_width(SrBits::ptx_x4, F);
      for (size_t i = 0; i < len; ++i)
        codes[c0 + i] = C(opt.sr_bits == SrBits::per_element ? encode_rs_f32<F, 32>(x[c0 + i], v[i], opt.overflow)
                                                             : encode_rs_f32<F, Wp>(x[c0 + i], v[i], opt.overflow));
    }
  });
}

template <class T, class C>
void encode_generic(const Format& f, const T* x, C* codes, size_t n, const CastOptions& opt) {
  for_blocks(n, [&](size_t lo, size_t hi) {
    if (opt.round != Round::rs) {
      for (size_t i = lo; i < hi; ++i) codes[i] = C(encode(f, x[i], opt.round, opt.overflow));
      return;
    }
    if (opt.sr_bits != SrBits::per_element || opt.words) {
      const int W = sr_width(opt.sr_bits, f);
      constexpr size_t K = 1024;
      uint32_t v[K];
      for (size_t c0 = lo; c0 < hi; c0 += K) {
        const size_t len = std::min(K, hi - c0);
        random_values(f, opt, c0, len, v);
        for (size_t i = 0; i < len; ++i) codes[c0 + i] = C(encode(f, x[c0 + i], Round::rs, opt.overflow, v[i], W));
      }
      return;
    }
    // One Philox call yields the bits of 4 consecutive indices (philox.hpp);
    // reuse the group while the index stays in it.
    uint64_t group = ~uint64_t(0);
    Philox4 words{};
    for (size_t i = lo; i < hi; ++i) {
      const uint64_t index = opt.index_offset + i;
      if ((index >> 2) != group) {
        group = index >> 2;
        words = philox_group(opt.seed, opt.stream, group);
      }
      codes[i] = C(encode(f, x[i], Round::rs, opt.overflow, words.v[index & 3u]));
    }
  });
}

template <class C>
void check_code_type(const Format& f) {
  if (code_bytes(f) != int(sizeof(C)))
    throw Error("format " + std::string(f.name) + " has " + std::to_string(f.bits()) +
                "-bit codes, which are not stored as " + (sizeof(C) == 1 ? "uint8" : "uint16") +
                (code_bytes(f) == 0 ? " (float32 codes are not supported by the array helpers)" : ""));
}

// Float32 round-to-nearest-even and stochastic rounding: the branch-free
// paths where they exist (e8m0, ue4m3 and int8 take the generic encode()).
template <class C>
bool try_fast(const Format& f, const float* x, C* codes, size_t n, Overflow o) {
  return with_fast_format(f, [&]<const Format & F>() { encode_rn_fast<F>(x, codes, n, o); });
}

template <class C>
bool try_fast_rs(const Format& f, const float* x, C* codes, size_t n, const CastOptions& opt) {
  if (opt.sr_bits != SrBits::per_element || opt.words)
    return with_fast_format(f, [&]<const Format & F>() { encode_rs_values<F>(x, codes, n, opt); });
  return with_fast_format(f, [&]<const Format & F>() { encode_rs_fast<F>(x, codes, n, opt); });
}

template <class T, class C>
void encode_any(const Format& f, const T* x, C* codes, size_t n, const CastOptions& opt) {
  check_code_type<C>(f);
  if (opt.round == Round::rs) check_sr_bits(opt.sr_bits, f, "cast");
  if constexpr (std::is_same_v<T, float>) {
    if (opt.round == Round::rn && try_fast(f, x, codes, n, opt.overflow)) return;
    if (opt.round == Round::rs && try_fast_rs(f, x, codes, n, opt)) return;
  }
  encode_generic(f, x, codes, n, opt);
}

}  // namespace

uint64_t sr_word_count(const Format& f, uint64_t n, const CastOptions& opt) {
  const uint64_t G = uint64_t(sr_group(opt.sr_bits, f));
  if (G == 1) return n;
  const uint64_t L = opt.row_length ? opt.row_length : n;
  if (L == 0) return 0;
  return (n / L) * ((L + G - 1) / G) + (n % L + G - 1) / G;
}

void encode_array(const Format& f, const float* x, uint8_t* codes, size_t n, const CastOptions& opt) {
  encode_any(f, x, codes, n, opt);
}
void encode_array(const Format& f, const double* x, uint8_t* codes, size_t n, const CastOptions& opt) {
  encode_any(f, x, codes, n, opt);
}
void encode_array(const Format& f, const float* x, uint16_t* codes, size_t n, const CastOptions& opt) {
  encode_any(f, x, codes, n, opt);
}
void encode_array(const Format& f, const double* x, uint16_t* codes, size_t n, const CastOptions& opt) {
  encode_any(f, x, codes, n, opt);
}

void decode_array(const Format& f, const uint8_t* codes, float* out, size_t n) {
  check_code_type<uint8_t>(f);
  // A cache of decode() over the format's codes (not a second definition).
  float table[256];
  for (uint32_t c = 0; c < 256; ++c) table[c] = decode(f, c);
  for_blocks(n, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) out[i] = table[codes[i]];
  });
}

void decode_array(const Format& f, const uint16_t* codes, float* out, size_t n) {
  check_code_type<uint16_t>(f);
  for_blocks(n, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) out[i] = decode(f, codes[i]);
  });
}

size_t first_invalid_code(const Format& f, const uint8_t* codes, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (codes[i] >= f.code_count()) return i;
  return n;
}
size_t first_invalid_code(const Format& f, const uint16_t* codes, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (codes[i] >= f.code_count()) return i;
  return n;
}

}  // namespace fp4lab
