// Quartet II's Triton simulation of its backward quantizer, MS-EDEN (src/models/quantization/schemes/
// quartet_2.py at 8776a90b: eden_1x16s_fp4_kernel, the quantizer of every backward GEMM operand in the paper's
// runs): `emulate: "quartet2_eden_triton"`. The kernel cuts the operand, flattened as its GEMM reads it, into
// chunks of 128; fp4lab's chunk is 128 consecutive elements along the block axis (a row segment for [1,16]
// blocks, a column segment for [16,1]: the transposed operand's rows), after the rotation (rht_kind
// quartet2_128, sim/rht.hpp) or none (the peer with H = I). `/` is Triton's fp32 division, div.full.f32
// (core/ptx_approx.hpp's div_full):
//   vmax  = float(6 / ((17/16) * 0.93))                 the backward's scale_override
//   s_dec = amax == 0 ? 1 : amax / 255.99 / vmax         amax: the rotated tensor's (the peer passes it in)
//   each 16-group k of a chunk: a16 = max |x|;  s8_k = e4m3_rn_satfinite(a16 / vmax / s_dec), 1 where it is 0;
//     p_k = fl(s8_k * s_dec);  y = x / p_k;  q = rtn_fp4(y) (schemes/quartet2/triton.hpp: ties away from
//     zero, saturating at 6, sign y > 0 ? + : -)
//   each chunk: num = sum y*y, den = sum y*q, in FP32, in element order; corr = den == 0 ? 1 : num / den
//   each group: c = fl(s8_k * corr); b = e4m3_rn_satfinite(c) (a bit pattern); cur, prev, next = the E4M3
//     values of b, b - 1, b + 1; (up, down) = cur > c ? (cur, prev) : (next, cur); prob = (c - down) / (up - down)
//     u = tl.rand(seed, o), o the group's index in the operand's memory order (row-major for [1,16], the
//       transpose's for [16,1]): the word random_bits(seed, stream, 4 o) (Triton's Philox: stream 0) as int32
//       w, then fl(float(w < 0 ? -w - 1 : w) * 4.6566127342e-10f)
//     scale = u < prob ? up : down (the scale rounded stochastically between adjacent E4M3 values)
//   out = fl(fl(q * scale) * s_dec)
// fp4lab writes q's E2M1 codes, the chosen scales' E4M3 codes and values, and s_dec as the global decode, so its
// dequant is the peer's output bit for bit. Not modelled: the order of the peer's tl.sum trees (FP32 sums
// whose last bits move prob or c; the output changes only where u lies within that distance of prob, or c that
// close to an E4M3 rounding boundary) and non-finite inputs. The peer needs whole chunks; fp4lab takes a partial
// last chunk (the axis not a multiple of 128) as a chunk of its own, and a partial last group likewise. The paper's
// CUDA kernels (sm_100) compute the correction per 16-group with a different global scale; they are not this rule.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/hd.hpp"
#include "core/philox.hpp"
#include "core/ptx_approx.hpp"
#include "schemes/quartet2/triton.hpp"
#include "sim/block_rule.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

// validate()'s checks of emulate 'quartet2_eden_triton'; throws fp4lab::Error prefixed by `where`.
void validate_quartet2_eden_triton(const QuantizerSpec& q, const std::string& where);

// Triton's tl.rand: the uniform float of a Philox word (triton/language/random.py, uint_to_uniform_float).
FP4LAB_HD inline float triton_uniform(uint32_t word) {
  const int32_t w = int32_t(word);
  return float(w < 0 ? -w - 1 : w) * 4.6566127342e-10f;
}

struct Quartet2EdenTritonRule {
  static constexpr BlockRuleId id = BlockRuleId::quartet2_eden_triton;
  static constexpr int chunk = 128;  // the EDEN correction's domain: 8 groups of 16
  struct Params {
    float vmax;
  };
  struct Global {
    float s_dec;
  };

  static Params params(const QuantizerSpec&) { return Params{float(6.0 / ((17.0 / 16.0) * 0.93))}; }
  FP4LAB_HD static OuterAmax outer(const Params&) { return OuterAmax::tensor; }
  FP4LAB_HD static Global global(const Params& p, uint32_t amax_bits) {
    const float amax = bits_float(amax_bits);
    return Global{amax == 0.0f ? 1.0f : div_full(div_full(amax, 255.99f), p.vmax)};
  }
  FP4LAB_HD static float g_dec(const Global& g) { return g.s_dec; }

  // s8 of a 16-group with amax a16, after the zero-to-1 replacement.
  FP4LAB_HD static float group_s8(const Params& p, const Global& g, float a16) {
    constexpr Format e4m3 = float8_e4m3fn;  // a local copy: device code cannot refer to the host global
    const float s8 =
        decode(e4m3, encode_rn_f32<float8_e4m3fn>(div_full(div_full(a16, p.vmax), g.s_dec), Overflow::saturate));
    return s8 == 0.0f ? 1.0f : s8;
  }

  // The choices of the groups of the 128-chunk that block `at` lies in, in order along the block axis, into
  // out[0 ..]; returns how many (8, or fewer in a partial chunk). view(r, c) reads element (r, c); blocks are
  // [1,16] or [16,1] (validate).
  static constexpr int run_blocks = chunk / 16;
  template <class X>
  FP4LAB_HD static int chunk_choices(const Params& p, const Global& g, const X& view, const BlockAt& at,
                                     BlockChoice* out) {
    constexpr Format e4m3 = float8_e4m3fn;
    const bool rows = at.br == 1;
    const int64_t line = rows ? at.bi : at.bj, pos = rows ? at.bj * at.bc : at.bi * at.br;  // a group's start
    const int64_t len = rows ? at.cols : at.rows, c0 = pos / chunk * chunk;
    const int64_t c1 = c0 + chunk < len ? c0 + chunk : len;
    auto x_at = [&](int64_t k) { return float(rows ? view(line, k) : view(k, line)); };
    float num = 0.0f, den = 0.0f, s8[run_blocks], pk[run_blocks], a16[run_blocks];
    int n = 0;
    for (int64_t k0 = c0; k0 < c1; k0 += 16, ++n) {
      const int64_t k1 = k0 + 16 < c1 ? k0 + 16 : c1;
      float a = 0.0f;
      for (int64_t k = k0; k < k1; ++k) {
        const float v = fabsf(x_at(k));
        a = v > a ? v : a;
      }
      a16[n] = a;
      s8[n] = group_s8(p, g, a);
      pk[n] = s8[n] * g.s_dec;
      for (int64_t k = k0; k < k1; ++k) {
        const float y = div_full(x_at(k), pk[n]);
        const float q = Quartet2TritonRule::rtn_fp4(y).value;
        num = num + y * y;
        den = den + y * q;
      }
    }
    const float corr = den == 0.0f ? 1.0f : div_full(num, den);
    for (int k = 0; k < n; ++k) {
      const float c = s8[k] * corr;
      const uint32_t b = encode_rn_f32<float8_e4m3fn>(c, Overflow::saturate);
      const float cur = decode(e4m3, b), prev = decode(e4m3, (b - 1u) & 0xFFu);
      const float next = decode(e4m3, (b + 1u) & 0xFFu);
      const bool above = cur > c;
      const float up = above ? cur : next, down = above ? prev : cur;
      const float prob = div_full(c - down, up - down);
      const int64_t start = c0 + 16 * k, o = (rows ? line * at.cols + start : line * at.rows + start) / 16;
      const bool take_up = triton_uniform(random_bits(at.seed, at.stream, 4u * uint64_t(o))) < prob;
      BlockChoice& ch = out[k];
      ch.code = take_up ? (above ? b : b + 1u) : (above ? (b - 1u) & 0xFFu : b);
      ch.scale = take_up ? up : down;
      ch.mult = pk[k];  // the divisor of the elements
      const bool over = c == c && is_nan_code(e4m3, encode_rn_f32<float8_e4m3fn>(c, Overflow::nonsaturate));
      ch.flags = uint8_t((over ? flag_overflow : 0) | (ch.scale == 0.0f && a16[k] > 0.0f ? flag_underflow : 0));
    }
    return n;
  }
  // One block's choice (the CUDA scale kernel's thread per block): its chunk's, computed whole.
  template <class X>
  FP4LAB_HD static BlockChoice choose(const Params& p, const Global& g, uint32_t /*amax*/, const X& view,
                                      const BlockAt& at) {
    BlockChoice out[run_blocks];
    chunk_choices(p, g, view, at, out);
    const int64_t pos = at.br == 1 ? at.bj * at.bc : at.bi * at.br;
    return out[pos % chunk / 16];
  }
  // The CPU pipeline's form (sim/block_rule.hpp's choose_run): one call per chunk.
  template <class X>
  static int choose_run(const Params& p, const Global& g, const X& view, const BlockAt& first, BlockChoice* out) {
    return chunk_choices(p, g, view, first, out);
  }
  FP4LAB_HD static Element encode(const Params&, const BlockChoice& c, float x, uint32_t /*rbits*/) {
    return Quartet2TritonRule::rtn_fp4(div_full(x, c.mult));
  }
};

}  // namespace fp4lab
