// The plan of a quantized linear layer y = x W^T + b: what each of its six
// GEMM operands is made of (quantizer, double quantization, wgrad RHT, bf16
// rounding, random stream), as data. Backend neutral: the CPU layer
// (train/cpu/linear.hpp) and the CUDA layer (train/cuda/linear.hpp) both
// execute linear_plan(), so their operands agree bit for bit.
//
// The three GEMMs (operand names of recipe.hpp):
//   forward  y  = Q_fwd_x(x) Q_fwd_w(W)^T + b
//   dgrad    dx = Q_dgrad_grad_y(dy) Q_dgrad_w(W')        W' = Q_fwd_w(W) if double_quantization, else W
//   wgrad    dW = Q_wgrad_grad_y(R dy)^T Q_wgrad_x(R x')  x' = Q_fwd_x(x) if double_quantization, else x
//            R = the 16-point RHT along B (the reduction axis) when recipe.wgrad_rht, else identity;
//            applying the same orthonormal R to both operands leaves dW unchanged in exact arithmetic.
// Shapes (row-major): x [B, in], W [out, in], b [out], y [B, out].
// Stochastic rounding streams: every quantization draws from
//   RandomStream{seed, stream_id(layer_id, operand, step)}
// so runs are reproducible per layer, per operand and per step.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "recipes/recipe.hpp"

namespace fp4lab {

// stream = 0xA << 60 | layer_id << 44 | step << 3 | operand. Throws
// fp4lab::Error if layer_id >= 2^16 or step >= 2^41 (the fields would overlap).
// The tag 0xA in the top bits keeps these streams apart from any other use of
// the same seed whose stream ids are below 2^60.
uint64_t stream_id(uint64_t layer_id, Operand op, uint64_t step);

// The signs' seed of a layer's rotations at a step (recipe.hpp's RhtSchedule): fixed, rht_seed itself;
// per_step, the two words random_bits(rht_seed, stream_id(layer_id, dgrad_grad_y, step) ^ 0x524F54 << 40, 0 and
// 1) as one 64-bit seed (high word first): fresh for each layer and step, the same for the layer's dgrad and
// wgrad operands (Quartet II re-rotates once per backward call and uses that rotation for all four).
uint64_t rotation_seed(RhtSchedule schedule, uint64_t rht_seed, uint64_t layer_id, uint64_t step);

struct LinearContext {
  const Recipe* recipe = nullptr;  // nullptr = plain FP32
  uint64_t seed = 0;
  uint64_t layer_id = 0;
  uint64_t step = 0;
  std::string_view layer_name = {};  // matched against recipe->keep_high_precision
  // False for a forward that no backward follows (evaluation): the layer
  // keeps nothing for backward and prepares no backward operand.
  // linear_backward after such a forward is an error.
  bool backward = true;
  // Non-null: W's values are quantize(*weight_cast, master).dequant already
  // (a parameter stored so, train/param_storage.hpp: NVFP4 primary weights,
  // nvfp4_2d, round to nearest). A W operand (fwd_w, dgrad_w) whose first
  // quantization is this same spec, round to nearest, takes W as it is
  // instead of quantizing it again: quantization is not idempotent (NVFP4's
  // global scale, re-derived from the dequantized tensor's amax, moves by an
  // ulp for ~8% of amaxes), and the operand must be Q(master), as the
  // FP32-primary run's. A fact about W's values only: where a backend keeps
  // W's stored form is the backend's (train/backend.hpp LayerPlan::w_stored).
  const QuantizerSpec* weight_cast = nullptr;
};

// True when this layer's GEMMs are quantized (recipe set, layer not kept in
// high precision).
bool linear_is_quantized(const LinearContext& ctx);

// ---- The plan: what each GEMM operand is (backend neutral) ------------------
// linear_plan() is the single place where a recipe + context is turned into
// the six operands' preparation; the CPU layer (train/cpu/linear.hpp) and the
// CUDA layer (train/cuda/linear.hpp) both execute it, so their operands agree bit for
// bit.
//
// One operand is made from its source tensor (fwd_x, wgrad_x: x; fwd_w,
// dgrad_w: W; dgrad_grad_y, wgrad_grad_y: dy), FP32 row-major, in this order:
//   1. pre        if set: fake_quantize(*pre, m, pre_stream). Double
//                 quantization: dgrad_w's pre is Q_fwd_w (stream of fwd_w),
//                 wgrad_x's pre is Q_fwd_x (stream of fwd_x), i.e. exactly the
//                 forward's fwd_w / fwd_x operand (whose plans are a bare
//                 quantizer), so a backend may reuse the forward's operand
//                 instead of re-applying pre (the CPU does for x: LinearSaved::x_q).
//   2. rht        if set: rht_forward(m, rht_axis, rht_kind, rht_seed) (sim/rht.hpp):
//                 the recipe's rotation along the operand's reduction axis,
//                 wgrad's along B (RhtAxis::cols for dy and x), dgrad's along
//                 out (RhtAxis::rows for dy [B, out], cols for W [out, in]);
//                 a partial last chunk stays untransformed. Both operands of a
//                 GEMM take the same signs, so the GEMM runs in the rotated
//                 domain (no inverse).
//   3. quantizer  if set: fake_quantize(*quantizer, m, stream);
//      else round_bf16: every element rounded to bfloat16, nearest-even
//                 (decode(bfloat16, encode_rn_f32<bfloat16>(v, nonsaturate)):
//                 Inf/NaN stay Inf/NaN).
// stream = RandomStream{ctx.seed, stream_id(ctx.layer_id, op, ctx.step)}.
// An operand with none of the three is the source itself (FP32).
struct OperandPlan {
  Operand op = Operand::fwd_x;
  const QuantizerSpec* pre = nullptr;  // points into the context's recipe
  RandomStream pre_stream{};
  bool rht = false;
  uint64_t rht_seed = 0;
  RhtKind rht_kind = RhtKind::rht16;
  RhtAxis rht_axis = RhtAxis::cols;
  const QuantizerSpec* quantizer = nullptr;  // points into the context's recipe
  RandomStream stream{};
  bool round_bf16 = false;  // only when quantizer is null

  // False when the operand is its source unchanged.
  bool changes() const { return pre != nullptr || rht || quantizer != nullptr || round_bf16; }
};

struct LinearPlan {
  std::array<OperandPlan, kOperandCount> operands;  // indexed by Operand
  // dgrad_w's operand is bit-identical to fwd_w's (the same quantizer on the
  // same W, not stochastic, no double quantization): backward may reuse the
  // forward's Q_fwd_w(W) (nvfp4's 16x16 tiles).
  bool reuse_fwd_w = false;
  bool quantized = false;  // linear_is_quantized(ctx)
  // The forward adds the bias: false for a quantized layer of a recipe with
  // forward_bias false.
  bool add_bias = true;

  const OperandPlan& operand(Operand op) const { return operands[size_t(op)]; }
};

// The plan of ctx (the pointers in it point into *ctx.recipe, which must
// outlive the plan). Rules, per operand op:
//   quantizer  = recipe.operand(op) unless the recipe is null or the layer is
//                kept in high precision;
//   round_bf16 = recipe.high_precision == bf16 and no quantizer;
//   pre        = Q_fwd_w for dgrad_w, Q_fwd_x for wgrad_x when
//                recipe.double_quantization and that forward quantizer exists
//                (quantized layers only; wgrad_x only with
//                double_quantization_x);
//   rht        = recipe.wgrad_rht for wgrad_grad_y and wgrad_x, recipe.dgrad_rht for dgrad_grad_y and
//                dgrad_w (quantized layers only), kind recipe.rht_kind, seed rotation_seed(...);
//   weight cast (ctx.weight_cast set, round to nearest): for fwd_w and dgrad_w,
//                a pre equal to *weight_cast is dropped, else (no pre) a
//                quantizer equal to it is dropped (W is that quantizer's output
//                already); reuse_fwd_w then holds only if fwd_w still changes W.
LinearPlan linear_plan(const LinearContext& ctx);

}  // namespace fp4lab
