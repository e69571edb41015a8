// TransformerEngine's 2026 NVFP4 options as quantizer options (DESIGN.md
// sec. 3): "Four Over Six" block-scale selection (scale_select
// "four_over_six", TE PR #2972) and row-scaled NVFP4 (global_scale
// "row_amax", TE PR #2931). The scalar arithmetic is scalar.hpp; here
// the block-level rule (FP4LAB_HD, shared with cuda/) behind the seam of
// sim/block_rule.hpp, and validate()'s checks (spec.cpp).
//
// Both options keep NVFP4's codes and layout (E2M1 elements, one E4M3 scale
// code per block) and change how a block's scale is chosen:
//  - four_over_six: two candidates per block (map-to-4: the scale 1.5x, so that
//    E2M1's 4 reaches the block amax; map-to-6: the usual scale), both quantized,
//    the one with the smaller error kept (scalar.hpp); blocks
//    [1,16], [16,1] and [16,16] (rows as lines, TE's rowwise 2-D order);
//    the global scale from E4M3_MAX = e4m3_max (448, or TE's 4/6 default 256);
//  - row_amax: the amax behind the global scale is the block's row's (blocks
//    [1,16]); each row is quantized exactly as a 1-row tensor with
//    global_scale tensor_amax would be (same codes and scale codes);
//  - both together: 4/6 with each row's amax (TE allows it rowwise).
// Decoded block scales (QuantizedTensor::scales) are TE's dequantization
// scale, final = (decode(sf) * amax) * fl(1 / (6 * E4M3_MAX)) with the
// tensor's or the row's amax; global_decode is 1, so dequant = decode(code) *
// final, what TE's dequantize computes. (The nv rule's dequant is instead
// (decode(code) * decode(sf)) * (1 / S_enc), the GEMM's factorisation: the two
// can differ in the last bit.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "schemes/te_nvfp4/scalar.hpp"
#include "sim/block_rule.hpp"
#include "sim/quantizer.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab {

// JSON names: "max", "four_over_six"; "mae", "mse", "mae_fp16", "mse_fp16".
std::string_view scale_select_name(ScaleSelect s);
std::string_view select_error_name(SelectError e);
// fp4lab::Error naming the valid choices for an unknown name.
ScaleSelect parse_scale_select(std::string_view s);
SelectError parse_select_error(std::string_view s);

// validate()'s checks of the options' keys (scale_select, select_error,
// e4m3_max, global_scale row_amax); throws fp4lab::Error prefixed by `where`.
void validate_nvfp4_options(const QuantizerSpec& q, const std::string& where);
// validate()'s checks of emulate 'te_fast_math' (schemes/te_nvfp4/fast_math.hpp).
void validate_te_fast_math(const QuantizerSpec& q, const std::string& where);
// validate()'s checks of emulate 'te_fused_fast_math' (schemes/te_nvfp4/fused_fast_math.hpp).
void validate_te_fused_fast_math(const QuantizerSpec& q, const std::string& where);

// The per-tensor constants of the block rule (device-copyable).
struct Nvfp4Options {
  bool four_over_six = false;
  SelectError mode = SelectError::mae;
  float e4m3_max = 448.0f;
  float scale_max = 448.0f;  // max_finite(scale format), the row-scaled nv rule's S
};
inline Nvfp4Options nvfp4_options_of(const QuantizerSpec& q) {
  return Nvfp4Options{q.scale_select == ScaleSelect::four_over_six, q.select_error, float(q.e4m3_max),
                      max_finite(*q.scale)};
}

// One block's result.
struct Nvfp4OptionBlock {
  uint32_t code = 0;       // E4M3 scale code
  float final_scale = 0;   // dequantization scale (te_dequant_scale)
  float mult = 0;          // element operand x * mult
  bool underflow = false;  // scale 0 with a non-zero block amax
  bool overflow = false;   // the chosen scale rounded beyond 448 before saturating
  bool map4 = false;       // four_over_six chose map-to-4
};

// Block (bi, bj) of a [rows, cols] tensor in blocks br x bc ([1,16], [16,1],
// [16,16]): x(r, c) reads element (r, c); block_amax is the block's (of its
// valid elements), global_amax the tensor's or the block's row's.
template <class X>
FP4LAB_HD Nvfp4OptionBlock nvfp4_option_block(const Nvfp4Options& o, const X& x, int64_t rows, int64_t cols, int64_t br,
                                              int64_t bc, int64_t bi, int64_t bj, float block_amax, float global_amax) {
  Nvfp4OptionBlock b;
  float sf;
  if (o.four_over_six) {
    const int64_t r0 = bi * br, c0 = bj * bc;
    const int64_t nr = rows - r0 < br ? rows - r0 : br, nc = cols - c0 < bc ? cols - c0 : bc;
    FosErrorArgs k;
    k.global_amax = global_amax;
    k.denom = 6.0f * o.e4m3_max;
    k.s_enc = te_global_encode(global_amax, o.e4m3_max);
    k.mode = o.mode;
    FosChoice ch;
    if (br == 1) {  // [1,16]: one line along the row
      ch = fos_select([&](int, int i) { return x(r0, c0 + i); }, 1, int(nc), false, block_amax, k);
    } else if (bc == 1) {  // [16,1]: one line down the column
      ch = fos_select([&](int, int i) { return x(r0 + i, c0); }, 1, int(nr), false, block_amax, k);
    } else {  // [16,16]: rows as lines, then the tree
      ch = fos_select([&](int l, int i) { return x(r0 + l, c0 + i); }, int(nr), int(nc), true, block_amax, k);
    }
    b.code = ch.pick.code;
    b.mult = ch.pick.inv;
    b.map4 = ch.map4;
    sf = ch.pick.scale;
    const float raw = ch.pick.raw;
    constexpr Format e4m3 = float8_e4m3fn;  // a local copy: device code cannot refer to the host global
    b.overflow = raw == raw && is_nan_code(e4m3, encode_rn_f32<float8_e4m3fn>(raw, Overflow::nonsaturate));
  } else {  // row_amax alone: the nv rule with the row's amax
    const NvBlockScale s = nv_block_scale<ufloat8_e4m3>(block_amax, nv_global(global_amax, o.scale_max, 6.0f));
    b.code = s.code;
    b.mult = s.encode;
    b.overflow = s.overflow;
    sf = s.scale;
  }
  b.final_scale = te_dequant_scale(sf, global_amax, o.e4m3_max);
  b.underflow = sf == 0.0f && block_amax > 0.0f;
  return b;
}

// The block rule: the nv rule's element encoder (x * mult, any round but rs) with TE's block scale
// choice; the amax behind the global scale is the tensor's, or each row's (row_amax).
struct TeNvfp4Rule {
  static constexpr BlockRuleId id = BlockRuleId::te_nvfp4;
  struct Params {
    Nvfp4Options o;
    bool row;  // global_scale row_amax
    Round round;
    Overflow overflow;
  };
  struct Global {
    float amax;  // the tensor's or the row's
  };
  static Params params(const QuantizerSpec& q) {
    return Params{nvfp4_options_of(q), q.global_scale == GlobalScale::row_amax, q.round, q.overflow};
  }
  FP4LAB_HD static OuterAmax outer(const Params& p) { return p.row ? OuterAmax::rows : OuterAmax::tensor; }
  FP4LAB_HD static Global global(const Params&, uint32_t amax_bits) { return Global{bits_float(amax_bits)}; }
  FP4LAB_HD static float g_dec(const Global&) { return 1.0f; }  // the scales are TE's final dequantization scales

  template <class X>
  FP4LAB_HD static BlockChoice choose(const Params& p, const Global& g, uint32_t amax, const X& x, const BlockAt& at) {
    const Nvfp4OptionBlock s =
        nvfp4_option_block(p.o, x, at.rows, at.cols, at.br, at.bc, at.bi, at.bj, bits_float(amax), g.amax);
    BlockChoice b;
    b.code = s.code;
    b.scale = s.final_scale;
    b.mult = s.mult;
    b.flags = uint8_t((s.underflow ? flag_underflow : 0) | (s.overflow ? flag_overflow : 0) |
                      (amax > 0x7F800000u ? flag_nan : 0));
    return b;
  }
  FP4LAB_HD static MultEncoder mult_encoder(const Params& p) {
    constexpr Format e2m1 = float4_e2m1fn;  // a local copy: device code cannot refer to the host global
    return MultEncoder{e2m1, p.round, p.overflow, false, false, 32};
  }
  FP4LAB_HD static Element encode(const Params& p, const BlockChoice& c, float x, uint32_t rbits) {
    return mult_encoder(p).element(c.mult, x, rbits);
  }
};

}  // namespace fp4lab
