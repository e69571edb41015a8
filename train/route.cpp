// The host routing (route.hpp).
#include "train/route.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/error.hpp"
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
// probabilities), gates. The losses' parts in blocks of kRouteSumBlock tokens
// (blocks independent).
Routing route_local(const RouteParams& c, const float* logits, int64_t tokens) {
  const int64_t E = c.experts, k = c.top_k;
  Routing r;
  r.tokens = tokens, r.experts = E, r.k = k;
  r.probs.resize(size_t(tokens * E));
  r.lse.resize(size_t(tokens));
  r.expert.resize(size_t(tokens * k));
  r.gate.resize(size_t(tokens * k));
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
  const int64_t nb = (tokens + kRouteSumBlock - 1) / kRouteSumBlock;
  r.block_sums.assign(size_t(nb * (E + 1)), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; ++b) {
    double* pb = r.block_sums.data() + b * (E + 1);
    for (int64_t t = b * kRouteSumBlock; t < std::min(tokens, (b + 1) * kRouteSumBlock); ++t) {
      for (int64_t e = 0; e < E; ++e) pb[e] += r.probs[size_t(t * E + e)];
      pb[E] += r.lse[size_t(t)] * r.lse[size_t(t)];
    }
  }
  return r;
}

void route_group(const RouteParams& c, Routing& r, const ExpertShard& shard, std::vector<int64_t> count_all,
                 int64_t grad_tokens) {
  const int64_t R = shard.ranks, E = c.experts, k = c.top_k;
  if (R < 1 || shard.rank < 0 || shard.rank >= R || shard.experts != E || E % R != 0)
    throw Error("route_group: expert shard rank " + std::to_string(shard.rank) + " of " + std::to_string(R) + " over " +
                std::to_string(shard.experts) + " experts does not fit " + std::to_string(E) +
                " experts (valid: 0 <= rank < ranks, experts a multiple of ranks)");
  if (count_all.size() != size_t(R * E) ||
      !std::equal(r.count.begin(), r.count.end(), count_all.begin() + int64_t(shard.rank) * E))
    throw Error("route_group: count_all of " + std::to_string(count_all.size()) + " counts, expected [" +
                std::to_string(R) + ", " + std::to_string(E) + "] with row " + std::to_string(shard.rank) +
                " this rank's counts");
  const int64_t L = shard.local(), first = shard.first(), me = shard.rank;
  r.shard = shard;
  r.count_all = std::move(count_all);
  r.global_count.assign(size_t(E), 0);
  for (int64_t s = 0; s < R; ++s)
    for (int64_t e = 0; e < E; ++e) r.global_count[size_t(e)] += r.count_all[size_t(s * E + e)];
  int64_t slots = 0;
  for (int64_t e = 0; e < E; ++e) slots += r.global_count[size_t(e)];
  r.global_tokens = slots / k;
  r.grad_tokens = grad_tokens;
  r.capacity = expert_capacity(c, r.global_tokens);
  const int64_t cap = r.capacity;
  // kept[s, e]: source s's slots for e that the global first-cap-slots rule keeps.
  std::vector<int64_t> kept(size_t(R * E)), before(size_t(E), 0);
  for (int64_t s = 0; s < R; ++s)
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = r.count_all[size_t(s * E + e)];
      kept[size_t(s * E + e)] = cap > 0 ? std::clamp(cap - before[size_t(e)], int64_t(0), n) : n;
      before[size_t(e)] += n;
    }
  r.dropped = 0;
  if (cap > 0)
    for (int64_t e = 0; e < E; ++e) r.dropped += std::max<int64_t>(0, r.global_count[size_t(e)] - cap);
  // The send layout: expert e's kept slots of this rank, tokens in order (one rank, capacity: then zero rows).
  const bool pad = R == 1 && cap > 0;
  r.offset.assign(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e)
    r.offset[size_t(e + 1)] = r.offset[size_t(e)] + (pad ? cap : kept[size_t(me * E + e)]);
  r.token.assign(size_t(r.offset[size_t(E)]), -1);
  r.pos.assign(size_t(r.tokens * k), -1);
  std::vector<int64_t> next(r.offset.begin(), r.offset.end() - 1);
  for (int64_t i = 0; i < r.tokens * k; ++i) {  // tokens in order within each expert's group
    const int64_t e = r.expert[size_t(i)];
    if (next[size_t(e)] == r.offset[size_t(e)] + kept[size_t(me * E + e)]) continue;  // dropped
    const int64_t row = next[size_t(e)]++;
    r.pos[size_t(i)] = int32_t(row);
    r.token[size_t(row)] = int32_t(i / k);
  }
  // The exchange: rank p's part is its experts' rows; this rank receives its experts' kept rows of each source.
  r.send_rows.assign(size_t(R), 0);
  r.recv_rows.assign(size_t(R), 0);
  for (int64_t p = 0; p < R; ++p) {
    r.send_rows[size_t(p)] = r.offset[size_t((p + 1) * L)] - r.offset[size_t(p * L)];
    for (int64_t e = first; e < first + L; ++e) r.recv_rows[size_t(p)] += kept[size_t(p * E + e)];
  }
  if (R == 1) {
    r.recv_rows = r.send_rows;
    r.expert_offset = r.offset;
    r.recv_index.clear();
    return;
  }
  r.expert_offset.assign(size_t(L + 1), 0);
  for (int64_t j = 0; j < L; ++j)
    r.expert_offset[size_t(j + 1)] = r.expert_offset[size_t(j)] + (cap > 0 ? cap : r.global_count[size_t(first + j)]);
  r.recv_index.assign(size_t(r.expert_offset[size_t(L)]), -1);
  std::vector<int64_t> fill(r.expert_offset.begin(), r.expert_offset.end() - 1);
  int64_t at = 0;  // the received rows: sources in order, each its local experts' rows in expert order
  for (int64_t s = 0; s < R; ++s)
    for (int64_t j = 0; j < L; ++j)
      for (int64_t i = 0; i < kept[size_t(s * E + first + j)]; ++i)
        r.recv_index[size_t(fill[size_t(j)]++)] = int32_t(at++);
}

void route_losses(const RouteParams& c, Routing& r, const std::vector<double>& block_sums_all) {
  const int64_t E = c.experts, k = c.top_k, N = r.global_tokens;
  if (block_sums_all.size() % size_t(E + 1) != 0)
    throw Error("route_losses: " + std::to_string(block_sums_all.size()) + " block sums, not a multiple of " +
                std::to_string(E + 1) + " (experts + 1)");
  const int64_t nb = int64_t(block_sums_all.size()) / (E + 1);
  std::vector<double> P(static_cast<size_t>(E), 0.0);
  double z = 0;
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t e = 0; e < E; ++e) P[size_t(e)] += block_sums_all[size_t(b * (E + 1) + e)];
    z += block_sums_all[size_t(b * (E + 1) + E)];
  }
  double aux = 0;
  for (int64_t e = 0; e < E; ++e)
    aux += (double(r.global_count[size_t(e)]) / double(N * k)) * (P[size_t(e)] / double(N));
  r.aux_loss = c.aux_loss * double(E) * aux;
  r.z_loss = c.z_loss * z / double(N);
}

Routing route(const RouteParams& c, const float* logits, int64_t tokens) {
  Routing r = route_local(c, logits, tokens);
  route_group(c, r, ExpertShard{1, 0, c.experts}, r.count, tokens);
  route_losses(c, r, r.block_sums);
  return r;
}

std::vector<float> router_logit_grad(const RouteParams& c, const Routing& r, const float* dgate, float loss_scale) {
  const int64_t T = r.tokens, E = r.experts, k = r.k, Ng = r.global_tokens, N = r.grad_tokens;
  std::vector<float> d(static_cast<size_t>(T * E));
  // Load balancing: d/dp[t,e] of alpha E sum_e f_e P_e = alpha E f_e / N (f_e = C_e / (N_g k) is piecewise
  // constant), scaled like the task loss's gradient.
  std::vector<double> daux(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    daux[size_t(e)] =
        double(loss_scale) * c.aux_loss * double(E) * (double(r.global_count[size_t(e)]) / double(Ng * k)) / double(N);
#pragma omp parallel
  {
    std::vector<double> dp(static_cast<size_t>(E)), dl(static_cast<size_t>(E));  // d loss / d p[t, e], / d logit
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
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
  s.tokens = r.global_tokens, s.experts = r.experts, s.k = r.k;
  s.count = r.global_count;
  s.capacity = r.capacity, s.dropped = r.dropped;
  s.aux_loss = r.aux_loss, s.z_loss = r.z_loss;
  return s;
}

HostRouteState::HostRouteState(Routing routing) : r(std::move(routing)) { refresh(); }

void RouteState::set_from(const Routing& r) {
  tokens = r.tokens;
  offset = r.offset;
  shard = r.shard;
  global_tokens = r.global_tokens, grad_tokens = r.grad_tokens;
  send_rows = r.send_rows, recv_rows = r.recv_rows, expert_offset = r.expert_offset;
}

std::vector<int32_t> receive_inverse(const std::vector<int32_t>& recv_index) {
  int64_t received = 0;
  for (const int32_t i : recv_index) received += i >= 0;
  std::vector<int32_t> inverse(size_t(received), -1);
  for (size_t g = 0; g < recv_index.size(); ++g)
    if (recv_index[g] >= 0) inverse[size_t(recv_index[g])] = int32_t(g);
  return inverse;
}

void HostRouteState::refresh() {
  unreorder = receive_inverse(r.recv_index);
  set_from(r);
  summary_ = route_summary(r);
}

}  // namespace fp4lab::train
