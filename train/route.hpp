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

// Expert parallelism's group (docs/log/2026-12-02-expert-parallel-plan.md):
// `ranks` ranks each compute a share of the batch; rank r holds experts
// [r E/R, (r + 1) E/R) of every MoE layer. {1, 0, E}: one process.
struct ExpertShard {
  int ranks = 1, rank = 0;
  int64_t experts = 0;  // E, a multiple of ranks
  int64_t local() const { return experts / ranks; }
  int64_t first() const { return int64_t(rank) * local(); }
};

// One token-to-expert assignment of a batch (host arrays). route_local sets
// the per-token fields, `count` and `block_sums`; route_group the rest.
// Under expert parallelism "the grouped tensor" is the send layout: this
// rank's kept slots grouped by global expert (tokens in order), so that the
// part for rank p is the contiguous experts of p; with one rank it is the
// experts' input itself (capacity: each group padded with zero rows to
// `capacity`).
struct Routing {
  int64_t tokens = 0, experts = 0, k = 0;
  std::vector<double> probs;    // [tokens, experts] softmax
  std::vector<double> lse;      // [tokens] logsumexp of the logits
  std::vector<int32_t> expert;  // [tokens, k] chosen experts, by decreasing probability
  std::vector<float> gate;      // [tokens, k] combine weights
  std::vector<int32_t> pos;     // [tokens, k] row of the slot in the grouped tensor; -1: dropped
  std::vector<int32_t> token;   // [offset[experts]] token of each grouped row; -1: a row of zeros
  std::vector<int64_t> count;   // [experts] n_e: this rank's slots routed to e (before any drop)
  std::vector<int64_t> offset;  // [experts + 1] the groups' first rows (capacity, one rank: e * capacity)
  // [blocks, experts + 1]: each kRouteSumBlock tokens' sums of probs[., e], then of lse^2 (the losses' parts).
  std::vector<double> block_sums;
  // route_group's view of the whole group (one process: count, tokens, tokens).
  ExpertShard shard;
  std::vector<int64_t> count_all;     // [ranks, experts] source s's slots for expert e (before drops)
  std::vector<int64_t> global_count;  // [experts] C_e = sum over sources (f_e = C_e / (N_g k))
  int64_t global_tokens = 0;          // N_g
  int64_t grad_tokens = 0;            // the 1/N of the auxiliary losses' gradients (DataParallel: tokens)
  // The exchange (ranks > 1; one rank: send_rows = recv_rows = {offset[experts]}, expert_offset = offset):
  std::vector<int64_t> send_rows, recv_rows;  // [ranks] rows of the grouped tensor to / from each rank
  // [local experts + 1] the first rows of this rank's experts' groups (their grouped linear's offsets):
  // each group its sources' rows in (source, token) order (capacity: then zero rows up to `capacity`).
  std::vector<int64_t> expert_offset;
  // [expert_offset.back()] row of the received rows (sources in rank order, each its part in its send
  // layout's order) that each local group row holds; -1: a row of zeros. Empty with one rank.
  std::vector<int32_t> recv_index;
  int64_t capacity = 0;             // expert_capacity on N_g (0: dropless)
  int64_t dropped = 0;              // slots of the whole group beyond their expert's capacity
  double aux_loss = 0, z_loss = 0;  // with their coefficients applied (route_losses)
};

// The auxiliary losses' sums over tokens run in blocks of this many tokens
// (each block summed in token order from 0, then the blocks' sums in block
// order from 0), so that a parallel device reduction gives the same bits.
inline constexpr int64_t kRouteSumBlock = 256;

// The most experts routing takes (config.model.moe.experts; the CUDA sums
// kernel sizes its per-thread columns by it).
inline constexpr int64_t kMaxRouteExperts = 4096;

// Routing of logits [tokens, experts] (row-major, host) under c, in one
// process: route_local, route_group over a shard of one (grad_tokens =
// tokens), route_losses on its own block sums.
Routing route(const RouteParams& c, const float* logits, int64_t tokens);
// Per token: softmax, top k, gates; `count` and `block_sums`. Independent of
// every other rank.
Routing route_local(const RouteParams& c, const float* logits, int64_t tokens);
// The grouping from every rank's counts count_all [R, E] (row `shard.rank` is
// r.count): global counts and N_g (= sum / k), capacity on N_g, source s keeps
// clamp(cap - sum_{s' < s} n_e^{s'}, 0, n_e^s) of its slots for e (one
// process's first-cap-slots rule), pos / token / offset of the send layout,
// and the exchange's sizes and receive map. Throws Error on counts that do not
// fit the shard.
void route_group(const RouteParams& c, Routing& r, const ExpertShard& shard, std::vector<int64_t> count_all,
                 int64_t grad_tokens);
// aux_loss and z_loss from every rank's block_sums in (rank, block) order
// (one process's bits when no block straddles two ranks: tokens a rank a
// multiple of kRouteSumBlock) and route_group's global counts.
void route_losses(const RouteParams& c, Routing& r, const std::vector<double>& block_sums_all);
// d(total loss)/d(logits) [tokens, experts] from the gates' gradient dgate
// [tokens, k] and the auxiliary losses (their gradient times loss_scale):
// f_e on the global counts, 1/N = 1/grad_tokens.
std::vector<float> router_logit_grad(const RouteParams& c, const Routing& r, const float* dgate, float loss_scale);

// What metrics.jsonl reports of one layer's routing (routing_metrics,
// train/moe.hpp): the whole group's (global counts, N_g).
struct RouteSummary {
  int64_t tokens = 0, experts = 0, k = 0;
  std::vector<int64_t> count;         // [experts] C_e
  int64_t capacity = 0, dropped = 0;  // Routing's
  double aux_loss = 0, z_loss = 0;    // Routing's
};
RouteSummary route_summary(const Routing& r);

// One batch's routing in a backend's memory (Backend::moe_route), and the
// host figures every backend has once moe_route returns.
struct RouteState {
  virtual ~RouteState() = default;
  RouteParams params;
  int64_t tokens = 0;
  std::vector<int64_t> offset;  // [experts + 1] the grouped tensor's row offsets (Routing's)
  // Routing's exchange fields (one process: {1, 0, E}, send / recv {offset[E]}, expert_offset = offset).
  ExpertShard shard;
  int64_t global_tokens = 0, grad_tokens = 0;
  std::vector<int64_t> send_rows, recv_rows, expert_offset;
  // The routing's figures (metrics.jsonl). A backend may keep them in its
  // memory until first asked (the CUDA backend under capacity dispatch, so
  // that the step waits for nothing): ask after the step.
  virtual const RouteSummary& summary() const { return summary_; }
  // The fields above (but params and the summary) from a host routing after route_group.
  void set_from(const Routing& r);

 protected:
  mutable RouteSummary summary_;  // moe_route's, or summary()'s on its first call
};

// The default seam's state (train/backend.cpp): the routing on the host, and
// the gates' gradient once Backend::moe_combine_backward has run.
struct HostRouteState final : RouteState {
  explicit HostRouteState(Routing routing);
  // RouteState's fields and `unreorder` from r (after r changes: route_group).
  void refresh();
  Routing r;
  std::vector<float> dgate;        // [tokens * k]; empty before moe_combine_backward
  std::vector<int32_t> unreorder;  // [received rows] the local group row of each (recv_index's inverse)
};

// recv_index's inverse (Backend::moe_unreorder's map): [received rows] the
// local group row holding each received row.
std::vector<int32_t> receive_inverse(const std::vector<int32_t>& recv_index);

}  // namespace fp4lab::train
