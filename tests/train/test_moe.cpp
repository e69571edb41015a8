// The mixture-of-experts layer (train/moe.hpp): routing against hand-computed
// values, the auxiliary losses' blocked sums, the routing seam's host defaults
// against the host-index calls, the router's logit gradient and the whole
// layer's gradients (router, experts, shared expert, input) against central
// finite differences, and the config's checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "train/config.hpp"
#include "train/moe.hpp"
#include "train/param_calls.hpp"
#include "train/params.hpp"
#include "train/route.hpp"

namespace fp4lab::train {

namespace {

MoeConfig moe(int64_t E, int64_t k, bool normalize, double aux = 0.01, double z = 0.001) {
  MoeConfig c;
  c.experts = E, c.top_k = k, c.normalize_top_k = normalize, c.aux_loss = aux, c.z_loss = z;
  return c;
}

}  // namespace

TEST_CASE("moe route: top-k, ties, gates, grouping and auxiliary losses by hand") {
  // Token 0 prefers 2 then 0; token 1 has a tie between 1 and 3 (lower index first);
  // token 2 prefers 2 then 3. Expert 0: token 0; 1: token 1; 2: tokens 0, 2; 3: tokens 1, 2.
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f,  //
                                     0.0f, 3.0f, -2.0f, 3.0f,  //
                                     -1.0f, 0.5f, 4.0f, 1.0f};
  const Routing r = route(moe(4, 2, true), logits.data(), 3);
  CHECK(r.expert == std::vector<int32_t>{2, 0, 1, 3, 2, 3});
  CHECK(r.count == std::vector<int64_t>{1, 1, 2, 2});
  CHECK(r.offset == std::vector<int64_t>{0, 1, 2, 4, 6});
  // Rows grouped by expert, tokens in order inside a group.
  CHECK(r.token == std::vector<int32_t>{0, 1, 0, 2, 1, 2});
  CHECK(r.pos == std::vector<int32_t>{2, 0, 1, 4, 3, 5});
  // Normalised gates: softmax over the chosen logits.
  const double g00 = std::exp(2.0) / (std::exp(2.0) + std::exp(1.0));
  CHECK(r.gate[0] == float(g00));
  CHECK(r.gate[2] == 0.5f);
  CHECK(r.gate[3] == 0.5f);
  // Auxiliary losses from their definitions.
  double P[4] = {0, 0, 0, 0}, z = 0;
  for (int t = 0; t < 3; ++t) {
    double s = 0;
    for (int e = 0; e < 4; ++e) s += std::exp(double(logits[size_t(t * 4 + e)]));
    for (int e = 0; e < 4; ++e) P[e] += std::exp(double(logits[size_t(t * 4 + e)])) / s / 3.0;
    z += std::log(s) * std::log(s);
  }
  const double f[4] = {1 / 6.0, 1 / 6.0, 2 / 6.0, 2 / 6.0};
  double aux = 0;
  for (int e = 0; e < 4; ++e) aux += f[e] * P[e];
  CHECK(r.aux_loss == doctest::Approx(0.01 * 4 * aux).epsilon(1e-12));
  CHECK(r.z_loss == doctest::Approx(0.001 * z / 3.0).epsilon(1e-12));
  // Unnormalised gates are the probabilities themselves.
  const Routing u = route(moe(4, 2, false), logits.data(), 3);
  CHECK(u.gate[0] == float(std::exp(2.0) / (std::exp(1.0) + 1.0 + std::exp(2.0) + std::exp(-1.0))));
}

TEST_CASE("moe route: empty experts and k = E") {
  const std::vector<float> logits = {5, 0, 0, 5, 0, 0};  // 2 tokens, 3 experts; expert 1 and 2 unused at k=1
  const Routing r = route(moe(3, 1, false), logits.data(), 2);
  CHECK(r.count == std::vector<int64_t>{2, 0, 0});
  const Routing all = route(moe(3, 3, true), logits.data(), 2);
  CHECK(all.count == std::vector<int64_t>{2, 2, 2});
  float sum = 0;
  for (int j = 0; j < 3; ++j) sum += all.gate[size_t(j)];
  CHECK(sum == doctest::Approx(1.0f));
}

TEST_CASE("moe route: capacity dispatch keeps each expert's first slots in token order and drops the rest") {
  // 40 tokens, 2 experts, k = 1; tokens 0..34 prefer expert 0, 35..39 expert 1. Capacity:
  // ceil(1.0 * 40 * 1 / 2) = 20, rounded up to 32 rows an expert.
  std::vector<float> logits;
  for (int t = 0; t < 40; ++t)
    logits.insert(logits.end(), t < 35 ? std::initializer_list<float>{1, 0} : std::initializer_list<float>{0, 1});
  MoeConfig c = moe(2, 1, true);
  c.dispatch = MoeConfig::Dispatch::capacity;
  c.capacity_factor = 1.0;
  CHECK(expert_capacity(c.route_params(), 40) == 32);
  const Routing r = route(c.route_params(), logits.data(), 40);
  CHECK(r.capacity == 32);
  CHECK(r.dropped == 3);
  CHECK(r.count == std::vector<int64_t>{35, 5});  // before the drops: f_e of the load-balancing loss
  CHECK(r.offset == std::vector<int64_t>{0, 32, 64});
  for (int t = 0; t < 40; ++t) {
    CAPTURE(t);
    CHECK(r.pos[size_t(t)] == (t < 32 ? t : t < 35 ? -1 : 32 + (t - 35)));
  }
  for (int row = 0; row < 64; ++row) {
    CAPTURE(row);
    CHECK(r.token[size_t(row)] == (row < 32 ? row : row < 37 ? 35 + (row - 32) : -1));
  }
  // Dropless routes the same logits into 40 rows; the capacity's losses are the same (counts before drops).
  const Routing d = route(moe(2, 1, true).route_params(), logits.data(), 40);
  CHECK(d.dropped == 0);
  CHECK(d.capacity == 0);
  CHECK(d.offset.back() == 40);
  CHECK(d.aux_loss == r.aux_loss);
  CHECK(d.z_loss == r.z_loss);
  // The rule's edges: a factor of experts / k fits every slot; one slot still takes 16 rows.
  RouteParams p = c.route_params();
  p.capacity_factor = 2.0;
  CHECK(expert_capacity(p, 40) == 48);
  CHECK(expert_capacity(p, 1) == 16);
  CHECK(expert_capacity(p, 0) == 0);
  CHECK(expert_capacity(moe(2, 1, true).route_params(), 40) == 0);
}

// The auxiliary losses' sums run in blocks of kRouteSumBlock tokens (route.hpp):
// the same values as plain float64 sums up to rounding, and exactly the
// blocked order (which the GPU's reduction reproduces).
TEST_CASE("moe route: the auxiliary losses' blocked sums") {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (const int64_t N : {1, 255, 256, 257, 1000}) {
    CAPTURE(N);
    const int64_t E = 8, k = 2;
    std::vector<float> logits(size_t(N * E));
    for (auto& v : logits) v = nd(rng);
    const MoeConfig c = moe(E, k, true, 0.3, 0.2);
    const Routing r = route(c, logits.data(), N);
    // Reference: serial sums in long double.
    std::vector<long double> P(size_t(E), 0.0L);
    long double z = 0;
    for (int64_t t = 0; t < N; ++t) {
      for (int64_t e = 0; e < E; ++e) P[size_t(e)] += r.probs[size_t(t * E + e)];
      z += (long double)r.lse[size_t(t)] * r.lse[size_t(t)];
    }
    long double aux = 0;
    for (int64_t e = 0; e < E; ++e) aux += (long double)r.count[size_t(e)] / (N * k) * (P[size_t(e)] / N);
    CHECK(r.aux_loss == doctest::Approx(double(0.3L * E * aux)).epsilon(1e-13));
    CHECK(r.z_loss == doctest::Approx(double(0.2L * z / N)).epsilon(1e-13));
    // The blocked order, bit for bit.
    std::vector<double> Pb(size_t(E), 0.0);
    double zb = 0;
    for (int64_t b = 0; b * kRouteSumBlock < N; ++b) {
      std::vector<double> part(size_t(E), 0.0);
      double zp = 0;
      for (int64_t t = b * kRouteSumBlock; t < std::min(N, (b + 1) * kRouteSumBlock); ++t) {
        for (int64_t e = 0; e < E; ++e) part[size_t(e)] += r.probs[size_t(t * E + e)];
        zp += r.lse[size_t(t)] * r.lse[size_t(t)];
      }
      for (int64_t e = 0; e < E; ++e) Pb[size_t(e)] += part[size_t(e)];
      zb += zp;
    }
    double auxb = 0;
    for (int64_t e = 0; e < E; ++e) auxb += (double(r.count[size_t(e)]) / double(N * k)) * (Pb[size_t(e)] / double(N));
    CHECK(r.aux_loss == 0.3 * double(E) * auxb);
    CHECK(r.z_loss == 0.2 * zb / double(N));
  }
}

namespace {

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace

namespace {

// One rank's view of an expert-parallel routing (route_local + route_group + route_losses).
struct RankRouting {
  Routing r;
  int64_t first_token = 0;  // its share's first global token
};

// R ranks routing consecutive shares of N_r tokens of `logits` (the global batch).
std::vector<RankRouting> route_ranks(const RouteParams& c, const std::vector<float>& logits, int R, int64_t Nr) {
  const int64_t E = c.experts, Ng = Nr * R;
  std::vector<RankRouting> ranks(static_cast<size_t>(R));
  std::vector<int64_t> count_all;
  std::vector<double> sums_all;
  for (int s = 0; s < R; ++s) {
    ranks[size_t(s)].r = route_local(c, logits.data() + int64_t(s) * Nr * E, Nr);
    ranks[size_t(s)].first_token = int64_t(s) * Nr;
    const Routing& r = ranks[size_t(s)].r;
    count_all.insert(count_all.end(), r.count.begin(), r.count.end());
    sums_all.insert(sums_all.end(), r.block_sums.begin(), r.block_sums.end());
  }
  for (int s = 0; s < R; ++s) {
    route_group(c, ranks[size_t(s)].r, ExpertShard{R, s, E}, count_all, Ng);
    route_losses(c, ranks[size_t(s)].r, sums_all);
  }
  return ranks;
}

// Owner o's grouped rows as global token ids (-1: a zero row), through the
// exchange built by hand: every source's send part for o, in source order,
// then o's receive map.
std::vector<int32_t> owner_groups(const std::vector<RankRouting>& ranks, int o) {
  const int R = int(ranks.size());
  const Routing& own = ranks[size_t(o)].r;
  if (R == 1) return own.token;
  std::vector<int32_t> received;
  for (int s = 0; s < R; ++s) {
    const Routing& src = ranks[size_t(s)].r;
    const int64_t L = src.shard.local();
    REQUIRE(own.recv_rows[size_t(s)] == src.send_rows[size_t(o)]);
    for (int64_t row = src.offset[size_t(o * L)]; row < src.offset[size_t((o + 1) * L)]; ++row) {
      const int32_t t = src.token[size_t(row)];
      REQUIRE(t >= 0);  // the send layout has no zero rows under expert parallelism
      received.push_back(int32_t(ranks[size_t(s)].first_token + t));
    }
  }
  std::vector<int32_t> groups;
  for (const int32_t i : own.recv_index) groups.push_back(i < 0 ? -1 : received[size_t(i)]);
  return groups;
}

}  // namespace

// Plan section 6, test 1: the ranks' route_local + route_group + route_losses
// against route() on the concatenated logits (one process): decisions, gates,
// counts, drops, every owner's groups (global tokens, in order), each slot's
// fate and router_logit_grad (grad_tokens = N_g) bit for bit; aux and z bit
// for bit when every rank's tokens are whole sum blocks, else within 1e-15.
TEST_CASE("moe route split: expert-parallel ranks' routing equals one process's") {
  std::mt19937 rng(47);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  int64_t cases = 0, losses_differ = 0;
  for (const int R : {1, 2, 3, 4})
    for (const int64_t Nr : {256, 100})
      for (const int64_t E : {4, 8, 64})
        for (const int64_t k : {1, 2, 6})
          for (const bool normalize : {true, false})
            for (const double cf : {0.0, 0.5, 1.0, 1.25}) {
              if (k > E || E % R != 0) continue;
              CAPTURE(R);
              CAPTURE(Nr);
              CAPTURE(E);
              CAPTURE(k);
              CAPTURE(normalize);
              CAPTURE(cf);
              RouteParams c;
              c.experts = E, c.top_k = k, c.normalize_top_k = normalize, c.aux_loss = 0.02, c.z_loss = 0.003;
              c.capacity_factor = cf;
              const int64_t Ng = Nr * R;
              std::vector<float> logits(size_t(Ng * E));
              for (auto& v : logits) v = nd(rng);
              for (int64_t i = 0; i < Ng * E; i += 7) logits[size_t(i)] = 0.25f;  // ties
              std::vector<float> dgate(size_t(Ng * k));
              for (auto& v : dgate) v = nd(rng);
              const Routing ref = route(c, logits.data(), Ng);
              const std::vector<float> ref_grad = router_logit_grad(c, ref, dgate.data(), 3.0f);
              const std::vector<RankRouting> ranks = route_ranks(c, logits, R, Nr);
              ++cases;
              for (int s = 0; s < R; ++s) {
                const Routing& r = ranks[size_t(s)].r;
                const int64_t t0 = int64_t(s) * Nr;
                CHECK(r.global_count == ref.count);
                CHECK(r.global_tokens == Ng);
                CHECK(r.capacity == ref.capacity);
                CHECK(r.dropped == ref.dropped);
                CHECK(
                    same_bits(r.gate, std::vector<float>(ref.gate.begin() + t0 * k, ref.gate.begin() + (t0 + Nr) * k)));
                CHECK(r.expert ==
                      std::vector<int32_t>(ref.expert.begin() + t0 * k, ref.expert.begin() + (t0 + Nr) * k));
                // Each slot: dropped in both or kept in both, and its send row holds its token.
                bool fates = true;
                for (int64_t i = 0; i < Nr * k; ++i) {
                  const int32_t p = r.pos[size_t(i)], q = ref.pos[size_t(t0 * k + i)];
                  fates = fates && (p < 0) == (q < 0) && (p < 0 || r.token[size_t(p)] == int32_t(i / k));
                }
                CHECK(fates);
                // Every owner's groups: one process's rows of its experts, in order.
                const std::vector<int32_t> groups = owner_groups(ranks, s);
                const int64_t L = E / R;
                const std::vector<int32_t> want(ref.token.begin() + ref.offset[size_t(s * L)],
                                                ref.token.begin() + ref.offset[size_t((s + 1) * L)]);
                CHECK(groups == want);
                std::vector<int64_t> want_offset;
                for (int64_t e = s * L; e <= (s + 1) * L; ++e)
                  want_offset.push_back(ref.offset[size_t(e)] - ref.offset[size_t(s * L)]);
                CHECK(r.expert_offset == want_offset);
                // The router's gradient on grad_tokens = N_g: one process's rows.
                const std::vector<float> g = router_logit_grad(c, r, dgate.data() + t0 * k, 3.0f);
                CHECK(same_bits(g, std::vector<float>(ref_grad.begin() + t0 * E, ref_grad.begin() + (t0 + Nr) * E)));
                if (Nr % kRouteSumBlock == 0 || R == 1) {
                  CHECK(r.aux_loss == ref.aux_loss);
                  CHECK(r.z_loss == ref.z_loss);
                } else {
                  CHECK(std::abs(r.aux_loss - ref.aux_loss) <= 1e-15 * std::abs(ref.aux_loss));
                  CHECK(std::abs(r.z_loss - ref.z_loss) <= 1e-15 * std::abs(ref.z_loss));
                  losses_differ += s == 0 && (r.aux_loss != ref.aux_loss || r.z_loss != ref.z_loss);
                }
              }
            }
  MESSAGE(cases, " cases; the losses' last bits differ in ", losses_differ, " (rank-local blocks)");
  CHECK(losses_differ > 0);  // the blocks really are rank-local at N_r = 100
}

TEST_CASE("moe route split: route_group names bad shards and counts") {
  RouteParams c;
  c.experts = 6, c.top_k = 2;
  std::vector<float> logits(size_t(10 * 6), 0.0f);
  Routing r = route_local(c, logits.data(), 10);
  CHECK_THROWS_WITH_AS(route_group(c, r, ExpertShard{4, 0, 6}, std::vector<int64_t>(24), 40),
                       doctest::Contains("experts a multiple of ranks"), Error);
  CHECK_THROWS_WITH_AS(route_group(c, r, ExpertShard{2, 1, 6}, std::vector<int64_t>(12), 20),
                       doctest::Contains("row 1 this rank's counts"), Error);
}

// The routing seam's host defaults (Backend::moe_*, train/backend.cpp) are the
// host-index calls they replace: route(), gather_rows_indexed, combine_rows,
// combine_rows_backward, router_logit_grad, bit for bit.
TEST_CASE("moe routing seam: the host defaults give the bits of route() and the host-index calls") {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const bool normalize : {true, false})
    for (const int64_t k : {1, 3}) {
      CAPTURE(normalize);
      CAPTURE(k);
      const int64_t N = 300, E = 6, C = 5, M = N * k;
      const MoeConfig c = moe(E, k, normalize, 0.1, 0.01);
      auto rnd = [&](int64_t n) {
        std::vector<float> v(static_cast<size_t>(n));
        for (auto& x : v) x = nd(rng);
        return v;
      };
      const std::vector<float> logits = rnd(N * E), x = rnd(N * C), src = rnd(M * C), dout = rnd(N * C);
      auto up = [&](const std::vector<float>& v, int64_t rows, int64_t cols) {
        Tensor t = be->empty(rows, cols);
        be->upload(v.data(), t);
        return t;
      };
      auto down = [&](const Tensor& t) {
        std::vector<float> v(size_t(t.size()));
        be->download(t, v.data());
        return v;
      };
      const Tensor lt = up(logits, N, E), xt = up(x, N, C), st = up(src, M, C), dt = up(dout, N, C);
      const Routing ref = route(c, logits.data(), N);
      std::unique_ptr<RouteState> rs = be->moe_route(c.route_params(), lt);
      REQUIRE(rs != nullptr);
      CHECK(rs->offset == ref.offset);
      CHECK(rs->tokens == N);
      CHECK(rs->summary().count == ref.count);
      CHECK(std::memcmp(&rs->summary().aux_loss, &ref.aux_loss, 8) == 0);
      CHECK(std::memcmp(&rs->summary().z_loss, &ref.z_loss, 8) == 0);
      const Routing got = be->moe_download(*rs);
      CHECK(same_bits(got.probs, ref.probs));
      CHECK(same_bits(got.lse, ref.lse));
      CHECK(got.expert == ref.expert);
      CHECK(same_bits(got.gate, ref.gate));
      CHECK(got.pos == ref.pos);
      CHECK(got.token == ref.token);
      Tensor g1 = be->empty(M, C), g2 = be->empty(M, C);
      be->moe_gather(xt, *rs, g1);
      be->gather_rows_indexed(xt, ref.token.data(), g2);
      CHECK(same_bits(down(g1), down(g2)));
      for (const bool gated : {true, false}) {
        Tensor o1 = be->empty(N, C), o2 = be->empty(N, C);
        be->moe_combine(st, *rs, gated, o1);
        be->combine_rows(st, ref.pos.data(), gated ? ref.gate.data() : nullptr, k, o2);
        CHECK(same_bits(down(o1), down(o2)));
      }
      Tensor ds1 = be->empty(M, C), ds2 = be->empty(M, C), dl = be->empty(N, E);
      std::vector<float> dgate_ref(static_cast<size_t>(M)), dgate;
      be->moe_combine_backward(dt, st, *rs, ds1);
      be->combine_rows_backward(dt, st, ref.pos.data(), ref.gate.data(), k, ds2, dgate_ref.data());
      CHECK(same_bits(down(ds1), down(ds2)));
      be->moe_download(*rs, &dgate);
      CHECK(same_bits(dgate, dgate_ref));
      be->moe_router_grad(*rs, 3.0f, dl);
      CHECK(same_bits(down(dl), router_logit_grad(c, ref, dgate_ref.data(), 3.0f)));
    }
}

// L(logits) = sum_slots dgate * gate + aux + z at fixed expert choices: the
// router gradient is d L / d logits (loss scale s multiplies every term).
TEST_CASE("moe router_logit_grad equals central differences of the routing's losses") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  for (const bool normalize : {true, false})
    for (const int64_t k : {1, 2, 3}) {
      const MoeConfig c = moe(5, k, normalize, 0.3, 0.2);
      const int64_t N = 7, E = 5;
      std::vector<float> logits(size_t(N * E)), dgate(size_t(N * k));
      for (auto& v : logits) v = nd(rng);
      for (auto& v : dgate) v = nd(rng);
      const float scale = 2.0f;
      const Routing r = route(c, logits.data(), N);
      const std::vector<float> g = router_logit_grad(c, r, dgate.data(), scale);
      auto loss = [&](const std::vector<float>& l, bool* same) {
        const Routing q = route(c, l.data(), N);
        *same = q.expert == r.expert;
        // The gates are floats: differentiate the float64 gates instead, for precision.
        double L = 0;
        for (int64_t t = 0; t < N; ++t) {
          double sel = 0;
          for (int64_t j = 0; j < k; ++j) sel += q.probs[size_t(t * E + q.expert[size_t(t * k + j)])];
          for (int64_t j = 0; j < k; ++j) {
            const double p = q.probs[size_t(t * E + q.expert[size_t(t * k + j)])];
            L += double(dgate[size_t(t * k + j)]) * (normalize ? p / sel : p);
          }
        }
        // aux with f held at the base routing's counts (piecewise constant in the logits).
        double aux = 0;
        for (int64_t e = 0; e < E; ++e) {
          double P = 0;
          for (int64_t t = 0; t < N; ++t) P += q.probs[size_t(t * E + e)];
          aux += double(r.count[size_t(e)]) / double(N * k) * P / double(N);
        }
        return L + double(scale) * (c.aux_loss * double(E) * aux + q.z_loss);
      };
      int64_t checked = 0;
      for (int64_t i = 0; i < N * E; ++i) {
        const float h = 1e-2f;
        std::vector<float> lp = logits, lm = logits;
        lp[size_t(i)] += h, lm[size_t(i)] -= h;
        bool sp = false, sm = false;
        const double fd = (loss(lp, &sp) - loss(lm, &sm)) / (double(lp[size_t(i)]) - double(lm[size_t(i)]));
        if (!sp || !sm) continue;  // a choice flipped: not differentiable here
        ++checked;
        CHECK_MESSAGE(std::abs(fd - double(g[size_t(i)])) <= 2e-4 * (1.0 + std::abs(fd)), "k=", k,
                      " normalize=", normalize, " logit ", i, ": fd ", fd, " analytic ", g[size_t(i)]);
      }
      CHECK(checked > N * E / 2);
    }
}

namespace {

// The layer alone on the CPU backend in FP32, its linears straight to the backend.
struct HarnessModel {
  std::unique_ptr<Backend> be = make_cpu_backend(1);
  ParamStore ps;
};
struct Harness final : HarnessModel, ParamCalls {
  std::vector<LinearLayerInfo> infos;
  std::unique_ptr<MoeMlp> layer;
  uint64_t next_id = 0;
  Harness(const MoeConfig& c, int64_t C, bool bias) : ParamCalls(*be, ps) {
    layer = std::make_unique<MoeMlp>(c, C, bias, "h.0.mlp.", 0.3f, 0.3f, ps, next_id, infos);
    ps.finalize(*be, 11);
  }
  // L = sum y * R + aux + z (float64 on the host).
  double loss(const std::vector<float>& x, const std::vector<float>& R, int64_t N, int64_t C,
              std::vector<int32_t>* experts) {
    Tensor xt = be->empty(N, C);
    be->upload(x.data(), xt);
    StepContext s;
    Tensor y = layer->forward(*be, *this, s, xt);
    std::vector<float> h(size_t(N * C));
    be->download(y, h.data());
    double L = 0;
    for (size_t i = 0; i < h.size(); ++i) L += double(h[i]) * double(R[i]);
    if (experts) *experts = be->moe_download(*layer->route_state()).expert;
    return L + layer->routing().aux_loss + layer->routing().z_loss;
  }
};

}  // namespace

TEST_CASE("moe layer: gradients of router, experts, shared expert and input equal central differences") {
  // Dropless, with and without a shared expert; capacity dispatch with drops (40 tokens x 2 slots over 4 experts
  // of 16 rows: about a fifth of the slots dropped).
  for (const int variant : {0, 1, 2}) {
    const bool shared = variant == 1, capacity = variant == 2;
    MoeConfig c = moe(4, 2, true, 0.05, 0.01);
    c.shared_expert = shared;
    c.expert_hidden = 6;
    if (capacity) c.dispatch = MoeConfig::Dispatch::capacity, c.capacity_factor = 0.5;
    const int64_t N = capacity ? 40 : 9, C = 5;
    Harness hz(c, C, /*bias=*/true);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(N * C)), R(size_t(N * C));
    for (auto& v : x) v = nd(rng);
    for (auto& v : R) v = nd(rng);
    std::vector<int32_t> base;
    hz.loss(x, R, N, C, &base);
    if (capacity) CHECK(hz.layer->routing().dropped > 8);
    // Analytic gradients: backward with dy = R.
    hz.be->fill(hz.ps.grads, 0.0f);
    Tensor dy = hz.be->empty(N, C);
    hz.be->upload(R.data(), dy);
    Tensor dx = hz.layer->backward(*hz.be, hz, StepContext{}, dy);
    std::vector<float> gx(size_t(N * C)), gp(size_t(hz.ps.size()));
    hz.be->download(dx, gx.data());
    hz.be->download(hz.ps.grads, gp.data());
    std::vector<float> values(size_t(hz.ps.size()));
    hz.be->download(hz.ps.values, values.data());
    const double eps = 1e-2;
    auto check_fd = [&](double fd, double an, const std::string& what) {
      CHECK_MESSAGE(std::abs(fd - an) <= 2e-3 * (1.0 + std::abs(an)), what, ": fd ", fd, " analytic ", an);
    };
    int64_t checked = 0, skipped = 0;
    // Every parameter element (router included; the layer is tiny).
    for (int64_t i = 0; i < hz.ps.size(); ++i) {
      std::vector<double> L(2);
      bool same = true;
      for (int sgn = 0; sgn < 2; ++sgn) {
        std::vector<float> v = values;
        v[size_t(i)] = float(double(values[size_t(i)]) + (sgn ? -eps : eps));
        hz.be->upload(v.data(), hz.ps.values);
        std::vector<int32_t> ex;
        L[size_t(sgn)] = hz.loss(x, R, N, C, &ex);
        same = same && ex == base;
      }
      hz.be->upload(values.data(), hz.ps.values);
      if (!same) {
        ++skipped;
        continue;
      }
      ++checked;
      // aux's f_e is constant while the choices are: the analytic gradient holds.
      check_fd((L[0] - L[1]) / (2 * eps), gp[size_t(i)], "parameter element " + std::to_string(i));
    }
    for (int64_t i = 0; i < N * C; ++i) {
      std::vector<double> L(2);
      bool same = true;
      for (int sgn = 0; sgn < 2; ++sgn) {
        std::vector<float> v = x;
        v[size_t(i)] = float(double(x[size_t(i)]) + (sgn ? -eps : eps));
        std::vector<int32_t> ex;
        L[size_t(sgn)] = hz.loss(v, R, N, C, &ex);
        same = same && ex == base;
      }
      if (!same) {
        ++skipped;
        continue;
      }
      ++checked;
      check_fd((L[0] - L[1]) / (2 * eps), gx[size_t(i)], "input element " + std::to_string(i));
    }
    MESSAGE("shared expert ", shared, ", capacity ", capacity, ": ", checked, " gradients checked, ", skipped,
            " skipped (a choice flipped)");
    CHECK(skipped * 10 < checked);
  }
}

TEST_CASE("moe config: bad values name the key and the valid range") {
  auto parse = [](const std::string& moe_json) {
    return config_from_json(nlohmann::json::parse(R"({"name": "m", "model": {"type": "gpt", "width": 16, "heads": 2, "moe": )" +
                                                  moe_json + R"(}, "data": {"type": "char", "path": "x.txt"}})"));
  };
  CHECK_THROWS_WITH_AS(parse(R"({"experts": 4, "top_k": 5})"), doctest::Contains("model.moe.top_k"), Error);
  CHECK_THROWS_WITH_AS(parse(R"({"experts": 0})"), doctest::Contains("model.moe.experts"), Error);
  CHECK_THROWS_WITH_AS(parse(R"({"experts": 4, "top_k": 3})"), doctest::Contains("expert_hidden"), Error);
  CHECK_THROWS_WITH_AS(parse(R"({"experts": 4, "bogus": 1})"), doctest::Contains("bogus"), Error);
  CHECK_THROWS_WITH_AS(parse(R"({"experts": 4, "aux_loss": -1})"), doctest::Contains("model.moe.aux_loss"), Error);
  CHECK_THROWS_WITH_AS(parse(R"({"experts": 4, "dispatch": "padded"})"), doctest::Contains("model.moe.dispatch"),
                       Error);
  CHECK_THROWS_WITH_AS(parse(R"({"experts": 4, "dispatch": "capacity", "capacity_factor": 0})"),
                       doctest::Contains("model.moe.capacity_factor"), Error);
  CHECK_THROWS_WITH_AS(parse(R"({"experts": 4, "capacity_factor": 4.5})"),
                       doctest::Contains("model.moe.capacity_factor"), Error);
  // The dispatch reaches the routing's parameters, and the resolved config names it only when not the default.
  const RunConfig cap = parse(R"({"experts": 4, "dispatch": "capacity", "capacity_factor": 1.5})");
  CHECK(cap.model.moe.route_params().capacity_factor == 1.5);
  CHECK(config_to_json(cap)["model"]["moe"]["dispatch"] == "capacity");
  CHECK(config_to_json(cap)["model"]["moe"]["capacity_factor"] == 1.5);
  const RunConfig drop = parse(R"({"experts": 4, "capacity_factor": 1.5})");
  CHECK(drop.model.moe.route_params().capacity_factor == 0.0);
  CHECK_FALSE(config_to_json(drop)["model"]["moe"].contains("dispatch"));
}

}  // namespace fp4lab::train
