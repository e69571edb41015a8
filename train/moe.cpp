// The mixture-of-experts MLP (moe.hpp).
#include "train/moe.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "train/math_f64.hpp"

namespace fp4lab::train {

// Per token (independent, so OpenMP threads do not change any bit): softmax
// in float64 (exp_f64 / log_f64, train/math_f64.hpp, which a device kernel can
// reproduce), top k by selection (the lower index first among equal
// probabilities), gates. Then, serially in token order: grouping, losses.
Routing route(const MoeConfig& c, const float* logits, int64_t tokens) {
  const int64_t E = c.experts, k = c.top_k;
  Routing r;
  r.tokens = tokens, r.experts = E, r.k = k;
  r.probs.resize(size_t(tokens * E));
  r.lse.resize(size_t(tokens));
  r.expert.resize(size_t(tokens * k));
  r.gate.resize(size_t(tokens * k));
  r.pos.resize(size_t(tokens * k));
  r.token.resize(size_t(tokens * k));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * E;
    double* p = r.probs.data() + t * E;
    double mx = -INFINITY;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double(l[e]));
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = exp_f64(double(l[e]) - mx));
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    r.lse[size_t(t)] = mx + log_f64(sum);
    int32_t* chosen = r.expert.data() + t * k;
    double sel = 0;
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || chosen[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = int32_t(e);  // strict: the lower index wins ties
      }
      chosen[j] = best;
      sel += p[best];
    }
    for (int64_t j = 0; j < k; ++j) {
      const double pj = p[chosen[j]];
      r.gate[size_t(t * k + j)] = float(c.normalize_top_k ? pj / sel : pj);
    }
  }
  r.count.assign(size_t(E), 0);
  for (int64_t i = 0; i < tokens * k; ++i) ++r.count[size_t(r.expert[size_t(i)])];
  r.offset.assign(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) r.offset[size_t(e + 1)] = r.offset[size_t(e)] + r.count[size_t(e)];
  std::vector<int64_t> next(r.offset.begin(), r.offset.end() - 1);
  for (int64_t i = 0; i < tokens * k; ++i) {  // tokens in order within each expert's group
    const int64_t row = next[size_t(r.expert[size_t(i)])]++;
    r.pos[size_t(i)] = int32_t(row);
    r.token[size_t(row)] = int32_t(i / k);
  }
  // Auxiliary losses (sums in token order).
  std::vector<double> P(static_cast<size_t>(E), 0.0);
  double z = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < E; ++e) P[size_t(e)] += r.probs[size_t(t * E + e)];
    z += r.lse[size_t(t)] * r.lse[size_t(t)];
  }
  double aux = 0;
  for (int64_t e = 0; e < E; ++e)
    aux += (double(r.count[size_t(e)]) / double(tokens * k)) * (P[size_t(e)] / double(tokens));
  r.aux_loss = c.aux_loss * double(E) * aux;
  r.z_loss = c.z_loss * z / double(tokens);
  return r;
}

std::vector<float> router_logit_grad(const MoeConfig& c, const Routing& r, const float* dgate, float loss_scale) {
  const int64_t N = r.tokens, E = r.experts, k = r.k;
  std::vector<float> d(static_cast<size_t>(N * E));
  // Load balancing: d/dp[t,e] of alpha E sum_e f_e P_e = alpha E f_e / N (f_e is piecewise constant),
  // scaled like the task loss's gradient.
  std::vector<double> daux(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    daux[size_t(e)] =
        double(loss_scale) * c.aux_loss * double(E) * (double(r.count[size_t(e)]) / double(N * k)) / double(N);
#pragma omp parallel
  {
    std::vector<double> dp(static_cast<size_t>(E)), dl(static_cast<size_t>(E));  // d loss / d p[t, e], / d logit
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      const double* p = r.probs.data() + t * E;
      const float* dg = dgate + t * k;
      std::fill(dl.begin(), dl.end(), 0.0);
      std::copy(daux.begin(), daux.end(), dp.begin());
      if (c.normalize_top_k) {
        // g_j = softmax over the chosen logits: dl[e_i] = g_i (dg_i - sum_j dg_j g_j).
        double s = 0;
        for (int64_t j = 0; j < k; ++j) s += double(dg[j]) * double(r.gate[size_t(t * k + j)]);
        for (int64_t j = 0; j < k; ++j)
          dl[size_t(r.expert[size_t(t * k + j)])] += double(r.gate[size_t(t * k + j)]) * (double(dg[j]) - s);
      } else {
        for (int64_t j = 0; j < k; ++j) dp[size_t(r.expert[size_t(t * k + j)])] += double(dg[j]);
      }
      // Through the softmax: dl_e += p_e (dp_e - sum_e' p_e' dp_e'); the z-loss: 2 beta lse_t p_e / N.
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += p[e] * dp[size_t(e)];
      const double dz = double(loss_scale) * c.z_loss * 2.0 * r.lse[size_t(t)] / double(N);
      for (int64_t e = 0; e < E; ++e)
        d[size_t(t * E + e)] = float(dl[size_t(e)] + p[e] * (dp[size_t(e)] - dot) + dz * p[e]);
    }
  }
  return d;
}

namespace {

LinearLayer make_linear(const std::string& name, int64_t in, int64_t out, float std, bool bias, ParamStore& ps,
                        uint64_t& next_id, std::vector<LinearLayerInfo>& infos) {
  LinearLayer l;
  l.name = name;
  l.id = next_id++;
  l.w = ps.add("transformer." + name + ".weight", out, in, true, Init::normal, std);
  if (bias) l.b = ps.add("transformer." + name + ".bias", 1, out, false, Init::zeros);
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
    fc_.push_back(make_linear(p + "c_fc", width, hidden_, std, bias, ps, next_id, infos));
    proj_.push_back(make_linear(p + "c_proj", hidden_, width, proj_std, bias, ps, next_id, infos));
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
  const int64_t N = x.rows, C = width_, H = hidden_, k = c_.top_k, M = N * k;
  x_ = x;
  Tensor logits;
  calls.forward(router_, router_context(s), x, logits);
  std::vector<float> host(static_cast<size_t>(logits.size()));
  be.download(logits, host.data());
  r_ = route(c_, host.data(), N);
  grouped_ = be.empty(M, C);
  be.gather_rows_indexed(x, r_.token.data(), grouped_);
  h_ = be.empty(M, H);
  g_ = be.empty(M, H);
  out_e_ = be.empty(M, C);
  calls.grouped_forward(fc_ptrs_, s, grouped_, r_.offset, h_, fc_state_);
  be.gelu_forward(h_, g_);
  calls.grouped_forward(proj_ptrs_, s, g_, r_.offset, out_e_, proj_state_);
  Tensor y = be.empty(N, C);
  be.combine_rows(out_e_, r_.pos.data(), r_.gate.data(), k, y);
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
  const int64_t N = dy.rows, C = width_, H = hidden_, k = c_.top_k, M = N * k;
  Tensor d_out_e = be.empty(M, C);
  std::vector<float> dgate(static_cast<size_t>(N * k));
  be.combine_rows_backward(dy, out_e_, r_.pos.data(), r_.gate.data(), k, d_out_e, dgate.data());
  Tensor dg = be.empty(M, H), dh = be.empty(M, H), dgrouped = be.empty(M, C);
  calls.grouped_backward(proj_ptrs_, s, *proj_state_, d_out_e, r_.offset, dg);
  be.gelu_backward(h_, dg, dh);
  calls.grouped_backward(fc_ptrs_, s, *fc_state_, dh, r_.offset, dgrouped);
  Tensor dx = be.empty(N, C);
  be.combine_rows(dgrouped, r_.pos.data(), nullptr, k, dx);  // each token's slots summed in order
  const std::vector<float> dl = router_logit_grad(c_, r_, dgate.data(), s.loss_scale);
  Tensor dlogits = be.empty(N, c_.experts);
  be.upload(dl.data(), dlogits);
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

nlohmann::json routing_metrics(const std::vector<const Routing*>& layers) {
  double aux = 0, z = 0, max_load = 0;
  nlohmann::json load = nlohmann::json::array();
  for (const Routing* r : layers) {
    aux += r->aux_loss;
    z += r->z_loss;
    nlohmann::json f = nlohmann::json::array();
    for (int64_t e = 0; e < r->experts; ++e) {
      const double fe = double(r->count[size_t(e)]) / double(r->tokens * r->k);
      f.push_back(fe);
      max_load = std::max(max_load, fe * double(r->experts));
    }
    load.push_back(f);
  }
  return {{"moe_aux_loss", aux}, {"moe_z_loss", z}, {"expert_load", load}, {"max_load", max_load}};
}

}  // namespace fp4lab::train
