// The NCCL communicator (train/dist/comm_nccl.hpp): every collective against
// its definition on a world of one (file rendezvous), then on every GPU of the
// machine from one process (one thread a rank; shard sizes even, uneven and
// empty; inputs small integers, so that the float sums are exact in any order).
// The argument errors are checked without a GPU (test suite "host"). Without
// a GPU the executable reports SKIPPED (tests/gpu_main.cpp); with one GPU the
// multi-GPU cases are skipped (doctest::skip, counted as skipped, never as
// passed).
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "cuda/device.hpp"
#include "sim/shard_cast.hpp"
#include "train/dist/comm_nccl.hpp"

using namespace fp4lab;
namespace fs = std::filesystem;
using cuda::DeviceBuffer;

namespace {

// Fewer than 2 GPUs: the multi-GPU cases are skipped (evaluated once, at registration).
bool fewer_than_2_gpus() {
  static const bool few = cuda::device_count() < 2;
  return few;
}

std::string fresh_path() {
  static std::atomic<int> n{0};
  const fs::path p =
      fs::temp_directory_path() / ("fp4lab_nccl_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
  fs::remove(p);
  return p.string();
}

template <class T>
DeviceBuffer<T> on_device(const std::vector<T>& v) {
  DeviceBuffer<T> d(v.size());
  if (!v.empty()) d.upload(v.data(), v.size());
  return d;
}

// Shards of the given sizes, in rank order.
std::vector<ShardRange> shards_of(const std::vector<int64_t>& sizes) {
  std::vector<ShardRange> s;
  int64_t at = 0;
  for (int64_t n : sizes) s.push_back({at, at += n});
  return s;
}

// Rank r's input element i of reduce_scatter_sum: a small integer.
float rs_input(int r, int64_t i) { return float(i % 13) + 3.0f * float(r) - 5.0f; }

// Every collective on `c` (rank r of n), checked against its definition;
// CHECKs only (safe from the rank threads). `round` varies the inputs.
void exercise(Communicator& c, int round) {
  const int r = c.rank(), n = c.world();
  auto m = on_device<uint32_t>({uint32_t(r * 7 + round), uint32_t(100 - r), r == n - 1 ? 0x7FC00000u : 0u});
  c.allreduce_max({m.data(), m.size()});
  CHECK(m.download() == std::vector<uint32_t>{uint32_t((n - 1) * 7 + round), 100u, 0x7FC00000u});

  float k_sum = 0.0f;
  for (int k = 0; k < n; ++k) k_sum += float(k);
  auto s = on_device<float>({1.0f + float(r), 0.5f, -float(r), float(round)});
  c.allreduce_sum({s.data(), s.size()});
  CHECK(s.download() == std::vector<float>{float(n) + k_sum, 0.5f * float(n), -k_sum, float(round * n)});
  auto d = on_device<double>({double(r) * 0.25, 1e15});
  c.allreduce_sum({d.data(), d.size()});
  CHECK(d.download() == std::vector<double>{double(k_sum) * 0.25, 1e15 * double(n)});

  // allgather_equal: rank k's 7 bytes a function of (k, i, round), at [7k, 7k + 7) of the result; then in place.
  {
    std::vector<uint8_t> mine(7), want;
    for (int k = 0; k < n; ++k)
      for (int i = 0; i < 7; ++i) want.push_back(uint8_t(k * 29 + i * 3 + round));
    for (int i = 0; i < 7; ++i) mine[size_t(i)] = want[size_t(r * 7 + i)];
    auto mine_d = on_device(mine);
    auto all_d = on_device(std::vector<uint8_t>(want.size(), 0xEE));
    c.allgather_equal({mine_d.data(), mine.size()}, {all_d.data(), want.size()});
    CHECK(all_d.download() == want);
    std::vector<uint8_t> staged(want.size(), 0xEE);
    std::copy(mine.begin(), mine.end(), staged.begin() + r * 7);
    auto in_place = on_device(staged);
    c.allgather_equal({in_place.data() + r * 7, mine.size()}, {in_place.data(), want.size()});
    CHECK(in_place.download() == want);
  }

  // alltoallv: rank k sends (k + 3p + round) % 4 rows of 6 bytes to rank p (zeros included, the own part too).
  {
    auto count = [&](int k, int p) { return int64_t((k + 3 * p + round) % 4); };
    auto byte = [&](int k, int p, int64_t i, int b) { return uint8_t(k * 37 + p * 11 + i * 3 + b + round); };
    std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
    std::vector<uint8_t> send, want;
    for (int p = 0; p < n; ++p) {
      sc[size_t(p)] = count(r, p), rc[size_t(p)] = count(p, r);
      for (int64_t i = 0; i < sc[size_t(p)]; ++i)
        for (int b = 0; b < 6; ++b) send.push_back(byte(r, p, i, b));
      for (int64_t i = 0; i < rc[size_t(p)]; ++i)
        for (int b = 0; b < 6; ++b) want.push_back(byte(p, r, i, b));
    }
    auto send_d = on_device(send);
    auto recv_d = on_device(std::vector<uint8_t>(want.size(), 0xEE));
    c.alltoallv({send_d.data(), send.size()}, sc, {recv_d.data(), want.size()}, rc, 6);
    CHECK(recv_d.download() == want);
  }

  // Shard sets: even_shards, a hand-made uneven one cycling {0, 7, 33, 1}, all on the last rank, none at all.
  std::vector<std::vector<ShardRange>> sets = {even_shards(1000 + round, n), even_shards(3, n)};
  std::vector<int64_t> uneven, last(static_cast<size_t>(n), 0);
  const int64_t pattern[] = {0, 7, 33, 1};
  for (int k = 0; k < n; ++k) uneven.push_back(pattern[(k + round) % 4]);
  last.back() = 17;
  sets.push_back(shards_of(uneven));
  sets.push_back(shards_of(last));
  sets.push_back(shards_of(std::vector<int64_t>(size_t(n), 0)));
  for (const auto& sh : sets) {
    const int64_t total = sh.back().end, b = sh[size_t(r)].begin, e = sh[size_t(r)].end;
    CAPTURE(total);
    std::vector<float> full(static_cast<size_t>(total)), gathered(static_cast<size_t>(total));
    std::vector<float> want(static_cast<size_t>(e - b), 0.0f);
    for (int64_t i = 0; i < total; ++i) full[size_t(i)] = rs_input(r, i);
    for (int64_t i = b; i < e; ++i)
      for (int k = 0; k < n; ++k) want[size_t(i - b)] += rs_input(k, i);
    auto full_d = on_device(full);
    DeviceBuffer<float> mine_d(size_t(e - b));
    c.reduce_scatter_sum({full_d.data(), full.size()}, sh, {mine_d.data(), mine_d.size()});
    CHECK(mine_d.download() == want);

    // allgather: rank k's shard holds 1000 k + j; `full` poisoned first; then again in place.
    std::vector<float> mine(static_cast<size_t>(e - b));
    for (int64_t j = 0; j < e - b; ++j) mine[size_t(j)] = float(1000 * r) + float(j);
    for (int k = 0; k < n; ++k)
      for (int64_t i = sh[size_t(k)].begin; i < sh[size_t(k)].end; ++i)
        gathered[size_t(i)] = float(1000 * k) + float(i - sh[size_t(k)].begin);
    auto mine_src = on_device(mine);
    full_d.fill_bytes(0xFF);
    c.allgather({mine_src.data(), mine.size()}, sh, {full_d.data(), full.size()});
    CHECK(full_d.download() == gathered);
    full_d.fill_bytes(0xFF);
    if (!mine.empty()) full_d.upload(mine.data(), mine.size(), size_t(b));
    c.allgather({full_d.data() + b, mine.size()}, sh, {full_d.data(), full.size()});
    CHECK(full_d.download() == gathered);
  }

  // Host bytes of different sizes, rank 0's empty; then all empty.
  std::vector<std::vector<uint8_t>> bytes;
  for (int k = 0; k < n; ++k) bytes.emplace_back(size_t(k * 3 + round % 2) * size_t(k > 0), uint8_t(k + 1));
  CHECK(c.allgather_bytes(bytes[size_t(r)]) == bytes);
  CHECK(c.allgather_bytes({}) == std::vector<std::vector<uint8_t>>(size_t(n)));
  c.barrier();

  if (round == 0) {
    // Inputs written on the legacy default stream just before the call are what
    // it reduces: `big` holds stale 3.0039 (bytes 0x40) until the copy of ones
    // lands, queued behind ~10 ms of other copies; a collective that started
    // early would leave 1 (or 3.0039 n), not n.
    const std::vector<float> ones(static_cast<size_t>(1) << 24, 1.0f);
    auto src = on_device(ones);
    DeviceBuffer<float> big(ones.size()), busy_a(size_t(1) << 26), busy_b(size_t(1) << 26);
    big.fill_bytes(0x40);
    cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (int k = 0; k < 20; ++k)
      cuda::check(
          cudaMemcpyAsync(busy_a.data(), busy_b.data(), busy_a.bytes(), cudaMemcpyDeviceToDevice, cudaStreamLegacy),
          "cudaMemcpyAsync");
    cuda::check(cudaMemcpyAsync(big.data(), src.data(), big.bytes(), cudaMemcpyDeviceToDevice, cudaStreamLegacy),
                "cudaMemcpyAsync");
    c.allreduce_sum({big.data(), big.size()});
    const auto host = big.download();
    CHECK(std::all_of(host.begin(), host.end(), [&](float x) { return x == float(n); }));
  }
}

// f(comm) on one thread a rank (after cudaSetDevice(devices[r])); each comm is
// destroyed in its own thread. Returns the ranks' exception messages.
template <class F>
std::vector<std::string> on_gpu_ranks(std::vector<std::unique_ptr<Communicator>> comms, const std::vector<int>& devices,
                                      F f) {
  std::vector<std::string> errors(devices.size());
  std::vector<std::thread> t;
  for (size_t r = 0; r < devices.size(); ++r)
    t.emplace_back([&, r] {
      try {
        cuda::check(cudaSetDevice(devices[r]), "cudaSetDevice");
        f(comms[r]);
        comms[r].reset();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      } catch (...) {
        errors[r] = "a test assertion or unknown exception";
      }
    });
  for (auto& th : t) th.join();
  return errors;
}

}  // namespace

TEST_CASE("nccl communicator: argument errors before any GPU work" * doctest::test_suite("host")) {
  if (!have_nccl()) {
    CHECK_THROWS_WITH_AS(make_nccl_comm(0, 1, "file:/tmp/x"), doctest::Contains("built without NCCL"), Error);
    return;
  }
  CHECK_THROWS_WITH_AS(make_nccl_comm(0, 1, "tcp:x"), doctest::Contains("expected \"mpi\""), Error);
  CHECK_THROWS_WITH_AS(make_nccl_comm(2, 2, "file:/tmp/x"), doctest::Contains("0 <= rank < world"), Error);
  const int bad[] = {0, 0};
  CHECK_THROWS_AS(make_nccl_comms_single_process(bad), Error);
}

TEST_CASE("nccl communicator, world of one (file rendezvous): every collective equals its definition") {
  REQUIRE(have_nccl());
  cuda::check(cudaSetDevice(0), "cudaSetDevice");
  const std::string path = fresh_path();
  auto c = make_nccl_comm(0, 1, "file:" + path);
  CHECK(!fs::exists(path));  // rank 0 removes it once every rank has joined
  CHECK(c->rank() == 0);
  CHECK(c->world() == 1);
  CHECK(c->name() == "nccl");
  CHECK(c->device_buffers());
  for (int round = 0; round < 3; ++round) exercise(*c, round);

  std::vector<float> on_host(4);
  CHECK_THROWS_WITH_AS(c->allreduce_sum(on_host), doctest::Contains("not memory of CUDA device 0"), Error);
  DeviceBuffer<float> f(8), m(8);
  const std::vector<ShardRange> gap = {{0, 4}}, two = {{0, 4}, {4, 8}}, whole = {{0, 8}};
  CHECK_THROWS_WITH_AS(c->reduce_scatter_sum({f.data(), 8}, gap, {m.data(), 4}), doctest::Contains("covering [0, 8)"),
                       Error);
  CHECK_THROWS_WITH_AS(c->allgather({m.data(), 8}, two, {f.data(), 8}), doctest::Contains("1 contiguous"), Error);
  CHECK_THROWS_WITH_AS(c->reduce_scatter_sum({f.data(), 8}, whole, {m.data(), 5}), doctest::Contains("holds 5"), Error);
}

TEST_CASE("nccl communicator, every GPU of one process: collectives with even, uneven and empty shards" *
          doctest::skip(fewer_than_2_gpus())) {
  REQUIRE(have_nccl());
  std::vector<int> devices(static_cast<size_t>(cuda::device_count()));
  for (size_t d = 0; d < devices.size(); ++d) devices[d] = int(d);
  const auto errors = on_gpu_ranks(make_nccl_comms_single_process(devices), devices, [&](auto& c) {
    CHECK(c->world() == int(devices.size()));
    for (int round = 0; round < 4; ++round) exercise(*c, round);
  });
  for (size_t r = 0; r < errors.size(); ++r) {
    CAPTURE(r);
    CHECK(errors[r] == "");
  }

  // A device the caller did not make current is refused by name.
  if (devices.size() >= 2) {
    auto comms = make_nccl_comms_single_process(std::vector<int>{1, 0});
    cuda::check(cudaSetDevice(0), "cudaSetDevice");
    CHECK_THROWS_WITH_AS(comms[0]->barrier(), doctest::Contains("this rank's device is 1"), Error);
    on_gpu_ranks(std::move(comms), {1, 0}, [](auto&) {});
  }
}

TEST_CASE("nccl communicator, one rank a thread through make_nccl_comm and a file rendezvous" *
          doctest::skip(fewer_than_2_gpus())) {
  REQUIRE(have_nccl());
  const int n = cuda::device_count();
  std::vector<int> devices(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) devices[size_t(d)] = d;
  const std::string rv = "file:" + fresh_path();
  const auto errors = on_gpu_ranks(std::vector<std::unique_ptr<Communicator>>(size_t(n)), devices, [&](auto& c) {
    int r = 0;
    cuda::check(cudaGetDevice(&r), "cudaGetDevice");
    c = make_nccl_comm(r, n, rv);
    CHECK(c->rank() == r);
    exercise(*c, 1);
  });
  for (size_t r = 0; r < errors.size(); ++r) {
    CAPTURE(r);
    CHECK(errors[r] == "");
  }
}
