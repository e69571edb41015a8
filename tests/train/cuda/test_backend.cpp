// The CUDA backend (train/cuda/backend.cpp) against the CPU backend: the
// backend operation table (tests/train/backend_cases.hpp: every op on random
// inputs and awkward shapes, dropout masks bit for bit, everything else at the
// row's FP32 tolerance) and its run-to-run determinism; then what the table
// cannot say: the caching allocator, the error paths, the producer outputs
// (BF16 operands and amaxes), and whole GPT/ViT steps. Without a GPU the executable reports
// SKIPPED (tests/gpu_main.cpp).
//
// Tolerance: the two backends evaluate the same FP32/FP64 operations and differ
// only in summation order (and erff/expf vs glibc, <= 2 ulp). A sum of K
// float terms reordered changes by about sqrt(K) * 2^-24 * max|term|
// typically, K * 2^-24 * sum|term| at worst; with K <= a few hundred and the
// chained GEMM -> softmax -> GEMM of attention this stays below ~1e-5 of the
// output's magnitude. So: max |gpu - cpu| <= tol * (1 + max |cpu|) with tol 2e-6
// for elementwise ops, 1e-5 for row reductions and 3e-5 for attention.
// (Per row and output in backend_cases.cpp, with the bit-for-bit ones and the
// linear layer's.)
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/encode.hpp"
#include "cuda/device.hpp"
#include "gpu_test_util.hpp"
#include "recipes/recipe.hpp"
#include "sim/rht.hpp"
#include "train/backend.hpp"
#include "train/backend_cases.hpp"
#include "train/model.hpp"

using namespace fp4lab::train;
namespace bt = fp4lab::train::test;

namespace {

using bt::put;
using bt::randv;

std::vector<float> get(Backend& be, const Tensor& t) {
  std::vector<float> v(size_t(t.size()));
  be.download(t, v.data());
  return v;
}

// max |got - ref| <= tol * (1 + max |ref|), with the worst element reported.
void expect_close(const std::string& what, const std::vector<float>& ref, const std::vector<float>& got, double tol) {
  REQUIRE(ref.size() == got.size());
  double mref = 0.0, md = 0.0;
  size_t at = 0;
  bool finite = true;
  for (size_t i = 0; i < ref.size(); ++i) {
    mref = std::max(mref, double(std::abs(ref[i])));
    const double d = std::abs(double(got[i]) - double(ref[i]));
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) finite = false;
    if (d > md) md = d, at = i;
  }
  INFO(what, ": max |gpu - cpu| = ", md, " at ", at, " (cpu ", ref.empty() ? 0.0f : ref[at], ", gpu ",
       got.empty() ? 0.0f : got[at], "), max |cpu| = ", mref, ", tol ", tol);
  CHECK(finite);
  CHECK(md <= tol * (1.0 + mref));
}
// Same bits.
void expect_same_bits(const std::string& what, const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  size_t bad = 0, first = a.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      if (!bad) first = i;
      ++bad;
    }
  INFO(what, ": ", bad, " of ", a.size(), " elements differ; first at ", first, " (",
       first < a.size() ? a[first] : 0.0f, " vs ", first < a.size() ? b[first] : 0.0f, ")");
  CHECK(bad == 0);
}

// A producer's BF16 output buffers for a [rows, cols] tensor (ProducerOutputs
// with bf16; drop: the FP32 values not written) and the FP32 tensor that goes
// with them (model.hpp's output_tensor: data null when dropped).
struct Produced {
  ProducerOutputs o;
  Tensor t;
};
Produced bf16_outputs(Backend& be, int64_t rows, int64_t cols, bool drop = false) {
  Produced p;
  p.o = be.producer_outputs(LinearInputNeeds{true, std::nullopt}, rows, cols);
  p.o.f32 = !drop;
  p.t = output_tensor(be, p.o);
  return p;
}

std::vector<uint16_t> get_bf16(const uint16_t* d, size_t n) {
  std::vector<uint16_t> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

// p's BF16 output, written, against core's round-to-nearest-even BF16 of p's FP32 values.
void expect_bf16_output(Backend& be, const std::string& what, const Produced& p) {
  REQUIRE(p.o.bf16 != nullptr);
  REQUIRE(p.o.bf16_written);
  const std::vector<float> v = get(be, p.t);
  const std::vector<uint16_t> h = get_bf16(p.o.bf16, v.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (h[i] != fp4lab::encode_rn_f32<fp4lab::bfloat16>(v[i], fp4lab::Overflow::nonsaturate) && !bad++) first = i;
  INFO(what, ": ", bad, " of ", v.size(), " BF16 outputs differ from the RNE BF16 of the FP32 values, first at ",
       first);
  CHECK(bad == 0);
}

// `only`, an output whose FP32 values were not written (ProducerOutputs::f32
// false), holds the same BF16 bits as `full`, the same op's output with them.
void expect_same_bf16_output(const std::string& what, const Produced& full, const Produced& only) {
  REQUIRE(only.t.data == nullptr);
  REQUIRE(only.o.bf16_written);
  REQUIRE(full.t.size() == only.t.size());
  const std::vector<uint16_t> a = get_bf16(full.o.bf16, size_t(full.t.size())), b = get_bf16(only.o.bf16, a.size());
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += a[i] != b[i];
  INFO(what, " (FP32 dropped): ", bad, " of ", a.size(), " BF16 outputs differ from the FP32-kept form's");
  CHECK(bad == 0);
}

// `produce(drop)` runs producers into outputs made by bf16_outputs(.., drop)
// and returns them: with the FP32 values kept, each BF16 output is the RNE
// BF16 of its tensor; with them dropped, the same BF16 bits.
void expect_bf16_outputs(Backend& be, const std::string& what, const std::vector<std::string>& names,
                         const std::function<std::vector<Produced>(bool)>& produce) {
  const std::vector<Produced> kept = produce(false), dropped = produce(true);
  REQUIRE(kept.size() == names.size());
  REQUIRE(dropped.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    expect_bf16_output(be, what + ": " + names[i], kept[i]);
    expect_same_bf16_output(what + ": " + names[i], kept[i], dropped[i]);
  }
}

struct Pair {
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  std::unique_ptr<Backend> gpu = make_backend("cuda");
};

}  // namespace

TEST_CASE("cuda backend: make_backend(\"cuda\")" * doctest::test_suite("host")) {
  if (!fp4lab::cuda::gpu_available()) {
    CHECK_THROWS_WITH(make_backend("cuda"), doctest::Contains("no CUDA device found"));
    return;
  }
  auto be = make_backend("cuda");
  CHECK(be->name() == "cuda");
}

// Every row of the table on the CPU (the reference) and on the GPU. A failure
// names the op, the row's shapes and parameters, the output, the worst
// element (index, row, col), both values with their bits, and the bound.
TEST_CASE("cuda backend: the backend op table matches the CPU (backend_cases.hpp)") {
  Pair b;
  const std::vector<bt::OpCase> cases = bt::backend_op_cases();
  const int64_t n = bt::compare_backends(*b.cpu, *b.gpu, cases, {"cpu (2 threads)", "cuda"});
  MESSAGE(cases.size(), " rows, ", n, " outputs compared");
  CHECK(n >= int64_t(cases.size()));
}

// precision.activations "bf16" (train/backend.hpp's contract): the CPU twin is the reference; rows bit for
// bit stay so, the others within 1 BF16 ulp of their magnitude (backend_op_cases(ActivationPrecision)).
TEST_CASE("cuda backend: the backend op table under bf16 activations matches the CPU twin") {
  Pair b;
  const std::vector<bt::OpCase> cases = bt::backend_op_cases(ActivationPrecision::bf16);
  const int64_t n = bt::compare_backends(*b.cpu, *b.gpu, cases, {"cpu (2 threads)", "cuda"});
  MESSAGE(cases.size(), " rows, ", n, " outputs compared");
  CHECK(n >= int64_t(cases.size()));
  CHECK(bt::check_run_to_run(*b.gpu, cases, "cuda") == n);
}

TEST_CASE("cuda backend: every op of the table gives the same bits run to run") {
  auto gpu = make_backend("cuda");
  const std::vector<bt::OpCase> cases = bt::backend_op_cases();
  CHECK(bt::check_run_to_run(*gpu, cases, "cuda") >= int64_t(cases.size()));
}

TEST_CASE("cuda backend: the caching allocator reuses freed blocks; tensors may outlive the backend") {
  auto g = make_backend("cuda");
  float* p = nullptr;
  {
    Tensor a = g->empty(100, 33);
    p = a.data;
  }
  Tensor a2 = g->empty(100, 33);
  CHECK(a2.data == p);  // the freed block, for the next request of its size
  Tensor e = g->empty(0, 5);
  CHECK(e.size() == 0);
  const auto v = randv(100, 1);
  Tensor survivor = put(*g, v, 10, 10);
  CHECK(get(*g, survivor) == v);
  g.reset();
  survivor = Tensor{};  // freed after its backend: no crash
}

TEST_CASE("cuda backend: device_memory counts the allocations themselves") {
  auto g = make_backend("cuda");
  g->reset_device_memory_peaks();
  const Backend::DeviceMemory m0 = g->device_memory().value();
  CHECK(m0.tensors_in_use_peak == 0);  // a new backend: nothing acquired
  CHECK(m0.tensors_reserved_peak == 0);
  const int64_t a_bytes = 1000 * 1001 * 4, b_bytes = 3 * 1000 * 1001 * 4;  // above 1 MiB: eighths of 2^22, 2^24
  const int64_t a_rounded = 4194304, b_rounded = 12582912;  // round_bytes: 4004000 -> 2^22, 12012000 -> 3/4 2^24
  REQUIRE(a_rounded >= a_bytes);
  REQUIRE(b_rounded >= b_bytes);
  {
    Tensor a = g->empty(1000, 1001);
    Tensor b = g->empty(3000, 1001);
    const Backend::DeviceMemory m = g->device_memory().value();
    CHECK(m.tensors_in_use_peak == a_rounded + b_rounded);
    CHECK(m.tensors_reserved_peak == a_rounded + b_rounded);
  }
  {
    Tensor a = g->empty(1000, 1001);  // from the cache: in use again, nothing new reserved
    const Backend::DeviceMemory m = g->device_memory().value();
    CHECK(m.tensors_in_use_peak == a_rounded + b_rounded);
    CHECK(m.tensors_reserved_peak == a_rounded + b_rounded);
    g->reset_device_memory_peaks();  // peaks come down to what is held now
    const Backend::DeviceMemory r = g->device_memory().value();
    CHECK(r.tensors_in_use_peak == a_rounded);
    CHECK(r.tensors_reserved_peak == a_rounded + b_rounded);  // b's block is cached, still reserved
  }
}

TEST_CASE("cuda backend: bad arguments are errors that say what is wrong, before anything runs") {
  auto g = make_backend("cuda");
  Tensor t = g->zeros(7, 13), d = g->zeros(7, 9);
  CHECK_THROWS(g->copy_cols(t, 10, d, 0, 4));
  Tensor te = g->zeros(4, 2), pe = g->zeros(2, 2), o = g->empty(2, 2);
  const int32_t ids[] = {1, 4};
  CHECK_THROWS_WITH(g->embed_forward(ids, 1, 2, te, pe, o), doctest::Contains("outside the vocabulary"));
  Tensor l = g->zeros(1, 3);
  const int32_t target = 3;
  CHECK_THROWS_WITH(g->cross_entropy(l, &target, nullptr, nullptr), doctest::Contains("outside [0, 3)"));
  CHECK_THROWS_WITH(g->cross_entropy_start(l, &target, nullptr), doctest::Contains("outside [0, 3)"));
  CHECK_THROWS_WITH(g->cross_entropy_finish(nullptr), doctest::Contains("no cross_entropy_start"));
  const int32_t ok = 2;
  g->cross_entropy_start(l, &ok, nullptr);
  CHECK(g->cross_entropy_finish(nullptr) == doctest::Approx(std::log(3.0)));
  CHECK_THROWS_WITH(g->cross_entropy_finish(nullptr), doctest::Contains("no cross_entropy_start"));
}

namespace {
// A 2-layer GPT or ViT (width 32, 2 heads, dropout 0.1) and a batch of 3 for it.
struct SmallStep {
  ModelConfig mc;
  Batch bt;
};
SmallStep small_step(const std::string& type, uint32_t seed) {
  SmallStep r;
  ModelConfig& mc = r.mc;
  mc.type = type;
  mc.layers = 2;
  mc.heads = 2;
  mc.width = 32;
  mc.dropout = 0.1;
  mc.vocab_size = 29;
  mc.context = 16;
  mc.image_size = 14;
  mc.patch_size = 7;
  Batch& bt = r.bt;
  bt.size = 3;
  std::mt19937 rng(seed);
  if (mc.type == "gpt") {
    bt.tokens.resize(size_t(bt.size * mc.context));
    bt.targets.resize(bt.tokens.size());
    for (auto& t : bt.tokens) t = int32_t(rng() % 29);
    for (auto& t : bt.targets) t = int32_t(rng() % 29);
  } else {
    bt.images = randv(size_t(bt.size * 14 * 14), seed + 5);
    for (int i = 0; i < 3; ++i) bt.targets.push_back(int32_t(rng() % 10));
  }
  return r;
}
// One forward + backward of a fresh model (init seed 5) on the CPU and on the
// GPU: the losses agree to 1e-5 and the gradients to 1e-4 (FP32 accumulation order).
void expect_step_matches(Pair& b, const SmallStep& in, const StepContext& sc) {
  double loss[2];
  std::vector<float> grads[2];
  for (int w = 0; w < 2; ++w) {
    Backend& be = w ? *b.gpu : *b.cpu;
    auto model = make_model(in.mc, be, 5);
    be.fill(model->params().grads, 0.0f);
    loss[w] = model->forward_backward(in.bt, sc, nullptr);
    grads[w] = get(be, model->params().grads);
  }
  CHECK(std::abs(loss[0] - loss[1]) <= 1e-5 * (1.0 + std::abs(loss[0])));
  expect_close("parameter gradients", grads[0], grads[1], 1e-4);
}
}  // namespace

TEST_CASE("cuda backend: one GPT and one ViT training step match the CPU (FP32 recipe)") {
  Pair b;
  StepContext sc;
  sc.seed = 11;
  sc.step = 2;
  for (const std::string type : {"gpt", "vit"}) {  // a string: CAPTURE prints its text
    CAPTURE(type);
    expect_step_matches(b, small_step(type, 3), sc);
  }
}

// precision.activations "bf16", whole steps (dense GPT, MoE GPT, ViT; the FP32 and the bf16 recipe): the CPU
// twin and the GPU round the same FP32 values, which differ by summation order, so a value may land on
// either side of a BF16 boundary: the loss within 1e-3 relative, the gradients' cosine above 0.9999.
TEST_CASE("cuda backend: model steps under bf16 activations match the CPU twin") {
  Pair b;
  const fp4lab::Recipe bf16 = fp4lab::recipe_by_name("bf16");
  for (const fp4lab::Recipe* r : {static_cast<const fp4lab::Recipe*>(nullptr), &bf16})
    for (const std::string type : {"gpt", "moe", "vit"}) {  // a string: CAPTURE prints its text
      CAPTURE(type);
      CAPTURE((r ? "bf16 recipe" : "FP32 recipe"));
      SmallStep in = small_step(type == "vit" ? "vit" : "gpt", 6);
      if (type == "moe") in.mc.moe.experts = 4;
      StepContext sc;
      sc.recipe = r;
      sc.seed = 13;
      sc.step = 1;
      sc.activations = ActivationPrecision::bf16;
      double loss[2];
      std::vector<float> g[2];
      for (int w = 0; w < 2; ++w) {
        Backend& be = w ? *b.gpu : *b.cpu;
        auto model = make_model(in.mc, be, 5);
        be.fill(model->params().grads, 0.0f);
        loss[w] = model->forward_backward(in.bt, sc, nullptr);
        g[w] = get(be, model->params().grads);
      }
      CHECK(std::abs(loss[0] - loss[1]) <= 1e-3 * std::abs(loss[0]));
      double ab = 0, aa = 0, bb = 0;
      for (size_t i = 0; i < g[0].size(); ++i)
        ab += double(g[0][i]) * g[1][i], aa += double(g[0][i]) * g[0][i], bb += double(g[1][i]) * g[1][i];
      CHECK(ab / std::sqrt(aa * bb) > 0.9999);
    }
}

TEST_CASE("cuda backend: producers' BF16 outputs are the RNE BF16 of what they write") {
  auto be = make_backend("cuda");
  // GELU and LayerNorm, around BF16 ties, with a BF16 output 2 bytes off
  // alignment too (the scalar stores).
  for (int64_t n : {1, 7, 4099, 10007}) {
    for (bool shifted : {false, true}) {
      CAPTURE(n);
      CAPTURE(shifted);
      auto x = randv(size_t(n), 70 + uint32_t(n), 3.0f);
      for (size_t i = 0; i < x.size(); i += 3)  // low halves 0x8000 exactly: BF16 ties
        x[i] = fp4lab::bits_float((fp4lab::float_bits(x[i]) & 0xFFFF0000u) | 0x8000u);
      Tensor xt = put(*be, x, 1, n), dyt = put(*be, randv(size_t(n), 71 + uint32_t(n)), 1, n);
      auto outputs = [&](int64_t rows, int64_t cols) {
        Produced p = bf16_outputs(*be, rows, cols);
        if (shifted) {
          const Produced wide = bf16_outputs(*be, 1, rows * cols + 1);
          p.o.bf16 = wide.o.bf16 + 1;
          p.o.bf16_mem = wide.o.bf16_mem;
        }
        return p;
      };
      Produced y = outputs(1, n), dx = outputs(1, n);
      be->gelu_forward(xt, y.t, &y.o);
      be->gelu_backward(xt, dyt, dx.t, &dx.o);
      expect_bf16_output(*be, "gelu_forward", y);
      expect_bf16_output(*be, "gelu_backward", dx);
      const int64_t rows = n == 1 ? 1 : 7, cols = n / rows;
      Produced ln = outputs(rows, cols);
      Tensor mean = be->empty(1, rows), rstd = be->empty(1, rows);
      Tensor g = put(*be, randv(size_t(cols), 72, 0.5f, 1.0f), 1, cols);
      be->layernorm_forward(view_of(xt.data, rows, cols), g.data, nullptr, 1e-5f, ln.t, mean, rstd, &ln.o);
      expect_bf16_output(*be, "layernorm_forward", ln);
      if (shifted) continue;
      // The BF16 alone (FP32 dropped): the same bits.
      expect_bf16_outputs(*be, "gelu", {"forward y", "backward dx"}, [&](bool drop) {
        Produced y2 = bf16_outputs(*be, 1, n, drop), dx2 = bf16_outputs(*be, 1, n, drop);
        be->gelu_forward(xt, y2.t, &y2.o);
        be->gelu_backward(xt, dyt, dx2.t, &dx2.o);
        return std::vector<Produced>{y2, dx2};
      });
      expect_bf16_outputs(*be, "layernorm_forward", {"y"}, [&](bool drop) {
        Produced l2 = bf16_outputs(*be, rows, cols, drop);
        be->layernorm_forward(view_of(xt.data, rows, cols), g.data, nullptr, 1e-5f, l2.t, mean, rstd, &l2.o);
        return std::vector<Produced>{l2};
      });
    }
  }
  // Out-of-place dropout gradients (one pass on the GPU): dst = drop(src); y += x, dst = drop(y).
  for (int64_t n : {1, 3, 4, 5, 1000, 4097})
    for (float p : {0.0f, 0.1f, 0.5f, 0.9f}) {
      CAPTURE(n);
      CAPTURE(p);
      const auto x = randv(size_t(n), 7 + uint32_t(n)), dy = randv(size_t(n), 8 + uint32_t(n));
      const DropoutKey key{0x1234567890ull, (uint64_t(0xD) << 60) | 12345};
      std::vector<float> sums[2];
      expect_bf16_outputs(*be, "dropout", {"dropout_backward_to dst", "add_dropout_backward_to dst"}, [&](bool drop) {
        Tensor src = put(*be, dy, 1, n), y = put(*be, dy, 1, n), yx = put(*be, x, 1, n);
        Produced dst = bf16_outputs(*be, 1, n, drop), dst2 = bf16_outputs(*be, 1, n, drop);
        be->dropout_backward_to(src, dst.t, p, key, &dst.o);
        be->add_dropout_backward_to(y, yx, dst2.t, p, key, &dst2.o);
        sums[drop] = get(*be, y);
        return std::vector<Produced>{dst, dst2};
      });
      expect_same_bits("add_dropout_backward_to's sum y += x, FP32 of dst dropped or not", sums[0], sums[1]);
    }
  // Attention out and dqkv, on the fused and the cuBLAS paths.
  uint32_t seed = 100;
  for (const bt::AttentionGeometry& g : bt::attention_geometries())
    for (bool causal : {false, true})
      for (float p : {0.0f, 0.1f}) {
        const int64_t N = g.B * g.T, C = g.H * g.hd;
        CAPTURE(g.B);
        CAPTURE(g.T);
        CAPTURE(g.H);
        CAPTURE(g.hd);
        CAPTURE(causal);
        CAPTURE(p);
        const float scale = causal ? float(1.0 / std::sqrt(double(g.hd))) : float(std::sqrt(double(g.hd)));
        const AttentionShape s{g.B, g.T, g.H, causal, scale, p};
        const DropoutKey key{77, 0xABCDEF0123ull};
        Tensor q = put(*be, randv(size_t(N * 3 * C), ++seed, 0.7f), N, 3 * C);
        Tensor d = put(*be, randv(size_t(N * C), ++seed), N, C);
        expect_bf16_outputs(*be, "attention", {"forward out", "backward dqkv"}, [&](bool drop) {
          Produced o = bf16_outputs(*be, N, C, drop), dq = bf16_outputs(*be, N, 3 * C, drop);
          Tensor pr = be->empty(g.B * g.H * g.T, g.T);
          be->attention_forward(s, q, o.t, pr, key, &o.o);
          be->attention_backward(s, q, pr, d, dq.t, key, &dq.o);
          return std::vector<Produced>{o, dq};
        });
      }
}

TEST_CASE("cuda backend: producer outputs are checked against their tensor") {
  auto be = make_backend("cuda");
  Tensor x = put(*be, randv(64, 3), 8, 8);
  Produced wrong = bf16_outputs(*be, 4, 16);  // same size, another shape
  Tensor y = be->empty(8, 8);
  CHECK_THROWS_AS(be->gelu_forward(x, y, &wrong.o), fp4lab::InternalError);
  Produced only = bf16_outputs(*be, 8, 8, true);
  Tensor y32 = be->empty(8, 8);  // FP32 present although the outputs drop it
  CHECK_THROWS_AS(be->gelu_forward(x, y32, &only.o), fp4lab::InternalError);
  Tensor none;  // no FP32 values and no outputs to write instead
  none.rows = none.cols = 8;
  CHECK_THROWS_AS(be->gelu_forward(x, none, nullptr), fp4lab::InternalError);
  // A layer given an input with no FP32 values and no written BF16 for it.
  const fp4lab::Recipe bf16 = fp4lab::recipe_by_name("bf16");
  Tensor w = put(*be, randv(64, 4), 8, 8), out;
  std::unique_ptr<LinearState> st;
  Produced unwritten = bf16_outputs(*be, 8, 8, true);
  CHECK_THROWS_AS(be->linear_forward(plan_layer({&bf16, 1, 0, 0, "h.0.mlp.c_fc"}), unwritten.t, w, nullptr, out, st,
                                     &unwritten.o),
                  fp4lab::InternalError);
}

namespace {
// The two amax words of o.
std::vector<uint32_t> amax_words(const ProducerOutputs& o) {
  std::vector<uint32_t> w(2);
  fp4lab::cuda::check(cudaMemcpy(w.data(), o.amax, 8, cudaMemcpyDeviceToHost), "test");
  return w;
}
// What the amax words must hold for the values v [rows, cols]: the max
// abs_bits of v, and of sim's RHT of v down 16-row column chunks (rht).
std::vector<uint32_t> want_amax(std::vector<float> v, int64_t rows, int64_t cols, const AmaxRequest& r) {
  auto amax = [](const std::vector<float>& x) {
    uint32_t m = 0;
    for (float f : x) m = std::max(m, fp4lab::float_bits(f) & 0x7FFFFFFFu);
    return m;
  };
  const uint32_t plain = amax(v);
  if (!r.rht) return {plain, plain};
  fp4lab::rht_forward(fp4lab::MatrixView<float>(v.data(), rows, cols), fp4lab::RhtAxis::cols, r.rht_seed);
  return {plain, amax(v)};
}
}  // namespace

// Under bf16 activations too: the producers round in their own pass, so their amaxes are of the rounded
// values they write (read back, and checked BF16-representable).
TEST_CASE("cuda backend: producers' amax outputs are the tensor amaxes of what they write") {
  auto be = make_backend("cuda");
  for (const ActivationPrecision mode : {ActivationPrecision::fp32, ActivationPrecision::bf16})
  for (const AmaxRequest r : {AmaxRequest{true, 41}, AmaxRequest{false, 0}}) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{48, 64}, {1040, 132}}) {
      const ActivationScope scope(*be, mode);
      CAPTURE(mode == ActivationPrecision::bf16);
      CAPTURE(r.rht);
      CAPTURE(rows);
      CAPTURE(cols);
      const size_t n = size_t(rows * cols);
      auto x = randv(n, 80 + uint32_t(rows), 3.0f);
      x[7] = x[7 + size_t(cols)] = 3e38f;  // their RHT column chunk overflows to Inf (quartered or not)
      x[n / 2] = -2e-40f;
      const auto dy = randv(n, 81 + uint32_t(rows)), res = randv(n, 82 + uint32_t(rows));
      Tensor xt = put(*be, x, rows, cols), dyt = put(*be, dy, rows, cols);
      auto with_amax = [&] {
        Produced p;
        p.o = be->producer_outputs(LinearInputNeeds{false, r}, rows, cols);
        p.t = output_tensor(*be, p.o);
        CHECK_FALSE(p.o.amax_written);
        return p;
      };
      auto expect = [&](const char* what, const Produced& p, const Tensor& plain) {
        CAPTURE(what);
        REQUIRE(p.o.amax_written);
        CHECK_FALSE(p.o.bf16_written);
        const std::vector<float> v = get(*be, p.t);
        expect_same_bits(std::string(what) + " (values, against the op without outputs)", v, get(*be, plain));
        if (mode == ActivationPrecision::bf16) {
          size_t wide = 0;  // values with bits below BF16's 16 (a NaN aside)
          for (const float f : v)
            wide += (std::bit_cast<uint32_t>(f) & 0xFFFFu) != 0 && !std::isnan(f);
          CHECK(wide == 0);
        }
        const std::vector<uint32_t> got = amax_words(p.o), want = want_amax(v, rows, cols, r);
        char msg[96];
        std::snprintf(msg, sizeof msg, "amax words got %08x %08x, want %08x %08x", got[0], got[1], want[0], want[1]);
        INFO(msg);
        // A NaN word (an Inf - Inf in the RHT: add_dropout_backward_to's x has
        // 3e38s, so y + x overflows) of any payload: the GPU makes the
        // canonical NaN, the CPU propagates x86's default one.
        auto same = [](uint32_t a, uint32_t b) { return a == b || (a > 0x7F800000u && b > 0x7F800000u); };
        CHECK(same(got[0], want[0]));
        CHECK(same(got[1], want[1]));
      };
      Produced y = with_amax();
      Tensor y0 = be->empty(rows, cols);
      be->gelu_forward(xt, y.t, &y.o);
      be->gelu_forward(xt, y0);
      expect("gelu_forward", y, y0);
      Produced dx = with_amax();
      Tensor dx0 = be->empty(rows, cols);
      be->gelu_backward(xt, dyt, dx.t, &dx.o);
      be->gelu_backward(xt, dyt, dx0);
      expect("gelu_backward", dx, dx0);
      for (float p : {0.2f, 0.0f}) {
        CAPTURE(p);
        Produced d = with_amax();
        Tensor d0 = be->empty(rows, cols);
        be->dropout_backward_to(dyt, d.t, p, DropoutKey{5, 6}, &d.o);
        be->dropout_backward_to(dyt, d0, p, DropoutKey{5, 6});
        expect("dropout_backward_to", d, d0);
        Tensor ya = put(*be, res, rows, cols), yb = put(*be, res, rows, cols);
        Produced e = with_amax();
        Tensor e0 = be->empty(rows, cols);
        be->add_dropout_backward_to(ya, xt, e.t, p, DropoutKey{7, 8}, &e.o);
        be->add_dropout_backward_to(yb, xt, e0, p, DropoutKey{7, 8});
        expect("add_dropout_backward_to", e, e0);
        expect_same_bits("add_dropout_backward_to (y += x)", get(*be, ya), get(*be, yb));
      }
      // A producer that does not compute amaxes leaves them unwritten.
      Produced l = with_amax();
      Tensor mean = be->empty(1, rows), rstd = be->empty(1, rows);
      Tensor g = put(*be, randv(size_t(cols), 83, 0.5f, 1.0f), 1, cols);
      be->layernorm_forward(xt, g.data, nullptr, 1e-5f, l.t, mean, rstd, &l.o);
      CHECK_FALSE(l.o.amax_written);
    }
  }
  // A shape the producer cannot serve (rows % 16 != 0): no amaxes, and the values stand.
  Tensor x = put(*be, randv(40, 90), 10, 4);
  ProducerOutputs o = be->producer_outputs(LinearInputNeeds{false, AmaxRequest{true, 3}}, 10, 4);
  Tensor y = output_tensor(*be, o);
  be->gelu_forward(x, y, &o);
  CHECK_FALSE(o.amax_written);
}

// The NVFP4 layers take their amaxes from the producer outputs: every canned
// recipe with one-pass operands gives the same bits with and without them
// (they replace the layer's own amax pass only), forward and backward; under bf16 activations too (the
// producers' amaxes are then of their rounded outputs).
TEST_CASE("cuda backend: NVFP4 layers with producer amaxes give the bits of their own amax passes") {
  auto be = make_backend("cuda");
  int requests = 0;
  for (const ActivationPrecision mode : {ActivationPrecision::fp32, ActivationPrecision::bf16})
  for (const std::string& name : fp4lab::recipe_names()) {
    const ActivationScope scope(*be, mode);
    const fp4lab::Recipe rec = fp4lab::recipe_by_name(name);
    CAPTURE(mode == ActivationPrecision::bf16);
    CAPTURE(name);
    const int64_t B = 64, in = 96, out = 48;
    const LayerPlan lp = plan_layer(fp4lab::LinearContext{&rec, 21, 3, 4, "h.1.mlp.c_proj"});
    const LinearInputNeeds nx = be->linear_input_needs(lp, false, B, in);
    const LinearInputNeeds ny = be->linear_input_needs(lp, true, B, out);
    requests += int(nx.amax.has_value()) + int(ny.amax.has_value());
    if (!nx.amax && !ny.amax) continue;
    const auto h = randv(size_t(B * in), 91, 2.0f), w = randv(size_t(out * in), 92, 0.2f);
    const auto g = randv(size_t(B * out), 93, 1e-3f);
    Tensor ht = put(*be, h, B, in), wt = put(*be, w, out, in), gt = put(*be, g, B, out);
    std::vector<std::vector<float> > got[2];
    for (int with = 0; with < 2; ++with) {
      ProducerOutputs xo = be->producer_outputs(with ? LinearInputNeeds{false, nx.amax} : LinearInputNeeds{}, B, in);
      ProducerOutputs yo = be->producer_outputs(with ? LinearInputNeeds{false, ny.amax} : LinearInputNeeds{}, B, out);
      Tensor x = output_tensor(*be, xo), dy = output_tensor(*be, yo);
      be->gelu_forward(ht, x, &xo);  // x = gelu(h): the producer writes the amaxes
      be->dropout_backward_to(gt, dy, 0.1f, DropoutKey{9, 10}, &yo);
      CHECK(xo.amax_written == (with && nx.amax.has_value()));
      CHECK(yo.amax_written == (with && ny.amax.has_value()));
      Tensor y = be->empty(B, out), dx = be->empty(B, in), dw = be->empty(out, in);
      be->fill(dw, 0.0f);
      std::unique_ptr<LinearState> st;
      be->linear_forward(lp, x, wt, nullptr, y, st, &xo);
      be->linear_backward(lp, *st, wt, dy, dx, dw, nullptr, &yo);
      got[with] = {get(*be, y), get(*be, dx), get(*be, dw)};
    }
    expect_same_bits("y", got[0][0], got[1][0]);
    expect_same_bits("dx", got[0][1], got[1][1]);
    expect_same_bits("dW", got[0][2], got[1][2]);
  }
  CHECK(requests >= 4);  // nvfp4 asks for both, in each mode
  // And the needs follow the plan: no amaxes for the bf16 recipe.
  const fp4lab::Recipe bf16 = fp4lab::recipe_by_name("bf16");
  CHECK_FALSE(be->linear_input_needs(fp4lab::LinearContext{&bf16, 1, 0, 0, "h.0.mlp.c_fc"}, false, 64, 96).amax);
}

TEST_CASE("cuda backend: a bf16-recipe GPT and ViT step (operands from producers' BF16) match the CPU") {
  Pair b;
  const fp4lab::Recipe bf16 = fp4lab::recipe_by_name("bf16");
  StepContext sc;
  sc.recipe = &bf16;
  sc.seed = 12;
  sc.step = 1;
  fp4lab::LinearContext lc{&bf16, sc.seed, 0, sc.step, "h.0.attn.c_attn"};
  CHECK(b.gpu->linear_input_needs(lc, false, 64, 96) == LinearInputNeeds{true, std::nullopt});
  CHECK(b.gpu->linear_input_needs(lc, true, 64, 96).bf16);
  CHECK(b.cpu->linear_input_needs(lc, false, 64, 96) == LinearInputNeeds{});
  // Same BF16 operands (a wrong producer output would be far off).
  for (const std::string type : {"gpt", "vit"}) {  // a string: CAPTURE prints its text
    CAPTURE(type);
    expect_step_matches(b, small_step(type, 4), sc);
  }
}

// What producers write for their consumer layers (BF16 operands, NVFP4 amaxes,
// FP32 values dropped: model.hpp's outputs_for) only replaces work the
// layers would do themselves: a model step gives the same bits with and without
// them (StepContext::producer_outputs), for every model form and the recipes
// that use them. The proof that the producer-output redesign keeps the bits.
TEST_CASE("cuda backend: model steps with and without producer outputs are bit-identical") {
  auto be = make_backend("cuda");
  for (const char* name : {"bf16", "nvfp4", "nvfp4_row_scaled", "nvfp4_4over6", "mxfp8"}) {
    const fp4lab::Recipe rec = fp4lab::recipe_by_name(name);
    for (const char* form : {"gpt", "gpt bias", "gpt moe", "vit"}) {
      CAPTURE(name);
      CAPTURE(form);
      const std::string f = form;
      SmallStep in = small_step(f.substr(0, 3), 6);
      in.mc.bias = f == "gpt bias" || f == "vit";
      if (f == "gpt moe") in.mc.moe.experts = 4;
      if (f == "vit") {  // 16 images: 80 rows (L = 5), a multiple of 16, so the NVFP4 amax path is taken
        in.bt.size = 16;
        in.bt.images = randv(size_t(16 * 14 * 14), 77);
        in.bt.targets.clear();
        for (int i = 0; i < 16; ++i) in.bt.targets.push_back(int32_t((i * 7) % 10));
      }
      double loss[2];
      std::vector<float> grads[2];
      for (int with = 0; with < 2; ++with) {
        StepContext sc;
        sc.recipe = &rec;
        sc.seed = 13;
        sc.step = 2;
        sc.producer_outputs = with == 1;
        auto model = make_model(in.mc, *be, 5);
        be->fill(model->params().grads, 0.0f);
        loss[with] = model->forward_backward(in.bt, sc, nullptr);
        grads[with] = get(*be, model->params().grads);
      }
      CHECK(loss[0] == loss[1]);
      expect_same_bits("parameter gradients", grads[0], grads[1]);
    }
  }
}

// The grouped linear (the MoE experts) on the GPU: the bits of each group's own
// linear calls (backend_cases.hpp check_grouped_linear), whichever implementation runs.
TEST_CASE("cuda backend: the grouped linear gives each group's own linear's bits") {
  auto be = make_backend("cuda");
  CHECK(bt::check_grouped_linear(*be) > 100);
}
