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

// 4 sequences of 16 tokens, tokens and targets drawn from a vocabulary of 11 (the memory tests' GPTs).
Batch token_batch(uint32_t seed) {
  std::mt19937 r(seed);
  Batch b;
  b.size = 4;
  for (int i = 0; i < 64; ++i) b.tokens.push_back(int32_t(r() % 11)), b.targets.push_back(int32_t(r() % 11));
  return b;
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

// Memory (Backend::device_memory, the CPU backend's count of its tensors): a step leaves nothing of its forward
// behind (each block's saved tensors are dropped once its backward has run), and an evaluation holds one block's
// tensors at a time (no backward reads them). Before the drops, a step left every block's saved activations in
// use until the next forward replaced them, and an evaluation kept all of them.
TEST_CASE("gpt: a step's saved activations are released by its backward; an evaluation holds one block at a time") {
  auto be = make_cpu_backend(1);
  ModelConfig c;
  c.type = "gpt", c.layers = 4, c.heads = 2, c.width = 32, c.context = 16, c.vocab_size = 11, c.bias = true;
  auto m = make_model(c, *be, 4);
  const Batch b = token_batch(3);
  StepContext train{nullptr, 1, 0, true}, eval{nullptr, 1, 0, false};
  const int64_t base = be->device_memory()->tensors_in_use;  // the parameters and their gradients
  CHECK(base >= 2 * m->params().size() * int64_t(sizeof(float)));
  int64_t step_peak = 0;
  for (int s = 0; s < 2; ++s) {
    be->reset_device_memory_peaks();
    const double loss = m->forward_backward(b, train, nullptr);
    CHECK(std::isfinite(loss));
    const Backend::DeviceMemory after = be->device_memory().value();
    CHECK_MESSAGE(after.tensors_in_use == base, "step ", s, ": ", after.tensors_in_use - base, " bytes left over");
    step_peak = after.tensors_in_use_peak - base;
  }
  be->reset_device_memory_peaks();
  m->evaluate(b, eval, nullptr);
  const Backend::DeviceMemory after = be->device_memory().value();
  CHECK(after.tensors_in_use == base);
  const int64_t eval_peak = after.tensors_in_use_peak - base;
  // One block's forward tensors at this shape: x_in, a, att, x_mid, m_in (5 x 64 x 32), qkv (64 x 96), f and g
  // (2 x 64 x 128), the probabilities (4 x 2 x 16 x 16), mean and rstd (4 x 64) floats.
  const int64_t block = (5 * 64 * 32 + 64 * 96 + 2 * 64 * 128 + 4 * 2 * 16 * 16 + 4 * 64) * int64_t(sizeof(float));
  CHECK_MESSAGE(step_peak >= 4 * block, "the step's peak holds the 4 blocks' saved tensors: ", step_peak);
  CHECK_MESSAGE(eval_peak < 2 * block, "an evaluation's peak ", eval_peak, " against one block's ", block);
}

TEST_CASE("vit: a step leaves nothing of its forward in use; neither does an evaluation") {
  auto be = make_cpu_backend(1);
  ModelConfig c;
  c.type = "vit", c.layers = 3, c.heads = 2, c.width = 16, c.image_size = 8, c.patch_size = 4, c.classes = 3;
  c.mlp_ratio = 2.0, c.dropout = 0.1;
  auto m = make_model(c, *be, 5);
  std::mt19937 r(4);
  std::normal_distribution<float> nd;
  Batch b;
  b.size = 4;
  for (int i = 0; i < 4 * 64; ++i) b.images.push_back(nd(r));
  b.targets = {1, 2, 0, 1};
  StepContext train{nullptr, 1, 0, true}, eval{nullptr, 1, 0, false};
  const int64_t base = be->device_memory()->tensors_in_use;
  for (int s = 0; s < 2; ++s) {
    train.step = uint64_t(s);
    CHECK(std::isfinite(m->forward_backward(b, train, nullptr)));
    CHECK_MESSAGE(be->device_memory()->tensors_in_use == base, "step ", s, ": ",
                  be->device_memory()->tensors_in_use - base, " bytes left over");
  }
  CHECK(std::isfinite(m->evaluate(b, eval, nullptr)));
  CHECK(be->device_memory()->tensors_in_use == base);
}

TEST_CASE("gpt with a mixture of experts: a step and an evaluation leave only the routing in use") {
  auto be = make_cpu_backend(1);
  ModelConfig c;
  c.type = "gpt", c.layers = 3, c.heads = 2, c.width = 32, c.context = 16, c.vocab_size = 11;
  c.moe.experts = 4, c.moe.top_k = 2, c.moe.shared_expert = true;
  auto m = make_model(c, *be, 4);
  const Batch b = token_batch(5);
  StepContext train{nullptr, 1, 0, true}, eval{nullptr, 1, 0, false};
  const int64_t base = be->device_memory()->tensors_in_use;
  // Less than one of the smallest tensors a MoE layer saves for its backward: the slots' rows [N k, C].
  const int64_t grouped = 64 * 2 * 32 * int64_t(sizeof(float));
  for (int s = 0; s < 2; ++s) {
    train.step = uint64_t(s);
    CHECK(std::isfinite(m->forward_backward(b, train, nullptr)));
    const int64_t left = be->device_memory()->tensors_in_use - base;
    CHECK_MESSAGE(left < grouped, "step ", s, ": ", left, " bytes left over");
    CHECK(m->step_metrics().contains("expert_load"));  // the routing's figures outlive the release
  }
  CHECK(std::isfinite(m->evaluate(b, eval, nullptr)));
  CHECK(be->device_memory()->tensors_in_use - base < grouped);
}
