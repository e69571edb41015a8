// The quantized linear layer y = x W^T + b on the CPU (the reference), forward and
// backward, executing recipes/linear_plan.hpp's plan: its three GEMMs on the
// recipe's fake-quantized operands
// (dequantized exactly to FP32, multiplied with Eigen in FP32: accumulation
// model "fp32_eigen", see sim/gemm.hpp).
//
// Shapes (row-major): x [B, in], W [out, in], b [out], y [B, out].
// Stochastic rounding streams: every quantization draws from
//   RandomStream{seed, stream_id(layer_id, operand, step)}
// so runs are reproducible per layer, per operand and per step.
//
// The three GEMMs (operand names of recipe.hpp):
//   forward  y  = Q_fwd_x(x) Q_fwd_w(W)^T + b
//   dgrad    dx = Q_dgrad_grad_y(dy) Q_dgrad_w(W')        W' = Q_fwd_w(W) if double_quantization, else W
//   wgrad    dW = Q_wgrad_grad_y(R dy)^T Q_wgrad_x(R x')  x' = Q_fwd_x(x) if double_quantization, else x
//            R = the 16-point RHT along B (the reduction axis) when recipe.wgrad_rht, else identity;
//            applying the same orthonormal R to both operands leaves dW unchanged in exact arithmetic.
//   db = column sums of dy (float64 accumulation, rounded once to float).
// Q_op = fake_quantize(recipe.operand(op), ...) on a copy (quantizer.hpp); an
// operand without a quantizer is used as is (FP32) or rounded to bfloat16 RN
// when recipe.high_precision == bf16. Layers whose name matches
// recipe.keep_high_precision use no quantizer (but the recipe's high-precision
// mode); a null recipe is plain FP32.
//
// Accumulation model "fp32_eigen" (sim/gemm_tiled.hpp): Eigen FP32 GEMMs on
// fixed output tiles computed in parallel, each by single-threaded Eigen, so
// the bits do not depend on the thread count.
#pragma once

#include <cstdint>

#include <Eigen/Core>

#include "core/tensor.hpp"
#include "recipes/linear_plan.hpp"

namespace fp4lab {

using MatrixRM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Executes one operand plan on the CPU, in place on m (the operand's source).
void apply_operand_plan(const OperandPlan& p, MatrixView<float> m);

// Forward. Keeps what backward needs in `saved` (the quantized operands when
// the recipe needs them again).
struct LinearSaved {
  bool forward_only = false;  // the forward ran with ctx.backward false: nothing below is kept
  MatrixRM x;                 // input as given (backward re-quantizes it for wgrad)
  MatrixRM x_q;               // Q_fwd_x(x), kept only when the recipe uses double_quantization (else empty)
  MatrixRM w_q;  // Q_fwd_w(W), kept only when dgrad_w is the same deterministic (non-SR) quantizer as fwd_w
                 // (nvfp4's 16x16 tiles): backward reuses it instead of quantizing W again (same bits).
};
// x and w are taken by value: a caller with temporaries (the CPU backend's
// aligned copies) moves them in, and the layer quantizes them in place or
// keeps x in `saved` without another copy.
void linear_forward(const LinearContext& ctx, MatrixRM x, MatrixRM w, const float* bias /*[out] or null*/,
                    MatrixRM& y, LinearSaved& saved);
// The same with the plan the caller holds (plan == linear_plan(ctx); train/backend.hpp's LayerPlan).
void linear_forward(const LinearContext& ctx, const LinearPlan& plan, MatrixRM x, MatrixRM w, const float* bias,
                    MatrixRM& y, LinearSaved& saved);
// Backward: given dy [B, out], writes dx [B, in], dW [out, in] and db [out]
// (db may be null; dx/dW are resized). `w` and `ctx` must be those of the
// forward that filled `saved`.
// w and dy by value, as linear_forward's x and w.
void linear_backward(const LinearContext& ctx, const LinearSaved& saved, MatrixRM w, MatrixRM dy, MatrixRM& dx,
                     MatrixRM& dw, float* db);
void linear_backward(const LinearContext& ctx, const LinearPlan& plan, const LinearSaved& saved, MatrixRM w,
                     MatrixRM dy, MatrixRM& dx, MatrixRM& dw, float* db);

}  // namespace fp4lab
