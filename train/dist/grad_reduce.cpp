// The BF16 gradient reduction (grad_reduce.hpp).
#include "train/dist/grad_reduce.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "train/dist/comm.hpp"

namespace fp4lab::train {

namespace {

// A byte tensor of be's memory holding `n` 16-bit codes (at least one float, so that it has an address).
Tensor code_tensor(Backend& be, size_t n) { return empty_bytes(be, std::max<int64_t>(int64_t(2 * n), 4)); }

}  // namespace

void reduce_scatter_bf16(Communicator& comm, Backend& be, const Tensor& full, std::span<const ShardRange> shards,
                         Tensor& mine) {
  const int world = comm.world(), me = comm.rank();
  check_shard_set(size_t(full.size()), shards, world, comm.name(), "reduce_scatter_bf16");
  const ShardRange own = shards[size_t(me)];
  const size_t n = size_t(full.size()), k = size_t(own.end - own.begin);
  if (size_t(mine.size()) != k)
    throw Error("reduce_scatter_bf16: " + std::to_string(mine.size()) + " elements for a shard of " +
                std::to_string(k));
  // This rank's contribution, rounded once by the backend: the codes of the whole buffer, which lie in rank
  // order of the shards (contiguous, covering it), i.e. alltoallv's send layout as they are.
  Tensor send = code_tensor(be, n), recv = code_tensor(be, size_t(world) * k);
  be.round_bf16_codes(full, send);
  std::vector<int64_t> send_counts(static_cast<size_t>(world)), recv_counts(static_cast<size_t>(world), int64_t(k));
  for (int r = 0; r < world; ++r) send_counts[size_t(r)] = shards[size_t(r)].end - shards[size_t(r)].begin;
  const size_t send_bytes = n * 2, recv_bytes = size_t(world) * k * 2;
  // The codes move in the backend's memory where the communicator takes it (the cpu backend's host memory with
  // threads or MPI; the device's with NCCL, whose stream waits for the rounding); the cuda backend with a host
  // communicator stages them, and only them, through host memory.
  if (be.host_tensors() || comm.device_buffers()) {
    comm.alltoallv(std::span<const uint8_t>(byte_data(send), send_bytes), send_counts,
                   std::span<uint8_t>(byte_data(recv), recv_bytes), recv_counts, 2);
  } else {
    std::vector<float> hs(size_t(send.size())), hr(size_t(recv.size()));
    be.download(send, hs.data());
    comm.alltoallv(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(hs.data()), send_bytes), send_counts,
                   std::span<uint8_t>(reinterpret_cast<uint8_t*>(hr.data()), recv_bytes), recv_counts, 2);
    be.upload(hr.data(), recv);
  }
  // Rank r's codes of this shard at [r k, (r + 1) k): summed by the backend in FP32 in rank order.
  be.sum_bf16_codes(recv, world, mine);
}

}  // namespace fp4lab::train
