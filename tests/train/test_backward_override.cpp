// A recipe's backward_override (recipes/recipe.hpp, TE's NVTE_BACKWARD_OVERRIDE)
// on the CPU reference layer, against a construction by another path: the
// forward is the recipe's own; with "dequantized" the backward equals the
// high-precision layer's backward on x' = Q_fwd_x(x) and W' = Q_fwd_w(W) made
// by sim's fake_quantize with the forward's streams; with "high_precision" it
// equals the high-precision layer's backward on x and W themselves.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "recipes/linear_plan.hpp"
#include "recipes/recipe.hpp"
#include "sim/quantizer.hpp"
#include "train/backend.hpp"
#include "train/backend_cases.hpp"  // randv, put

using fp4lab::LinearContext;
using fp4lab::Operand;
using fp4lab::Recipe;
using fp4lab::HighPrecision;
using fp4lab::MatrixView;
using fp4lab::RandomStream;
using namespace fp4lab::train;
using fp4lab::train::test::put;
using fp4lab::train::test::randv;

namespace {

struct Pass {
  std::vector<float> y, dx, dw, db;
};
// One forward and backward of a layer with context ctx on x [B, in], W [out, in], bias, dy [B, out].
Pass pass(Backend& be, const LinearContext& ctx, const std::vector<float>& x, const std::vector<float>& w,
          const std::vector<float>& b, const std::vector<float>& dy, int64_t B, int64_t in, int64_t out) {
  Tensor xt = put(be, x, B, in), wt = put(be, w, out, in), bt = put(be, b, 1, out), dyt = put(be, dy, B, out);
  Tensor y, dx, dw = be.zeros(out, in), db = be.zeros(1, out);
  std::unique_ptr<LinearState> st;
  be.linear_forward(ctx, xt, wt, bt.data, y, st);
  be.linear_backward(ctx, *st, wt, dyt, dx, dw, db.data);
  auto get = [&](const Tensor& t) {
    std::vector<float> v(size_t(t.size()));
    be.download(t, v.data());
    return v;
  };
  return Pass{get(y), get(dx), get(dw), get(db)};
}
bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST_CASE("backward_override on the CPU layer: the recipe's forward, the backward of the high-precision layer") {
  auto be = make_cpu_backend(2);
  const int64_t B = 48, in = 64, out = 32;
  const std::vector<float> x = randv(size_t(B * in), 1), w = randv(size_t(out * in), 2, 0.1f),
                           b = randv(size_t(out), 3), dy = randv(size_t(B * out), 4, 1e-2f);
  const uint64_t seed = 9, id = 4, step = 12;
  for (const char* base_name : {"nvfp4", "mxfp8", "tetrajet"}) {
    const Recipe base = fp4lab::recipe_by_name(base_name);
    const Recipe hp_recipe = fp4lab::recipe_by_name("bf16");
    const Recipe* hp = base.high_precision == HighPrecision::bf16 ? &hp_recipe : nullptr;
    const LinearContext base_ctx{&base, seed, id, step, "h.0.mlp.c_fc"};
    const Pass want_fwd = pass(*be, base_ctx, x, w, b, dy, B, in, out);
    for (const char* mode : {"high_precision", "dequantized"}) {
      CAPTURE(base_name);
      CAPTURE(mode);
      const Recipe r = fp4lab::parse_recipe(std::string(R"({"extends": ")") + base_name + R"(", "backward_override": ")" +
                                    mode + "\"}");
      const Pass got = pass(*be, LinearContext{&r, seed, id, step, "h.0.mlp.c_fc"}, x, w, b, dy, B, in, out);
      CHECK(same(got.y, want_fwd.y));  // the forward is the recipe's
      // The construction: x', W' by sim (dequantized) or as they are, through the high-precision layer.
      std::vector<float> xq = x, wq = w;
      if (std::string(mode) == "dequantized") {
        fp4lab::fake_quantize(*base.operand(Operand::fwd_x), MatrixView<float>(xq.data(), B, in),
                      RandomStream{seed, fp4lab::stream_id(id, Operand::fwd_x, step)});
        fp4lab::fake_quantize(*base.operand(Operand::fwd_w), MatrixView<float>(wq.data(), out, in),
                      RandomStream{seed, fp4lab::stream_id(id, Operand::fwd_w, step)});
        CHECK_FALSE(same(xq, x));  // the quantization did something
      }
      const Pass want = pass(*be, LinearContext{hp, seed, id, step, "h.0.mlp.c_fc"}, xq, wq, b, dy, B, in, out);
      CHECK(same(got.dx, want.dx));
      CHECK(same(got.dw, want.dw));
      CHECK(same(got.db, want.db));
      CHECK_FALSE(same(got.dw, want_fwd.dw));  // and it is not the recipe's own backward
    }
  }
}
