// The bit-exact block quantizer (quantizer.hpp); its spec, JSON and canned names are in quantizer_spec.cpp.
//
// Layout of the computation (every step is per element or an exact max, so the
// result does not depend on the OpenMP thread count):
//   1. block amax: max of |x| bit patterns over each block's valid elements
//      (stripes of block_rows rows in parallel);
//   2. the amax of the rule's outer domain (the tensor, or each row), its
//      global constants, and each block's scale by the block rule
//      (sim/block_rule.hpp, selected once by sim/block_rules.hpp; the same
//      FP4LAB_HD code as cuda/);
//   3. per row (in parallel): the rule's element code, dequant = (value * scale) * g_dec;
//      for the standard encoder, y = x * mult (x / scale for nv_noglobal),
//      code = encode(element, y), in vectorised rows.
#include "sim/quantizer.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.hpp"
#include "core/format_dispatch.hpp"
#include "core/philox.hpp"
#include "sim/block_scales.hpp"
#include "sim/element_stats.hpp"
#include "sim/block_rules.hpp"
#include "sim/rht.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab {

// ---------------------------------------------------------------------------
// block scales
// ---------------------------------------------------------------------------

BlockGrid block_grid(const QuantizerSpec& q, int64_t rows, int64_t cols) {
  BlockGrid g;
  g.br = q.block_rows == 0 ? std::max<int64_t>(rows, 1) : q.block_rows;
  g.bc = q.block_cols == 0 ? std::max<int64_t>(cols, 1) : q.block_cols;
  g.nbr = (rows + g.br - 1) / g.br;
  g.nbc = (cols + g.bc - 1) / g.bc;
  return g;
}

namespace {

template <bool kDropNan>
std::vector<uint32_t> block_amax_bits_t(const BlockGrid& g, MatrixView<const float> x) {
  std::vector<uint32_t> amax(size_t(g.nbr * g.nbc), 0u);
  if (amax.empty()) return amax;
  if (g.nbr * g.nbc == 1) {
    uint32_t m = 0;
#pragma omp parallel for reduction(max : m) schedule(static)
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* xr = x.data + r * x.stride;
      uint32_t mr = 0;
      for (int64_t c = 0; c < x.cols; ++c) mr = std::max(mr, amax_bits_of(xr[c], kDropNan));
      m = std::max(m, mr);
    }
    amax[0] = m;
    return amax;
  }
  if (g.bc >= 8) {
    // Wide blocks: reduce each row segment directly (no per-column buffer).
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < g.nbr; ++i) {
      uint32_t* out = amax.data() + i * g.nbc;
      const int64_t r1 = std::min(x.rows, (i + 1) * g.br);
      for (int64_t r = i * g.br; r < r1; ++r) {
        const float* xr = x.data + r * x.stride;
        for (int64_t j = 0; j < g.nbc; ++j) {
          const int64_t c0 = j * g.bc, c1 = std::min(x.cols, c0 + g.bc);
          uint32_t m = out[j];
          for (int64_t c = c0; c < c1; ++c) m = std::max(m, amax_bits_of(xr[c], kDropNan));
          out[j] = m;
        }
      }
    }
    return amax;
  }
#pragma omp parallel
  {
    std::vector<uint32_t> colmax(static_cast<size_t>(x.cols));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < g.nbr; ++i) {
      std::fill(colmax.begin(), colmax.end(), 0u);
      const int64_t r1 = std::min(x.rows, (i + 1) * g.br);
      for (int64_t r = i * g.br; r < r1; ++r) {
        const float* xr = x.data + r * x.stride;
        uint32_t* cm = colmax.data();
        for (int64_t c = 0; c < x.cols; ++c) cm[c] = std::max(cm[c], amax_bits_of(xr[c], kDropNan));
      }
      for (int64_t j = 0; j < g.nbc; ++j) {
        const int64_t c1 = std::min(x.cols, (j + 1) * g.bc);
        uint32_t m = 0;
        for (int64_t c = j * g.bc; c < c1; ++c) m = std::max(m, colmax[size_t(c)]);
        amax[size_t(i * g.nbc + j)] = m;
      }
    }
  }
  return amax;
}

}  // namespace

std::vector<uint32_t> block_amax_bits(const BlockGrid& g, MatrixView<const float> x, bool drop_nan) {
  return drop_nan ? block_amax_bits_t<true>(g, x) : block_amax_bits_t<false>(g, x);
}

namespace {

// The amax of each outer domain of R (sim/block_rule.hpp's OuterAmax): one word for none (0) and the tensor,
// one per block row for rows.
std::vector<uint32_t> outer_amax_bits(OuterAmax o, const BlockGrid& g, const std::vector<uint32_t>& amax) {
  if (o == OuterAmax::none) return {0u};
  if (o == OuterAmax::tensor) return {amax.empty() ? 0u : *std::max_element(amax.begin(), amax.end())};
  std::vector<uint32_t> rows(size_t(g.nbr), 0u);
  for (int64_t i = 0; i < g.nbr; ++i)
    for (int64_t j = 0; j < g.nbc; ++j) rows[size_t(i)] = std::max(rows[size_t(i)], amax[size_t(i * g.nbc + j)]);
  return rows;
}

// Steps 1-2 of the pipeline under rule R: block amaxes, the outer amaxes and R's globals, each block's choice.
template <class R>
BlockScales block_scales_with(const QuantizerSpec& q, const typename R::Params& p, MatrixView<const float> x,
                              RandomStream rs = {}) {
  BlockScales b;
  b.grid = block_grid(q, x.rows, x.cols);
  const BlockGrid& g = b.grid;
  const std::vector<uint32_t> amax = block_amax_bits(g, x, amax_drops_nan<R>(p));
  const size_t n = amax.size();
  b.has_codes = q.scale != &float32;
  b.scale_codes.assign(b.has_codes ? n : 0, 0);
  b.scales.assign(n, 0.0f);
  b.mult.assign(n, 0.0f);
  b.flags.assign(n, 0);
  const OuterAmax outer = R::outer(p);
  const std::vector<uint32_t> oa = outer_amax_bits(outer, g, amax);
  std::vector<typename R::Global> gl;
  gl.reserve(oa.size());
  for (uint32_t a : oa) gl.push_back(R::global(p, a));
  // One global decode scale for the tensor: a rule with an amax per row has g_dec 1 for every row.
  b.g_dec = R::g_dec(gl.empty() ? R::global(p, 0u) : gl[0]);
  const auto at = [&](int64_t r, int64_t c) { return x(r, c); };
  auto store = [&](size_t i, const BlockChoice& c) {
    if (b.has_codes) b.scale_codes[i] = uint8_t(c.code);
    b.scales[i] = c.scale;
    b.mult[i] = c.mult;
    b.flags[i] = c.flags;
  };
  if constexpr (requires { R::run_blocks; }) {
    // Runs of R::run_blocks blocks along the block axis (a block row for blocks one row high, else a block
    // column), one choose_run call each (sim/block_rule.hpp).
    constexpr int64_t k = R::run_blocks;
    const bool along_row = g.br == 1;
    const int64_t lines = along_row ? g.nbr : g.nbc, per_line = ((along_row ? g.nbc : g.nbr) + k - 1) / k;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < lines * per_line; ++t) {
      const int64_t line = t / per_line, first = (t % per_line) * k;
      const int64_t bi = along_row ? line : first, bj = along_row ? first : line;
      BlockChoice out[k];
      const int m = R::choose_run(p, gl[0], at, BlockAt{x.rows, x.cols, g.br, g.bc, bi, bj, rs.seed, rs.stream}, out);
      for (int j = 0; j < m; ++j)
        store(size_t(along_row ? bi * g.nbc + bj + j : (bi + j) * g.nbc + bj), out[j]);
    }
    return b;
  }
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const int64_t bi = int64_t(i) / g.nbc, bj = int64_t(i) - bi * g.nbc;
    const BlockChoice c = R::choose(p, gl[outer == OuterAmax::rows ? size_t(bi) : 0], amax[i], at,
                                    BlockAt{x.rows, x.cols, g.br, g.bc, bi, bj, rs.seed, rs.stream});
    store(i, c);
  }
  return b;
}

}  // namespace

BlockScales compute_block_scales(const QuantizerSpec& q, MatrixView<const float> x) {
  return with_block_rule(q, [&]<class R>(const typename R::Params& p) { return block_scales_with<R>(q, p, x); });
}

// ---------------------------------------------------------------------------
// element encoding
// ---------------------------------------------------------------------------

std::array<float, 256> decode_table(const Format& f) {
  std::array<float, 256> t{};
  for (uint32_t c = 0; c < 256; ++c) t[c] = c < f.code_count() ? decode(f, c) : quiet_nan_f();
  return t;
}

namespace {

// Dequantized values of a chunk: dq[i] = (value(code[i]) * scale) * gd, one
// scale per element (cs) or one for the chunk (sc, cs null). value() is core's
// branch-free decode_f32<F>, the bits of decode() (the table's entries) for
// every code (tests/core/test_format.cpp), so this loop vectorises where the
// table lookup did not.
template <const Format& F>
inline void dequant_chunk(const uint32_t* code, const float* cs, float sc, float gd, float* dq, int64_t n) {
  if (cs) {
    for (int64_t i = 0; i < n; ++i) dq[i] = (decode_f32<F>(code[i]) * cs[i]) * gd;
  } else {
    for (int64_t i = 0; i < n; ++i) dq[i] = (decode_f32<F>(code[i]) * sc) * gd;
  }
}

// Row kernel of the RN fast path: y = x * m (or x / m), branch-free encode.
template <const Format& F, bool Divide>
void row_rn_fast(const float* xr, const float* cm, const float* cs, float gd, const float* /*tab*/, Overflow o,
                 uint8_t* codes, float* dq, int64_t n) {
  // Chunks through a local code buffer: the encode loop has no aliasing
  // (dq may be xr itself in fake_quantize) and vectorises; the codes and the
  // dequantized values (dequant_chunk) follow in loops of their own.
  constexpr int64_t K = 256;
  uint32_t code[K];
  for (int64_t c0 = 0; c0 < n; c0 += K) {
    const int64_t m = std::min(K, n - c0);
    const float* x = xr + c0;
    const float* mu = cm + c0;
    for (int64_t i = 0; i < m; ++i) {
      const float y = Divide ? x[i] / mu[i] : x[i] * mu[i];
      code[i] = encode_rn_f32<F>(y, o);
    }
    for (int64_t i = 0; i < m; ++i) codes[c0 + i] = uint8_t(code[i]);
    dequant_chunk<F>(code, cs + c0, 0.0f, gd, dq + c0, m);
  }
}

// Wide blocks (bc >= 8): per-block constants, no per-column parameter arrays.
template <const Format& F, bool Divide>
void row_rn_blocks(const float* xr, const float* bm, const float* bs, int64_t bc, float gd, const float* /*tab*/,
                   Overflow o, uint8_t* codes, float* dq, int64_t n) {
  constexpr int64_t K = 256;
  uint32_t code[K];
  for (int64_t b0 = 0, j = 0; b0 < n; b0 += bc, ++j) {
    const float m = bm[j], sc = bs[j];
    const int64_t b1 = std::min(n, b0 + bc);
    for (int64_t c0 = b0; c0 < b1; c0 += K) {
      const int64_t len = std::min(K, b1 - c0);
      const float* x = xr + c0;
      for (int64_t i = 0; i < len; ++i) {
        const float y = Divide ? x[i] / m : x[i] * m;
        code[i] = encode_rn_f32<F>(y, o);
      }
      for (int64_t i = 0; i < len; ++i) codes[c0 + i] = uint8_t(code[i]);
      dequant_chunk<F>(code, nullptr, sc, gd, dq + c0, len);
    }
  }
}

using BlockRowFn = void (*)(const float*, const float*, const float*, int64_t, float, const float*, Overflow, uint8_t*,
                            float*, int64_t);

template <bool Divide>
BlockRowFn block_row_fn(const Format& f) {
  BlockRowFn r = nullptr;
  with_fast_element_format(f, [&]<const Format & F>() { r = row_rn_blocks<F, Divide>; });
  return r;
}

using RowFn = void (*)(const float*, const float*, const float*, float, const float*, Overflow, uint8_t*, float*,
                       int64_t);

template <bool Divide>
RowFn fast_row_fn(const Format& f) {
  RowFn r = nullptr;
  with_fast_element_format(f, [&]<const Format & F>() { r = row_rn_fast<F, Divide>; });
  return r;
}

// The random values of stochastic rounding of row r's `cols` elements
// (core/sr.hpp: element c's value, right-aligned, sr_width bits, from word
// r * words_per_row + c / G of rs): a pointer to cols of them, either the
// words themselves (per_element: the whole word) or rv's extracted values.
// `words`, `rv`: per-thread scratch.
const uint32_t* row_random_values(const QuantizerSpec& q, RandomStream rs, int64_t r, int64_t cols,
                                  std::vector<uint32_t>& words, std::vector<uint32_t>& rv) {
  const Format& f = *q.element;
  const int G = sr_group(q.sr_bits, f);
  const int64_t per_row = sr_words_per_row(q.sr_bits, f, cols);
  const uint64_t w0 = uint64_t(r) * uint64_t(per_row);
  const uint32_t* w;
  if (rs.words) {
    w = rs.words + w0;
  } else {
    // Whole Philox groups of four words covering the row's words.
    const uint64_t g0 = w0 >> 2, g1 = (w0 + uint64_t(per_row) + 3) >> 2;
    words.resize(size_t(4 * (g1 - g0)));
    philox_groups(rs.seed, rs.stream, g0, g1 - g0, words.data());
    w = words.data() + (w0 & 3u);
  }
  if (G == 1) return w;  // per_element: the whole word
  rv.resize(size_t(cols));
  for (int64_t c = 0; c < cols; ++c) rv[size_t(c)] = sr_element_bits(q.sr_bits, f, w[c / G], int(c % G));
  return rv.data();
}

// Stochastic rounding of a row with the branch-free encoder (encode_rs_f32,
// identical to encode(rs) with W-bit random values rv, row_random_values).
using SrRowFn = void (*)(const float*, const float*, const float*, float, const float*, Overflow, const uint32_t*,
                         uint8_t*, float*, int64_t);

template <const Format& F, bool Divide, int W>
void row_rs_fast(const float* x, const float* m, const float* cs, float gd, const float* /*tab*/, Overflow o,
                 const uint32_t* rv, uint8_t* codes, float* dq, int64_t n) {
  constexpr int64_t K = 256;
  uint32_t code[K];
  for (int64_t c0 = 0; c0 < n; c0 += K) {
    const int64_t len = std::min(K, n - c0);
    for (int64_t i = 0; i < len; ++i) {
      const float y = Divide ? x[c0 + i] / m[c0 + i] : x[c0 + i] * m[c0 + i];
      code[i] = encode_rs_f32<F, W>(y, rv[c0 + i], o);
    }
    for (int64_t i = 0; i < len; ++i) codes[c0 + i] = uint8_t(code[i]);
    dequant_chunk<F>(code, cs + c0, 0.0f, gd, dq + c0, len);
  }
}

// The fast SR row of element format f with W-bit random values (32, or the
// 8 of the PTX contract), nullptr where there is none.
template <bool Divide>
SrRowFn sr_row_fn(const Format& f, int W) {
  SrRowFn r = nullptr;
  with_fast_element_format(f, [&]<const Format & F>() {
    if (W == 32) r = row_rs_fast<F, Divide, 32>;
    if constexpr (F.man_bits <= 15)
      if (W == 8) r = row_rs_fast<F, Divide, 8>;
  });
  return r;
}

// Generic row kernel: any rounding mode (SR: the random values rv of
// row_random_values, W bits each), through the encoder itself.
void row_generic(const MultEncoder& enc, float g_dec, const float* xr, const float* cm, const float* cs,
                 const float* tab, const uint32_t* rv, uint8_t* codes, float* dq, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const uint32_t code = enc.code(cm[c], xr[c], rv ? rv[c] : 0u);
    codes[c] = uint8_t(code);
    dq[c] = (tab[code] * cs[c]) * g_dec;
  }
}

// Step 3 for a rule whose elements are the standard encoder's (R::mult_encoder): the rows of x (already
// RHT-transformed if the spec says so) with the block scales b, vectorised where the mode allows; writes
// dequant (row-major, stride out_stride) and, if codes_out is not null, the element codes (contiguous
// rows*cols). q.element is the encoder's format (dispatched by address).
void mult_rows(const QuantizerSpec& q, const MultEncoder& enc, const BlockScales& b, MatrixView<const float> x,
               RandomStream rs, float* dq_out, int64_t out_stride, uint8_t* codes_out) {
  const std::array<float, 256> tab = decode_table(*q.element);
  const bool divide = enc.divide;
  const bool fast = q.round == Round::rn;
  const RowFn fast_fn = fast ? (divide ? fast_row_fn<true>(*q.element) : fast_row_fn<false>(*q.element)) : nullptr;
  const bool sr = q.round == Round::rs;
  const int W = sr_width(q.sr_bits, *q.element);
  const SrRowFn sr_fn = sr ? (divide ? sr_row_fn<true>(*q.element, W) : sr_row_fn<false>(*q.element, W)) : nullptr;
  const BlockGrid& g = b.grid;
  const int64_t cols = x.cols;
  const BlockRowFn block_fn =
      fast && g.bc >= 8 ? (divide ? block_row_fn<true>(*q.element) : block_row_fn<false>(*q.element)) : nullptr;
  if (block_fn) {
#pragma omp parallel
    {
      std::vector<uint8_t> cb(static_cast<size_t>(cols));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < x.rows; ++r) {
        const size_t bi = size_t((r / g.br) * g.nbc);
        uint8_t* codes = codes_out ? codes_out + r * cols : cb.data();
        block_fn(x.data + r * x.stride, b.mult.data() + bi, b.scales.data() + bi, g.bc, b.g_dec, tab.data(), q.overflow,
                 codes, dq_out + r * out_stride, cols);
      }
    }
    return;
  }
#pragma omp parallel
  {
    std::vector<float> cm(static_cast<size_t>(cols)), cs(static_cast<size_t>(cols));
    std::vector<uint8_t> cb(static_cast<size_t>(cols));
    std::vector<uint32_t> rv, words;
    int64_t cached = -1;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < x.rows; ++r) {
      const int64_t bi = r / g.br;
      if (bi != cached) {
        cached = bi;
        for (int64_t j = 0; j < g.nbc; ++j) {
          const int64_t c1 = std::min(cols, (j + 1) * g.bc);
          const float m = b.mult[size_t(bi * g.nbc + j)], s = b.scales[size_t(bi * g.nbc + j)];
          for (int64_t c = j * g.bc; c < c1; ++c) {
            cm[size_t(c)] = m;
            cs[size_t(c)] = s;
          }
        }
      }
      const float* xr = x.data + r * x.stride;
      float* dq = dq_out + r * out_stride;
      uint8_t* codes = codes_out ? codes_out + r * cols : cb.data();
      const uint32_t* rbits = sr ? row_random_values(q, rs, r, cols, words, rv) : nullptr;
      if (fast_fn) {
        fast_fn(xr, cm.data(), cs.data(), b.g_dec, tab.data(), q.overflow, codes, dq, cols);
      } else if (sr_fn) {
        sr_fn(xr, cm.data(), cs.data(), b.g_dec, tab.data(), q.overflow, rbits, codes, dq, cols);
      } else {
        row_generic(enc, b.g_dec, xr, cm.data(), cs.data(), tab.data(), rbits, codes, dq, cols);
      }
    }
  }
}

// Step 3 for any rule, element by element through R::encode (the rule's own arithmetic; SR values under the
// spec's contract, row_random_values).
template <class R>
void element_rows(const QuantizerSpec& q, const typename R::Params& p, const BlockScales& b, MatrixView<const float> x,
                  RandomStream rs, float* dq_out, int64_t out_stride, uint8_t* codes_out) {
  const BlockGrid& g = b.grid;
  const bool sr = q.round == Round::rs;
#pragma omp parallel
  {
    std::vector<uint32_t> rv, words;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < x.rows; ++r) {
      const uint32_t* rbits = sr ? row_random_values(q, rs, r, x.cols, words, rv) : nullptr;
      const size_t bi = size_t((r / g.br) * g.nbc);
      for (int64_t c = 0; c < x.cols; ++c) {
        BlockChoice ch;
        ch.scale = b.scales[bi + size_t(c / g.bc)];
        ch.mult = b.mult[bi + size_t(c / g.bc)];
        const Element e = R::encode(p, ch, x(r, c), rbits ? rbits[c] : 0u);
        if (codes_out) codes_out[r * x.cols + c] = uint8_t(e.code);
        dq_out[r * out_stride + c] = dequant_value(e, ch, b.g_dec);
      }
    }
  }
}

// Step 3 under rule R: its own rows where it has them, the standard encoder's vectorised rows where it uses
// that encoder, else element by element.
template <class R>
void encode_tensor(const QuantizerSpec& q, const typename R::Params& p, const BlockScales& b, MatrixView<const float> x,
                   RandomStream rs, float* dq_out, int64_t out_stride, uint8_t* codes_out) {
  if constexpr (requires { R::encode_rows(p, b, x, rs, dq_out, out_stride, codes_out); }) {
    R::encode_rows(p, b, x, rs, dq_out, out_stride, codes_out);
  } else if constexpr (requires { R::mult_encoder(p); }) {
    mult_rows(q, R::mult_encoder(p), b, x, rs, dq_out, out_stride, codes_out);
  } else {
    element_rows<R>(q, p, b, x, rs, dq_out, out_stride, codes_out);
  }
}

// Steps 1-3 of x (in the quantizer's domain): its block scales, and its elements into dq_out / codes_out.
BlockScales quantize_rows(const QuantizerSpec& q, MatrixView<const float> x, RandomStream rs, float* dq_out,
                          int64_t out_stride, uint8_t* codes_out) {
  return with_block_rule(q, [&]<class R>(const typename R::Params& p) {
    BlockScales b = block_scales_with<R>(q, p, x, rs);
    encode_tensor<R>(q, p, b, x, rs, dq_out, out_stride, codes_out);
    return b;
  });
}

RhtAxis rht_axis(const QuantizerSpec& q) { return q.block_rows == 1 ? RhtAxis::rows : RhtAxis::cols; }

// Contiguous copy of x, RHT-transformed with the spec's signs and, under rht_output bf16, rounded to BF16
// (RN, NaN kept: the partial last chunk, which the RHT leaves as it is, too; quantizer_domain for a spec with rht).
std::vector<float> rht_copy(const QuantizerSpec& q, MatrixView<const float> x) {
  std::vector<float> t(static_cast<size_t>(x.rows * x.cols));
  for (int64_t r = 0; r < x.rows; ++r) std::memcpy(t.data() + r * x.cols, x.data + r * x.stride, size_t(x.cols) * 4);
  if (!q.rht) return t;
  const MatrixView<float> tv(t.data(), x.rows, x.cols);
  if (q.rht_kind == RhtKind::quartet2_128) {
    rht128_quartet2(tv, rht_axis(q), q.rht_seed, true);
    return t;
  }
  rht_forward(tv, rht_axis(q), rht_signs(q.rht_signs, q.rht_seed));
  if (q.rht_output == RhtOutput::bf16)
    for (float& v : t) v = rht_output_value(RhtOutput::bf16, v);
  return t;
}

}  // namespace

std::vector<float> quantizer_domain(const QuantizerSpec& q, MatrixView<const float> x) { return rht_copy(q, x); }

QuantizedTensor quantize(const QuantizerSpec& q, MatrixView<const float> x_in, RandomStream rs) {
  validate(q, "quantize");
  std::vector<float> transformed;
  MatrixView<const float> x = x_in;
  if (q.rht) {
    transformed = rht_copy(q, x_in);
    x = MatrixView<const float>(transformed.data(), x_in.rows, x_in.cols);
  }
  QuantizedTensor qt;
  qt.spec = q;
  qt.rows = x.rows;
  qt.cols = x.cols;
  qt.codes.assign(size_t(x.rows * x.cols), 0);
  qt.dequant.assign(size_t(x.rows * x.cols), 0.0f);
  BlockScales b = quantize_rows(q, x, rs, qt.dequant.data(), x.cols, qt.codes.data());
  qt.scale_rows = b.grid.nbr;
  qt.scale_cols = b.grid.nbc;
  qt.scale_codes = std::move(b.scale_codes);
  qt.scales = std::move(b.scales);
  qt.global_decode = b.g_dec;
  return qt;
}

void fake_quantize(const QuantizerSpec& q, MatrixView<float> x, RandomStream rs) {
  validate(q, "fake_quantize");
  if (q.rht) {
    std::vector<float> t = rht_copy(q, MatrixView<const float>(x.data, x.rows, x.cols, x.stride));
    quantize_rows(q, MatrixView<const float>(t.data(), x.rows, x.cols), rs, x.data, x.stride, nullptr);
    if (q.rht_kind == RhtKind::quartet2_128) {
      rht128_quartet2(x, rht_axis(q), q.rht_seed, false);
    } else {
      rht_inverse(x, rht_axis(q), rht_signs(q.rht_signs, q.rht_seed));
    }
    return;
  }
  quantize_rows(q, MatrixView<const float>(x.data, x.rows, x.cols, x.stride), rs, x.data, x.stride, nullptr);
}

QuantStats quant_stats(const QuantizedTensor& qt, MatrixView<const float> x_in) {
  if (x_in.rows != qt.rows || x_in.cols != qt.cols)
    throw Error("quant_stats: input shape [" + std::to_string(x_in.rows) + ", " + std::to_string(x_in.cols) +
                "] differs from the quantized tensor's [" + std::to_string(qt.rows) + ", " + std::to_string(qt.cols) +
                "]");
  std::vector<float> transformed;
  MatrixView<const float> x = x_in;
  if (qt.spec.rht) {
    transformed = rht_copy(qt.spec, x_in);
    x = MatrixView<const float>(transformed.data(), x_in.rows, x_in.cols);
  }
  QuantStats s;
  const BlockScales b = compute_block_scales(qt.spec, x);
  for (uint8_t f : b.flags) {
    s.scale_underflows += (f & flag_underflow) ? 1 : 0;
    s.scale_overflows += (f & flag_overflow) ? 1 : 0;
  }
  const ElementRule er = element_rule(*qt.spec.element);
  double sig = 0, err = 0, maxerr = 0;
  int64_t flushed = 0, nonzero = 0, saturated = 0;
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t c = 0; c < x.cols; ++c) {
      const float vf = x(r, c), df = qt.dequant[size_t(r * x.cols + c)];
      const double v = vf, d = df;
      sig += v * v;
      const double e = v - d;
      err += e * e;
      maxerr = std::isnan(e) || std::isnan(maxerr) ? std::nan("") : std::max(maxerr, std::fabs(e));
      // nonzero, flushed, saturated: sim/element_stats.hpp (the training statistics' definition too).
      const uint32_t f = element_flags(vf, df, qt.codes[size_t(r * x.cols + c)], er);
      nonzero += (f & kNumNonzero) ? 1 : 0;
      flushed += (f & kNumFlushed) ? 1 : 0;
      saturated += (f & kNumSaturated) ? 1 : 0;
    }
  }
  const double n = double(std::max<int64_t>(1, x.rows * x.cols));
  s.sqnr_db = err == 0 ? std::numeric_limits<double>::infinity() : 10.0 * std::log10(sig / err);
  s.max_abs_error = maxerr;
  s.flushed_to_zero = nonzero ? double(flushed) / double(nonzero) : 0.0;
  s.saturated = double(saturated) / n;
  return s;
}

}  // namespace fp4lab
