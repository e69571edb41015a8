// The cuda backend's cast stores keeping only this rank's window (CastStore::keep_window / release_packed /
// restore_packed; train/cuda/cast_store.cpp), on thread ranks of one GPU (the windows assembled through the
// host: a host communicator and device stores). The oracle is the host (cpu backend) store casting every
// tensor whole on one rank: the device rank's restored and gathered buffer equals its bytes, for all three
// stored forms. Also: the NVFP4 stored form's pointers follow the buffer (null while released, into the
// restored buffer after), and the buffer comes from the backend's pool (device_memory counts it).
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device.hpp"
#include "sim/shard_cast.hpp"
#include "train/cuda/cast_store.hpp"
#include "train/dist/primary_weights.hpp"
#include "train/run.hpp"
#include "train/store_window_fixture.hpp"

using namespace fp4lab;
using namespace fp4lab::train;

using test::kWindowFlat;
using test::kWindowTensors;

namespace {

std::vector<uint8_t> download_bytes(std::span<uint8_t> device) {
  std::vector<uint8_t> h(device.size());
  if (!h.empty()) cuda::check(cudaMemcpy(h.data(), device.data(), h.size(), cudaMemcpyDeviceToHost), "download");
  return h;
}

}  // namespace

TEST_CASE("cuda stores keeping their window: restored and gathered, the host store's whole cast on 1-3 ranks") {
  const std::vector<float> flat = test::window_values();
  for (Storage s : {Storage::nvfp4_2d, Storage::bf16, Storage::fp8_e4m3}) {
    const std::vector<uint8_t> want = test::whole_cast(s, flat).packed;
    for (int n = 1; n <= 3; ++n) {
      CAPTURE(storage_name(s));
      CAPTURE(n);
      const std::vector<ShardRange> shards = even_shards(kWindowFlat, n);
      auto comms = make_thread_comms(n);
      std::vector<std::vector<uint8_t>> got(static_cast<size_t>(n));
      std::vector<int> forms_null(static_cast<size_t>(n), -1), forms_follow(static_cast<size_t>(n), -1);
      std::vector<int64_t> pool_drop(static_cast<size_t>(n), -1);
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
          Communicator& c = *comms[size_t(r)];
          auto be = make_cuda_backend();
          train::Tensor x = be->empty(1, kWindowFlat);
          be->upload(flat.data(), x);
          auto store = be->make_cast_store(s, kWindowTensors);
          const ShardRange own = shards[size_t(r)];
          store->partial_amax(x.data, own);
          if (!store->amax().empty()) {  // device maxima through the host (a host communicator)
            std::vector<uint32_t> h(store->amax().size());
            cuda::check(cudaMemcpy(h.data(), store->amax().data(), h.size() * 4, cudaMemcpyDeviceToHost), "amax");
            c.allreduce_max(h);
            cuda::check(cudaMemcpy(store->amax().data(), h.data(), h.size() * 4, cudaMemcpyHostToDevice), "amax");
          }
          store->compute_scales();
          store->cast(x.data, own);
          const PackedWindows w = store->windows(shards);
          store->keep_window(w.at[size_t(r)], w.size);
          const int64_t before = be->device_memory()->tensors_in_use;
          store->release_packed();
          be->synchronize();
          pool_drop[size_t(r)] = before - be->device_memory()->tensors_in_use;
          const auto* form = dynamic_cast<const StoredNvfp4*>(store->stored(0));
          if (form) forms_null[size_t(r)] = form->form.packed == nullptr;
          store->restore_packed();
          gather_windows(c, *be, *store, shards);
          if (form) forms_follow[size_t(r)] = form->form.packed == store->packed().data();
          got[size_t(r)] = download_bytes(store->packed());
        });
      for (auto& t : threads) t.join();
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        CHECK(got[size_t(r)] == want);
        CHECK(pool_drop[size_t(r)] >= int64_t(want.size()));  // the full buffer was the pool's
        if (s == Storage::nvfp4_2d) {
          CHECK(forms_null[size_t(r)] == 1);
          CHECK(forms_follow[size_t(r)] == 1);
        }
      }
    }
  }
}
