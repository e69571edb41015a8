// The compact form of rows quantized with E8M0 block scales along the width:
// the transport of the MoE dispatch cast (model.moe.dispatch_cast mxfp8,
// train/moe.hpp), which sends each row as codes and scales instead of FP32.
//
// A row of C elements under a quantizer q with [1, B] blocks is
//   C element codes (one byte each, q.element's code), then
//   ceil(C / B) E8M0 scale codes (one byte each, block order),
// row_bytes = C + ceil(C / B) bytes (MXFP8 with B = 32: 1 + 1/32 bytes an
// element against FP32's 4). The last block of a row may be partial.
//
// One codec, not a second one: encoding is sim's quantizer pipeline for one
// block (the exact bit-pattern amax, sim/block_rule.hpp's StandardRule::choose
// for the scale, StandardRule::encode for each element) and decoding is core's
// decode() of the element and of the E8M0 code, multiplied as dequant_value
// does: (value * scale) * g_dec. So decode(encode(row)) is, bit for bit, the
// row fake_quantize(q, ...) writes (sim/quantizer.hpp), NaN/Inf blocks
// included (their scale code 0xFF decodes to NaN, as the quantizer's scale).
// FP4LAB_HD: the CPU backend's loops and the CUDA backend's kernels
// (train/cuda/moe_ops.cu) call these same functions.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "core/format.hpp"
#include "core/hd.hpp"
#include "sim/block_rule.hpp"
#include "sim/block_rules.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab::train {

// A quantizer's row codec for rows of `cols` elements (a kernel argument: trivially copyable).
struct MxRows {
  StandardRule::Params p;
  NvGlobal g;  // StandardRule::global without a global scale: g_dec 1
  int64_t cols = 0, block = 0;
  FP4LAB_HD int64_t scales() const { return (cols + block - 1) / block; }
  FP4LAB_HD int64_t row_bytes() const { return cols + scales(); }
};

// Whether q has a compact row form: fp4lab's own arithmetic (no emulation), an E8M0 rule of the MX kind,
// E8M0 scales, blocks [1, B], no RHT, no global scale, an element of at most 8 bits and a rounding that
// draws no random bits (not rs).
inline bool mx_rows_supported(const QuantizerSpec& q) {
  return block_rule_id(q) == BlockRuleId::standard && StandardRule::mx_rule(q.scale_rule) &&
         q.scale == &float8_e8m0fnu && q.block_rows == 1 && q.block_cols > 0 && !q.rht &&
         q.global_scale == GlobalScale::none && q.element->bits() <= 8 && q.round != Round::rs;
}

// The codec of q for rows of `cols` elements (fp4lab::Error unless mx_rows_supported(q)).
inline MxRows mx_rows(const QuantizerSpec& q, int64_t cols) {
  validate(q, "mx rows");
  if (!mx_rows_supported(q)) throw Error("mx rows: the quantizer " + describe(q) + " has no compact row form");
  FP4LAB_CHECK(cols >= 0, "mx rows: " + std::to_string(cols) + " columns");
  MxRows m;
  m.p = StandardRule::params(q);
  m.g = StandardRule::global(m.p, 0u);
  m.cols = cols;
  m.block = q.block_cols;
  return m;
}

// One block of a row: its n elements x[0, n) into codes[0, n); returns the block's E8M0 scale code.
FP4LAB_HD inline uint8_t mx_encode_block(const MxRows& m, const float* x, int64_t n, uint8_t* codes) {
  const bool drop_nan = amax_drops_nan<StandardRule>(m.p);
  uint32_t amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = amax_bits_of(x[i], drop_nan);
    amax = a > amax ? a : amax;
  }
  const BlockChoice c = StandardRule::choose(m.p, m.g, amax);
  for (int64_t i = 0; i < n; ++i) codes[i] = uint8_t(StandardRule::encode(m.p, c, x[i], 0u).code);
  return uint8_t(c.code);
}

// One row x[0, cols) into its row_bytes() bytes at out.
FP4LAB_HD inline void mx_encode_row(const MxRows& m, const float* x, uint8_t* out) {
  uint8_t* scale = out + m.cols;
  for (int64_t j = 0, c0 = 0; c0 < m.cols; ++j, c0 += m.block) {
    const int64_t n = m.cols - c0 < m.block ? m.cols - c0 : m.block;
    scale[j] = mx_encode_block(m, x + c0, n, out + c0);
  }
}

// The dequantized value of element code `code` in a block of E8M0 scale code `scale_code`.
FP4LAB_HD inline float mx_decode(const MxRows& m, uint8_t code, uint8_t scale_code) {
  BlockChoice c;
  c.scale = decode(m.p.sfmt, scale_code);  // 2^(s - 127); 0xFF: NaN, the quantizer's NaN scale
  return dequant_value(Element{code, decode(m.p.elem, code)}, c, StandardRule::g_dec(m.g));
}

// Element c of the row whose row_bytes() bytes are at in.
FP4LAB_HD inline float mx_decode_at(const MxRows& m, const uint8_t* in, int64_t c) {
  return mx_decode(m, in[c], in[m.cols + c / m.block]);
}

// mx_rows(q, cols) for `rows` rows in a buffer of `capacity` bytes (fp4lab::Error naming `what` if they do
// not fit).
MxRows mx_rows_for(const char* what, const QuantizerSpec& q, int64_t rows, int64_t cols, int64_t capacity);

// Host loops (train/mx_rows.cpp; rows in parallel, the same bytes and values for any thread count): `rows`
// rows of x [rows, cols] into rows * row_bytes() bytes at out, and back.
void mx_encode_rows(const MxRows& m, const float* x, int64_t rows, uint8_t* out);
void mx_decode_rows(const MxRows& m, const uint8_t* in, int64_t rows, float* x);

}  // namespace fp4lab::train
