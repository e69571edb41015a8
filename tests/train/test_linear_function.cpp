// The standalone layer over caller memory (train/linear_function.hpp):
//  - bit for bit the trainer's own layer (Backend::linear_forward/backward of
//    the CPU backend on owned tensors, accumulating into zeroed dW/db) for
//    fp32, mx_baseline, tetrajet (SR, double quantization), nvfp4 (SR, 2-D
//    weight tiles, wgrad RHT) and an fp4tk recipe (no forward bias);
//  - an independent oracle: each operand made here with sim's quantize() on the
//    documented stream (seed, 0xA<<60 | layer<<44 | step<<3 | operand), the
//    GEMMs in float64, within FP32 accumulation error;
//  - SR: same seed and step -> same bits, another seed or step -> other bits;
//  - dW/db written, not accumulated (garbage in the caller's buffers ignored).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "sim/quantizer.hpp"
#include "sim/rht.hpp"
#include "train/backend.hpp"
#include "train/linear_function.hpp"

using namespace fp4lab;
using namespace fp4lab::train;

namespace {

using Vec = std::vector<float>;

Vec randv(size_t n, uint32_t seed, float sigma) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  Vec v(n);
  for (float& f : v) f = d(g);
  return v;
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
  int64_t rows = 40, in = 48, out = 24;  // not multiples of 16/32: partial blocks and RHT chunks
  Vec x, w, b, dy;
  uint64_t seed = 99, layer = 5, step = 11;
  Case() {
    x = randv(size_t(rows * in), 1, 1.0f);
    w = randv(size_t(out * in), 2, 0.1f);
    b = randv(size_t(out), 3, 1.0f);
    dy = randv(size_t(rows * out), 4, 1e-3f);
  }
};

struct Grads {
  Vec y, dx, dw, db;
};

Grads run_function(const std::string& recipe, const Case& c, uint64_t seed, uint64_t step) {
  LinearFunction f(LinearFunctionOptions{"cpu", recipe, "blocks.0.fc", c.layer, seed, 0});
  Grads g;
  g.y.assign(size_t(c.rows * c.out), NAN);
  g.dx.assign(size_t(c.rows * c.in), NAN);
  g.dw.assign(size_t(c.out * c.in), NAN);  // garbage: backward writes, not accumulates
  g.db.assign(size_t(c.out), NAN);
  auto s = f.forward(step, c.x.data(), c.rows, c.in, c.w.data(), c.out, c.b.data(), g.y.data());
  REQUIRE(s);
  f.backward(*s, c.w.data(), c.dy.data(), g.dx.data(), g.dw.data(), g.db.data());
  return g;
}

// The trainer's path: the CPU backend on owned tensors, as train/model.hpp's layers call it.
Grads run_trainer(const std::string& recipe, const Case& c) {
  const Recipe r = parse_recipe(recipe);
  auto be = make_backend("cpu");
  LinearContext ctx{&r, c.seed, c.layer, c.step, "blocks.0.fc", true};
  train::Tensor x = be->empty(c.rows, c.in), w = be->empty(c.out, c.in), dy = be->empty(c.rows, c.out);
  be->upload(c.x.data(), x);
  be->upload(c.w.data(), w);
  be->upload(c.dy.data(), dy);
  train::Tensor y, dx;
  std::unique_ptr<LinearState> st;
  be->linear_forward(ctx, x, w, c.b.data(), y, st);
  train::Tensor dw = be->zeros(c.out, c.in);
  Grads g;
  g.db.assign(size_t(c.out), 0.0f);
  be->linear_backward(ctx, *st, w, dy, dx, dw, g.db.data());
  g.y.resize(size_t(y.size()));
  g.dx.resize(size_t(dx.size()));
  g.dw.resize(size_t(dw.size()));
  be->download(y, g.y.data());
  be->download(dx, g.dx.data());
  be->download(dw, g.dw.data());
  return g;
}

uint64_t documented_stream(uint64_t layer, Operand op, uint64_t step) {
  return (uint64_t(0xA) << 60) | (layer << 44) | (step << 3) | uint64_t(op);
}

// Operand op of the recipe made here from its source (r x c): an optional
// pre-quantization, the optional wgrad RHT, the operand's quantizer.
Vec make_operand(const Recipe& r, const Case& c, Operand op, const Vec& src, int64_t rows, int64_t cols) {
  Vec m = src;
  auto q = [&](const QuantizerSpec& spec, Operand stream_op) {
    const QuantizedTensor t =
        quantize(spec, MatrixView<const float>(m.data(), rows, cols), RandomStream{c.seed, documented_stream(c.layer, stream_op, c.step)});
    m = t.dequant;
  };
  if (r.double_quantization && op == Operand::dgrad_w && r.operand(Operand::fwd_w))
    q(*r.operand(Operand::fwd_w), Operand::fwd_w);
  if (r.double_quantization && r.double_quantization_x && op == Operand::wgrad_x && r.operand(Operand::fwd_x))
    q(*r.operand(Operand::fwd_x), Operand::fwd_x);
  if (r.wgrad_rht && (op == Operand::wgrad_x || op == Operand::wgrad_grad_y))
    rht_forward(MatrixView<float>(m.data(), rows, cols), RhtAxis::cols, r.rht_seed);
  if (r.operand(op)) q(*r.operand(op), op);
  return m;
}

// C[M,N] = A[M,K] B[K,N] (A(i,k) = a[i*sa_i + k*sa_k], B likewise) in float64,
// with the bound 2 K 2^-24 sum |a||b| of an FP32 accumulation in any order.
void gemm64(int64_t M, int64_t N, int64_t K, const Vec& a, int64_t sai, int64_t sak, const Vec& b, int64_t sbk,
            int64_t sbj, std::vector<double>& c, std::vector<double>& bound) {
  c.assign(size_t(M * N), 0.0);
  bound.assign(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0, sa = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(a[size_t(i * sai + k * sak)]) * double(b[size_t(k * sbk + j * sbj)]);
        s += p;
        sa += std::fabs(p);
      }
      c[size_t(i * N + j)] = s;
      bound[size_t(i * N + j)] = 2.0 * double(K + 2) * std::ldexp(1.0, -24) * sa;
    }
}

int64_t count_outside(const Vec& got, const std::vector<double>& ref, const std::vector<double>& bound,
                      const float* add = nullptr, int64_t cols = 1) {
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double extra = add ? double(add[i % size_t(cols)]) : 0.0;
    const double tol = bound[i] + 2 * std::ldexp(std::fabs(ref[i] + extra), -24) + 1e-30;
    if (!(std::fabs(double(got[i]) - (ref[i] + extra)) <= tol)) ++bad;
  }
  return bad;
}

}  // namespace

TEST_CASE("LinearFunction: the trainer's CPU layer bit for bit, and an independent quantize() + float64 oracle") {
  const Case c;
  for (const char* name : {"fp32", "mx_baseline", "tetrajet", "nvfp4", "fp4tk_mx_baseline"}) {
    CAPTURE(name);
    const Grads f = run_function(name, c, c.seed, c.step);
    const Grads t = run_trainer(name, c);
    CHECK(same_bits(f.y, t.y));
    CHECK(same_bits(f.dx, t.dx));
    CHECK(same_bits(f.dw, t.dw));
    CHECK(same_bits(f.db, t.db));

    const Recipe r = parse_recipe(name);
    const Vec ox = make_operand(r, c, Operand::fwd_x, c.x, c.rows, c.in);
    const Vec ow = make_operand(r, c, Operand::fwd_w, c.w, c.out, c.in);
    const Vec og = make_operand(r, c, Operand::dgrad_grad_y, c.dy, c.rows, c.out);
    const Vec owd = make_operand(r, c, Operand::dgrad_w, c.w, c.out, c.in);
    const Vec ogw = make_operand(r, c, Operand::wgrad_grad_y, c.dy, c.rows, c.out);
    const Vec oxw = make_operand(r, c, Operand::wgrad_x, c.x, c.rows, c.in);
    std::vector<double> ref, bound;
    // y = x W^T (+ b): A = ox [rows, in], B(k, j) = W[j, k].
    gemm64(c.rows, c.out, c.in, ox, c.in, 1, ow, 1, c.in, ref, bound);
    const bool add_bias = r.forward_bias || !r.operand(Operand::fwd_x);
    CHECK(count_outside(f.y, ref, bound, add_bias ? c.b.data() : nullptr, c.out) == 0);
    // dx = dy W': A = og [rows, out], B = owd [out, in].
    gemm64(c.rows, c.in, c.out, og, c.out, 1, owd, c.in, 1, ref, bound);
    CHECK(count_outside(f.dx, ref, bound) == 0);
    // dW = (R dy)^T (R x'): A(i, k) = ogw[k, i], B = oxw [rows, in].
    gemm64(c.out, c.in, c.rows, ogw, 1, c.out, oxw, c.in, 1, ref, bound);
    CHECK(count_outside(f.dw, ref, bound) == 0);
    // db: column sums of dy (float64, rounded once).
    for (int64_t j = 0; j < c.out; ++j) {
      double s = 0;
      for (int64_t i = 0; i < c.rows; ++i) s += double(c.dy[size_t(i * c.out + j)]);
      CHECK(f.db[size_t(j)] == float(s));
    }
  }
}

TEST_CASE("LinearFunction: stochastic rounding is reproducible per (seed, step) and changes with either") {
  const Case c;
  for (const char* name : {"nvfp4", "tetrajet"}) {
    CAPTURE(name);
    const Grads a = run_function(name, c, c.seed, c.step), b = run_function(name, c, c.seed, c.step);
    CHECK(same_bits(a.dx, b.dx));
    CHECK(same_bits(a.dw, b.dw));
    const Grads s2 = run_function(name, c, c.seed + 1, c.step), t2 = run_function(name, c, c.seed, c.step + 1);
    CHECK(same_bits(a.y, s2.y));  // the forward quantizers round to nearest
    CHECK_FALSE(same_bits(a.dw, s2.dw));
    CHECK_FALSE(same_bits(a.dw, t2.dw));
  }
}

TEST_CASE("LinearFunction: evaluation forward, bad arguments") {
  const Case c;
  LinearFunction f(LinearFunctionOptions{"cpu", "nvfp4", "fc", 1, 2, 0});
  CHECK(f.quantized());
  Vec y1(size_t(c.rows * c.out)), y2(y1.size());
  auto s = f.forward(0, c.x.data(), c.rows, c.in, c.w.data(), c.out, nullptr, y1.data(), true);
  CHECK(f.forward(0, c.x.data(), c.rows, c.in, c.w.data(), c.out, nullptr, y2.data(), false) == nullptr);
  CHECK(same_bits(y1, y2));
  LinearFunction g(LinearFunctionOptions{"cpu", "nvfp4", "fc", 1, 2, 0});
  Vec dx(c.x.size()), dw(c.w.size());
  CHECK_THROWS_AS(g.backward(*s, c.w.data(), c.dy.data(), dx.data(), dw.data(), nullptr), Error);
  CHECK_THROWS_AS(LinearFunction(LinearFunctionOptions{"cpu", "no_such_recipe", "fc", 0, 0, 0}), Error);
  CHECK_THROWS_AS(LinearFunction(LinearFunctionOptions{"tpu", "fp32", "fc", 0, 0, 0}), Error);
  CHECK_THROWS_AS(LinearFunction(LinearFunctionOptions{"cpu", "fp32", "fc", 1 << 16, 0, 0}), Error);
  // A layer kept in high precision by the recipe's own patterns is not quantized.
  LinearFunction k(LinearFunctionOptions{"cpu", R"({"extends": "nvfp4", "keep_high_precision": ["head"]})", "head", 0, 0, 0});
  CHECK_FALSE(k.quantized());
}
