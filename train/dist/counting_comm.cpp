// Counting collectives (counting_comm.hpp).
#include "train/dist/counting_comm.hpp"

namespace fp4lab::train {

namespace {

// A ring all-reduce's bytes per rank: a reduce-scatter and an all-gather, (N-1)/N of the buffer each.
int64_t ring_allreduce(int64_t bytes, int world) { return world > 1 ? 2 * (world - 1) * bytes / world : 0; }

int64_t part_bytes(std::span<const ShardRange> shards, int rank) {
  const ShardRange& s = shards[size_t(rank)];
  return (s.end - s.begin) * int64_t(sizeof(float));
}

nlohmann::json to_json(const std::map<std::string, CollectiveCounts>& m) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, c] : m)
    j[name] = {{"calls", c.calls}, {"bytes_in", c.bytes_in}, {"bytes_out", c.bytes_out}, {"ring_bytes", c.ring_bytes}};
  return j;
}

}  // namespace

CountingComm::CountingComm(Communicator& inner) : inner_(inner) {
  set_timeout(inner.timeout());
  set_step(inner.step());
}

void CountingComm::count(const char* collective, int64_t in, int64_t out, int64_t ring) {
  inner_.set_step(step());
  inner_.set_timeout(timeout());
  CollectiveCounts& c = counts_[step()][collective];
  ++c.calls;
  c.bytes_in += in;
  c.bytes_out += out;
  c.ring_bytes += ring;
}

void CountingComm::allreduce_max(std::span<uint32_t> v) {
  const int64_t b = int64_t(v.size_bytes());
  count("allreduce_max", b, b, ring_allreduce(b, world()));
  inner_.allreduce_max(v);
}

void CountingComm::allreduce_sum(std::span<float> v) {
  const int64_t b = int64_t(v.size_bytes());
  count("allreduce_sum", b, b, ring_allreduce(b, world()));
  inner_.allreduce_sum(v);
}

void CountingComm::allreduce_sum(std::span<double> v) {
  const int64_t b = int64_t(v.size_bytes());
  count("allreduce_sum", b, b, ring_allreduce(b, world()));
  inner_.allreduce_sum(v);
}

void CountingComm::reduce_scatter_sum(std::span<const float> full, std::span<const ShardRange> shards,
                                      std::span<float> mine) {
  const int64_t b = int64_t(full.size_bytes()), own = world() > 1 ? part_bytes(shards, rank()) : b;
  count("reduce_scatter_sum", b, int64_t(mine.size_bytes()), b - own);
  inner_.reduce_scatter_sum(full, shards, mine);
}

void CountingComm::allgather(std::span<const float> mine, std::span<const ShardRange> shards, std::span<float> full) {
  const int64_t b = int64_t(full.size_bytes()), own = int64_t(mine.size_bytes());
  count("allgather", own, b, world() > 1 ? b - own : 0);
  inner_.allgather(mine, shards, full);
}

std::unique_ptr<PendingCollective> CountingComm::allgather_start(std::span<const float> mine,
                                                                 std::span<const ShardRange> shards,
                                                                 std::span<float> full) {
  const int64_t b = int64_t(full.size_bytes()), own = int64_t(mine.size_bytes());
  count("allgather", own, b, world() > 1 ? b - own : 0);
  return inner_.allgather_start(mine, shards, full);
}

std::vector<std::vector<uint8_t>> CountingComm::allgather_bytes(std::span<const uint8_t> mine) {
  inner_.set_step(step());
  inner_.set_timeout(timeout());
  std::vector<std::vector<uint8_t>> all = inner_.allgather_bytes(mine);  // the sizes are known after the call
  int64_t out = 0;
  for (const auto& v : all) out += int64_t(v.size());
  count("allgather_bytes", int64_t(mine.size()), out, out - int64_t(mine.size()));
  return all;
}

void CountingComm::allgather_equal(std::span<const uint8_t> mine, std::span<uint8_t> all) {
  const int64_t s = int64_t(mine.size());
  count("allgather_equal", s, int64_t(all.size()), s * (world() - 1));
  inner_.allgather_equal(mine, all);
}

std::unique_ptr<PendingCollective> CountingComm::allgather_equal_start(std::span<const uint8_t> mine,
                                                                       std::span<uint8_t> all) {
  const int64_t s = int64_t(mine.size());
  count("allgather_equal", s, int64_t(all.size()), s * (world() - 1));
  return inner_.allgather_equal_start(mine, all);
}

void CountingComm::alltoallv(std::span<const uint8_t> send, std::span<const int64_t> send_counts,
                             std::span<uint8_t> recv, std::span<const int64_t> recv_counts, size_t unit_bytes) {
  const int me = rank();
  const int64_t own = me < int64_t(send_counts.size()) ? send_counts[size_t(me)] * int64_t(unit_bytes) : 0;
  count("alltoallv", int64_t(send.size()), int64_t(recv.size()), int64_t(send.size()) - own);
  inner_.alltoallv(send, send_counts, recv, recv_counts, unit_bytes);
}

void CountingComm::barrier() {
  count("barrier", 0, 0, 0);
  inner_.barrier();
}

nlohmann::json CountingComm::summary() const {
  nlohmann::json j = nlohmann::json::object();
  if (counts_.empty()) return j;
  std::map<std::string, CollectiveCounts> total;
  for (const auto& [step, m] : counts_)
    for (const auto& [name, c] : m) {
      CollectiveCounts& t = total[name];
      t.calls += c.calls, t.bytes_in += c.bytes_in, t.bytes_out += c.bytes_out, t.ring_bytes += c.ring_bytes;
    }
  // The first training step (every step moves the same bytes); the start alone if no step was taken.
  auto first = counts_.lower_bound(0);
  if (first == counts_.end()) first = counts_.begin();
  j["step"] = first->first;
  j["per_step"] = to_json(first->second);
  j["total"] = to_json(total);
  return j;
}

}  // namespace fp4lab::train
