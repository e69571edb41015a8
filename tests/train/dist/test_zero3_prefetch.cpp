// ZeRO-3's prefetch (train/dist/sharded_params.hpp; distributed.prefetch): entering a unit starts the next
// unit's gather with the collectives' start forms. The host engines finish a started collective at once, which
// would hide a read before the wait; so these runs put around every thread rank a communicator that delays a
// started gather to its wait() (a PendingCollective that has not run yet: its output holds whatever the
// allocator left there, its input is read only then). A ShardedParams that read a prefetched unit before its
// wait, or changed an input between start and wait, would give other bits. Oracle: the same run with prefetch
// off on the plain thread communicator (itself equal to ZeRO-1: test_zero3_training.cpp, test_zero3_nvfp4.cpp,
// test_gather_bf16_fp8.cpp). Also: the same collectives, calls and bytes, with and without prefetch (CountingComm,
// summary.json's distributed.collectives), and the config key.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "train/config.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"
#include "train/thread_ranks.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Forwards every call; the start forms return a collective that runs (the blocking form) only in its wait(),
// or when destroyed unwaited. Every rank runs its collectives in its program's order, which is the same on
// every rank, so the thread engine still matches them.
class DelayedComm final : public Communicator {
 public:
  // `started` counts the start forms called (outlives the communicator).
  DelayedComm(Communicator& inner, int64_t& started) : started(started), inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int world() const override { return inner_.world(); }
  std::string name() const override { return inner_.name(); }
  bool device_buffers() const override { return inner_.device_buffers(); }
  void allreduce_max(std::span<uint32_t> v) override { sync(), inner_.allreduce_max(v); }
  void allreduce_sum(std::span<float> v) override { sync(), inner_.allreduce_sum(v); }
  void allreduce_sum(std::span<double> v) override { sync(), inner_.allreduce_sum(v); }
  void reduce_scatter_sum(std::span<const float> full, std::span<const ShardRange> shards,
                          std::span<float> mine) override {
    sync(), inner_.reduce_scatter_sum(full, shards, mine);
  }
  void allgather(std::span<const float> mine, std::span<const ShardRange> shards, std::span<float> full) override {
    sync(), inner_.allgather(mine, shards, full);
  }
  std::vector<std::vector<uint8_t>> allgather_bytes(std::span<const uint8_t> mine) override {
    sync();
    return inner_.allgather_bytes(mine);
  }
  void allgather_equal(std::span<const uint8_t> mine, std::span<uint8_t> all) override {
    sync(), inner_.allgather_equal(mine, all);
  }
  void alltoallv(std::span<const uint8_t> send, std::span<const int64_t> send_counts, std::span<uint8_t> recv,
                 std::span<const int64_t> recv_counts, size_t unit_bytes) override {
    sync(), inner_.alltoallv(send, send_counts, recv, recv_counts, unit_bytes);
  }
  void barrier() override { sync(), inner_.barrier(); }

  std::unique_ptr<PendingCollective> allgather_start(std::span<const float> mine, std::span<const ShardRange> shards,
                                                     std::span<float> full) override {
    ++started;
    std::vector<ShardRange> s(shards.begin(), shards.end());
    return std::make_unique<Later>([this, mine, s, full] { inner_.allgather(mine, s, full); });
  }
  std::unique_ptr<PendingCollective> allgather_equal_start(std::span<const uint8_t> mine,
                                                           std::span<uint8_t> all) override {
    ++started;
    return std::make_unique<Later>([this, mine, all] { inner_.allgather_equal(mine, all); });
  }
  int64_t& started;

 private:
  struct Later final : PendingCollective {
    explicit Later(std::function<void()> f) : run(std::move(f)) {}
    ~Later() override { wait(); }
    void wait() override {
      if (run) std::exchange(run, nullptr)();
    }
    std::function<void()> run;
  };
  // The step and timeout handed on (as CountingComm does).
  void sync() {
    inner_.set_step(step());
    inner_.set_timeout(timeout());
  }
  Communicator& inner_;
};

struct Scratch {
  fs::path dir = test::scratch_dir("fp4lab_z3pf_");
  std::string text = (dir / "text.txt").string(), out = (dir / "runs").string();
  Scratch() { std::ofstream(text) << test::words_corpus(); }
  ~Scratch() { fs::remove_all(dir); }
};

struct Form {
  const char* name;
  const char* recipe;
  json distributed;     // zero 3's keys but prefetch
  int64_t codes_bytes;  // a block's full packed buffer (largest_unit_codes_bytes)
};

const Form kForms[] = {
    {"fp32 masters", "fp32", {{"zero", 3}}, 0},
    {"nvfp4 codes kept", "nvfp4", {{"zero", 3}, {"primary_weights", "nvfp4"}, {"gather", "nvfp4"}}, 9600},
    {"nvfp4 codes regathered",
     "nvfp4",
     {{"zero", 3}, {"primary_weights", "nvfp4"}, {"gather", "nvfp4"}, {"reshard_after_forward", true}},
     9600},
    {"nvfp4 storage, fp32 gather", "nvfp4", {{"zero", 3}, {"primary_weights", "nvfp4"}, {"gather", "fp32"}}, 9600},
    {"bf16 codes", "bf16", {{"zero", 3}, {"primary_weights", "bf16"}, {"gather", "bf16"}}, 38400},
    {"fp8 codes", "bf16", {{"zero", 3}, {"primary_weights", "fp8"}, {"gather", "fp8"}}, 19200},
    {"fp32 masters, bf16 reduce", "fp32", {{"zero", 3}, {"reduce", "bf16"}}, 0},
};

}  // namespace

TEST_CASE("ZeRO-3 prefetch: every gather started early and delayed to its wait gives the bits of no prefetch") {
  Scratch s;
  for (const Form& f : kForms)
    for (int world : {2, 3}) {
      const std::string tag = std::string(f.name) + "-" + std::to_string(world);
      CAPTURE(tag);
      json j = test::zero3_config(s.text, s.out, "off-" + tag, 40, f.recipe);
      j["model"]["layers"] = 3;  // units: the root and three blocks (a middle one prefetched both ways)
      j["distributed"] = f.distributed;
      j["distributed"]["prefetch"] = false;
      const RunResult off = test::run_on_threads(world, j);
      j["name"] = "on-" + tag;
      j["distributed"]["prefetch"] = true;
      std::vector<int64_t> started(size_t(world), 0);  // per rank
      const RunResult on = test::run_on_threads(world, j, false, -1, [&](Communicator& c) {
        return std::unique_ptr<Communicator>(std::make_unique<DelayedComm>(c, started[size_t(c.rank())]));
      });
      test::check_same_run(off, on, 3);
      // The prefetch ran: gathers were started (and delayed), every rank the same number.
      CHECK(started[0] > 0);
      for (int64_t n : started) CHECK(n == started[0]);
      // The same collectives, calls and bytes (rank 0's counts of the first step and of the whole run).
      CHECK(on.summary["distributed"]["collectives"] == off.summary["distributed"]["collectives"]);
      CHECK(on.summary["distributed"]["prefetch"] == true);
      CHECK(off.summary["distributed"]["prefetch"] == false);
      // One more unit's values in flight, and its stored tensors' full packed buffer (the blocks of width 40:
      // 19,200 stored elements; nvfp4 0.5 B an element, fp8 1, bf16 2; none where nothing is stored).
      const int64_t largest = on.summary["distributed"]["largest_unit_bytes"].get<int64_t>();
      const int64_t codes = on.summary["distributed"]["largest_unit_codes_bytes"].get<int64_t>();
      CHECK(codes == f.codes_bytes);
      CHECK(on.summary["distributed"]["in_flight_bytes"].get<int64_t>() -
                off.summary["distributed"]["in_flight_bytes"].get<int64_t>() ==
            largest + codes);
    }
}

TEST_CASE("distributed.prefetch: zero 3 only; written back only when given; not part of the run's identity") {
  json c = test::zero3_config("x.txt", "runs", "cfg", 40);
  c["distributed"] = {{"zero", 1}, {"prefetch", true}};
  CHECK(test::config_error(c).find("config.distributed.prefetch: only with distributed.zero 3 (ZeRO-3), not zero 1") !=
        std::string::npos);
  c["distributed"] = {{"zero", 3}, {"prefetch", "yes"}};
  CHECK(test::config_error(c).find("distributed.prefetch") != std::string::npos);
  c["distributed"] = {{"zero", 3}};
  const RunConfig absent = config_from_json(c);
  CHECK(absent.distributed.prefetch == -1);
  CHECK_FALSE(config_to_json(absent)["distributed"].contains("prefetch"));
  for (bool on : {false, true}) {
    c["distributed"]["prefetch"] = on;
    const RunConfig given = config_from_json(c);
    CHECK(given.distributed.prefetch == int(on));
    CHECK(config_to_json(given)["distributed"]["prefetch"] == on);
    CHECK(config_hash(config_to_json(given)) == config_hash(config_to_json(absent)));
  }
}
