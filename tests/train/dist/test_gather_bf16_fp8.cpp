// BF16 and FP8 (E4M3, one scale a tensor) parameter storage and their gathers (train/param_storage.hpp;
// distributed.primary_weights / gather "bf16", "fp8"), on in-process thread ranks (sums in rank order).
// Oracles, each independent of the code it checks:
//   - the stored values: a BF16 rounding written here (integer round to nearest even on the FP32 bits, not
//     core's codec) with ties, NaN, Inf, overflow, subnormals and -0; sim's quantize(fp8_e4m3_tensor) tensor
//     by tensor; both at every split (1-3 even ranks, odd offsets), cast shard by shard and whole;
//   - under the bf16 recipe (whose linear layers round W to BF16 anyway) BF16 storage equals FP32 storage in
//     every loss, evaluation and checkpoint array;
//   - ZeRO-3 with the storage's gather equals ZeRO-1 with the same storage bit for bit on 1, 2, 3 ranks;
//   - CountingComm: the weights' gather moves half (bf16) or a quarter (fp8) of the FP32 gather's bytes.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sim/quantizer.hpp"
#include "train/checkpoint.hpp"
#include "train/dist/counting_comm.hpp"
#include "train/dist/data_parallel.hpp"
#include "train/dist/primary_weights.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"
#include "train/thread_ranks.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// FP32 -> BF16 code, round to nearest even, by integer arithmetic on the bits (the classic form): add 0x7FFF
// plus the kept part's lowest bit and keep the high 16 bits. A carry into the exponent rounds up a binade,
// past the largest finite to Inf; Inf, -0 and subnormals come out right by the same rule. NaN (either sign,
// any payload): the canonical code 0x7FFF.
uint32_t ref_bf16_code(float x) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}
// Its FP32 value: the code widened, NaN read back as FP32's default quiet NaN 0x7FC00000 (what every reader
// of a BF16 NaN gets from core's decode, the layers' BF16 rounding included).
float ref_bf16(float x) {
  const uint32_t c = ref_bf16_code(x);
  return c == 0x7FFFu ? float_of(0x7FC00000u) : float_of(c << 16);
}

// Runs f(comm) on n thread ranks.
template <class F>
void on_threads(int n, F f) {
  auto comms = make_thread_comms(n);
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r) t.emplace_back([&, r] { f(*comms[size_t(r)]); });
  for (auto& th : t) th.join();
}

// run_cast of a host store of storage s over `shards` (each rank its shard, or every rank the whole), then
// the dequantized values of rank r into out[r] (a copy of `flat` with the tensors' elements replaced).
std::vector<std::vector<float>> cast_on_ranks(Storage s, std::span<const FlatTensor> tensors,
                                              const std::vector<float>& flat, const std::vector<ShardRange>& shards,
                                              bool shard_cast) {
  const int n = int(shards.size());
  std::vector<std::vector<float>> out(size_t(n), flat);
  on_threads(n, [&](Communicator& c) {
    auto be = make_cpu_backend(1);
    auto store = be->make_cast_store(s, tensors);
    CHECK(store->storage() == s);
    run_cast(c, *be, *store, flat.data(), shards, shard_cast);
    store->dequantize(out[size_t(c.rank())].data());
  });
  return out;
}

// The first element whose bits differ ("" where none), with both bit patterns, for the failure message.
std::string first_difference(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return "sizes " + std::to_string(got.size()) + " and " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (bits_of(got[i]) != bits_of(want[i]))
      return "element " + std::to_string(i) + ": got bits " + std::to_string(bits_of(got[i])) + ", want " +
             std::to_string(bits_of(want[i]));
  return "";
}

// Every split the shard tests use: 1-3 even ranks, then 2 and 3 ranks cut at odd offsets.
std::vector<std::vector<ShardRange>> splits(int64_t total) {
  std::vector<std::vector<ShardRange>> out;
  for (int n = 1; n <= 3; ++n) out.push_back(even_shards(total, n));
  for (int64_t off : {int64_t(1), int64_t(17), int64_t(333)}) {
    out.push_back({{0, off}, {off, total}});
    out.push_back({{0, off}, {off, 2 * off + 1}, {2 * off + 1, total}});
  }
  return out;
}

}  // namespace

TEST_CASE("BF16 storage: the cast at every split is an independent RNE of the masters (ties, NaN, Inf, -0)") {
  const FlatTensor tensors[] = {{13, 29, 3}, {8, 8, 400}, {1, 5, 470}};  // gaps between them stay FP32
  std::vector<float> flat(480);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : flat) v = nd(rng) * 0.05f;
  // The edges, inside the first tensor: ties to even (down and up), just above a tie, NaN of either sign,
  // +-Inf, past BF16's largest finite (rounds to Inf) and just below the rounding point (stays finite),
  // +-0, FP32 subnormals (a tie among them too), the largest finite float.
  const uint32_t edges[] = {0x3F808000u, 0x3F818000u, 0x3F808001u, 0x7FC00001u, 0xFFC00000u, 0x7F800000u,
                            0xFF800000u, 0x7F7F8000u, 0x7F7F7FFFu, 0x00000000u, 0x80000000u, 0x00000001u,
                            0x80018000u, 0x00008000u, 0x00018000u, 0x7F7FFFFFu, 0xBF7FFFFFu, 0x3B7F8000u};
  for (size_t i = 0; i < std::size(edges); ++i) flat[3 + 2 * i] = float_of(edges[i]);
  std::vector<float> want = flat;
  for (const FlatTensor& t : tensors)
    for (int64_t i = 0; i < t.rows * t.cols; ++i) want[size_t(t.offset + i)] = ref_bf16(flat[size_t(t.offset + i)]);
  // The oracle's own spot checks: a tie rounds to even, a carry rounds past the largest finite to Inf.
  CHECK(bits_of(ref_bf16(float_of(0x3F808000u))) == 0x3F800000u);
  CHECK(bits_of(ref_bf16(float_of(0x3F818000u))) == 0x3F820000u);
  CHECK(bits_of(ref_bf16(float_of(0x7F7F8000u))) == 0x7F800000u);
  CHECK(bits_of(ref_bf16(float_of(0x80000000u))) == 0x80000000u);
  CHECK(ref_bf16_code(float_of(0xFFC00000u)) == 0x7FFFu);
  for (const auto& shards : splits(int64_t(flat.size())))
    for (bool shard_cast : {true, false}) {
      CAPTURE(shards.size());
      CAPTURE(shards[0].end);
      CAPTURE(shard_cast);
      for (const auto& got : cast_on_ranks(Storage::bf16, tensors, flat, shards, shard_cast))
        CHECK(first_difference(got, want) == "");
    }
  // The codes themselves: two bytes an element, little-endian, the tensors back to back; no scale, so
  // nothing to MAX-reduce.
  auto be = make_cpu_backend(1);
  auto store = be->make_cast_store(Storage::bf16, tensors);
  store->partial_amax(flat.data(), {0, int64_t(flat.size())});
  store->compute_scales();
  store->cast(flat.data(), {0, int64_t(flat.size())});
  std::vector<uint8_t> want_codes;
  for (const FlatTensor& t : tensors)
    for (int64_t i = 0; i < t.rows * t.cols; ++i) {
      const uint32_t c = ref_bf16_code(flat[size_t(t.offset + i)]);
      want_codes.push_back(uint8_t(c & 0xFFu));
      want_codes.push_back(uint8_t(c >> 8));
    }
  const std::span<uint8_t> codes = store->packed();
  CHECK(std::vector<uint8_t>(codes.begin(), codes.end()) == want_codes);
  CHECK(codes[2 * 6] == 0xFF);  // the first tensor's element 6 (edges[3]): NaN 0x7FC00001, the canonical 0x7FFF
  CHECK(codes[2 * 6 + 1] == 0x7F);
  CHECK(store->amax().empty());
  CHECK(store->bytes() == 2 * (13 * 29 + 64 + 5));
}

TEST_CASE("FP8 storage: the cast at every split equals quantize(fp8_e4m3_tensor) tensor by tensor") {
  // A tensor of wide range, an all-zero tensor (amax 0: scale 1), one with an Inf (amax Inf: scale 1, the Inf
  // saturating to 448) and a NaN, and a tiny-valued one (scales far from 1).
  const FlatTensor tensors[] = {{13, 29, 3}, {8, 8, 400}, {3, 5, 470}, {7, 3, 490}};
  std::vector<float> flat(520);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : flat) v = nd(rng) * 0.05f;
  flat[10] = 3000.0f, flat[11] = -1e-30f;
  for (int64_t i = 0; i < 64; ++i) flat[size_t(400 + i)] = (i % 2) ? 0.0f : -0.0f;
  flat[472] = std::numeric_limits<float>::infinity();
  flat[475] = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < 21; ++i) flat[size_t(490 + i)] = nd(rng) * 1e-20f;
  const QuantizerSpec& q = quantizer_by_name("fp8_e4m3_tensor");
  CHECK(storage_cast(Storage::fp8_e4m3) != nullptr);
  CHECK(*storage_cast(Storage::fp8_e4m3) == q);
  std::vector<float> want = flat;
  for (const FlatTensor& t : tensors) {
    const QuantizedTensor r = quantize(q, MatrixView<const float>(flat.data() + t.offset, t.rows, t.cols));
    std::copy(r.dequant.begin(), r.dequant.end(), want.begin() + t.offset);
  }
  CHECK(want[472] == 448.0f);  // Inf saturated (the scale is 1)
  for (const auto& shards : splits(int64_t(flat.size())))
    for (bool shard_cast : {true, false}) {
      CAPTURE(shards.size());
      CAPTURE(shards[0].end);
      CAPTURE(shard_cast);
      for (const auto& got : cast_on_ranks(Storage::fp8_e4m3, tensors, flat, shards, shard_cast))
        CHECK(first_difference(got, want) == "");
    }
  auto be = make_cpu_backend(1);
  auto store = be->make_cast_store(Storage::fp8_e4m3, tensors);
  CHECK(store->amax().size() == 4);  // one maximum a tensor, no tiles
  CHECK(store->bytes() == (13 * 29 + 64 + 15 + 21) + 4 * 4);
}

namespace {

struct Scratch {
  fs::path dir = test::scratch_dir("fp4lab_gbf_");
  std::string text = (dir / "text.txt").string(), out = (dir / "runs").string();
  Scratch() { std::ofstream(text) << test::words_corpus(); }
  ~Scratch() { fs::remove_all(dir); }
};

json model_config(const Scratch& s, const std::string& name, const std::string& recipe) {
  return test::zero3_config(s.text, s.out, name, 40, recipe);
}

}  // namespace

TEST_CASE("bf16 recipe: BF16 primary weights equal FP32 storage in every loss, evaluation and checkpoint") {
  Scratch s;
  for (int world : {1, 3}) {
    CAPTURE(world);
    json j = model_config(s, "fp32-" + std::to_string(world), "bf16");
    j["distributed"] = {{"zero", 1}};
    const RunResult f = test::run_on_threads(world, j);
    j["name"] = "bf16-" + std::to_string(world);
    j["distributed"] = {{"zero", 1}, {"primary_weights", "bf16"}};
    const RunResult b = test::run_on_threads(world, j);
    REQUIRE(b.status == "completed");
    CHECK(b.step_losses == f.step_losses);
    CHECK(test::evals(b) == test::evals(f));
    const int64_t n = int64_t(f.final_params.size());
    const Checkpoint x = load_checkpoint(fs::path(f.dir) / "checkpoint.bin", n);
    const Checkpoint y = load_checkpoint(fs::path(b.dir) / "checkpoint.bin", n);
    CHECK(x.values == y.values);
    CHECK(x.m == y.m);
    CHECK(x.v == y.v);
    // The model's values: the masters, rounded to BF16 (the oracle above) where stored; so they differ.
    CHECK(f.final_params == x.values);
    CHECK(b.final_params != y.values);
    size_t rounded = 0;
    for (size_t i = 0; i < y.values.size(); ++i) {
      const bool kept = bits_of(b.final_params[i]) == bits_of(y.values[i]);
      const bool bf = bits_of(b.final_params[i]) == bits_of(ref_bf16(y.values[i]));
      CHECK((kept || bf));
      rounded += !kept;
    }
    CHECK(rounded > y.values.size() / 2);  // the block weights are most of the model
    CHECK(b.summary["distributed"]["storage"] == "bf16");
  }
  // The pair can differ: under the fp32 recipe (whose layers take W as it is) BF16 storage is weight-only BF16.
  json j = model_config(s, "fp32r-fp32", "fp32");
  j["distributed"] = {{"zero", 1}};
  const RunResult f = test::run_on_threads(1, j);
  j["name"] = "fp32r-bf16";
  j["distributed"] = {{"zero", 1}, {"primary_weights", "bf16"}};
  CHECK(test::run_on_threads(1, j).step_losses != f.step_losses);
}

TEST_CASE("ZeRO-3 gather bf16 / fp8 equals ZeRO-1 primary bf16 / fp8 bit for bit on 1, 2 and 3 thread ranks") {
  Scratch s;
  for (const char* form : {"bf16", "fp8"})
    for (const char* recipe : {"bf16", "fp32"})
      for (int world : {1, 2, 3}) {
        CAPTURE(form);
        CAPTURE(recipe);
        CAPTURE(world);
        const std::string tag = std::string(form) + "-" + recipe + "-" + std::to_string(world);
        json j = model_config(s, "z1-" + tag, recipe);
        j["distributed"] = {{"zero", 1}, {"primary_weights", form}};
        const RunResult z1 = test::run_on_threads(world, j);
        j["name"] = "z3-" + tag;
        j["distributed"] = {{"zero", 3}, {"primary_weights", form}, {"gather", form}};
        const RunResult z3 = test::run_on_threads(world, j);
        test::check_same_run(z1, z3, 3);
        const json& m = z3.summary["distributed"];
        CHECK(m["gather"] == form);
        CHECK(m["reshard_after_forward"] == false);  // the codes kept from forward to backward
        CHECK(m["stored_bytes"].get<int64_t>() > 0);
        // The layers saw the cast, not the masters: the final values differ from the checkpoint's masters.
        const Checkpoint c = load_checkpoint(fs::path(z3.dir) / "checkpoint.bin", int64_t(z3.final_params.size()));
        CHECK(c.values != z3.final_params);
        if (world == 3) {  // the codes gathered again in the backward: the same run
          j["name"] = "z3r-" + tag;
          j["distributed"]["reshard_after_forward"] = true;
          test::check_same_run(z1, test::run_on_threads(world, j), 3);
        }
        if (world == 3) {  // the FP32 gather (every rank casts the gathered masters whole): the same run
          j["name"] = "z3f-" + tag;
          j["distributed"] = {{"zero", 3}, {"primary_weights", form}, {"gather", "fp32"}};
          test::check_same_run(z1, test::run_on_threads(world, j), 3);
        }
      }
}

namespace {

// One ZeRO-3 step over two stored weights around an FP32 bias (units: root {bias}, {a.weight}, {b.weight};
// both weights of 3k elements, so 3 ranks hold equal parts), rank 0's counts of step 0.
std::map<std::string, CollectiveCounts> zero3_step(int N, Storage form, const DistributedConfig& dc) {
  auto comms = make_thread_comms(N);
  std::map<std::string, CollectiveCounts> out;
  std::vector<std::thread> t;
  for (int r = 0; r < N; ++r)
    t.emplace_back([&, r] {
      CountingComm c(*comms[size_t(r)]);
      auto be = make_cpu_backend(1);
      ParamStore ps;
      ps.add("a.weight", 18, 37, true, Init::normal, 0.5f);
      ps.add("a.bias", 1, 19, false, Init::normal, 0.1f);
      ps.add("b.weight", 33, 17, true, Init::normal, 0.5f);
      ps.finalize(*be, 7);
      const int stored[] = {0, 2};
      ps.set_storage(stored, form, *be);
      DataParallel dp(c, *be, ps, AdamWConfig{}, dc, {{1}, {0}, {2}});
      c.set_step(0);
      dp.begin_step(1.0f, 1.0 / N);
      for (int i : {1, 0, 2}) CHECK(ps.value_ptr(i) != nullptr);
      for (int i : {2, 0, 1}) {
        float* g = ps.grad_ptr(i);
        for (int64_t k = 0; k < ps.info(i).size(); ++k) g[k] = 0.01f * float(k % 13);
      }
      dp.step(1e-3);
      if (r == 0) out = c.counts().at(0);
    });
  for (auto& th : t) th.join();
  return out;
}

}  // namespace

TEST_CASE("ZeRO-3 gather bf16 / fp8 with CountingComm: half / a quarter of the FP32 gather's bytes") {
  const int N = 3;
  const int64_t weights = 18 * 37 + 33 * 17;  // 666 + 561, both multiples of 3
  for (Storage form : {Storage::bf16, Storage::fp8_e4m3}) {
    CAPTURE(storage_name(form));
    DistributedConfig codes;
    codes.zero = 3;
    codes.primary_weights = form;  // shard_cast true: the storage's gather, codes kept forward to backward
    DistributedConfig fp32 = codes;
    fp32.shard_cast = false;         // gather fp32: the masters travel
    fp32.reshard_after_forward = 0;  // each unit gathered once a step, as the codes are
    const auto f = zero3_step(N, form, fp32), q = zero3_step(N, form, codes);
    CHECK(f.at("allgather").calls == 3);
    CHECK(f.at("allgather").bytes_out == 4 * (weights + 19));
    CHECK(f.count("allgather_equal") == 0);
    CHECK(q.at("allgather").calls == 1);  // the root's bias, in FP32
    CHECK(q.at("allgather").bytes_out == 4 * 19);
    CHECK(q.at("allgather_equal").calls == 2);
    const int64_t b = code_bytes(form);
    CHECK(q.at("allgather_equal").bytes_out == b * weights);
    const int64_t fp32_weights_ring = f.at("allgather").ring_bytes - 4 * (19 - 7);  // the root's ring: 19 - 7
    CHECK(q.at("allgather_equal").ring_bytes * 4 == fp32_weights_ring * b);
    CHECK(q.count("allreduce_max") == (form == Storage::fp8_e4m3 ? 1u : 0u));  // per-tensor amax: fp8 only
    CHECK(q.at("reduce_scatter_sum") == f.at("reduce_scatter_sum"));
    MESSAGE(storage_name(form), ": weight gather ring bytes ", q.at("allgather_equal").ring_bytes, " against ",
            fp32_weights_ring, " in FP32");
  }
}

TEST_CASE("distributed.primary_weights bf16 / fp8 and their gathers: the config, one line for bad values") {
  Scratch s;
  json c = model_config(s, "cfg", "bf16");
  c["distributed"] = {{"zero", 3}, {"primary_weights", "fp8"}, {"gather", "bf16"}};
  CHECK(test::config_error(c).find("config.distributed.gather: \"bf16\" needs config.distributed.primary_weights "
                                   "\"bf16\" (the weights travel as their stored cast); valid with primary_weights "
                                   "fp8: \"fp32\", \"fp8\"") != std::string::npos);
  c["distributed"] = {{"zero", 1}, {"primary_weights", "fp4"}};
  CHECK(test::config_error(c).find("config.distributed.primary_weights: \"fp4\" is not valid; valid: fp32, bf16, "
                                   "fp8, nvfp4") != std::string::npos);
  c["distributed"] = {{"zero", 1}, {"primary_weights", "bf16"}, {"gather", "fp32"}, {"shard_cast", true}};
  CHECK(test::config_error(c).find("config.distributed.gather \"fp32\" and config.distributed.shard_cast true "
                                   "disagree") != std::string::npos);
  // Written back as given: gather only when given, primary_weights by its config name.
  c["distributed"] = {{"zero", 3}, {"primary_weights", "fp8"}};
  json w = config_to_json(config_from_json(c));
  CHECK(w["distributed"]["primary_weights"] == "fp8");
  CHECK(!w["distributed"].contains("gather"));
  c["distributed"]["gather"] = "fp8";
  w = config_to_json(config_from_json(c));
  CHECK(w["distributed"]["gather"] == "fp8");
  CHECK(w["distributed"]["shard_cast"] == true);
  // Earlier runs' sections are written as before the enums (so their config.json and config_hash stay): the
  // objects main's writer produced for these inputs.
  const std::pair<json, std::string> earlier[] = {
      {{{"zero", 1}}, R"({"primary_weights":"fp32","shard_cast":true,"zero":1})"},
      {{{"zero", 1}, {"primary_weights", "nvfp4"}}, R"({"primary_weights":"nvfp4","shard_cast":true,"zero":1})"},
      {{{"zero", 1}, {"primary_weights", "nvfp4"}, {"shard_cast", false}},
       R"({"primary_weights":"nvfp4","shard_cast":false,"zero":1})"},
      {{{"zero", 3}, {"primary_weights", "nvfp4"}, {"gather", "nvfp4"}},
       R"({"gather":"nvfp4","primary_weights":"nvfp4","shard_cast":true,"zero":3})"},
      {{{"zero", 3}, {"primary_weights", "nvfp4"}, {"gather", "fp32"}},
       R"({"gather":"fp32","primary_weights":"nvfp4","shard_cast":false,"zero":3})"},
      {{{"zero", 3}, {"gather", "fp32"}}, R"({"gather":"fp32","primary_weights":"fp32","shard_cast":true,"zero":3})"}};
  for (const auto& [d, want] : earlier) {
    CAPTURE(d.dump());
    c["distributed"] = d;
    CHECK(config_to_json(config_from_json(c))["distributed"].dump() == want);
  }
  c.erase("distributed");
  CHECK(!config_to_json(config_from_json(c)).contains("distributed"));
}
