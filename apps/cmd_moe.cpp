// `fp4lab bench moe`: the mixture-of-experts data movement of one MoE layer on
// a backend (the routing, the gather into the experts' grouped rows, the gated
// combine, the combine's backward and the router's gradient: Backend::moe_*,
// train/backend.hpp), each against a plain copy of the token activations
// measured in the same run, the strongest bandwidth baseline a user has.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "core/error.hpp"
#include "train/backend.hpp"
#include "train/route.hpp"

namespace fp4lab {

namespace {

struct MoeBenchArgs {
  std::string backend = "cuda";
  int threads = 0;
  int64_t tokens = 16384, width = 384, experts = 8, top_k = 2;
  std::string dispatch = "dropless";
  double capacity_factor = 1.25;
  int repeats = 20, inner = 10;
};

// Median over `repeats` rounds of the milliseconds one call of f takes: each
// round makes `inner` calls back to back and waits for the backend once.
template <class F>
double median_ms(train::Backend& be, int repeats, int inner, F&& f) {
  for (int w = 0; w < 2; ++w) f();  // warm-up (first-touch allocations, cuBLAS/kernel loading)
  be.synchronize();
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) f();
    be.synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / inner);
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

void check_args(const MoeBenchArgs& a) {
  auto positive = [](const char* opt, int64_t v) {
    if (v <= 0) throw Error(std::string(opt) + " must be positive, got " + std::to_string(v));
  };
  positive("--tokens", a.tokens);
  positive("--width", a.width);
  positive("--experts", a.experts);
  positive("--top-k", a.top_k);
  positive("--repeats", a.repeats);
  positive("--inner", a.inner);
  if (a.experts > train::kMaxRouteExperts)
    throw Error("--experts " + std::to_string(a.experts) + ": at most " + std::to_string(train::kMaxRouteExperts));
  if (a.top_k > a.experts)
    throw Error("--top-k " + std::to_string(a.top_k) + ": at most --experts (" + std::to_string(a.experts) + ")");
  if (a.dispatch != "dropless" && a.dispatch != "capacity")
    throw Error("--dispatch '" + a.dispatch + "': valid: dropless, capacity");
  if (a.dispatch == "capacity" && !(a.capacity_factor > 0 && a.capacity_factor <= double(a.experts)))
    throw Error("--capacity-factor " + std::to_string(a.capacity_factor) + ": must be in (0, experts]");
}

void run_bench_moe(const MoeBenchArgs& a) {
  check_args(a);
  std::unique_ptr<train::Backend> be = train::make_backend(a.backend, a.threads);
  const int64_t N = a.tokens, C = a.width, E = a.experts, k = a.top_k;
  train::RouteParams p;
  p.experts = E, p.top_k = k, p.normalize_top_k = true, p.aux_loss = 0.01, p.z_loss = 0.001;
  p.capacity_factor = a.dispatch == "capacity" ? a.capacity_factor : 0.0;

  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto upload = [&](int64_t rows, int64_t cols, float sd) {
    std::vector<float> h(size_t(rows * cols));
    for (float& v : h) v = sd * nd(rng);
    train::Tensor t = be->empty(rows, cols);
    be->upload(h.data(), t);
    return t;
  };
  const train::Tensor logits = upload(N, E, 1.0f), x = upload(N, C, 1.0f), dy = upload(N, C, 1.0f);
  std::unique_ptr<train::RouteState> route = be->moe_route(p, logits);
  const int64_t M = route->offset.back();
  const train::Tensor src = upload(M, C, 1.0f);
  train::Tensor copy_out = be->empty(N, C), grouped = be->empty(M, C), y = be->empty(N, C), dsrc = be->empty(M, C),
                dlogits = be->empty(N, E);
  be->moe_combine_backward(dy, src, *route, dsrc);  // the gates' gradient exists before the router's

  const double f = 4.0;  // bytes a float
  struct Row {
    const char* what;
    double ms, bytes;
  };
  std::vector<Row> rows;
  const double copy_ms = median_ms(*be, a.repeats, a.inner, [&] { be->copy(x, copy_out); });
  rows.push_back({"copy of x [tokens, width] (baseline)", copy_ms, 2 * f * N * C});
  rows.push_back({"route (softmax, top-k, grouping, aux sums)",
                  median_ms(*be, a.repeats, a.inner, [&] { route = be->moe_route(p, logits); }),
                  f * N * E + 8.0 * N * E + (4.0 + 4.0 + 4.0) * N * k});
  rows.push_back({"gather x into the grouped rows",
                  median_ms(*be, a.repeats, a.inner, [&] { be->moe_gather(x, *route, grouped); }), 2 * f * M * C});
  rows.push_back({"combine, gated", median_ms(*be, a.repeats, a.inner, [&] { be->moe_combine(src, *route, true, y); }),
                  f * (M * C + N * C)});
  rows.push_back({"combine backward (dsrc and the gates' gradient)",
                  median_ms(*be, a.repeats, a.inner, [&] { be->moe_combine_backward(dy, src, *route, dsrc); }),
                  f * (N * C + 2 * M * C)});
  rows.push_back({"router gradient",
                  median_ms(*be, a.repeats, a.inner, [&] { be->moe_router_grad(*route, 1.0f, dlogits); }),
                  8.0 * N * E + f * N * E});

  std::printf(
      "bench moe: backend %s, %lld tokens x width %lld, %lld experts, top %lld, %s dispatch (%lld grouped "
      "rows); median of %d rounds of %d calls, each round waited for once\n",
      be->name().c_str(), (long long)N, (long long)C, (long long)E, (long long)k, a.dispatch.c_str(), (long long)M,
      a.repeats, a.inner);
  std::printf(
      "bytes: each operation's compulsory reads + writes of its FP32 rows (float64 probabilities for the "
      "route), counted once\n");
  std::printf("%-50s %10s %10s %9s\n", "operation", "ms", "GB/s", "of copy");
  const double copy_gbs = rows[0].bytes / (copy_ms * 1e-3) / 1e9;
  for (const Row& r : rows) {
    const double gbs = r.bytes / (r.ms * 1e-3) / 1e9;
    std::printf("%-50s %10.4f %10.1f %8.1f%%\n", r.what, r.ms, gbs, 100.0 * gbs / copy_gbs);
  }
}

}  // namespace

void register_bench_moe(CLI::App& bench) {
  auto a = std::make_shared<MoeBenchArgs>();
  CLI::App* c = bench.add_subcommand(
      "moe",
      "A mixture-of-experts layer's data movement on a backend: routing (softmax, top-k, grouping, the aux/z\n"
      "sums), the gather into the experts' grouped rows, the gated combine, the combine's backward and the\n"
      "router's gradient, each as ms and GB/s against a copy of the token activations in the same run.\n"
      "Example: fp4lab bench moe --backend cuda --tokens 16384 --width 384 --experts 8 --top-k 2");
  c->add_option("--backend", a->backend, "cpu or cuda")->capture_default_str();
  c->add_option("--threads", a->threads, "CPU backend threads (0: all)")->capture_default_str();
  c->add_option("--tokens", a->tokens, "Tokens in the batch")->capture_default_str();
  c->add_option("--width", a->width, "Model width (columns of the token activations)")->capture_default_str();
  c->add_option("--experts", a->experts, "Routed experts")->capture_default_str();
  c->add_option("--top-k", a->top_k, "Experts a token")->capture_default_str();
  c->add_option("--dispatch", a->dispatch, "dropless or capacity (model.moe.dispatch)")->capture_default_str();
  c->add_option("--capacity-factor", a->capacity_factor, "Capacity dispatch's factor (model.moe.capacity_factor)")
      ->capture_default_str();
  c->add_option("--repeats", a->repeats, "Timed rounds (median reported)")->capture_default_str();
  c->add_option("--inner", a->inner, "Calls a round")->capture_default_str();
  c->callback([a] { run_bench_moe(*a); });
}

}  // namespace fp4lab
