// The list of block rules (sim/block_rule.hpp's seam) and the one place a QuantizerSpec is mapped to one:
// block_rule_id() is the only reader of the emulation keys (emulate, scale_select, global_scale row_amax)
// past the JSON edge. A pipeline calls with_block_rule(q, fn) once per call; fn receives the rule's type and
// its Params. What the rest of fp4lab needs to know about a rule (which kernels take it, whether its scales
// are decode(code)) is in its traits, not in predicates over the spec's fields.
#pragma once

#include "schemes/fp4tk/rule.hpp"
#include "schemes/quartet2/rule.hpp"
#include "schemes/quartet2/eden_triton.hpp"
#include "schemes/quartet2/triton.hpp"
#include "schemes/tetrajet2/rule.hpp"
#include "schemes/te_nvfp4/fast_math.hpp"
#include "schemes/te_nvfp4/fused_fast_math.hpp"
#include "schemes/te_nvfp4/reference.hpp"
#include "schemes/te_nvfp4/rule.hpp"
#include "sim/block_rule.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

inline BlockRuleId block_rule_id(const QuantizerSpec& q) {
  if (q.emulate == Emulation::fp4tk) return BlockRuleId::fp4tk;
  if (q.emulate == Emulation::te_fast_math) return BlockRuleId::te_fast_math;
  if (q.emulate == Emulation::quartet2) return BlockRuleId::quartet2;
  if (q.emulate == Emulation::quartet2_triton) return BlockRuleId::quartet2_triton;
  if (q.emulate == Emulation::quartet2_eden_triton) return BlockRuleId::quartet2_eden_triton;
  if (q.emulate == Emulation::te_reference) return BlockRuleId::te_reference;
  if (q.emulate == Emulation::te_fused_fast_math) return BlockRuleId::te_fused_fast_math;
  if (q.emulate == Emulation::tetrajet2_source || q.emulate == Emulation::tetrajet2_triton ||
      q.emulate == Emulation::tetrajet2_kernel)
    return BlockRuleId::tetrajet2;
  if (q.scale_select == ScaleSelect::four_over_six || q.global_scale == GlobalScale::row_amax)
    return BlockRuleId::te_nvfp4;
  return BlockRuleId::standard;
}

// fn.template operator()<R>(R::Params) for q's rule R.
template <class Fn>
decltype(auto) with_block_rule(const QuantizerSpec& q, Fn&& fn) {
  switch (block_rule_id(q)) {
    case BlockRuleId::fp4tk: return fn.template operator()<Fp4tkRule>(Fp4tkRule::params(q));
    case BlockRuleId::te_nvfp4: return fn.template operator()<TeNvfp4Rule>(TeNvfp4Rule::params(q));
    case BlockRuleId::te_fast_math: return fn.template operator()<TeFastMathRule>(TeFastMathRule::params(q));
    case BlockRuleId::quartet2: return fn.template operator()<Quartet2Rule>(Quartet2Rule::params(q));
    case BlockRuleId::te_fused_fast_math:
      return fn.template operator()<TeFusedFastMathRule>(TeFusedFastMathRule::params(q));
    case BlockRuleId::tetrajet2: return fn.template operator()<Tetrajet2Rule>(Tetrajet2Rule::params(q));
    case BlockRuleId::quartet2_triton: return fn.template operator()<Quartet2TritonRule>(Quartet2TritonRule::params(q));
    case BlockRuleId::quartet2_eden_triton:
      return fn.template operator()<Quartet2EdenTritonRule>(Quartet2EdenTritonRule::params(q));
    case BlockRuleId::te_reference: return fn.template operator()<TeReferenceRule>(TeReferenceRule::params(q));
    case BlockRuleId::standard: break;
  }
  return fn.template operator()<StandardRule>(StandardRule::params(q));
}

struct BlockRuleTraits {
  const char* name;  // what `fp4lab recipes` and describe() call the arithmetic
  // The CUDA fused kernels (cuda/quantize_plan.hpp's families, the dual and grouped quantizers) take the rule;
  // the others run on the generic rule kernels (cuda/quantize_rule.cuh).
  bool fused;
  // QuantizedTensor::scales are decode(scale code), so a block-scaled GEMM can take the codes (with
  // global_decode) in place of the scales, and decode(code) * scale is a product of two short significands
  // (cuda/quantize.hpp's bf16_exact).
  bool scales_from_codes;
};

inline const BlockRuleTraits& block_rule_traits(BlockRuleId id) {
  static constexpr BlockRuleTraits standard{"fp4lab", true, true};
  static constexpr BlockRuleTraits fp4tk{"fp4-trainkit", false, true};
  static constexpr BlockRuleTraits te_nvfp4{"TransformerEngine NVFP4 options", false, false};
  static constexpr BlockRuleTraits te_fast_math{"TransformerEngine NVFP4 fast math", false, true};
  static constexpr BlockRuleTraits quartet2{"Quartet II", false, true};
  static constexpr BlockRuleTraits te_fused_fast_math{"TransformerEngine fused RHT-cast fast math", false, true};
  static constexpr BlockRuleTraits tetrajet2{"TetraJet-v2", false, false};
  static constexpr BlockRuleTraits quartet2_triton{"Quartet II (Triton)", false, false};
  static constexpr BlockRuleTraits quartet2_eden_triton{"Quartet II MS-EDEN (Triton)", false, true};
  static constexpr BlockRuleTraits te_reference{"TransformerEngine NVFP4 reference", false, true};
  switch (id) {
    case BlockRuleId::fp4tk: return fp4tk;
    case BlockRuleId::te_nvfp4: return te_nvfp4;
    case BlockRuleId::te_fast_math: return te_fast_math;
    case BlockRuleId::quartet2: return quartet2;
    case BlockRuleId::te_fused_fast_math: return te_fused_fast_math;
    case BlockRuleId::tetrajet2: return tetrajet2;
    case BlockRuleId::quartet2_triton: return quartet2_triton;
    case BlockRuleId::quartet2_eden_triton: return quartet2_eden_triton;
    case BlockRuleId::te_reference: return te_reference;
    case BlockRuleId::standard: break;
  }
  return standard;
}
inline const BlockRuleTraits& block_rule_traits(const QuantizerSpec& q) { return block_rule_traits(block_rule_id(q)); }

}  // namespace fp4lab
