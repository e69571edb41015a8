// The GPT of model.hpp (nanoGPT's architecture).
#include <cmath>

#include "train/model.hpp"
#include "train/moe.hpp"
#include "core/error.hpp"

namespace fp4lab::train {

namespace {

struct Block {
  int ln1_w, ln1_b = -1, ln2_w, ln2_b = -1;
  LinearLayer c_attn, attn_proj, c_fc, mlp_proj;  // c_fc, mlp_proj: the dense MLP (moe null)
  std::unique_ptr<MoeMlp> moe;
  Tensor x_in, a, mean1, rstd1, qkv, probs, att, x_mid, m_in, mean2, rstd2, f, g;
  // qkv's and f's BF16 storage (bf16_storage_for), which their consumers read in the forward and the backward.
  ProducerOutputs qkv_o, f_o;
  // Drops what the forward saved for the backward (the tensors above and the dense layers' states), once the
  // block's backward has run or, in a forward without a backward, once the block is done: the memory goes
  // back to the backend instead of waiting for the next forward to replace it.
  void drop_saved() {
    x_in = a = mean1 = rstd1 = qkv = probs = att = x_mid = m_in = mean2 = rstd2 = f = g = Tensor{};
    qkv_o = f_o = ProducerOutputs{};
    for (LinearLayer* l : {&c_attn, &attn_proj, &c_fc, &mlp_proj}) l->state.reset();
  }
};

class Gpt final : public CrossEntropyModel, private LinearCalls {
 public:
  Gpt(const ModelConfig& c, Backend& be, uint64_t seed, ExpertExchange* ep) : CrossEntropyModel(be), cfg_(c) {
    if (c.width % c.heads != 0)
      throw Error("model.width " + std::to_string(c.width) + " must be a multiple of model.heads " +
                  std::to_string(c.heads));
    if (ep && c.moe.experts == 0)
      throw Error("expert parallelism needs a mixture-of-experts GPT (model.moe.experts > 0)");
    if (ep) params_.set_expert_parallel(ep->ranks(), ep->rank());
    const int64_t C = c.width, V = c.vocab_size, T = c.context;
    const float proj_std = float(0.02 / std::sqrt(2.0 * double(c.layers)));
    uint64_t next_id = 0;
    auto linear = [&](const std::string& name, int64_t in, int64_t out, float std) {
      LinearLayer l;
      l.name = name;
      l.id = next_id++;
      l.w = params_.add("transformer." + name + ".weight", out, in, true, Init::normal, std);
      if (c.bias) l.b = params_.add("transformer." + name + ".bias", 1, out, false, Init::zeros);
      infos_.push_back(LinearLayerInfo{name, l.id, in, out, l.w});
      return l;
    };
    wte_ = params_.add("transformer.wte.weight", V, C, true, Init::normal, 0.02f);
    wpe_ = params_.add("transformer.wpe.weight", T, C, true, Init::normal, 0.02f);
    for (int64_t i = 0; i < c.layers; ++i) {
      const std::string p = "h." + std::to_string(i) + ".";
      const int first = int(params_.infos().size());
      Block b;
      b.ln1_w = params_.add("transformer." + p + "ln_1.weight", 1, C, false, Init::ones);
      if (c.bias) b.ln1_b = params_.add("transformer." + p + "ln_1.bias", 1, C, false, Init::zeros);
      b.c_attn = linear(p + "attn.c_attn", C, 3 * C, 0.02f);
      b.attn_proj = linear(p + "attn.c_proj", C, C, proj_std);
      b.ln2_w = params_.add("transformer." + p + "ln_2.weight", 1, C, false, Init::ones);
      if (c.bias) b.ln2_b = params_.add("transformer." + p + "ln_2.bias", 1, C, false, Init::zeros);
      if (c.moe.experts > 0) {
        b.moe = std::make_unique<MoeMlp>(c.moe, C, c.bias, p + "mlp.", 0.02f, proj_std, params_, next_id, infos_);
        if (ep) b.moe->set_expert_exchange(ep);  // share-mean auxiliary gradients (data_parallel.hpp)
      } else {
        b.c_fc = linear(p + "mlp.c_fc", C, 4 * C, 0.02f);
        b.mlp_proj = linear(p + "mlp.c_proj", 4 * C, C, proj_std);
      }
      blocks_.push_back(std::move(b));
      std::vector<int>& unit = block_units_.emplace_back(size_t(int(params_.infos().size()) - first));
      std::iota(unit.begin(), unit.end(), first);
    }
    lnf_w_ = params_.add("transformer.ln_f.weight", 1, C, false, Init::ones);
    if (c.bias) lnf_b_ = params_.add("transformer.ln_f.bias", 1, C, false, Init::zeros);
    // lm_head: no bias, weight tied to wte (its gradient is added to wte's).
    head_.name = "lm_head";
    head_.id = next_id++;
    head_.w = wte_;
    infos_.push_back(LinearLayerInfo{"lm_head", head_.id, C, V});
    params_.finalize(be, seed);
  }

  std::vector<LinearLayerInfo> linear_layers() const override { return infos_; }
  // The root {wte, wpe, ln_f} (wte is lm_head's too), then one unit a block (its experts and router included).
  std::vector<std::vector<int>> param_units() const override {
    std::vector<std::vector<int>> u = {{wte_, wpe_, lnf_w_}};
    if (lnf_b_ >= 0) u[0].push_back(lnf_b_);
    u.insert(u.end(), block_units_.begin(), block_units_.end());
    return u;
  }
  int64_t items_per_sample() const override { return cfg_.context; }
  nlohmann::json step_metrics() const override {
    std::vector<const RouteSummary*> r;
    for (const Block& b : blocks_)
      if (b.moe) r.push_back(&b.moe->routing());
    return r.empty() ? nlohmann::json::object() : routing_metrics(r);
  }

 private:
  const float* ptr(int i) const { return i >= 0 ? params_.value_ptr(i) : nullptr; }
  float* gptr(int i) const { return i >= 0 ? params_.grad_ptr(i) : nullptr; }
  // x_from (dy_from): what x's (dy's) producer wrote for l (outputs_for), or null.
  // y_out (dx_out): the output's BF16 storage for its non-linear consumer (bf16_storage_for), or null; where it
  // holds the BF16 alone, the returned tensor has its shape and no data.
  Tensor lin_fwd(LinearLayer& l, const StepContext& s, const Tensor& x, const ProducerOutputs* x_from = nullptr,
                 ProducerOutputs* y_out = nullptr) {
    Tensor y = y_out && !y_out->f32 ? output_tensor(be_, *y_out) : Tensor{};  // BF16 alone: the shape
    linear(l, s, x, y, x_from, y_out);
    return y;
  }
  Tensor lin_bwd(LinearLayer& l, const StepContext& s, const Tensor& dy, const ProducerOutputs* dy_from = nullptr,
                 ProducerOutputs* dx_out = nullptr) {
    Tensor dx = dx_out && !dx_out->f32 ? output_tensor(be_, *dx_out) : Tensor{};
    linear_grad(l, s, dy, dx, dy_from, dx_out);
    return dx;
  }
  void linear(LinearLayer& l, const StepContext& s, const Tensor& x, Tensor& y, const ProducerOutputs* x_from,
              ProducerOutputs* y_out = nullptr) {
    capture(l.name, "x", s, x);
    capture(l.name, "w", s, params_.value(l.w));
    be_.linear_forward(l.lp, x, params_.value(l.w), ptr(l.b), y, l.state, x_from, y_out);
  }
  void linear_grad(LinearLayer& l, const StepContext& s, const Tensor& dy, Tensor& dx, const ProducerOutputs* dy_from,
                   ProducerOutputs* dx_out = nullptr) {
    l.check_backward_plan(s);
    capture(l.name, "dy", s, dy);
    Tensor dw = params_.grad(l.w);
    be_.linear_backward(l.lp, *l.state, params_.value(l.w), dy, dx, dw, gptr(l.b), dy_from, dx_out);
  }
  // LinearCalls (the MoE layers' linears, no producer outputs): y / dx written in place when shaped.
  // (l.lp: planned at the start of the pass, forward's plan_layers or MoeMlp::forward.)
  void forward(LinearLayer& l, const StepContext& s, const Tensor& x, Tensor& y) override {
    linear(l, s, x, y, nullptr);
  }
  void backward(LinearLayer& l, const StepContext& s, const Tensor& dy, Tensor& dx) override {
    linear_grad(l, s, dy, dx, nullptr);
  }
  void grouped_forward(std::span<LinearLayer* const> ls, const StepContext& s, const Tensor& x,
                       std::span<const int64_t> offsets, Tensor& y, std::unique_ptr<LinearState>& state) override {
    const Groups g(*this, ls, offsets);
    const LinearGroups lg = g.groups();
    for (size_t i = 0; i < ls.size(); ++i)
      if (lg.rows(i) > 0) {  // operand capture per expert with tokens
        capture(ls[i]->name, "x", s, rows_of(x, offsets[i], lg.rows(i)));
        capture(ls[i]->name, "w", s, lg.w[i]);
      }
    be_.grouped_linear_forward(lg, x, y, state);
  }
  void grouped_backward(std::span<LinearLayer* const> ls, const StepContext& s, const LinearState& state,
                        const Tensor& dy, std::span<const int64_t> offsets, Tensor& dx) override {
    const Groups g(*this, ls, offsets);
    const LinearGroups lg = g.groups();
    std::vector<Tensor> dw;
    std::vector<float*> db;
    for (size_t i = 0; i < ls.size(); ++i) {
      if (lg.rows(i) > 0) {
        ls[i]->check_backward_plan(s);
        capture(ls[i]->name, "dy", s, rows_of(dy, offsets[i], lg.rows(i)));
      }
      dw.push_back(params_.grad(ls[i]->w));
      if (!lg.b.empty()) db.push_back(gptr(ls[i]->b));
    }
    be_.grouped_linear_backward(lg, state, dy, dx, dw, db);
  }
  // The LinearGroups of layers ls (their plans, weights and biases) over offsets.
  struct Groups {
    std::vector<const LayerPlan*> plans;
    std::vector<Tensor> w;
    std::vector<const float*> b;
    std::span<const int64_t> offsets;
    Groups(const Gpt& m, std::span<LinearLayer* const> ls, std::span<const int64_t> off) : offsets(off) {
      for (LinearLayer* l : ls) {
        plans.push_back(&l->lp);
        w.push_back(m.params_.value(l->w));
        if (l->b >= 0) b.push_back(m.ptr(l->b));
      }
    }
    LinearGroups groups() const { return LinearGroups{plans, w, b, offsets}; }
  };
  // Every dense layer's plan for this pass (the MoE layers plan theirs in MoeMlp::forward).
  void plan_layers(const StepContext& s) {
    for (Block& k : blocks_) {
      k.c_attn.plan(s, params_), k.attn_proj.plan(s, params_);
      if (!k.moe) k.c_fc.plan(s, params_), k.mlp_proj.plan(s, params_);
    }
    head_.plan(s, params_);
  }
  uint64_t site(int64_t block, int k) const { return 1 + uint64_t(block) * 4 + uint64_t(k); }
  AttentionShape shape(int64_t B, float p) const {
    const int64_t hd = cfg_.width / cfg_.heads;
    return AttentionShape{
        B, cfg_.context, cfg_.heads, true, float(1.0 / std::sqrt(double(hd))), p, cfg_.attention == ModelConfig::Attention::bf16_flash};
  }

  Tensor forward(const Batch& bt, const StepContext& s) override {
    const int64_t B = bt.size, T = cfg_.context, C = cfg_.width, N = B * T;
    if (int64_t(bt.tokens.size()) != N || int64_t(bt.targets.size()) != N)
      throw Error("gpt: batch holds " + std::to_string(bt.tokens.size()) + " tokens / " +
                  std::to_string(bt.targets.size()) + " targets, expected " + std::to_string(B) + " x context " +
                  std::to_string(T));
    batch_ = B;
    plan_layers(s);
    const float p = s.train ? float(cfg_.dropout) : 0.0f;
    const float eps = float(cfg_.layernorm_eps);
    Tensor x = be_.empty(N, C);
    be_.embed_forward(bt.tokens.data(), B, T, params_.value(wte_), params_.value(wpe_), x);
    {
      const ActivationScope residual(be_, ActivationPrecision::fp32);  // the embeddings are FP32 (backend.hpp)
      be_.dropout_forward(x, p, dropout_key(s, 0));
    }
    for (int64_t i = 0; i < int64_t(blocks_.size()); ++i) {
      Block& k = blocks_[size_t(i)];
      k.x_in = x;
      // ln_1 -> attn.c_attn (x)
      ProducerOutputs a_o = outputs_for(be_, {&k.c_attn}, s, false, N, C, true);
      k.a = output_tensor(be_, a_o);
      k.mean1 = be_.empty(1, N);
      k.rstd1 = be_.empty(1, N);
      be_.layernorm_forward(x, ptr(k.ln1_w), ptr(k.ln1_b), eps, k.a, k.mean1, k.rstd1, &a_o);
      // attn.c_attn -> attention: qkv in BF16 alone for the flash attention (forward and backward)
      k.qkv_o = bf16_storage_for(be_, s, Bf16Edge::flash_qkv, N, 3 * C, shape(B, p).bf16_flash);
      k.qkv = lin_fwd(k.c_attn, s, k.a, &a_o, &k.qkv_o);
      // attention -> attn.c_proj (x)
      k.probs = be_.empty(B * cfg_.heads * T, attention_saved_cols(shape(B, p), C / cfg_.heads));
      ProducerOutputs att_o = outputs_for(be_, {&k.attn_proj}, s, false, N, C, true);
      k.att = output_tensor(be_, att_o);
      be_.attention_forward(shape(B, p), k.qkv, k.att, k.probs, dropout_key(s, site(i, 0)), &att_o, &k.qkv_o);
      // attn.c_proj -> the residual add: its y in BF16 alone, the sum a new FP32 tensor
      ProducerOutputs y_o = bf16_storage_for(be_, s, Bf16Edge::attn_branch, N, C);
      Tensor y = lin_fwd(k.attn_proj, s, k.att, &att_o, &y_o);
      be_.dropout_add(y, x, p, dropout_key(s, site(i, 1)), &y_o);  // the residual feeds ln_2, not a linear
      k.x_mid = y;
      // ln_2 -> mlp.c_fc (x); the MoE MLP's input has other readers (router, gather, shared expert): nothing
      ProducerOutputs m_o = k.moe ? be_.producer_outputs({}, N, C) : outputs_for(be_, {&k.c_fc}, s, false, N, C, true);
      k.m_in = output_tensor(be_, m_o);
      k.mean2 = be_.empty(1, N);
      k.rstd2 = be_.empty(1, N);
      be_.layernorm_forward(k.x_mid, ptr(k.ln2_w), ptr(k.ln2_b), eps, k.m_in, k.mean2, k.rstd2, &m_o);
      Tensor m;
      ProducerOutputs mo;  // mlp.c_proj -> the residual add (the dense MLP): as attn.c_proj's
      if (k.moe) {
        m = k.moe->forward(be_, *this, s, k.m_in);
      } else {
        // mlp.c_fc -> gelu: f in BF16 alone (read by gelu_forward and gelu_backward)
        k.f_o = bf16_storage_for(be_, s, Bf16Edge::fc_out, N, 4 * C);
        k.f = lin_fwd(k.c_fc, s, k.m_in, &m_o, &k.f_o);
        // gelu -> mlp.c_proj (x): BF16 and/or the NVFP4 amaxes
        ProducerOutputs g_o = outputs_for(be_, {&k.mlp_proj}, s, false, N, 4 * C, true);
        k.g = output_tensor(be_, g_o);
        be_.gelu_forward(k.f, k.g, &g_o, &k.f_o);
        mo = bf16_storage_for(be_, s, Bf16Edge::mlp_branch, N, C);
        m = lin_fwd(k.mlp_proj, s, k.g, &g_o, &mo);
      }
      {  // the MoE MLP's output is its FP32 weighted sum (backend.hpp)
        const ActivationScope combined(be_, k.moe ? ActivationPrecision::fp32 : be_.activations());
        be_.dropout_add(m, k.x_mid, p, dropout_key(s, site(i, 2)), &mo);
      }
      x = m;
      if (!s.backward) k.drop_saved();  // an evaluation: nothing of the block is read again
    }
    xf_in_ = x;
    // ln_f -> lm_head (x)
    ProducerOutputs f_o = outputs_for(be_, {&head_}, s, false, N, C, true);
    xf_ = output_tensor(be_, f_o);
    meanf_ = be_.empty(1, N);
    rstdf_ = be_.empty(1, N);
    be_.layernorm_forward(x, ptr(lnf_w_), ptr(lnf_b_), eps, xf_, meanf_, rstdf_, &f_o);
    Tensor logits = lin_fwd(head_, s, xf_, &f_o);
    if (!s.backward) drop_head_saved();
    return logits;
  }
  void drop_head_saved() {
    xf_in_ = xf_ = meanf_ = rstdf_ = Tensor{};
    head_.state.reset();
  }

  void backward(const Batch& bt, const StepContext& s, const Tensor& dlogits) override {
    const int64_t B = batch_, T = cfg_.context, C = cfg_.width, N = B * T;
    const float p = s.train ? float(cfg_.dropout) : 0.0f;
    // lm_head's dx -> ln_f's backward: in BF16 alone
    ProducerOutputs dxf_o = bf16_storage_for(be_, s, Bf16Edge::lnf_dy, N, C);
    Tensor dxf = lin_bwd(head_, s, dlogits, nullptr, &dxf_o);  // dW into wte's gradient (tied)
    Tensor dx = be_.empty(N, C);
    be_.layernorm_backward(dxf, xf_in_, ptr(lnf_w_), meanf_, rstdf_, dx, gptr(lnf_w_), gptr(lnf_b_), nullptr, &dxf_o);
    drop_head_saved();
    for (int64_t i = int64_t(blocks_.size()) - 1; i >= 0; --i) {
      Block& k = blocks_[size_t(i)];
      // x_out = x_mid + drop(c_proj(gelu(c_fc(ln_2(x_mid)))))
      Tensor dmi;
      ProducerOutputs dmi_o;  // mlp.c_fc's dx -> ln_2's backward (the dense MLP): in BF16 alone
      if (k.moe) {
        Tensor dm = be_.empty(N, C);
        {
          const ActivationScope combined(be_, ActivationPrecision::fp32);  // the gradient of an FP32 tensor
          be_.dropout_backward_to(dx, dm, p, dropout_key(s, site(i, 2)));
        }
        dmi = k.moe->backward(be_, *this, s, dm);
      } else {
        // residual gradient -> mlp.c_proj (dy)
        ProducerOutputs dm_o = outputs_for(be_, {&k.mlp_proj}, s, true, N, C, true);
        Tensor dm = output_tensor(be_, dm_o);
        be_.dropout_backward_to(dx, dm, p, dropout_key(s, site(i, 2)), &dm_o);
        // mlp.c_proj's dx -> gelu': dg in BF16 alone
        ProducerOutputs dg_o = bf16_storage_for(be_, s, Bf16Edge::proj_dx, N, 4 * C);
        Tensor dg = lin_bwd(k.mlp_proj, s, dm, &dm_o, &dg_o);
        // gelu' -> mlp.c_fc (dy)
        ProducerOutputs df_o = outputs_for(be_, {&k.c_fc}, s, true, N, 4 * C, true);
        Tensor df = output_tensor(be_, df_o);
        be_.gelu_backward(k.f, dg, df, &df_o, &k.f_o, &dg_o);
        dmi_o = bf16_storage_for(be_, s, Bf16Edge::ln2_dy, N, C);
        dmi = lin_bwd(k.c_fc, s, df, &df_o, &dmi_o);
      }
      Tensor dmid = be_.empty(N, C);
      be_.layernorm_backward(dmi, k.x_mid, ptr(k.ln2_w), k.mean2, k.rstd2, dmid, gptr(k.ln2_w), gptr(k.ln2_b), nullptr,
                             &dmi_o);
      // x_mid = x_in + drop(c_proj(attn(c_attn(ln_1(x_in))))): dmid += dx, dy = drop(dmid).
      ProducerOutputs dy_o = outputs_for(be_, {&k.attn_proj}, s, true, N, C, true);
      Tensor dy = output_tensor(be_, dy_o);
      be_.add_dropout_backward_to(dmid, dx, dy, p, dropout_key(s, site(i, 1)), &dy_o);
      // attn.c_proj's dx -> attention backward: datt in BF16 alone for the flash attention
      ProducerOutputs datt_o = bf16_storage_for(be_, s, Bf16Edge::flash_dout, N, C, shape(B, p).bf16_flash);
      Tensor datt = lin_bwd(k.attn_proj, s, dy, &dy_o, &datt_o);
      // attention backward -> attn.c_attn (dy)
      ProducerOutputs dq_o = outputs_for(be_, {&k.c_attn}, s, true, N, 3 * C, true);
      Tensor dqkv = output_tensor(be_, dq_o);
      be_.attention_backward(shape(B, p), k.qkv, k.probs, datt, dqkv, dropout_key(s, site(i, 0)), &dq_o, &k.qkv_o,
                             &datt_o);
      // attn.c_attn's dx -> ln_1's backward: in BF16 alone
      ProducerOutputs da_o = bf16_storage_for(be_, s, Bf16Edge::ln1_dy, N, C);
      Tensor da = lin_bwd(k.c_attn, s, dqkv, &dq_o, &da_o);
      Tensor dxin = be_.empty(N, C);
      be_.layernorm_backward(da, k.x_in, ptr(k.ln1_w), k.mean1, k.rstd1, dxin, gptr(k.ln1_w), gptr(k.ln1_b), &dmid,
                             &da_o);
      k.drop_saved();
      dx = dxin;
    }
    {
      const ActivationScope residual(be_, ActivationPrecision::fp32);  // the embeddings' FP32 gradient
      be_.dropout_backward(dx, p, dropout_key(s, 0));
    }
    Tensor dwte = params_.grad(wte_), dwpe = params_.grad(wpe_);
    be_.embed_backward(bt.tokens.data(), B, T, dx, dwte, dwpe);
  }

  ModelConfig cfg_;
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  std::vector<Block> blocks_;
  std::vector<std::vector<int>> block_units_;  // each block's parameter indices (param_units)
  LinearLayer head_;
  std::vector<LinearLayerInfo> infos_;
  int64_t batch_ = 0;
  Tensor xf_in_, xf_, meanf_, rstdf_;
};

}  // namespace

std::unique_ptr<Model> make_gpt(const ModelConfig& cfg, Backend& be, uint64_t seed, ExpertExchange* ep) {
  return std::make_unique<Gpt>(cfg, be, seed, ep);
}

}  // namespace fp4lab::train
