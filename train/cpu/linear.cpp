// The quantized linear layer on the CPU (linear.hpp): fake-quantized
// operands, FP32 Eigen GEMMs on fixed output tiles.
#include "train/cpu/linear.hpp"

#include <algorithm>
#include <initializer_list>
#include <string>

#include "train/cpu/bf16.hpp"
#include "core/error.hpp"
#include "sim/quantizer.hpp"
#include "sim/gemm_tiled.hpp"
#include "sim/rht.hpp"
#include "train/numerics.hpp"

namespace fp4lab {

namespace {

MatrixView<float> view(MatrixRM& m) { return MatrixView<float>(m.data(), m.rows(), m.cols()); }

// Round to bfloat16, nearest-even (the high-precision mode "bf16": GEMM
// operands in bf16, FP32 accumulation). Inf stays Inf, NaN becomes the quiet
// NaN (bf16.hpp: the bits of core's codec, in a loop that vectorises).
void round_bf16(MatrixView<float> m) {
  const int64_t rows = m.rows, cols = m.cols;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* p = m.data + r * m.stride;
    for (int64_t c = 0; c < cols; ++c) p[c] = train::round_bf16_f32(p[c]);
  }
}

MatrixView<const float> cview(const MatrixRM& m) { return MatrixView<const float>(m.data(), m.rows(), m.cols()); }

// Numerics statistics (train/numerics.hpp) of the operands ops made from src,
// when the step measures them (a recorder is set); otherwise nothing.
void measure(const LinearContext& ctx, const LinearPlan& plan, std::initializer_list<Operand> ops,
             const MatrixRM& src) {
  train::NumericsRecorder* rec = train::numerics_recorder();
  if (rec == nullptr || !ctx.backward) return;
  for (Operand op : ops) rec->add(ctx, plan.operand(op), train::operand_numerics(plan.operand(op), cview(src)));
}

void check_shapes(const char* fn, const MatrixRM& x, const MatrixRM& w) {
  if (x.cols() != w.cols())
    throw Error(std::string(fn) + ": x is [" + std::to_string(x.rows()) + ", " + std::to_string(x.cols()) +
                "] but W is [" + std::to_string(w.rows()) + ", " + std::to_string(w.cols()) +
                "]: x's columns must equal W's columns (in_features)");
}

}  // namespace

void apply_operand_plan(const OperandPlan& p, MatrixView<float> m) {
  if (p.pre) fake_quantize(*p.pre, m, p.pre_stream);
  if (p.rht) rht_forward(m, p.rht_axis, p.rht_kind, p.rht_seed);
  if (p.quantizer) {
    fake_quantize(*p.quantizer, m, p.stream);
  } else if (p.round_bf16) {
    round_bf16(m);
  }
}

void linear_forward(const LinearContext& ctx, MatrixRM x, MatrixRM w, const float* bias, MatrixRM& y,
                    LinearSaved& saved) {
  linear_forward(ctx, linear_plan(ctx), std::move(x), std::move(w), bias, y, saved);
}

void linear_forward(const LinearContext& ctx, const LinearPlan& plan, MatrixRM x, MatrixRM w, const float* bias,
                    MatrixRM& y, LinearSaved& saved) {
  check_shapes("linear_forward", x, w);
  measure(ctx, plan, {Operand::fwd_x, Operand::wgrad_x}, x);  // x and W are the backward's too
  measure(ctx, plan, {Operand::fwd_w, Operand::dgrad_w}, w);
  saved.forward_only = !ctx.backward;
  saved.x_q.resize(0, 0);
  saved.w_q.resize(0, 0);
  saved.x.resize(0, 0);
  // x and W are this call's own copies: an operand whose source is not needed
  // afterwards is quantized in place (W always; x when no backward keeps it).
  MatrixRM xq;
  MatrixRM* xa = &x;
  if (plan.operand(Operand::fwd_x).changes()) {
    if (ctx.backward) {
      xq = x;
      xa = &xq;
    }
    apply_operand_plan(plan.operand(Operand::fwd_x), view(*xa));
  }
  if (plan.operand(Operand::fwd_w).changes()) apply_operand_plan(plan.operand(Operand::fwd_w), view(w));
  gemm_tiled(y, *xa, w.transpose());
  if (bias != nullptr && plan.add_bias) {
    const int64_t rows = y.rows(), cols = y.cols();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = y.data() + r * cols;
      for (int64_t c = 0; c < cols; ++c) yr[c] += bias[c];
    }
  }
  // wgrad_x's pre (double quantization) is Q_fwd_x(x) with fwd_x's stream: the
  // forward's fwd_x operand (a bare quantizer), kept instead of recomputed.
  if (!ctx.backward) return;
  saved.x = std::move(x);
  if (plan.operand(Operand::wgrad_x).pre) saved.x_q = std::move(xq);
  if (plan.reuse_fwd_w) saved.w_q = std::move(w);
}

namespace {

// db = column sums of dy: column strips of 64, rows in order (a fixed
// summation order per column), float64 accumulation rounded once.
void bias_grad(const MatrixRM& dy, float* db) {
  const int64_t rows = dy.rows(), cols = dy.cols(), strips = (cols + 63) / 64;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < strips; ++s) {
    const int64_t c0 = s * 64, nc = std::min<int64_t>(64, cols - c0);
    double acc[64] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* dr = dy.data() + r * cols + c0;
      for (int64_t c = 0; c < nc; ++c) acc[c] += double(dr[c]);
    }
    for (int64_t c = 0; c < nc; ++c) db[c0 + c] = float(acc[c]);
  }
}

}  // namespace

void linear_backward(const LinearContext& ctx, const LinearSaved& saved, MatrixRM w, MatrixRM dy, MatrixRM& dx,
                     MatrixRM& dw, float* db) {
  linear_backward(ctx, linear_plan(ctx), saved, std::move(w), std::move(dy), dx, dw, db);
}

void linear_backward(const LinearContext& ctx, const LinearPlan& plan, const LinearSaved& saved, MatrixRM w,
                     MatrixRM dy, MatrixRM& dx, MatrixRM& dw, float* db) {
  if (saved.forward_only)
    throw Error(
        "linear_backward: the forward ran with LinearContext::backward false (evaluation) and kept nothing "
        "for a backward pass");
  check_shapes("linear_backward", saved.x, w);
  if (dy.rows() != saved.x.rows() || dy.cols() != w.rows())
    throw Error("linear_backward: dy is [" + std::to_string(dy.rows()) + ", " + std::to_string(dy.cols()) +
                "], expected [" + std::to_string(saved.x.rows()) + ", " + std::to_string(w.rows()) +
                "] (batch rows of x, out_features of W)");
  measure(ctx, plan, {Operand::dgrad_grad_y, Operand::wgrad_grad_y}, dy);
  // db first: dy is this call's own copy, and wgrad quantizes it in place.
  if (db != nullptr) bias_grad(dy, db);

  // dgrad: dx = Q(dy) Q(W'), reduction over out. W (this call's copy) is
  // quantized in place; dy is copied, wgrad needs it again.
  {
    MatrixRM g;
    const MatrixRM* ga = &dy;
    const MatrixRM* wa = &w;
    const OperandPlan& pg = plan.operand(Operand::dgrad_grad_y);
    const OperandPlan& pw = plan.operand(Operand::dgrad_w);
    if (pg.changes()) {
      g = dy;
      apply_operand_plan(pg, view(g));
      ga = &g;
    }
    if (plan.reuse_fwd_w && saved.w_q.rows() == w.rows() && saved.w_q.cols() == w.cols()) {
      wa = &saved.w_q;
    } else if (pw.changes()) {
      apply_operand_plan(pw, view(w));
    }
    gemm_tiled(dx, *ga, *wa);
  }

  // wgrad: dW = Q(R dy)^T Q(R x'), reduction over B; dy's last use, in place.
  {
    MatrixRM xb;
    const MatrixRM* xa = &saved.x;
    const OperandPlan& pg = plan.operand(Operand::wgrad_grad_y);
    OperandPlan px = plan.operand(Operand::wgrad_x);
    if (pg.changes()) apply_operand_plan(pg, view(dy));
    if (px.pre && saved.x_q.rows() != saved.x.rows())
      throw Error(
          "linear_backward: the recipe uses double_quantization but `saved` holds no Q_fwd_x(x); pass the "
          "LinearSaved that linear_forward filled with the same context");
    if (px.changes()) {
      xb = px.pre ? saved.x_q : saved.x;
      px.pre = nullptr;  // saved.x_q is pre's result already
      apply_operand_plan(px, view(xb));
      xa = &xb;
    }
    gemm_tiled(dw, dy.transpose(), *xa);
  }
}

}  // namespace fp4lab
