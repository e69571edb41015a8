// Quantizers with `emulate: fp4tk` (sim/quantizer.hpp): fp4-trainkit's MXFP4
// and NVFP4 simulators computed with its own arithmetic (scalar.hpp has the
// scalar steps and their source), so that its results, and the collapse of
// its fp4_all_the_way recipe, can be reproduced and taken apart. A block rule
// (sim/block_rule.hpp) on the generic pipelines of both backends.
//
// Layout as every fp4lab quantizer: row-major [rows, cols] float32, 1-D blocks
// of K along rows ([1,K]) or columns ([K,1]). fp4-trainkit refuses a tensor
// whose block axis is not a multiple of K; here a partial last block follows
// fp4lab's rule (its amax over its valid elements), which fp4-trainkit would
// give if it padded with zeros.
//
// Codes: the element code is E2M1's code of the emulated value (always on the
// E2M1 grid); a NaN block gets E2M1 code 0x7 (E2M1 has no NaN; its dequant is
// NaN) and the scale format's NaN code. Scales are E8M0 codes of 2^e, or the
// E4M3 codes of the clamped amax / 6. Stochastic rounding takes element
// (r, c)'s random word as every per_element quantizer does (RandomStream) and
// uses its top 24 bits as torch.rand_like's uniform value. Dequant = s * v,
// which is (v * s) * 1, the seam's dequant_value with g_dec 1.
// Flags: flag_underflow a non-zero block whose scale the floor (2^-23 MX, 2^-9
// NVFP4) raised; flag_overflow an Inf amax (MX), or an NVFP4 amax / 6 above
// 448; flag_nan.
#pragma once

#include <string>

#include "core/encode.hpp"
#include "schemes/fp4tk/scalar.hpp"
#include "sim/block_rule.hpp"
#include "sim/block_scales.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

// Throws fp4lab::Error (prefixed by `where`) unless q is a spec fp4-trainkit
// has: e2m1 elements; scale e8m0 with rule ocp, ceil or tetrajet, or e4m3 /
// ue4m3 with nv_noglobal; a 1-D block; no global scale, no rht; round rn or
// rs with per_element bits; overflow saturate. (schemes/fp4tk/spec.cpp)
void validate_fp4tk(const QuantizerSpec& q, const std::string& where);

struct Fp4tkRule {
  static constexpr BlockRuleId id = BlockRuleId::fp4tk;
  struct Params {
    bool mx;             // E8M0 power-of-two scales (else NVFP4's E4M3 scale of amax / 6)
    Fp4tkMxRule mxrule;  // the MX exponent rule
    bool sr;             // round rs
  };
  struct Global {};

  static Params params(const QuantizerSpec& q) {
    const ScaleRule r = q.scale_rule;
    return Params{r != ScaleRule::nv_noglobal,
                  r == ScaleRule::ocp    ? Fp4tkMxRule::ocp
                  : r == ScaleRule::ceil ? Fp4tkMxRule::ceil
                                         : Fp4tkMxRule::tetrajet,
                  q.round == Round::rs};
  }
  FP4LAB_HD static OuterAmax outer(const Params&) { return OuterAmax::none; }
  FP4LAB_HD static Global global(const Params&, uint32_t) { return Global{}; }
  FP4LAB_HD static float g_dec(const Global&) { return 1.0f; }

  template <class X>
  FP4LAB_HD static BlockChoice choose(const Params& p, const Global&, uint32_t amax, const X& /*view*/,
                                      const BlockAt& /*at*/) {
    const float a = bits_float(amax);
    const bool nan = amax > 0x7F800000u, inf = amax == 0x7F800000u;
    BlockChoice b;
    b.flags = nan ? flag_nan : 0;
    if (p.mx) {
      b.scale = fp4tk_mx_scale(a, p.mxrule);
      // 2^e with e in [-23, 127] is normal: its E8M0 code is its exponent field.
      b.code = nan ? 0xFFu : float_bits(b.scale) >> 23;
      const float lead = p.mxrule == Fp4tkMxRule::ocp ? a / 4.0f : a / 6.0f;
      if (a > 0.0f && lead < fp4tk_eps) b.flags |= flag_underflow;
      if (inf) b.flags |= flag_overflow;
    } else {
      const float sf = fp4tk_nv_scale_f(a);
      constexpr Format e4m3 = float8_e4m3fn;  // a local copy: device code cannot refer to the host global
      b.code = nan ? e4m3.nan_code() : encode_rn_f32<float8_e4m3fn>(sf, Overflow::saturate);
      b.scale = nan ? quiet_nan_f() : decode_f32<float8_e4m3fn>(b.code);
      if (a > 0.0f && a / 6.0f < 0.001953125f) b.flags |= flag_underflow;
      if (!nan && a / 6.0f > 448.0f) b.flags |= flag_overflow;
    }
    b.mult = b.scale;
    return b;
  }

  // v = fp4tk_e2m1(x / s) with the word's noise under SR; code E2M1's code of v (0x7 for NaN).
  FP4LAB_HD static Element encode(const Params& p, const BlockChoice& c, float x, uint32_t rbits) {
    const float v = fp4tk_e2m1(x / c.scale, p.sr, p.sr ? fp4tk_noise(rbits) : 0.0f);
    return Element{v != v ? 0x7u : encode_rn_f32<float4_e2m1fn>(v, Overflow::saturate), v};
  }

  // The CPU's rows (schemes/fp4tk/cpu_rows.cpp): the elements of x with the scales b through
  // fp4tk_e2m1_fast, which vectorises (the libm form was 82% of an fp4tk recipe's training step); the same
  // bits as encode() element by element (schemes/fp4tk/test_fp4tk_bits.cpp).
  static void encode_rows(const Params& p, const BlockScales& b, MatrixView<const float> x, RandomStream rs,
                          float* dq_out, int64_t out_stride, uint8_t* codes_out);
};

}  // namespace fp4lab
