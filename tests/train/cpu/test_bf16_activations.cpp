// precision.activations "bf16" on the CPU backend (train/backend.hpp's
// contract; docs/DESIGN.md, "BF16 activations"), op by op, against an oracle
// built another way: the same op in fp32 mode on the same (or pre-rounded)
// inputs, then rounded by rne() below, an RNE written here by distances in
// double (not train/cpu/bf16.hpp's carry trick). Where the contract promises
// r(FP32 formula), the bits must be equal; where it promises nothing changes
// (FP32 outputs), the bits of fp32 mode.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "recipes/recipe.hpp"
#include "train/backend.hpp"
#include "train/backend_cases.hpp"
#include "train/forwarding_backend.hpp"

using namespace fp4lab::train;
using fp4lab::LinearContext;
using fp4lab::Recipe;
using fp4lab::recipe_by_name;
using fp4lab::recipe_names;
using fp4lab::train::test::put;
using fp4lab::train::test::randv;

namespace {

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// The BF16 value nearest to x, ties to the one with an even last kept bit;
// past the largest finite BF16 by half an ulp or more: Inf (IEEE's rule, with
// 2^128 as the "next" value above it). Chosen by comparing the distances to
// the two BF16 neighbours in double, where both are exact.
float rne(float x) {
  if (std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
  if (std::isinf(x)) return x;
  const uint32_t down = bits(x) & 0xFFFF0000u;  // the neighbour toward zero
  if (down == bits(x)) return x;
  const uint32_t up = down + 0x10000u;  // the neighbour away from zero (an Inf past the largest finite)
  const double lo = double(from_bits(down));
  const double hi = (up & 0x7F800000u) == 0x7F800000u ? std::copysign(std::ldexp(1.0, 128), x) : double(from_bits(up));
  const double d_lo = std::abs(double(x) - lo), d_hi = std::abs(hi - double(x));
  const bool take_up = d_hi < d_lo || (d_hi == d_lo && (down & 0x10000u) != 0);
  return from_bits(take_up ? up : down);
}
std::vector<float> rne(std::vector<float> v) {
  for (float& x : v) x = rne(x);
  return v;
}

TEST_CASE("the test's RNE oracle: ties, carries, overflow") {
  CHECK(bits(rne(1.0f)) == 0x3F800000u);
  CHECK(bits(rne(from_bits(0x3F808000u))) == 0x3F800000u);  // a tie, even kept part: down
  CHECK(bits(rne(from_bits(0x3F818000u))) == 0x3F820000u);  // a tie, odd kept part: up
  CHECK(bits(rne(from_bits(0x3F808001u))) == 0x3F810000u);  // above the tie: up
  CHECK(bits(rne(from_bits(0x3FFFFFFFu))) == 0x40000000u);  // the carry into the exponent
  CHECK(bits(rne(from_bits(0xBF808001u))) == 0xBF810000u);  // negative: away from zero
  CHECK(bits(rne(from_bits(0x7F7F7FFFu))) == 0x7F7F0000u);  // below half an ulp past the largest finite
  CHECK(bits(rne(from_bits(0x7F7F8000u))) == 0x7F800000u);  // half an ulp past it: Inf
  CHECK(bits(rne(from_bits(0x00008000u))) == 0x00000000u);  // subnormal tie, even: down to +0
}

std::unique_ptr<Backend> cpu(ActivationPrecision a) {
  auto be = make_cpu_backend(2);
  be->set_activations(a);
  return be;
}
std::unique_ptr<Backend> cpu32() { return cpu(ActivationPrecision::fp32); }
std::unique_ptr<Backend> cpu16() { return cpu(ActivationPrecision::bf16); }

std::vector<float> get(Backend& be, const Tensor& t) {
  std::vector<float> h(size_t(t.size()));
  be.download(t, h.data());
  return h;
}

// Bit-for-bit equality, naming the first mismatch.
void check_bits(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE_MESSAGE(got.size() == want.size(), what, ": ", got.size(), " values, expected ", want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (bits(got[i]) != bits(want[i]) && bad++ == 0) first = i;
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", got.size(), " differ; first at ", first, ": ",
                bad ? got[first] : 0.0f, " vs ", bad ? want[first] : 0.0f);
}
bool all_bf16(const std::vector<float>& v) {
  for (float x : v)
    if ((bits(x) & 0xFFFFu) != 0) return false;
  return true;
}
std::vector<float> add(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> s(a.size());
  for (size_t i = 0; i < a.size(); ++i) s[i] = a[i] + b[i];
  return s;
}

struct LinearOut {
  std::vector<float> y, dx, dw, db;
};
// One linear forward + backward on `be`: weight and gradient accumulators as given.
LinearOut run_linear(Backend& be, const Recipe* rec, int64_t B, int64_t in, int64_t out, const std::vector<float>& x,
                     const std::vector<float>& w, const std::vector<float>* b, const std::vector<float>& dy,
                     const std::vector<float>& dw0, const std::vector<float>& db0) {
  const LinearContext ctx{rec, 987654321ull, 5, 11, "blocks.0.mlp.fc"};
  Tensor xt = put(be, x, B, in), wt = put(be, w, out, in), dyt = put(be, dy, B, out);
  Tensor bt = b ? put(be, *b, 1, out) : Tensor{}, dw = put(be, dw0, out, in), db = put(be, db0, 1, out);
  Tensor y = be.empty(B, out), dx = be.empty(B, in);
  std::unique_ptr<LinearState> st;
  be.linear_forward(ctx, xt, wt, b ? bt.data : nullptr, y, st);
  be.linear_backward(ctx, *st, wt, dyt, dx, dw, b ? db.data : nullptr);
  return {get(be, y), get(be, dx), get(be, dw), get(be, db)};
}

void check_linear(const std::optional<Recipe>& rec, int64_t B, int64_t in, int64_t out, bool bias, uint32_t seed) {
  INFO("recipe ", rec ? rec->name : std::string("none (FP32)"), " B=", B, " in=", in, " out=", out);
  const auto x = randv(size_t(B * in), seed), w = randv(size_t(out * in), seed + 1, 0.1f),
             b = randv(size_t(out), seed + 2), dy = randv(size_t(B * out), seed + 3),
             dw0 = randv(size_t(out * in), seed + 4, 0.01f), db0 = randv(size_t(out), seed + 5, 0.01f);
  const std::vector<float> zw(dw0.size(), 0.0f), zb(db0.size(), 0.0f);
  const Recipe* r = rec ? &*rec : nullptr;
  // The oracle: fp32 mode on r(x), r(b), r(dy), accumulating into zeros, each output then rounded.
  const auto xr = rne(x), br = rne(b), dyr = rne(dy);
  auto be32 = cpu32();
  const LinearOut ref = run_linear(*be32, r, B, in, out, xr, w, bias ? &br : nullptr, dyr, zw, zb);
  auto be16 = cpu16();
  const LinearOut got = run_linear(*be16, r, B, in, out, x, w, bias ? &b : nullptr, dy, dw0, db0);
  check_bits("y = r(acc + r(b))", got.y, rne(ref.y));
  check_bits("dx = r(acc)", got.dx, rne(ref.dx));
  check_bits("dW_acc += float(r(dW))", got.dw, add(dw0, rne(ref.dw)));
  if (bias) check_bits("db_acc += float(r(db))", got.db, add(db0, rne(ref.db)));
  CHECK(all_bf16(got.y));
  CHECK(all_bf16(got.dx));
}

}  // namespace

TEST_CASE("bf16 activations: linear forward/backward, plain FP32 and every canned recipe, against r(fp32 mode)") {
  uint32_t seed = 500;
  check_linear(std::nullopt, 37, 50, 29, true, seed += 10);
  check_linear(std::nullopt, 1, 1, 1, false, seed += 10);
  check_linear(std::nullopt, 272, 48, 75, true, seed += 10);
  // The quantized recipes quantize the BF16 activation r(x) (and r(dy)): fp32 mode on pre-rounded inputs.
  for (const std::string& name : recipe_names()) check_linear(recipe_by_name(name), 64, 96, 64, true, seed += 10);
}

TEST_CASE("bf16 activations: layernorm writes r(y); mean, rstd and the backward are fp32 mode's") {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 5}, {37, 64}, {300, 130}}) {
    INFO("N=", N, " C=", C);
    const auto x = randv(size_t(N * C), 11, 2.0f, 0.3f), g = randv(size_t(C), 21, 0.5f, 1.0f),
               bb = randv(size_t(C), 31), dy = rne(randv(size_t(N * C), 41)), dg0 = randv(size_t(C), 51);
    std::vector<float> y[2], mean[2], rstd[2], dx[2], dg[2], dbeta[2];
    int k = 0;
    for (ActivationPrecision mode : {ActivationPrecision::fp32, ActivationPrecision::bf16}) {
      auto be = cpu(mode);
      Tensor xt = put(*be, x, N, C), gt = put(*be, g, 1, C), bt = put(*be, bb, 1, C);
      Tensor yt = be->empty(N, C), mt = be->empty(1, N), rt = be->empty(1, N);
      be->layernorm_forward(xt, gt.data, bt.data, 1e-5f, yt, mt, rt);
      Tensor dyt = put(*be, dy, N, C), dxt = be->empty(N, C), dgt = put(*be, dg0, 1, C), dbt = put(*be, dg0, 1, C);
      be->layernorm_backward(dyt, xt, gt.data, mt, rt, dxt, dgt.data, dbt.data);
      y[k] = get(*be, yt), mean[k] = get(*be, mt), rstd[k] = get(*be, rt), dx[k] = get(*be, dxt);
      dg[k] = get(*be, dgt), dbeta[k] = get(*be, dbt);
      ++k;
    }
    check_bits("y = r(y)", y[1], rne(y[0]));
    check_bits("mean", mean[1], mean[0]);
    check_bits("rstd", rstd[1], rstd[0]);
    check_bits("dx (FP32)", dx[1], dx[0]);
    check_bits("dgamma", dg[1], dg[0]);
    check_bits("dbeta", dbeta[1], dbeta[0]);
  }
}

TEST_CASE("bf16 activations: GELU writes r(y) and r(dx) of BF16 inputs") {
  const int64_t n = 10007;
  const auto x = rne(randv(size_t(n), 3, 3.0f)), dy = rne(randv(size_t(n), 4));
  std::vector<float> y[2], dx[2];
  int k = 0;
  for (ActivationPrecision mode : {ActivationPrecision::fp32, ActivationPrecision::bf16}) {
    auto be = cpu(mode);
    Tensor xt = put(*be, x, 1, n), dyt = put(*be, dy, 1, n), yt = be->empty(1, n), dxt = be->empty(1, n);
    be->gelu_forward(xt, yt);
    be->gelu_backward(xt, dyt, dxt);
    y[k] = get(*be, yt), dx[k] = get(*be, dxt);
    ++k;
  }
  check_bits("y = r(gelu(x))", y[1], rne(y[0]));
  check_bits("dx = r(gelu'(x) dy)", dx[1], rne(dx[0]));
}

TEST_CASE("bf16 activations: attention writes r(out) and r(dqkv); the probabilities stay FP32") {
  for (const auto& g : test::attention_geometries())
    for (bool causal : {false, true}) {
      const int64_t B = g.B, T = g.T, H = g.H, C = H * g.hd, N = B * T;
      const AttentionShape s{B, T, H, causal, float(1.0 / std::sqrt(double(g.hd))), 0.1f};
      INFO("B=", B, " T=", T, " H=", H, " hd=", g.hd, causal ? " causal" : " full");
      const DropoutKey key{77, 0xABCDEF0123ull};
      const auto qkv = rne(randv(size_t(N * 3 * C), 900 + uint32_t(T), 0.7f)),
                 dout = rne(randv(size_t(N * C), 901 + uint32_t(T)));
      std::vector<float> o[2], p[2], dq[2];
      int k = 0;
      for (ActivationPrecision mode : {ActivationPrecision::fp32, ActivationPrecision::bf16}) {
        auto be = cpu(mode);
        Tensor q = put(*be, qkv, N, 3 * C), d = put(*be, dout, N, C), ot = be->empty(N, C),
               pt = be->empty(B * H * T, T), dqt = be->empty(N, 3 * C);
        be->attention_forward(s, q, ot, pt, key);
        be->attention_backward(s, q, pt, d, dqt, key);
        o[k] = get(*be, ot), p[k] = get(*be, pt), dq[k] = get(*be, dqt);
        ++k;
      }
      check_bits("out = r(out)", o[1], rne(o[0]));
      check_bits("probs (FP32)", p[1], p[0]);
      check_bits("dqkv = r(dqkv)", dq[1], rne(dq[0]));
    }
}

TEST_CASE("bf16 activations: dropout and its fused forms write r(dropped value); the residual add in FP32") {
  for (int64_t n : {1, 5, 4097})
    for (float p : {0.0f, 0.1f, 0.5f}) {
      INFO("n=", n, " p=", p);
      const DropoutKey key{0x1234567890ull, (uint64_t(0xD) << 60) | 12345};
      const auto x = randv(size_t(n), 7 + uint32_t(n)), dy = randv(size_t(n), 8 + uint32_t(n));
      // fp32 mode's dropped values: the oracle's input.
      auto b32 = cpu32();
      Tensor xf = put(*b32, x, 1, n), df = put(*b32, dy, 1, n);
      b32->dropout_forward(xf, p, key);
      b32->dropout_backward(df, p, key);
      const auto drop_x = get(*b32, xf), drop_dy = get(*b32, df);
      Tensor yx = put(*b32, dy, 1, n);
      b32->add_inplace(yx, put(*b32, x, 1, n));
      const auto sum = get(*b32, yx);
      Tensor ds = put(*b32, sum, 1, n);
      b32->dropout_backward(ds, p, key);
      const auto drop_sum = get(*b32, ds);

      auto be = cpu16();
      Tensor a = put(*be, x, 1, n), bd = put(*be, dy, 1, n);
      be->dropout_forward(a, p, key);
      be->dropout_backward(bd, p, key);
      check_bits("dropout_forward", get(*be, a), rne(drop_x));
      check_bits("dropout_backward", get(*be, bd), rne(drop_dy));
      Tensor r = put(*be, x, 1, n);
      be->dropout_add(r, put(*be, dy, 1, n), p, key);
      check_bits("dropout_add = r(drop(y)) + x", get(*be, r), add(rne(drop_x), dy));
      Tensor src = put(*be, dy, 1, n), dst = be->empty(1, n);
      be->dropout_backward_to(src, dst, p, key);
      check_bits("dropout_backward_to: dst", get(*be, dst), rne(drop_dy));
      check_bits("dropout_backward_to: src unchanged", get(*be, src), dy);
      Tensor y = put(*be, dy, 1, n), dst2 = be->empty(1, n);
      be->add_dropout_backward_to(y, put(*be, x, 1, n), dst2, p, key);
      check_bits("add_dropout_backward_to: y += x (FP32)", get(*be, y), sum);
      check_bits("add_dropout_backward_to: dst", get(*be, dst2), rne(drop_sum));
      // An FP32 tensor in a bf16 pass (GPT's embeddings): fp32 mode's bits, and the mode restored after.
      Tensor e = put(*be, x, 1, n);
      {
        const ActivationScope residual(*be, ActivationPrecision::fp32);
        be->dropout_forward(e, p, key);
      }
      check_bits("dropout_forward under ActivationScope(fp32)", get(*be, e), drop_x);
      CHECK(be->activations() == ActivationPrecision::bf16);
    }
}

TEST_CASE("bf16 activations: cross-entropy writes r(dlogits); the loss and the hits are fp32 mode's") {
  const int64_t N = 37, V = 65;
  const auto logits = rne(randv(size_t(N * V), 61, 2.0f));
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) t[size_t(i)] = int32_t((i * 7) % V);
  double loss[2];
  int64_t hits[2];
  std::vector<float> d[2];
  int k = 0;
  for (ActivationPrecision mode : {ActivationPrecision::fp32, ActivationPrecision::bf16}) {
    auto be = cpu(mode);
    Tensor l = put(*be, logits, N, V), dl = be->empty(N, V);
    loss[k] = be->cross_entropy(l, t.data(), &dl, &hits[k]);
    d[k] = get(*be, dl);
    ++k;
  }
  CHECK(loss[1] == loss[0]);
  CHECK(hits[1] == hits[0]);
  check_bits("dlogits = r(dlogits)", d[1], rne(d[0]));
}

TEST_CASE("bf16 activations: the residual-stream ops are fp32 mode's bits") {
  const int64_t B = 3, T = 5, V = 11, C = 7, N = B * T;
  const auto wte = randv(size_t(V * C), 71), wpe = randv(size_t(T * C), 72), g = randv(size_t(N * C), 73),
             a = randv(size_t(N * C), 74);
  std::vector<int32_t> idx(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) idx[size_t(i)] = int32_t((i * 5) % V);
  std::vector<float> emb[2], dwte[2], dwpe[2], sum[2];
  int k = 0;
  for (ActivationPrecision mode : {ActivationPrecision::fp32, ActivationPrecision::bf16}) {
    auto be = cpu(mode);
    Tensor wt = put(*be, wte, V, C), wp = put(*be, wpe, T, C), o = be->empty(N, C);
    be->embed_forward(idx.data(), B, T, wt, wp, o);
    Tensor dw = be->zeros(V, C), dp = be->zeros(T, C);
    be->embed_backward(idx.data(), B, T, put(*be, g, N, C), dw, dp);
    Tensor s = put(*be, a, N, C);
    be->add_inplace(s, put(*be, g, N, C));
    emb[k] = get(*be, o), dwte[k] = get(*be, dw), dwpe[k] = get(*be, dp), sum[k] = get(*be, s);
    ++k;
  }
  check_bits("embed_forward", emb[1], emb[0]);
  check_bits("embed_backward dwte", dwte[1], dwte[0]);
  check_bits("embed_backward dwpe", dwpe[1], dwpe[0]);
  check_bits("add_inplace", sum[1], sum[0]);
}

TEST_CASE("set_activations: a backend that does not implement bf16 says so; ForwardingBackend forwards it") {
  class Fp32Only final : public test::ForwardingBackend {
   public:
    Fp32Only() : ForwardingBackend(make_cpu_backend(1)) {}
    bool implements(ActivationPrecision a) const override { return a == ActivationPrecision::fp32; }
  };
  Fp32Only f;
  CHECK_THROWS_WITH_AS(f.set_activations(ActivationPrecision::bf16),
                       "backend cpu does not implement precision.activations \"bf16\" (yet); use \"fp32\"",
                       fp4lab::Error);
  CHECK(f.activations() == ActivationPrecision::fp32);
  auto inner = make_cpu_backend(1);
  const Backend* in = inner.get();
  test::ForwardingBackend fw(std::move(inner));
  fw.set_activations(ActivationPrecision::bf16);
  CHECK(fw.activations() == ActivationPrecision::bf16);
  CHECK(in->activations() == ActivationPrecision::bf16);
}
