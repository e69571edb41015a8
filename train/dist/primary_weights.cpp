// NVFP4 primary weights over a communicator (primary_weights.hpp).
#include "train/dist/primary_weights.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace fp4lab::train {

namespace {

// Step 2: the amaxes MAX-reduced over the ranks, in the store's memory or through the host.
void reduce_amax(Communicator& comm, Backend& be, CastStore& store) {
  const std::span<uint32_t> a = store.amax();
  if (!store.device()) return comm.allreduce_max(a);
  if (comm.device_buffers()) return comm.allreduce_max(a);
  // A host communicator and a device store: through host memory (the backend copies bytes).
  Tensor t = view_of(reinterpret_cast<float*>(a.data()), 1, int64_t(a.size()));
  std::vector<uint32_t> h(a.size());
  be.download(t, reinterpret_cast<float*>(h.data()));
  comm.allreduce_max(h);
  be.upload(reinterpret_cast<const float*>(h.data()), t);
}

}  // namespace

WindowGather start_gather_windows(Communicator& comm, Backend& be, CastStore& store,
                                  std::span<const ShardRange> shards) {
  WindowGather g;
  g.w = store.windows(shards);
  const size_t me = size_t(comm.rank()), size = size_t(g.w.size), all_bytes = shards.size() * size;
  if (store.device() == comm.device_buffers()) {  // the windows stay in the store's memory
    const std::span<const uint8_t> mine = std::span<const uint8_t>(store.packed()).subspan(size_t(g.w.at[me]), size);
    std::span<uint8_t> all;
    if (store.device()) {
      g.device_all = be.empty(1, int64_t((all_bytes + 3) / 4));  // device bytes from the backend's pool
      all = std::span<uint8_t>(reinterpret_cast<uint8_t*>(g.device_all.data), all_bytes);
    } else {
      g.host_all.resize(all_bytes);
      all = g.host_all;
    }
    g.pending = comm.allgather_equal_start(mine, all);
    return g;
  }
  // A device store and a host communicator: the own span to the host, assembled there by the finish.
  g.through_host = true;
  const ShardBytes own = store.span();
  std::vector<uint8_t> window(size, 0);
  std::copy(own.bytes.begin(), own.bytes.end(), window.begin() + (own.first_byte - g.w.at[me]));
  g.host_all.resize(all_bytes);
  g.pending = comm.allgather_equal_start(window, g.host_all);
  g.pending->wait();  // a host engine: done already; `window` dies here
  return g;
}

void finish_gather_windows(CastStore& store, WindowGather& g) {
  g.pending->wait();
  if (g.through_host) {
    std::vector<uint8_t> full(store.packed().size(), 0);
    or_windows(full, g.host_all, g.w);
    return store.set_packed(full);
  }
  if (g.device_all.data) {
    const size_t all_bytes = size_t(g.w.at.size()) * size_t(g.w.size);
    return store.or_windows(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(g.device_all.data), all_bytes),
                            g.w);
  }
  store.or_windows(g.host_all, g.w);
}

void gather_windows(Communicator& comm, Backend& be, CastStore& store, std::span<const ShardRange> shards) {
  WindowGather g = start_gather_windows(comm, be, store, shards);
  finish_gather_windows(store, g);
}

void run_cast(Communicator& comm, Backend& be, CastStore& store, const float* flat, std::span<const ShardRange> shards,
              bool shard_cast) {
  if (comm.device_buffers() && !store.device())
    throw Error("shard cast: the " + comm.name() + " communicator needs a device cast store (the cuda backend)");
  if (shards.size() != size_t(comm.world()))
    throw Error("shard cast: " + std::to_string(shards.size()) + " shards for " + std::to_string(comm.world()) +
                " ranks");
  const bool gather = shard_cast && comm.world() > 1;
  ShardRange s = shards[size_t(comm.rank())];
  if (!shard_cast) {  // every tensor whole
    s = ShardRange{0, 0};
    for (const FlatTensor& t : store.tensors()) s.end = std::max(s.end, t.offset + t.rows * t.cols);
  }
  store.partial_amax(flat, s);
  if (gather && !store.amax().empty()) reduce_amax(comm, be, store);  // bf16 has no maxima
  store.compute_scales();
  store.cast(flat, s);
  if (gather) gather_windows(comm, be, store, shards);
}

std::vector<ShardRange> outside_tensors(ShardRange shard, std::span<const FlatTensor> tensors) {
  std::vector<ShardRange> out;
  int64_t at = shard.begin;
  for (const FlatTensor& t : tensors) {
    const int64_t b = std::max(at, t.offset), e = std::min(shard.end, t.offset + t.rows * t.cols);
    if (b >= e) continue;  // the tensor misses what is left of the shard
    if (at < b) out.push_back({at, b});
    at = e;
  }
  if (at < shard.end) out.push_back({at, shard.end});
  return out;
}

}  // namespace fp4lab::train
