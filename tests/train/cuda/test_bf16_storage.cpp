// BF16 storage under precision.activations "bf16" (train/backend.hpp Bf16Edge): a linear layer's output read
// only by GELU, the flash attention, the residual add or (a dx) a LayerNorm's backward is written by the GEMM
// in BF16 alone and read so. The promise is "bits
// unchanged": the BF16 holds exactly r() of the FP32 output the layer wrote before (FP32 storage), and a
// consumer reading it gives the bits it gave reading those FP32 values. Checked here:
// - the linear layer alone: linear_forward's y_out and linear_backward's dx_out hold the RNE BF16 of the
//   FP32-output call's y and dx, element for element, with and without a bias, on odd shapes, for the recipes
//   whose GEMMs write the BF16 directly (bf16 without a bias: cuBLASLt's BF16 output) and those that take
//   the FP32 GEMM and a rounding pass (FP32 recipe, nvfp4, mxfp8); the weight and bias gradients unchanged;
// - the consumers alone: GELU forward/backward, the flash attention forward/backward (both inputs BF16, and
//   one of them), the residual add (dropout_add) and LayerNorm's backward give the bits of the same call on
//   FP32 tensors holding the BF16 values;
// - whole GPT steps: every edge on, each edge alone, against every edge off (StepContext::bf16_storage = 0,
//   the FP32 storage of before), the loss and every gradient bit for bit, for the FP32 and the bf16_flash
//   attention, with and without biases, dense and MoE, and several recipes; the edges taken are counted, so
//   a test that silently ran the FP32 storage fails.
// The CPU twin comparison of these steps is test_backend.cpp's (its defaults take every edge the FP32
// attention has); the flash attention has no CPU twin, hence the on/off comparison, which proves the bits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "core/encode.hpp"
#include "core/format.hpp"
#include "recipes/recipe.hpp"
#include "train/backend.hpp"
#include "train/backend_cases.hpp"
#include "train/forwarding_backend.hpp"
#include "train/model.hpp"

using namespace fp4lab::train;
namespace bt = fp4lab::train::test;

namespace {

uint16_t rne(float v) { return uint16_t(fp4lab::encode_rn_f32<fp4lab::bfloat16>(v, fp4lab::Overflow::nonsaturate)); }
float widen(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::vector<float> get(Backend& be, const Tensor& t) {
  std::vector<float> v(size_t(t.size()));
  be.download(t, v.data());
  return v;
}
std::vector<uint16_t> get_bf16(const uint16_t* d, size_t n) {
  std::vector<uint16_t> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}
void put_bf16(uint16_t* d, const std::vector<uint16_t>& h) {
  REQUIRE(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
}
// BF16 storage for a [rows, cols] output: the BF16 alone (as bf16_storage_for makes it) and its shape-only tensor.
ProducerOutputs bf16_only(Backend& be, int64_t rows, int64_t cols) {
  ProducerOutputs o = be.producer_outputs(LinearInputNeeds{true, std::nullopt}, rows, cols);
  o.f32 = false;
  return o;
}

// `got` (BF16 bits of a [rows, cols] output) == the RNE BF16 of `ref` (the FP32 output), element for element.
void expect_rne_of(const std::string& what, const std::vector<float>& ref, const std::vector<uint16_t>& got,
                   int64_t cols) {
  REQUIRE(ref.size() == got.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (got[i] != rne(ref[i]) && !bad++) first = i;
  INFO(what, ": ", bad, " of ", ref.size(), " BF16-stored elements differ from r() of the FP32 output; first at [",
       first / size_t(cols), ", ", first % size_t(cols), "]: stored ", bad ? widen(got[first]) : 0.0f, ", r(FP32) ",
       bad ? widen(rne(ref[first])) : 0.0f, " (FP32 ", bad ? ref[first] : 0.0f, ")");
  CHECK(bad == 0);
}
void expect_same_bits(const std::string& what, const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && !bad++) first = i;
  INFO(what, ": ", bad, " of ", a.size(), " elements differ; first at ", first, " (", bad ? a[first] : 0.0f, " vs ",
       bad ? b[first] : 0.0f, ")");
  CHECK(bad == 0);
}
std::vector<float> bf16_valued(std::vector<float> v) {
  for (float& x : v) x = widen(rne(x));
  return v;
}
std::vector<uint16_t> bits_of(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = rne(v[i]);
  return h;
}

}  // namespace

TEST_CASE("bf16 storage: a linear layer's BF16 output is r() of its FP32 output (y with and without bias, dx)") {
  auto be = make_backend("cuda");
  be->set_activations(ActivationPrecision::bf16);
  REQUIRE(be->stores_bf16(Bf16Edge::fc_out));
  const fp4lab::Recipe bf16 = fp4lab::recipe_by_name("bf16"), nvfp4 = fp4lab::recipe_by_name("nvfp4"),
                       mxfp8 = fp4lab::recipe_by_name("mxfp8");
  struct Shape {
    int64_t B, in, out;
  };
  struct Case {
    const char* name;
    const fp4lab::Recipe* r;
    std::vector<Shape> shapes;
  };
  // bf16 without a bias: cuBLASLt writes the BF16 itself; the others: FP32 GEMM, then one rounding pass.
  const std::vector<Shape> odd = {{48, 32, 96}, {37, 29, 51}, {1, 7, 3}, {130, 65, 257}};
  const std::vector<Shape> blocked = {{48, 32, 96}, {64, 64, 48}};  // the NVFP4/MX blocks' multiples
  for (const Case& c : {Case{"fp32", nullptr, odd}, Case{"bf16", &bf16, odd}, Case{"nvfp4", &nvfp4, blocked},
                        Case{"mxfp8", &mxfp8, blocked}})
    for (const Shape& s : c.shapes)
      for (bool bias : {false, true}) {
        const std::string recipe = c.name;
        CAPTURE(recipe);
        CAPTURE(s.B);
        CAPTURE(s.in);
        CAPTURE(s.out);
        CAPTURE(bias);
        const LayerPlan lp = plan_layer(fp4lab::LinearContext{c.r, 7, 3, 2, "h.0.mlp.c_fc"});
        Tensor x = bt::put(*be, bt::randv(size_t(s.B * s.in), 1), s.B, s.in);
        Tensor w = bt::put(*be, bt::randv(size_t(s.out * s.in), 2, 0.2f), s.out, s.in);
        Tensor b = bt::put(*be, bt::randv(size_t(s.out), 3), 1, s.out);
        Tensor dy = bt::put(*be, bf16_valued(bt::randv(size_t(s.B * s.out), 4)), s.B, s.out);
        // FP32 storage (the reference) and BF16 storage, each with its own state and gradients.
        std::unique_ptr<LinearState> st32, st16;
        Tensor y32, dx32, dw32 = be->zeros(s.out, s.in), db32 = be->zeros(1, s.out);
        be->linear_forward(lp, x, w, bias ? b.data : nullptr, y32, st32);
        be->linear_backward(lp, *st32, w, dy, dx32, dw32, bias ? db32.data : nullptr);
        ProducerOutputs yo = bf16_only(*be, s.B, s.out), dxo = bf16_only(*be, s.B, s.in);
        Tensor y16 = output_tensor(*be, yo), dx16 = output_tensor(*be, dxo);
        Tensor dw16 = be->zeros(s.out, s.in), db16 = be->zeros(1, s.out);
        be->linear_forward(lp, x, w, bias ? b.data : nullptr, y16, st16, nullptr, &yo);
        be->linear_backward(lp, *st16, w, dy, dx16, dw16, bias ? db16.data : nullptr, nullptr, &dxo);
        CHECK(y16.data == nullptr);
        CHECK(dx16.data == nullptr);
        REQUIRE(yo.bf16_written);
        REQUIRE(dxo.bf16_written);
        CHECK(yo.rounded);
        expect_rne_of("y", get(*be, y32), get_bf16(yo.bf16, size_t(s.B * s.out)), s.out);
        expect_rne_of("dx", get(*be, dx32), get_bf16(dxo.bf16, size_t(s.B * s.in)), s.in);
        expect_same_bits("dW", get(*be, dw32), get(*be, dw16));
        if (bias) expect_same_bits("db", get(*be, db32), get(*be, db16));
      }
}

TEST_CASE("bf16 storage: GELU reads a BF16-only input with the bits of the FP32 one holding its values") {
  auto be = make_backend("cuda");
  be->set_activations(ActivationPrecision::bf16);
  for (int64_t n : {int64_t(48 * 128), int64_t(4097), int64_t(3)}) {
    CAPTURE(n);
    const int64_t rows = n % 16 == 0 ? 48 : 1, cols = n / rows;
    const std::vector<float> xv = bf16_valued(bt::randv(size_t(n), 5, 2.0f)), dyv = bf16_valued(bt::randv(size_t(n), 6));
    Tensor x = bt::put(*be, xv, rows, cols), dy = bt::put(*be, dyv, rows, cols);
    ProducerOutputs xo = bf16_only(*be, rows, cols), dyo = bf16_only(*be, rows, cols);
    put_bf16(xo.bf16, bits_of(xv));
    put_bf16(dyo.bf16, bits_of(dyv));
    xo.bf16_written = dyo.bf16_written = true;
    const Tensor xs = output_tensor(*be, xo), dys = output_tensor(*be, dyo);  // shape only
    Tensor y32 = be->empty(rows, cols), y16 = be->empty(rows, cols);
    be->gelu_forward(x, y32);
    be->gelu_forward(xs, y16, nullptr, &xo);
    expect_same_bits("gelu_forward y (x BF16 only)", get(*be, y32), get(*be, y16));
    Tensor dx32 = be->empty(rows, cols);
    be->gelu_backward(x, dy, dx32);
    for (int form = 0; form < 3; ++form) {  // x BF16, dy BF16, both
      CAPTURE(form);
      Tensor dx16 = be->empty(rows, cols);
      be->gelu_backward(form == 1 ? x : xs, form == 0 ? dy : dys, dx16, nullptr, &xo, &dyo);
      expect_same_bits("gelu_backward dx", get(*be, dx32), get(*be, dx16));
    }
  }
}

TEST_CASE("bf16 storage: the flash attention reads BF16-only qkv and dout with the bits of FP32 ones") {
  auto be = make_backend("cuda");
  be->set_activations(ActivationPrecision::bf16);
  for (int64_t hd : {16, 64})
    for (float p : {0.0f, 0.1f}) {
      CAPTURE(hd);
      CAPTURE(p);
      const int64_t B = 2, T = 37, H = 2, C = H * hd, N = B * T;
      AttentionShape s{B, T, H, true, float(1.0 / std::sqrt(double(hd))), p, true};
      const std::vector<float> qv = bf16_valued(bt::randv(size_t(N * 3 * C), 8)),
                               dv = bf16_valued(bt::randv(size_t(N * C), 9));
      Tensor qkv = bt::put(*be, qv, N, 3 * C), dout = bt::put(*be, dv, N, C);
      ProducerOutputs qo = bf16_only(*be, N, 3 * C), dz = bf16_only(*be, N, C);
      put_bf16(qo.bf16, bits_of(qv));
      put_bf16(dz.bf16, bits_of(dv));
      qo.bf16_written = dz.bf16_written = true;
      const Tensor qs = output_tensor(*be, qo), ds = output_tensor(*be, dz);
      const int64_t sc = attention_saved_cols(s, hd);
      Tensor out32 = be->empty(N, C), pr32 = be->empty(B * H * T, sc), out16 = be->empty(N, C),
             pr16 = be->empty(B * H * T, sc);
      const DropoutKey key{3, 4};
      be->attention_forward(s, qkv, out32, pr32, key);
      be->attention_forward(s, qs, out16, pr16, key, nullptr, &qo);
      expect_same_bits("attention_forward out (qkv BF16 only)", get(*be, out32), get(*be, out16));
      expect_same_bits("attention_forward saved rows and lse", get(*be, pr32), get(*be, pr16));
      Tensor dq32 = be->empty(N, 3 * C);
      be->attention_backward(s, qkv, pr32, dout, dq32, key);
      for (int form = 0; form < 3; ++form) {  // qkv BF16 (dout widened), dout BF16 (qkv widened), both BF16
        CAPTURE(form);
        Tensor dq16 = be->empty(N, 3 * C);
        be->attention_backward(s, form == 1 ? qkv : qs, pr16, form == 0 ? dout : ds, dq16, key, nullptr, &qo, &dz);
        expect_same_bits("attention_backward dqkv", get(*be, dq32), get(*be, dq16));
      }
    }
}

TEST_CASE("bf16 storage: the residual add reads a BF16-only branch with the bits of the FP32 one") {
  auto be = make_backend("cuda");
  be->set_activations(ActivationPrecision::bf16);
  for (int64_t n : {int64_t(48 * 32), int64_t(4097), int64_t(5)})
    for (float p : {0.0f, 0.1f, 0.5f}) {
      CAPTURE(n);
      CAPTURE(p);
      const std::vector<float> yv = bf16_valued(bt::randv(size_t(n), 10)), xv = bt::randv(size_t(n), 11);
      Tensor y32 = bt::put(*be, yv, 1, n), x = bt::put(*be, xv, 1, n);
      ProducerOutputs yo = bf16_only(*be, 1, n);
      put_bf16(yo.bf16, bits_of(yv));
      yo.bf16_written = true;
      Tensor y16 = output_tensor(*be, yo);
      const DropoutKey key{5, 6};
      be->dropout_add(y32, x, p, key);
      be->dropout_add(y16, x, p, key, &yo);
      REQUIRE(y16.data != nullptr);  // the sum: a new FP32 tensor
      expect_same_bits("dropout_add (branch BF16 only)", get(*be, y32), get(*be, y16));
    }
}

TEST_CASE("bf16 storage: every BF16 code reads as core's decode of it (the device widening, through the residual add)") {
  // nn_device.cuh's bf16_widen (a shift and a NaN select) against core's decode(bfloat16, code) on the host, over
  // all 65536 codes: the branch of dropout_add (p 0) with add = -0, which x + (-0) leaves as x for every non-NaN
  // x (-0 included); NaN codes must read as NaN. FP32 activations (no r()) and BF16 ones (r() of a BF16 value is
  // the value).
  for (ActivationPrecision act : {ActivationPrecision::fp32, ActivationPrecision::bf16}) {
    auto be = make_backend("cuda");
    be->set_activations(act);
    const int64_t n = 65536;
    std::vector<uint16_t> codes(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c) codes[size_t(c)] = uint16_t(c);
    ProducerOutputs yo = bf16_only(*be, 1, n);
    put_bf16(yo.bf16, codes);
    yo.bf16_written = true;
    Tensor y16 = output_tensor(*be, yo);
    Tensor add = bt::put(*be, std::vector<float>(size_t(n), -0.0f), 1, n);
    be->dropout_add(y16, add, 0.0f, DropoutKey{1, 2}, &yo);
    const std::vector<float> got = get(*be, y16);
    int64_t bad = 0;
    for (int64_t c = 0; c < n; ++c) {
      const float want = fp4lab::decode(fp4lab::bfloat16, uint32_t(c));
      const bool ok = std::isnan(want) ? std::isnan(got[size_t(c)]) : std::memcmp(&want, &got[size_t(c)], 4) == 0;
      if (!ok && bad++ < 5) MESSAGE("code ", c, ": read ", got[size_t(c)], ", decode ", want);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("bf16 storage: LayerNorm's backward reads a BF16-only dy with the bits of the FP32 one") {
  auto be = make_backend("cuda");
  be->set_activations(ActivationPrecision::bf16);
  for (int64_t rows : {48, 37, 300})
    for (int64_t cols : {32, 29})
      for (bool residual : {false, true}) {
        CAPTURE(rows);
        CAPTURE(cols);
        CAPTURE(residual);
        const int64_t n = rows * cols;
        Tensor x = bt::put(*be, bt::randv(size_t(n), 12), rows, cols);
        Tensor g = bt::put(*be, bt::randv(size_t(cols), 13, 0.5f, 1.0f), 1, cols);
        Tensor bta = bt::put(*be, bt::randv(size_t(cols), 14), 1, cols);
        Tensor y = be->empty(rows, cols), mean = be->empty(1, rows), rstd = be->empty(1, rows);
        be->layernorm_forward(x, g.data, bta.data, 1e-5f, y, mean, rstd);
        const std::vector<float> dyv = bf16_valued(bt::randv(size_t(n), 15));
        Tensor dy = bt::put(*be, dyv, rows, cols), res = bt::put(*be, bt::randv(size_t(n), 16), rows, cols);
        ProducerOutputs dyo = bf16_only(*be, rows, cols);
        put_bf16(dyo.bf16, bits_of(dyv));
        dyo.bf16_written = true;
        const Tensor dys = output_tensor(*be, dyo);
        Tensor dx[2] = {be->empty(rows, cols), be->empty(rows, cols)};
        Tensor dg[2] = {be->zeros(1, cols), be->zeros(1, cols)}, db[2] = {be->zeros(1, cols), be->zeros(1, cols)};
        for (int w = 0; w < 2; ++w)
          be->layernorm_backward(w ? dys : dy, x, g.data, mean, rstd, dx[w], dg[w].data, db[w].data,
                                 residual ? &res : nullptr, w ? &dyo : nullptr);
        expect_same_bits("layernorm_backward dx (dy BF16 only)", get(*be, dx[0]), get(*be, dx[1]));
        expect_same_bits("layernorm_backward dgamma", get(*be, dg[0]), get(*be, dg[1]));
        expect_same_bits("layernorm_backward dbeta", get(*be, db[0]), get(*be, db[1]));
      }
}

namespace {

// Counts the linear calls that stored their output in BF16 alone, by layer name and pass.
class StorageWatch final : public bt::ForwardingBackend {
 public:
  StorageWatch() : ForwardingBackend(make_backend("cuda")) {}
  using Backend::linear_backward;
  using Backend::linear_forward;
  void linear_forward(const LayerPlan& l, const Tensor& x, const Tensor& w, const float* b, Tensor& y,
                      std::unique_ptr<LinearState>& state, const ProducerOutputs* from,
                      ProducerOutputs* y_out) override {
    ForwardingBackend::linear_forward(l, x, w, b, y, state, from, y_out);
    if (y_out && !y_out->f32) ++taken[std::string(l.ctx.layer_name) + " y"];
  }
  void linear_backward(const LayerPlan& l, const LinearState& state, const Tensor& w, const Tensor& dy, Tensor& dx,
                       Tensor& dw_acc, float* db_acc, const ProducerOutputs* from, ProducerOutputs* dx_out) override {
    ForwardingBackend::linear_backward(l, state, w, dy, dx, dw_acc, db_acc, from, dx_out);
    if (dx_out && !dx_out->f32) ++taken[std::string(l.ctx.layer_name) + " dx"];
  }
  std::map<std::string, int> taken;
};

// Gradient buffers a and b bit for bit, a difference named by its parameter and element.
void expect_same_grads(const ParamStore& ps, const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  size_t bad = 0;
  std::string first;
  for (const ParamInfo& p : ps.infos()) {
    if (!p.held) continue;
    for (int64_t i = 0; i < p.size(); ++i) {
      const size_t k = size_t(p.offset + i);
      if (std::memcmp(&a[k], &b[k], 4) != 0 && !bad++)
        first = p.name + "[" + std::to_string(i / p.cols) + ", " + std::to_string(i % p.cols) + "] (" +
                std::to_string(a[k]) + " vs " + std::to_string(b[k]) + ")";
    }
  }
  INFO("parameter gradients: ", bad, " of ", a.size(), " differ; first ", first);
  CHECK(bad == 0);
}

// The layer (of block 0) and pass each edge stores in BF16.
const char* edge_key(Bf16Edge e) {
  switch (e) {
    case Bf16Edge::fc_out: return "h.0.mlp.c_fc y";
    case Bf16Edge::proj_dx: return "h.0.mlp.c_proj dx";
    case Bf16Edge::flash_qkv: return "h.0.attn.c_attn y";
    case Bf16Edge::flash_dout: return "h.0.attn.c_proj dx";
    case Bf16Edge::attn_branch: return "h.0.attn.c_proj y";
    case Bf16Edge::mlp_branch: return "h.0.mlp.c_proj y";
    case Bf16Edge::lnf_dy: return "lm_head dx";
    case Bf16Edge::ln1_dy: return "h.0.attn.c_attn dx";
    default: return "h.0.mlp.c_fc dx";
  }
}

}  // namespace

TEST_CASE("bf16 storage: GPT steps with each edge stored in BF16 give the bits of FP32 storage") {
  const fp4lab::Recipe bf16 = fp4lab::recipe_by_name("bf16"), nvfp4 = fp4lab::recipe_by_name("nvfp4"),
                       mxfp8 = fp4lab::recipe_by_name("mxfp8");
  struct R {
    const char* name;
    const fp4lab::Recipe* r;
  };
  for (const R& rc : {R{"fp32", nullptr}, R{"bf16", &bf16}, R{"nvfp4", &nvfp4}, R{"mxfp8", &mxfp8}})
    for (const char* attention : {"fp32", "bf16_flash"})
      for (const char* form : {"gpt", "gpt bias", "gpt moe"}) {
        const std::string recipe = rc.name, attn = attention, model_form = form;
        CAPTURE(recipe);
        CAPTURE(attn);
        CAPTURE(model_form);
        const std::string f = form;
        ModelConfig mc;
        mc.type = "gpt";
        mc.layers = 2, mc.heads = 2, mc.width = 32, mc.dropout = 0.1, mc.vocab_size = 29, mc.context = 16;
        mc.bias = f == "gpt bias";
        mc.attention = attn == "bf16_flash" ? ModelConfig::Attention::bf16_flash : ModelConfig::Attention::fp32;
        if (f == "gpt moe") mc.moe.experts = 4;
        Batch bt;
        bt.size = 3;  // 48 tokens: a multiple of 16 (the NVFP4 producer amaxes apply)
        std::mt19937 rng(6);
        for (int i = 0; i < 48; ++i) bt.tokens.push_back(int32_t(rng() % 29)), bt.targets.push_back(int32_t(rng() % 29));
        // Runs of every edge off (the reference), every edge on, and each edge alone.
        std::vector<uint32_t> masks = {0u, kAllBf16Edges};
        for (int e = 0; e < kBf16Edges; ++e) masks.push_back(bf16_edge_bit(Bf16Edge(e)));
        double ref_loss = 0.0, ref_eval = 0.0;
        std::vector<float> ref_grads;
        for (uint32_t mask : masks) {
          CAPTURE(mask);
          StorageWatch be;
          StepContext sc;
          sc.recipe = rc.r;
          sc.seed = 13;
          sc.step = 2;
          sc.activations = ActivationPrecision::bf16;
          sc.bf16_storage = mask;
          auto model = make_model(mc, be, 5);
          be.fill(model->params().grads, 0.0f);
          const double loss = model->forward_backward(bt, sc, nullptr);
          const std::vector<float> grads = get(be, model->params().grads);

          StepContext ev = sc;
          ev.train = false;
          const double eval = model->evaluate(bt, ev, nullptr);
          for (int e = 0; e < kBf16Edges; ++e) {
            const Bf16Edge edge = Bf16Edge(e);
            const bool flash_edge = edge == Bf16Edge::flash_qkv || edge == Bf16Edge::flash_dout;
            const bool mlp_edge = edge == Bf16Edge::fc_out || edge == Bf16Edge::proj_dx ||
                                  edge == Bf16Edge::mlp_branch || edge == Bf16Edge::ln2_dy;
            const bool exists = flash_edge ? std::string(attention) == "bf16_flash" : !(mlp_edge && f == "gpt moe");
            const bool want = exists && (mask & bf16_edge_bit(edge)) != 0;
            INFO("edge ", bf16_edge_name(edge), ": ", be.taken[edge_key(edge)], " BF16-stored calls");
            CHECK((be.taken[edge_key(edge)] > 0) == want);
          }
          if (mask == 0) {
            ref_loss = loss, ref_eval = eval, ref_grads = grads;
            continue;
          }
          std::string edges;
          for (int e = 0; e < kBf16Edges; ++e)
            if (mask & bf16_edge_bit(Bf16Edge(e))) edges += std::string(edges.empty() ? "" : ", ") + bf16_edge_name(Bf16Edge(e));
          INFO("BF16 storage of [", edges, "] against FP32 storage (StepContext::bf16_storage 0)");
          CHECK(loss == ref_loss);
          CHECK(eval == ref_eval);
          expect_same_grads(model->params(), ref_grads, grads);
        }
      }
}
