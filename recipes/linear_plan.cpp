// The plan of a quantized linear layer (linear_plan.hpp).
#include "recipes/linear_plan.hpp"

#include <string>
#include <utility>

#include "core/error.hpp"
#include "core/philox.hpp"

namespace fp4lab {

uint64_t stream_id(uint64_t layer_id, Operand op, uint64_t step) {
  if (layer_id >= (uint64_t(1) << 16))
    throw Error("stream_id: layer_id " + std::to_string(layer_id) + " is too large (must be < 65536)");
  if (step >= (uint64_t(1) << 41))
    throw Error("stream_id: step " + std::to_string(step) + " is too large (must be < 2^41)");
  return (uint64_t(0xA) << 60) | (layer_id << 44) | (step << 3) | uint64_t(op);
}

uint64_t rotation_seed(RhtSchedule schedule, uint64_t rht_seed, uint64_t layer_id, uint64_t step) {
  if (schedule == RhtSchedule::fixed) return rht_seed;
  const uint64_t stream = stream_id(layer_id, Operand::dgrad_grad_y, step) ^ (uint64_t(0x524F54) << 40);
  return (uint64_t(random_bits(rht_seed, stream, 0)) << 32) | random_bits(rht_seed, stream, 1);
}

LinearPlan linear_plan(const LinearContext& ctx) {
  LinearPlan plan;
  const Recipe* r = ctx.recipe;
  for (int i = 0; i < kOperandCount; ++i) plan.operands[size_t(i)].op = Operand(i);
  if (r == nullptr) return plan;
  const bool quantize = !r->keeps_high_precision(std::string(ctx.layer_name));
  const bool bf16 = r->high_precision == HighPrecision::bf16;
  auto stream_of = [&](Operand op) { return RandomStream{ctx.seed, stream_id(ctx.layer_id, op, ctx.step)}; };
  for (int i = 0; i < kOperandCount; ++i) {
    OperandPlan& o = plan.operands[size_t(i)];
    const auto& q = r->operand(o.op);
    if (quantize && q) {
      o.quantizer = &*q;
      o.stream = stream_of(o.op);
      plan.quantized = true;
    } else {
      o.round_bf16 = bf16;
    }
  }
  if (!quantize) return plan;
  plan.add_bias = !plan.quantized || r->forward_bias;
  if (r->double_quantization) {
    // dgrad's W' = Q_fwd_w(W) and wgrad's x' = Q_fwd_x(x), each with its forward stream (same bits).
    for (auto [dst, src] : {std::pair{Operand::dgrad_w, Operand::fwd_w}, std::pair{Operand::wgrad_x, Operand::fwd_x}}) {
      const auto& q = r->operand(src);
      if (!q || (dst == Operand::wgrad_x && !r->double_quantization_x)) continue;
      plan.operands[size_t(dst)].pre = &*q;
      plan.operands[size_t(dst)].pre_stream = stream_of(src);
    }
  }
  const uint64_t rseed = r->wgrad_rht || r->dgrad_rht ? rotation_seed(r->rht_schedule, r->rht_seed, ctx.layer_id,
                                                                        ctx.step)
                                                      : 0;
  auto rotate = [&](Operand op, RhtAxis axis) {
    OperandPlan& o = plan.operands[size_t(op)];
    o.rht = true;
    o.rht_seed = rseed;
    o.rht_kind = r->rht_kind;
    o.rht_axis = axis;
  };
  if (r->wgrad_rht) {
    rotate(Operand::wgrad_grad_y, RhtAxis::cols);
    rotate(Operand::wgrad_x, RhtAxis::cols);
  }
  if (r->dgrad_rht) {
    rotate(Operand::dgrad_grad_y, RhtAxis::rows);
    rotate(Operand::dgrad_w, RhtAxis::cols);
  }
  // dgrad's W operand is bit-identical to the forward's: the same quantizer on
  // the same W, without random bits (stochastic rounding draws from the
  // operand's own stream) and without double quantization.
  const auto& f = r->operand(Operand::fwd_w);
  const auto& d = r->operand(Operand::dgrad_w);
  plan.reuse_fwd_w = !r->double_quantization && !r->dgrad_rht && f && d && *f == *d && f->round != Round::rs;
  if (r->backward_override != BackwardOverride::none) {
    // The backward in high precision (recipe.hpp BackwardOverride); dequantized: x and W through the
    // forward's quantizers and streams first.
    for (Operand op : {Operand::dgrad_grad_y, Operand::dgrad_w, Operand::wgrad_grad_y, Operand::wgrad_x}) {
      OperandPlan& o = plan.operands[size_t(op)];
      o = OperandPlan{};
      o.op = op;
      o.round_bf16 = bf16;
    }
    if (r->backward_override == BackwardOverride::dequantized) {
      for (auto [dst, src] : {std::pair{Operand::dgrad_w, Operand::fwd_w}, std::pair{Operand::wgrad_x, Operand::fwd_x}}) {
        if (const auto& q = r->operand(src)) {
          plan.operands[size_t(dst)].pre = &*q;
          plan.operands[size_t(dst)].pre_stream = stream_of(src);
        }
      }
    }
    plan.reuse_fwd_w = false;
  }
  // W is the weight cast's output already (NVFP4 primary weights): its first
  // quantization by the same spec would re-quantize Q(master), which is not
  // Q(master) again in general (linear_plan.hpp).
  if (const QuantizerSpec* c = ctx.weight_cast; c && c->round == Round::rn) {
    for (Operand op : {Operand::fwd_w, Operand::dgrad_w}) {
      OperandPlan& o = plan.operands[size_t(op)];
      if (o.pre) {
        if (*o.pre == *c) o.pre = nullptr, o.pre_stream = {};
      } else if (o.quantizer && *o.quantizer == *c) {
        o.quantizer = nullptr, o.stream = {};
      }
    }
    plan.reuse_fwd_w = plan.reuse_fwd_w && plan.operand(Operand::fwd_w).changes();
  }
  return plan;
}

bool linear_is_quantized(const LinearContext& ctx) { return linear_plan(ctx).quantized; }

}  // namespace fp4lab
