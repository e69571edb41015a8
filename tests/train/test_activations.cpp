// precision.activations (train/config.hpp; the semantics: docs/DESIGN.md,
// "BF16 activations"): the config key, the models under "bf16" (every linear
// layer of the dense GPT is handed BF16 values by its producers; the mode is
// set per pass and leaves nothing behind), and short training runs: close to
// fp32's loss, not equal to it. The ops' exactness: tests/train/cpu/test_bf16_activations.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>

#include "core/error.hpp"
#include "train/config.hpp"
#include "train/forwarding_backend.hpp"
#include "train/model.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"

using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

bool bf16_valued(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, p + i, 4);
    if ((u & 0xFFFFu) != 0) return false;
  }
  return true;
}

// Watches the operands the linear layers are handed: counts those that are not all BF16 values.
class LinearWatch final : public test::ForwardingBackend {
 public:
  LinearWatch() : ForwardingBackend(make_cpu_backend(2)) {}
  using Backend::linear_backward;
  using Backend::linear_forward;
  void linear_forward(const LayerPlan& l, const Tensor& x, const Tensor& w, const float* b, Tensor& y,
                      std::unique_ptr<LinearState>& state, const ProducerOutputs* from,
                      ProducerOutputs* y_out) override {
    ++calls;
    if (!bf16_valued(x.data, x.size())) not_bf16.push_back(std::string(l.ctx.layer_name) + ".x");
    ForwardingBackend::linear_forward(l, x, w, b, y, state, from, y_out);
    if (!bf16_valued(y.data, y.size())) not_bf16.push_back(std::string(l.ctx.layer_name) + ".y");
  }
  void linear_backward(const LayerPlan& l, const LinearState& state, const Tensor& w, const Tensor& dy, Tensor& dx,
                       Tensor& dw_acc, float* db_acc, const ProducerOutputs* from,
                       ProducerOutputs* dx_out) override {
    ++calls;
    if (!bf16_valued(dy.data, dy.size())) not_bf16.push_back(std::string(l.ctx.layer_name) + ".dy");
    ForwardingBackend::linear_backward(l, state, w, dy, dx, dw_acc, db_acc, from, dx_out);
    if (!bf16_valued(dx.data, dx.size())) not_bf16.push_back(std::string(l.ctx.layer_name) + ".dx");
  }
  int64_t calls = 0;
  std::vector<std::string> not_bf16;
};

ModelConfig tiny_gpt(int64_t experts = 0) {
  ModelConfig c;
  c.type = "gpt", c.layers = 2, c.heads = 2, c.width = 16, c.context = 8, c.vocab_size = 11, c.bias = true;
  c.dropout = 0.1;
  c.moe.experts = experts;
  return c;
}
Batch token_batch(int64_t B, int64_t T, int64_t V) {
  std::mt19937 r(7);
  Batch b;
  b.size = B;
  for (int64_t i = 0; i < B * T; ++i)
    b.tokens.push_back(int32_t(r() % uint32_t(V))), b.targets.push_back(int32_t(r() % uint32_t(V)));
  return b;
}
StepContext ctx(ActivationPrecision a) {
  StepContext s{nullptr, 3, 0, true};
  s.activations = a;
  return s;
}
std::vector<float> grads(Model& m) {
  const Tensor& g = m.params().grads;
  return std::vector<float>(g.data, g.data + g.size());
}
double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return ab / std::sqrt(aa * bb);
}

}  // namespace

TEST_CASE("config precision.activations: parsed once, default fp32 (absent from the config), bf16 in the identity") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_activations_config";
  fs::remove_all(tmp);
  const std::string text = test::write_words_corpus(tmp);
  json j = test::tiny_gpt_config(text, (tmp / "runs").string());
  const RunConfig plain = config_from_json(j);
  CHECK(plain.activations == ActivationPrecision::fp32);
  const json plain_json = config_to_json(plain);
  CHECK_FALSE(plain_json.contains("precision"));
  j["precision"] = {{"activations", "fp32"}};
  CHECK(config_hash(config_to_json(config_from_json(j))) == config_hash(plain_json));  // the default: the same run
  j["precision"] = {{"activations", "bf16"}};
  const RunConfig bf = config_from_json(j);
  CHECK(bf.activations == ActivationPrecision::bf16);
  const json bf_json = config_to_json(bf);
  CHECK(bf_json.at("precision").at("activations") == "bf16");
  CHECK(run_identity(bf_json).at("precision").at("activations") == "bf16");
  CHECK(config_hash(bf_json) != config_hash(plain_json));
  CHECK(config_from_json(bf_json).activations == ActivationPrecision::bf16);  // round trip

  j["precision"] = {{"activations", "fp16"}};
  CHECK(test::config_error(j) == "config.precision.activations: \"fp16\" is not valid; valid: fp32, bf16");
  j["precision"] = {{"weights", "bf16"}};
  CHECK(test::config_error(j).starts_with("config.precision.weights: unknown key"));
  // Both backends run it (the cuda backend's twin: tests/train/cuda/test_backend.cpp, op table and model steps).
  j["precision"] = {{"activations", "bf16"}};
  j["backend"] = "cuda";
  CHECK(config_from_json(j).activations == ActivationPrecision::bf16);
  fs::remove_all(tmp);
}

TEST_CASE("gpt under bf16 activations: every linear layer is handed BF16 x and dy and writes BF16 y and dx") {
  LinearWatch be;
  const ModelConfig c = tiny_gpt();
  auto m = make_model(c, be, 4);
  const Batch b = token_batch(3, c.context, c.vocab_size);
  const double loss = m->forward_backward(b, ctx(ActivationPrecision::bf16), nullptr);
  CHECK(std::isfinite(loss));
  CHECK(be.calls == 2 * 9);  // 9 linear layers, forward and backward
  std::string bad;
  for (const auto& s : be.not_bf16) bad += s + " ";
  CHECK_MESSAGE(be.not_bf16.empty(), "not BF16 values: ", bad);
  // fp32 mode hands them FP32 values (the watch can tell).
  be.not_bf16.clear();
  m->forward_backward(b, ctx(ActivationPrecision::fp32), nullptr);
  CHECK_FALSE(be.not_bf16.empty());
}

TEST_CASE("gpt, MoE gpt and vit under bf16 activations: loss and gradients close to fp32's, not equal") {
  ModelConfig vit;
  vit.type = "vit", vit.layers = 1, vit.heads = 2, vit.width = 8, vit.image_size = 8, vit.patch_size = 4;
  vit.classes = 3, vit.dropout = 0.1;
  for (const ModelConfig& c : {tiny_gpt(), tiny_gpt(4), vit}) {
    INFO(c.type, c.moe.experts ? " (MoE)" : "");
    Batch b;
    if (c.type == "gpt") {
      b = token_batch(3, c.context, c.vocab_size);
    } else {
      std::mt19937 r(3);
      std::normal_distribution<float> nd;
      b.size = 4;
      for (int i = 0; i < 4 * 64; ++i) b.images.push_back(nd(r));
      b.targets = {1, 2, 0, 1};
    }
    double loss[2];
    std::vector<float> g[2];
    int k = 0;
    for (ActivationPrecision a : {ActivationPrecision::fp32, ActivationPrecision::bf16}) {
      auto be = make_cpu_backend(2);
      auto m = make_model(c, *be, 4);
      loss[k] = m->forward_backward(b, ctx(a), nullptr);
      g[k] = grads(*m);
      ++k;
    }
    CHECK(loss[1] != loss[0]);
    CHECK(std::abs(loss[1] - loss[0]) <= 0.01 * std::abs(loss[0]));
    CHECK(g[1] != g[0]);
    CHECK(cosine(g[0], g[1]) > 0.999);
  }
}

TEST_CASE("the activation precision is set per pass: a bf16 pass leaves an fp32 pass's bits unchanged") {
  const ModelConfig c = tiny_gpt(4);
  const Batch b = token_batch(3, c.context, c.vocab_size);
  auto be1 = make_cpu_backend(2), be2 = make_cpu_backend(2);
  auto m1 = make_model(c, *be1, 4), m2 = make_model(c, *be2, 4);
  m1->forward_backward(b, ctx(ActivationPrecision::bf16), nullptr);
  m1->evaluate(b, ctx(ActivationPrecision::bf16), nullptr);
  be1->fill(m1->params().grads, 0.0f);
  const double l1 = m1->forward_backward(b, ctx(ActivationPrecision::fp32), nullptr);
  const double l2 = m2->forward_backward(b, ctx(ActivationPrecision::fp32), nullptr);
  CHECK(l1 == l2);
  CHECK(grads(*m1) == grads(*m2));
  CHECK(m1->evaluate(b, ctx(ActivationPrecision::fp32), nullptr) ==
        m2->evaluate(b, ctx(ActivationPrecision::fp32), nullptr));
}

TEST_CASE("a tiny GPT run under bf16 activations: trains, its loss close to fp32's, not equal") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_activations_run";
  fs::remove_all(tmp);
  const std::string text = test::write_words_corpus(tmp);
  RunResult r[2];
  int k = 0;
  for (const char* a : {"fp32", "bf16"}) {
    json j = test::tiny_gpt_config(text, (tmp / "runs").string());
    j["precision"] = {{"activations", a}};
    j["output"]["name"] = std::string("run_") + a;
    std::ostringstream log;
    RunOptions o;
    o.log = &log;
    o.progress = false;
    r[k++] = run_training(config_from_json(j), o);
  }
  for (const RunResult& x : r) {
    CHECK(x.status == "completed");
    REQUIRE(x.step_losses.size() == 60);
  }
  double first = 0, last[2] = {0, 0};
  for (int i = 0; i < 5; ++i) {
    first += r[1].step_losses[size_t(i)];
    for (int m = 0; m < 2; ++m) last[m] += r[m].step_losses[size_t(55 + i)];
  }
  CHECK(last[1] < 0.7 * first);  // it trains
  CHECK(r[1].step_losses != r[0].step_losses);
  CHECK(std::abs(last[1] - last[0]) <= 0.03 * last[0]);  // a 60-step run of 5-step means: within 3%
  const json saved = read_json_file((fs::path(r[1].dir) / "config.json").string());
  CHECK(saved.at("precision").at("activations") == "bf16");
  fs::remove_all(tmp);
}
