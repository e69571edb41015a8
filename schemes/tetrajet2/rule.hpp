// TetraJet-v2's double-block quantizer (schemes/tetrajet2/scalar.hpp) as a block rule behind the seam of
// sim/block_rule.hpp: each [1,16] block reads its own 1x128 row segment through the view for the outer scale
// (no outer amax level in the pipeline: the segment's max is recomputed per block, 8 reads of 128 values), and
// validate()'s checks (spec.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "schemes/tetrajet2/scalar.hpp"
#include "sim/block_rule.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

// validate()'s checks of emulate 'tetrajet2_*'; throws fp4lab::Error prefixed by `where`.
void validate_tetrajet2(const QuantizerSpec& q, const std::string& where);

struct Tetrajet2Rule {
  static constexpr BlockRuleId id = BlockRuleId::tetrajet2;
  static constexpr int64_t outer_cols = 128;  // the outer block: 1x128 row segments
  struct Params {
    Tetrajet2Math math;
  };
  struct Global {};

  static Params params(const QuantizerSpec& q) {
    return Params{q.emulate == Emulation::tetrajet2_triton   ? Tetrajet2Math::triton
                  : q.emulate == Emulation::tetrajet2_kernel ? Tetrajet2Math::kernel
                                                             : Tetrajet2Math::source};
  }
  FP4LAB_HD static OuterAmax outer(const Params&) { return OuterAmax::none; }
  FP4LAB_HD static Global global(const Params&, uint32_t) { return Global{}; }
  FP4LAB_HD static float g_dec(const Global&) { return 1.0f; }  // the scales are os * dec(s)

  // view(r, c) reads element (r, c); blocks are [1,16] (validate_tetrajet2).
  template <class X>
  FP4LAB_HD static BlockChoice choose(const Params& p, const Global&, uint32_t /*amax*/, const X& view,
                                      const BlockAt& at) {
    const int64_t c0 = at.bj * at.bc, s0 = c0 / outer_cols * outer_cols;
    const int64_t s1 = s0 + outer_cols < at.cols ? s0 + outer_cols : at.cols;
    const int64_t c1 = c0 + at.bc < at.cols ? c0 + at.bc : at.cols;
    float a128 = 0.0f, a16 = 0.0f;  // magnitudes are >= 0: max from 0 as from -Inf
    for (int64_t c = s0; c < s1; ++c) {
      const float a = tetrajet2_abs(p.math, float(view(at.bi, c)));
      a128 = a > a128 ? a : a128;
      if (c >= c0 && c < c1) a16 = a > a16 ? a : a16;
    }
    const Tetrajet2Block b = tetrajet2_block(p.math, a16, tetrajet2_outer_scale(p.math, a128));
    BlockChoice ch;
    ch.code = b.code;
    ch.scale = b.sp;
    ch.mult = b.factor;
    ch.flags = uint8_t((b.overflow ? flag_overflow : 0) | (b.sp == 0.0f && a16 > 0.0f ? flag_underflow : 0));
    return ch;
  }
  FP4LAB_HD static Element encode(const Params& p, const BlockChoice& c, float x, uint32_t /*rbits*/) {
    constexpr Format e2m1 = float4_e2m1fn;  // a local copy: device code cannot refer to the host global
    const uint32_t code = encode_rn_f32<float4_e2m1fn>(tetrajet2_scaled(p.math, x, c.mult), Overflow::saturate);
    return Element{code, decode(e2m1, code)};
  }
};

}  // namespace fp4lab
