// The CUDA backend's routing state (Backend::moe_route and the calls after it;
// train/route.hpp's RouteState): one batch's routing in device memory
// (nn::RouteDevice, train/cuda/moe_route.hpp), and expert parallelism's calls
// on it (Backend::moe_route_local ... moe_unreorder).
//
// Expert parallelism: the per-token routing runs on the device
// (nn::route_local: the same bits as moe_route's first part); the grouping on
// every rank's counts and the losses on every rank's block sums run on the
// host (route_group, route_losses: the reference itself), and their index
// arrays (pos, token, the receive map and its inverse) and summary words (the
// global counts the router's gradient reads, the losses, the dropped slots)
// are uploaded. The waits beyond moe_route's: the chosen experts' download at
// moe_route_finish (the counts' exchange waits anyway).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "train/backend.hpp"
#include "train/cuda/moe_route.hpp"
#include "train/route.hpp"

namespace fp4lab::train {

struct CudaRouteState final : RouteState {
  Tensor mem;  // the RouteDevice block (route_layout)
  cuda::nn::RouteDevice d;
  bool dgate_written = false;
  // Expert parallelism: the host grouping (route_group's Routing), a token array when the send layout has more
  // rows than the block's, and the receive map and its inverse on the device (int32; -1: a row of zeros).
  std::unique_ptr<Routing> host;
  Tensor token_mem, reorder, unreorder;
  int64_t received = 0;  // rows received from every rank (the inverse map's length)
  // The summary words (d.summary) as host figures; downloaded when first asked for, unless set.
  const RouteSummary& summary() const override;
  void set_summary(RouteSummary m);

 private:
  mutable bool summary_read_ = false;
};

// r as the CUDA backend's state (InternalError for another backend's).
CudaRouteState& device_route(const RouteState& r);

// Backend::moe_route_local: per token on the device, no grouping yet (`be` allocates).
std::unique_ptr<RouteState> expert_parallel_route_local(Backend& be, const RouteParams& p, const Tensor& logits);
// Backend::moe_route_counts / moe_route_partials: this rank's counts [E] and block sums [blocks, E + 1]
// (Routing::block_sums' layout), downloaded.
std::vector<int64_t> expert_parallel_counts(const RouteState& r);
std::vector<double> expert_parallel_partials(const RouteState& r);
// Backend::moe_route_finish: route_group and route_losses on the host, their arrays uploaded.
void expert_parallel_finish(Backend& be, RouteState& r, const ExpertShard& shard, std::vector<int64_t> count_all,
                            const std::vector<double>& block_sums_all, int64_t grad_tokens);
// Backend::moe_reorder / moe_unreorder: device row gathers by the receive map and its inverse.
void expert_parallel_reorder(const RouteState& r, const Tensor& received, Tensor& grouped);
void expert_parallel_unreorder(const RouteState& r, const Tensor& grouped, Tensor& back);

}  // namespace fp4lab::train
