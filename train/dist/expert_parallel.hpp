// Expert parallelism's transport (docs/log/2026-12-02-expert-parallel-plan.md
// sections 2-3): MoeMlp's ExpertExchange (train/moe.hpp) over a Communicator
// whose world is the expert-parallel group (R = world until the plan's step
// 9). Rows travel as bytes (Communicator::alltoallv: exact): FP32 rows, or
// the dispatch cast's compact rows (codes and scales, train/mx_rows.hpp); with a host
// communicator and the CUDA backend they are staged through host memory, as
// DataParallel stages its collectives.
#pragma once

#include "train/dist/comm.hpp"
#include "train/moe.hpp"

namespace fp4lab::train {

class CommExpertExchange final : public ExpertExchange {
 public:
  explicit CommExpertExchange(Communicator& comm) : comm_(comm) {}
  int ranks() const override { return comm_.world(); }
  int rank() const override { return comm_.rank(); }
  RouteTotals exchange_totals(std::span<const int64_t> counts, std::span<const double> block_sums) override;
  void exchange_rows(Backend& be, const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                     std::span<const int64_t> recv_rows) override;
  void exchange_bytes(Backend& be, const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                      std::span<const int64_t> recv_rows, int64_t row_bytes) override;

 private:
  void move(Backend& be, const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
            std::span<const int64_t> recv_rows, size_t unit);
  Communicator& comm_;
};

}  // namespace fp4lab::train
