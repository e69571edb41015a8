// The CPU backend (train/cpu/backend.cpp): finite-difference gradient checks
// of every layer (loss L = sum(y .* R) for a fixed random R, dL/dy = R; central
// differences in float inputs, the loss accumulated in double), the dropout
// mask's definition, and the backend operation table (backend_cases.hpp) on 1
// against 3 threads, bit for bit.
#include <doctest/doctest.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "train/backend.hpp"
#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/philox.hpp"
#include "train/backend_cases.hpp"
#include "train/forwarding_backend.hpp"

using namespace fp4lab::train;

namespace {

std::vector<float> randv(size_t n, uint32_t seed, float s = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, s);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
double dot(const Tensor& y, const std::vector<float>& r) {
  double s = 0;
  for (int64_t i = 0; i < y.size(); ++i) s += double(y.data[i]) * r[size_t(i)];
  return s;
}
// Checks analytic gradient `g` of loss(x) against central differences at a few indices.
void check_fd(std::vector<float>& x, const std::vector<float>& g, const std::function<double()>& loss,
              float eps = 1e-2f, double tol = 2e-2) {
  const size_t n = x.size(), stride = std::max<size_t>(1, n / 23);
  for (size_t i = 0; i < n; i += stride) {
    const float x0 = x[i];
    x[i] = x0 + eps;
    const double lp = loss();
    x[i] = x0 - eps;
    const double lm = loss();
    x[i] = x0;
    const double fd = (lp - lm) / (2.0 * double(eps));
    CHECK_MESSAGE(std::abs(fd - g[i]) <= tol * (1.0 + std::abs(fd)), "index ", i, ": fd ", fd, " analytic ", g[i]);
  }
}

}  // namespace

TEST_CASE("layernorm: forward normalises, backward matches finite differences") {
  auto be = make_cpu_backend(1);
  const int64_t N = 5, C = 12;
  auto xv = randv(N * C, 1), gam = randv(C, 2), bet = randv(C, 3), r = randv(N * C, 4);
  auto run = [&](Tensor& y, Tensor& mean, Tensor& rstd) {
    Tensor x = view_of(xv.data(), N, C);
    be->layernorm_forward(x, gam.data(), bet.data(), 1e-5f, y, mean, rstd);
  };
  Tensor y = be->empty(N, C), mean = be->empty(1, N), rstd = be->empty(1, N);
  run(y, mean, rstd);
  // Hand oracle: row mean of (y - beta)/gamma is 0.
  double s = 0;
  for (int64_t j = 0; j < C; ++j) s += (y.row(0)[j] - bet[size_t(j)]) / gam[size_t(j)];
  CHECK(std::abs(s / C) < 1e-5);
  Tensor dy = view_of(r.data(), N, C), dx = be->empty(N, C);
  std::vector<float> dg(C, 0.0f), db(C, 0.0f);
  Tensor x = view_of(xv.data(), N, C);
  be->layernorm_backward(dy, x, gam.data(), mean, rstd, dx, dg.data(), db.data());
  auto loss = [&] {
    Tensor yy = be->empty(N, C), m = be->empty(1, N), rs = be->empty(1, N);
    run(yy, m, rs);
    return dot(yy, r);
  };
  std::vector<float> gx(dx.data, dx.data + dx.size());
  check_fd(xv, gx, loss);
  check_fd(gam, dg, loss);
  check_fd(bet, db, loss);
  // The residual form: dx + residual with one float add, the same bits.
  auto resv = randv(N * C, 5);
  Tensor res = view_of(resv.data(), N, C), dxr = be->empty(N, C);
  std::vector<float> dg2(C, 0.0f);
  be->layernorm_backward(dy, x, gam.data(), mean, rstd, dxr, dg2.data(), nullptr, &res);
  for (int64_t i = 0; i < N * C; ++i) REQUIRE(dxr.data[i] == gx[size_t(i)] + resv[size_t(i)]);
  CHECK(dg2 == dg);
  Tensor bad = be->empty(N, C + 1);
  CHECK_THROWS_WITH_AS(be->layernorm_backward(dy, x, gam.data(), mean, rstd, dxr, dg2.data(), nullptr, &bad),
                       doctest::Contains("residual"), fp4lab::InternalError);
}

TEST_CASE("gelu (erf form): values and derivative") {
  auto be = make_cpu_backend(1);
  std::vector<float> xv = {-3.0f, -1.0f, 0.0f, 0.5f, 2.0f};
  Tensor x = view_of(xv.data(), 1, 5), y = be->empty(1, 5);
  be->gelu_forward(x, y);
  CHECK(y.data[1] == doctest::Approx(-0.158655254).epsilon(1e-6));  // -Phi(-1)
  CHECK(y.data[4] == doctest::Approx(1.954499736).epsilon(1e-6));   // 2 Phi(2)
  auto r = randv(5, 7);
  Tensor dx = be->empty(1, 5);
  be->gelu_backward(x, view_of(r.data(), 1, 5), dx);
  std::vector<float> g(dx.data, dx.data + 5);
  check_fd(
      xv, g,
      [&] {
        Tensor yy = be->empty(1, 5);
        be->gelu_forward(view_of(xv.data(), 1, 5), yy);
        return dot(yy, r);
      },
      1e-3f, 1e-2);
}

TEST_CASE("attention: causal and full, with and without dropout, match finite differences") {
  auto be = make_cpu_backend(2);
  for (bool causal : {true, false})
    for (float p : {0.0f, 0.3f}) {
      const int64_t B = 2, T = 5, H = 2, C = 8;
      AttentionShape s{B, T, H, causal, 0.5f, p};
      auto qkv = randv(B * T * 3 * C, 11), r = randv(B * T * C, 12);
      DropoutKey key{9, 3};
      auto fwd = [&](Tensor& out, Tensor& probs) {
        be->attention_forward(s, view_of(qkv.data(), B * T, 3 * C), out, probs, key);
      };
      Tensor out = be->empty(B * T, C), probs = be->empty(B * H * T, T);
      fwd(out, probs);
      if (causal) CHECK(probs.row(0)[1] == 0.0f);  // token 0 sees only itself
      CHECK(std::abs(probs.row(1)[0] + probs.row(1)[1] + probs.row(1)[2] + probs.row(1)[3] + probs.row(1)[4] - 1.0f) <
            1e-6);
      Tensor dqkv = be->empty(B * T, 3 * C);
      be->attention_backward(s, view_of(qkv.data(), B * T, 3 * C), probs, view_of(r.data(), B * T, C), dqkv, key);
      std::vector<float> g(dqkv.data, dqkv.data + dqkv.size());
      check_fd(
          qkv, g,
          [&] {
            Tensor o = be->empty(B * T, C), pr = be->empty(B * H * T, T);
            fwd(o, pr);
            return dot(o, r);
          },
          1e-2f, 3e-2);
    }
}

TEST_CASE("cross entropy: loss of uniform logits is log(V); gradient matches finite differences") {
  auto be = make_cpu_backend(1);
  std::vector<float> z(3 * 4, 0.0f);
  std::vector<int32_t> t = {0, 3, 2};
  int64_t correct = 0;
  CHECK(be->cross_entropy(view_of(z.data(), 3, 4), t.data(), nullptr, &correct) == doctest::Approx(std::log(4.0)));
  CHECK(correct == 1);  // ties pick the first index: only row 0 (target 0) is a hit
  auto l = randv(12, 5);
  Tensor d = be->empty(3, 4);
  be->cross_entropy(view_of(l.data(), 3, 4), t.data(), &d, nullptr);
  std::vector<float> g(d.data, d.data + 12);
  check_fd(
      l, g, [&] { return be->cross_entropy(view_of(l.data(), 3, 4), t.data(), nullptr, nullptr); }, 1e-3f, 1e-2);
  // The two-half form returns what the one call does.
  int64_t c1 = -1, c2 = -1;
  const double one = be->cross_entropy(view_of(l.data(), 3, 4), t.data(), nullptr, &c1);
  be->cross_entropy_start(view_of(l.data(), 3, 4), t.data(), nullptr);
  CHECK(be->cross_entropy_finish(&c2) == one);
  CHECK(c2 == c1);
  CHECK_THROWS_WITH(be->cross_entropy_finish(nullptr), doctest::Contains("no cross_entropy_start"));
}

TEST_CASE("linear (fp32 recipe = null): y = x W^T + b and its gradients") {
  auto be = make_cpu_backend(1);
  const int64_t N = 4, I = 6, O = 3;
  auto x = randv(N * I, 21), w = randv(O * I, 22), b = randv(O, 23), r = randv(N * O, 24);
  fp4lab::LinearContext ctx{};
  auto fwd = [&](std::unique_ptr<LinearState>& st) {
    Tensor y;
    be->linear_forward(ctx, view_of(x.data(), N, I), view_of(w.data(), O, I), b.data(), y, st);
    return y;
  };
  std::unique_ptr<LinearState> st;
  Tensor y = fwd(st);
  double ref = b[1];
  for (int64_t k = 0; k < I; ++k) ref += double(x[size_t(2 * I + k)]) * w[size_t(1 * I + k)];
  CHECK(y.row(2)[1] == doctest::Approx(ref).epsilon(1e-5));
  Tensor dx, dw = be->zeros(O, I);
  std::vector<float> db(O, 0.0f);
  be->linear_backward(ctx, *st, view_of(w.data(), O, I), view_of(r.data(), N, O), dx, dw, db.data());
  auto loss = [&] {
    std::unique_ptr<LinearState> s2;
    return dot(fwd(s2), r);
  };
  check_fd(x, std::vector<float>(dx.data, dx.data + dx.size()), loss);
  check_fd(w, std::vector<float>(dw.data, dw.data + dw.size()), loss);
  check_fd(b, db, loss);
}

TEST_CASE("embeddings, ViT tokens, dropout: gradients are the adjoints") {
  auto be = make_cpu_backend(2);
  // GPT embedding: out = wte[idx] + wpe[t].
  const int64_t V = 5, T = 3, C = 4, B = 2;
  auto wte = randv(V * C, 31), wpe = randv(T * C, 32), r = randv(B * T * C, 33);
  std::vector<int32_t> idx = {1, 4, 1, 0, 2, 1};
  Tensor out = be->empty(B * T, C);
  be->embed_forward(idx.data(), B, T, view_of(wte.data(), V, C), view_of(wpe.data(), T, C), out);
  CHECK(out.row(3)[2] == wte[0 * C + 2] + wpe[0 * C + 2]);
  Tensor dwte = be->zeros(V, C), dwpe = be->zeros(T, C);
  be->embed_backward(idx.data(), B, T, view_of(r.data(), B * T, C), dwte, dwpe);
  // Token 1 appears at rows 0, 2, 5.
  CHECK(dwte.row(1)[0] == doctest::Approx(r[0] + r[2 * C] + r[5 * C]));
  CHECK(dwpe.row(1)[3] == doctest::Approx(r[1 * C + 3] + r[4 * C + 3]));
  // ViT tokens: row 0 of each image = cls + pos[0].
  const int64_t P = 2;
  auto pt = randv(B * P * C, 34), cls = randv(C, 35), pos = randv((P + 1) * C, 36), r2 = randv(B * (P + 1) * C, 37);
  Tensor h = be->empty(B * (P + 1), C);
  be->vit_tokens_forward(view_of(pt.data(), B * P, C), B, cls.data(), view_of(pos.data(), P + 1, C), h);
  CHECK(h.row(3)[1] == cls[1] + pos[1]);
  CHECK(h.row(5)[0] == pt[3 * C] + pos[2 * C]);
  Tensor dp = be->empty(B * P, C), dpos = be->zeros(P + 1, C);
  std::vector<float> dcls(C, 0.0f);
  be->vit_tokens_backward(view_of(r2.data(), B * (P + 1), C), B, dp, dcls.data(), dpos);
  CHECK(dcls[2] == doctest::Approx(r2[2] + r2[3 * C + 2]));
  CHECK(dp.row(3)[1] == r2[5 * C + 1]);
  // Dropout: kept elements scaled by 1/(1-p), the same mask in backward, about p dropped.
  std::vector<float> ones(10000, 1.0f), ones2(10000, 1.0f);
  Tensor a = view_of(ones.data(), 1, 10000), g = view_of(ones2.data(), 1, 10000);
  be->dropout_forward(a, 0.25f, DropoutKey{1, 2});
  be->dropout_backward(g, 0.25f, DropoutKey{1, 2});
  int dropped = 0;
  for (int i = 0; i < 10000; ++i) {
    CHECK((ones[size_t(i)] == 0.0f || ones[size_t(i)] == doctest::Approx(1.0f / 0.75f)));
    CHECK(ones[size_t(i)] == ones2[size_t(i)]);
    dropped += ones[size_t(i)] == 0.0f;
  }
  CHECK(std::abs(dropped - 2500) < 200);
}

TEST_CASE("adamw_step: grad_scale gives the bits of scale(g) then the step, and leaves g unchanged") {
  // Gradient clipping fused into the step's read of g (optim.cpp) against the
  // two-pass form it replaces: scale the buffer, then step.
  auto be = make_cpu_backend(2);
  const int64_t n = 1003;
  const std::vector<IndexRange> decayed{{5, 200}, {400, 3}, {900, 103}};
  for (float s : {1.0f, 0.37f, 1e-3f}) {
    CAPTURE(s);
    std::vector<float> p1 = randv(size_t(n), 1), m1 = randv(size_t(n), 2, 0.1f), v1 = randv(size_t(n), 3, 0.01f);
    for (float& x : v1) x = std::abs(x);
    std::vector<float> p2 = p1, m2 = m1, v2 = v1;
    const std::vector<float> g0 = randv(size_t(n), 4);
    std::vector<float> ga = g0, gb = g0;
    Tensor tp1 = view_of(p1.data(), 1, n), tm1 = view_of(m1.data(), 1, n), tv1 = view_of(v1.data(), 1, n);
    Tensor tp2 = view_of(p2.data(), 1, n), tm2 = view_of(m2.data(), 1, n), tv2 = view_of(v2.data(), 1, n);
    Tensor tga = view_of(ga.data(), 1, n), tgb = view_of(gb.data(), 1, n);
    be->adamw_step(tp1, tga, tm1, tv1, decayed, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, s);
    for (float& x : gb) x *= s;  // the two-pass form, written out
    be->adamw_step(tp2, tgb, tm2, tv2, decayed, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
    int64_t bad = 0;
    for (size_t i = 0; i < size_t(n); ++i)
      bad += std::memcmp(&p1[i], &p2[i], 4) != 0 || std::memcmp(&m1[i], &m2[i], 4) != 0 ||
             std::memcmp(&v1[i], &v2[i], 4) != 0 || std::memcmp(&ga[i], &g0[i], 4) != 0;
    CHECK(bad == 0);
  }
}

TEST_CASE("adamw_step with BF16 moments: the FP32 step from the widened moments, stored as their RNE BF16") {
  // MomentStorage::bf16 (train/backend.hpp) against a construction from another path: the FP32-moment step
  // run on the moments' widened values gives the parameters bit for bit, and the stored BF16 moments are
  // core's generic encoder's round-to-nearest-even of that step's FP32 moments (not train/cpu/bf16.hpp's).
  auto be = make_cpu_backend(2);
  const int64_t n = 1003;  // odd: the last float holds one BF16 and a zero half
  const std::vector<IndexRange> decayed{{5, 200}, {400, 3}, {900, 103}};
  auto bf16_code = [](float x) { return uint16_t(fp4lab::encode(fp4lab::bfloat16, x, fp4lab::Round::rn,
                                                                fp4lab::Overflow::nonsaturate)); };
  std::vector<float> m_wide = randv(size_t(n), 2, 0.1f), v_wide = randv(size_t(n), 3, 0.01f);
  std::vector<float> m_pack(size_t((n + 1) / 2), 0.0f), v_pack(m_pack.size(), 0.0f);
  auto* mh = reinterpret_cast<uint16_t*>(m_pack.data());
  auto* vh = reinterpret_cast<uint16_t*>(v_pack.data());
  for (size_t i = 0; i < size_t(n); ++i) {
    mh[i] = bf16_code(m_wide[i]);
    vh[i] = bf16_code(std::abs(v_wide[i]));
    m_wide[i] = fp4lab::decode(fp4lab::bfloat16, mh[i]);  // the values the BF16 step reads
    v_wide[i] = fp4lab::decode(fp4lab::bfloat16, vh[i]);
  }
  std::vector<float> p1 = randv(size_t(n), 1), p2 = p1, g = randv(size_t(n), 4);
  Tensor tg = view_of(g.data(), 1, n);
  for (int64_t t : {1, 2, 7}) {
    CAPTURE(t);
    Tensor tp1 = view_of(p1.data(), 1, n), tm1 = view_of(m_pack.data(), 1, (n + 1) / 2),
           tv1 = view_of(v_pack.data(), 1, (n + 1) / 2);
    Tensor tp2 = view_of(p2.data(), 1, n), tm2 = view_of(m_wide.data(), 1, n), tv2 = view_of(v_wide.data(), 1, n);
    be->adamw_step(tp1, tg, tm1, tv1, decayed, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.37f, MomentStorage::bf16);
    be->adamw_step(tp2, tg, tm2, tv2, decayed, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.37f);
    int64_t bad_p = 0, bad_m = 0;
    for (size_t i = 0; i < size_t(n); ++i) {
      bad_p += std::memcmp(&p1[i], &p2[i], 4) != 0;
      bad_m += mh[i] != bf16_code(m_wide[i]) || vh[i] != bf16_code(v_wide[i]);
      m_wide[i] = fp4lab::decode(fp4lab::bfloat16, mh[i]);  // the next step reads the stored BF16
      v_wide[i] = fp4lab::decode(fp4lab::bfloat16, vh[i]);
    }
    CHECK(bad_p == 0);
    CHECK(bad_m == 0);
    CHECK(reinterpret_cast<uint16_t*>(m_pack.data())[n] == 0);  // the pad half stays zero
  }
  // Sizes: the moments of n values are ceil(n / 2) floats under bf16.
  Tensor tp = view_of(p1.data(), 1, n), wrong = view_of(m_wide.data(), 1, n);
  CHECK_THROWS_AS(be->adamw_step(tp, tg, wrong, wrong, decayed, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f,
                                 MomentStorage::bf16),
                  fp4lab::Error);
}

TEST_CASE("dropout masks: element i is dropped iff random_bits(seed, stream, i) < threshold") {
  // The definition, element by element (core's random_bits), against the backend's
  // batched words: sizes around the 4-element Philox groups and the 4096-element chunks.
  auto be = make_cpu_backend(2);
  const fp4lab::train::DropoutKey key{0xC0FFEEull, 77};
  const float p = 0.3f, keep = 1.0f / (1.0f - p);
  const uint32_t thr = uint32_t(std::ldexp(double(p), 32));
  for (int64_t n : {1, 3, 5, 4095, 4097, 9001}) {
    CAPTURE(n);
    std::vector<float> x = randv(size_t(n), uint32_t(n));
    const std::vector<float> x0 = x;
    Tensor t = view_of(x.data(), 1, n);
    be->dropout_forward(t, p, key);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool drop = fp4lab::random_bits(key.seed, key.stream, uint64_t(i)) < thr;
      bad += x[size_t(i)] != (drop ? 0.0f : x0[size_t(i)] * keep);
    }
    CHECK(bad == 0);
  }
  // Attention: with V = the identity (head dim = T), out is the dropped probabilities
  // exactly; element e of probs (its linear index) is dropped iff its word < threshold.
  const int64_t B = 2, T = 7, H = 1, C = T;  // odd T: rows straddle Philox groups
  std::vector<float> qkv = randv(size_t(B * T * 3 * C), 5);
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t c = 0; c < C; ++c) qkv[size_t(r * 3 * C + 2 * C + c)] = (r % T == c) ? 1.0f : 0.0f;
  Tensor out = be->empty(B * T, C), pr = be->empty(B * H * T, T);
  be->attention_forward(AttentionShape{B, T, H, false, 0.5f, p}, view_of(qkv.data(), B * T, 3 * C), out, pr, key);
  int64_t bad = 0;
  for (int64_t e = 0; e < B * H * T * T; ++e) {
    const bool drop = fp4lab::random_bits(key.seed, key.stream, uint64_t(e)) < thr;
    bad += out.data[e] != (drop ? 0.0f : pr.data[e] * keep);  // B*T rows of C = T columns: same layout
  }
  CHECK(bad == 0);
}

namespace {

// A CPU backend whose every call runs on `threads` OpenMP threads. The CPU
// backend sets the thread count once, in its constructor, through
// omp_set_num_threads, which is per calling thread, not per backend: of two
// CPU backends in one process, the one made last would set the count for both.
class Pinned final : public fp4lab::train::test::ForwardingBackend {
 public:
  explicit Pinned(int threads) : ForwardingBackend(make_cpu_backend(threads)), threads_(threads) {}

 private:
  Backend& inner() override {
    omp_set_num_threads(threads_);
    return ForwardingBackend::inner();
  }
  int threads_;
};

}  // namespace

// The operation table (tests/train/backend_cases.hpp) on the CPU backend: the
// backend promises the same bits on any thread count (train/backend.hpp), so
// every output of every row, whatever the row's tolerance, bit for bit.
TEST_CASE("backend op table: the CPU backend on 3 threads gives the bits of 1 thread, run to run") {
  namespace bt = fp4lab::train::test;
  const std::vector<bt::OpCase> cases = bt::backend_op_cases();
  Pinned one(1), three(3);
  const int64_t n = bt::compare_backends(one, three, cases, {"cpu (1 thread)", "cpu (3 threads)", true});
  MESSAGE(cases.size(), " rows, ", n, " outputs compared");
  CHECK(n >= int64_t(cases.size()));
  const int64_t again = bt::check_run_to_run(three, cases, "cpu (3 threads)");
  CHECK(again == n);
  // Each backend's calls run on its own thread count, whichever was made last.
  Tensor t = one.empty(1, 1);
  CHECK(omp_get_max_threads() == 1);
  t = three.empty(1, 1);
  CHECK(omp_get_max_threads() == 3);
}

// The same table under precision.activations "bf16" (train/backend.hpp's contract): the CPU's bits still do
// not depend on the thread count, run to run. (Its exactness against r() of fp32 mode: test_bf16_activations.cpp.)
TEST_CASE("backend op table under bf16 activations: the CPU backend on 3 threads gives the bits of 1 thread") {
  namespace bt = fp4lab::train::test;
  const std::vector<bt::OpCase> cases = bt::backend_op_cases(fp4lab::train::ActivationPrecision::bf16);
  Pinned one(1), three(3);
  const int64_t n = bt::compare_backends(one, three, cases, {"cpu (1 thread)", "cpu (3 threads)", true});
  MESSAGE(cases.size(), " rows, ", n, " outputs compared");
  CHECK(n >= int64_t(cases.size()));
  CHECK(bt::check_run_to_run(three, cases, "cpu (3 threads)") == n);
  CHECK(one.activations() == fp4lab::train::ActivationPrecision::fp32);  // each row restores fp32
}
