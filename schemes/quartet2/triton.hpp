// Quartet II's Triton simulation of its forward NVFP4 round-to-nearest quantizer (the quantizer of the paper's
// runs: src/models/quantization/quantizers/nvfp4_triton.py at 8776a90b, rtn_1x16s_fp4_kernel with
// four_over_six False, scale_override 1): `emulate: "quartet2_triton"`. Per tensor and 16-element block, `/` is
// Triton's fp32 division, div.full.f32 (core/ptx_approx.hpp's div_full):
//   s_dec = amax == 0 ? 1 : amax / 448 / 6           amax: torch's x.abs().max() (NaN propagates)
//   s8    = e4m3_rn_satfinite(a16 / 6 / s_dec)       (float8e4nv), then 1 where it is 0
//   p     = fl(s8 * s_dec)                            the block's scale product
//   q     = rtn_fp4(x / p)                            thresholds >= 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5: E2M1
//                                                     rounded to nearest, ties away from zero (round "rna"),
//                                                     saturating at 6; its sign is x / p > 0 ? + : -, so a
//                                                     quotient of +0 (or NaN) gives -0
//   out   = q * p                                     the only output (a fake quantizer)
// fp4lab writes the E4M3 code of s8 before the zero-to-1 replacement, p as the decoded scale (so scales are not
// decode(code)) and global decode 1, so its dequant is q * p bit for bit. Its 4/6 variant sums errors with
// tl.sum (a tree whose order the compiler picks) and is not modelled; the CUDA kernels' arithmetic is
// emulate quartet2 (schemes/quartet2/scalar.hpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/hd.hpp"
#include "core/ptx_approx.hpp"
#include "sim/block_rule.hpp"

namespace fp4lab {

struct Quartet2TritonRule {
  static constexpr BlockRuleId id = BlockRuleId::quartet2_triton;
  struct Params {};
  struct Global {
    float s_dec;
  };

  static Params params(const QuantizerSpec&) { return Params{}; }
  FP4LAB_HD static OuterAmax outer(const Params&) { return OuterAmax::tensor; }
  FP4LAB_HD static Global global(const Params&, uint32_t amax_bits) {
    const float amax = bits_float(amax_bits);
    return Global{amax == 0.0f ? 1.0f : div_full(div_full(amax, 448.0f), 6.0f)};
  }
  FP4LAB_HD static float g_dec(const Global&) { return 1.0f; }  // the scales are the products s8 * s_dec

  template <class X>
  FP4LAB_HD static BlockChoice choose(const Params&, const Global& g, uint32_t amax, const X& /*view*/,
                                      const BlockAt& /*at*/) {
    constexpr Format e4m3 = float8_e4m3fn;  // a local copy: device code cannot refer to the host global
    const float raw = div_full(div_full(bits_float(amax), 6.0f), g.s_dec);
    BlockChoice b;
    b.code = encode_rn_f32<float8_e4m3fn>(raw, Overflow::saturate);
    const float s8 = decode(e4m3, b.code);
    b.scale = (s8 == 0.0f ? 1.0f : s8) * g.s_dec;
    b.mult = b.scale;  // the divisor
    const bool over = raw == raw && is_nan_code(e4m3, encode_rn_f32<float8_e4m3fn>(raw, Overflow::nonsaturate));
    b.flags = uint8_t((over ? flag_overflow : 0) | (amax > 0x7F800000u ? flag_nan : 0));
    return b;
  }
  // rtn_fp4 of a quotient y, as the peer writes it: the magnitude by the threshold chain |y| >= 0.25, 0.75,
  // 1.25, 1.75, 2.5, 3.5, 5 (E2M1 rounded to nearest with ties away from zero, saturating at 6: the index of
  // the E2M1 magnitude is the number of thresholds passed), the sign y > 0 ? + : -, so +0 and NaN become -0
  // (code 8).
  FP4LAB_HD static Element rtn_fp4(float y) {
    const float a = fabsf(y);
    const uint32_t m = uint32_t(a >= 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a >= 1.25f) + uint32_t(a >= 1.75f) +
                       uint32_t(a >= 2.5f) + uint32_t(a >= 3.5f) + uint32_t(a >= 5.0f);
    constexpr float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const bool pos = y > 0.0f;
    return Element{pos ? m : m | 8u, pos ? mag[m] : -mag[m]};
  }
  FP4LAB_HD static Element encode(const Params&, const BlockChoice& c, float x, uint32_t /*rbits*/) {
    return rtn_fp4(div_full(x, c.mult));
  }
};

}  // namespace fp4lab
