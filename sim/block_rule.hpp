// The block-rule seam: how one block of a tensor is scaled and its elements
// encoded, as a type the generic pipelines take as a template parameter (the
// CPU's sim/quantizer.cpp, the CUDA generic kernels of cuda/quantize_rule.cuh).
//
// The pipeline owns everything that is the same for every scheme: validation,
// the RHT, the block grid, the exact bit-pattern amax of each block (sim/
// block_scales.hpp), the amax of the rule's *outer* domain (the tensor, or each
// row), the random values of stochastic rounding under the spec's sr_bits
// contract (core/sr.hpp), the loops, threads and outputs. A rule R owns:
//   R::Params                      trivially copyable (a kernel argument), built once per call by R::params(q)
//   R::Global                      its per-tensor (or per-row) constants
//   R::outer(p) -> OuterAmax       the amax domain behind the global scale
//   R::global(p, amax_bits)        Global from that domain's amax bits (0 where the domain is none)
//   R::g_dec(g)                    the global decode scale (QuantizedTensor::global_decode)
//   R::choose(p, g, amax, view, at) one block's BlockChoice; view reads the tensor's elements (4/6 does),
//                                  at says where the block lies
//   R::encode(p, choice, x, rbits) one element's Element (code, and the value dequant multiplies)
// and may add, for a choice that reads a run of blocks (Quartet II's MS-EDEN: the 8 groups of a 128-chunk),
//   R::run_blocks, R::choose_run(p, g, view, first, out) the choices of the run of up to run_blocks blocks
//                                  along the block axis (a block row for blocks one row high, else a block
//                                  column) that starts at `first` (a multiple of run_blocks), into out[];
//                                  returns how many. The CPU pipeline calls it once per run (its rules have an
//                                  outer domain of none or the tensor); R::choose must give the same choices
//                                  (the CUDA scale kernel calls it per block).
// and dequant is the same for every rule: (value * choice.scale) * g_dec(g), one FP32 operation each, RN.
// Rules are selected once per call from the spec (sim/block_rules.hpp's with_block_rule); a kernel or a
// row loop sees a concrete type, never a string or a function pointer.
//
// This header holds the seam's types and the standard rule (fp4lab's own arithmetic: the MX rules, NVFP4's
// two levels, nv_noglobal, per-tensor FP8; sim/scale_rules.hpp). Emulations of other tools' arithmetic live in
// schemes/<name>/rule.hpp. FP4LAB_HD throughout: compiled for the host and the device, the same bits
// (built with -ffp-contract=off / --fmad=false, see sim/scale_rules.hpp).
#pragma once

#include <cstdint>

#include "core/encode.hpp"
#include "core/hd.hpp"
#include "core/sr.hpp"
#include "schemes/fp8_block/scalar.hpp"
#include "schemes/mx_scale_modes/scalar.hpp"
#include "sim/quantizer.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab {

// The rules (sim/block_rules.hpp maps a QuantizerSpec to one).
enum class BlockRuleId : uint8_t {
  standard,              // fp4lab's arithmetic (this header)
  fp4tk,                 // fp4-trainkit's (schemes/fp4tk/rule.hpp)
  te_nvfp4,              // TransformerEngine's 4/6 and row-scaled NVFP4 options (schemes/te_nvfp4/rule.hpp)
  te_fast_math,          // TransformerEngine's NVFP4 kernels under NVTE_USE_FAST_MATH (schemes/te_nvfp4/fast_math.hpp)
  quartet2,              // Quartet II's forward NVFP4 kernels (schemes/quartet2/rule.hpp)
  te_fused_fast_math,    // TE's fused RHT-cast NVFP4 kernels under fast math (schemes/te_nvfp4/fused_fast_math.hpp)
  tetrajet2,             // TetraJet-v2's 1x16 / 1x128 double-block quantizer (schemes/tetrajet2/rule.hpp)
  quartet2_triton,       // Quartet II's Triton simulation of its forward quantizer (schemes/quartet2/triton.hpp)
  quartet2_eden_triton,  // its Triton simulation of the backward's MS-EDEN (schemes/quartet2/eden_triton.hpp)
  te_reference,          // TransformerEngine's Python reference NVFP4 quantizer (schemes/te_nvfp4/reference.hpp)
};

// The amax a rule's global scale is computed from: none, the whole tensor's, or each row's (row_amax: a rule
// with this domain has blocks one row high).
enum class OuterAmax : uint8_t { none, tensor, rows };

inline constexpr uint8_t flag_underflow = 1, flag_overflow = 2, flag_nan = 4;

// One block's scale: what BlockScales (CPU) and the block parameters (CUDA) hold for it.
struct BlockChoice {
  uint32_t code = 0;  // scale-format code (unused for float32 scales)
  float scale = 0;    // decoded scale: dequant = (value * scale) * g_dec
  float mult = 0;     // the element operand's factor (the rule's encode says whether it multiplies or divides)
  uint8_t flags = 0;  // flag_underflow | flag_overflow | flag_nan
};

// One element: its code, and the value dequant multiplies by the block's scale (decode(code), or an emulated
// tool's own value).
struct Element {
  uint32_t code = 0;
  float value = 0;
};

// Where block (bi, bj) lies: a [rows, cols] tensor in blocks of br x bc (the last ones possibly partial), and
// the call's random stream (RandomStream's seed and stream: a rule that rounds its scales stochastically draws
// from them, schemes/quartet2/eden_triton.hpp).
struct BlockAt {
  int64_t rows, cols, br, bc, bi, bj;
  uint64_t seed = 0, stream = 0;
};

// The element encoder of fp4lab's arithmetic, which a rule may reuse (R::mult_encoder(p)): code =
// encode(elem, x * mult), or x / mult when `divide`; for power-of-two scales (`pow2`) under rp/rm the exact
// float64 product (x * 2^-e below FP32's normal range must keep its true sign and size for directed
// rounding). SR with rbits of sr_width bits. A rule offering it gets the CPU's vectorised rows
// (sim/quantizer.cpp) and the CUDA fused kernels' element forms.
struct MultEncoder {
  Format elem;
  Round round;
  Overflow overflow;
  bool divide, pow2;
  int sr_width;
  FP4LAB_HD uint32_t code(float mult, float x, uint32_t rbits) const {
    if (pow2 && (round == Round::rp || round == Round::rm))
      return fp4lab::encode(elem, double(x) * double(mult), round, overflow, rbits, sr_width);
    const float y = divide ? x / mult : x * mult;
    return fp4lab::encode(elem, y, round, overflow, rbits, sr_width);
  }
  FP4LAB_HD Element element(float mult, float x, uint32_t rbits) const {
    const uint32_t c = code(mult, x, rbits);
    return Element{c, decode(elem, c)};
  }
};

// ---- the standard rule -----------------------------------------------------------------------------------
// Scale formats with a compile-time form (sim/scale_rules.hpp's nv_*_block_scale<S>, equal to the generic
// forms by test): the choice of form is made once, in params(), not per block.
enum class StdScaleForm : uint8_t { ue4m3, e4m3fn, generic };

struct StandardRule {
  static constexpr BlockRuleId id = BlockRuleId::standard;
  struct Params {
    Format elem, sfmt;
    ScaleRule rule;
    Round round;
    Overflow overflow;
    bool tensor_global;  // nv with global_scale tensor_amax
    int sr_width;        // bits of an element's random value (core/sr.hpp's sr_width)
    StdScaleForm form;
  };
  using Global = NvGlobal;

  static Params params(const QuantizerSpec& q) {
    const StdScaleForm form = q.scale == &ufloat8_e4m3    ? StdScaleForm::ue4m3
                              : q.scale == &float8_e4m3fn ? StdScaleForm::e4m3fn
                                                          : StdScaleForm::generic;
    return Params{*q.element,
                  *q.scale,
                  q.scale_rule,
                  q.round,
                  q.overflow,
                  q.global_scale == GlobalScale::tensor_amax,
                  sr_width(q.sr_bits, *q.element),
                  form};
  }
  // The E8M0 rules: fp4lab's MX rules and the schemes' (schemes/mx_scale_modes/).
  FP4LAB_HD static constexpr bool mx_rule(ScaleRule r) {
    return r == ScaleRule::ocp || r == ScaleRule::ceil || r == ScaleRule::tetrajet || r == ScaleRule::torchao_floor ||
           r == ScaleRule::torchao_ceil || r == ScaleRule::torchao_even || r == ScaleRule::torchao_rceil ||
           r == ScaleRule::te_mxfp8;
  }
  // FP8 block scaling's rules (schemes/fp8_block/): 128-long blocks in recipes and the block-scaled GEMM.
  FP4LAB_HD static constexpr bool fp8_block_rule(ScaleRule r) {
    return r == ScaleRule::deepgemm || r == ScaleRule::te_fp8_block || r == ScaleRule::amax_div;
  }
  // The element factor is an exact power of two: the E8M0 rules, and FP8 block scaling with e8m0 scales
  // (which amax_div does not take).
  FP4LAB_HD static constexpr bool pow2(const Params& p) {
    return mx_rule(p.rule) || (fp8_block_rule(p.rule) && p.sfmt.special == Special::e8m0);
  }
  // Elements are x / scale (fp4-trainkit's eq. 3 in fp4lab's arithmetic; DeepSeek-V3's x / s) rather than
  // x * mult.
  FP4LAB_HD static constexpr bool divide(const Params& p) {
    return p.rule == ScaleRule::nv_noglobal || p.rule == ScaleRule::amax_div;
  }
  // The block amax leaves NaN out (TransformerEngine's fmaxf reductions) instead of letting it dominate.
  FP4LAB_HD static constexpr bool amax_drops_nan(const Params& p) {
    return p.rule == ScaleRule::te_fp8_block || p.rule == ScaleRule::te_mxfp8;
  }

  FP4LAB_HD static OuterAmax outer(const Params& p) {
    return p.rule == ScaleRule::nv && p.tensor_global ? OuterAmax::tensor : OuterAmax::none;
  }
  // TE's compute_global_encode_scaling_factor_FP4 from the tensor's amax; without a global scale, g_enc 1.
  FP4LAB_HD static NvGlobal global(const Params& p, uint32_t amax_bits) {
    const float elem_max = max_finite(p.elem);
    if (p.rule == ScaleRule::nv && p.tensor_global)
      return nv_global(bits_float(amax_bits), max_finite(p.sfmt), elem_max);
    return nv_no_global(elem_max);
  }
  FP4LAB_HD static float g_dec(const NvGlobal& g) { return g.g_dec; }

  template <class X>
  FP4LAB_HD static BlockChoice choose(const Params& p, const NvGlobal& g, uint32_t amax, const X& /*view*/,
                                      const BlockAt& /*at*/) {
    return choose(p, g, amax);
  }
  // An E4M3 block scale's choice: its code and value, the element factor `mult`, its flags.
  FP4LAB_HD static BlockChoice nv_choice(const NvBlockScale& s, float mult, uint8_t nan) {
    BlockChoice b;
    b.code = s.code;
    b.scale = s.scale;
    b.mult = mult;
    b.flags = uint8_t((s.underflow ? flag_underflow : 0) | (s.overflow ? flag_overflow : 0) | nan);
    return b;
  }
  FP4LAB_HD static BlockChoice choose(const Params& p, const NvGlobal& g, uint32_t amax) {
    BlockChoice b;
    const uint8_t nan = amax > 0x7F800000u ? flag_nan : 0;
    switch (p.rule) {
      case ScaleRule::ocp:
      case ScaleRule::ceil:
      case ScaleRule::tetrajet: {
        const MxScale s = p.rule == ScaleRule::ocp    ? mx_scale_ocp(amax, p.elem)
                          : p.rule == ScaleRule::ceil ? mx_scale_ceil(amax, p.elem)
                                                      : mx_scale_tetrajet(amax, p.elem);
        b.code = s.code();
        b.scale = s.nan ? quiet_nan_f() : pow2f(s.exp);
        b.mult = s.nan ? quiet_nan_f() : pow2f(-s.exp);
        b.flags =
            uint8_t((s.underflow ? flag_underflow : 0) | (s.overflow ? flag_overflow : 0) | (s.nan ? flag_nan : 0));
        break;
      }
      case ScaleRule::nv: {
        const float a = bits_float(amax);
        const NvBlockScale s = p.form == StdScaleForm::ue4m3    ? nv_block_scale<ufloat8_e4m3>(a, g)
                               : p.form == StdScaleForm::e4m3fn ? nv_block_scale<float8_e4m3fn>(a, g)
                                                                : nv_block_scale(a, g, p.sfmt);
        b = nv_choice(s, s.encode, nan);
        break;
      }
      case ScaleRule::nv_noglobal: {
        const float a = bits_float(amax), elem_max = max_finite(p.elem);
        const NvBlockScale s = p.form == StdScaleForm::ue4m3    ? nv_noglobal_block_scale<ufloat8_e4m3>(a, elem_max)
                               : p.form == StdScaleForm::e4m3fn ? nv_noglobal_block_scale<float8_e4m3fn>(a, elem_max)
                                                                : nv_noglobal_block_scale(a, elem_max, p.sfmt);
        b = nv_choice(s, s.scale, nan);  // elements divide by the scale
        break;
      }
      case ScaleRule::tensor_amax: {
        const TensorScale t = tensor_amax_scale(bits_float(amax), max_finite(p.elem));
        b.scale = t.decode;
        b.mult = t.encode;
        b.flags = nan;
        break;
      }
      case ScaleRule::torchao_floor:
      case ScaleRule::torchao_ceil:
      case ScaleRule::torchao_even:
      case ScaleRule::torchao_rceil:
      case ScaleRule::te_mxfp8: {
        const MxScaleMode m = p.rule == ScaleRule::torchao_floor   ? MxScaleMode::torchao_floor
                              : p.rule == ScaleRule::torchao_ceil  ? MxScaleMode::torchao_ceil
                              : p.rule == ScaleRule::torchao_even  ? MxScaleMode::torchao_even
                              : p.rule == ScaleRule::torchao_rceil ? MxScaleMode::torchao_rceil
                                                                   : MxScaleMode::te_mxfp8;
        const MxScale s = mx_scale_mode(m, amax, p.elem);
        b.code = s.code();
        b.scale = s.nan ? quiet_nan_f() : pow2f(s.exp);
        b.mult = s.nan ? quiet_nan_f() : pow2f(-s.exp);
        b.flags = uint8_t((s.underflow ? flag_underflow : 0) | (s.nan ? flag_nan : 0));
        break;
      }
      case ScaleRule::deepgemm:
      case ScaleRule::te_fp8_block:
      case ScaleRule::amax_div: {
        const float a = bits_float(amax), elem_max = max_finite(p.elem);
        const bool e8m0 = p.sfmt.special == Special::e8m0;
        const Fp8BlockScale s = p.rule == ScaleRule::deepgemm       ? deepgemm_block_scale(a, elem_max, e8m0)
                                : p.rule == ScaleRule::te_fp8_block ? te_fp8_block_scale(a, elem_max, e8m0)
                                                                    : amax_div_block_scale(a, elem_max);
        b.code = s.code;
        b.scale = s.scale;
        b.mult = s.mult;
        b.flags = uint8_t((s.underflow ? flag_underflow : 0) | nan);
        break;
      }
    }
    return b;
  }

  FP4LAB_HD static MultEncoder mult_encoder(const Params& p) {
    return MultEncoder{p.elem, p.round, p.overflow, divide(p), pow2(p), p.sr_width};
  }
  FP4LAB_HD static Element encode(const Params& p, const BlockChoice& c, float x, uint32_t rbits) {
    return mult_encoder(p).element(c.mult, x, rbits);
  }
};

// Whether rule R's block amax leaves NaN out (R::amax_drops_nan, where R has it): the amax is then the max of
// the block's non-NaN magnitudes (a NaN element still encodes as the rule's encoder says).
template <class R>
FP4LAB_HD constexpr bool amax_drops_nan(const typename R::Params& p) {
  if constexpr (requires { R::amax_drops_nan(p); })
    return R::amax_drops_nan(p);
  else
    return false;
}
// |x|'s bits for the block amax: NaN patterns dominate, or count as 0 under amax_drops_nan.
FP4LAB_HD constexpr uint32_t amax_bits_of(float x, bool drop_nan) {
  const uint32_t a = abs_bits(x);
  return drop_nan && a > 0x7F800000u ? 0u : a;
}

// Dequantization, the same for every rule: (value * scale) * g_dec.
FP4LAB_HD inline float dequant_value(const Element& e, const BlockChoice& c, float g_dec) {
  return (e.value * c.scale) * g_dec;
}

}  // namespace fp4lab
