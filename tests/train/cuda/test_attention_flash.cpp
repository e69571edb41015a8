// train/cuda/attention_flash.cu: the BF16 flash attention (AttentionDims::bf16_flash)
// against a float64 reference computed from the same BF16 values of Q, K, V and
// dout (the inputs are drawn BF16-exact, so the kernels' input rounding is exact).
//
// Tolerance, element by element, from the two roundings the path adds: P (or
// drop(P)) rounded to BF16 before P.V and drop(P)^T dout, and dS before dS K and
// dS^T Q. BF16 round-to-nearest moves a value by at most u = 2^-8 of itself (half
// an ulp, the ulp at most 2^-7 of the value), so an output sum_j a_j b_j with a_j rounded may
// be off by u sum_j |a_j| |b_j|. D = rowsum(dout * O) takes O's error along
// (|dD_i| <= u sum_c |dout_ic| sum_j |Pd_ij| |V_jc|), which moves dS by P_ij
// scale dD_i; FP32 accumulation and exp2 add 2^-14 sum |terms| + 1e-6.
// Every element must be inside its bound (a wrong dropout element moves an
// output by about P_ij |v| ks, far above u P_ij |v|).
// The dropout mask is checked directly too: with one-hot V (and dout) rows, out
// and dV show the dropped probabilities as zeros, in the flash path and in the
// FP32 fused path alike.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attention_test_util.hpp"
#include "cuda/device.hpp"
#include "gpu_test_util.hpp"
#include "train/backend.hpp"
#include "train/config.hpp"
#include "train/cuda/nn.hpp"

namespace {

using fp4lab::cuda::DeviceBuffer;
using fp4lab::cuda::nn::Attention;
using fp4lab::cuda::nn::AttentionDims;
using fp4lab::cuda::nn::AttentionPath;
using fp4lab::test::attention_dims;
using fp4lab::test::attention_dropped;
using fp4lab::test::AttentionGeo;
using fp4lab::test::randn_bf16;

constexpr double kU = 1.0 / 256.0;          // 2^-8: BF16's relative rounding bound (its unit roundoff)
constexpr double kAcc = 1.0 / 16384.0;      // 2^-14: FP32 accumulation, exp2
constexpr double kAbs = 1e-6;

struct Ref {
  std::vector<double> out, dqkv, tol_out, tol_dqkv;
};

Ref reference(const AttentionDims& d, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int64_t B = d.batch, T = d.seq, H = d.heads, C = d.width, hd = C / H, ld = 3 * C;
  const double keep = fp4lab::test::attention_keep_scale(d);
  Ref r;
  r.out.assign(size_t(B * T * C), 0.0);
  r.tol_out.assign(size_t(B * T * C), kAbs);
  r.dqkv.assign(size_t(B * T * ld), 0.0);
  r.tol_dqkv.assign(size_t(B * T * ld), kAbs);
  const size_t nT = size_t(T);
  std::vector<double> P(nT * nT), Pd(nT * nT), dS(nT * nT), D(nT), dD(nT);
  auto at = [&](int64_t row, int64_t col) { return size_t(row) * nT + size_t(col); };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = b * H + h;
      auto q = [&](int64_t i, int64_t c) { return double(qkv[size_t((b * T + i) * ld + h * hd + c)]); };
      auto k = [&](int64_t j, int64_t c) { return double(qkv[size_t((b * T + j) * ld + C + h * hd + c)]); };
      auto v = [&](int64_t j, int64_t c) { return double(qkv[size_t((b * T + j) * ld + 2 * C + h * hd + c)]); };
      auto go = [&](int64_t i, int64_t c) { return double(dout[size_t((b * T + i) * C + h * hd + c)]); };
      std::fill(P.begin(), P.end(), 0.0);
      std::fill(Pd.begin(), Pd.end(), 0.0);
      std::fill(dS.begin(), dS.end(), 0.0);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t lim = d.causal ? i + 1 : T;
        std::vector<double> s(nT);
        double mx = -INFINITY;
        for (int64_t j = 0; j < lim; ++j) {
          double acc = 0.0;
          for (int64_t c = 0; c < hd; ++c) acc += q(i, c) * k(j, c);
          s[size_t(j)] = acc * d.scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < lim; ++j) sum += std::exp(s[size_t(j)] - mx);
        double dot = 0.0, ddi = 0.0;
        for (int64_t j = 0; j < lim; ++j) {
          const double p = std::exp(s[size_t(j)] - mx) / sum;
          const bool dr = attention_dropped(d, (bh * T + i) * T + j);
          P[at(i, j)] = p;
          Pd[at(i, j)] = dr ? 0.0 : p * keep;
          double dp = 0.0;
          for (int64_t c = 0; c < hd; ++c) dp += go(i, c) * v(j, c);
          dp = dr ? 0.0 : dp * keep;
          dS[at(i, j)] = dp;  // dP for now
          dot += p * dp;
        }
        D[size_t(i)] = dot;
        for (int64_t c = 0; c < hd; ++c) {
          double o = 0.0, bound = 0.0;
          for (int64_t j = 0; j < lim; ++j) {
            o += Pd[at(i, j)] * v(j, c);
            bound += std::fabs(Pd[at(i, j)] * v(j, c));
          }
          const size_t oi = size_t((b * T + i) * C + h * hd + c);
          r.out[oi] = o;
          r.tol_out[oi] += (kU + kAcc) * bound;
          ddi += std::fabs(go(i, c)) * kU * bound;
        }
        dD[size_t(i)] = ddi;
        for (int64_t j = 0; j < lim; ++j) dS[at(i, j)] = P[at(i, j)] * (dS[at(i, j)] - dot) * d.scale;
      }
      for (int64_t i = 0; i < T; ++i)
        for (int64_t c = 0; c < hd; ++c) {
          double dq = 0.0, tq = 0.0, tdd = 0.0;
          for (int64_t j = 0; j < T; ++j) {
            dq += dS[at(i, j)] * k(j, c);
            tq += std::fabs(dS[at(i, j)] * k(j, c));
            tdd += P[at(i, j)] * std::fabs(k(j, c));
          }
          const size_t qi = size_t((b * T + i) * ld + h * hd + c);
          r.dqkv[qi] = dq;
          r.tol_dqkv[qi] += (kU + kAcc) * tq + 2.0 * d.scale * dD[size_t(i)] * tdd;
        }
      for (int64_t j = 0; j < T; ++j)
        for (int64_t c = 0; c < hd; ++c) {
          double dk = 0.0, tk = 0.0, tdd = 0.0, dv = 0.0, tv = 0.0;
          for (int64_t i = 0; i < T; ++i) {
            dk += dS[at(i, j)] * q(i, c);
            tk += std::fabs(dS[at(i, j)] * q(i, c));
            tdd += P[at(i, j)] * dD[size_t(i)] * std::fabs(q(i, c));
            dv += Pd[at(i, j)] * go(i, c);
            tv += std::fabs(Pd[at(i, j)] * go(i, c));
          }
          const size_t ki = size_t((b * T + j) * ld + C + h * hd + c);
          r.dqkv[ki] = dk;
          r.tol_dqkv[ki] += (kU + kAcc) * tk + 2.0 * d.scale * tdd;
          r.dqkv[ki + size_t(C)] = dv;
          r.tol_dqkv[ki + size_t(C)] += (kU + kAcc) * tv;
        }
    }
  return r;
}

// Every element inside its bound (NaN fails); reports the worst ratio and the
// norm-wise relative error.
void expect_within(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                   const std::vector<double>& tol) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0, num = 0.0, den = 0.0;
  size_t at = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - want[i]);
    const double ratio = e / tol[i];
    if (!(ratio <= 1.0)) ++bad;
    if (!(ratio <= worst)) worst = ratio, at = i;
    num += e * e, den += want[i] * want[i];
  }
  INFO(what << ": " << bad << " of " << got.size() << " outside the bound; worst |err| / bound " << worst << " at "
            << at << " (got " << got[at] << ", want " << want[at] << ", bound " << tol[at]
            << "); |err| / |ref| = " << std::sqrt(num / std::max(den, 1e-300)));
  CHECK(bad == 0);
}

struct Result {
  std::vector<float> out, dqkv, saved;
  std::vector<uint16_t> out_h, dqkv_h;
};

Result run(const AttentionDims& d, const std::vector<float>& qkv, const std::vector<float>& dout, bool bf16_outputs,
           AttentionPath path = AttentionPath::automatic) {
  const int64_t BT = d.batch * d.seq, C = d.width;
  DeviceBuffer<float> q(size_t(BT * 3 * C)), o(size_t(BT * C)), s(size_t(Attention::saved_floats(d))),
      g(size_t(BT * C)), dq(size_t(BT * 3 * C));
  DeviceBuffer<uint16_t> oh(size_t(BT * C)), dqh(size_t(BT * 3 * C));
  q.upload(qkv.data(), qkv.size());
  g.upload(dout.data(), dout.size());
  o.fill_bytes(0xFF);  // NaN: every element must be written
  s.fill_bytes(0xFF);
  dq.fill_bytes(0xFF);
  oh.fill_bytes(0xFF);
  dqh.fill_bytes(0xFF);
  Attention a(nullptr, path);
  a.forward(d, q.data(), o.data(), s.data(), bf16_outputs ? oh.data() : nullptr);
  a.backward(d, q.data(), s.data(), g.data(), dq.data(), bf16_outputs ? dqh.data() : nullptr);
  fp4lab::cuda::check(cudaDeviceSynchronize(), "flash attention test");
  Result r{o.download(), dq.download(), s.download(), {}, {}};
  if (bf16_outputs) r.out_h = oh.download(), r.dqkv_h = dqh.download();
  return r;
}

uint16_t bf16_of(float x) {
  std::vector<float> v{x};
  fp4lab::test::round_to_bf16(v);
  uint32_t b;
  std::memcpy(&b, v.data(), 4);
  return uint16_t(b >> 16);
}

}  // namespace

TEST_CASE("bf16 flash attention: forward and backward inside the BF16 bounds of a float64 reference") {
  // T: one element, below/at/above a 64-row tile, odd (unaligned Philox groups), several tiles.
  const AttentionGeo geos[] = {{1, 1, 1, 64},   {2, 5, 3, 16},   {1, 63, 2, 32},  {2, 64, 2, 64},   {1, 130, 2, 64},
                               {2, 97, 1, 128}, {1, 256, 2, 64}, {1, 300, 1, 32}, {3, 33, 2, 128}, {2, 200, 3, 64}};
  uint32_t seed = 11;
  for (const AttentionGeo& g : geos)
    for (bool causal : {true, false})
      for (float p : {0.0f, 0.2f}) {
        AttentionDims d = attention_dims(g, causal, p, 4321 + seed, 77);
        d.bf16_flash = true;
        FP4LAB_CAPTURE_ATTENTION_CASE(g, causal, p);
        const auto qkv = randn_bf16(size_t(g.B * g.T * 3 * d.width), ++seed, 1.0f);
        const auto dout = randn_bf16(size_t(g.B * g.T * d.width), ++seed, 1.0f);
        const Ref ref = reference(d, qkv, dout);
        const bool bf16_outputs = (seed % 4) == 0;
        const Result r = run(d, qkv, dout, bf16_outputs);
        expect_within("out", r.out, ref.out, ref.tol_out);
        expect_within("dqkv", r.dqkv, ref.dqkv, ref.tol_dqkv);
        if (bf16_outputs) {
          bool same = true;
          for (size_t i = 0; i < r.out.size() && same; ++i) same = r.out_h[i] == bf16_of(r.out[i]);
          for (size_t i = 0; i < r.dqkv.size() && same; ++i) same = r.dqkv_h[i] == bf16_of(r.dqkv[i]);
          CHECK(same);  // the BF16 outputs are the outputs' BF16 roundings
        }
        // The saved output rows are out's; the log-sum-exp is finite.
        const int64_t hd = g.hd, T = g.T, C = d.width;
        bool saved_ok = true;
        for (int64_t bh = 0; bh < g.B * g.H && saved_ok; ++bh)
          for (int64_t i = 0; i < T && saved_ok; ++i) {
            const int64_t b = bh / g.H, h = bh % g.H;
            for (int64_t c = 0; c < hd; ++c)
              saved_ok =
                  saved_ok && r.saved[size_t((bh * T + i) * hd + c)] == r.out[size_t((b * T + i) * C + h * hd + c)];
            saved_ok = saved_ok && std::isfinite(r.saved[size_t(g.B * g.H * T * hd + bh * T + i)]);
          }
        CHECK(saved_ok);
        const Result again = run(d, qkv, dout, false);
        CHECK(again.out == r.out);  // no atomics: the same bits run to run
        CHECK(again.dqkv == r.dqkv);
      }
}

TEST_CASE("bf16 flash attention: the dropout mask is the FP32 path's, element for element") {
  // One-hot V and dout rows (e_j for key j, e_i for query i): out row i holds
  // drop(P)_ij in column j, dV row j holds drop(P)_ij in column i. hd >= T.
  for (const AttentionGeo& g : {AttentionGeo{2, 100, 2, 128}, AttentionGeo{1, 37, 3, 64}, AttentionGeo{2, 64, 1, 64}})
    for (bool causal : {true, false}) {
      AttentionDims d = attention_dims(g, causal, 0.3f, 99, 5);
      CAPTURE(g.T);
      CAPTURE(g.hd);
      CAPTURE(causal);
      const int64_t T = g.T, C = d.width, ld = 3 * C;
      auto qkv = randn_bf16(size_t(g.B * T * ld), 3, 0.5f);
      std::vector<float> dout(size_t(g.B * T * C), 0.0f);
      for (int64_t b = 0; b < g.B; ++b)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < g.H; ++h) {
            for (int64_t c = 0; c < g.hd; ++c)
              qkv[size_t((b * T + t) * ld + 2 * C + h * g.hd + c)] = c == t ? 1.f : 0.f;
            dout[size_t((b * T + t) * C + h * g.hd + t)] = 1.0f;
          }
      const Result fp32 = run(d, qkv, dout, false, AttentionPath::fused);
      d.bf16_flash = true;
      const Result flash = run(d, qkv, dout, false);
      int64_t mismatches = 0, zeros = 0, total = 0;
      for (int64_t b = 0; b < g.B; ++b)
        for (int64_t h = 0; h < g.H; ++h)
          for (int64_t i = 0; i < T; ++i)
            for (int64_t j = 0; j < T; ++j) {
              const int64_t bh = b * g.H + h;
              const bool want = (causal && j > i) || attention_dropped(d, (bh * T + i) * T + j);
              const size_t oi = size_t((b * T + i) * C + h * g.hd + j);
              const size_t vi = size_t((b * T + j) * ld + 2 * C + h * g.hd + i);
              const bool z[4] = {flash.out[oi] == 0.0f, fp32.out[oi] == 0.0f, flash.dqkv[vi] == 0.0f,
                                 fp32.dqkv[vi] == 0.0f};
              for (bool zz : z) mismatches += zz != want;
              zeros += want, ++total;
            }
      INFO(mismatches << " mismatches; " << zeros << " of " << total << " dropped or masked");
      CHECK(mismatches == 0);
      CHECK(zeros > total / 10);
    }
}

TEST_CASE("bf16 flash attention: saved sizes, refusals, config choice" * doctest::test_suite("host")) {
  AttentionDims d;
  d.batch = 2, d.seq = 256, d.heads = 6, d.width = 384;
  CHECK(Attention::saved_floats(d) == 2 * 6 * 256 * 256);
  d.bf16_flash = true;
  CHECK(Attention::saved_floats(d) == 2 * 6 * 256 * 65);
  CHECK(Attention::flash_unsupported(d, {}).empty());
  d.width = 6 * 48;
  CHECK(Attention::flash_unsupported(d, {}).find("head dim 48") != std::string::npos);
  d.width = 384;
  alignas(16) static float buf[8];
  CHECK(Attention::flash_unsupported(d, {buf + 1}).find("16-byte aligned") != std::string::npos);
  fp4lab::train::AttentionShape s{2, 256, 6, true, 0.125f, 0.0f};
  CHECK(fp4lab::train::attention_saved_cols(s, 64) == 256);
  s.bf16_flash = true;
  CHECK(fp4lab::train::attention_saved_cols(s, 64) == 65);

  using nlohmann::json;
  const json base = {{"model", {{"type", "gpt"}, {"layers", 1}, {"heads", 2}, {"width", 128}, {"context", 32}}},
                     {"data", {{"type", "char"}, {"path", "x.txt"}}},
                     {"recipe", "bf16"},
                     {"backend", "cuda"}};
  json j = base;
  j["model"]["attention"] = "bf16_flash";
  using Kind = fp4lab::train::ModelConfig::Attention;
  CHECK(fp4lab::train::config_from_json(j).model.attention == Kind::bf16_flash);
  CHECK(fp4lab::train::config_to_json(fp4lab::train::config_from_json(j))["model"]["attention"] == "bf16_flash");
  // Not given: a GPT of head dim 64 gets bf16_flash (the default: tests/train/cpu/test_attention_flash.cpp has the rest).
  CHECK(fp4lab::train::config_from_json(base).model.attention == Kind::bf16_flash);
  j["model"]["attention"] = "fp32";
  CHECK(fp4lab::train::config_from_json(j).model.attention == Kind::fp32);
  CHECK(fp4lab::train::config_to_json(fp4lab::train::config_from_json(j))["model"]["attention"] == "fp32");
  j["model"]["attention"] = "flash";
  CHECK_THROWS_WITH(fp4lab::train::config_from_json(j), doctest::Contains("model.attention"));
  j["model"]["attention"] = "bf16_flash";
  j["backend"] = "cpu";  // the CPU twin (train/cpu/attention_flash.cpp)
  CHECK(fp4lab::train::config_from_json(j).model.attention == Kind::bf16_flash);
  j["backend"] = "cuda";
  j["model"]["width"] = 96;  // head dim 48
  CHECK_THROWS_WITH(fp4lab::train::config_from_json(j), doctest::Contains("head dims 16, 32, 64 or 128"));
}
