// Mixture-of-experts routing (train/moe.hpp's router): the host reference
// route() / router_logit_grad(), and the types of the backend's routing seam
// (Backend::moe_route and the calls after it, train/backend.hpp), which keeps
// one batch's routing in the backend's memory. The host reference defines the
// bits: a backend that routes in its own memory (the CUDA backend,
// train/cuda/moe_route.hpp) gives route()'s decisions and values and
// router_logit_grad's gradient bit for bit on the same logits.
#pragma once

#include <cstdint>
#include <vector>

namespace fp4lab::train {

// The routing's parameters (MoeConfig's routing fields, train/model.hpp).
struct RouteParams {
  int64_t experts = 0, top_k = 1;
  bool normalize_top_k = true;  // gates: the top-k probabilities renormalised to sum 1; false: as they are
  double aux_loss = 0, z_loss = 0;
};

// One token-to-expert assignment of a batch (host arrays).
struct Routing {
  int64_t tokens = 0, experts = 0, k = 0;
  std::vector<double> probs;        // [tokens, experts] softmax
  std::vector<double> lse;          // [tokens] logsumexp of the logits
  std::vector<int32_t> expert;      // [tokens, k] chosen experts, by decreasing probability
  std::vector<float> gate;          // [tokens, k] combine weights
  std::vector<int32_t> pos;         // [tokens, k] row of the slot in the grouped tensor
  std::vector<int32_t> token;       // [tokens * k] token of each grouped row
  std::vector<int64_t> count;       // [experts] n_e
  std::vector<int64_t> offset;      // [experts + 1]
  double aux_loss = 0, z_loss = 0;  // with their coefficients applied
};

// The auxiliary losses' sums over tokens run in blocks of this many tokens
// (each block summed in token order from 0, then the blocks' sums in block
// order from 0), so that a parallel device reduction gives the same bits.
inline constexpr int64_t kRouteSumBlock = 256;

// Routing of logits [tokens, experts] (row-major, host) under c.
Routing route(const RouteParams& c, const float* logits, int64_t tokens);
// d(total loss)/d(logits) [tokens, experts] from the gates' gradient dgate
// [tokens, k] and the auxiliary losses (their gradient times loss_scale).
std::vector<float> router_logit_grad(const RouteParams& c, const Routing& r, const float* dgate, float loss_scale);

// What metrics.jsonl reports of one layer's routing (routing_metrics, train/moe.hpp).
struct RouteSummary {
  int64_t tokens = 0, experts = 0, k = 0;
  std::vector<int64_t> count;       // [experts] n_e
  double aux_loss = 0, z_loss = 0;  // Routing's
};
RouteSummary route_summary(const Routing& r);

// One batch's routing in a backend's memory (Backend::moe_route), and the
// host figures every backend has once moe_route returns.
struct RouteState {
  virtual ~RouteState() = default;
  RouteParams params;
  int64_t tokens = 0;
  std::vector<int64_t> offset;  // [experts + 1] the grouped tensor's row offsets (the grouped linear's)
  RouteSummary summary;
};

// The default seam's state (train/backend.cpp): the routing on the host, and
// the gates' gradient once Backend::moe_combine_backward has run.
struct HostRouteState final : RouteState {
  Routing r;
  std::vector<float> dgate;  // [tokens * k]; empty before moe_combine_backward
};

}  // namespace fp4lab::train
