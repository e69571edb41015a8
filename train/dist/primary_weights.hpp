// NVFP4 primary weights over a communicator: the protocol of
// sim/shard_cast.hpp driven over a CastStore (train/param_storage.hpp: the
// backend's memory), with one MAX all-reduce (the tensor and tile amaxes in
// one array) and one byte gather (each rank's span of packed bytes, ORed
// into the full buffer). Every rank ends with the same packed codes and
// scales, bit for bit those of quantize(nvfp4_2d, W) per tensor.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sim/shard_cast.hpp"
#include "train/backend.hpp"
#include "train/dist/comm.hpp"
#include "train/param_storage.hpp"

namespace fp4lab::train {

// Steps 1-5 of the protocol on `store` from the flat FP32 buffer `flat` (the
// store's memory). shard_cast true: this rank casts only `mine` (its ZeRO-1
// shard; only that range of `flat` needs to be current) and the rest comes
// from the other ranks: the amaxes MAX-reduced, the packed spans ORed in
// place on the device (a device communicator, NCCL) or gathered through the
// host (gather_packed); a device store with a host communicator stages the
// amaxes through host memory with `be`. shard_cast false: this rank casts
// every tensor whole (the reference; no communication). Step 6, the
// dequantized values, is the caller's (CastStore::dequantize).
void run_cast(Communicator& comm, Backend& be, CastStore& store, const float* flat, ShardRange mine, bool shard_cast);

// Step 5 over a communicator: every rank's span (`mine`: what its cast
// wrote) gathered (allgather_bytes, host memory) and ORed into the full
// packed buffer, identical on every rank.
std::vector<uint8_t> gather_packed(Communicator& comm, std::span<const FlatTensor> tensors, const ShardBytes& mine);

}  // namespace fp4lab::train
