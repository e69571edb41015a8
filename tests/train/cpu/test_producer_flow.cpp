// The models' producer -> consumer edges (train/model.hpp outputs_for /
// output_tensor, train/backend.hpp ProducerOutputs), on the CPU, where every
// CI run sees them. The CPU backend states no needs, so here a wrapper (Flow)
// states a CUDA-like set: BF16 where a layer's plan makes both GEMM operands of
// the tensor by plain BF16 rounding, amaxes where it quantizes them. Its
// producers write those outputs on the host (RNE BF16, the tensor amax), and
// write no FP32 values where the model dropped them; its linear layers take an
// input with no FP32 values from the BF16 the producer wrote. So a model that
// drops FP32 values that another op reads, or hands a consumer outputs its
// producer never wrote, fails here; a model that states its edges right gives
// the bits of the plain CPU step (a BF16 operand is the rounding the layer
// would make itself).
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/encode.hpp"
#include "recipes/recipe.hpp"
#include "train/forwarding_backend.hpp"
#include "train/model.hpp"

using namespace fp4lab::train;

namespace {

bool bf16_rounding_only(const fp4lab::OperandPlan& p) {
  return p.round_bf16 && p.quantizer == nullptr && p.pre == nullptr && !p.rht;
}

// A CPU backend whose producers write outputs for their consumers (see the file comment).
class Flow final : public fp4lab::train::test::ForwardingBackend {
 public:
  Flow() : ForwardingBackend(make_cpu_backend(2)) {}

  struct Edge {
    int64_t rows = 0, cols = 0;
    bool f32 = true, bf16 = false, amax = false;
    int produced = 0, consumed = 0;
  };
  std::map<const void*, Edge> edges;  // by the outputs' buffer
  int violations = 0;                 // an op given a tensor without FP32 values it needed

  LinearInputNeeds linear_input_needs(const LayerPlan& l, bool grad, int64_t, int64_t) override {
    using fp4lab::Operand;
    const fp4lab::OperandPlan& a = l.plan.operand(grad ? Operand::dgrad_grad_y : Operand::fwd_x);
    const fp4lab::OperandPlan& b = l.plan.operand(grad ? Operand::wgrad_grad_y : Operand::wgrad_x);
    if (bf16_rounding_only(a) && bf16_rounding_only(b)) return LinearInputNeeds{true, std::nullopt};
    if (l.ctx.backward && a.quantizer && b.quantizer) return LinearInputNeeds{false, AmaxRequest{}};
    return {};
  }
  ProducerOutputs producer_outputs(const LinearInputNeeds& needs, int64_t rows, int64_t cols) override {
    ProducerOutputs o;
    o.rows = rows;
    o.cols = cols;
    if (needs.bf16) {
      o.bf16_mem = std::shared_ptr<float[]>(new float[size_t((rows * cols + 1) / 2 + 1)]);
      o.bf16 = reinterpret_cast<uint16_t*>(o.bf16_mem.get());
    }
    if (needs.amax) {
      o.amax_mem = std::shared_ptr<float[]>(new float[2]);
      o.amax = reinterpret_cast<uint32_t*>(o.amax_mem.get());
      o.request = *needs.amax;
    }
    if (const void* k = key(o)) {
      REQUIRE(edges.count(k) == 0);
      edges[k] = Edge{rows, cols, true, needs.bf16, needs.amax.has_value()};
      held_.push_back(o.bf16_mem ? o.bf16_mem : o.amax_mem);  // no later edge gets this address
    }
    return o;
  }

  // ---- producers ----
  void layernorm_forward(const Tensor& x, const float* g, const float* b, float eps, Tensor& y, Tensor& mean,
                         Tensor& rstd, ProducerOutputs* o) override {
    need(x);
    produce(y, o, [&](Tensor& t) { inner().layernorm_forward(x, g, b, eps, t, mean, rstd); });
  }
  void gelu_forward(const Tensor& x, Tensor& y, ProducerOutputs* o, const ProducerOutputs*) override {
    need(x);
    produce(y, o, [&](Tensor& t) { inner().gelu_forward(x, t); });
  }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, ProducerOutputs* o, const ProducerOutputs*,
                     const ProducerOutputs*) override {
    need(x), need(dy);
    produce(dx, o, [&](Tensor& t) { inner().gelu_backward(x, dy, t); });
  }
  void attention_forward(const AttentionShape& s, const Tensor& qkv, Tensor& out, Tensor& probs, DropoutKey key,
                         ProducerOutputs* o, const ProducerOutputs*) override {
    need(qkv);
    produce(out, o, [&](Tensor& t) { inner().attention_forward(s, qkv, t, probs, key); });
  }
  void attention_backward(const AttentionShape& s, const Tensor& qkv, const Tensor& probs, const Tensor& dout,
                          Tensor& dqkv, DropoutKey key, ProducerOutputs* o, const ProducerOutputs*,
                          const ProducerOutputs*) override {
    need(qkv), need(dout);
    produce(dqkv, o, [&](Tensor& t) { inner().attention_backward(s, qkv, probs, dout, t, key); });
  }
  void dropout_backward_to(const Tensor& src, Tensor& dst, float p, DropoutKey key, ProducerOutputs* o) override {
    need(src);
    produce(dst, o, [&](Tensor& t) { inner().dropout_backward_to(src, t, p, key); });
  }
  void add_dropout_backward_to(Tensor& y, const Tensor& x, Tensor& dst, float p, DropoutKey key,
                               ProducerOutputs* o) override {
    need(y), need(x);
    produce(dst, o, [&](Tensor& t) { inner().add_dropout_backward_to(y, x, t, p, key); });
  }
  // ---- readers that must get FP32 values ----
  void layernorm_backward(const Tensor& dy, const Tensor& x, const float* g, const Tensor& mean, const Tensor& rstd,
                          Tensor& dx, float* dg, float* db, const Tensor* residual, const ProducerOutputs*) override {
    need(dy), need(x);
    if (residual) need(*residual);
    inner().layernorm_backward(dy, x, g, mean, rstd, dx, dg, db, residual);
  }
  void add_inplace(Tensor& y, const Tensor& x) override {
    need(y), need(x);
    inner().add_inplace(y, x);
  }
  void dropout_add(Tensor& y, const Tensor& x, float p, DropoutKey key, const ProducerOutputs*) override {
    need(y), need(x);
    inner().dropout_add(y, x, p, key);
  }
  void dropout_backward(Tensor& dy, float p, DropoutKey key) override {
    need(dy);
    inner().dropout_backward(dy, p, key);
  }
  void copy_cols(const Tensor& s, int64_t sc, Tensor& d, int64_t dc, int64_t n) override {
    need(s);
    inner().copy_cols(s, sc, d, dc, n);
  }
  // ---- consumers ----
  void linear_forward(const LayerPlan& l, const Tensor& x, const Tensor& w, const float* b, Tensor& y,
                      std::unique_ptr<LinearState>& st, const ProducerOutputs* from, ProducerOutputs* y_out) override {
    inner().linear_forward(l, consume(x, from), w, b, y, st, nullptr, y_out);
  }
  void linear_backward(const LayerPlan& l, const LinearState& st, const Tensor& w, const Tensor& dy, Tensor& dx,
                       Tensor& dw, float* db, const ProducerOutputs* from, ProducerOutputs* dx_out) override {
    inner().linear_backward(l, st, w, consume(dy, from), dx, dw, db, nullptr, dx_out);
  }

 private:
  std::vector<std::shared_ptr<float[]>> held_;
  static const void* key(const ProducerOutputs& o) {
    return o.bf16_mem ? static_cast<const void*>(o.bf16_mem.get()) : o.amax_mem ? o.amax_mem.get() : nullptr;
  }
  void need(const Tensor& t) { violations += t.data == nullptr && t.size() > 0; }
  // Runs `op` into y (or, where the model dropped y's FP32 values, into a scratch tensor), then writes o.
  template <class Op>
  void produce(Tensor& y, ProducerOutputs* o, Op op) {
    Tensor t = y;
    if (y.data == nullptr && y.size() > 0) {
      REQUIRE(o != nullptr);
      REQUIRE(!o->f32);
      REQUIRE(o->bf16 != nullptr);
      t = inner().empty(y.rows, y.cols);
    }
    op(t);
    if (o == nullptr || key(*o) == nullptr) return;
    Edge& e = edges.at(key(*o));
    CHECK(e.rows == y.rows);
    CHECK(e.cols == y.cols);
    e.f32 = o->f32;
    ++e.produced;
    uint32_t amax = 0;
    for (int64_t i = 0; i < t.size(); ++i) {
      const float v = t.data[i];
      if (o->bf16) o->bf16[i] = uint16_t(fp4lab::encode_rn_f32<fp4lab::bfloat16>(v, fp4lab::Overflow::nonsaturate));
      uint32_t u;
      std::memcpy(&u, &v, 4);
      amax = std::max(amax, u & 0x7FFFFFFFu);
    }
    o->bf16_written = o->bf16 != nullptr;
    if (o->amax) o->amax[0] = o->amax[1] = amax, o->amax_written = true;
  }
  // x as the layer reads it: its FP32 values, or, where they were dropped, the BF16 its producer wrote.
  Tensor consume(const Tensor& x, const ProducerOutputs* from) {
    if (from && key(*from)) {
      Edge& e = edges.at(key(*from));
      CHECK(e.produced == 1);  // written before it is read, by one producer
      CHECK(e.rows == x.rows);
      CHECK(e.cols == x.cols);
      ++e.consumed;
    }
    if (x.data != nullptr || x.size() == 0) return x;
    REQUIRE(from != nullptr);
    REQUIRE(from->bf16_written);
    Tensor t = inner().empty(x.rows, x.cols);
    for (int64_t i = 0; i < x.size(); ++i) {
      const uint32_t u = uint32_t(from->bf16[i]) << 16;
      std::memcpy(&t.data[i], &u, 4);
    }
    return t;
  }
};

struct Form {
  std::string name;
  ModelConfig mc;
  Batch bt;
};
Form form(const std::string& name) {
  Form f;
  f.name = name;
  ModelConfig& mc = f.mc;
  mc.type = name.substr(0, 3);
  mc.layers = 2, mc.heads = 2, mc.width = 32, mc.dropout = 0.1;
  mc.vocab_size = 29, mc.context = 16, mc.image_size = 14, mc.patch_size = 7;
  mc.bias = name == "gpt bias" || name == "vit";
  if (name == "gpt moe") mc.moe.experts = 4;
  std::mt19937 rng(7);
  Batch& bt = f.bt;
  bt.size = 3;
  if (mc.type == "gpt") {
    for (int i = 0; i < 3 * 16; ++i)
      bt.tokens.push_back(int32_t(rng() % 29)), bt.targets.push_back(int32_t(rng() % 29));
  } else {
    std::normal_distribution<float> nd;
    for (int i = 0; i < 3 * 14 * 14; ++i) bt.images.push_back(nd(rng));
    for (int i = 0; i < 3; ++i) bt.targets.push_back(int32_t(rng() % 10));
  }
  return f;
}

struct StepResult {
  double loss = 0;
  std::vector<float> grads;
};
StepResult step(Backend& be, const Form& f, const fp4lab::Recipe* r) {
  StepContext sc;
  sc.recipe = r;
  sc.seed = 11;
  sc.step = 3;
  auto model = make_model(f.mc, be, 5);
  be.fill(model->params().grads, 0.0f);
  StepResult s;
  s.loss = model->forward_backward(f.bt, sc, nullptr);
  const Tensor& g = model->params().grads;
  s.grads.assign(g.data, g.data + g.size());
  return s;
}

}  // namespace

TEST_CASE("models state their producer outputs: each written once, then read, FP32 dropped only where unread") {
  const fp4lab::Recipe bf16 = fp4lab::recipe_by_name("bf16"), nvfp4 = fp4lab::recipe_by_name("nvfp4");
  for (const char* name : {"gpt", "gpt bias", "gpt moe", "vit"}) {
    for (const fp4lab::Recipe* r : {&bf16, &nvfp4, static_cast<const fp4lab::Recipe*>(nullptr)}) {
      const Form f = form(name);
      const std::string form_name = name;
      CAPTURE(form_name);
      CAPTURE(r ? r->name : "fp32");
      auto plain = make_cpu_backend(2);
      Flow flow;
      const StepResult want = step(*plain, f, r), got = step(flow, f, r);
      CHECK(flow.violations == 0);
      // A BF16 or amax output only replaces the layer's own identical work: the plain CPU step's bits.
      CHECK(got.loss == want.loss);
      REQUIRE(got.grads.size() == want.grads.size());
      CHECK(std::memcmp(got.grads.data(), want.grads.data(), want.grads.size() * 4) == 0);
      int dropped = 0, bf16_edges = 0, amax_edges = 0;
      for (const auto& [k, e] : flow.edges) {
        CHECK(e.produced == 1);
        CHECK(e.consumed >= 1);
        dropped += !e.f32, bf16_edges += e.bf16, amax_edges += e.amax;
      }
      // What the model states, by form (2 blocks): GPT ln_1, attention, ln_2, gelu -> the block's linears, ln_f
      // -> lm_head, and the four gradients into them; the MoE MLP's edges are not stated (ln_2's output and
      // the residual gradient have other readers); ViT ln1 -> q, k, v, attention -> o, ln2 -> up, and the
      // gradients into down and up.
      const std::string n = name;
      const bool gpt = n.substr(0, 3) == "gpt";
      if (r == &bf16) {
        const int want_edges = n == "vit" ? 2 * 5 : n == "gpt moe" ? 2 * 4 + 1 : 2 * 8 + 1;
        CHECK(bf16_edges == want_edges);
        CHECK(amax_edges == 0);
        // FP32 dropped where only linears read the tensor: every GPT edge but the gradients into layers
        // with a bias; ViT's forward edges (its gradient edges are not stated only_linears).
        const int want_dropped = n == "gpt bias" ? 2 * 4 + 1 : n == "vit" ? 2 * 3 : want_edges;
        CHECK(dropped == want_dropped);
      } else if (r == &nvfp4) {
        CHECK(amax_edges > 0);
        // lm_head keeps BF16 (nvfp4's keep_high_precision): ln_f writes its BF16 alone. ViT's head reads
        // the gathered [CLS] rows (no producer output).
        CHECK(bf16_edges == int(gpt));
        CHECK(dropped == int(gpt));
      } else {
        CHECK(flow.edges.empty());
      }
    }
  }
}
