// distributed.reduce "bf16" on the cuda backend (train/dist/grad_reduce.hpp): the device kernels of
// Backend::round_bf16_codes and sum_bf16_codes (train/cuda/grad_reduce_ops.cu) against the integer oracle of
// bf16_codes_cases.hpp (the cpu backend passes the same cases: cpu/test_bf16_codes.cpp): the rounding on every
// upper half's ties both ways, NaN of both signs, +-Inf, past BF16's largest finite, FP32 subnormals and -0,
// the sum on 1, 2, 3 and 5 rows; then reduce_scatter_bf16 itself on the cuda backend equal, bit for bit, to the
// cpu backend's: on 1, 2, 3 and 5 thread ranks (a host communicator: the codes staged through the host, the
// rounding and the sum on the device), and over NCCL (the codes in device buffers): a world of one, and every
// GPU of the machine (skipped with fewer than 2). Without a GPU the executable reports SKIPPED.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/bits.hpp"
#include "core/philox.hpp"
#include "cuda/device.hpp"
#include "train/backend.hpp"
#include "train/bf16_codes_cases.hpp"
#include "train/dist/comm.hpp"
#include "train/dist/comm_nccl.hpp"
#include "train/dist/grad_reduce.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
namespace fs = std::filesystem;

namespace {

bool fewer_than_2_gpus() {
  static const bool few = cuda::device_count() < 2;
  return few;
}

// Rank r's gradient element i: random magnitudes over many binades, and every 7th an edge value (ties both
// ways, subnormals, overflow to Inf, -0, +-Inf, NaN of both signs).
float local_grad(int r, int64_t i) {
  static const uint32_t edges[] = {0x3F808000u, 0x3F818000u, 0xBF818000u, 0x00008000u, 0x00018000u,
                                   0x00000001u, 0x7F7FFFFFu, 0x7F7F7FFFu, 0x80000000u, 0x7F800000u,
                                   0xFF800000u, 0x7FC00000u, 0xFFA00001u, 0x7F7F8000u};
  const uint32_t w = random_bits(0xC0DA, uint64_t(r), uint64_t(i));
  if (w % 7 == 0) return bits_float(edges[(w >> 8) % std::size(edges)]);
  return std::ldexp(float(w >> 8) * 0x1p-24f - 0.5f, int((w >> 4) % 40) - 20);
}

enum class Engine { threads, nccl };

// reduce_scatter_bf16 of local_grad over even_shards(n, world) on backend be_name, each rank's `mine` (host).
// Engine::nccl: rank r on GPU r (world 1: a file rendezvous), else thread ranks on the current GPU.
std::vector<std::vector<float>> reduce_on(Engine engine, const std::string& be_name, int world, int64_t n) {
  const std::vector<ShardRange> shards = even_shards(n, world);
  std::vector<std::unique_ptr<Communicator>> comms;
  std::string rendezvous;
  if (engine == Engine::threads) {
    comms = make_thread_comms(world);
  } else if (world == 1) {
    static std::atomic<int> k{0};
    const fs::path p =
        fs::temp_directory_path() / ("fp4lab_rbf16_" + std::to_string(::getpid()) + "_" + std::to_string(k++));
    fs::remove(p);
    rendezvous = "file:" + p.string();
    comms.resize(1);
  } else {
    std::vector<int> devices;
    for (int d = 0; d < world; ++d) devices.push_back(d);
    comms = make_nccl_comms_single_process(devices);
  }
  std::vector<std::vector<float>> got(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> th;
  for (int r = 0; r < world; ++r)
    th.emplace_back([&, r] {
      try {
        if (engine == Engine::nccl) {
          cuda::check(cudaSetDevice(r), "cudaSetDevice");
          if (!comms[size_t(r)]) comms[size_t(r)] = make_nccl_comm(0, 1, rendezvous);
        }
        auto be = be_name == "cuda" ? make_cuda_backend() : make_cpu_backend(1);
        std::vector<float> x(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) x[size_t(i)] = local_grad(r, i);
        train::Tensor full = be->empty(1, n);
        be->upload(x.data(), full);
        const ShardRange s = shards[size_t(r)];
        train::Tensor mine = be->empty(1, s.end - s.begin);
        reduce_scatter_bf16(*comms[size_t(r)], *be, full, shards, mine);
        got[size_t(r)].resize(size_t(mine.size()));
        if (mine.size() > 0) be->download(mine, got[size_t(r)].data());
        comms[size_t(r)].reset();
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(errors[size_t(r)] == "");
  }
  return got;
}

// The test's own expectation of rank r's shard: the oracle's codes summed by the oracle's sum.
std::vector<float> oracle_shard(int world, ShardRange s) {
  const int64_t k = s.end - s.begin;
  std::vector<uint16_t> codes(static_cast<size_t>(world * k));
  for (int r = 0; r < world; ++r)
    for (int64_t i = 0; i < k; ++i)
      codes[size_t(r * k + i)] = test::oracle_bf16_code(float_bits(local_grad(r, s.begin + i)));
  std::vector<float> out(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) out[size_t(i)] = bits_float(test::oracle_bf16_sum(codes, world, k, i));
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// The cuda backend's shards against the cpu backend's and the oracle's, bit for bit (NaN included: the rule
// writes every NaN sum as 0x7FFF0000).
void check_against_cpu(Engine engine, int world, int64_t n) {
  CAPTURE(world);
  CAPTURE(n);
  const auto gpu = reduce_on(engine, "cuda", world, n);
  const auto cpu = reduce_on(Engine::threads, "cpu", world, n);
  const std::vector<ShardRange> shards = even_shards(n, world);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(same_bits(gpu[size_t(r)], cpu[size_t(r)]));
    CHECK(same_bits(cpu[size_t(r)], oracle_shard(world, shards[size_t(r)])));
  }
}

}  // namespace

TEST_CASE("cuda backend: round_bf16_codes equals the integer RNE oracle (ties, NaN, Inf, overflow, subnormals)") {
  auto be = make_cuda_backend();
  test::check_round_bf16_codes(*be);
}

TEST_CASE("cuda backend: sum_bf16_codes equals the rank-order FP32 sum on 1, 2, 3 and 5 rows") {
  auto be = make_cuda_backend();
  test::check_sum_bf16_codes(*be);
}

TEST_CASE("cuda backend: reduce_scatter_bf16 on 1, 2, 3 and 5 thread ranks equals the cpu backend's bit for bit") {
  for (int world : {1, 2, 3, 5})
    for (int64_t n : {int64_t(3), int64_t(1001), int64_t(65537)})  // 3 elements on 5 ranks: empty shards
      check_against_cpu(Engine::threads, world, n);
}

TEST_CASE("cuda backend: reduce_scatter_bf16 over NCCL, world of one, equals the cpu backend's bit for bit") {
  REQUIRE(have_nccl());
  for (int64_t n : {int64_t(1), int64_t(1001)}) check_against_cpu(Engine::nccl, 1, n);
}

TEST_CASE("cuda backend: reduce_scatter_bf16 over NCCL on every GPU equals the cpu backend's bit for bit" *
          doctest::skip(fewer_than_2_gpus())) {
  REQUIRE(have_nccl());
  const int world = cuda::device_count();
  for (int64_t n : {int64_t(world - 1), int64_t(1001), int64_t(65537)}) check_against_cpu(Engine::nccl, world, n);
}
