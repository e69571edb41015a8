// NVFP4 primary weights over a communicator: the protocol of
// sim/shard_cast.hpp driven over a CastStore (train/param_storage.hpp: the
// backend's memory), with one MAX all-reduce (the tensor and tile amaxes in
// one array) and one all-gather of equal byte windows (each rank's span of
// packed bytes, ORed into the full buffer). Every rank ends with the same packed codes and
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
// store's memory). `shards`: every rank's (rank order; ZeRO-1's even shards).
// shard_cast true: this rank casts only its shard (only that range of `flat`
// needs to be current) and the rest comes from the other ranks: the amaxes
// MAX-reduced, then every rank's window of packed codes (sim's
// packed_windows: its span padded to the longest) gathered in one
// allgather_equal and ORed in, in the store's memory (host store and host
// communicator; device store and NCCL), or through the host (device store,
// host communicator: set_packed). shard_cast false: this rank casts every
// tensor whole (the reference; no communication). Step 6, the dequantized
// values, is the caller's (CastStore::dequantize).
void run_cast(Communicator& comm, Backend& be, CastStore& store, const float* flat, std::span<const ShardRange> shards,
              bool shard_cast);

// Step 5 alone: every rank's window of `store`'s packed codes (sim's
// packed_windows over `shards`) gathered in one allgather_equal and ORed into
// the store's packed(), as run_cast does after its cast. ZeRO-3 calls it when
// a unit is gathered (train/dist/sharded_params.hpp); ORing again into an
// assembled buffer gives it back unchanged, so a unit may be gathered twice.
void gather_windows(Communicator& comm, Backend& be, CastStore& store, std::span<const ShardRange> shards);

// gather_windows in two halves, for a gather started before its result is needed (ZeRO-3's prefetch):
// start_gather_windows sends this rank's window (the collective started: Communicator::allgather_equal_start),
// finish_gather_windows waits for it and ORs every window into the store's packed(). The store's packed() is
// not to be changed in between. gather_windows is the two back to back.
struct WindowGather {
  PackedWindows w;
  Tensor device_all;              // every rank's window, in the backend's memory (store and communicator alike)
  std::vector<uint8_t> host_all;  // or in host memory
  bool through_host = false;      // a device store and a host communicator: assembled on the host, set_packed
  std::unique_ptr<PendingCollective> pending;
};
WindowGather start_gather_windows(Communicator& comm, Backend& be, CastStore& store,
                                  std::span<const ShardRange> shards);
void finish_gather_windows(CastStore& store, WindowGather& g);

// The parts of `shard` outside every one of `tensors` (sorted by offset,
// disjoint), in order: the elements ZeRO-1's all-gather still moves as FP32
// when the tensors travel as packed codes (run_cast).
std::vector<ShardRange> outside_tensors(ShardRange shard, std::span<const FlatTensor> tensors);

}  // namespace fp4lab::train
