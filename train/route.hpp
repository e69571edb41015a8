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
  // Capacity dispatch (MoeConfig::dispatch): each expert takes at most
  // expert_capacity() slots, in slot order (tokens in order), the rest are
  // dropped; 0: dropless.
  double capacity_factor = 0;
};

// The rows each expert's group has under capacity dispatch:
// ceil(capacity_factor * tokens * k / experts) (in float64) rounded up to a
// multiple of 16 (whole 16-row blocks for the column-block quantizers); 0 when
// dropless. The grouped tensor then has experts * capacity rows, expert e's at
// [e capacity, (e + 1) capacity): its kept slots' tokens in order, then rows
// of zeros (no slot); its shape depends on the token count only.
int64_t expert_capacity(const RouteParams& p, int64_t tokens);

// One token-to-expert assignment of a batch (host arrays).
struct Routing {
  int64_t tokens = 0, experts = 0, k = 0;
  std::vector<double> probs;        // [tokens, experts] softmax
  std::vector<double> lse;          // [tokens] logsumexp of the logits
  std::vector<int32_t> expert;      // [tokens, k] chosen experts, by decreasing probability
  std::vector<float> gate;          // [tokens, k] combine weights
  std::vector<int32_t> pos;         // [tokens, k] row of the slot in the grouped tensor; -1: dropped
  std::vector<int32_t> token;       // [offset[experts]] token of each grouped row; -1: a row of zeros
  std::vector<int64_t> count;       // [experts] n_e: the slots routed to e (before any drop)
  std::vector<int64_t> offset;      // [experts + 1] the groups' first rows (capacity: e * capacity)
  int64_t capacity = 0;             // expert_capacity (0: dropless)
  int64_t dropped = 0;              // slots beyond their expert's capacity
  double aux_loss = 0, z_loss = 0;  // with their coefficients applied
};

// The auxiliary losses' sums over tokens run in blocks of this many tokens
// (each block summed in token order from 0, then the blocks' sums in block
// order from 0), so that a parallel device reduction gives the same bits.
inline constexpr int64_t kRouteSumBlock = 256;

// The most experts routing takes (config.model.moe.experts; the CUDA sums
// kernel sizes its per-thread columns by it).
inline constexpr int64_t kMaxRouteExperts = 4096;

// Routing of logits [tokens, experts] (row-major, host) under c.
Routing route(const RouteParams& c, const float* logits, int64_t tokens);
// d(total loss)/d(logits) [tokens, experts] from the gates' gradient dgate
// [tokens, k] and the auxiliary losses (their gradient times loss_scale).
std::vector<float> router_logit_grad(const RouteParams& c, const Routing& r, const float* dgate, float loss_scale);

// What metrics.jsonl reports of one layer's routing (routing_metrics, train/moe.hpp).
struct RouteSummary {
  int64_t tokens = 0, experts = 0, k = 0;
  std::vector<int64_t> count;       // [experts] n_e
  int64_t capacity = 0, dropped = 0;  // Routing's
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
  // The routing's figures (metrics.jsonl). A backend may keep them in its
  // memory until first asked (the CUDA backend under capacity dispatch, so
  // that the step waits for nothing): ask after the step.
  virtual const RouteSummary& summary() const { return summary_; }

 protected:
  mutable RouteSummary summary_;  // moe_route's, or summary()'s on its first call
};

// The default seam's state (train/backend.cpp): the routing on the host, and
// the gates' gradient once Backend::moe_combine_backward has run.
struct HostRouteState final : RouteState {
  explicit HostRouteState(Routing routing);
  Routing r;
  std::vector<float> dgate;  // [tokens * k]; empty before moe_combine_backward
};

}  // namespace fp4lab::train
