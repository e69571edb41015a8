// The local and thread communicators (comm.hpp); MPI in comm_mpi.cpp.
#include "train/dist/comm.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "core/error.hpp"

namespace fp4lab {

namespace {

class LocalComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::string name() const override { return "local"; }
  void allreduce_max(std::span<uint32_t>) override {}
  void allreduce_sum(std::span<float>) override {}
  void allreduce_sum(std::span<double>) override {}
  void reduce_scatter_sum(std::span<const float> full, std::span<const ShardRange> shards,
                          std::span<float> mine) override {
    check_shard_set(full.size(), shards, 1, "local", "reduce_scatter_sum");
    std::copy(full.begin(), full.end(), mine.begin());
  }
  void allgather(std::span<const float> mine, std::span<const ShardRange> shards, std::span<float> full) override {
    check_shard_set(full.size(), shards, 1, "local", "allgather");
    if (mine.data() != full.data()) std::copy(mine.begin(), mine.end(), full.begin());
  }
  std::vector<std::vector<uint8_t>> allgather_bytes(std::span<const uint8_t> mine) override {
    return {std::vector<uint8_t>(mine.begin(), mine.end())};
  }
  void allgather_equal(std::span<const uint8_t> mine, std::span<uint8_t> all) override {
    check_allgather_equal(mine.size(), all.size(), 1, "local");
    if (!mine.empty() && mine.data() != all.data()) std::memmove(all.data(), mine.data(), mine.size());
  }
  void alltoallv(std::span<const uint8_t> send, std::span<const int64_t> send_counts, std::span<uint8_t> recv,
                 std::span<const int64_t> recv_counts, size_t unit_bytes) override {
    check_alltoallv(send.size(), send_counts, recv.size(), recv_counts, unit_bytes, 1, "local");
    if (send_counts[0] != recv_counts[0])
      throw Error("communicator (local): alltoallv: rank 0 sends " + std::to_string(send_counts[0]) +
                  " rows to itself but expects " + std::to_string(recv_counts[0]));
    if (!send.empty() && send.data() != recv.data()) std::memcpy(recv.data(), send.data(), send.size());
  }
  void barrier() override {}
};

// The meeting point of n thread ranks: each collective deposits every rank's
// contribution, the last to arrive combines them, everyone takes the result.
// A rank that waits longer than its timeout (for the others to arrive, or to
// take the previous round's result) gives the hub up: it throws, and every
// later or waiting call throws too (the world cannot be resumed).
class Hub {
 public:
  explicit Hub(int n) : n_(n), slots_(size_t(n)), here_(size_t(n), 0) {}

  // Rank r's bytes in; every rank's bytes (rank order) out. One round at a
  // time. Throws EnvironmentError through `comm` on a timeout.
  std::vector<std::vector<uint8_t>> exchange(const Communicator& comm, const char* what, std::vector<uint8_t> mine) {
    const int r = comm.rank();
    std::unique_lock<std::mutex> lk(m_);
    const auto deadline = std::chrono::steady_clock::now() + comm.timeout();
    // The previous round's results are taken by every rank.
    if (!cv_.wait_until(lk, deadline, [&] { return broken() || !draining_; })) give_up(comm, what);
    if (broken()) given_up(comm);
    slots_[size_t(r)] = std::move(mine);
    here_[size_t(r)] = 1;
    if (++arrived_ == n_) {
      result_ = slots_;
      draining_ = true;
      taken_ = 0;
      arrived_ = 0;
      std::fill(here_.begin(), here_.end(), char(0));
      cv_.notify_all();
    } else {
      const uint64_t round = round_;
      if (!cv_.wait_until(lk, deadline, [&] { return broken() || (draining_ && round == round_); }))
        give_up(comm, what);
      if (broken()) given_up(comm);
    }
    std::vector<std::vector<uint8_t>> out = result_;
    here_[size_t(r)] = 1;  // taken
    if (++taken_ == n_) {
      draining_ = false;
      taken_ = 0;
      std::fill(here_.begin(), here_.end(), char(0));
      ++round_;
      cv_.notify_all();
    }
    return out;
  }
  int size() const { return n_; }

 private:
  bool broken() const { return !broken_.empty(); }
  // Timed out: the ranks not yet here (arriving, or taking the last result) are silent.
  [[noreturn]] void give_up(const Communicator& comm, const char* what) {
    std::vector<int> silent;
    for (int k = 0; k < n_; ++k)
      if (!here_[size_t(k)] && k != comm.rank()) silent.push_back(k);
    broken_ = no_answer_message(comm.rank(), silent, comm.timeout(), what, comm.step());
    cv_.notify_all();
    throw EnvironmentError(broken_);
  }
  [[noreturn]] void given_up(const Communicator& comm) const {
    throw EnvironmentError("rank " + std::to_string(comm.rank()) +
                           ": the thread ranks' world was given up after a timeout (" + broken_ + ")");
  }

  const int n_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::vector<uint8_t>> slots_, result_;
  std::vector<char> here_;  // per rank: arrived (collecting) or took the result (draining)
  int arrived_ = 0, taken_ = 0;
  bool draining_ = false;
  uint64_t round_ = 0;
  std::string broken_;  // the timeout that gave the hub up; empty while it works
};

template <class T>
std::vector<uint8_t> to_bytes(std::span<const T> v) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  return std::vector<uint8_t>(p, p + v.size_bytes());
}

class ThreadComm final : public Communicator {
 public:
  ThreadComm(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return hub_->size(); }
  std::string name() const override { return "threads"; }
  void allreduce_max(std::span<uint32_t> v) override {
    const auto all = hub_->exchange(*this, "allreduce_max", to_bytes<uint32_t>(v));
    check_sizes(all, v.size_bytes(), "allreduce_max");
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t m = 0;
      for (const auto& b : all) m = std::max(m, reinterpret_cast<const uint32_t*>(b.data())[i]);
      v[i] = m;
    }
  }
  void allreduce_sum(std::span<float> v) override { sum_in_rank_order(v); }
  void allreduce_sum(std::span<double> v) override { sum_in_rank_order(v); }
  void reduce_scatter_sum(std::span<const float> full, std::span<const ShardRange> shards,
                          std::span<float> mine) override {
    check_shard_set(full.size(), shards, world(), "threads", "reduce_scatter_sum");
    const auto all = hub_->exchange(*this, "reduce_scatter_sum", to_bytes<float>(full));
    check_sizes(all, full.size_bytes(), "reduce_scatter_sum");
    const ShardRange s = shards[size_t(rank_)];
    for (int64_t i = s.begin; i < s.end; ++i) {
      float sum = 0.0f;
      for (const auto& b : all) sum += reinterpret_cast<const float*>(b.data())[i];  // rank order
      mine[size_t(i - s.begin)] = sum;
    }
  }
  void allgather(std::span<const float> mine, std::span<const ShardRange> shards, std::span<float> full) override {
    check_shard_set(full.size(), shards, world(), "threads", "allgather");
    const auto all = hub_->exchange(*this, "allgather", to_bytes<float>(mine));
    for (int r = 0; r < world(); ++r) {
      const ShardRange s = shards[size_t(r)];
      if (all[size_t(r)].size() != size_t(s.end - s.begin) * sizeof(float))
        throw Error("communicator (threads): allgather: rank " + std::to_string(r) +
                    " passed a buffer unlike its shard");
      std::memcpy(full.data() + s.begin, all[size_t(r)].data(), all[size_t(r)].size());
    }
  }
  std::vector<std::vector<uint8_t>> allgather_bytes(std::span<const uint8_t> mine) override {
    return hub_->exchange(*this, "allgather_bytes", std::vector<uint8_t>(mine.begin(), mine.end()));
  }
  void allgather_equal(std::span<const uint8_t> mine, std::span<uint8_t> all) override {
    check_allgather_equal(mine.size(), all.size(), world(), "threads");
    const auto parts = hub_->exchange(*this, "allgather_equal", std::vector<uint8_t>(mine.begin(), mine.end()));
    check_sizes(parts, mine.size(), "allgather_equal");
    for (size_t r = 0; r < parts.size(); ++r)
      if (!parts[r].empty()) std::memcpy(all.data() + r * mine.size(), parts[r].data(), mine.size());
  }
  // Each rank deposits its send counts and rows; each takes its part of every peer's (the hub hands every rank
  // every deposit, as allgather_bytes does: the thread engine is for tests and one host).
  void alltoallv(std::span<const uint8_t> send, std::span<const int64_t> send_counts, std::span<uint8_t> recv,
                 std::span<const int64_t> recv_counts, size_t unit_bytes) override {
    const int n = world();
    check_alltoallv(send.size(), send_counts, recv.size(), recv_counts, unit_bytes, n, "threads");
    std::vector<uint8_t> mine(size_t(n) * sizeof(int64_t) + send.size());
    std::memcpy(mine.data(), send_counts.data(), size_t(n) * sizeof(int64_t));
    if (!send.empty()) std::memcpy(mine.data() + size_t(n) * sizeof(int64_t), send.data(), send.size());
    const auto all = hub_->exchange(*this, "alltoallv", std::move(mine));
    size_t at = 0;
    for (int p = 0; p < n; ++p) {
      const auto& b = all[size_t(p)];
      std::vector<int64_t> theirs(static_cast<size_t>(n));
      std::memcpy(theirs.data(), b.data(), size_t(n) * sizeof(int64_t));
      if (theirs[size_t(rank_)] != recv_counts[size_t(p)])
        throw Error("communicator (threads): alltoallv: rank " + std::to_string(p) + " sends " +
                    std::to_string(theirs[size_t(rank_)]) + " rows to rank " + std::to_string(rank_) +
                    ", which expects " + std::to_string(recv_counts[size_t(p)]));
      int64_t before = 0;
      for (int q = 0; q < rank_; ++q) before += theirs[size_t(q)];
      const size_t bytes = size_t(theirs[size_t(rank_)]) * unit_bytes;
      if (bytes > 0)
        std::memcpy(recv.data() + at, b.data() + size_t(n) * sizeof(int64_t) + size_t(before) * unit_bytes, bytes);
      at += bytes;
    }
  }
  void barrier() override { hub_->exchange(*this, "barrier", {}); }

 private:
  template <class T>
  void sum_in_rank_order(std::span<T> v) {
    const auto all = hub_->exchange(*this, "allreduce_sum", to_bytes<T>(v));
    check_sizes(all, v.size_bytes(), "allreduce_sum");
    for (size_t i = 0; i < v.size(); ++i) {
      T s = 0;
      for (const auto& b : all) s += reinterpret_cast<const T*>(b.data())[i];  // rank order
      v[i] = s;
    }
  }
  static void check_sizes(const std::vector<std::vector<uint8_t>>& all, size_t bytes, const char* what) {
    for (const auto& b : all)
      if (b.size() != bytes)
        throw Error(std::string("communicator (threads): ") + what +
                    " called with different lengths on different ranks");
  }
  std::shared_ptr<Hub> hub_;
  int rank_;
};

}  // namespace

void check_allgather_equal(size_t mine, size_t all, int world, const std::string& engine) {
  if (all != mine * size_t(world))
    throw Error("communicator (" + engine + "): allgather_equal: a part of " + std::to_string(mine) +
                " bytes and a result buffer of " + std::to_string(all) + " bytes for " + std::to_string(world) +
                " ranks (valid: world x part)");
}

void check_alltoallv(size_t send_bytes, std::span<const int64_t> send_counts, size_t recv_bytes,
                     std::span<const int64_t> recv_counts, size_t unit_bytes, int world, const std::string& engine) {
  const std::string where = "communicator (" + engine + "): alltoallv: ";
  if (unit_bytes == 0) throw Error(where + "rows of 0 bytes");
  if (send_counts.size() != size_t(world) || recv_counts.size() != size_t(world))
    throw Error(where + std::to_string(send_counts.size()) + " send and " + std::to_string(recv_counts.size()) +
                " receive counts for " + std::to_string(world) + " ranks");
  int64_t sent = 0, received = 0;
  for (int p = 0; p < world; ++p) {
    if (send_counts[size_t(p)] < 0 || recv_counts[size_t(p)] < 0)
      throw Error(where + "a negative count for rank " + std::to_string(p));
    sent += send_counts[size_t(p)], received += recv_counts[size_t(p)];
  }
  if (size_t(sent) * unit_bytes != send_bytes || size_t(received) * unit_bytes != recv_bytes)
    throw Error(where + "the send buffer holds " + std::to_string(send_bytes) + " bytes for " + std::to_string(sent) +
                " rows and the receive buffer " + std::to_string(recv_bytes) + " for " + std::to_string(received) +
                " rows of " + std::to_string(unit_bytes) + " bytes");
}

namespace {
struct Finished final : PendingCollective {
  void wait() override {}
};
}  // namespace

std::unique_ptr<PendingCollective> Communicator::allgather_start(std::span<const float> mine,
                                                                 std::span<const ShardRange> shards,
                                                                 std::span<float> full) {
  allgather(mine, shards, full);
  return std::make_unique<Finished>();
}

std::unique_ptr<PendingCollective> Communicator::allgather_equal_start(std::span<const uint8_t> mine,
                                                                       std::span<uint8_t> all) {
  allgather_equal(mine, all);
  return std::make_unique<Finished>();
}

void Communicator::set_timeout(std::chrono::milliseconds t) {
  if (t.count() <= 0)
    throw Error("communicator: the collective timeout must be positive, got " + std::to_string(t.count()) + " ms");
  timeout_ = t;
}

void Communicator::throw_no_answer(const std::string& collective, const std::vector<int>& silent) const {
  throw EnvironmentError(no_answer_message(rank(), silent, timeout_, collective, step_));
}

std::string no_answer_message(int rank, const std::vector<int>& silent, std::chrono::milliseconds timeout,
                              const std::string& collective, int64_t step) {
  std::string who;
  for (size_t k = 0; k < silent.size(); ++k) who += (k ? ", " : "") + std::to_string(silent[k]);
  who = silent.empty() ? "the other rank(s)" : (silent.size() == 1 ? "rank " : "ranks ") + who;
  char t[32];
  std::snprintf(t, sizeof t, "%g", double(timeout.count()) / 1000.0);
  return "rank " + std::to_string(rank) + ": no answer from " + who + " within " + t + " s during " + collective +
         (step >= 0 ? " at step " + std::to_string(step) : " before the first step") +
         "; a rank stopped or died (distributed.timeout_s sets the wait)";
}

void check_shard_set(size_t n, std::span<const ShardRange> shards, int world, const std::string& engine,
                     const char* what) {
  bool ok =
      int(shards.size()) == world && !shards.empty() && shards.front().begin == 0 && shards.back().end == int64_t(n);
  for (size_t r = 0; ok && r < shards.size(); ++r)
    ok = shards[r].begin <= shards[r].end && (r == 0 || shards[r].begin == shards[r - 1].end);
  if (!ok)
    throw Error("communicator (" + engine + "): " + what + ": the shards must be " + std::to_string(world) +
                " contiguous ranges in rank order covering [0, " + std::to_string(n) + ")");
}

std::unique_ptr<Communicator> make_local_comm() { return std::make_unique<LocalComm>(); }

std::vector<std::unique_ptr<Communicator>> make_thread_comms(int n) {
  if (n < 1) throw Error("make_thread_comms: need at least one rank, got " + std::to_string(n));
  auto hub = std::make_shared<Hub>(n);
  std::vector<std::unique_ptr<Communicator>> v;
  for (int r = 0; r < n; ++r) v.push_back(std::make_unique<ThreadComm>(hub, r));
  return v;
}

}  // namespace fp4lab
