// The dispatch cast's compact transport on the CUDA backend (train/mx_rows.hpp's
// codec in train/cuda/moe_ops.cu): the device's bytes are the CPU backend's
// bytes and its decoded rows the CPU's values (fake_quantize's) bit for bit, a
// NaN as a NaN, for widths with partial last blocks and the rows of
// mx_rows_case.hpp (zeros, E4M3's max, FP32's extremes and subnormals, NaN and
// Inf); and the MoE layer on thread ranks of CUDA backends gives the same bits
// with the compact rows as with the fake-quantized FP32 rows. Without a GPU:
// SKIPPED (gpu_main.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "recipes/recipe.hpp"
#include "train/expert_parallel_case.hpp"
#include "train/mx_rows.hpp"
#include "train/mx_rows_case.hpp"

namespace fp4lab::train {

namespace {

// The same bits, or both NaN: the GPU's float products give the canonical NaN (0x7FFFFFFF) where the CPU's
// keep the NaN operand's bits (0x7FC00000), in the blocks whose scale is NaN.
bool same_values(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::isnan(a[i]) && std::isnan(b[i])) && std::memcmp(&a[i], &b[i], 4) != 0) return false;
  return true;
}

}  // namespace

TEST_CASE("cuda backend, moe dispatch transport: encode_rows_mx / decode_rows_mx equal the CPU backend's") {
  const QuantizerSpec q = *recipe_by_name("mxfp8").operands[size_t(Operand::fwd_x)];
  auto gpu = make_cuda_backend();
  auto cpu = make_cpu_backend(1);
  std::mt19937 rng(4703);
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{24, 32}, {40, 48}, {17, 70}, {9, 1}, {1000, 96}, {0, 70}}) {
    CAPTURE(N);
    CAPTURE(C);
    const std::vector<float> x = test::mx_hard_rows(N, C, rng);
    const int64_t rb = mx_rows(q, C).row_bytes();
    std::vector<float> bytes[2], vals[2], fq[2];
    int i = 0;
    for (Backend* be : {gpu.get(), cpu.get()}) {
      Tensor xt = be->empty(N, C), b = empty_bytes(*be, N * rb), back = be->empty(N, C);
      be->upload(x.data(), xt);
      be->fill(b, 0.0f);
      be->encode_rows_mx(q, xt, b);
      be->decode_rows_mx(q, b, back);
      bytes[i].resize(size_t(b.size())), vals[i].resize(size_t(N * C));
      be->download(b, bytes[i].data());
      be->download(back, vals[i].data());
      be->fake_quantize(xt, q);
      fq[i].resize(size_t(N * C));
      be->download(xt, fq[i].data());
      ++i;
    }
    const auto* b0 = reinterpret_cast<const uint8_t*>(bytes[0].data());
    CHECK(std::equal(b0, b0 + N * rb, reinterpret_cast<const uint8_t*>(bytes[1].data())));
    CHECK(same_values(vals[0], vals[1]));
    CHECK(same_values(vals[0], fq[0]));
    CHECK(test::ep_case::same_bits(vals[1], fq[1]));  // the CPU's decode is fake_quantize's, NaN bits included
  }
}

TEST_CASE("cuda backend, moe dispatch cast mxfp8 under EP: compact rows give the FP32 rows' bits") {
  std::mt19937 rng(4704);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const Recipe recipe = recipe_by_name("mxfp8");
  for (const int R : {2, 4})
    for (const int64_t C : {32, 70}) {
      CAPTURE(R);
      CAPTURE(C);
      MoeConfig c;
      c.experts = 8, c.top_k = 2, c.expert_hidden = 64;
      c.dispatch_cast = MoeConfig::DispatchCast::mxfp8;
      const int64_t n = test::ep_case::kTokens;
      std::vector<float> x(size_t(n * R * C)), dy(x.size()), logits(size_t(n * R * c.experts));
      for (auto& v : x) v = nd(rng);
      for (auto& v : dy) v = nd(rng);
      for (auto& v : logits) v = nd(rng);
      std::vector<test::ep_case::LayerOut> out[2];
      for (const bool compact : {true, false}) {
        auto comms = make_thread_comms(R);
        auto& o = out[compact ? 0 : 1];
        o.resize(size_t(R));
        std::vector<std::thread> th;
        for (int r = 0; r < R; ++r)
          th.emplace_back([&, r] {
            const auto part = [&](const std::vector<float>& v, int64_t w) {
              return std::vector<float>(v.begin() + r * n * w, v.begin() + (r + 1) * n * w);
            };
            o[size_t(r)] =
                test::ep_case::run_layer([] { return make_cuda_backend(); }, c, &recipe, R, r, comms[size_t(r)].get(),
                                         part(x, C), part(dy, C), n, part(logits, c.experts), C, compact);
          });
        for (auto& t : th) t.join();
      }
      for (int r = 0; r < R; ++r) {
        CAPTURE(r);
        CHECK(test::ep_case::same_bits(out[0][size_t(r)].y, out[1][size_t(r)].y));
        CHECK(test::ep_case::same_bits(out[0][size_t(r)].dx, out[1][size_t(r)].dx));
        for (size_t i = 0; i < out[0][size_t(r)].grads.size(); ++i)
          CHECK_MESSAGE(test::ep_case::same_bits(out[0][size_t(r)].grads[i], out[1][size_t(r)].grads[i]), i);
      }
    }
}

}  // namespace fp4lab::train
