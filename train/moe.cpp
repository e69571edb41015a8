// The mixture-of-experts MLP (moe.hpp).
#include "train/moe.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "recipes/recipe.hpp"
#include "train/mx_rows.hpp"

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
    : c_(c), ps_(&ps), width_(width), hidden_(c.expert_hidden > 0 ? c.expert_hidden : 4 * width / c.top_k) {
  if (c.experts % ps.expert_ranks() != 0)
    throw Error("model.moe.experts " + std::to_string(c.experts) + " is not a multiple of " +
                "distributed.expert_parallel " + std::to_string(ps.expert_ranks()));
  shard_ = ExpertShard{ps.expert_ranks(), ps.expert_rank(), c.experts};
  if (c.dispatch_cast == MoeConfig::DispatchCast::mxfp8)
    dispatch_cast_ = recipe_by_name("mxfp8").operands[size_t(Operand::fwd_x)];
  router_ = make_linear(layer + "router", width, c.experts, std, false, ps, next_id, infos, {});
  for (int64_t e = 0; e < c.experts; ++e) {
    const std::string p = layer + "experts." + std::to_string(e) + ".";
    const Placement at{e, c.experts};
    fc_.push_back(make_linear(p + "c_fc", width, hidden_, std, bias, ps, next_id, infos, at));
    proj_.push_back(make_linear(p + "c_proj", hidden_, width, proj_std, bias, ps, next_id, infos, at));
  }
  for (int64_t e = shard_.first(); e < shard_.first() + shard_.local(); ++e) {  // this rank's experts
    fc_ptrs_.push_back(&fc_[size_t(e)]);
    proj_ptrs_.push_back(&proj_[size_t(e)]);
  }
  if (c.shared_expert) {
    shared_fc_ = std::make_unique<LinearLayer>(
        make_linear(layer + "shared_expert.c_fc", width, hidden_, std, bias, ps, next_id, infos, {}));
    shared_proj_ = std::make_unique<LinearLayer>(
        make_linear(layer + "shared_expert.c_proj", hidden_, width, proj_std, bias, ps, next_id, infos, {}));
  }
}

void MoeMlp::set_expert_exchange(ExpertExchange* ep, bool global_grad) {
  if (ep && (ep->ranks() != shard_.ranks || ep->rank() != shard_.rank))
    throw Error("MoeMlp: an expert exchange of rank " + std::to_string(ep->rank()) + " of " +
                std::to_string(ep->ranks()) + " for parameters of expert-parallel rank " + std::to_string(shard_.rank) +
                " of " + std::to_string(shard_.ranks));
  if (!ep && shard_.ranks > 1)
    throw Error("MoeMlp: " + std::to_string(shard_.ranks) + " expert-parallel ranks need an expert exchange");
  ep_ = ep;
  global_grad_ = global_grad;
}

StepContext MoeMlp::router_context(const StepContext& s) const {
  StepContext r = s;
  if (!c_.quantize_router) r.recipe = nullptr, r.layer_recipes = nullptr;
  return r;
}

Tensor MoeMlp::router_logits(Backend& be, LinearCalls& calls, const StepContext& s, const Tensor& x) {
  (void)be;
  router_.plan(router_context(s), *ps_);
  Tensor logits;
  calls.forward(router_, router_context(s), x, logits);
  return logits;
}

// One process: moe_route. Expert parallelism: the local routing, every rank's counts and block sums, the grouping.
void MoeMlp::route(Backend& be, const Tensor& logits) {
  if (!ep_) {
    route_ = be.moe_route(c_.route_params(), logits);
    return;
  }
  route_ = be.moe_route_local(c_.route_params(), logits);
  const std::vector<int64_t> counts = be.moe_route_counts(*route_);
  const std::vector<double> sums = be.moe_route_partials(*route_);
  RouteTotals t = ep_->exchange_totals(counts, sums);
  int64_t slots = 0;
  for (const int64_t n : t.count_all) slots += n;
  const int64_t grad_tokens = global_grad_ ? slots / c_.top_k : logits.rows;
  be.moe_route_finish(*route_, shard_, std::move(t.count_all), t.block_sums_all, grad_tokens);
}

Tensor MoeMlp::dispatch(Backend& be, Tensor& send) {
  const bool compact = dispatch_cast_ && ep_ && compact_dispatch_ && mx_rows_supported(*dispatch_cast_);
  if (dispatch_cast_ && !compact) be.fake_quantize(send, *dispatch_cast_);
  if (!ep_) return send;
  int64_t n = 0;
  for (const int64_t r : route_->recv_rows) n += r;
  Tensor received = be.empty(n, send.cols);
  if (compact)
    exchange_compact(be, send, received);
  else
    ep_->exchange_rows(be, send, route_->send_rows, received, route_->recv_rows);
  Tensor grouped = be.empty(route_->expert_offset.back(), send.cols);
  be.moe_reorder(received, *route_, grouped);
  return grouped;
}

// Every row, this rank's own part included, takes the same path, so the owner's rows are decode(encode(row)):
// fake_quantize's values (mx_rows.hpp).
void MoeMlp::exchange_compact(Backend& be, const Tensor& send, Tensor& received) {
  const int64_t rb = mx_rows(*dispatch_cast_, send.cols).row_bytes();
  Tensor out = empty_bytes(be, send.rows * rb), in = empty_bytes(be, received.rows * rb);
  be.encode_rows_mx(*dispatch_cast_, send, out);
  ep_->exchange_bytes(be, out, route_->send_rows, in, route_->recv_rows, rb);
  be.decode_rows_mx(*dispatch_cast_, in, received);
}

Tensor MoeMlp::combine(Backend& be, const Tensor& grouped) {
  if (!ep_) return grouped;
  int64_t n = 0;
  for (const int64_t r : route_->recv_rows) n += r;
  Tensor back = be.empty(n, grouped.cols);
  be.moe_unreorder(grouped, *route_, back);
  Tensor send = be.empty(route_->offset.back(), grouped.cols);
  ep_->exchange_rows(be, back, route_->recv_rows, send, route_->send_rows);
  return send;
}

Tensor MoeMlp::forward(Backend& be, LinearCalls& calls, const StepContext& s, const Tensor& x) {
  const Tensor logits = router_logits(be, calls, s, x);
  return forward_routed(be, calls, s, x, logits);
}

Tensor MoeMlp::forward_routed(Backend& be, LinearCalls& calls, const StepContext& s, const Tensor& x,
                              const Tensor& logits) {
  // This pass's plans (LinearLayer::lp) of this rank's experts and the shared expert.
  for (std::vector<LinearLayer*>* ls : {&fc_ptrs_, &proj_ptrs_})
    for (LinearLayer* l : *ls) l->plan(s, *ps_);
  if (shared_fc_) shared_fc_->plan(s, *ps_), shared_proj_->plan(s, *ps_);
  const int64_t N = x.rows, C = width_, H = hidden_;
  x_ = x;
  route(be, logits);
  const int64_t M = route_->offset.back();  // the send layout: N k slots; one process, capacity: E capacity rows
  grouped_ = be.empty(M, C);
  be.moe_gather(x, *route_, grouped_);
  const Tensor expert_in = dispatch(be, grouped_);
  const int64_t Me = route_->expert_offset.back();  // this rank's experts' rows
  h_ = be.empty(Me, H);
  g_ = be.empty(Me, H);
  out_e_ = be.empty(Me, C);
  calls.grouped_forward(fc_ptrs_, s, expert_in, route_->expert_offset, h_, fc_state_);
  be.gelu_forward(h_, g_);
  calls.grouped_forward(proj_ptrs_, s, g_, route_->expert_offset, out_e_, proj_state_);
  combined_ = combine(be, out_e_);
  Tensor y = be.empty(N, C);
  be.moe_combine(combined_, *route_, true, y);
  if (shared_fc_) {
    calls.forward(*shared_fc_, s, x, sh_h_);
    sh_g_ = be.empty(N, H);
    be.gelu_forward(sh_h_, sh_g_);
    Tensor o;
    calls.forward(*shared_proj_, s, sh_g_, o);
    be.add_inplace(y, o);
  }
  if (!s.backward) drop_saved();  // an evaluation: nothing of it is read again
  return y;
}

void MoeMlp::drop_saved() {
  x_ = grouped_ = h_ = g_ = out_e_ = combined_ = sh_h_ = sh_g_ = Tensor{};
  fc_state_.reset(), proj_state_.reset(), router_.state.reset();
  if (shared_fc_) shared_fc_->state.reset(), shared_proj_->state.reset();
}

Tensor MoeMlp::backward(Backend& be, LinearCalls& calls, const StepContext& s, const Tensor& dy) {
  const int64_t N = dy.rows, C = width_, H = hidden_;
  FP4LAB_CHECK(route_ && route_->tokens == N, "MoeMlp::backward without its forward");
  const int64_t M = route_->offset.back(), Me = route_->expert_offset.back();
  Tensor d_combined = be.empty(M, C);
  be.moe_combine_backward(dy, combined_, *route_, d_combined);
  const Tensor d_out_e = dispatch(be, d_combined);
  Tensor dg = be.empty(Me, H), dh = be.empty(Me, H), dgrouped = be.empty(Me, C);
  calls.grouped_backward(proj_ptrs_, s, *proj_state_, d_out_e, route_->expert_offset, dg);
  be.gelu_backward(h_, dg, dh);
  calls.grouped_backward(fc_ptrs_, s, *fc_state_, dh, route_->expert_offset, dgrouped);
  const Tensor d_send = combine(be, dgrouped);
  Tensor dx = be.empty(N, C);
  be.moe_combine(d_send, *route_, false, dx);  // each token's slots summed in order
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
  drop_saved();
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
