// The window stores' tests' tensors and values (tests/train/dist/test_store_window.cpp on the host stores,
// tests/train/cuda/test_store_window_cuda.cpp on the device stores), and their oracle: one host store of one
// rank casting every tensor whole (no shards, no windows).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "train/dist/primary_weights.hpp"
#include "train/run.hpp"

namespace fp4lab::train::test {

// Odd shapes (partial tiles, an odd column count: a byte shared by two ranks) at offsets with gaps.
inline const std::vector<FlatTensor> kWindowTensors = {
    {37, 45, 3}, {20, 33, 3 + 37 * 45 + 5}, {1, 7, 3 + 37 * 45 + 5 + 20 * 33}};
inline constexpr int64_t kWindowFlat = 3 + 37 * 45 + 5 + 20 * 33 + 7 + 2;

inline std::vector<float> window_values() {
  std::mt19937 g(46);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(kWindowFlat);
  for (float& x : v) x = d(g);
  v[10] = 300.0f;  // one large element: a tile and a tensor scale away from the rest
  return v;
}

struct WholeCast {
  std::vector<uint8_t> packed;
  std::vector<float> dequant;  // `flat` with the tensors' elements dequantized
};

// The oracle: one host store of one rank casts every tensor whole.
inline WholeCast whole_cast(Storage s, const std::vector<float>& flat) {
  WholeCast w;
  auto comms = make_thread_comms(1);
  auto be = make_cpu_backend(1);
  auto store = be->make_cast_store(s, kWindowTensors);
  run_cast(*comms[0], *be, *store, flat.data(), std::vector<ShardRange>{{0, kWindowFlat}}, false);
  w.packed.assign(store->packed().begin(), store->packed().end());
  w.dequant = flat;
  store->dequantize(w.dequant.data());
  return w;
}

}  // namespace fp4lab::train::test
