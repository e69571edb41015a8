// The BF16 gradient reduction (grad_reduce.hpp).
#include "train/dist/grad_reduce.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/error.hpp"
#include "train/dist/comm.hpp"

namespace fp4lab::train {

namespace {

// A float tensor holding `n` 16-bit codes (ceil(n / 2) floats; at least one, so that it has an address).
Tensor code_tensor(Backend& be, size_t n) { return be.empty(1, std::max<int64_t>(int64_t((n + 1) / 2), 1)); }

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
  // This rank's contribution, rounded once: the codes of the whole buffer, which lie in rank order of the
  // shards (contiguous, covering it), i.e. alltoallv's send layout as they are. Rounded to an even count of
  // codes, so that a device buffer of floats can carry them.
  std::vector<float> h(n);
  be.download(full, h.data());
  std::vector<uint16_t> send(n + (n & 1)), recv(size_t(world) * k + ((size_t(world) * k) & 1));
  for (size_t i = 0; i < n; ++i) send[i] = uint16_t(encode_rn_f32<bfloat16>(h[i], Overflow::nonsaturate));
  std::vector<int64_t> send_counts(static_cast<size_t>(world)), recv_counts(static_cast<size_t>(world), int64_t(k));
  for (int r = 0; r < world; ++r) send_counts[size_t(r)] = shards[size_t(r)].end - shards[size_t(r)].begin;
  const size_t send_bytes = n * 2, recv_bytes = size_t(world) * k * 2;
  if (!comm.device_buffers()) {
    comm.alltoallv(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(send.data()), send_bytes), send_counts,
                   std::span<uint8_t>(reinterpret_cast<uint8_t*>(recv.data()), recv_bytes), recv_counts, 2);
  } else {  // NCCL: the codes through device buffers (the backend's float copies move bytes unchanged)
    Tensor ds = code_tensor(be, send.size()), dr = code_tensor(be, recv.size());
    if (n > 0) {
      Tensor s = view_of(ds.data, 1, int64_t(send.size() / 2));
      be.upload(reinterpret_cast<const float*>(send.data()), s);
    }
    be.synchronize();
    comm.alltoallv(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(ds.data), send_bytes), send_counts,
                   std::span<uint8_t>(reinterpret_cast<uint8_t*>(dr.data), recv_bytes), recv_counts, 2);
    if (!recv.empty()) be.download(view_of(dr.data, 1, int64_t(recv.size() / 2)), reinterpret_cast<float*>(recv.data()));
  }
  // Rank r's codes of this shard at [r k, (r + 1) k): summed in FP32 in rank order, from rank 0's value.
  std::vector<float> sum(k);
  for (size_t i = 0; i < k; ++i) {
    float s = bits_float(uint32_t(recv[i]) << 16);
    for (int r = 1; r < world; ++r) s += bits_float(uint32_t(recv[size_t(r) * k + i]) << 16);
    sum[i] = s;
  }
  if (k > 0) be.upload(sum.data(), mine);
}

}  // namespace fp4lab::train
