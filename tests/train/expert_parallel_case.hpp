// Expert parallelism's MoE layer on in-process thread ranks, shared by the
// CPU and CUDA trainer tests (plan docs/log/2026-12-02-expert-parallel-plan.md
// section 6, tests 3 and 7): R ranks each holding E/R experts and computing a
// share of the tokens against one process holding every expert on the
// concatenated tokens, on one backend. Contract C1: every expert's dW / db on
// its owner, the router's logit gradient (through the router's dW), the
// routing figures, bit for bit; C2 (recipes whose forward and dgrad operands
// are row-local: fp32, bf16, mxfp8, and nvfp4 without a shared expert, the
// router being FP32): y and dx bit for bit; replicated dW summed over the
// ranks within 1e-5 of one process's.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "recipes/recipe.hpp"
#include "train/dist/expert_parallel.hpp"
#include "train/param_calls.hpp"

namespace fp4lab::train::test {

// A fresh backend for each rank (and for the one-process reference).
using BackendFactory = std::function<std::unique_ptr<Backend>()>;

namespace ep_case {

constexpr int64_t kTokens = 256, kWidth = 32;

struct LayerOut {
  std::vector<float> y, dx;
  std::vector<std::vector<float>> grads;  // by parameter index; empty: not held
  RouteSummary routing;
  int64_t held_experts = 0;
};

// One rank's layer (ranks 1: one process) on x / dy rows [N, C]: forward, backward. logits (non-empty: [N, E]):
// the router's output replaced by these before the routing (MoeMlp::forward_routed). width: C; compact: the
// dispatch cast's transport (MoeMlp::set_compact_dispatch).
inline LayerOut run_layer(const BackendFactory& make, const MoeConfig& c, const Recipe* recipe, int ranks, int rank,
                          Communicator* comm, const std::vector<float>& x, const std::vector<float>& dy, int64_t N,
                          const std::vector<float>& logits, int64_t width = kWidth, bool compact = true) {
  auto be = make();
  ParamStore ps;
  ps.set_expert_parallel(ranks, rank);
  std::vector<LinearLayerInfo> infos;
  uint64_t next_id = 0;
  MoeMlp layer(c, width, /*bias=*/true, "h.0.mlp.", 0.3f, 0.3f, ps, next_id, infos);
  ps.finalize(*be, 11);
  std::unique_ptr<CommExpertExchange> ex;
  if (comm) {
    ex = std::make_unique<CommExpertExchange>(*comm);
    layer.set_expert_exchange(ex.get(), /*global_grad=*/true);
    layer.set_compact_dispatch(compact);
  }
  ParamCalls calls(*be, ps);
  StepContext s;
  s.recipe = recipe, s.seed = 5, s.step = 3, s.loss_scale = 2.0f;
  Tensor xt = be->empty(N, width), dyt = be->empty(N, width);
  be->upload(x.data(), xt);
  be->upload(dy.data(), dyt);
  LayerOut o;
  Tensor lg = layer.router_logits(*be, calls, s, xt);  // the router's forward (its backward follows)
  if (!logits.empty()) be->upload(logits.data(), lg);
  Tensor y = layer.forward_routed(*be, calls, s, xt, lg);
  Tensor dx = layer.backward(*be, calls, s, dyt);
  o.y.resize(size_t(N * width)), o.dx.resize(size_t(N * width));
  be->download(y, o.y.data());
  be->download(dx, o.dx.data());
  o.grads.resize(ps.infos().size());
  for (int i = 0; i < int(ps.infos().size()); ++i) {
    if (!ps.info(i).held) continue;
    o.grads[size_t(i)].resize(size_t(ps.info(i).size()));
    be->download(ps.grad(i), o.grads[size_t(i)].data());  // the backend's memory (a GPU's on CUDA)
    o.held_experts += ps.info(i).placement.expert >= 0 && ps.info(i).name.ends_with("c_fc.weight");
  }
  o.routing = layer.routing();
  return o;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

inline std::vector<float> rows(const std::vector<float>& v, int64_t first, int64_t n) {
  return std::vector<float>(v.begin() + first * kWidth, v.begin() + (first + n) * kWidth);
}

}  // namespace ep_case

// What a backend's GEMMs promise across row counts. CPU (Eigen): a row of a product does not depend on the
// other rows, so the router's logits, the shared expert and the router's dgrad of a share are one process's
// rows bit for bit (C2 in full). CUDA (cuBLAS picks its kernels by shape): they are not, so the test injects
// the same logits on both sides (C1's condition), y is bitwise only without a shared expert, and dx (the
// router's dgrad over the share's rows) is checked within 1e-5 of its largest element.
enum class GemmRows { independent, shape_dependent };

// The layer on R in {2, 4} thread ranks of `make`'s backend against one process of it, for each recipe
// (the contracts C1 and C2 above).
inline void check_expert_parallel_layer(const BackendFactory& make, std::initializer_list<const char*> recipes,
                                        GemmRows gemm_rows = GemmRows::independent,
                                        MoeConfig::DispatchCast cast = MoeConfig::DispatchCast::none) {
  const bool inject = gemm_rows == GemmRows::shape_dependent;
  using namespace ep_case;
  std::mt19937 rng(4747);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int64_t cases = 0;
  double noisiest = 0;
  for (const char* recipe_name : recipes)
    for (const int R : {2, 4})
      for (const auto& [E, k] : {std::pair<int64_t, int64_t>{8, 2}, {16, 6}})
        for (const bool shared : {false, true})
          for (const bool capacity : {false, true}) {
            CAPTURE(recipe_name);
            CAPTURE(R);
            CAPTURE(E);
            CAPTURE(k);
            CAPTURE(shared);
            CAPTURE(capacity);
            const Recipe recipe = recipe_by_name(recipe_name);
            MoeConfig c;
            c.experts = E, c.top_k = k, c.aux_loss = 0.01, c.z_loss = 0.001, c.expert_hidden = 64;
            c.shared_expert = shared;
            c.dispatch_cast = cast;
            if (capacity) c.dispatch = MoeConfig::Dispatch::capacity, c.capacity_factor = 1.0;
            const int64_t Ng = kTokens * R;
            std::vector<float> x(size_t(Ng * kWidth)), dy(size_t(Ng * kWidth));
            for (auto& v : x) v = nd(rng);
            for (auto& v : dy) v = nd(rng);
            std::vector<float> logits;
            if (inject) {
              logits.resize(size_t(Ng * E));
              for (auto& v : logits) v = nd(rng);
            }
            auto logit_rows = [&](int64_t first, int64_t n) {
              return inject ? std::vector<float>(logits.begin() + first * E, logits.begin() + (first + n) * E)
                            : std::vector<float>{};
            };
            const LayerOut ref = run_layer(make, c, &recipe, 1, 0, nullptr, x, dy, Ng, logits);
            auto comms = make_thread_comms(R);
            std::vector<LayerOut> out(static_cast<size_t>(R));
            std::vector<std::thread> th;
            for (int r = 0; r < R; ++r)
              th.emplace_back([&, r] {
                out[size_t(r)] =
                    run_layer(make, c, &recipe, R, r, comms[size_t(r)].get(), rows(x, r * kTokens, kTokens),
                              rows(dy, r * kTokens, kTokens), kTokens, logit_rows(r * kTokens, kTokens));
              });
            for (auto& t : th) t.join();
            ++cases;
            if (capacity) CHECK(ref.routing.dropped > 0);
            const bool row_local = !(shared && std::string(recipe_name) == "nvfp4");
            const size_t P = ref.grads.size();
            std::vector<std::vector<float>> replicated_sum(P);
            for (int r = 0; r < R; ++r) {
              const LayerOut& o = out[size_t(r)];
              CHECK(o.held_experts == E / R);
              CHECK(o.routing.count == ref.routing.count);
              CHECK(o.routing.dropped == ref.routing.dropped);
              CHECK(o.routing.tokens == Ng);
              CHECK(o.routing.aux_loss == ref.routing.aux_loss);  // 256 tokens a rank: whole sum blocks
              CHECK(o.routing.z_loss == ref.routing.z_loss);
              if (row_local && !inject) {
                CHECK(same_bits(o.y, rows(ref.y, r * kTokens, kTokens)));
                CHECK(same_bits(o.dx, rows(ref.dx, r * kTokens, kTokens)));
              } else if (row_local) {
                if (!shared) CHECK(same_bits(o.y, rows(ref.y, r * kTokens, kTokens)));
                for (const auto& [got, want] : {std::pair{&o.y, rows(ref.y, r * kTokens, kTokens)},
                                                std::pair{&o.dx, rows(ref.dx, r * kTokens, kTokens)}}) {
                  double worst = 0, scale = 0;
                  for (size_t j = 0; j < want.size(); ++j) {
                    worst = std::max(worst, std::abs(double((*got)[j]) - double(want[j])));
                    scale = std::max(scale, std::abs(double(want[j])));
                  }
                  CHECK(worst <= 1e-5 * scale);
                }
              }
              for (size_t i = 0; i < P; ++i) {
                if (o.grads[i].empty()) continue;
                const bool expert = i >= 1 && i < 1 + size_t(E) * 4;  // router, then 4 tensors an expert
                if (expert) {
                  CHECK_MESSAGE(same_bits(o.grads[i], ref.grads[i]), "parameter ", i);
                } else if (replicated_sum[i].empty()) {
                  replicated_sum[i] = o.grads[i];
                } else {
                  for (size_t j = 0; j < o.grads[i].size(); ++j) replicated_sum[i][j] += o.grads[i][j];
                }
              }
            }
            // Replicated parameters (router, shared expert): the ranks' sum within DP rounding (elementwise
            // relative to the largest element); under nvfp4 the shared expert's operands take each rank's own
            // amax and stochastic-rounding positions, so its dW differs by NVFP4's noise: the relative
            // Frobenius norm of the difference, bounded well below 1.
            for (size_t i = 0; i < P; ++i) {
              if (replicated_sum[i].empty()) continue;
              double worst = 0, scale = 0, d2 = 0, r2 = 0;
              for (size_t j = 0; j < ref.grads[i].size(); ++j) {
                const double d = double(replicated_sum[i][j]) - double(ref.grads[i][j]);
                worst = std::max(worst, std::abs(d));
                scale = std::max(scale, std::abs(double(ref.grads[i][j])));
                d2 += d * d, r2 += double(ref.grads[i][j]) * double(ref.grads[i][j]);
              }
              const bool noisy = !row_local && i > size_t(E) * 4;  // the shared expert's
              if (noisy) {
                noisiest = std::max(noisiest, std::sqrt(d2 / r2));
                CHECK_MESSAGE(std::sqrt(d2) <= 0.3 * std::sqrt(r2), "parameter ", i, ": ", std::sqrt(d2), " of ",
                              std::sqrt(r2));
              } else {
                CHECK_MESSAGE(worst <= 1e-5 * scale, "parameter ", i, ": ", worst, " of ", scale);
              }
            }
          }
  MESSAGE(cases, " cases; nvfp4 shared expert dW, largest relative difference (Frobenius) ", noisiest);
}

}  // namespace fp4lab::train::test
