// BF16 and FP8 (E4M3, one scale a tensor) parameter storage on the CUDA backend (cuda/element_cast.hpp behind
// train/cuda/cast_store.hpp): the device store's cast against the host store's (train/param_storage.cpp, itself
// tested against an independent BF16 rounding and sim's quantize(fp8_e4m3_tensor):
// tests/train/dist/test_gather_bf16_fp8.cpp) bit for bit at every split, through run_cast on thread ranks (a
// host communicator: the device store's span staged through the host); whole runs: ZeRO-3 with the storage's
// gather = ZeRO-1 with that storage, and under the bf16 recipe BF16 storage = FP32 storage, every loss,
// evaluation and checkpoint array (thread ranks on one GPU, clipping off, as the CPU tests). Without a GPU
// only the "host" case runs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sim/element_layout.hpp"
#include "train/checkpoint.hpp"
#include "train/config.hpp"
#include "train/dist/primary_weights.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"
#include "train/thread_ranks.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Cast {
  std::vector<float> values;   // the flat buffer after dequantize
  std::vector<uint8_t> span;   // the rank's codes (CastStore::span)
  std::vector<uint8_t> packed;  // every rank's codes assembled (host stores only)
};

// run_cast of backend be_name's store of storage s over `shards` on thread ranks; rank r's result.
std::vector<Cast> cast_on_ranks(const std::string& be_name, Storage s, std::span<const FlatTensor> tensors,
                                const std::vector<float>& flat, const std::vector<ShardRange>& shards,
                                bool shard_cast) {
  const int n = int(shards.size());
  std::vector<Cast> out(static_cast<size_t>(n));
  auto comms = make_thread_comms(n);
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      auto be = be_name == "cuda" ? make_cuda_backend() : make_cpu_backend(1);
      train::Tensor x = be->empty(1, int64_t(flat.size()));
      be->upload(flat.data(), x);
      auto store = be->make_cast_store(s, tensors);
      run_cast(*comms[size_t(r)], *be, *store, x.data, shards, shard_cast);
      store->dequantize(x.data);
      Cast& c = out[size_t(r)];
      c.values.resize(flat.size());
      be->download(x, c.values.data());
      c.span = store->span().bytes;  // this rank's span of codes (downloaded from a device store)
      if (!store->device()) {
        const std::span<uint8_t> p = store->packed();
        c.packed.assign(p.begin(), p.end());
      }
    });
  for (auto& t : th) t.join();
  return out;
}

// The same bits, except that NaN equals NaN whatever its payload, as every GPU test of the house compares floats
// (tests/gpu_test_util.hpp same_bits): FP32 arithmetic's NaN payload is the hardware's (x86 keeps the operand's,
// 0x7FC00000 for decode(NaN) * scale; NVIDIA GPUs give 0x7FFFFFFF). The codes are compared byte for byte below.
bool same_values(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && !(std::isnan(a[i]) && std::isnan(b[i]))) {
      MESSAGE("first difference at element " << i << ": device " << a[i] << ", host " << b[i]);
      return false;
    }
  return true;
}

struct Scratch {
  fs::path dir = test::scratch_dir("fp4lab_gbfcuda_");
  std::string text = (dir / "text.txt").string(), out = (dir / "runs").string();
  Scratch() { std::ofstream(text) << test::words_corpus(); }
  ~Scratch() { fs::remove_all(dir); }
};

}  // namespace

TEST_CASE("cuda element stores (bf16, fp8_e4m3): the device cast equals the host cast at every split") {
  const FlatTensor tensors[] = {{13, 29, 3}, {8, 8, 400}, {3, 5, 470}, {7, 3, 490}};
  std::vector<float> flat(520);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : flat) v = nd(rng) * 0.05f;
  const uint32_t edges[] = {0x3F808000u, 0x3F818000u, 0x7FC00001u, 0xFF800000u, 0x7F7F8000u,
                            0x80000000u, 0x00000001u, 0x80018000u, 0x7F7FFFFFu, 0x3B7F8000u};
  for (size_t i = 0; i < std::size(edges); ++i) std::memcpy(&flat[3 + 2 * i], &edges[i], 4);
  for (int64_t i = 0; i < 64; ++i) flat[size_t(400 + i)] = (i % 2) ? 0.0f : -0.0f;  // amax 0
  flat[472] = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < 21; ++i) flat[size_t(490 + i)] = nd(rng) * 1e-20f;
  const int64_t total = int64_t(flat.size());
  for (Storage s : {Storage::bf16, Storage::fp8_e4m3})
    for (const std::vector<ShardRange>& shards :
         {even_shards(total, 1), even_shards(total, 2), even_shards(total, 3),
          std::vector<ShardRange>{{0, 17}, {17, 35}, {35, total}}, std::vector<ShardRange>{{0, 333}, {333, total}}})
      for (bool shard_cast : {true, false}) {
        CAPTURE(storage_name(s));
        CAPTURE(shards.size());
        CAPTURE(shards[0].end);
        CAPTURE(shard_cast);
        const std::vector<Cast> h = cast_on_ranks("cpu", s, tensors, flat, shards, shard_cast);
        const std::vector<Cast> d = cast_on_ranks("cuda", s, tensors, flat, shards, shard_cast);
        for (size_t r = 0; r < shards.size(); ++r) {
          CHECK(same_values(d[r].values, h[0].values));
          // The device rank's span of codes: the host's assembled codes at the same bytes.
          const ShardRange me = shard_cast ? shards[r] : ShardRange{0, total};
          const ShardRange sp = element_byte_span(tensors, element_code_at(tensors), code_bytes(s), me);
          REQUIRE(d[r].span.size() == size_t(sp.end - sp.begin));
          REQUIRE(size_t(sp.end) <= h[0].packed.size());
          CHECK(std::memcmp(d[r].span.data(), h[0].packed.data() + sp.begin, d[r].span.size()) == 0);
        }
      }
}

TEST_CASE("cuda backend: ZeRO-3 gather bf16 / fp8 = ZeRO-1 primary bf16 / fp8; bf16 recipe BF16 = FP32 storage") {
  Scratch s;
  for (const char* form : {"bf16", "fp8"})
    for (int world : {1, 2}) {
      CAPTURE(form);
      CAPTURE(world);
      const std::string tag = std::string(form) + "-" + std::to_string(world);
      json j = test::zero3_config(s.text, s.out, "z1-" + tag, 40, "bf16", "cuda");
      j["distributed"] = {{"zero", 1}, {"primary_weights", form}};
      const RunResult z1 = test::run_on_threads(world, j);
      j["name"] = "z3-" + tag;
      j["distributed"] = {{"zero", 3}, {"primary_weights", form}, {"gather", form}};
      const RunResult z3 = test::run_on_threads(world, j);
      test::check_same_run(z1, z3, 3);
      CHECK(z3.summary["distributed"]["gather"] == form);
      if (std::string(form) == "bf16") {  // the bf16 recipe rounds W to BF16 anyway: FP32 storage's run
        j["name"] = "f1-" + tag;
        j["distributed"] = {{"zero", 1}};
        const RunResult f1 = test::run_on_threads(world, j);
        CHECK(f1.step_losses == z1.step_losses);
        CHECK(test::evals(f1) == test::evals(z1));
        const int64_t n = int64_t(f1.final_params.size());
        const Checkpoint x = load_checkpoint(fs::path(f1.dir) / "checkpoint.bin", n);
        const Checkpoint y = load_checkpoint(fs::path(z1.dir) / "checkpoint.bin", n);
        CHECK(x.values == y.values);
        CHECK(x.m == y.m);
        CHECK(x.v == y.v);
      }
    }
}

TEST_CASE("cuda backend: primary_weights bf16 / fp8 accepted by the config" * doctest::test_suite("host")) {
  json j = test::zero3_config("x.txt", "runs", "cfg", 40, "bf16", "cuda");
  for (const char* form : {"bf16", "fp8"}) {
    j["distributed"] = {{"zero", 3}, {"primary_weights", form}, {"gather", form}};
    const RunConfig c = config_from_json(j);
    CHECK(c.distributed.primary_weights != Storage::fp32);
    CHECK(c.distributed.shard_cast);
  }
}
