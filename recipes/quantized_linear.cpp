// The quantized linear layer (quantized_linear.hpp): fake-quantized operands,
// FP32 Eigen GEMMs on fixed output tiles.
#include "recipes/quantized_linear.hpp"

#include <algorithm>
#include <string>

#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "sim/rht.hpp"

namespace fp4lab {

namespace {

// Output tile of one parallel GEMM task: kGemmRowBlock rows x kGemmColBlock
// columns. Every tile is computed by single-threaded Eigen (inside an OpenMP
// region Eigen does not spawn threads), over the whole reduction dimension, so
// each output element's summation order depends only on the problem shape and
// the fixed tiling, never on the thread count. Large tiles keep Eigen's
// operand packing (O(k (m + n)) per tile) small next to the O(2 m n k) flops.
constexpr int64_t kGemmColBlock = 256;

template <class A, class B>
void gemm_tiled(MatrixRM& c, const A& a, const B& b) {
  const int64_t m = a.rows(), n = b.cols();
  c.resize(m, n);
  if (m == 0 || n == 0) return;
  if (a.cols() == 0) {
    c.setZero();
    return;
  }
  const int64_t tm = (m + kGemmRowBlock - 1) / kGemmRowBlock;
  const int64_t tn = (n + kGemmColBlock - 1) / kGemmColBlock;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tm * tn; ++t) {
    const int64_t r0 = (t / tn) * kGemmRowBlock, c0 = (t % tn) * kGemmColBlock;
    const int64_t nr = std::min(kGemmRowBlock, m - r0), nc = std::min(kGemmColBlock, n - c0);
    c.block(r0, c0, nr, nc).noalias() = a.middleRows(r0, nr) * b.middleCols(c0, nc);
  }
}

MatrixView<float> view(MatrixRM& m) { return MatrixView<float>(m.data(), m.rows(), m.cols()); }

// Round to bfloat16, nearest-even (the high-precision mode "bf16": GEMM
// operands in bf16, FP32 accumulation). Inf/NaN stay Inf/NaN.
void round_bf16(MatrixRM& m) {
  float* p = m.data();
  const int64_t n = m.size();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = decode(bfloat16, encode_rn_f32<bfloat16>(p[i], Overflow::nonsaturate));
}

struct Plan {
  const Recipe* r = nullptr;
  bool quantize = false;  // recipe quantizers apply
  bool bf16 = false;      // unquantized operands are rounded to bf16
};

Plan plan_of(const LinearContext& ctx) {
  Plan p;
  p.r = ctx.recipe;
  if (p.r == nullptr) return p;
  p.bf16 = p.r->high_precision == HighPrecision::bf16;
  p.quantize = !p.r->keeps_high_precision(std::string(ctx.layer_name));
  return p;
}

bool any_quantizer(const Recipe& r) {
  for (const auto& q : r.operands)
    if (q) return true;
  return false;
}

RandomStream stream_of(const LinearContext& ctx, Operand op) {
  return RandomStream{ctx.seed, stream_id(ctx.layer_id, op, ctx.step)};
}

// The operand fed to the GEMM: Q_op(m) in place, or m rounded to bf16, or m.
void prepare(const Plan& p, const LinearContext& ctx, Operand op, MatrixRM& m) {
  if (p.quantize && p.r->operand(op)) {
    fake_quantize(*p.r->operand(op), view(m), stream_of(ctx, op));
  } else if (p.bf16) {
    round_bf16(m);
  }
}

// dgrad's W operand is bit-identical to the forward's: the same quantizer on
// the same W, without random bits (stochastic rounding draws from the
// operand's own stream) and without double quantization.
bool reuse_fwd_w(const Plan& p) {
  if (!p.quantize || p.r->double_quantization) return false;
  const auto& f = p.r->operand(Operand::fwd_w);
  const auto& d = p.r->operand(Operand::dgrad_w);
  return f && d && *f == *d && f->round != Round::rs;
}

// Whether the operand needs a modified copy at all.
bool touches(const Plan& p, Operand op) { return p.bf16 || (p.quantize && p.r->operand(op)); }

void check_shapes(const char* fn, const MatrixRM& x, const MatrixRM& w) {
  if (x.cols() != w.cols())
    throw Error(std::string(fn) + ": x is [" + std::to_string(x.rows()) + ", " + std::to_string(x.cols()) +
                "] but W is [" + std::to_string(w.rows()) + ", " + std::to_string(w.cols()) +
                "]: x's columns must equal W's columns (in_features)");
}

}  // namespace

uint64_t stream_id(uint64_t layer_id, Operand op, uint64_t step) {
  if (layer_id >= (uint64_t(1) << 16))
    throw Error("stream_id: layer_id " + std::to_string(layer_id) + " is too large (must be < 65536)");
  if (step >= (uint64_t(1) << 41))
    throw Error("stream_id: step " + std::to_string(step) + " is too large (must be < 2^41)");
  return (uint64_t(0xA) << 60) | (layer_id << 44) | (step << 3) | uint64_t(op);
}

bool linear_is_quantized(const LinearContext& ctx) {
  const Plan p = plan_of(ctx);
  return p.quantize && any_quantizer(*p.r);
}

void linear_forward(const LinearContext& ctx, const MatrixRM& x, const MatrixRM& w, const float* bias, MatrixRM& y,
                    LinearSaved& saved) {
  check_shapes("linear_forward", x, w);
  const Plan p = plan_of(ctx);
  saved.x = x;
  saved.x_q.resize(0, 0);
  saved.w_q.resize(0, 0);
  MatrixRM xq, wq;
  const MatrixRM* xa = &x;
  const MatrixRM* wa = &w;
  if (touches(p, Operand::fwd_x)) {
    xq = x;
    prepare(p, ctx, Operand::fwd_x, xq);
    xa = &xq;
  }
  if (touches(p, Operand::fwd_w)) {
    wq = w;
    prepare(p, ctx, Operand::fwd_w, wq);
    wa = &wq;
  }
  gemm_tiled(y, *xa, wa->transpose());
  if (bias != nullptr) {
    const int64_t rows = y.rows(), cols = y.cols();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = y.data() + r * cols;
      for (int64_t c = 0; c < cols; ++c) yr[c] += bias[c];
    }
  }
  if (p.quantize && p.r->double_quantization && p.r->operand(Operand::fwd_x)) saved.x_q = std::move(xq);
  if (reuse_fwd_w(p)) saved.w_q = std::move(wq);
}

void linear_backward(const LinearContext& ctx, const LinearSaved& saved, const MatrixRM& w, const MatrixRM& dy,
                     MatrixRM& dx, MatrixRM& dw, float* db) {
  check_shapes("linear_backward", saved.x, w);
  if (dy.rows() != saved.x.rows() || dy.cols() != w.rows())
    throw Error("linear_backward: dy is [" + std::to_string(dy.rows()) + ", " + std::to_string(dy.cols()) +
                "], expected [" + std::to_string(saved.x.rows()) + ", " + std::to_string(w.rows()) +
                "] (batch rows of x, out_features of W)");
  const Plan p = plan_of(ctx);
  const bool dq = p.quantize && p.r->double_quantization;

  // dgrad: dx = Q(dy) Q(W'), reduction over out.
  {
    MatrixRM g, wb;
    const MatrixRM* ga = &dy;
    const MatrixRM* wa = &w;
    if (touches(p, Operand::dgrad_grad_y)) {
      g = dy;
      prepare(p, ctx, Operand::dgrad_grad_y, g);
      ga = &g;
    }
    const bool requant_w = dq && p.r->operand(Operand::fwd_w);
    if (reuse_fwd_w(p) && saved.w_q.rows() == w.rows() && saved.w_q.cols() == w.cols()) {
      wa = &saved.w_q;
    } else if (requant_w || touches(p, Operand::dgrad_w)) {
      wb = w;
      // Double quantization: the forward's Q_fwd_w(W) (same stream, same bits), re-quantized along out.
      if (requant_w) fake_quantize(*p.r->operand(Operand::fwd_w), view(wb), stream_of(ctx, Operand::fwd_w));
      prepare(p, ctx, Operand::dgrad_w, wb);
      wa = &wb;
    }
    gemm_tiled(dx, *ga, *wa);
  }

  // wgrad: dW = Q(R dy)^T Q(R x'), reduction over B.
  {
    const bool rht = p.quantize && p.r->wgrad_rht;
    MatrixRM g, xb;
    const MatrixRM* ga = &dy;
    const MatrixRM* xa = &saved.x;
    if (rht || touches(p, Operand::wgrad_grad_y)) {
      g = dy;
      if (rht) rht_forward(view(g), RhtAxis::cols, p.r->rht_seed);
      prepare(p, ctx, Operand::wgrad_grad_y, g);
      ga = &g;
    }
    const bool requant_x = dq && p.r->operand(Operand::fwd_x);
    if (requant_x && saved.x_q.rows() != saved.x.rows())
      throw Error("linear_backward: the recipe uses double_quantization but `saved` holds no Q_fwd_x(x); pass the "
                  "LinearSaved that linear_forward filled with the same context");
    if (rht || requant_x || touches(p, Operand::wgrad_x)) {
      xb = requant_x ? saved.x_q : saved.x;
      if (rht) rht_forward(view(xb), RhtAxis::cols, p.r->rht_seed);
      prepare(p, ctx, Operand::wgrad_x, xb);
      xa = &xb;
    }
    gemm_tiled(dw, ga->transpose(), *xa);
  }

  if (db != nullptr) {
    // Column strips of 64, rows in order: a fixed summation order per column.
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
}

}  // namespace fp4lab
