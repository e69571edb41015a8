// Models (train/vit.cpp, gpt.cpp): the full backward pass of each model
// matches finite differences of its loss, parameter by parameter.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "train/model.hpp"

using namespace fp4lab::train;

namespace {

void check_model(Model& m, const Batch& b) {
  ParamStore& ps = m.params();
  StepContext train{nullptr, 1, 0, true}, eval{nullptr, 1, 0, false};
  m.forward_backward(b, train, nullptr);  // dropout 0: train == eval
  std::vector<float> g(ps.grads.data, ps.grads.data + ps.size());
  for (int k = 0; k < int(ps.infos().size()); ++k) {
    const ParamInfo& p = ps.info(k);
    for (int64_t i : {int64_t(0), p.size() / 2, p.size() - 1}) {
      float* x = ps.values.data + p.offset + i;
      const float x0 = *x, eps = 2e-3f;
      *x = x0 + eps;
      const double lp = m.evaluate(b, eval, nullptr);
      *x = x0 - eps;
      const double lm = m.evaluate(b, eval, nullptr);
      *x = x0;
      const double fd = (lp - lm) / (2.0 * eps), an = g[size_t(p.offset + i)];
      CHECK_MESSAGE(std::abs(fd - an) <= 2e-3 + 3e-2 * std::abs(fd), p.name, "[", i, "]: fd ", fd, " analytic ", an);
    }
  }
}

}  // namespace

TEST_CASE("gpt (tied lm_head, bias on): gradients of every parameter") {
  auto be = make_cpu_backend(2);
  ModelConfig c;
  c.type = "gpt", c.layers = 2, c.heads = 2, c.width = 8, c.context = 5, c.vocab_size = 7, c.bias = true;
  auto m = make_model(c, *be, 4);
  CHECK(m->linear_layers().back().name == "lm_head");
  CHECK(m->linear_layers().size() == 9);
  std::mt19937 r(2);
  Batch b;
  b.size = 3;
  for (int i = 0; i < 15; ++i) b.tokens.push_back(int32_t(r() % 7)), b.targets.push_back(int32_t(r() % 7));
  check_model(*m, b);
}

TEST_CASE("vit (fp4-trainkit's block, sqrt(head_dim) score scale): gradients of every parameter") {
  auto be = make_cpu_backend(2);
  ModelConfig c;
  c.type = "vit", c.layers = 1, c.heads = 2, c.width = 8, c.image_size = 8, c.patch_size = 4, c.classes = 3;
  c.mlp_ratio = 2.0, c.dropout = 0.0, c.attn_scale = "sqrt_head_dim";
  auto m = make_model(c, *be, 5);
  CHECK(m->linear_layers().front().name == "patch_embed");
  CHECK(m->linear_layers().back().name == "head");
  std::mt19937 r(3);
  std::normal_distribution<float> nd;
  Batch b;
  b.size = 2;
  for (int i = 0; i < 2 * 64; ++i) b.images.push_back(nd(r));
  b.targets = {1, 2};
  check_model(*m, b);
}
