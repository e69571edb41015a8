// The ViT of model.hpp (fp4-trainkit's one-block ViT on MNIST).
#include <cmath>

#include "train/model.hpp"
#include "core/error.hpp"

namespace fp4lab::train {

namespace {

struct Block {
  int ln1_w, ln1_b, ln2_w, ln2_b;
  LinearLayer q, k, v, o, up, down;
  // activations of the forward, for its backward
  Tensor x_in, a, mean1, rstd1, qkv, probs, att, h1, u, mean2, rstd2, up_y, g;
  // Drops them and the layers' states once the block's backward has run, or in a forward without a backward
  // once the block is done (the GPT's Block::drop_saved, train/gpt.cpp).
  void drop_saved() {
    x_in = a = mean1 = rstd1 = qkv = probs = att = h1 = u = mean2 = rstd2 = up_y = g = Tensor{};
    for (LinearLayer* l : {&q, &k, &v, &o, &up, &down}) l->state.reset();
  }
};

class Vit final : public CrossEntropyModel {
 public:
  Vit(const ModelConfig& c, Backend& be, uint64_t seed) : CrossEntropyModel(be), cfg_(c) {
    if (c.image_size % c.patch_size != 0)
      throw Error("model.patch_size " + std::to_string(c.patch_size) + " must divide model.image_size " +
                  std::to_string(c.image_size));
    if (c.width % c.heads != 0)
      throw Error("model.width " + std::to_string(c.width) + " must be a multiple of model.heads " +
                  std::to_string(c.heads));
    const int64_t E = c.width, F = int64_t(double(E) * c.mlp_ratio);
    grid_ = c.image_size / c.patch_size;
    patches_ = grid_ * grid_;
    patch_dim_ = c.channels * c.patch_size * c.patch_size;
    ffn_ = F;
    uint64_t next_id = 0;
    auto linear = [&](const std::string& name, int64_t in, int64_t out) {
      LinearLayer l;
      l.name = name;
      l.id = next_id++;
      const float bound = float(1.0 / std::sqrt(double(in)));  // PyTorch's default Linear/Conv2d init
      l.w = params_.add(name + ".weight", out, in, true, Init::uniform, bound);
      if (c.bias) l.b = params_.add(name + ".bias", 1, out, false, Init::uniform, bound);
      infos_.push_back(LinearLayerInfo{name, l.id, in, out, l.w});
      return l;
    };
    patch_ = linear("patch_embed", patch_dim_, E);
    cls_ = params_.add("cls_token", 1, E, false, Init::trunc_normal, 0.02f);
    pos_ = params_.add("pos_embed", patches_ + 1, E, false, Init::trunc_normal, 0.02f);
    for (int64_t i = 0; i < c.layers; ++i) {
      const std::string p = "blocks." + std::to_string(i) + ".";
      Block b;
      b.ln1_w = params_.add(p + "attn.preln.weight", 1, E, false, Init::ones);
      b.ln1_b = params_.add(p + "attn.preln.bias", 1, E, false, Init::zeros);
      b.q = linear(p + "attn.q_proj", E, E);
      b.k = linear(p + "attn.k_proj", E, E);
      b.v = linear(p + "attn.v_proj", E, E);
      b.o = linear(p + "attn.o_proj", E, E);
      b.ln2_w = params_.add(p + "ffn.preln.weight", 1, E, false, Init::ones);
      b.ln2_b = params_.add(p + "ffn.preln.bias", 1, E, false, Init::zeros);
      b.up = linear(p + "ffn.up_proj", E, F);
      b.down = linear(p + "ffn.down_proj", F, E);
      blocks_.push_back(std::move(b));
    }
    head_ = linear("head", E, c.classes);
    params_.finalize(be, seed);
  }

  std::vector<LinearLayerInfo> linear_layers() const override { return infos_; }
  int64_t items_per_sample() const override { return 1; }

 private:
  Tensor w(const LinearLayer& l) const { return params_.value(l.w); }
  const float* bias(const LinearLayer& l) const { return l.b >= 0 ? params_.value_ptr(l.b) : nullptr; }
  float* dbias(const LinearLayer& l) const { return l.b >= 0 ? params_.grad_ptr(l.b) : nullptr; }
  // x_from (dy_from): what x's (dy's) producer wrote for l (outputs_for), or null.
  Tensor lin_fwd(LinearLayer& l, const StepContext& s, const Tensor& x, const ProducerOutputs* x_from = nullptr) {
    capture(l.name, "x", s, x);
    capture(l.name, "w", s, w(l));
    Tensor y;
    be_.linear_forward(l.lp, x, w(l), bias(l), y, l.state, x_from);
    return y;
  }
  Tensor lin_bwd(LinearLayer& l, const StepContext& s, const Tensor& dy, const ProducerOutputs* dy_from = nullptr) {
    l.check_backward_plan(s);
    capture(l.name, "dy", s, dy);
    Tensor dx, dw = params_.grad(l.w);
    be_.linear_backward(l.lp, *l.state, w(l), dy, dx, dw, dbias(l), dy_from);
    return dx;
  }
  // Every layer's plan for this pass.
  void plan_layers(const StepContext& s) {
    patch_.plan(s, params_), head_.plan(s, params_);
    for (Block& b : blocks_)
      for (LinearLayer* l : {&b.q, &b.k, &b.v, &b.o, &b.up, &b.down}) l->plan(s, params_);
  }
  uint64_t site(size_t block, int k) const { return uint64_t(block) * 4 + uint64_t(k); }

  Tensor forward(const Batch& bt, const StepContext& s) override {
    const int64_t B = bt.size, E = cfg_.width, L = patches_ + 1, P = cfg_.patch_size, G = grid_;
    const int64_t img = cfg_.channels * cfg_.image_size * cfg_.image_size;
    if (int64_t(bt.images.size()) != B * img || int64_t(bt.targets.size()) != B)
      throw Error("vit: batch holds " + std::to_string(bt.images.size()) + " pixels / " +
                  std::to_string(bt.targets.size()) + " labels for " + std::to_string(B) + " images of " +
                  std::to_string(img) + " pixels");
    batch_ = B;
    plan_layers(s);
    // Patchify on the host: patch (py, px) of image b -> row b*G*G + py*G + px,
    // features in Conv2d weight order (channel, ky, kx).
    std::vector<float> host(size_t(B * patches_ * patch_dim_));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t py = 0; py < G; ++py)
        for (int64_t px = 0; px < G; ++px) {
          float* dst = host.data() + ((b * G + py) * G + px) * patch_dim_;
          for (int64_t ch = 0; ch < cfg_.channels; ++ch)
            for (int64_t ky = 0; ky < P; ++ky)
              for (int64_t kx = 0; kx < P; ++kx)
                *dst++ =
                    bt.images[size_t(b * img + (ch * cfg_.image_size + py * P + ky) * cfg_.image_size + px * P + kx)];
        }
    Tensor xp = be_.empty(B * patches_, patch_dim_);
    be_.upload(host.data(), xp);
    Tensor pe = lin_fwd(patch_, s, xp);
    Tensor h = be_.empty(B * L, E);
    be_.vit_tokens_forward(pe, B, params_.value_ptr(cls_), params_.value(pos_), h);

    const int64_t H = cfg_.heads, hd = E / H;
    const float scale =
        cfg_.attn_scale == "sqrt_head_dim" ? float(std::sqrt(double(hd))) : float(1.0 / std::sqrt(double(hd)));
    const float p = s.train ? float(cfg_.dropout) : 0.0f;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      Block& k = blocks_[i];
      k.x_in = h;
      // ln1 -> q, k, v (x; BF16 where all three read it)
      ProducerOutputs a_o = outputs_for(be_, {&k.q, &k.k, &k.v}, s, false, B * L, E, true);
      k.a = output_tensor(be_, a_o);
      k.mean1 = be_.empty(1, B * L);
      k.rstd1 = be_.empty(1, B * L);
      be_.layernorm_forward(h, params_.value_ptr(k.ln1_w), params_.value_ptr(k.ln1_b), float(cfg_.layernorm_eps), k.a,
                            k.mean1, k.rstd1, &a_o);
      Tensor q = lin_fwd(k.q, s, k.a, &a_o), kk = lin_fwd(k.k, s, k.a, &a_o), v = lin_fwd(k.v, s, k.a, &a_o);
      k.qkv = be_.empty(B * L, 3 * E);
      be_.copy_cols(q, 0, k.qkv, 0, E);
      be_.copy_cols(kk, 0, k.qkv, E, E);
      be_.copy_cols(v, 0, k.qkv, 2 * E, E);
      k.probs = be_.empty(B * H * L, attention_saved_cols(shape(B, scale, p), hd));
      // attention -> o (x)
      ProducerOutputs att_o = outputs_for(be_, {&k.o}, s, false, B * L, E, true);
      k.att = output_tensor(be_, att_o);
      be_.attention_forward(shape(B, scale, p), k.qkv, k.att, k.probs, dropout_key(s, site(i, 0)), &att_o);
      Tensor o = lin_fwd(k.o, s, k.att, &att_o);
      be_.add_inplace(o, h);  // h1 = h + o
      k.h1 = o;
      // ln2 -> up (x)
      ProducerOutputs u_o = outputs_for(be_, {&k.up}, s, false, B * L, E, true);
      k.u = output_tensor(be_, u_o);
      k.mean2 = be_.empty(1, B * L);
      k.rstd2 = be_.empty(1, B * L);
      be_.layernorm_forward(k.h1, params_.value_ptr(k.ln2_w), params_.value_ptr(k.ln2_b), float(cfg_.layernorm_eps),
                            k.u, k.mean2, k.rstd2, &u_o);
      k.up_y = lin_fwd(k.up, s, k.u, &u_o);
      k.g = be_.empty(B * L, ffn_);
      be_.gelu_forward(k.up_y, k.g);
      be_.dropout_forward(k.g, p, dropout_key(s, site(i, 1)));
      Tensor d = lin_fwd(k.down, s, k.g);
      be_.dropout_add(d, k.h1, p, dropout_key(s, site(i, 2)));
      h = d;
      if (!s.backward) k.drop_saved();  // an evaluation: nothing of the block is read again
    }
    Tensor cls = be_.empty(B, E);
    be_.gather_rows(h, L, cls);
    final_rows_ = B * L;
    Tensor logits = lin_fwd(head_, s, cls);
    if (!s.backward) patch_.state.reset(), head_.state.reset();
    return logits;
  }

  AttentionShape shape(int64_t B, float scale, float p) const {
    return AttentionShape{B, patches_ + 1, cfg_.heads, false, scale, p, cfg_.attention == ModelConfig::Attention::bf16_flash};
  }

  void backward(const Batch&, const StepContext& s, const Tensor& dlogits) override {
    const int64_t B = batch_, E = cfg_.width, L = patches_ + 1, H = cfg_.heads, hd = E / H;
    const float scale =
        cfg_.attn_scale == "sqrt_head_dim" ? float(std::sqrt(double(hd))) : float(1.0 / std::sqrt(double(hd)));
    const float p = s.train ? float(cfg_.dropout) : 0.0f;
    Tensor dcls = lin_bwd(head_, s, dlogits);
    Tensor dh = be_.empty(B * L, E);
    be_.scatter_rows(dcls, L, dh);
    for (size_t ii = blocks_.size(); ii-- > 0;) {
      Block& k = blocks_[ii];
      // h2 = h1 + drop(down(drop(gelu(up(ln2(h1))))))
      // residual gradient -> down (dy)
      ProducerOutputs dd_o = outputs_for(be_, {&k.down}, s, true, B * L, E);
      Tensor dd = output_tensor(be_, dd_o);
      be_.dropout_backward_to(dh, dd, p, dropout_key(s, site(ii, 2)), &dd_o);
      Tensor dg = lin_bwd(k.down, s, dd, &dd_o);
      be_.dropout_backward(dg, p, dropout_key(s, site(ii, 1)));
      // gelu' -> up (dy)
      ProducerOutputs dup_o = outputs_for(be_, {&k.up}, s, true, B * L, ffn_);
      Tensor dup = output_tensor(be_, dup_o);
      be_.gelu_backward(k.up_y, dg, dup, &dup_o);
      Tensor du = lin_bwd(k.up, s, dup, &dup_o);
      Tensor dh1 = be_.empty(B * L, E);
      be_.layernorm_backward(du, k.h1, params_.value_ptr(k.ln2_w), k.mean2, k.rstd2, dh1, params_.grad_ptr(k.ln2_w),
                             params_.grad_ptr(k.ln2_b), &dh);
      // h1 = h + o_proj(attn(q, k, v of ln1(h)))
      Tensor datt = lin_bwd(k.o, s, dh1);
      Tensor dqkv = be_.empty(B * L, 3 * E);
      be_.attention_backward(shape(B, scale, p), k.qkv, k.probs, datt, dqkv, dropout_key(s, site(ii, 0)));
      Tensor dq = be_.empty(B * L, E), dk = be_.empty(B * L, E), dv = be_.empty(B * L, E);
      be_.copy_cols(dqkv, 0, dq, 0, E);
      be_.copy_cols(dqkv, E, dk, 0, E);
      be_.copy_cols(dqkv, 2 * E, dv, 0, E);
      Tensor da = lin_bwd(k.q, s, dq);
      be_.add_inplace(da, lin_bwd(k.k, s, dk));
      be_.add_inplace(da, lin_bwd(k.v, s, dv));
      Tensor dx = be_.empty(B * L, E);
      be_.layernorm_backward(da, k.x_in, params_.value_ptr(k.ln1_w), k.mean1, k.rstd1, dx, params_.grad_ptr(k.ln1_w),
                             params_.grad_ptr(k.ln1_b), &dh1);
      k.drop_saved();
      dh = dx;
    }
    Tensor dpe = be_.empty(B * patches_, E);
    Tensor dpos = params_.grad(pos_);
    be_.vit_tokens_backward(dh, B, dpe, params_.grad_ptr(cls_), dpos);
    lin_bwd(patch_, s, dpe);
    patch_.state.reset(), head_.state.reset();
  }

  ModelConfig cfg_;
  int64_t grid_ = 0, patches_ = 0, patch_dim_ = 0, ffn_ = 0, batch_ = 0, final_rows_ = 0;
  LinearLayer patch_, head_;
  int cls_ = -1, pos_ = -1;
  std::vector<Block> blocks_;
  std::vector<LinearLayerInfo> infos_;
};

}  // namespace

std::unique_ptr<Model> make_vit(const ModelConfig& cfg, Backend& be, uint64_t seed) {
  return std::make_unique<Vit>(cfg, be, seed);
}

std::unique_ptr<Model> make_model(const ModelConfig& cfg, Backend& be, uint64_t seed, ExpertExchange* ep) {
  if (cfg.type == "vit") {
    if (ep) throw Error("expert parallelism needs a mixture-of-experts GPT; model.type is vit");
    return make_vit(cfg, be, seed);
  }
  if (cfg.type == "gpt") return make_gpt(cfg, be, seed, ep);
  throw Error("model.type \"" + cfg.type + "\" unknown; valid: vit, gpt");
}

}  // namespace fp4lab::train
