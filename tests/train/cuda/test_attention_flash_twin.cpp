// The CUDA BF16 flash attention (train/cuda/attention_flash.cu) against its CPU
// twin (train/cpu/attention_flash.hpp), through the two backends' attention ops
// with AttentionShape::bf16_flash, element by element within the stated bound:
// each lies within its bound of the float64 evaluation of the same roundings
// (tests/train/attention_flash_ref.hpp; the twin's FP32 model, the kernels':
// truncating tensor-core sums and ex2.approx), so the two within the sum.
// The backward runs on one saved forward (the twin's, uploaded to the GPU), so
// that the comparison is of the backward alone. The dropout masks are compared
// directly (one-hot V and dout rows), and a few GPT steps with bf16_flash run
// on both backends within the CPU-vs-CUDA model-step tolerances.
// Without a GPU the executable reports SKIPPED (tests/gpu_main.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "train/attention_flash_ref.hpp"
#include "train/backend.hpp"
#include "train/backend_cases.hpp"
#include "train/model.hpp"

using namespace fp4lab::train;
namespace bt = fp4lab::train::test;

namespace {

std::vector<float> get(Backend& be, const Tensor& t) {
  std::vector<float> v(size_t(t.size()));
  be.download(t, v.data());
  return v;
}

// Elements of a and b farther apart than bound_a + bound_b (NaN counts).
void expect_within_sum(const std::string& what, const std::vector<float>& a, const std::vector<float>& b,
                       const std::vector<double>& ta, const std::vector<double>& tb) {
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() == ta.size());
  REQUIRE(a.size() == tb.size());
  std::vector<double> want(b.begin(), b.end()), bound(a.size());
  for (size_t i = 0; i < a.size(); ++i) bound[i] = ta[i] + tb[i];
  const bt::BoundExcess e = bt::outside_bound(a, want, bound);
  const size_t at = e.worst < 0.0 ? 0 : e.at;
  INFO(what << ": " << e.outside << " of " << a.size() << " outside; worst |cuda - cpu| / bound " << e.worst << " at "
            << at << " (cuda " << a[at] << ", cpu " << b[at] << ", bound " << bound[at] << ")");
  CHECK(e.outside == 0);
}

struct Fwd {
  std::vector<float> out, saved;
};
Fwd forward(Backend& be, const AttentionShape& s, const std::vector<float>& qkv, DropoutKey key) {
  const int64_t N = s.batch * s.seq, C3 = int64_t(qkv.size()) / N;
  Tensor q = bt::put(be, qkv, N, C3), o = be.empty(N, C3 / 3);
  Tensor sv = be.empty(s.batch * s.heads * s.seq, attention_saved_cols(s, C3 / 3 / s.heads));
  be.attention_forward(s, q, o, sv, key);
  return {get(be, o), get(be, sv)};
}
std::vector<float> backward(Backend& be, const AttentionShape& s, const std::vector<float>& qkv,
                            const std::vector<float>& saved, const std::vector<float>& dout, DropoutKey key) {
  const int64_t N = s.batch * s.seq, C3 = int64_t(qkv.size()) / N;
  Tensor q = bt::put(be, qkv, N, C3), d = bt::put(be, dout, N, C3 / 3), dq = be.empty(N, C3);
  Tensor sv = bt::put(be, saved, s.batch * s.heads * s.seq, attention_saved_cols(s, C3 / 3 / s.heads));
  be.attention_backward(s, q, sv, d, dq, key);
  return get(be, dq);
}

}  // namespace

TEST_CASE("bf16 flash attention: the CUDA kernels against the CPU twin, element by element within the bound") {
  auto cpu = make_cpu_backend(2);
  auto gpu = make_backend("cuda");
  const DropoutKey key{0xC0FFEEull, 31};
  uint32_t seed = 700;
  for (int64_t T : {1, 7, 63, 65, 130})
    for (int64_t hd : {16, 32, 64, 128})
      for (bool causal : {false, true})
        for (float p : {0.0f, 0.1f}) {
          const int64_t B = 2, H = 2, C = H * hd, N = B * T;
          const AttentionShape s{B, T, H, causal, float((causal ? 1.0 : 4.0) / std::sqrt(double(hd))), p, true};
          CAPTURE(T);
          CAPTURE(hd);
          CAPTURE(causal);
          CAPTURE(p);
          const auto qkv = bt::randv(size_t(N * 3 * C), ++seed, 0.7f), dout = bt::randv(size_t(N * C), ++seed);
          const Fwd fc = forward(*cpu, s, qkv, key), fg = forward(*gpu, s, qkv, key);
          const bt::FlashRef rc = bt::flash_reference(s, qkv, dout, key),
                             rg = bt::flash_reference(s, qkv, dout, key, bt::kFlashCudaModel);
          expect_within_sum("out", fg.out, fc.out, rg.tol_out, rc.tol_out);
          const size_t no = size_t(B * H * T * hd);
          expect_within_sum("saved lse2", std::vector<float>(fg.saved.begin() + long(no), fg.saved.end()),
                            std::vector<float>(fc.saved.begin() + long(no), fc.saved.end()), rg.tol_lse, rc.tol_lse);
          // The backward of one forward (the twin's) on both.
          const auto dc = backward(*cpu, s, qkv, fc.saved, dout, key), dg = backward(*gpu, s, qkv, fc.saved, dout, key);
          const bt::FlashRef bc = bt::flash_reference(s, qkv, dout, key, {}, &fc.saved),
                             bg = bt::flash_reference(s, qkv, dout, key, bt::kFlashCudaModel, &fc.saved);
          expect_within_sum("dqkv", dg, dc, bg.tol_dqkv, bc.tol_dqkv);
        }
}

TEST_CASE("bf16 flash attention: the CUDA kernels drop the CPU twin's elements") {
  // One-hot V and dout rows (hd >= T): out (i, j) and dV (j, i) are zero exactly
  // where element (i, j) is masked or dropped, on either backend.
  auto cpu = make_cpu_backend(2);
  auto gpu = make_backend("cuda");
  const DropoutKey key{99, 5};
  for (int64_t T : {7, 65, 100})
    for (bool causal : {false, true}) {
      const int64_t B = 2, H = 2, hd = 128, C = H * hd, ld = 3 * C;
      const AttentionShape s{B, T, H, causal, 0.05f, 0.3f, true};
      CAPTURE(T);
      CAPTURE(causal);
      auto qkv = bt::randv(size_t(B * T * ld), 3, 0.5f);
      std::vector<float> dout(size_t(B * T * C), 0.0f);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t c = 0; c < hd; ++c) qkv[size_t((b * T + t) * ld + 2 * C + h * hd + c)] = c == t ? 1.f : 0.f;
            dout[size_t((b * T + t) * C + h * hd + t)] = 1.0f;
          }
      const Fwd fc = forward(*cpu, s, qkv, key), fg = forward(*gpu, s, qkv, key);
      const auto dc = backward(*cpu, s, qkv, fc.saved, dout, key), dg = backward(*gpu, s, qkv, fc.saved, dout, key);
      int64_t differ = 0, zeros = 0, total = 0;
      for (size_t i = 0; i < fc.out.size(); ++i) differ += (fc.out[i] == 0.0f) != (fg.out[i] == 0.0f);
      for (size_t i = 0; i < dc.size(); ++i) differ += (dc[i] == 0.0f) != (dg[i] == 0.0f);
      for (int64_t r = 0; r < B * T; ++r)  // out (i, j), j < T: drop(P)_ij, zero where masked or dropped
        for (int64_t h = 0; h < H; ++h)
          for (int64_t j = 0; j < T; ++j) zeros += fc.out[size_t(r * C + h * hd + j)] == 0.0f, ++total;
      INFO(differ << " elements zero on one backend only; " << zeros << " of " << total << " probabilities zero");
      CHECK(differ == 0);
      CHECK(zeros > total / 5);  // p = 0.3: the check sees dropped elements
    }
}

// Forward + backward of a small GPT with bf16_flash at steps 0, 1, 2 (fresh model, each step its dropout) on both backends, with the tolerances of the FP32 model-step
// test (test_backend.cpp): losses to 1e-5 relative, parameter gradients within 1e-4 (1 + max |cpu|). The
// twin and the kernels may round a fragile P or dS to neighbouring BF16 values (the bound above), which
// moves a gradient by at most 2^-7 of one term; these sizes keep that far below the tolerance.
TEST_CASE("bf16 flash attention: GPT forward/backward at three steps (their dropout) agree on the CPU twin and CUDA") {
  auto cpu = make_cpu_backend(2);
  auto gpu = make_backend("cuda");
  ModelConfig mc;
  mc.type = "gpt";
  mc.layers = 2, mc.heads = 2, mc.width = 32, mc.dropout = 0.1, mc.vocab_size = 29, mc.context = 16;
  mc.attention = ModelConfig::Attention::bf16_flash;
  Batch bt;
  bt.size = 3;
  std::mt19937 rng(21);
  bt.tokens.resize(size_t(bt.size * mc.context));
  bt.targets.resize(bt.tokens.size());
  for (auto& t : bt.tokens) t = int32_t(rng() % 29);
  for (auto& t : bt.targets) t = int32_t(rng() % 29);
  for (int64_t step = 0; step < 3; ++step) {
    CAPTURE(step);
    StepContext sc;
    sc.seed = 17;
    sc.step = step;
    double loss[2];
    std::vector<float> g[2];
    for (int w = 0; w < 2; ++w) {
      Backend& be = w ? *gpu : *cpu;
      auto model = make_model(mc, be, 5);
      be.fill(model->params().grads, 0.0f);
      loss[w] = model->forward_backward(bt, sc, nullptr);
      g[w] = get(be, model->params().grads);
    }
    CHECK(std::abs(loss[0] - loss[1]) <= 1e-5 * (1.0 + std::abs(loss[0])));
    double mref = 0.0, md = 0.0;
    for (size_t i = 0; i < g[0].size(); ++i)
      mref = std::max(mref, double(std::fabs(g[0][i]))), md = std::max(md, double(std::fabs(g[0][i] - g[1][i])));
    INFO("max |cuda - cpu| gradient " << md << ", max |cpu| " << mref);
    CHECK(md <= 1e-4 * (1.0 + mref));
  }
}
