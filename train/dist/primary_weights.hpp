// NVFP4 primary weights over a communicator: the protocol of
// sim/shard_cast.hpp with its two MAX all-reduces (tensor amaxes, tile
// amaxes) and one byte gather (each rank's span of packed bytes, ORed into
// the full buffer). Every rank ends with the same packed codes and scales,
// bit for bit those of quantize(nvfp4_2d, W) per tensor.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sim/shard_cast.hpp"
#include "train/dist/comm.hpp"

namespace fp4lab {

struct Nvfp4Weights {
  std::vector<uint8_t> packed;  // every tensor's packed rows, at flat_layout(...).packed_offset
  ShardScales scales;
};

// shard_cast true: rank r casts only `mine` (its ZeRO-1 shard of the flat
// FP32 master buffer `flat`; only that range needs to be current) and the
// rest comes from the other ranks. false: this rank casts every tensor from
// `flat` whole (the reference; no communication).
Nvfp4Weights cast_primary_weights(Communicator& comm, std::span<const FlatTensor> tensors, const float* flat,
                                  ShardRange mine, bool shard_cast = true);

// Step 5 over a communicator: every rank's span (`mine`: what shard_cast
// wrote) gathered (allgather_bytes, host memory) and ORed into the full
// packed buffer, identical on every rank.
std::vector<uint8_t> gather_packed(Communicator& comm, std::span<const FlatTensor> tensors, const ShardBytes& mine);

}  // namespace fp4lab
