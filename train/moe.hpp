// The mixture-of-experts MLP of the MoE GPT (model.hpp MoeConfig; docs/DESIGN.md
// "Mixture of experts"):
//   router    logits = x R^T (R [E, C], no bias; plain FP32 unless
//             quantize_router), probabilities p = softmax(logits) per token
//   top-k     the k largest probabilities of each token (ties: the lower
//             expert index first); gates g_j = p_j / sum of the k (normalised)
//             or p_j
//   dispatch  dropless: slot (t, j) goes to row pos(t, j) of a [N k, C] tensor
//             grouped by expert (expert e's tokens in token order at rows
//             [offset_e, offset_e + n_e); n_e may be 0); capacity: expert e's
//             first `capacity` slots at rows [e capacity, ...), the rest of its
//             rows zeros, its further slots dropped (they add nothing to y_t)
//   experts   each a GPT MLP: c_fc [H, C], exact GELU, c_proj [C, H], every one
//             a linear layer of the recipe with its own id (so its own
//             stochastic-rounding streams): quantizing an expert's operands is
//             quantizing its group alone (sim/grouped.hpp's semantics)
//   combine   y_t = sum_j g_j * expert_out(pos(t, j)), in slot order
//             (Backend::combine_rows), plus the shared expert's output if any
//   losses    load balancing alpha E sum_e f_e P_e (f_e = n_e / (N k), P_e the
//             mean probability of e) and router z-loss beta mean_t lse_t^2,
//             both added to the gradient (times the step's loss scale), not to
//             the reported loss (the task's cross-entropy)
// Routing runs in the backend's memory through Backend::moe_route and the
// calls after it (train/route.hpp): on the host by default, on the GPU in the
// CUDA backend, with the same bits on the same logits (route() in float64).
// Expert parallelism (docs/log/2026-12-02-expert-parallel-plan.md section 3):
// with an ExpertExchange, rank r of R holds experts [r E/R, (r + 1) E/R) and
// computes its share of the tokens; the slots travel to their experts' owners
// and back (dispatch and combine), and every expert's group is one process's
// on the concatenated shares (rows, order, capacity drops), so the experts'
// outputs and gradients are one process's bit for bit.
// Dispatch cast (MoeConfig::dispatch_cast mxfp8; torchao's MXFP8 dispatch,
// torchao/prototype/moe_training/ep): the send layout's rows (the experts'
// inputs) are fake-quantized after the gather in the forward, and the rows of
// the combine's gradient (the experts' output gradients) before they travel
// in the backward, with the mxfp8 recipe's fwd_x quantizer (E4M3, [1, 32]
// along the width, E8M0 rounded up; Backend::fake_quantize); the backward
// treats the cast as the identity (straight through), and the gradients
// leaving the experts and the outputs coming back stay FP32. Under the mxfp8
// recipe it changes only the experts' weight gradients: their forward and
// dgrad operands quantize the cast rows again to the same values.
// Under expert parallelism the cast rows travel compact (torchao's MXFP8
// all-to-all, which sends the FP8 codes and E8M0 scales): each row as C E4M3
// codes plus ceil(C / 32) E8M0 codes (train/mx_rows.hpp), encoded by the
// sender (Backend::encode_rows_mx), sent by ExpertExchange::exchange_bytes and
// decoded by the owner (Backend::decode_rows_mx) to exactly the fake-quantized
// values, so the bits are those of the FP32 rows (set_compact_dispatch(false)
// keeps those, for the tests); the combine direction stays FP32.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/model.hpp"

namespace fp4lab::train {

// The model's linear layer calls (with its operand capture), which the MoE
// layer's linears go through; y (dx) is written in place when it already has
// the output's shape.
class LinearCalls {
 public:
  virtual ~LinearCalls() = default;
  virtual void forward(LinearLayer& l, const StepContext& s, const Tensor& x, Tensor& y) = 0;
  virtual void backward(LinearLayer& l, const StepContext& s, const Tensor& dy, Tensor& dx) = 0;
  // The experts: layer ls[g] on rows [offsets[g], offsets[g + 1]) of x (Backend::grouped_linear_forward;
  // each layer's plan, LinearLayer::lp, made for this pass). The grouped state is the caller's.
  virtual void grouped_forward(std::span<LinearLayer* const> ls, const StepContext& s, const Tensor& x,
                               std::span<const int64_t> offsets, Tensor& y, std::unique_ptr<LinearState>& state) = 0;
  virtual void grouped_backward(std::span<LinearLayer* const> ls, const StepContext& s, const LinearState& state,
                                const Tensor& dy, std::span<const int64_t> offsets, Tensor& dx) = 0;
};

// Expert parallelism's transport: collectives over the expert-parallel group
// (train/dist/expert_parallel.hpp implements it over a Communicator).
struct RouteTotals {
  std::vector<int64_t> count_all;      // [R, E] every rank's counts, in rank order
  std::vector<double> block_sums_all;  // every rank's block sums, in (rank, block) order
};
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int ranks() const = 0;
  virtual int rank() const = 0;
  // Every rank's routing counts [E] and block sums (route.hpp's Routing::block_sums).
  virtual RouteTotals exchange_totals(std::span<const int64_t> counts, std::span<const double> block_sums) = 0;
  // Rows [., C] of backend tensors: send_rows[p] rows of `send` (contiguous in rank order) to rank p; `recv`
  // receives recv_rows[p] rows from each rank p, in rank order (Communicator::alltoallv).
  virtual void exchange_rows(Backend& be, const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                             std::span<const int64_t> recv_rows) = 0;
  // The same for rows of row_bytes bytes in byte tensors of the backend (empty_bytes): the dispatch cast's
  // compact rows (train/mx_rows.hpp).
  virtual void exchange_bytes(Backend& be, const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                              std::span<const int64_t> recv_rows, int64_t row_bytes) = 0;
};

// route() and router_logit_grad() (train/route.hpp) under a MoeConfig.
inline Routing route(const MoeConfig& c, const float* logits, int64_t tokens) {
  return route(c.route_params(), logits, tokens);
}
inline std::vector<float> router_logit_grad(const MoeConfig& c, const Routing& r, const float* dgate,
                                            float loss_scale) {
  return router_logit_grad(c.route_params(), r, dgate, loss_scale);
}

class MoeMlp {
 public:
  // Declares the parameters and linear layers of layer `layer` ("h.<i>.mlp."
  // names) in ps / infos, ids from next_id: every expert, each placed with
  // its owner among ps's expert-parallel ranks (set before), of which this
  // rank computes its own.
  MoeMlp(const MoeConfig& c, int64_t width, bool bias, const std::string& layer, float std, float proj_std,
         ParamStore& ps, uint64_t& next_id, std::vector<LinearLayerInfo>& infos);
  // Expert parallelism: the transport over ps's expert-parallel ranks (null:
  // one process, the default). global_grad: the auxiliary losses' gradients
  // over the group's tokens (one process's, as the layer tests compare)
  // instead of this rank's (data_parallel.hpp's share-mean convention).
  void set_expert_exchange(ExpertExchange* ep, bool global_grad = false);
  // The dispatch cast's transport under expert parallelism: compact (codes and scales, the default) or, with
  // false, the fake-quantized rows as FP32 (the same values: tests compare the two bit for bit).
  void set_compact_dispatch(bool on) { compact_dispatch_ = on; }
  // y [N, C] from x [N, C]: router_logits, forward_routed. What the backward reads is kept until the
  // backward has run, then released (a forward without a backward, StepContext::backward false, keeps none of
  // it); the routing stays until the next forward (routing(), route_state()).
  Tensor forward(Backend& be, LinearCalls& calls, const StepContext& s, const Tensor& x);
  // The router's logits [N, E] of x (plans the router).
  Tensor router_logits(Backend& be, LinearCalls& calls, const StepContext& s, const Tensor& x);
  // y from x and its router logits (tests may inject logits: the contract C1 on GPUs).
  Tensor forward_routed(Backend& be, LinearCalls& calls, const StepContext& s, const Tensor& x, const Tensor& logits);
  // dx [N, C] from dy [N, C]; parameter gradients accumulated.
  Tensor backward(Backend& be, LinearCalls& calls, const StepContext& s, const Tensor& dy);
  // The last forward's routing figures (empty before the first forward).
  const RouteSummary& routing() const;
  // The last forward's routing state (null before the first forward): Backend::moe_download's argument.
  const RouteState* route_state() const { return route_.get(); }

 private:
  StepContext router_context(const StepContext& s) const;
  // Releases what the forward saved for the backward (the tensors and the layers' states below), not the routing.
  void drop_saved();
  void route(Backend& be, const Tensor& logits);
  // Rows between the send layout and this rank's experts' groups (identities in one process), dispatch under
  // the dispatch cast if any (send fake-quantized in place unless the rows travel compact).
  Tensor dispatch(Backend& be, Tensor& send);
  Tensor combine(Backend& be, const Tensor& grouped);
  // The compact transport: send's rows encoded, exchanged as bytes, decoded into received.
  void exchange_compact(Backend& be, const Tensor& send, Tensor& received);
  MoeConfig c_;
  std::optional<QuantizerSpec> dispatch_cast_;  // c_.dispatch_cast's quantizer, if any
  const ParamStore* ps_ = nullptr;              // the constructor's: its storage plans the layers (LinearLayer::plan)
  int64_t width_ = 0, hidden_ = 0;
  ExpertShard shard_;
  ExpertExchange* ep_ = nullptr;
  bool global_grad_ = false;
  bool compact_dispatch_ = true;  // with ep_ and a dispatch cast of a compact form (mx_rows_supported)
  LinearLayer router_;
  std::vector<LinearLayer> fc_, proj_;
  std::vector<LinearLayer*> fc_ptrs_, proj_ptrs_;       // the experts' layers, for the grouped calls
  std::unique_ptr<LinearState> fc_state_, proj_state_;  // the experts' grouped states (forward -> backward)
  std::unique_ptr<LinearLayer> shared_fc_, shared_proj_;
  std::unique_ptr<RouteState> route_;  // the last forward's routing (forward -> backward)
  Tensor x_, grouped_, h_, g_, out_e_, combined_, sh_h_, sh_g_;
};

// metrics.jsonl figures of the layers' last routings: {"moe_aux_loss",
// "moe_z_loss" (sums over layers), "expert_load" ([layer][expert] f_e),
// "max_load" (the largest E f_e over layers: 1 = balanced), and under
// capacity dispatch "moe_dropped" (the layers' dropped slots over their slots)}.
nlohmann::json routing_metrics(const std::vector<const RouteSummary*>& layers);

}  // namespace fp4lab::train
