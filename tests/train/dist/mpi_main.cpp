// test_dist_mpi: run as `mpirun -np 2 test_dist_mpi`. The MPI communicator's
// collectives on real ranks, and the NVFP4 primary-weight cast with shard
// boundaries at offsets 0, 1, 15, 16, 17, 33 and odd lengths: every rank's
// result must equal quantize(nvfp4_2d, W) of each tensor (computed on each
// rank alone). Prints one line per failure; exit 0 when all pass.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "sim/packing.hpp"
#include "sim/quantizer.hpp"
#include "train/dist/comm.hpp"
#include "train/dist/primary_weights.hpp"

using namespace fp4lab;

int main() {
  auto comm = make_mpi_comm();
  const int r = comm->rank(), n = comm->world();
  int failures = 0;
  auto fail = [&](const char* what) {
    std::printf("rank %d of %d: FAIL %s\n", r, n, what);
    ++failures;
  };
  std::vector<uint32_t> m = {uint32_t(10 + r), 0x7FC00000u * (r == n - 1)};
  comm->allreduce_max(m);
  if (m[0] != uint32_t(10 + n - 1) || m[1] != 0x7FC00000u) fail("allreduce_max");
  std::vector<float> s = {1.0f + float(r), 0.25f};
  comm->allreduce_sum(s);
  if (s[0] != float(n * (n + 1) / 2) || s[1] != 0.25f * float(n)) fail("allreduce_sum");
  const auto g = comm->allgather_bytes(std::vector<uint8_t>(size_t(r + 1), uint8_t(r)));
  for (int k = 0; k < n; ++k)
    if (g.size() != size_t(n) || g[size_t(k)] != std::vector<uint8_t>(size_t(k + 1), uint8_t(k)))
      fail("allgather_bytes");

  {  // allgather_equal: rank k's 9 bytes k * 31 + i, at [9k, 9k + 9); then in place
    std::vector<uint8_t> mine(9), all(size_t(9 * n), 0xEE), want;
    for (int k = 0; k < n; ++k)
      for (int i = 0; i < 9; ++i) want.push_back(uint8_t(k * 31 + i));
    for (int i = 0; i < 9; ++i) mine[size_t(i)] = uint8_t(r * 31 + i);
    comm->allgather_equal(mine, all);
    if (all != want) fail("allgather_equal");
    std::fill(all.begin(), all.end(), uint8_t(0xEE));
    std::copy(mine.begin(), mine.end(), all.begin() + 9 * r);
    comm->allgather_equal(std::span<const uint8_t>(all).subspan(size_t(9 * r), 9), all);
    if (all != want) fail("allgather_equal in place");
  }
  // alltoallv: rank k sends (k + 2p) % 3 rows of 5 bytes to rank p (zeros included), bytes a function of (k, p, i, b).
  {
    auto count = [](int k, int p) { return int64_t((k + 2 * p) % 3); };
    auto byte = [](int k, int p, int64_t i, int b) { return uint8_t(k * 41 + p * 13 + i * 5 + b); };
    std::vector<int64_t> sc(static_cast<size_t>(n)), rcv(static_cast<size_t>(n));
    std::vector<uint8_t> send, want;
    for (int p = 0; p < n; ++p) {
      sc[size_t(p)] = count(r, p), rcv[size_t(p)] = count(p, r);
      for (int64_t i = 0; i < sc[size_t(p)]; ++i)
        for (int b = 0; b < 5; ++b) send.push_back(byte(r, p, i, b));
      for (int64_t i = 0; i < rcv[size_t(p)]; ++i)
        for (int b = 0; b < 5; ++b) want.push_back(byte(p, r, i, b));
    }
    std::vector<uint8_t> got(want.size(), 0xEE);
    comm->alltoallv(send, sc, got, rcv, 5);
    if (got != want) fail("alltoallv");
  }
  std::vector<double> sd = {0.5 + double(r)};
  comm->allreduce_sum(sd);
  if (sd[0] != 0.5 * double(n) + double(n * (n - 1) / 2)) fail("allreduce_sum(double)");
  // ZeRO-1's collectives with shards of odd and empty sizes: rank k owns [bk, bk+1).
  for (const std::vector<int64_t>& cut : {std::vector<int64_t>{0, 0, 7}, {0, 5, 7}, {0, 1, 7}, {0, 7, 7}}) {
    std::vector<ShardRange> shards;
    for (int k = 0; k < n; ++k)
      shards.push_back(n == 2 ? ShardRange{cut[size_t(k)], cut[size_t(k) + 1]} : even_shards(7, n)[size_t(k)]);
    std::vector<float> full(7), mine(size_t(shards[size_t(r)].end - shards[size_t(r)].begin));
    for (int i = 0; i < 7; ++i) full[size_t(i)] = float(i * (r + 1));  // small integers: exact sums
    comm->reduce_scatter_sum(full, shards, mine);
    for (int64_t i = shards[size_t(r)].begin; i < shards[size_t(r)].end; ++i)
      if (mine[size_t(i - shards[size_t(r)].begin)] != float(i * n * (n + 1) / 2)) fail("reduce_scatter_sum");
    std::vector<float> got(7, -1.0f);
    for (float& v : mine) v += 0.5f;
    comm->allgather(mine, shards, got);
    for (int i = 0; i < 7; ++i)
      if (got[size_t(i)] != float(i * n * (n + 1) / 2) + 0.5f) fail("allgather");
  }

  const FlatTensor tensors[] = {{37, 45, 0}, {16, 16, 1665}, {50, 33, 1921}, {1, 7, 3571}};
  std::vector<float> flat(3578);
  std::mt19937 rng(9);  // the same values on every rank
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : flat) v = nd(rng) * 0.02f;
  std::vector<uint8_t> ref;
  for (const FlatTensor& t : tensors) {
    const QuantizedTensor q =
        quantize(quantizer_by_name("nvfp4_2d"), MatrixView<const float>(flat.data() + t.offset, t.rows, t.cols));
    const auto p = pack_fp4(q.codes.data(), t.rows, t.cols);
    ref.insert(ref.end(), p.begin(), p.end());
  }
  const int64_t total = int64_t(flat.size());
  auto be = train::make_cpu_backend(1);  // the host cast store's backend (nothing to stage)
  int cases = 0;
  for (int64_t off : {int64_t(0), int64_t(1), int64_t(15), int64_t(16), int64_t(17), int64_t(33), total / 2 + 1}) {
    // Rank k of n owns [b_k, b_{k+1}) with b_1 = off and the rest split evenly (odd lengths included).
    std::vector<int64_t> b = {0, off};
    for (int k = 2; k < n; ++k) b.push_back(off + (total - off) * (k - 1) / (n - 1));
    b.push_back(total);
    if (n == 1) b = {0, total};
    const std::unique_ptr<train::CastStore> store = train::make_host_cast_store(tensors);
    std::vector<ShardRange> shards;
    for (int k = 0; k < n; ++k) shards.push_back({b[size_t(k)], b[size_t(k) + 1]});
    train::run_cast(*comm, *be, *store, flat.data(), shards, true);
    ++cases;
    const std::span<const uint8_t> packed = store->packed();
    if (!std::equal(packed.begin(), packed.end(), ref.begin(), ref.end()))
      fail("shard cast differs from quantize(nvfp4_2d)");
  }
  comm->barrier();
  if (r == 0)
    std::printf("test_dist_mpi: %d ranks, %d shard-cast splits, %s\n", n, cases, failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
