// The choice of kernels of a quantization (quantize_plan.hpp): the one place
// that maps a spec, its input and the caller's path and amax to a family,
// kind, block size, RHT and amax strategy. quantize.cu runs the plans.
#include "cuda/quantize_plan.hpp"

#include <string>

#include "core/error.hpp"
#include "core/sr.hpp"
#include "sim/block_rules.hpp"

namespace fp4lab::cuda {
namespace qk {
namespace {

// The kind of kernel that `family` has for q's formats: the rows and columns
// families compile [16]-blocks for the nvfp4 and e2m1 kinds only (nvfp4 only
// with the RHT), [32]-blocks for every kind; tiles for the nvfp4 and e2m1
// kinds; every other spec takes the runtime kind (run-time formats).
KernelKind family_kind(Family family, int block, bool rht, KernelKind k) {
  switch (family) {
    case Family::rows:
    case Family::cols:
      if (block == 32) return k;
      if (rht) return k == KernelKind::nvfp4 ? k : KernelKind::runtime;
      return e2m1_kind(k) ? k : KernelKind::runtime;
    case Family::tiles: return e2m1_kind(k) ? k : KernelKind::runtime;
    case Family::dual: return KernelKind::nvfp4;
    case Family::generic: break;
  }
  return KernelKind::runtime;
}

bool needs_tensor_amax(const QuantizerSpec& q) {
  return q.scale_rule == ScaleRule::nv && q.global_scale == GlobalScale::tensor_amax;
}

// A quantizer of quantize_dual_device: NVFP4 (e2m1 elements, ue4m3 scales, the
// nv rule, with or without the per-tensor scale), rounding rn or rs.
bool dual_quantizer(const QuantizerSpec& q) {
  return spec_kind(q) == KernelKind::nvfp4 && q.scale_rule == ScaleRule::nv &&
         (q.round == Round::rn || q.round == Round::rs) && block_rule_traits(q).fused && q.rht_kind == RhtKind::rht16;
}

}  // namespace

SrLayout sr_layout(const QuantizerSpec& q, int64_t cols) {
  const Format& f = *q.element;
  SrLayout s;
  s.bits = q.sr_bits;
  s.width = sr_width(q.sr_bits, f);
  s.group = sr_group(q.sr_bits, f);
  s.lsb_step = sr_lsb(q.sr_bits, f, 1);
  s.words_per_row = sr_words_per_row(q.sr_bits, f, cols);
  return s;
}

std::optional<Family> fused_family(const QuantizerSpec& q) {
  if (!block_rule_traits(q).fused) return std::nullopt;  // the generic pipeline on its rule (quantize_rule.cuh)
  if (q.rht && q.rht_output != RhtOutput::f32) return std::nullopt;  // the generic path's RHT rounds its output
  if (q.rht && q.rht_kind != RhtKind::rht16) return std::nullopt;    // and takes Quartet II's 128-point rotation
  // The fused kernels' scale rules (their fast forms know which divide: nv_noglobal); the schemes' scale rules
  // (schemes/mx_scale_modes, schemes/fp8_block) run on the generic rule kernels.
  switch (q.scale_rule) {
    case ScaleRule::ocp:
    case ScaleRule::ceil:
    case ScaleRule::tetrajet:
    case ScaleRule::nv:
    case ScaleRule::nv_noglobal:
    case ScaleRule::tensor_amax: break;
    default: return std::nullopt;
  }
  const int br = q.block_rows, bc = q.block_cols;
  if (br == 1 && (bc == 16 || bc == 32)) {
    if (q.rht && bc != 16) return std::nullopt;
    return Family::rows;
  }
  if (bc == 1 && (br == 16 || br == 32)) {
    if (q.rht && br != 16) return std::nullopt;
    return Family::cols;
  }
  if (br == 16 && bc == 16 && !q.rht) return Family::tiles;
  return std::nullopt;
}

KernelPlan plan_quantize(const QuantizerSpec& q, InputType in, QuantPath path, bool amax_given) {
  const std::optional<Family> fused = fused_family(q);
  const BlockRuleTraits& rule = block_rule_traits(q);
  if (path == QuantPath::fused && !rule.fused)
    throw Error("quantize (cuda): " + std::string(rule.name) +
                "'s arithmetic runs on the generic pipeline's rule kernels (cuda/quantize_rule.cuh), not the fused "
                "ones: " + describe(q));
  if (path == QuantPath::fused && !fused)
    throw Error(
        "quantize (cuda): the fused kernel handles blocks [1,16], [1,32], [16,16], [16,1], [32,1] (RHT on "
        "[1,16]/[16,1]); got " +
        describe(q));
  KernelPlan plan;
  plan.input = in;
  plan.rht = q.rht;
  if (path == QuantPath::generic || !fused) {
    plan.family = Family::generic;
    plan.amax = AmaxStrategy::pre_pass;  // its block-amax pass (tensor_amax_bits is not used)
    return plan;
  }
  plan.family = *fused;
  plan.block = plan.family == Family::rows ? q.block_cols : q.block_rows;
  plan.kind = family_kind(plan.family, plan.block, q.rht, spec_kind(q));
  if (!needs_tensor_amax(q)) {
    plan.amax = AmaxStrategy::none;
  } else if (amax_given) {
    plan.amax = AmaxStrategy::given;
  } else if (plan.family == Family::tiles && plan.kind == KernelKind::nvfp4 && q.round == Round::rn) {
    plan.amax = AmaxStrategy::cooperative;  // the tile kernel's GRID_AMAX form (its Fast::rn form)
  } else {
    plan.amax = AmaxStrategy::pre_pass;
  }
  return plan;
}

std::optional<KernelPlan> plan_dual(const QuantizerSpec& row_q, const QuantizerSpec& col_q, InputType in, int64_t rows,
                                    int64_t cols, bool amax_given) {
  if (!dual_quantizer(row_q) || !dual_quantizer(col_q)) return std::nullopt;
  if (row_q.block_rows != 1 || row_q.block_cols != 16 || row_q.rht) return std::nullopt;
  if (col_q.block_rows != 16 || col_q.block_cols != 1) return std::nullopt;
  if (col_q.rht && col_q.rht_output != RhtOutput::f32) return std::nullopt;  // rounded RHT output: generic only
  if (rows % 16 != 0 || cols % 16 != 0) return std::nullopt;
  KernelPlan plan;
  plan.family = Family::dual;
  plan.kind = family_kind(Family::dual, 16, col_q.rht, KernelKind::nvfp4);
  plan.input = in;
  plan.block = 16;
  plan.rht = col_q.rht;
  const bool need = needs_tensor_amax(row_q) || needs_tensor_amax(col_q);
  plan.amax = !need ? AmaxStrategy::none : amax_given ? AmaxStrategy::given : AmaxStrategy::pre_pass;
  return plan;
}

}  // namespace qk

bool bf16_exact(const QuantizerSpec& q) {
  const Format* e = q.element;
  const bool element =
      e == &float4_e2m1fn || e == &float6_e2m3fn || e == &float6_e3m2fn || e == &float8_e4m3fn || e == &float8_e5m2;
  const bool scale = q.scale == &float8_e8m0fnu || q.scale == &ufloat8_e4m3;
  // A rule whose scales are not decode(code) (TE's NVFP4 options: final FP32 dequantization scales,
  // schemes/te_nvfp4/rule.hpp) does not give such a product.
  return element && scale && !q.rht && block_rule_traits(q).scales_from_codes;
}

bool rht_foldable(const QuantizerSpec& q) { return bf16_exact(q) && q.block_rows == 16 && q.block_cols == 1; }

bool fused_supported(const QuantizerSpec& q) { return qk::fused_family(q).has_value(); }

bool dual_supported(const QuantizerSpec& row_q, const QuantizerSpec& col_q, int64_t rows, int64_t cols) {
  return qk::plan_dual(row_q, col_q, InputType::f32, rows, cols, false).has_value();
}

}  // namespace fp4lab::cuda
