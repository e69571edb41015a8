// NVFP4 primary weights over a communicator (primary_weights.hpp).
#include "train/dist/primary_weights.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace fp4lab {

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
  if (w.size() < 9) throw Error("cast_primary_weights: a rank sent a malformed shard (" + std::to_string(w.size()) + " bytes)");
  std::memcpy(&s.first_byte, w.data(), 8);
  s.bytes.assign(w.begin() + 8, w.end());
  return s;
}

}  // namespace

Nvfp4Weights cast_primary_weights(Communicator& comm, std::span<const FlatTensor> tensors, const float* flat,
                                  ShardRange mine, bool shard_cast) {
  Nvfp4Weights w;
  if (!shard_cast) {
    int64_t end = 0;
    for (const FlatTensor& t : tensors) end = std::max(end, t.offset + t.rows * t.cols);
    const ShardRange all{0, end};
    w.scales = shard_scales(tensors, shard_partial_amax(tensors, flat, all));
    const ShardBytes b = fp4lab::shard_cast(tensors, flat, all, w.scales);
    w.packed = assemble_packed(tensors, std::span<const ShardBytes>(&b, 1));
    return w;
  }
  ShardAmax a = shard_partial_amax(tensors, flat, mine);
  comm.allreduce_max(a.tensor);  // the two MAX all-reduces: identical scales everywhere
  comm.allreduce_max(a.tile);
  w.scales = shard_scales(tensors, a);
  w.packed = gather_packed(comm, tensors, fp4lab::shard_cast(tensors, flat, mine, w.scales));
  return w;
}

std::vector<uint8_t> gather_packed(Communicator& comm, std::span<const FlatTensor> tensors, const ShardBytes& mine) {
  const std::vector<std::vector<uint8_t>> all = comm.allgather_bytes(serialize(mine));
  std::vector<ShardBytes> parts;
  for (const auto& v : all) parts.push_back(deserialize(v));
  return assemble_packed(tensors, parts);
}

}  // namespace fp4lab
