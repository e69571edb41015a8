// The communicators (train/dist/comm.hpp) with in-process thread ranks, and
// the NVFP4 primary-weight cast over them (train/dist/primary_weights.hpp):
// every rank ends with quantize(nvfp4_2d, W) of every tensor, for 1 to 8
// ranks and shard boundaries at odd, mid-byte and mid-tile offsets.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "sim/packing.hpp"
#include "sim/quantizer.hpp"
#include "train/dist/comm.hpp"
#include "train/dist/primary_weights.hpp"

using namespace fp4lab;

namespace {

// Runs f(comm) on n thread ranks and waits for all.
template <class F>
void on_ranks(int n, F f) {
  auto comms = make_thread_comms(n);
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r) t.emplace_back([&, r] { f(*comms[size_t(r)]); });
  for (auto& th : t) th.join();
}

}  // namespace

TEST_CASE("thread communicator: max, sum in rank order, gather of any sizes, many rounds") {
  for (int n : {1, 2, 3, 8}) {
    CAPTURE(n);
    std::vector<std::vector<uint32_t>> maxes(static_cast<size_t>(n));
    std::vector<std::vector<float>> sums(static_cast<size_t>(n));
    std::vector<std::vector<std::vector<uint8_t>>> gathers(static_cast<size_t>(n));
    on_ranks(n, [&](Communicator& c) {
      const int r = c.rank();
      CHECK(c.world() == n);
      for (int round = 0; round < 20; ++round) {  // back-to-back rounds must not mix
        std::vector<uint32_t> m = {uint32_t(r * 7 + round), uint32_t(100 - r), 0x7FC00000u * (r == 1)};
        c.allreduce_max(m);
        std::vector<float> s = {1.0f + float(r), 1e8f * float(r == 0), -1e8f * float(r == n - 1), 0.5f};
        c.allreduce_sum(s);
        const std::vector<uint8_t> mine(size_t(r), uint8_t(r + round));
        auto g = c.allgather_bytes(mine);
        c.barrier();
        if (round == 19) {
          maxes[size_t(r)] = m;
          sums[size_t(r)] = s;
          gathers[size_t(r)] = g;
        }
      }
    });
    for (int r = 0; r < n; ++r) {
      CHECK(maxes[size_t(r)] == std::vector<uint32_t>{uint32_t((n - 1) * 7 + 19), 100u, n > 1 ? 0x7FC00000u : 0u});
      // Rank order: (1e8 + ...) then -1e8: the small terms are absorbed exactly as a rank-order sum does.
      float expect = 0.0f, big = 0.0f;
      for (int k = 0; k < n; ++k) {
        expect += 1.0f + float(k);
        big += 1e8f * float(k == 0) + -1e8f * float(k == n - 1);
      }
      CHECK(sums[size_t(r)][0] == expect);
      CHECK(float_bits(sums[size_t(r)][3]) == float_bits(0.5f * float(n)));
      REQUIRE(gathers[size_t(r)].size() == size_t(n));
      for (int k = 0; k < n; ++k)
        CHECK(gathers[size_t(r)][size_t(k)] == std::vector<uint8_t>(size_t(k), uint8_t(k + 19)));
    }
  }
  CHECK(make_local_comm()->world() == 1);
  if (!have_mpi()) CHECK_THROWS(make_mpi_comm());
  // allgather_equal: rank r's `part` bytes a function of (r, i), at [r part, (r + 1) part); empty parts; in place.
  for (int n : {1, 2, 5})
    for (size_t part : {size_t(0), size_t(1), size_t(13)}) {
      CAPTURE(n);
      CAPTURE(part);
      std::vector<uint8_t> want;
      for (int k = 0; k < n; ++k)
        for (size_t i = 0; i < part; ++i) want.push_back(uint8_t(k * 37 + int(i) * 5 + 1));
      std::vector<std::vector<uint8_t>> got(static_cast<size_t>(n)), in_place(static_cast<size_t>(n));
      on_ranks(n, [&](Communicator& c) {
        const size_t r = size_t(c.rank());
        const std::vector<uint8_t> mine(want.begin() + std::ptrdiff_t(r * part),
                                        want.begin() + std::ptrdiff_t((r + 1) * part));
        std::vector<uint8_t> all(want.size(), 0xEE);
        c.allgather_equal(mine, all);
        got[r] = all;
        std::fill(all.begin(), all.end(), uint8_t(0xEE));
        std::copy(mine.begin(), mine.end(), all.begin() + std::ptrdiff_t(r * part));
        c.allgather_equal(std::span<const uint8_t>(all).subspan(r * part, part), all);
        in_place[r] = all;
      });
      for (int r = 0; r < n; ++r) {
        CHECK(got[size_t(r)] == want);
        CHECK(in_place[size_t(r)] == want);
      }
    }
  // A result buffer that is not world x part: one line naming the sizes.
  on_ranks(2, [&](Communicator& c) {
    std::vector<uint8_t> mine(3), all(5);
    CHECK_THROWS_WITH(c.allgather_equal(mine, all), doctest::Contains("allgather_equal: a part of 3 bytes"));
  });
}

namespace {

// alltoallv's test traffic: rank r sends count(r, p, round) rows of `unit` bytes to rank p (zeros included),
// row i's bytes a function of (r, p, i, round, byte).
int64_t a2a_count(int r, int p, int round) { return (r * 3 + p * 5 + round) % 4; }
uint8_t a2a_byte(int r, int p, int64_t i, int round, size_t b) { return uint8_t(r * 61 + p * 17 + i * 7 + round + b); }

}  // namespace

TEST_CASE("thread and local communicators: alltoallv of any counts, zeros included, rows of any width") {
  for (int n : {1, 2, 3, 5}) {
    for (size_t unit : {size_t(1), size_t(4), size_t(6)}) {
      CAPTURE(n);
      CAPTURE(unit);
      std::vector<int> bad(static_cast<size_t>(n), 0);
      on_ranks(n, [&](Communicator& c) {
        const int r = c.rank();
        for (int round = 0; round < 6; ++round) {
          std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
          std::vector<uint8_t> send, want;
          for (int p = 0; p < n; ++p) {
            sc[size_t(p)] = a2a_count(r, p, round);
            rc[size_t(p)] = a2a_count(p, r, round);
            for (int64_t i = 0; i < sc[size_t(p)]; ++i)
              for (size_t b = 0; b < unit; ++b) send.push_back(a2a_byte(r, p, i, round, b));
            for (int64_t i = 0; i < rc[size_t(p)]; ++i)
              for (size_t b = 0; b < unit; ++b) want.push_back(a2a_byte(p, r, i, round, b));
          }
          std::vector<uint8_t> recv(want.size(), 0xEE);
          c.alltoallv(send, sc, recv, rc, unit);
          if (recv != want) ++bad[size_t(r)];
        }
      });
      for (int r = 0; r < n; ++r) CHECK(bad[size_t(r)] == 0);
    }
  }
  // The local engine: its own part copied; counts that disagree with the buffers are errors naming them.
  auto local = make_local_comm();
  const std::vector<uint8_t> send = {1, 2, 3, 4, 5, 6};
  std::vector<uint8_t> recv(6);
  local->alltoallv(send, std::vector<int64_t>{3}, recv, std::vector<int64_t>{3}, 2);
  CHECK(recv == send);
  CHECK_THROWS_WITH_AS(local->alltoallv(send, std::vector<int64_t>{2}, recv, std::vector<int64_t>{3}, 2),
                       doctest::Contains("alltoallv"), Error);
  CHECK_THROWS_WITH_AS(local->alltoallv(send, std::vector<int64_t>{3, 0}, recv, std::vector<int64_t>{3}, 2),
                       doctest::Contains("for 1 ranks"), Error);
  // Thread ranks whose counts disagree: the receiver names the sender and both counts.
  std::vector<std::string> errors(2);
  on_ranks(2, [&](Communicator& c) {
    const int r = c.rank();
    const std::vector<int64_t> sc = {1, 1}, rc = r == 1 ? std::vector<int64_t>{2, 1} : std::vector<int64_t>{1, 1};
    std::vector<uint8_t> out(size_t(rc[0] + rc[1]));
    try {
      c.alltoallv(std::vector<uint8_t>{uint8_t(r), uint8_t(r)}, sc, out, rc, 1);
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
    }
  });
  CHECK(errors[0].empty());
  CHECK(errors[1].find("rank 0 sends 1 rows to rank 1, which expects 2") != std::string::npos);
}

// run_cast on a host cast store (the cpu backend's): the packed codes and scales every rank ends with.
struct HostCast {
  std::vector<uint8_t> packed;
  ShardScales scales;
};
HostCast host_cast(Communicator& c, std::span<const FlatTensor> tensors, const float* flat,
                   std::span<const ShardRange> shards, bool shard_cast) {
  auto be = train::make_cpu_backend(1);
  const std::unique_ptr<train::CastStore> store = train::make_host_cast_store(tensors);
  train::run_cast(c, *be, *store, flat, shards, shard_cast);
  const std::span<uint8_t> p = store->packed();
  return HostCast{std::vector<uint8_t>(p.begin(), p.end()), store->scales()};
}

TEST_CASE("NVFP4 primary weights over thread ranks: shard_cast true equals false equals quantize(nvfp4_2d)") {
  const FlatTensor tensors[] = {{37, 45, 0}, {16, 16, 1665}, {50, 33, 1921}, {1, 7, 3571}};
  std::vector<float> flat(3578);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : flat) v = nd(rng) * 0.02f;
  // The reference, tensor by tensor.
  std::vector<uint8_t> ref_packed, ref_scales;
  for (const FlatTensor& t : tensors) {
    const QuantizedTensor q =
        quantize(quantizer_by_name("nvfp4_2d"), MatrixView<const float>(flat.data() + t.offset, t.rows, t.cols));
    const auto p = pack_fp4(q.codes.data(), t.rows, t.cols);
    ref_packed.insert(ref_packed.end(), p.begin(), p.end());
    ref_scales.insert(ref_scales.end(), q.scale_codes.begin(), q.scale_codes.end());
  }
  const int64_t total = int64_t(flat.size());
  auto check_split = [&](const std::vector<ShardRange>& shards) {
    const int n = int(shards.size());
    std::vector<HostCast> got(static_cast<size_t>(n)), whole(static_cast<size_t>(n));
    on_ranks(n, [&](Communicator& c) {
      got[size_t(c.rank())] = host_cast(c, tensors, flat.data(), shards, true);
      whole[size_t(c.rank())] = host_cast(c, tensors, flat.data(), shards, false);
    });
    bool ok = true;
    for (int r = 0; r < n; ++r) {
      ok = ok && got[size_t(r)].packed == ref_packed && got[size_t(r)].scales.tile_code == ref_scales;
      ok = ok && whole[size_t(r)].packed == ref_packed && whole[size_t(r)].scales.tile_code == ref_scales;
    }
    return ok;
  };
  for (int n = 1; n <= 8; ++n) {
    CAPTURE(n);
    CHECK(check_split(even_shards(total, n)));
  }
  for (int64_t off : {int64_t(0), int64_t(1), int64_t(15), int64_t(16), int64_t(17), int64_t(33)}) {
    CAPTURE(off);
    CHECK(check_split({{0, off}, {off, total}}));
    CHECK(check_split({{0, off}, {off, 2 * off + 1}, {2 * off + 1, total}}));  // odd lengths
  }
}
