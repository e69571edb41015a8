// Counting collectives (train/dist/counting_comm.hpp) on thread ranks: every
// call reaches the inner communicator unchanged, and the counts equal the
// header's formulas for known buffers, collective by collective and for the
// data-parallel step (ZeRO-1 with NVFP4-stored weights).
#include <doctest/doctest.h>

#include <memory>
#include <thread>
#include <vector>

#include "train/dist/counting_comm.hpp"
#include "train/dist/data_parallel.hpp"

using namespace fp4lab;
using namespace fp4lab::train;

namespace {

// Runs f(counting comm) on n thread ranks; each rank's counts.
template <class F>
std::vector<std::map<int64_t, std::map<std::string, CollectiveCounts>>> count_on_ranks(int n, F f) {
  auto comms = make_thread_comms(n);
  std::vector<std::map<int64_t, std::map<std::string, CollectiveCounts>>> out(static_cast<size_t>(n));
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r)
    t.emplace_back([&, r] {
      CountingComm c(*comms[size_t(r)]);
      f(c);
      out[size_t(r)] = c.counts();
    });
  for (auto& th : t) th.join();
  return out;
}

}  // namespace

TEST_CASE("CountingComm: forwards every collective and counts calls, payload and ring bytes per step") {
  const int N = 3;
  const std::vector<ShardRange> shards = even_shards(10, N);  // 4, 3, 3 floats
  std::vector<std::vector<float>> sums(N), gathered(N), scattered(N);
  const auto counts = count_on_ranks(N, [&](Communicator& c) {
    const int r = c.rank();
    std::vector<float> v(10, float(r + 1));
    c.allreduce_sum(std::span<float>(v));  // step -1
    sums[size_t(r)] = v;
    c.set_step(0);
    std::vector<double> d(2, 1.0);
    c.allreduce_sum(std::span<double>(d));
    std::vector<uint32_t> m(5, uint32_t(r));
    c.allreduce_max(m);
    std::vector<float> full(10, 1.0f), mine(size_t(shards[size_t(r)].end - shards[size_t(r)].begin));
    c.reduce_scatter_sum(full, shards, mine);
    scattered[size_t(r)] = mine;
    std::vector<float> g(10, 0.0f);
    std::vector<float> own(mine.size(), float(r));
    c.allgather(own, shards, g);
    gathered[size_t(r)] = g;
    const std::vector<uint8_t> bytes(size_t(r), uint8_t(7));  // 0, 1, 2 bytes
    const auto all = c.allgather_bytes(bytes);
    CHECK(all.size() == size_t(N));
    c.barrier();
  });
  for (int r = 0; r < N; ++r) {
    CAPTURE(r);
    CHECK(sums[size_t(r)] == std::vector<float>(10, 6.0f));  // 1 + 2 + 3: forwarded
    CHECK(scattered[size_t(r)] == std::vector<float>(scattered[size_t(r)].size(), 3.0f));
    CHECK(gathered[size_t(r)] == std::vector<float>{0, 0, 0, 0, 1, 1, 1, 2, 2, 2});
    const auto& c = counts[size_t(r)];
    REQUIRE(c.size() == 2);
    CHECK(c.at(-1).at("allreduce_sum") == CollectiveCounts{1, 40, 40, 2 * 2 * 40 / 3});
    const auto& s = c.at(0);
    const int64_t own = 4 * (shards[size_t(r)].end - shards[size_t(r)].begin);
    CHECK(s.at("allreduce_sum") == CollectiveCounts{1, 16, 16, 2 * 2 * 16 / 3});
    CHECK(s.at("allreduce_max") == CollectiveCounts{1, 20, 20, 2 * 2 * 20 / 3});
    CHECK(s.at("reduce_scatter_sum") == CollectiveCounts{1, 40, own, 40 - own});
    CHECK(s.at("allgather") == CollectiveCounts{1, own, 40, 40 - own});
    CHECK(s.at("allgather_bytes") == CollectiveCounts{1, r, 3, 3 - r});
    CHECK(s.at("barrier") == CollectiveCounts{1, 0, 0, 0});
    CHECK(s.size() == 6);
  }
}

TEST_CASE("CountingComm: world 1 moves nothing on the wire; summary per step and in total") {
  auto local = make_local_comm();
  CountingComm c(*local);
  CHECK(c.summary().empty());
  std::vector<float> v(8, 1.0f);
  c.allreduce_sum(std::span<float>(v));
  c.set_step(0);
  c.allreduce_sum(std::span<float>(v));
  c.set_step(1);
  c.allreduce_sum(std::span<float>(v));
  const std::vector<ShardRange> one{{0, 8}};
  std::vector<float> out(8);
  c.reduce_scatter_sum(v, one, out);
  CHECK(c.counts().at(1).at("reduce_scatter_sum") == CollectiveCounts{1, 32, 32, 0});
  const nlohmann::json s = c.summary();
  CHECK(s["step"] == 0);
  CHECK(s["per_step"] ==
        nlohmann::json{{"allreduce_sum", {{"calls", 1}, {"bytes_in", 32}, {"bytes_out", 32}, {"ring_bytes", 0}}}});
  CHECK(s["total"]["allreduce_sum"]["calls"] == 3);
  CHECK(s["total"]["allreduce_sum"]["bytes_in"] == 96);
  CHECK(s["total"]["reduce_scatter_sum"]["calls"] == 1);
}

TEST_CASE("CountingComm under DataParallel: ZeRO-1 with NVFP4-stored weights, the bytes of one step") {
  const int N = 3;
  std::vector<ShardRange> shards;
  int64_t n = 0, amax_bytes = 0, packed = 0, bias_at = 0;
  PackedWindows w;
  const auto counts = count_on_ranks(N, [&](Communicator& c) {
    auto be = make_cpu_backend(1);
    ParamStore ps;
    ps.add("a.weight", 19, 37, true, Init::normal, 0.5f);
    ps.add("a.bias", 1, 19, false, Init::normal, 0.1f);
    ps.add("b.weight", 33, 17, true, Init::normal, 0.5f);
    ps.finalize(*be, 7);
    const int nv[] = {0, 2};
    ps.set_storage(nv, Storage::nvfp4_2d, *be);
    DistributedConfig dc;
    dc.zero = 1;
    dc.primary_weights = Storage::nvfp4_2d;  // shard_cast: each rank casts its shard
    DataParallel dp(c, *be, ps, AdamWConfig{}, dc);
    dp.begin_step(1.0f, 1.0 / N);
    for (int64_t i = 0; i < ps.size(); ++i) ps.grads.data[i] = 0.01f * float(i % 13);
    dp.step(1e-3);
    if (c.rank() == 0) {
      n = ps.size();
      shards = even_shards(n, N);
      const FlatLayout l = flat_layout(ps.cast_store()->tensors());
      amax_bytes = 4 * (int64_t(ps.cast_store()->tensors().size()) + l.tile_offset.back());
      packed = l.packed_offset.back();
      w = packed_windows(ps.cast_store()->tensors(), shards);
      bias_at = ps.info(1).offset;
    }
  });
  REQUIRE(n == 19 * 37 + 19 + 33 * 17);
  // The windows: about the packed buffer's N-th part each (the longest span: shards are even in elements, not
  // in NVFP4 elements, and an odd row width packs 37 elements into 19 bytes), within 10% in all here.
  CHECK(w.size * N >= packed);
  CHECK(w.size * N <= packed + packed / 10);
  const int64_t wire_before = 4 * n;  // the FP32 all-gather of every parameter, before the packed codes travelled
  for (int r = 0; r < N; ++r) {
    CAPTURE(r);
    const int64_t own = 4 * (shards[size_t(r)].end - shards[size_t(r)].begin);
    // The FP32 elements of rank r's shard: the bias's [bias_at, bias_at + 19) inside it.
    const int64_t own_fp32 = 4 * std::max<int64_t>(0, std::min(shards[size_t(r)].end, bias_at + 19) -
                                                          std::max(shards[size_t(r)].begin, bias_at));
    // The start (step -1): the first cast, the amaxes reduced and the packed windows gathered.
    const auto& start = counts[size_t(r)].at(-1);
    CHECK(start.at("allreduce_max") == CollectiveCounts{1, amax_bytes, amax_bytes, 2 * (N - 1) * amax_bytes / N});
    CHECK(start.at("allgather_equal") == CollectiveCounts{1, w.size, N * w.size, (N - 1) * w.size});
    CHECK(start.size() == 2);
    // Step 0: the gradient's reduce-scatter, the norm's sum, the FP32 all-gather of the bias only, the cast.
    const auto& s = counts[size_t(r)].at(0);
    CHECK(s.at("reduce_scatter_sum") == CollectiveCounts{1, 4 * n, own, 4 * n - own});
    CHECK(s.at("allreduce_sum") == CollectiveCounts{1, 8, 8, 2 * (N - 1) * 8 / N});
    CHECK(s.at("allgather") == CollectiveCounts{1, own_fp32, 4 * 19, 4 * 19 - own_fp32});
    CHECK(s.at("allreduce_max") == start.at("allreduce_max"));
    CHECK(s.at("allgather_equal") == start.at("allgather_equal"));
    CHECK(s.size() == 5);
    // The weight gather's wire bytes against the FP32 all-gather of everything: the target is 1/6.
    const int64_t wire = s.at("allgather").ring_bytes + s.at("allgather_equal").ring_bytes;
    CHECK(6 * wire <= wire_before - own);
  }
}
