// Quartet II's forward quantizer (schemes/quartet2/scalar.hpp) as a block rule behind the seam of
// sim/block_rule.hpp, and validate()'s checks of `emulate: "quartet2"` (spec.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "schemes/quartet2/scalar.hpp"
#include "sim/block_rule.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

// validate()'s checks of emulate 'quartet2'; throws fp4lab::Error prefixed by `where`.
void validate_quartet2(const QuantizerSpec& q, const std::string& where);
// validate()'s checks of emulate 'quartet2_triton' (schemes/quartet2/triton.hpp).
void validate_quartet2_triton(const QuantizerSpec& q, const std::string& where);

struct Quartet2Rule {
  static constexpr BlockRuleId id = BlockRuleId::quartet2;
  struct Params {
    bool four_six;  // candidates 6 and 4 (scale_select four_over_six), else 6 alone
  };
  using Global = Quartet2Tensor;

  static Params params(const QuantizerSpec& q) { return Params{q.scale_select == ScaleSelect::four_over_six}; }
  FP4LAB_HD static OuterAmax outer(const Params&) { return OuterAmax::tensor; }
  FP4LAB_HD static constexpr bool amax_drops_nan(const Params&) { return true; }
  FP4LAB_HD static Quartet2Tensor global(const Params& p, uint32_t amax_bits) {
    return quartet2_tensor(bits_float(amax_bits), p.four_six);
  }
  FP4LAB_HD static float g_dec(const Quartet2Tensor& g) { return g.s; }

  FP4LAB_HD static MultEncoder mult_encoder(const Params&) {
    constexpr Format e2m1 = float4_e2m1fn;  // a local copy: device code cannot refer to the host global
    return MultEncoder{e2m1, Round::rn, Overflow::saturate, false, false, 32};
  }
  FP4LAB_HD static Element encode(const Params& p, const BlockChoice& c, float x, uint32_t rbits) {
    return mult_encoder(p).element(c.mult, x, rbits);
  }

  // view(r, c) reads element (r, c) of the tensor; blocks are [1,16] (validate_quartet2).
  template <class X>
  FP4LAB_HD static BlockChoice choose(const Params& p, const Quartet2Tensor& g, uint32_t amax, const X& view,
                                      const BlockAt& at) {
    constexpr Format e4m3 = float8_e4m3fn;
    const float a = bits_float(amax);
    const int64_t c0 = at.bj * at.bc;
    const int n = int(at.cols - c0 < at.bc ? at.cols - c0 : at.bc);
    const float inv_v[2] = {1.0f / 6.0f, 1.0f / 4.0f};
    Quartet2Scale pick = quartet2_scale(a, inv_v[0], g);
    bool chosen = !p.four_six;
    if (p.four_six) {
      float best = bits_float(0x7F800000u);  // +Inf
      for (int i = 0; i < 2; ++i) {
        const Quartet2Scale s = i == 0 ? pick : quartet2_scale(a, inv_v[1], g);
        const MultEncoder enc = mult_encoder(p);
        const float descale = decode(e4m3, s.code) * g.s;
        const float err =
            quartet2_error([&](int t) { return float(view(at.bi, c0 + t)); },
                           [&](int t) { return enc.element(s.factor, view(at.bi, c0 + t), 0).value; }, n, descale);
        if (err < best) {
          best = err;
          pick = s;
          chosen = true;
        }
      }
    }
    BlockChoice b;
    b.code = pick.code;
    b.scale = decode(e4m3, pick.code);
    b.mult = pick.factor;
    b.flags =
        uint8_t((b.scale == 0.0f && a > 0.0f ? flag_underflow : 0) | (pick.overflow || !chosen ? flag_overflow : 0));
    return b;
  }
};

}  // namespace fp4lab
