// A cast store that holds only this rank's window between uses (CastStore::keep_window / release_packed /
// restore_packed, train/param_storage.hpp; what ZeRO-3 does with each unit's store, sharded_params.hpp), on
// the cpu backend's host stores, on thread ranks. The oracle is another path: one store casting every tensor
// whole on one rank (no shards, no windows). Each rank casts its shard, keeps its window, releases the full
// buffer, restores it and ORs every rank's window in: the full buffer must equal the whole cast byte for
// byte, and so must the dequantized values; a released buffer refuses the steps that need it; bytes()
// counts the window, not the buffer. And ZeRO-3's summary: the stored bytes of a rank of 3 are about a third
// of one rank's.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "train/dist/primary_weights.hpp"
#include "train/run.hpp"
#include "train/store_window_fixture.hpp"
#include "train/text_fixture.hpp"
#include "train/thread_ranks.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

using test::kWindowFlat;
using test::kWindowTensors;

TEST_CASE("a store keeping only its window: restored and gathered, the whole cast byte for byte on 1-3 ranks") {
  const std::vector<float> flat = test::window_values();
  for (Storage s : {Storage::nvfp4_2d, Storage::bf16, Storage::fp8_e4m3}) {
    const test::WholeCast want = test::whole_cast(s, flat);
    for (int n = 1; n <= 3; ++n) {
      CAPTURE(storage_name(s));
      CAPTURE(n);
      const std::vector<ShardRange> shards = even_shards(kWindowFlat, n);
      auto comms = make_thread_comms(n);
      std::vector<std::vector<uint8_t>> got(static_cast<size_t>(n));
      std::vector<std::vector<float>> dequant(static_cast<size_t>(n), flat);
      std::vector<int64_t> bytes_full(static_cast<size_t>(n)), bytes_window(static_cast<size_t>(n)), window(static_cast<size_t>(n));
      std::vector<std::string> refusals(static_cast<size_t>(n));
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
          Communicator& c = *comms[size_t(r)];
          auto be = make_cpu_backend(1);
          auto store = be->make_cast_store(s, kWindowTensors);
          const ShardRange own = shards[size_t(r)];
          store->partial_amax(flat.data(), own);
          if (!store->amax().empty()) c.allreduce_max(store->amax());
          store->compute_scales();
          store->cast(flat.data(), own);
          bytes_full[size_t(r)] = store->bytes();
          const PackedWindows w = store->windows(shards);
          window[size_t(r)] = w.size;
          store->keep_window(w.at[size_t(r)], w.size);
          store->release_packed();
          bytes_window[size_t(r)] = store->bytes();
          if (store->packed().empty() && store->packed_bytes() > 0) {
            try {
              store->dequantize(dequant[size_t(r)].data());
            } catch (const InternalError& e) {
              refusals[size_t(r)] = e.what();
            }
          }
          store->restore_packed();
          gather_windows(c, *be, *store, shards);
          got[size_t(r)].assign(store->packed().begin(), store->packed().end());
          store->dequantize(dequant[size_t(r)].data());
        });
      for (auto& t : threads) t.join();
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        CHECK(got[size_t(r)] == want.packed);
        CHECK(std::memcmp(dequant[size_t(r)].data(), want.dequant.data(), sizeof(float) * size_t(kWindowFlat)) == 0);
        // bytes(): the full buffer before, the window after (the scales unchanged).
        CHECK(bytes_full[size_t(r)] - bytes_window[size_t(r)] == int64_t(want.packed.size()) - window[size_t(r)]);
        if (n > 1) CHECK(window[size_t(r)] < int64_t(want.packed.size()));
        CHECK(refusals[size_t(r)].find("dequantize") != std::string::npos);
        CHECK(refusals[size_t(r)].find("released") != std::string::npos);
      }
    }
  }
}

TEST_CASE("ZeRO-3 with stored weights: a rank of 3 keeps about a third of one rank's stored bytes") {
  const fs::path dir = test::scratch_dir("fp4lab_window_");
  const std::string text = (dir / "text.txt").string(), out = (dir / "runs").string();
  std::ofstream(text) << test::words_corpus();
  for (const char* form : {"nvfp4", "bf16"}) {
    CAPTURE(form);
    json j = test::zero3_config(text, out, std::string("w1-") + form, 40, form);
    j["distributed"] = {{"zero", 3}, {"primary_weights", form}, {"gather", form}};
    const RunResult one = test::run_on_threads(1, j);
    j["name"] = std::string("w3-") + form;
    const RunResult three = test::run_on_threads(3, j);
    const int64_t b1 = one.summary["distributed"]["stored_bytes"].get<int64_t>();
    const int64_t b3 = three.summary["distributed"]["stored_bytes"].get<int64_t>();
    MESSAGE(form, ": stored bytes on 1 rank ", b1, ", on each of 3 ", b3);
    CHECK(3 * b3 >= b1);  // every byte of the codes is in some rank's window
    CHECK(2 * b3 < b1);   // and a rank keeps well under half
  }
  fs::remove_all(dir);
}
