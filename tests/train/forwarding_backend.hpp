// A Backend that forwards every call to another (inner()), for tests that
// wrap a backend to watch or pin its calls: a test derives from it and
// overrides what it watches. The routing seam (Backend::moe_route and the
// calls after it) is not forwarded: a wrapped backend routes on the host (the
// seam's defaults, over the forwarded host-index calls), which is how a test
// forces the host routing on a backend with its own.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>

#include "train/backend.hpp"

namespace fp4lab::train::test {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  bool host_tensors() const override { return inner_->host_tensors(); }
  bool implements(ActivationPrecision a) const override { return inner_->implements(a); }
  void set_activations(ActivationPrecision a) override {
    Backend::set_activations(a);
    inner().set_activations(a);
  }
  Tensor empty(int64_t rows, int64_t cols) override { return inner().empty(rows, cols); }
  void fill(Tensor& t, float v) override { inner().fill(t, v); }
  void upload(const float* host, Tensor& t) override { inner().upload(host, t); }
  void download(const Tensor& t, float* host) override { inner().download(t, host); }
  void copy(const Tensor& src, Tensor& dst) override { inner().copy(src, dst); }
  void copy_cols(const Tensor& s, int64_t sc, Tensor& d, int64_t dc, int64_t n) override {
    inner().copy_cols(s, sc, d, dc, n);
  }
  std::unique_ptr<CastStore> make_cast_store(Storage s, std::span<const FlatTensor> tensors) override {
    return inner().make_cast_store(s, tensors);
  }
  using Backend::linear_forward;
  using Backend::linear_backward;
  void linear_forward(const LayerPlan& l, const Tensor& x, const Tensor& w, const float* b, Tensor& y,
                      std::unique_ptr<LinearState>& state, const ProducerOutputs* from,
                      ProducerOutputs* y_out) override {
    inner().linear_forward(l, x, w, b, y, state, from, y_out);
  }
  void linear_backward(const LayerPlan& l, const LinearState& state, const Tensor& w, const Tensor& dy, Tensor& dx,
                       Tensor& dw_acc, float* db_acc, const ProducerOutputs* from, ProducerOutputs* dx_out) override {
    inner().linear_backward(l, state, w, dy, dx, dw_acc, db_acc, from, dx_out);
  }
  bool stores_bf16(Bf16Edge e) const override { return inner_->stores_bf16(e); }
  void layernorm_forward(const Tensor& x, const float* gamma, const float* beta, float eps, Tensor& y, Tensor& mean,
                         Tensor& rstd, ProducerOutputs* o) override {
    inner().layernorm_forward(x, gamma, beta, eps, y, mean, rstd, o);
  }
  void layernorm_backward(const Tensor& dy, const Tensor& x, const float* gamma, const Tensor& mean, const Tensor& rstd,
                          Tensor& dx, float* dgamma, float* dbeta, const Tensor* residual,
                          const ProducerOutputs* dy_from) override {
    inner().layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, residual, dy_from);
  }
  void gelu_forward(const Tensor& x, Tensor& y, ProducerOutputs* o, const ProducerOutputs* x_from) override {
    inner().gelu_forward(x, y, o, x_from);
  }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, ProducerOutputs* o, const ProducerOutputs* x_from,
                     const ProducerOutputs* dy_from) override {
    inner().gelu_backward(x, dy, dx, o, x_from, dy_from);
  }
  void attention_forward(const AttentionShape& s, const Tensor& qkv, Tensor& out, Tensor& probs, DropoutKey key,
                         ProducerOutputs* o, const ProducerOutputs* qkv_from) override {
    inner().attention_forward(s, qkv, out, probs, key, o, qkv_from);
  }
  void attention_backward(const AttentionShape& s, const Tensor& qkv, const Tensor& probs, const Tensor& dout,
                          Tensor& dqkv, DropoutKey key, ProducerOutputs* o, const ProducerOutputs* qkv_from,
                          const ProducerOutputs* dout_from) override {
    inner().attention_backward(s, qkv, probs, dout, dqkv, key, o, qkv_from, dout_from);
  }
  void dropout_forward(Tensor& x, float p, DropoutKey key) override { inner().dropout_forward(x, p, key); }
  void dropout_backward(Tensor& dy, float p, DropoutKey key) override { inner().dropout_backward(dy, p, key); }
  void dropout_backward_to(const Tensor& src, Tensor& dst, float p, DropoutKey key, ProducerOutputs* o) override {
    inner().dropout_backward_to(src, dst, p, key, o);
  }
  void add_dropout_backward_to(Tensor& y, const Tensor& x, Tensor& dst, float p, DropoutKey key,
                               ProducerOutputs* o) override {
    inner().add_dropout_backward_to(y, x, dst, p, key, o);
  }
  void add_inplace(Tensor& y, const Tensor& x) override { inner().add_inplace(y, x); }
  void dropout_add(Tensor& y, const Tensor& x, float p, DropoutKey key, const ProducerOutputs* y_from) override {
    inner().dropout_add(y, x, p, key, y_from);
  }
  void embed_forward(const int32_t* idx, int64_t batch, int64_t seq, const Tensor& wte, const Tensor& wpe,
                     Tensor& out) override {
    inner().embed_forward(idx, batch, seq, wte, wpe, out);
  }
  void embed_backward(const int32_t* idx, int64_t batch, int64_t seq, const Tensor& dout, Tensor& dwte,
                      Tensor& dwpe) override {
    inner().embed_backward(idx, batch, seq, dout, dwte, dwpe);
  }
  void vit_tokens_forward(const Tensor& patches, int64_t batch, const float* cls, const Tensor& pos,
                          Tensor& out) override {
    inner().vit_tokens_forward(patches, batch, cls, pos, out);
  }
  void vit_tokens_backward(const Tensor& dout, int64_t batch, Tensor& dpatches, float* dcls, Tensor& dpos) override {
    inner().vit_tokens_backward(dout, batch, dpatches, dcls, dpos);
  }
  void gather_rows(const Tensor& x, int64_t stride, Tensor& out) override { inner().gather_rows(x, stride, out); }
  void scatter_rows(const Tensor& dout, int64_t stride, Tensor& dx) override { inner().scatter_rows(dout, stride, dx); }
  void gather_rows_indexed(const Tensor& x, const int32_t* idx, Tensor& out) override {
    inner().gather_rows_indexed(x, idx, out);
  }
  void combine_rows(const Tensor& src, const int32_t* pos, const float* w, int64_t k, Tensor& out) override {
    inner().combine_rows(src, pos, w, k, out);
  }
  void combine_rows_backward(const Tensor& dout, const Tensor& src, const int32_t* pos, const float* w, int64_t k,
                             Tensor& dsrc, float* dw) override {
    inner().combine_rows_backward(dout, src, pos, w, k, dsrc, dw);
  }
  double cross_entropy(const Tensor& logits, const int32_t* targets, Tensor* dlogits, int64_t* correct) override {
    return inner().cross_entropy(logits, targets, dlogits, correct);
  }
  void cross_entropy_start(const Tensor& logits, const int32_t* targets, Tensor* dlogits) override {
    inner().cross_entropy_start(logits, targets, dlogits);
  }
  double cross_entropy_finish(int64_t* correct) override { return inner().cross_entropy_finish(correct); }
  void round_bf16_codes(const Tensor& x, Tensor& codes) override { inner().round_bf16_codes(x, codes); }
  void sum_bf16_codes(const Tensor& codes, int64_t rows, Tensor& out) override {
    inner().sum_bf16_codes(codes, rows, out);
  }
  double sum_squares(const Tensor& g) override { return inner().sum_squares(g); }
  void scale(Tensor& g, float s) override { inner().scale(g, s); }
  void adamw_step(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, std::span<const IndexRange> decayed, float lr,
                  float b1, float b2, float eps, float wd, int64_t t, float grad_scale, MomentStorage moments) override {
    inner().adamw_step(p, g, m, v, decayed, lr, b1, b2, eps, wd, t, grad_scale, moments);
  }
  double adamw_step_clipped(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, std::span<const IndexRange> decayed,
                            float lr, float b1, float b2, float eps, float wd, int64_t t, double grad_clip,
                            MomentStorage moments) override {
    return inner().adamw_step_clipped(p, g, m, v, decayed, lr, b1, b2, eps, wd, t, grad_clip, moments);
  }
  void synchronize() override { inner().synchronize(); }
  using Backend::linear_input_needs;
  LinearInputNeeds linear_input_needs(const LayerPlan& l, bool grad, int64_t rows, int64_t cols) override {
    return inner().linear_input_needs(l, grad, rows, cols);
  }
  ProducerOutputs producer_outputs(const LinearInputNeeds& needs, int64_t rows, int64_t cols) override {
    return inner().producer_outputs(needs, rows, cols);
  }

 protected:
  // Every call goes through here (a derived class may do something first).
  virtual Backend& inner() { return *inner_; }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace fp4lab::train::test
