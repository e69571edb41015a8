// Collectives of data-parallel training (issue 30): one interface, with the
// engines behind it: a single process (`local`), in-process ranks on threads
// (`threads`: tests, and one host without MPI), and MPI (`mpi`, OpenMPI;
// built when CMake finds MPI: FP4LAB_WITH_MPI). NCCL for the CUDA backend
// is comm_nccl.hpp's.
//
// Every collective is called by every rank of the communicator, in the same
// order (as MPI requires). Results are identical on every rank.
//
// No collective waits forever (issue 42): each engine gives up after
// timeout() without every rank's part and throws EnvironmentError
// (no_answer_message: which rank(s) did not answer, where it waited, the
// training step). A world that timed out is not used again: its next
// collectives throw at once, and an MPI world ends the job at exit
// (MPI_Abort) instead of finalising with a rank missing.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sim/shard_cast.hpp"

namespace fp4lab {

// A collective started and not yet finished (Communicator::allgather_start, allgather_equal_start). wait()
// returns once its results may be read and its input buffers reused: the host engines (local, threads, MPI)
// finish in the start itself; NCCL queues the collective on its stream and wait() polls its completion up to
// the collective's timeout (then aborts, as a blocking collective does). Destroying one that was not waited
// for waits (and swallows a failure, which the next collective reports).
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual std::string name() const = 0;
  // In place: the element-wise maximum over the ranks (unsigned: the max of
  // amax bit patterns is the max magnitude, NaN dominating).
  virtual void allreduce_max(std::span<uint32_t> v) = 0;
  // In place: the element-wise sum over the ranks. `threads` sums in rank
  // order; MPI in its reduction's order, fixed for a given world size, so two
  // runs with the same ranks agree bitwise.
  virtual void allreduce_sum(std::span<float> v) = 0;
  virtual void allreduce_sum(std::span<double> v) = 0;
  // ZeRO-1's gradient reduction: the sum over the ranks of `full` (the same
  // length on every rank), of which rank r receives the elements shards[r]
  // into `mine` (length shards[r].end - shards[r].begin). `shards` is the same
  // on every rank: contiguous, in rank order, covering [0, full.size()); any
  // sizes (empty, odd). Summed in the same order as allreduce_sum's (threads:
  // rank order), fixed for a given world size.
  virtual void reduce_scatter_sum(std::span<const float> full, std::span<const ShardRange> shards,
                                  std::span<float> mine) = 0;
  // ZeRO-1's weight gather: every rank's `mine` (its shards[r]) placed at
  // shards[r] of `full` on every rank. `full`'s own shard may alias `mine`.
  virtual void allgather(std::span<const float> mine, std::span<const ShardRange> shards, std::span<float> full) = 0;
  // The two gathers in a form that returns before the collective has finished (ZeRO-3's prefetch of the
  // next unit, train/dist/sharded_params.hpp): the same collective, in the same place of the rank's
  // sequence of collectives (every rank starts it where every other rank does, and the engine runs the
  // collectives in that order); `full` / `all` may be read, and `mine` changed, only after the returned
  // object's wait(). The default runs the blocking call (done on return): the host engines.
  virtual std::unique_ptr<PendingCollective> allgather_start(std::span<const float> mine,
                                                             std::span<const ShardRange> shards,
                                                             std::span<float> full);
  virtual std::unique_ptr<PendingCollective> allgather_equal_start(std::span<const uint8_t> mine,
                                                                   std::span<uint8_t> all);
  // Where the float collectives' buffers live: host memory (local, threads,
  // MPI) or the current CUDA device's memory (NCCL).
  virtual bool device_buffers() const { return false; }
  // Every rank's bytes (any sizes, empty included), in rank order, on every rank.
  virtual std::vector<std::vector<uint8_t>> allgather_bytes(std::span<const uint8_t> mine) = 0;
  // Every rank's `mine` (the same size on every rank) at [r size, (r + 1) size)
  // of `all` (world() times the size), on every rank: one all-gather of equal
  // parts (ncclAllGather, MPI_Iallgather). The NVFP4 cast's packed windows
  // (train/dist/primary_weights.hpp). Buffers follow device_buffers(); `mine`
  // may alias the own part of `all`.
  virtual void allgather_equal(std::span<const uint8_t> mine, std::span<uint8_t> all) = 0;
  // All-to-all of rows of unit_bytes bytes (expert parallelism's dispatch and
  // combine; docs/log/2026-12-02-expert-parallel-plan.md): `send` holds the
  // parts for ranks 0, 1, ... contiguous in rank order, send_counts[p] rows for
  // rank p; `recv` receives every rank's part for this rank, contiguous in rank
  // order, recv_counts[p] rows from rank p, which must equal rank p's
  // send_counts[this rank]. Any counts, 0 included; the own part is copied.
  // Bytes travel unchanged (exact). send / recv hold exactly the counts' rows.
  // Buffers follow device_buffers(). Throws fp4lab::Error naming the counts
  // that disagree (threads, local; MPI and NCCL cannot see the peer's counts:
  // their transfer then fails or times out).
  virtual void alltoallv(std::span<const uint8_t> send, std::span<const int64_t> send_counts, std::span<uint8_t> recv,
                         std::span<const int64_t> recv_counts, size_t unit_bytes) = 0;
  virtual void barrier() = 0;

  // How long one collective waits for the other ranks (config
  // distributed.timeout_s; kDefaultCollectiveTimeout until set). Positive.
  void set_timeout(std::chrono::milliseconds t);
  std::chrono::milliseconds timeout() const { return timeout_; }
  // The training step the collectives belong to, for the timeout's message
  // (-1: none, before the first step); DataParallel sets it every step.
  void set_step(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }

  static constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{600'000};

 protected:
  // Throws EnvironmentError(no_answer_message(...)) for this rank, timeout and step.
  [[noreturn]] void throw_no_answer(const std::string& collective, const std::vector<int>& silent) const;

 private:
  std::chrono::milliseconds timeout_ = kDefaultCollectiveTimeout;
  int64_t step_ = -1;
};

// "rank R: no answer from rank(s) X within T s during COLLECTIVE at step S; a
// rank stopped or died" (X: the ranks that did not arrive, "the other ranks"
// where the engine cannot tell; "before the first step" for step -1).
std::string no_answer_message(int rank, const std::vector<int>& silent, std::chrono::milliseconds timeout,
                              const std::string& collective, int64_t step);

// The shard sets of reduce_scatter_sum / allgather: `world` contiguous ranges
// in rank order covering [0, n). Throws fp4lab::Error "communicator (<engine>):
// <what>: ..." otherwise.
void check_shard_set(size_t n, std::span<const ShardRange> shards, int world, const std::string& engine,
                     const char* what);

// allgather_equal's sizes (all = world x mine); throws fp4lab::Error
// "communicator (<engine>): allgather_equal: ..." otherwise.
void check_allgather_equal(size_t mine, size_t all, int world, const std::string& engine);

// alltoallv's arguments against the world and the buffers' sizes; throws
// fp4lab::Error "communicator (<engine>): alltoallv: ..." otherwise.
void check_alltoallv(size_t send_bytes, std::span<const int64_t> send_counts, size_t recv_bytes,
                     std::span<const int64_t> recv_counts, size_t unit_bytes, int world, const std::string& engine);

// World of one: every collective is the identity.
std::unique_ptr<Communicator> make_local_comm();
// n in-process ranks that meet through a shared hub; rank k's communicator
// is element k. Each must be used from its own thread.
std::vector<std::unique_ptr<Communicator>> make_thread_comms(int n);
// MPI_COMM_WORLD (MPI initialised on first use, finalised at exit); throws
// fp4lab::Error when this build has no MPI.
std::unique_ptr<Communicator> make_mpi_comm();
bool have_mpi();

}  // namespace fp4lab
