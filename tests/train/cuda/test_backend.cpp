// The CUDA backend (train/cuda/backend.cpp) against the CPU backend: the
// backend operation table (tests/train/backend_cases.hpp: every op on random
// inputs and awkward shapes, dropout masks bit for bit, everything else at the
// row's FP32 tolerance) and its run-to-run determinism; then what the table
// cannot say: the caching allocator, the error paths, the BF16 and amax
// companions, and whole GPT/ViT steps. Without a GPU the executable reports
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

// t's BF16 companion (Tensor::bf16), downloaded, against core's
// round-to-nearest-even BF16 of t's data.
void expect_companion(Backend& be, const std::string& what, const Tensor& t) {
  REQUIRE(t.bf16 != nullptr);
  const std::vector<float> v = get(be, t);
  std::vector<uint16_t> h(v.size());
  REQUIRE(cudaMemcpy(h.data(), t.bf16, h.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (h[i] != fp4lab::encode_rn_f32<fp4lab::bfloat16>(v[i], fp4lab::Overflow::nonsaturate) && !bad++) first = i;
  INFO(what, ": ", bad, " of ", v.size(), " companions differ from the RNE BF16 of the FP32 values, first at ", first);
  CHECK(bad == 0);
}

// `only`, a tensor whose FP32 values the backend dropped (add_bf16_companion's
// drop_f32), holds the same companion bits as `full`, the same op's output
// with its FP32 values kept.
void expect_same_companion(const std::string& what, const Tensor& full, const Tensor& only) {
  REQUIRE(only.data == nullptr);
  REQUIRE(only.bf16 != nullptr);
  REQUIRE(full.size() == only.size());
  std::vector<uint16_t> a(size_t(full.size())), b(a.size());
  REQUIRE(cudaMemcpy(a.data(), full.bf16, a.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(b.data(), only.bf16, b.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += a[i] != b[i];
  INFO(what, " (FP32 dropped): ", bad, " of ", a.size(), " companions differ from the FP32-kept form's");
  CHECK(bad == 0);
}

// `produce(drop_f32)` runs producers into output tensors it gives BF16
// companions (add_bf16_companion(t, drop_f32)) and returns them: with the FP32
// values kept, each companion is the RNE BF16 of its tensor; with them dropped,
// the same companion bits.
void expect_companions(Backend& be, const std::string& what, const std::vector<std::string>& names,
                       const std::function<std::vector<Tensor>(bool)>& produce) {
  const std::vector<Tensor> kept = produce(false), dropped = produce(true);
  REQUIRE(kept.size() == names.size());
  REQUIRE(dropped.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    expect_companion(be, what + ": " + names[i], kept[i]);
    expect_same_companion(what + ": " + names[i], kept[i], dropped[i]);
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
  for (const char* type : {"gpt", "vit"}) {
    CAPTURE(type);
    expect_step_matches(b, small_step(type, 3), sc);
  }
}

TEST_CASE("cuda backend: BF16 companions are the RNE BF16 of what each producer writes") {
  auto be = make_backend("cuda");
  // GELU, in-place dropout_backward and LayerNorm, around BF16 ties, with a
  // companion 2 bytes off alignment too (the scalar stores).
  for (int64_t n : {1, 7, 4099, 10007}) {
    for (bool shifted : {false, true}) {
      CAPTURE(n);
      CAPTURE(shifted);
      auto x = randv(size_t(n), 70 + uint32_t(n), 3.0f);
      for (size_t i = 0; i < x.size(); i += 3)  // low halves 0x8000 exactly: BF16 ties
        x[i] = fp4lab::bits_float((fp4lab::float_bits(x[i]) & 0xFFFF0000u) | 0x8000u);
      Tensor xt = put(*be, x, 1, n), dyt = put(*be, randv(size_t(n), 71 + uint32_t(n)), 1, n);
      auto with_companion = [&](int64_t rows, int64_t cols) {
        Tensor t = be->empty(rows, cols);
        if (!shifted) {
          be->add_bf16_companion(t);
        } else {
          Tensor wide = be->empty(1, rows * cols + 1);
          be->add_bf16_companion(wide);
          t.bf16 = wide.bf16 + 1;
          t.bf16_mem = wide.bf16_mem;
        }
        return t;
      };
      Tensor y = with_companion(1, n), dx = with_companion(1, n);
      be->gelu_forward(xt, y);
      be->gelu_backward(xt, dyt, dx);
      expect_companion(*be, "gelu_forward", y);
      expect_companion(*be, "gelu_backward", dx);
      for (float p : {0.2f, 0.0f}) {
        Tensor d = with_companion(1, n);
        be->copy(dyt, d);  // copy leaves the companion stale; dropout_backward writes it
        be->dropout_backward(d, p, DropoutKey{3, 4});
        expect_companion(*be, p > 0 ? "dropout_backward" : "dropout_backward (p = 0)", d);
      }
      const int64_t rows = n == 1 ? 1 : 7, cols = n / rows;
      Tensor ln = with_companion(rows, cols), mean = be->empty(1, rows), rstd = be->empty(1, rows);
      Tensor g = put(*be, randv(size_t(cols), 72, 0.5f, 1.0f), 1, cols);
      be->layernorm_forward(view_of(xt.data, rows, cols), g.data, nullptr, 1e-5f, ln, mean, rstd);
      expect_companion(*be, "layernorm_forward", ln);
      if (shifted) continue;
      // The companions alone (FP32 dropped): the same bits.
      expect_companions(*be, "gelu", {"forward y", "backward dx"}, [&](bool drop) {
        Tensor y2 = be->empty(1, n), dx2 = be->empty(1, n);
        be->add_bf16_companion(y2, drop);
        be->add_bf16_companion(dx2, drop);
        be->gelu_forward(xt, y2);
        be->gelu_backward(xt, dyt, dx2);
        return std::vector<Tensor>{y2, dx2};
      });
      expect_companions(*be, "layernorm_forward", {"y"}, [&](bool drop) {
        Tensor l2 = be->empty(rows, cols);
        be->add_bf16_companion(l2, drop);
        be->layernorm_forward(view_of(xt.data, rows, cols), g.data, nullptr, 1e-5f, l2, mean, rstd);
        return std::vector<Tensor>{l2};
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
      expect_companions(*be, "dropout", {"dropout_backward_to dst", "add_dropout_backward_to dst"}, [&](bool drop) {
        Tensor src = put(*be, dy, 1, n), dst = be->empty(1, n), y = put(*be, dy, 1, n), yx = put(*be, x, 1, n),
               dst2 = be->empty(1, n);
        be->add_bf16_companion(dst, drop);
        be->add_bf16_companion(dst2, drop);
        be->dropout_backward_to(src, dst, p, key);
        be->add_dropout_backward_to(y, yx, dst2, p, key);
        sums[drop] = get(*be, y);
        return std::vector<Tensor>{dst, dst2};
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
        expect_companions(*be, "attention", {"forward out", "backward dqkv"}, [&](bool drop) {
          Tensor o = be->empty(N, C), pr = be->empty(g.B * g.H * g.T, g.T), dq = be->empty(N, 3 * C);
          be->add_bf16_companion(o, drop);
          be->add_bf16_companion(dq, drop);
          be->attention_forward(s, q, o, pr, key);
          be->attention_backward(s, q, pr, d, dq, key);
          return std::vector<Tensor>{o, dq};
        });
      }
}

namespace {
// The two words of t's amax companion.
std::vector<uint32_t> amax_words(const Tensor& t) {
  std::vector<uint32_t> w(2);
  fp4lab::cuda::check(cudaMemcpy(w.data(), t.amax, 8, cudaMemcpyDeviceToHost), "test");
  return w;
}
// What the companion must hold for the values v [rows, cols]: the max
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

TEST_CASE("cuda backend: amax companions are the tensor amaxes of what each producer writes") {
  auto be = make_backend("cuda");
  for (const AmaxRequest r : {AmaxRequest{true, 41}, AmaxRequest{false, 0}}) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{48, 64}, {1040, 132}}) {
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
        Tensor t = be->empty(rows, cols);
        be->add_amax_companion(t, r);
        CHECK_FALSE(t.amax_written);
        return t;
      };
      auto expect = [&](const char* what, const Tensor& t, const Tensor& plain) {
        CAPTURE(what);
        REQUIRE(t.amax_written);
        const std::vector<float> v = get(*be, t);
        expect_same_bits(std::string(what) + " (values, against the op without a companion)", v, get(*be, plain));
        const std::vector<uint32_t> got = amax_words(t), want = want_amax(v, rows, cols, r);
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
      Tensor y = with_amax(), y0 = be->empty(rows, cols);
      be->gelu_forward(xt, y);
      be->gelu_forward(xt, y0);
      expect("gelu_forward", y, y0);
      Tensor dx = with_amax(), dx0 = be->empty(rows, cols);
      be->gelu_backward(xt, dyt, dx);
      be->gelu_backward(xt, dyt, dx0);
      expect("gelu_backward", dx, dx0);
      for (float p : {0.2f, 0.0f}) {
        CAPTURE(p);
        Tensor d = with_amax(), d0 = be->empty(rows, cols);
        be->dropout_backward_to(dyt, d, p, DropoutKey{5, 6});
        be->dropout_backward_to(dyt, d0, p, DropoutKey{5, 6});
        expect("dropout_backward_to", d, d0);
        Tensor ya = put(*be, res, rows, cols), yb = put(*be, res, rows, cols);
        Tensor e = with_amax(), e0 = be->empty(rows, cols);
        be->add_dropout_backward_to(ya, xt, e, p, DropoutKey{7, 8});
        be->add_dropout_backward_to(yb, xt, e0, p, DropoutKey{7, 8});
        expect("add_dropout_backward_to", e, e0);
        expect_same_bits("add_dropout_backward_to (y += x)", get(*be, ya), get(*be, yb));
      }
      // A producer that does not write the companion leaves it unwritten.
      Tensor l = with_amax(), mean = be->empty(1, rows), rstd = be->empty(1, rows);
      Tensor g = put(*be, randv(size_t(cols), 83, 0.5f, 1.0f), 1, cols);
      be->layernorm_forward(xt, g.data, nullptr, 1e-5f, l, mean, rstd);
      CHECK_FALSE(l.amax_written);
    }
  }
  // A shape the producer cannot serve (rows % 16 != 0): no amaxes, and the values stand.
  Tensor x = put(*be, randv(40, 90), 10, 4), y = be->empty(10, 4);
  be->add_amax_companion(y, AmaxRequest{true, 3});
  be->gelu_forward(x, y);
  CHECK_FALSE(y.amax_written);
}

// The NVFP4 layers take their amaxes from the companions: every canned recipe
// with one-pass operands gives the same bits with and without them (the
// companion replaces the layer's own amax pass only), forward and backward.
TEST_CASE("cuda backend: NVFP4 layers with amax companions give the bits of their own amax passes") {
  auto be = make_backend("cuda");
  int requests = 0;
  for (const std::string& name : fp4lab::recipe_names()) {
    const fp4lab::Recipe rec = fp4lab::recipe_by_name(name);
    CAPTURE(name);
    const int64_t B = 64, in = 96, out = 48;
    const fp4lab::LinearContext lc{&rec, 21, 3, 4, "h.1.mlp.c_proj"};
    const std::optional<AmaxRequest> rx = be->linear_amax_request(lc, false, B, in);
    const std::optional<AmaxRequest> ry = be->linear_amax_request(lc, true, B, out);
    requests += int(rx.has_value()) + int(ry.has_value());
    if (!rx && !ry) continue;
    const auto h = randv(size_t(B * in), 91, 2.0f), w = randv(size_t(out * in), 92, 0.2f);
    const auto g = randv(size_t(B * out), 93, 1e-3f);
    Tensor ht = put(*be, h, B, in), wt = put(*be, w, out, in), gt = put(*be, g, B, out);
    std::vector<std::vector<float> > got[2];
    for (int with = 0; with < 2; ++with) {
      Tensor x = be->empty(B, in), dy = be->empty(B, out);
      if (with && rx) be->add_amax_companion(x, *rx);
      if (with && ry) be->add_amax_companion(dy, *ry);
      be->gelu_forward(ht, x);  // x = gelu(h): the producer writes the companion
      be->dropout_backward_to(gt, dy, 0.1f, DropoutKey{9, 10});
      if (with) {
        CHECK(x.amax_written == rx.has_value());
        CHECK(dy.amax_written == ry.has_value());
      }
      Tensor y = be->empty(B, out), dx = be->empty(B, in), dw = be->empty(out, in);
      be->fill(dw, 0.0f);
      std::unique_ptr<LinearState> st;
      be->linear_forward(lc, x, wt, nullptr, y, st);
      be->linear_backward(lc, *st, wt, dy, dx, dw, nullptr);
      got[with] = {get(*be, y), get(*be, dx), get(*be, dw)};
    }
    expect_same_bits("y", got[0][0], got[1][0]);
    expect_same_bits("dx", got[0][1], got[1][1]);
    expect_same_bits("dW", got[0][2], got[1][2]);
  }
  CHECK(requests >= 2);  // nvfp4 asks for both
  // And the request follows the plan: none for the bf16 recipe.
  const fp4lab::Recipe bf16 = fp4lab::recipe_by_name("bf16");
  CHECK_FALSE(be->linear_amax_request(fp4lab::LinearContext{&bf16, 1, 0, 0, "h.0.mlp.c_fc"}, false, 64, 96));
}

TEST_CASE("cuda backend: a bf16-recipe GPT and ViT step (operands from BF16 companions) match the CPU") {
  Pair b;
  const fp4lab::Recipe bf16 = fp4lab::recipe_by_name("bf16");
  StepContext sc;
  sc.recipe = &bf16;
  sc.seed = 12;
  sc.step = 1;
  fp4lab::LinearContext lc{&bf16, sc.seed, 0, sc.step, "h.0.attn.c_attn"};
  CHECK(b.gpu->linear_reads_bf16(lc, false));
  CHECK(b.gpu->linear_reads_bf16(lc, true));
  CHECK_FALSE(b.cpu->linear_reads_bf16(lc, false));
  // Same BF16 operands (a stale or wrong companion would be far off).
  for (const char* type : {"gpt", "vit"}) {
    CAPTURE(type);
    expect_step_matches(b, small_step(type, 4), sc);
  }
}

// What producers write for their consumer layers (BF16 operands, NVFP4 amaxes,
// FP32 values dropped: model.hpp's empty_for_linear) only replaces work the
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
