// A Communicator that counts what passes through it (issue 46, plan step S0):
// a decorator over any communicator (local, threads, MPI, NCCL) that
// forwards every call unchanged and records, per collective and per training
// step (Communicator::step, which DataParallel sets), the calls, this rank's
// payload bytes in and out, and the ring-equivalent bytes this rank puts on
// the wire. The counts depend on the buffers' shapes only, so thread ranks on
// one machine give what N GPUs would move.
//
// Per call, with S the collective's full buffer in bytes, s_r rank r's part
// and N the world (N = 1: nothing travels, ring bytes 0):
//   allreduce_sum / allreduce_max  in S, out S, ring 2 (N-1)/N S
//   reduce_scatter_sum  in S, out s_me, ring (S - s_me)  (a ring passes every part but its own once)
//   allgather           in s_me, out S, ring (S - s_me)
//   allgather_bytes     in s_me, out sum s_r, ring sum_{r != me} s_r
//   allgather_equal     in s, out N s, ring (N-1) s
//   alltoallv           in sent, out received, ring what it sends to other ranks
//   barrier             a call, no bytes
// (ring: the bytes this rank sends in a ring algorithm; integer division.)
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "train/dist/comm.hpp"

namespace fp4lab::train {

struct CollectiveCounts {
  int64_t calls = 0, bytes_in = 0, bytes_out = 0, ring_bytes = 0;
  bool operator==(const CollectiveCounts&) const = default;
};

class CountingComm final : public Communicator {
 public:
  // `inner` must outlive this object.
  explicit CountingComm(Communicator& inner);

  int rank() const override { return inner_.rank(); }
  int world() const override { return inner_.world(); }
  std::string name() const override { return inner_.name(); }
  bool device_buffers() const override { return inner_.device_buffers(); }
  void allreduce_max(std::span<uint32_t> v) override;
  void allreduce_sum(std::span<float> v) override;
  void allreduce_sum(std::span<double> v) override;

  void reduce_scatter_sum(std::span<const float> full, std::span<const ShardRange> shards,
                          std::span<float> mine) override;
  void allgather(std::span<const float> mine, std::span<const ShardRange> shards, std::span<float> full) override;
  std::vector<std::vector<uint8_t>> allgather_bytes(std::span<const uint8_t> mine) override;
  void allgather_equal(std::span<const uint8_t> mine, std::span<uint8_t> all) override;
  // The start forms count as their blocking forms (under the same names) and start the inner one's.
  std::unique_ptr<PendingCollective> allgather_start(std::span<const float> mine, std::span<const ShardRange> shards,
                                                     std::span<float> full) override;
  std::unique_ptr<PendingCollective> allgather_equal_start(std::span<const uint8_t> mine,
                                                           std::span<uint8_t> all) override;
  void alltoallv(std::span<const uint8_t> send, std::span<const int64_t> send_counts, std::span<uint8_t> recv,
                 std::span<const int64_t> recv_counts, size_t unit_bytes) override;
  void barrier() override;

  // step -> collective -> counts (step -1: before the first step, e.g. the start's agreement and cast).
  const std::map<int64_t, std::map<std::string, CollectiveCounts>>& counts() const { return counts_; }
  // summary.json's distributed.collectives: {"per_step": the first training step's counts by collective
  // ({calls, bytes_in, bytes_out, ring_bytes}; every step moves the same, and a step that also
  // checkpoints adds the state gathers), "step": that step (-1: none was taken), "total": the sums over
  // the run (the start's agreement and first cast included)}. Empty when nothing was counted.
  nlohmann::json summary() const;

 private:
  // Counts one call at the current step, and hands the inner communicator this one's step and timeout.
  void count(const char* collective, int64_t in, int64_t out, int64_t ring);
  Communicator& inner_;
  std::map<int64_t, std::map<std::string, CollectiveCounts>> counts_;
};

}  // namespace fp4lab::train
