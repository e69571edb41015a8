// The CUDA backend (train/cuda/backend.cpp) against the CPU backend, op by
// op: random inputs, awkward shapes, dropout masks compared bit for bit,
// everything else at an FP32 tolerance, and run-to-run determinism. Without a
// GPU the executable reports SKIPPED (tests/gpu_main.cpp).
//
// Tolerance: the two backends evaluate the same FP32/FP64 operations and differ
// only in summation order (and erff/expf vs glibc, <= 2 ulp). A sum of K
// float terms reordered changes by about sqrt(K) * 2^-24 * max|term|
// typically, K * 2^-24 * sum|term| at worst; with K <= a few hundred and the
// chained GEMM -> softmax -> GEMM of attention this stays below ~1e-5 of the
// output's magnitude. So: max |gpu - cpu| <= tol * (1 + max |cpu|) with tol 2e-6
// for elementwise ops, 1e-5 for row reductions and 3e-5 for attention.
#include <doctest/doctest.h>

#include "train/backend.hpp"


#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "train/model.hpp"
#include "core/encode.hpp"
#include "recipes/recipe.hpp"
#include "sim/rht.hpp"
#include "cuda/device.hpp"
#include "gpu_test_util.hpp"

using namespace fp4lab::train;

namespace {

// Normal draws (never exactly zero in practice) times s, plus `shift`.
std::vector<float> randv(size_t n, uint32_t seed, float s = 1.0f, float shift = 0.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, s);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = d(g) + shift;
    if (x == 0.0f) x = 0.5f;
  }
  return v;
}

Tensor put(Backend& be, const std::vector<float>& v, int64_t rows, int64_t cols) {
  Tensor t = be.empty(rows, cols);
  REQUIRE(int64_t(v.size()) == rows * cols);
  be.upload(v.data(), t);
  return t;
}
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
  INFO(what, ": ", bad, " of ", v.size(), " companions differ, first at ", first);
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

TEST_CASE("cuda backend: memory, copies and the caching allocator") {
  Pair b;
  Backend& g = *b.gpu;
  const auto v = randv(7 * 13, 1);
  Tensor t = put(g, v, 7, 13);
  expect_same_bits("upload/download", v, get(g, t));
  Tensor u = g.empty(13, 7);
  g.copy(t, u);
  expect_same_bits("copy", v, get(g, u));
  g.fill(u, -2.5f);
  expect_same_bits("fill", std::vector<float>(v.size(), -2.5f), get(g, u));
  Tensor z = g.zeros(3, 3);
  expect_same_bits("zeros", std::vector<float>(9, 0.0f), get(g, z));
  // copy_cols: 4 columns from column 5 of t into column 2 of d [7, 9].
  const auto dv = randv(7 * 9, 2);
  Tensor d = put(g, dv, 7, 9), dc = put(*b.cpu, dv, 7, 9), tc = put(*b.cpu, v, 7, 13);
  g.copy_cols(t, 5, d, 2, 4);
  b.cpu->copy_cols(tc, 5, dc, 2, 4);
  expect_same_bits("copy_cols", get(*b.cpu, dc), get(g, d));
  CHECK_THROWS(g.copy_cols(t, 10, d, 0, 4));
  // A freed block is reused for the next request of the same size.
  float* p = nullptr;
  {
    Tensor a = g.empty(100, 33);
    p = a.data;
  }
  Tensor a2 = g.empty(100, 33);
  CHECK(a2.data == p);
  Tensor e = g.empty(0, 5);  // empty tensors are fine
  CHECK(e.size() == 0);
  // Tensors may outlive their backend.
  Tensor survivor = g.empty(10, 10);
  b.gpu.reset();
  survivor = Tensor{};
}

TEST_CASE("cuda backend: layernorm forward/backward match the CPU") {
  Pair b;
  const int64_t shapes[][2] = {{1, 1}, {1, 5}, {3, 7}, {37, 64}, {300, 130}, {513, 768}, {1100, 200}};
  int k = 0;
  for (auto [N, C] : shapes) {
    const bool with_beta = k++ % 2 == 0;
    CAPTURE(N);
    CAPTURE(C);
    CAPTURE(with_beta);
    const auto x = randv(size_t(N * C), 10 + k, 2.0f, 0.3f), gam = randv(size_t(C), 20 + k, 0.5f, 1.0f),
               bet = randv(size_t(C), 30 + k), dy = randv(size_t(N * C), 40 + k), dg0 = randv(size_t(C), 50 + k),
               db0 = randv(size_t(C), 60 + k);
    std::vector<std::vector<float> > out[2];
    for (int w = 0; w < 2; ++w) {
      Backend& be = w ? *b.gpu : *b.cpu;
      Tensor xt = put(be, x, N, C), gt = put(be, gam, 1, C), bt = put(be, bet, 1, C), y = be.empty(N, C),
             mean = be.empty(1, N), rstd = be.empty(1, N);
      be.layernorm_forward(xt, gt.data, with_beta ? bt.data : nullptr, 1e-5f, y, mean, rstd);
      Tensor dyt = put(be, dy, N, C), dx = be.empty(N, C), dg = put(be, dg0, 1, C), db = put(be, db0, 1, C);
      be.layernorm_backward(dyt, xt, gt.data, mean, rstd, dx, dg.data, with_beta ? db.data : nullptr);
      out[w] = {get(be, y), get(be, mean), get(be, rstd), get(be, dx), get(be, dg), get(be, db)};
      // The residual form: the bits of the plain form followed by add_inplace.
      Tensor res = put(be, randv(size_t(N * C), 70 + k), N, C), dxr = be.empty(N, C), dg2 = put(be, dg0, 1, C);
      be.layernorm_backward(dyt, xt, gt.data, mean, rstd, dxr, dg2.data, nullptr, &res);
      be.add_inplace(dx, res);
      expect_same_bits(w ? "gpu: residual form" : "cpu: residual form", get(be, dx), get(be, dxr));
      expect_same_bits("dgamma with a residual", out[w][4], get(be, dg2));
    }
    const char* names[] = {"y", "mean", "rstd", "dx", "dgamma", "dbeta"};
    // dgamma and dbeta: the CPU's summation order (256-row blocks in row
    // order, then the blocks), so bit for bit.
    for (int i = 0; i < 4; ++i) expect_close(names[i], out[0][size_t(i)], out[1][size_t(i)], 1e-5);
    for (int i = 4; i < 6; ++i) expect_same_bits(names[i], out[0][size_t(i)], out[1][size_t(i)]);
  }
}

TEST_CASE("cuda backend: gelu forward/backward match the CPU") {
  Pair b;
  for (int64_t n : {1, 257, 10007}) {
    CAPTURE(n);
    const auto x = randv(size_t(n), 3 + uint32_t(n), 3.0f), dy = randv(size_t(n), 4 + uint32_t(n));
    std::vector<float> y[2], dx[2];
    for (int w = 0; w < 2; ++w) {
      Backend& be = w ? *b.gpu : *b.cpu;
      Tensor xt = put(be, x, 1, n), yt = be.empty(1, n), dyt = put(be, dy, 1, n), dxt = be.empty(1, n);
      be.gelu_forward(xt, yt);
      be.gelu_backward(xt, dyt, dxt);
      y[w] = get(be, yt);
      dx[w] = get(be, dxt);
    }
    expect_close("gelu y", y[0], y[1], 2e-6);
    expect_close("gelu dx", dx[0], dx[1], 2e-6);
  }
}

TEST_CASE("cuda backend: attention forward/backward match the CPU (causal/full, dropout on/off)") {
  Pair b;
  struct Geo {
    int64_t B, T, H, hd;
  };
  const Geo geos[] = {{1, 1, 1, 1},   {2, 1, 2, 3},    {2, 5, 3, 8},   {3, 17, 2, 16},
                      {2, 64, 4, 16}, {1, 130, 2, 32}, {2, 256, 6, 8}, {1, 256, 2, 64}};
  uint32_t seed = 100;
  for (const Geo& g : geos) {
    for (bool causal : {false, true}) {
      for (float p : {0.0f, 0.1f}) {
        const int64_t B = g.B, T = g.T, H = g.H, C = H * g.hd;
        const float scale = causal ? float(1.0 / std::sqrt(double(g.hd))) : float(std::sqrt(double(g.hd)));
        CAPTURE(B);
        CAPTURE(T);
        CAPTURE(H);
        CAPTURE(C);
        CAPTURE(causal);
        CAPTURE(p);
        const AttentionShape s{B, T, H, causal, scale, p};
        const DropoutKey key{77, 0xABCDEF0123ull};
        const auto qkv = randv(size_t(B * T * 3 * C), ++seed, 0.7f), dout = randv(size_t(B * T * C), ++seed);
        std::vector<float> out[2], probs[2], dqkv[2];
        for (int w = 0; w < 2; ++w) {
          Backend& be = w ? *b.gpu : *b.cpu;
          Tensor q = put(be, qkv, B * T, 3 * C), o = be.empty(B * T, C), pr = be.empty(B * H * T, T),
                 d = put(be, dout, B * T, C), dq = be.empty(B * T, 3 * C);
          if (w == 1) {  // the GPU writes BF16 companions of out and dqkv too (fused and cuBLAS paths)
            be.add_bf16_companion(o);
            be.add_bf16_companion(dq);
          }
          be.attention_forward(s, q, o, pr, key);
          be.attention_backward(s, q, pr, d, dq, key);
          if (w == 1) {
            expect_companion(be, "attention_forward out", o);
            expect_companion(be, "attention_backward dqkv", dq);
            // The companions alone (FP32 dropped), the same bits.
            Tensor o2 = be.empty(B * T, C), pr2 = be.empty(B * H * T, T), dq2 = be.empty(B * T, 3 * C);
            be.add_bf16_companion(o2, true);
            be.add_bf16_companion(dq2, true);
            be.attention_forward(s, q, o2, pr2, key);
            be.attention_backward(s, q, pr2, d, dq2, key);
            expect_same_companion("attention_forward out", o, o2);
            expect_same_companion("attention_backward dqkv", dq, dq2);
          }
          out[w] = get(be, o);
          probs[w] = get(be, pr);
          dqkv[w] = get(be, dq);
        }
        expect_close("attention probs", probs[0], probs[1], 1e-5);
        expect_close("attention out", out[0], out[1], 3e-5);
        expect_close("attention dqkv", dqkv[0], dqkv[1], 3e-5);
        if (causal && T > 1) CHECK(probs[1][1] == 0.0f);  // row 0 sees only token 0
      }
    }
  }
}

TEST_CASE(
    "cuda backend: dropout masks (and the fused dropout_add, dropout_backward_to, add_dropout_backward_to) are the "
    "CPU's bit for bit") {
  Pair b;
  for (int64_t n : {1, 3, 4, 5, 1000, 4097}) {
    for (float p : {0.0f, 0.1f, 0.5f, 0.9f}) {
      CAPTURE(n);
      CAPTURE(p);
      const auto x = randv(size_t(n), 7 + uint32_t(n)), dy = randv(size_t(n), 8 + uint32_t(n));
      const DropoutKey key{0x1234567890ull, (uint64_t(0xD) << 60) | 12345};
      std::vector<float> xf[2], dyb[2], res[2], to[2], sum[2], sum_to[2];
      for (int w = 0; w < 2; ++w) {
        Backend& be = w ? *b.gpu : *b.cpu;
        Tensor xt = put(be, x, 1, n), dt = put(be, dy, 1, n), rt = put(be, x, 1, n);
        // Out of place, one pass on the GPU: dst = drop(src); y += x, dst = drop(y).
        Tensor src = put(be, dy, 1, n), dst = be.empty(1, n), y = put(be, dy, 1, n), yx = put(be, x, 1, n),
               dst2 = be.empty(1, n);
        if (w == 1) {
          be.add_bf16_companion(dst);
          be.add_bf16_companion(dst2);
        }
        be.dropout_forward(xt, p, key);
        be.dropout_backward(dt, p, key);
        be.dropout_add(rt, dt, p, key);  // the residual branch: drop(x) + dy, fused on the GPU
        be.dropout_backward_to(src, dst, p, key);
        be.add_dropout_backward_to(y, yx, dst2, p, key);
        xf[w] = get(be, xt);
        dyb[w] = get(be, dt);
        res[w] = get(be, rt);
        to[w] = get(be, dst);
        sum[w] = get(be, y);
        sum_to[w] = get(be, dst2);
        CHECK(get(be, src) == dy);  // the source stays
        if (w == 1) {
          expect_companion(be, "dropout_backward_to", dst);
          expect_companion(be, "add_dropout_backward_to", dst2);
          Tensor src3 = put(be, dy, 1, n), dst3 = be.empty(1, n), y3 = put(be, dy, 1, n), dst4 = be.empty(1, n);
          be.add_bf16_companion(dst3, true);
          be.add_bf16_companion(dst4, true);
          be.dropout_backward_to(src3, dst3, p, key);
          be.add_dropout_backward_to(y3, yx, dst4, p, key);
          expect_same_companion("dropout_backward_to", dst, dst3);
          expect_same_companion("add_dropout_backward_to", dst2, dst4);
          expect_same_bits("add_dropout_backward_to's sum (FP32 of dst dropped)", get(be, y), get(be, y3));
        }
      }
      expect_same_bits("dropout forward", xf[0], xf[1]);
      expect_same_bits("dropout backward", dyb[0], dyb[1]);
      expect_same_bits("dropout_add", res[0], res[1]);
      expect_same_bits("dropout_backward_to", to[0], to[1]);
      expect_same_bits("dropout_backward_to == dropout_backward in place", dyb[1], to[1]);
      expect_same_bits("add_dropout_backward_to (the sum)", sum[0], sum[1]);
      expect_same_bits("add_dropout_backward_to (dst)", sum_to[0], sum_to[1]);
      std::vector<float> unfused = xf[1];  // the GPU's dropout then add, element by element
      for (size_t i = 0; i < unfused.size(); ++i) unfused[i] += dyb[1][i];
      expect_same_bits("dropout_add == dropout then add", unfused, res[1]);
      if (p == 0.0f) expect_same_bits("p = 0 is a no-op", x, xf[1]);
      if (n >= 1000 && p > 0.0f) {  // the masks really drop about p of the elements
        const auto zeros = std::count(xf[1].begin(), xf[1].end(), 0.0f);
        CHECK(std::abs(double(zeros) / double(n) - p) < 0.06);
      }
    }
  }
}

TEST_CASE("cuda backend: add_inplace, scale, gather/scatter rows") {
  Pair b;
  const int64_t N = 37, C = 11, stride = 9, n = 4;
  const auto y = randv(size_t(N * C), 1), x = randv(size_t(N * C), 2), d = randv(size_t(n * C), 3);
  std::vector<float> r[2][4];
  for (int w = 0; w < 2; ++w) {
    Backend& be = w ? *b.gpu : *b.cpu;
    Tensor yt = put(be, y, N, C), xt = put(be, x, N, C);
    be.add_inplace(yt, xt);
    r[w][0] = get(be, yt);
    be.scale(yt, -0.37f);
    r[w][1] = get(be, yt);
    Tensor g = be.empty(n, C);
    be.gather_rows(xt, stride, g);
    r[w][2] = get(be, g);
    Tensor dt = put(be, d, n, C), dx = put(be, y, N, C);
    be.scatter_rows(dt, stride, dx);
    r[w][3] = get(be, dx);
  }
  expect_same_bits("add_inplace", r[0][0], r[1][0]);
  expect_same_bits("scale", r[0][1], r[1][1]);
  expect_same_bits("gather_rows", r[0][2], r[1][2]);
  expect_same_bits("scatter_rows", r[0][3], r[1][3]);
}

TEST_CASE("cuda backend: GPT embeddings forward/backward match the CPU") {
  Pair b;
  struct Geo {
    int64_t V, B, T, C;
  };
  for (const Geo& g : {Geo{37, 3, 11, 24}, Geo{5, 1, 1, 1}, Geo{65, 4, 64, 300}, Geo{3, 2, 300, 7}}) {
    CAPTURE(g.V);
    CAPTURE(g.T);
    const int64_t n = g.B * g.T;
    std::mt19937 rng(uint32_t(g.V * 31 + g.T));
    std::vector<int32_t> idx(static_cast<size_t>(n));
    for (auto& i : idx) i = int32_t(rng() % uint32_t(g.V));
    const auto wte = randv(size_t(g.V * g.C), 1), wpe = randv(size_t(g.T * g.C), 2), dout = randv(size_t(n * g.C), 3),
               dwte0 = randv(size_t(g.V * g.C), 4), dwpe0 = randv(size_t(g.T * g.C), 5);
    std::vector<float> out[2], dwte[2], dwpe[2];
    for (int w = 0; w < 2; ++w) {
      Backend& be = w ? *b.gpu : *b.cpu;
      Tensor te = put(be, wte, g.V, g.C), pe = put(be, wpe, g.T, g.C), o = be.empty(n, g.C), d = put(be, dout, n, g.C),
             dte = put(be, dwte0, g.V, g.C), dpe = put(be, dwpe0, g.T, g.C);
      be.embed_forward(idx.data(), g.B, g.T, te, pe, o);
      be.embed_backward(idx.data(), g.B, g.T, d, dte, dpe);
      out[w] = get(be, o);
      dwte[w] = get(be, dte);
      dwpe[w] = get(be, dpe);
    }
    expect_same_bits("embedding out", out[0], out[1]);
    // The same additions in the same order as the CPU (float32 scatter-add in
    // row order; float64 column sums in row order): bit-identical.
    expect_same_bits("dwte", dwte[0], dwte[1]);
    expect_same_bits("dwpe", dwpe[0], dwpe[1]);
  }
  // Out-of-range ids are rejected before anything runs.
  Backend& g = *b.gpu;
  Tensor te = g.zeros(4, 2), pe = g.zeros(2, 2), o = g.empty(2, 2);
  const int32_t bad[] = {1, 4};
  CHECK_THROWS_WITH(g.embed_forward(bad, 1, 2, te, pe, o), doctest::Contains("outside the vocabulary"));
}

TEST_CASE("cuda backend: ViT tokens forward/backward match the CPU") {
  Pair b;
  struct Geo {
    int64_t B, P, C;
  };
  for (const Geo& g : {Geo{3, 16, 20}, Geo{1, 1, 3}, Geo{300, 2, 5}, Geo{64, 16, 64}}) {
    CAPTURE(g.B);
    CAPTURE(g.P);
    const int64_t L = g.P + 1;
    const auto patches = randv(size_t(g.B * g.P * g.C), 1), cls = randv(size_t(g.C), 2),
               pos = randv(size_t(L * g.C), 3), dout = randv(size_t(g.B * L * g.C), 4), dcls0 = randv(size_t(g.C), 5),
               dpos0 = randv(size_t(L * g.C), 6);
    std::vector<float> r[2][4];
    for (int w = 0; w < 2; ++w) {
      Backend& be = w ? *b.gpu : *b.cpu;
      Tensor pt = put(be, patches, g.B * g.P, g.C), ct = put(be, cls, 1, g.C), post = put(be, pos, L, g.C),
             o = be.empty(g.B * L, g.C);
      be.vit_tokens_forward(pt, g.B, ct.data, post, o);
      Tensor d = put(be, dout, g.B * L, g.C), dp = be.empty(g.B * g.P, g.C), dc = put(be, dcls0, 1, g.C),
             dps = put(be, dpos0, L, g.C);
      be.vit_tokens_backward(d, g.B, dp, dc.data, dps);
      r[w][0] = get(be, o);
      r[w][1] = get(be, dp);
      r[w][2] = get(be, dc);
      r[w][3] = get(be, dps);
    }
    expect_same_bits("vit tokens", r[0][0], r[1][0]);
    expect_same_bits("dpatches", r[0][1], r[1][1]);
    // Float64 column sums in the CPU's order: bit-identical.
    expect_same_bits("dcls", r[0][2], r[1][2]);
    expect_same_bits("dpos", r[0][3], r[1][3]);
  }
}

TEST_CASE("cuda backend: cross-entropy matches the CPU (loss, hits with ties, dlogits)") {
  Pair b;
  const int64_t shapes[][2] = {{1, 1}, {1, 10}, {7, 65}, {300, 1000}, {513, 10}, {3, 129}};
  uint32_t seed = 9;
  for (auto [N, V] : shapes) {
    CAPTURE(N);
    CAPTURE(V);
    auto logits = randv(size_t(N * V), ++seed, 3.0f);
    std::mt19937 rng(++seed);
    std::vector<int32_t> tg(static_cast<size_t>(N));
    for (auto& t : tg) t = int32_t(rng() % uint32_t(V));
    // Ties for the maximum in every third row: argmax must be the first one.
    for (int64_t r = 0; r < N && V > 1; r += 3) {
      float* l = logits.data() + r * V;
      const float mx = *std::max_element(l, l + V) + 1.0f;
      const int64_t j = int64_t(rng() % uint32_t(V - 1)), k = j + 1 + int64_t(rng() % uint32_t(V - 1 - j));
      l[j] = l[k] = mx;
      tg[size_t(r)] = int32_t(r % 2 ? j : k);  // a hit on odd rows, a miss on even rows
    }
    double loss[2];
    int64_t correct[2];
    std::vector<float> dl[2];
    double eval_loss[2];
    for (int w = 0; w < 2; ++w) {
      Backend& be = w ? *b.gpu : *b.cpu;
      Tensor lt = put(be, logits, N, V), d = be.empty(N, V);
      loss[w] = be.cross_entropy(lt, tg.data(), &d, &correct[w]);
      dl[w] = get(be, d);
      eval_loss[w] = be.cross_entropy(lt, tg.data(), nullptr, nullptr);
    }
    CHECK(correct[0] == correct[1]);
    CHECK(std::abs(loss[0] - loss[1]) <= 1e-12 * (1.0 + std::abs(loss[0])));
    CHECK(eval_loss[1] == loss[1]);
    expect_close("dlogits", dl[0], dl[1], 2e-6);
    // Split into start / finish, with the logits overwritten on the device and
    // the host's targets changed after the start: the loss, hits and dlogits
    // are those of the inputs at the start (stream order; staged targets).
    for (int w = 0; w < 2; ++w) {
      CAPTURE(w);
      Backend& be = w ? *b.gpu : *b.cpu;
      Tensor lt = put(be, logits, N, V), d = be.empty(N, V);
      std::vector<int32_t> tg2 = tg;
      be.cross_entropy_start(lt, tg2.data(), &d);
      std::vector<float> dl_split = get(be, d);  // before the logits change (a download waits)
      be.fill(lt, 0.0f);
      std::fill(tg2.begin(), tg2.end(), 0);
      int64_t c = -1;
      CHECK(be.cross_entropy_finish(&c) == loss[w]);
      CHECK(c == correct[w]);
      CHECK(dl_split == dl[w]);
      CHECK_THROWS_WITH(be.cross_entropy_finish(nullptr), doctest::Contains("no cross_entropy_start"));
    }
  }
  Backend& g = *b.gpu;
  Tensor l = g.zeros(1, 3);
  const int32_t bad = 3;
  CHECK_THROWS_WITH(g.cross_entropy(l, &bad, nullptr, nullptr), doctest::Contains("outside [0, 3)"));
  CHECK_THROWS_WITH(g.cross_entropy_start(l, &bad, nullptr), doctest::Contains("outside [0, 3)"));
  CHECK_THROWS_WITH(g.cross_entropy_finish(nullptr), doctest::Contains("no cross_entropy_start"));
}

TEST_CASE("cuda backend: sum_squares and AdamW match the CPU") {
  Pair b;
  for (int64_t n : {1, 1000, 16384, 16385, 100003}) {
    CAPTURE(n);
    const auto g = randv(size_t(n), uint32_t(n));
    double s[2];
    for (int w = 0; w < 2; ++w) {
      Backend& be = w ? *b.gpu : *b.cpu;
      Tensor t = put(be, g, 1, n);
      s[w] = be.sum_squares(t);
    }
    CHECK(std::abs(s[0] - s[1]) <= 1e-12 * s[0]);
  }
  const int64_t n = 5003;
  const auto p0 = randv(size_t(n), 1), m0 = randv(size_t(n), 3, 0.1f);
  auto v0 = randv(size_t(n), 4, 0.01f);
  for (auto& x : v0) x = std::abs(x);
  // Decayed ranges: many short ones (edges everywhere, first element included),
  // then one long one that ends at the buffer's last element.
  std::vector<IndexRange> ranges, ranges2{{1000, n - 1000}};
  std::mt19937 rng(5);
  for (int64_t at = 0; at < n;) {
    const int64_t len = 1 + int64_t(rng() % 37), gap = int64_t(rng() % 29) + 1;
    if (at + len > n) break;
    ranges.push_back({at, len});
    at += len + gap;
  }
  for (float wd : {0.0f, 0.1f}) {
    CAPTURE(wd);
    std::vector<float> r[2][3];
    for (int w = 0; w < 2; ++w) {
      Backend& be = w ? *b.gpu : *b.cpu;
      Tensor p = put(be, p0, 1, n), m = put(be, m0, 1, n), v = put(be, v0, 1, n);
      for (int64_t t = 1; t <= 4; ++t) {  // ranges change at step 3 (the GPU rebuilds its mask)
        Tensor gt = put(be, randv(size_t(n), 10 + uint32_t(t)), 1, n);
        be.adamw_step(p, gt, m, v, t < 3 ? ranges : ranges2, 1e-3f * float(t), 0.9f, 0.99f, 1e-8f, wd, t);
      }
      r[w][0] = get(be, p);
      r[w][1] = get(be, m);
      r[w][2] = get(be, v);
    }
    // The same FP32 operations in the same order (no FMA contraction on either
    // side, IEEE sqrt and division): bit-identical.
    expect_same_bits("adamw p", r[0][0], r[1][0]);
    expect_same_bits("adamw m", r[0][1], r[1][1]);
    expect_same_bits("adamw v", r[0][2], r[1][2]);
  }
}

TEST_CASE("cuda backend: every op gives the same bits run to run") {
  auto be = make_backend("cuda");
  const int64_t B = 3, T = 70, H = 4, C = 64, N = B * T, V = 65;
  const auto qkv = randv(size_t(N * 3 * C), 1), dout = randv(size_t(N * C), 2), gam = randv(size_t(C), 3, 0.3f, 1.0f),
             logits = randv(size_t(N * V), 4, 2.0f);
  std::vector<int32_t> idx(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) idx[size_t(i)] = int32_t((i * 7 + i / 5) % V);
  auto run = [&] {
    std::vector<std::vector<float> > r;
    Tensor q = put(*be, qkv, N, 3 * C), o = be->empty(N, C), pr = be->empty(B * H * T, T), d = put(*be, dout, N, C),
           dq = be->empty(N, 3 * C);
    const AttentionShape s{B, T, H, true, 0.125f, 0.1f};
    be->attention_forward(s, q, o, pr, DropoutKey{5, 6});
    be->attention_backward(s, q, pr, d, dq, DropoutKey{5, 6});
    r.push_back(get(*be, o));
    r.push_back(get(*be, dq));
    Tensor x = be->empty(N, C);
    be->copy_cols(q, 0, x, 0, C);
    Tensor g = put(*be, gam, 1, C), y = be->empty(N, C), mean = be->empty(1, N), rstd = be->empty(1, N),
           dx = be->empty(N, C), dg = be->zeros(1, C), db = be->zeros(1, C);
    be->layernorm_forward(x, g.data, nullptr, 1e-5f, y, mean, rstd);
    be->layernorm_backward(d, x, g.data, mean, rstd, dx, dg.data, db.data);
    r.push_back(get(*be, dx));
    r.push_back(get(*be, dg));
    r.push_back(get(*be, db));
    Tensor wte = be->zeros(V, C), wpe = be->zeros(T, C);
    be->embed_backward(idx.data(), B, T, d, wte, wpe);
    r.push_back(get(*be, wte));
    r.push_back(get(*be, wpe));
    Tensor lg = put(*be, logits, N, V), dl = be->empty(N, V);
    int64_t c = 0;
    const double loss = be->cross_entropy(lg, idx.data(), &dl, &c);
    r.push_back(get(*be, dl));
    const double ss = be->sum_squares(dq);
    r.push_back({float(loss), float(loss - double(float(loss))), float(c), float(ss), float(ss - double(float(ss)))});
    return r;
  };
  const auto a = run(), b2 = run();
  REQUIRE(a.size() == b2.size());
  for (size_t i = 0; i < a.size(); ++i) expect_same_bits("run " + std::to_string(i), a[i], b2[i]);
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
  for (int64_t n : {1, 7, 4099, 10007}) {
    for (bool shifted : {false, true}) {  // shifted: a companion 2 bytes off alignment (the scalar stores)
      CAPTURE(n);
      CAPTURE(shifted);
      // Values around BF16 ties too: x with low halves 0x8000 exactly.
      auto x = randv(size_t(n), 70 + uint32_t(n), 3.0f);
      for (size_t i = 0; i < x.size(); i += 3)
        x[i] = fp4lab::bits_float((fp4lab::float_bits(x[i]) & 0xFFFF0000u) | 0x8000u);
      const auto dy = randv(size_t(n), 71 + uint32_t(n));
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
      auto companion_only = [&](int64_t rows, int64_t cols) {
        Tensor t = be->empty(rows, cols);
        be->add_bf16_companion(t, true);
        return t;
      };
      Tensor xt = put(*be, x, 1, n), dyt = put(*be, dy, 1, n);
      Tensor y = with_companion(1, n), dx = with_companion(1, n), y2 = companion_only(1, n), dx2 = companion_only(1, n);
      be->gelu_forward(xt, y);
      expect_companion(*be, "gelu_forward", y);
      be->gelu_backward(xt, dyt, dx);
      expect_companion(*be, "gelu_backward", dx);
      be->gelu_forward(xt, y2);
      be->gelu_backward(xt, dyt, dx2);
      if (!shifted) {
        expect_same_companion("gelu_forward", y, y2);
        expect_same_companion("gelu_backward", dx, dx2);
      }
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
      Tensor ln2 = companion_only(rows, cols);
      be->layernorm_forward(view_of(xt.data, rows, cols), g.data, nullptr, 1e-5f, ln2, mean, rstd);
      if (!shifted) expect_same_companion("layernorm_forward", ln, ln2);
    }
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

