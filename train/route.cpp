// The host routing (route.hpp).
#include "train/route.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "train/math_f64.hpp"

namespace fp4lab::train {

int64_t expert_capacity(const RouteParams& p, int64_t tokens) {
  if (p.capacity_factor <= 0 || tokens == 0) return 0;
  const int64_t c = int64_t(std::ceil(p.capacity_factor * double(tokens) * double(p.top_k) / double(p.experts)));
  return (std::max<int64_t>(c, 1) + 15) / 16 * 16;
}

// Per token (independent, so OpenMP threads do not change any bit): softmax
// in float64 (exp_f64 / log_f64, train/math_f64.hpp, which a device kernel can
// reproduce), top k by selection (the lower index first among equal
// probabilities), gates. Then, serially in token order: grouping. The losses' sums in blocks of
// kRouteSumBlock tokens (blocks independent, then summed in order).
Routing route(const RouteParams& c, const float* logits, int64_t tokens) {
  const int64_t E = c.experts, k = c.top_k;
  Routing r;
  r.tokens = tokens, r.experts = E, r.k = k;
  r.probs.resize(size_t(tokens * E));
  r.lse.resize(size_t(tokens));
  r.expert.resize(size_t(tokens * k));
  r.gate.resize(size_t(tokens * k));
  r.pos.resize(size_t(tokens * k));
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
  // Groups: dropless, expert e's n_e slots; capacity, its first `capacity` slots then rows of zeros.
  r.capacity = expert_capacity(c, tokens);
  r.offset.assign(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e)
    r.offset[size_t(e + 1)] = r.offset[size_t(e)] + (r.capacity > 0 ? r.capacity : r.count[size_t(e)]);
  r.token.assign(size_t(r.offset[size_t(E)]), -1);
  std::vector<int64_t> next(r.offset.begin(), r.offset.end() - 1);
  for (int64_t i = 0; i < tokens * k; ++i) {  // tokens in order within each expert's group
    const int64_t e = r.expert[size_t(i)];
    if (next[size_t(e)] == r.offset[size_t(e + 1)]) {  // full (capacity only: dropless groups fit exactly)
      r.pos[size_t(i)] = -1;
      ++r.dropped;
      continue;
    }
    const int64_t row = next[size_t(e)]++;
    r.pos[size_t(i)] = int32_t(row);
    r.token[size_t(row)] = int32_t(i / k);
  }
  // Auxiliary losses: P_e and the z sum in blocks of kRouteSumBlock tokens.
  const int64_t nb = (tokens + kRouteSumBlock - 1) / kRouteSumBlock;
  std::vector<double> part(static_cast<size_t>(nb * E), 0.0), zpart(static_cast<size_t>(nb), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; ++b) {
    double* pb = part.data() + b * E;
    for (int64_t t = b * kRouteSumBlock; t < std::min(tokens, (b + 1) * kRouteSumBlock); ++t) {
      for (int64_t e = 0; e < E; ++e) pb[e] += r.probs[size_t(t * E + e)];
      zpart[size_t(b)] += r.lse[size_t(t)] * r.lse[size_t(t)];
    }
  }
  std::vector<double> P(static_cast<size_t>(E), 0.0);
  double z = 0;
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t e = 0; e < E; ++e) P[size_t(e)] += part[size_t(b * E + e)];
    z += zpart[size_t(b)];
  }
  double aux = 0;
  for (int64_t e = 0; e < E; ++e)
    aux += (double(r.count[size_t(e)]) / double(tokens * k)) * (P[size_t(e)] / double(tokens));
  r.aux_loss = c.aux_loss * double(E) * aux;
  r.z_loss = c.z_loss * z / double(tokens);
  return r;
}

std::vector<float> router_logit_grad(const RouteParams& c, const Routing& r, const float* dgate, float loss_scale) {
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

RouteSummary route_summary(const Routing& r) {
  RouteSummary s;
  s.tokens = r.tokens, s.experts = r.experts, s.k = r.k;
  s.count = r.count;
  s.capacity = r.capacity, s.dropped = r.dropped;
  s.aux_loss = r.aux_loss, s.z_loss = r.z_loss;
  return s;
}

HostRouteState::HostRouteState(Routing routing) : r(std::move(routing)) {
  tokens = r.tokens;
  offset = r.offset;
  summary_ = route_summary(r);
}

}  // namespace fp4lab::train
