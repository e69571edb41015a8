// The MoE dispatch cast (MoeConfig::dispatch_cast mxfp8, train/moe.hpp): the
// experts' inputs and output gradients fake-quantized with the mxfp8 recipe's
// fwd_x quantizer. Checked by properties that hold only if the cast is that
// quantizer at those two places: under the mxfp8 recipe the layer's y and dx
// are bit for bit those without the cast (the recipe quantizes the cast rows
// again, to the same values: idempotence) while the experts' weight
// gradients change (wgrad reads the cast rows); under bf16 y changes; the
// Backend op equals sim's quantize(...).dequant (a different entry point)
// on the CPU; and on R = 2 thread ranks the layer with the cast equals one
// process with it (expert_parallel_case.hpp).
#include <doctest/doctest.h>

#include "sim/quantizer.hpp"
#include "train/expert_parallel_case.hpp"

namespace fp4lab::train {

namespace {

test::ep_case::LayerOut run_cast(const char* recipe_name, MoeConfig::DispatchCast cast, const std::vector<float>& x,
                                 const std::vector<float>& dy, int64_t N) {
  MoeConfig c;
  c.experts = 8, c.top_k = 2, c.expert_hidden = 64, c.dispatch_cast = cast;
  const Recipe recipe = recipe_by_name(recipe_name);
  return test::ep_case::run_layer([] { return make_cpu_backend(1); }, c, &recipe, 1, 0, nullptr, x, dy, N, {});
}

}  // namespace

TEST_CASE("moe dispatch cast mxfp8: under the mxfp8 recipe only the experts' weight gradients change") {
  std::mt19937 rng(61);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t N = 200, C = test::ep_case::kWidth;
  std::vector<float> x(size_t(N * C)), dy(size_t(N * C));
  for (auto& v : x) v = nd(rng) * (nd(rng) > 1.5f ? 30.0f : 1.0f);  // outliers: blocks of varied scales
  for (auto& v : dy) v = nd(rng);
  using Cast = MoeConfig::DispatchCast;
  const auto plain = run_cast("mxfp8", Cast::none, x, dy, N), cast = run_cast("mxfp8", Cast::mxfp8, x, dy, N);
  CHECK(test::ep_case::same_bits(cast.y, plain.y));
  CHECK(test::ep_case::same_bits(cast.dx, plain.dx));
  // Parameters: the router's weight, then per expert c_fc.weight, c_fc.bias, c_proj.weight, c_proj.bias.
  // The weights' wgrad and c_proj's bias (the sum of its output gradient rows) read cast rows; the router's
  // gradient (through the gates) and c_fc's bias (the sum of GELU's gradient, from the unchanged dgrad) do not.
  int weights_changed = 0, unchanged_kept = 0, unchanged = 0;
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    const bool same = test::ep_case::same_bits(cast.grads[i], plain.grads[i]);
    const int64_t slot = i == 0 ? -1 : int64_t(i - 1) % 4;
    if (slot == 0 || slot == 2) weights_changed += !same;
    if (slot == -1 || slot == 1) ++unchanged, unchanged_kept += same;
  }
  CHECK(weights_changed >= 12);  // of the 16 expert weights (every expert gets rows here)
  CHECK(unchanged_kept == unchanged);
  // Under bf16 the experts' inputs are BF16 roundings of the rows: the cast (3 mantissa bits) shows in y.
  const auto bf_plain = run_cast("bf16", Cast::none, x, dy, N), bf_cast = run_cast("bf16", Cast::mxfp8, x, dy, N);
  CHECK_FALSE(test::ep_case::same_bits(bf_cast.y, bf_plain.y));
}

TEST_CASE("Backend::fake_quantize equals sim's quantize(...).dequant (the mxfp8 recipe's fwd_x quantizer)") {
  std::mt19937 rng(62);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const QuantizerSpec q = *recipe_by_name("mxfp8").operands[size_t(Operand::fwd_x)];
  auto be = make_cpu_backend(1);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{7, 32}, {33, 96}, {5, 50}}) {
    std::vector<float> h(size_t(rows * cols));
    for (auto& v : h) v = nd(rng) * std::ldexp(1.0f, int(nd(rng) * 6));
    h[0] = 0.0f, h[1] = -0.0f;
    Tensor t = be->empty(rows, cols);
    be->upload(h.data(), t);
    be->fake_quantize(t, q);
    std::vector<float> got(h.size());
    be->download(t, got.data());
    const QuantizedTensor want = quantize(q, MatrixView<const float>(h.data(), rows, cols));
    CHECK(test::ep_case::same_bits(got, want.dequant));
  }
}

TEST_CASE("moe dispatch cast mxfp8 on R thread ranks equals one process with it") {
  test::check_expert_parallel_layer([] { return make_cpu_backend(1); }, {"bf16", "mxfp8"}, test::GemmRows::independent,
                                    MoeConfig::DispatchCast::mxfp8);
}

}  // namespace fp4lab::train
