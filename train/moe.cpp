// The mixture-of-experts MLP (moe.hpp).
#include "train/moe.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace fp4lab::train {

namespace {

LinearLayer make_linear(const std::string& name, int64_t in, int64_t out, float std, bool bias, ParamStore& ps,
                        uint64_t& next_id, std::vector<LinearLayerInfo>& infos, Placement at = {}) {
  LinearLayer l;
  l.name = name;
  l.id = next_id++;
  l.w = ps.add("transformer." + name + ".weight", out, in, true, Init::normal, std, at);
  if (bias) l.b = ps.add("transformer." + name + ".bias", 1, out, false, Init::zeros, 0.0f, at);
  infos.push_back(LinearLayerInfo{name, l.id, in, out, l.w});
  return l;
}

}  // namespace

MoeMlp::MoeMlp(const MoeConfig& c, int64_t width, bool bias, const std::string& layer, float std, float proj_std,
               ParamStore& ps, uint64_t& next_id, std::vector<LinearLayerInfo>& infos)
    : c_(c), width_(width), hidden_(c.expert_hidden > 0 ? c.expert_hidden : 4 * width / c.top_k) {
  router_ = make_linear(layer + "router", width, c.experts, std, false, ps, next_id, infos);
  for (int64_t e = 0; e < c.experts; ++e) {
    const std::string p = layer + "experts." + std::to_string(e) + ".";
    const Placement at{e, c.experts};  // held by its owner under expert parallelism (params.hpp)
    fc_.push_back(make_linear(p + "c_fc", width, hidden_, std, bias, ps, next_id, infos, at));
    proj_.push_back(make_linear(p + "c_proj", hidden_, width, proj_std, bias, ps, next_id, infos, at));
  }
  for (LinearLayer& l : fc_) fc_ptrs_.push_back(&l);
  for (LinearLayer& l : proj_) proj_ptrs_.push_back(&l);
  if (c.shared_expert) {
    shared_fc_ = std::make_unique<LinearLayer>(
        make_linear(layer + "shared_expert.c_fc", width, hidden_, std, bias, ps, next_id, infos));
    shared_proj_ = std::make_unique<LinearLayer>(
        make_linear(layer + "shared_expert.c_proj", hidden_, width, proj_std, bias, ps, next_id, infos));
  }
}

StepContext MoeMlp::router_context(const StepContext& s) const {
  StepContext r = s;
  if (!c_.quantize_router) r.recipe = nullptr, r.layer_recipes = nullptr;
  return r;
}

Tensor MoeMlp::forward(Backend& be, LinearCalls& calls, const StepContext& s, const Tensor& x) {
  // This pass's plans (LinearLayer::lp): the router's under its own context.
  router_.plan(router_context(s));
  for (std::vector<LinearLayer>* ls : {&fc_, &proj_})
    for (LinearLayer& l : *ls) l.plan(s);
  if (shared_fc_) shared_fc_->plan(s), shared_proj_->plan(s);
  const int64_t N = x.rows, C = width_, H = hidden_;
  x_ = x;
  Tensor logits;
  calls.forward(router_, router_context(s), x, logits);
  route_ = be.moe_route(c_.route_params(), logits);
  const int64_t M = route_->offset.back();  // N k slots; capacity dispatch: E capacity rows
  grouped_ = be.empty(M, C);
  be.moe_gather(x, *route_, grouped_);
  h_ = be.empty(M, H);
  g_ = be.empty(M, H);
  out_e_ = be.empty(M, C);
  calls.grouped_forward(fc_ptrs_, s, grouped_, route_->offset, h_, fc_state_);
  be.gelu_forward(h_, g_);
  calls.grouped_forward(proj_ptrs_, s, g_, route_->offset, out_e_, proj_state_);
  Tensor y = be.empty(N, C);
  be.moe_combine(out_e_, *route_, true, y);
  if (shared_fc_) {
    calls.forward(*shared_fc_, s, x, sh_h_);
    sh_g_ = be.empty(N, H);
    be.gelu_forward(sh_h_, sh_g_);
    Tensor o;
    calls.forward(*shared_proj_, s, sh_g_, o);
    be.add_inplace(y, o);
  }
  return y;
}

Tensor MoeMlp::backward(Backend& be, LinearCalls& calls, const StepContext& s, const Tensor& dy) {
  const int64_t N = dy.rows, C = width_, H = hidden_;
  FP4LAB_CHECK(route_ && route_->tokens == N, "MoeMlp::backward without its forward");
  const int64_t M = route_->offset.back();
  Tensor d_out_e = be.empty(M, C);
  be.moe_combine_backward(dy, out_e_, *route_, d_out_e);
  Tensor dg = be.empty(M, H), dh = be.empty(M, H), dgrouped = be.empty(M, C);
  calls.grouped_backward(proj_ptrs_, s, *proj_state_, d_out_e, route_->offset, dg);
  be.gelu_backward(h_, dg, dh);
  calls.grouped_backward(fc_ptrs_, s, *fc_state_, dh, route_->offset, dgrouped);
  Tensor dx = be.empty(N, C);
  be.moe_combine(dgrouped, *route_, false, dx);  // each token's slots summed in order
  Tensor dlogits = be.empty(N, c_.experts);
  be.moe_router_grad(*route_, s.loss_scale, dlogits);
  Tensor dxr;
  calls.backward(router_, router_context(s), dlogits, dxr);
  be.add_inplace(dx, dxr);
  if (shared_fc_) {
    Tensor dsg, dsh = be.empty(N, H), dsx;
    calls.backward(*shared_proj_, s, dy, dsg);
    be.gelu_backward(sh_h_, dsg, dsh);
    calls.backward(*shared_fc_, s, dsh, dsx);
    be.add_inplace(dx, dsx);
  }
  return dx;
}

const RouteSummary& MoeMlp::routing() const {
  static const RouteSummary none;
  return route_ ? route_->summary() : none;
}

nlohmann::json routing_metrics(const std::vector<const RouteSummary*>& layers) {
  double aux = 0, z = 0, max_load = 0;
  int64_t dropped = 0, slots = 0;
  bool capacity = false;
  nlohmann::json load = nlohmann::json::array();
  for (const RouteSummary* r : layers) {
    aux += r->aux_loss;
    z += r->z_loss;
    dropped += r->dropped, slots += r->tokens * r->k;
    capacity = capacity || r->capacity > 0;
    nlohmann::json f = nlohmann::json::array();
    for (int64_t e = 0; e < r->experts; ++e) {
      const double fe = double(r->count[size_t(e)]) / double(r->tokens * r->k);
      f.push_back(fe);
      max_load = std::max(max_load, fe * double(r->experts));
    }
    load.push_back(f);
  }
  nlohmann::json j = {{"moe_aux_loss", aux}, {"moe_z_loss", z}, {"expert_load", load}, {"max_load", max_load}};
  if (capacity) j["moe_dropped"] = slots > 0 ? double(dropped) / double(slots) : 0.0;  // capacity dispatch only
  return j;
}

}  // namespace fp4lab::train
