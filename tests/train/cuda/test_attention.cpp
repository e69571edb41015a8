// train/cuda/attention.cu: both attention paths (fused FP32 kernels, cuBLAS SGEMMs)
// against a float64 reference written here from the definition in train/cuda/nn.hpp,
// with the dropout mask drawn from core's random_bits; shapes with partial
// tiles, odd T (unaligned Philox groups), every fused head dim, causal or not.
// Tolerance: FP32 sums of <= 300 terms against float64, through the chained
// GEMM -> softmax -> GEMM: max |gpu - ref| <= 3e-5 (1 + max |ref|). A wrong
// dropout element moves an output by about p_ij |v| ~ 1e-3, far above that.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "attention_test_util.hpp"
#include "cuda/device.hpp"
#include "train/cuda/nn.hpp"

namespace {

using fp4lab::cuda::DeviceBuffer;
using fp4lab::cuda::nn::Attention;
using fp4lab::cuda::nn::AttentionDims;
using fp4lab::cuda::nn::AttentionPath;
using fp4lab::test::attention_dims;
using fp4lab::test::attention_dropped;
using fp4lab::test::AttentionGeo;
using fp4lab::test::randn;

struct Ref {
  std::vector<double> probs, out, dqkv;
};

// The definition, in float64 (mask and keep scale as the kernels use them).
Ref reference(const AttentionDims& d, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int64_t B = d.batch, T = d.seq, H = d.heads, C = d.width, hd = C / H, ld = 3 * C;
  const double keep = fp4lab::test::attention_keep_scale(d);
  Ref r;
  r.probs.assign(size_t(B * H * T * T), 0.0);
  r.out.assign(size_t(B * T * C), 0.0);
  r.dqkv.assign(size_t(B * T * ld), 0.0);
  const size_t nT = static_cast<size_t>(T);
  std::vector<double> pd(nT), dpd(nT), s(nT);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const float* q = &qkv[size_t((b * T + i) * ld + h * hd)];
        const int64_t lim = d.causal ? i + 1 : T;
        double mx = -INFINITY;
        for (int64_t j = 0; j < lim; ++j) {
          const float* k = &qkv[size_t((b * T + j) * ld + C + h * hd)];
          double acc = 0.0;
          for (int64_t c = 0; c < hd; ++c) acc += double(q[c]) * double(k[c]);
          s[size_t(j)] = acc * d.scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < lim; ++j) sum += std::exp(s[size_t(j)] - mx);
        const int64_t row = (b * H + h) * T + i;
        const float* go = &dout[size_t((b * T + i) * C + h * hd)];
        double dot = 0.0;
        for (int64_t j = 0; j < lim; ++j) {
          const double p = std::exp(s[size_t(j)] - mx) / sum;
          r.probs[size_t(row * T + j)] = p;
          const bool dropped = attention_dropped(d, row * T + j);
          pd[size_t(j)] = dropped ? 0.0 : p * keep;
          const float* v = &qkv[size_t((b * T + j) * ld + 2 * C + h * hd)];
          double dp = 0.0;
          for (int64_t c = 0; c < hd; ++c) {
            r.out[size_t((b * T + i) * C + h * hd + c)] += pd[size_t(j)] * v[c];
            dp += double(go[c]) * double(v[c]);
          }
          dpd[size_t(j)] = dropped ? 0.0 : dp * keep;
          dot += dpd[size_t(j)] * p;
        }
        for (int64_t j = 0; j < lim; ++j) {
          const double ds = r.probs[size_t(row * T + j)] * (dpd[size_t(j)] - dot) * d.scale;
          for (int64_t c = 0; c < hd; ++c) {
            const int64_t qi = (b * T + i) * ld + h * hd + c, kj = (b * T + j) * ld + C + h * hd + c;
            r.dqkv[size_t(qi)] += ds * qkv[size_t(kj)];
            r.dqkv[size_t(kj)] += ds * qkv[size_t(qi)];
            r.dqkv[size_t(kj + C)] += pd[size_t(j)] * go[c];
          }
        }
      }
  return r;
}

void expect_close(const char* what, const std::vector<float>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  double mx = 0.0, err = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    mx = std::max(mx, std::fabs(want[i]));
    const double e = std::fabs(double(got[i]) - want[i]);
    if (!(e <= err)) err = e, at = i;
  }
  INFO(what << ": max |err| " << err << " at " << at << " (got " << got[at] << ", want " << want[at] << "), max |ref| "
            << mx);
  CHECK(err <= tol * (1.0 + mx));
}

struct Result {
  std::vector<float> probs, out, dqkv;
};

Result run(AttentionPath path, const AttentionDims& d, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int64_t BT = d.batch * d.seq, C = d.width, BHT = d.batch * d.heads * d.seq;
  DeviceBuffer<float> q(size_t(BT * 3 * C)), o(size_t(BT * C)), p(size_t(BHT * d.seq)), g(size_t(BT * C)),
      dq(size_t(BT * 3 * C));
  q.upload(qkv.data(), qkv.size());
  g.upload(dout.data(), dout.size());
  p.fill_bytes(0xFF);  // NaN: every element must be written
  dq.fill_bytes(0xFF);
  Attention a(nullptr, path);
  a.forward(d, q.data(), o.data(), p.data());
  a.backward(d, q.data(), p.data(), g.data(), dq.data());
  fp4lab::cuda::check(cudaDeviceSynchronize(), "attention test");
  return Result{p.download(), o.download(), dq.download()};
}

}  // namespace

TEST_CASE("attention: fused and cuBLAS paths match a float64 reference (causal/full, dropout, partial tiles)") {
  // T: one element, below/at/above one 64-row tile, odd (unaligned Philox groups), several tiles.
  const AttentionGeo geos[] = {{1, 1, 1, 16},   {2, 5, 3, 16},   {1, 63, 2, 32},  {2, 64, 2, 64},  {1, 130, 2, 64},
                               {2, 97, 1, 128}, {1, 256, 2, 64}, {1, 300, 1, 32}, {1, 257, 1, 16}, {3, 33, 2, 128}};
  uint32_t seed = 7;
  for (const AttentionGeo& g : geos)
    for (bool causal : {true, false})
      for (float p : {0.0f, 0.2f}) {
        const AttentionDims d = attention_dims(g, causal, p, 1234 + seed, 99);
        FP4LAB_CAPTURE_ATTENTION_CASE(g, causal, p);
        const auto qkv = randn(size_t(g.B * g.T * 3 * d.width), ++seed, 1.0f);
        const auto dout = randn(size_t(g.B * g.T * d.width), ++seed, 1.0f);
        const Ref ref = reference(d, qkv, dout);
        for (AttentionPath path : {AttentionPath::fused, AttentionPath::cublas}) {
          CAPTURE(int(path));
          const Result r = run(path, d, qkv, dout);
          expect_close("probs", r.probs, ref.probs, 1e-5);
          expect_close("out", r.out, ref.out, 3e-5);
          expect_close("dqkv", r.dqkv, ref.dqkv, 3e-5);
          if (path == AttentionPath::fused) {
            const Result again = run(path, d, qkv, dout);
            CHECK(again.probs == r.probs);
            CHECK(again.out == r.out);
            CHECK(again.dqkv == r.dqkv);
          }
        }
      }
}

TEST_CASE("attention: the fused path names what it cannot run; automatic falls back to cuBLAS") {
  AttentionDims d;
  d.batch = 1, d.seq = 8, d.heads = 2, d.width = 16;  // head dim 8
  CHECK(Attention::fused_unsupported(d, {}).find("head dim 8") != std::string::npos);
  d.width = 128, d.seq = 4096;
  CHECK(Attention::fused_unsupported(d, {}).find("sequence length 4096") != std::string::npos);
  d.seq = 256;
  CHECK(Attention::fused_unsupported(d, {}).empty());
  // The longest sequences a 64-row tile of scores fits (the limits train/cuda/nn.hpp states).
  for (auto [hd, tmax] : {std::pair<int64_t, int64_t>{16, 704}, {32, 640}, {64, 576}, {128, 448}}) {
    CAPTURE(hd);
    d.heads = 2, d.width = 2 * hd, d.seq = tmax;
    CHECK(Attention::fused_unsupported(d, {}).empty());
    d.seq = tmax + 1;
    CHECK(Attention::fused_unsupported(d, {}).find("sequence length") != std::string::npos);
  }
  d.heads = 2, d.width = 128, d.seq = 256;
  alignas(16) static float buf[8];
  CHECK(Attention::fused_unsupported(d, {buf + 1}).find("16-byte aligned") != std::string::npos);
  d.width = 16, d.seq = 8;
  const auto qkv = randn(size_t(8 * 48), 3, 1.0f), dout = randn(size_t(8 * 16), 4, 1.0f);
  CHECK_THROWS_WITH(run(AttentionPath::fused, d, qkv, dout), doctest::Contains("head dim 8"));
  const Result r = run(AttentionPath::automatic, d, qkv, dout);
  expect_close("automatic out (cuBLAS path)", r.out, reference(d, qkv, dout).out, 3e-5);
}
