// NVFP4 primary weights over a communicator (primary_weights.hpp).
#include "train/dist/primary_weights.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace fp4lab::train {

namespace {

// A rank's ShardBytes on the wire: first_byte (int64, little endian as the
// hosts are) then the bytes; an empty shard sends nothing.
std::vector<uint8_t> serialize(const ShardBytes& s) {
  if (s.bytes.empty()) return {};
  std::vector<uint8_t> w(8 + s.bytes.size());
  std::memcpy(w.data(), &s.first_byte, 8);
  std::memcpy(w.data() + 8, s.bytes.data(), s.bytes.size());
  return w;
}

ShardBytes deserialize(const std::vector<uint8_t>& w) {
  ShardBytes s;
  if (w.empty()) return s;
  if (w.size() < 9)
    throw Error("gather_packed: a rank sent a malformed shard (" + std::to_string(w.size()) + " bytes)");
  std::memcpy(&s.first_byte, w.data(), 8);
  s.bytes.assign(w.begin() + 8, w.end());
  return s;
}

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

void run_cast(Communicator& comm, Backend& be, CastStore& store, const float* flat, ShardRange mine, bool shard_cast) {
  if (comm.device_buffers() && !store.device())
    throw Error("NVFP4 cast: the " + comm.name() + " communicator needs a device cast store (the cuda backend)");
  const bool gather = shard_cast && comm.world() > 1;
  ShardRange s = mine;
  if (!shard_cast) {  // every tensor whole
    s = ShardRange{0, 0};
    for (const FlatTensor& t : store.tensors()) s.end = std::max(s.end, t.offset + t.rows * t.cols);
  }
  store.partial_amax(flat, s);
  if (gather) reduce_amax(comm, be, store);
  store.compute_scales();
  store.cast(flat, s);
  if (!gather) return;
  if (comm.device_buffers())  // NCCL: the ranks' packed buffers ORed in place on the device
    comm.allreduce_disjoint_or(store.packed());
  else  // a host communicator: the byte spans gathered and ORed on the host
    store.set_packed(gather_packed(comm, store.tensors(), store.span()));
}

std::vector<uint8_t> gather_packed(Communicator& comm, std::span<const FlatTensor> tensors, const ShardBytes& mine) {
  const std::vector<std::vector<uint8_t>> all = comm.allgather_bytes(serialize(mine));
  std::vector<ShardBytes> parts;
  for (const auto& v : all) parts.push_back(deserialize(v));
  return assemble_packed(tensors, parts);
}

}  // namespace fp4lab::train
