// TransformerEngine's Python reference NVFP4 quantizer (d0067d0da, pytorch/custom_recipes/reference_nvfp4.py,
// NVFP4QuantizerRef): `emulate: "te_reference"`. Its arithmetic is fp4lab's standard nv rule (TE's default
// kernels'), checked against it on 26 cases, except in two places read from its source and confirmed by the
// oracle (tests/cli/test_te_nvfp4.py):
//   - an all-zero tensor: S_enc = min(2688 / 0, FLT_MAX) = FLT_MAX (the reference resets S_enc to 1 only where
//     it is 0), so the global decode scale is fl(1 / FLT_MAX) = 2^-128; the kernels take S_enc = 1;
//   - a product y = x * e that is -0 (a -0.0 input, or a negative one whose product underflows): its
//     cast_to_fp4x2 takes the sign from y >= 0, so -0 is written as code 0x0; the kernels keep 0x8.
// [1,16], [16,1] or [16,16] blocks, round rn, the two-level scale, with or without TE's RHT (whose sums have no
// -0). The kernels' own arithmetic is the standard rule (`emulate: none`) and, under NVTE_USE_FAST_MATH,
// te_fast_math / te_fused_fast_math.
#pragma once

#include <cstdint>
#include <string>

#include "core/bits.hpp"
#include "core/hd.hpp"
#include "sim/block_rule.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

// validate()'s checks of emulate 'te_reference'; throws fp4lab::Error prefixed by `where`.
void validate_te_reference(const QuantizerSpec& q, const std::string& where);

struct TeReferenceRule {
  static constexpr BlockRuleId id = BlockRuleId::te_reference;
  using Params = StandardRule::Params;
  using Global = NvGlobal;

  static Params params(const QuantizerSpec& q) { return StandardRule::params(q); }
  FP4LAB_HD static OuterAmax outer(const Params& p) { return StandardRule::outer(p); }
  FP4LAB_HD static NvGlobal global(const Params& p, uint32_t amax_bits) {
    NvGlobal g = StandardRule::global(p, amax_bits);
    if (bits_float(amax_bits) == 0.0f) {  // S_enc = min(2688 / 0, FLT_MAX)
      g.g_enc = flt_max_f;
      g.g_dec = 1.0f / flt_max_f;
      g.mult = flt_max_f * (1.0f / max_finite(p.elem));
    }
    return g;
  }
  FP4LAB_HD static float g_dec(const NvGlobal& g) { return g.g_dec; }
  template <class X>
  FP4LAB_HD static BlockChoice choose(const Params& p, const NvGlobal& g, uint32_t amax, const X& view,
                                      const BlockAt& at) {
    return StandardRule::choose(p, g, amax, view, at);
  }
  FP4LAB_HD static Element encode(const Params& p, const BlockChoice& c, float x, uint32_t rbits) {
    const float y = x * c.mult;                                        // the standard encoder's product (nv multiplies)
    if (y == 0.0f && (float_bits(y) >> 31)) return Element{0u, 0.0f};  // -0 written as +0
    return StandardRule::encode(p, c, x, rbits);
  }
};

}  // namespace fp4lab
