// The CPU twin of the BF16 flash attention (train/cpu/attention_flash.hpp),
// through the CPU backend's attention_forward / attention_backward with
// AttentionShape::bf16_flash, against the float64 evaluation of the same
// roundings (tests/train/attention_flash_ref.hpp): every output element inside
// its derived bound; the dropout mask against random_bits computed here; the
// bound tight enough that the FP32 attention and a wrong mask fall outside it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/philox.hpp"
#include "train/attention_flash_ref.hpp"
#include "train/backend.hpp"
#include "train/backend_cases.hpp"
#include "train/config.hpp"
#include "train/model.hpp"

namespace {

using namespace fp4lab::train;
namespace bt = fp4lab::train::test;

struct Run {
  std::vector<float> out, saved, dqkv;
};

// Forward and backward on the backend; the saved tensor [B*H*T, cols] as the trainer allocates it.
Run run(Backend& be, const AttentionShape& s, const std::vector<float>& qkv, const std::vector<float>& dout,
        DropoutKey key) {
  const int64_t N = s.batch * s.seq, C3 = int64_t(qkv.size()) / N, C = C3 / 3;
  Tensor q = bt::put(be, qkv, N, C3), g = bt::put(be, dout, N, C);
  Tensor o = be.empty(N, C), dq = be.empty(N, C3);
  Tensor sv = be.empty(s.batch * s.heads * s.seq, attention_saved_cols(s, C / s.heads));
  be.attention_forward(s, q, o, sv, key);
  be.attention_backward(s, q, sv, g, dq, key);
  Run r{std::vector<float>(size_t(o.size())), std::vector<float>(size_t(sv.size())),
        std::vector<float>(size_t(dq.size()))};
  be.download(o, r.out.data());
  be.download(sv, r.saved.data());
  be.download(dq, r.dqkv.data());
  return r;
}

// How many elements of got lie outside want +- tol (NaN counts), with the worst one described in `worst`.
int64_t outside(const float* got, const std::vector<double>& want, const std::vector<double>& tol,
                std::string& worst) {
  const bt::BoundExcess e = bt::outside_bound(std::span<const float>(got, want.size()), want, tol);
  if (e.worst >= 0.0 || std::isnan(e.worst))
    worst = "worst |err| / bound " + std::to_string(e.worst) + " at " + std::to_string(e.at) + " (got " +
            std::to_string(got[e.at]) + ", want " + std::to_string(want[e.at]) + ", bound " +
            std::to_string(tol[e.at]) + ")";
  return e.outside;
}

void expect_inside(const char* what, const float* got, const std::vector<double>& want,
                   const std::vector<double>& tol) {
  std::string worst;
  const int64_t bad = outside(got, want, tol, worst);
  INFO(what << ": " << bad << " of " << want.size() << " outside the bound; " << worst);
  CHECK(bad == 0);
}

AttentionShape shape(int64_t B, int64_t T, int64_t H, int64_t hd, bool causal, float p) {
  // Causal rows at the usual 1/sqrt(hd); full rows at 4/sqrt(hd): peaked rows whose running max moves.
  const float scale = float((causal ? 1.0 : 4.0) / std::sqrt(double(hd)));
  return AttentionShape{B, T, H, causal, scale, p, true};
}

}  // namespace

TEST_CASE("bf16 flash attention, CPU twin: every output inside the bound of the float64 evaluation") {
  auto be = make_cpu_backend(2);
  const DropoutKey key{0x5EED1234ull, 0xA77Eull};
  uint32_t seed = 500;
  int64_t cases = 0, rounded = 0, fragile = 0;
  for (int64_t T : {1, 7, 63, 65, 130})
    for (int64_t hd : {16, 32, 64, 128})
      for (bool causal : {false, true})
        for (float p : {0.0f, 0.1f}) {
          const int64_t B = T > 64 ? 1 : 2, H = hd >= 64 ? 1 : 2, C = H * hd, N = B * T;
          const AttentionShape s = shape(B, T, H, hd, causal, p);
          CAPTURE(T);
          CAPTURE(hd);
          CAPTURE(causal);
          CAPTURE(p);
          // Not BF16-exact: the loads' rounding is part of what is checked.
          const auto qkv = bt::randv(size_t(N * 3 * C), ++seed, 0.7f), dout = bt::randv(size_t(N * C), ++seed);
          const bt::FlashRef ref = bt::flash_reference(s, qkv, dout, key);
          const Run r = run(*be, s, qkv, dout, key);
          expect_inside("out", r.out.data(), ref.out, ref.tol_out);
          expect_inside("saved lse2", r.saved.data() + B * H * T * hd, ref.lse, ref.tol_lse);
          expect_inside("dqkv (forward and backward)", r.dqkv.data(), ref.dqkv, ref.tol_dqkv);
          // The backward alone, of the forward it was given: the tighter bound.
          const bt::FlashRef bwd = bt::flash_reference(s, qkv, dout, key, {}, &r.saved);
          expect_inside("dqkv (backward of the saved forward)", r.dqkv.data(), bwd.dqkv, bwd.tol_dqkv);
          // The saved O rows are out's bits ([B*H][T][hd] against [B*T, C]).
          bool same = true;
          for (int64_t bh = 0; bh < B * H; ++bh)
            for (int64_t i = 0; i < T; ++i)
              same = same && std::memcmp(r.saved.data() + (bh * T + i) * hd,
                                         r.out.data() + ((bh / H) * T + i) * C + (bh % H) * hd, size_t(hd) * 4) == 0;
          CHECK(same);
          ++cases, rounded += bwd.rounded, fragile += bwd.fragile;
        }
  // Fragile: within the worst-case FP32 error (linear in the number of terms) of a BF16 rounding boundary.
  MESSAGE(cases, " cases; ", fragile, " of ", rounded, " BF16-rounded intermediates fragile");
  CHECK(fragile < rounded / 20);  // elsewhere the bound is FP32 noise, far below a BF16 rounding
}

TEST_CASE("bf16 flash attention, CPU twin: the dropout mask is random_bits' of (bh T + i) T + j") {
  // One-hot V and dout rows (V_j = e_j, dout_i = e_i; hd >= T): out row i holds
  // drop(P)_ij in column j and dV row j holds drop(P)_ij in column i, so each is
  // zero exactly where the element is masked or dropped.
  auto be = make_cpu_backend(2);
  const DropoutKey key{99, 5};
  for (int64_t T : {7, 65, 100})
    for (bool causal : {false, true}) {
      const int64_t B = 2, H = 2, hd = 128, C = H * hd, ld = 3 * C;
      const float p = 0.3f;
      AttentionShape s = shape(B, T, H, hd, causal, p);
      s.scale = 0.05f;  // flat rows: no probability underflows to 0
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
      const Run r = run(*be, s, qkv, dout, key);
      const uint32_t thr = fp4lab::dropout_threshold(p);
      int64_t mismatches = 0, dropped = 0, total = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < T; ++i)
            for (int64_t j = 0; j < T; ++j) {
              const int64_t bh = b * H + h;
              const bool drop = fp4lab::random_bits(key.seed, key.stream, uint64_t((bh * T + i) * T + j)) < thr;
              const bool zero = (causal && j > i) || drop;
              mismatches += (r.out[size_t((b * T + i) * C + h * hd + j)] == 0.0f) != zero;
              mismatches += (r.dqkv[size_t((b * T + j) * ld + 2 * C + h * hd + i)] == 0.0f) != zero;
              if (!(causal && j > i)) dropped += drop, ++total;
            }
      INFO(mismatches << " mismatches; " << dropped << " of " << total << " unmasked elements dropped");
      CHECK(mismatches == 0);
      CHECK(dropped > total / 5);  // p = 0.3 of the unmasked elements, roughly
    }
}

TEST_CASE("bf16 flash attention, CPU twin: the bound rejects the FP32 attention and another dropout mask") {
  auto be = make_cpu_backend(2);
  const int64_t B = 1, T = 65, H = 2, hd = 64, C = H * hd, N = B * T;
  const DropoutKey key{7, 8};
  AttentionShape s = shape(B, T, H, hd, true, 0.1f);
  const auto qkv = bt::randv(size_t(N * 3 * C), 41, 0.7f), dout = bt::randv(size_t(N * C), 42);
  const bt::FlashRef ref = bt::flash_reference(s, qkv, dout, key);
  std::string worst;
  // The twin itself: inside (the first case's check, here for the two contrasts below).
  const Run twin = run(*be, s, qkv, dout, key);
  CHECK(outside(twin.out.data(), ref.out, ref.tol_out, worst) == 0);
  // Another dropout stream: other elements dropped, far outside.
  const Run other = run(*be, s, qkv, dout, DropoutKey{7, 9});
  CHECK(outside(other.out.data(), ref.out, ref.tol_out, worst) > N * C / 4);
  // The FP32 attention (no BF16 rounding of Q, K, V, P): outside on many elements, so the bound
  // is far below the BF16 roundings' effect.
  s.bf16_flash = false;
  const int64_t BHT = B * H * T;
  Tensor q = bt::put(*be, qkv, N, 3 * C), o = be->empty(N, C), pr = be->empty(BHT, T);
  be->attention_forward(s, q, o, pr, key);
  std::vector<float> fp32(size_t(N * C));
  be->download(o, fp32.data());
  const int64_t bad = outside(fp32.data(), ref.out, ref.tol_out, worst);
  INFO("fp32 attention: " << bad << " of " << N * C << " outside; " << worst);
  CHECK(bad > N * C / 4);
}

TEST_CASE("model.attention: parsed once to ModelConfig::Attention; bf16_flash runs on the CPU backend") {
  using nlohmann::json;
  using Kind = ModelConfig::Attention;
  const json base = {{"model", {{"type", "gpt"}, {"layers", 1}, {"heads", 2}, {"width", 64}, {"context", 32}}},
                     {"data", {{"type", "char"}, {"path", "x.txt"}}},
                     {"recipe", "fp32"},
                     {"backend", "cpu"}};
  // Not given: a GPT whose head dim the kernels take gets bf16_flash (head dim 32 here); written into the config.
  CHECK(config_from_json(base).model.attention == Kind::bf16_flash);
  CHECK(config_to_json(config_from_json(base))["model"]["attention"] == "bf16_flash");
  {
    json other = base;
    other["model"]["width"] = 40;  // head dim 20: the FP32 attention
    CHECK(config_from_json(other).model.attention == Kind::fp32);
    CHECK(config_to_json(config_from_json(other))["model"]["attention"] == "fp32");
    json vit = {{"model", {{"type", "vit"}, {"width", 64}, {"heads", 4}}},
                {"data", {{"type", "mnist"}, {"path", "x"}}},
                {"recipe", "fp32"},
                {"backend", "cpu"}};
    CHECK(config_from_json(vit).model.attention == Kind::fp32);  // the ViT's default (head dim 16)
    // A run written before the key existed (no attention: FP32) keeps its identity beside an explicit "fp32";
    // against the new default its difference is named (a resume is refused with it).
    json old_run = config_to_json(config_from_json(other));
    old_run["model"].erase("attention");
    CHECK(config_hash(old_run) == config_hash(config_to_json(config_from_json(other))));
    CHECK(config_difference(run_identity(old_run), run_identity(config_to_json(config_from_json(other)))).empty());
    json old_gpt = config_to_json(config_from_json(base));
    old_gpt["model"].erase("attention");
    CHECK(config_difference(run_identity(old_gpt), run_identity(config_to_json(config_from_json(base)))) ==
          "model.attention (absent) -> \"bf16_flash\"");
  }
  json j = base;
  j["model"]["attention"] = "fp32";
  CHECK(config_from_json(j).model.attention == Kind::fp32);  // asked for: kept
  j["model"]["attention"] = "bf16_flash";
  const RunConfig c = config_from_json(j);
  CHECK(c.model.attention == Kind::bf16_flash);
  CHECK(config_to_json(c)["model"]["attention"] == "bf16_flash");
  j["model"]["attention"] = "BF16_flash";
  CHECK_THROWS_WITH(config_from_json(j),
                    doctest::Contains("model.attention: \"BF16_flash\" is not valid; valid: fp32, bf16_flash"));
  j["model"]["attention"] = "bf16_flash";
  j["model"]["width"] = 96;  // head dim 48
  CHECK_THROWS_WITH(config_from_json(j), doctest::Contains("head dims 16, 32, 64 or 128"));
  // A GPT step with bf16_flash on the CPU: the model hands the flag to the backend (a loss different from fp32's).
  ModelConfig mc;
  mc.type = "gpt";
  mc.layers = 1, mc.heads = 2, mc.width = 32, mc.vocab_size = 11, mc.context = 9;
  Batch b;
  b.size = 2;
  for (int i = 0; i < 18; ++i) b.tokens.push_back(i % 11), b.targets.push_back((3 * i + 1) % 11);
  auto be = make_cpu_backend(2);
  double loss[2];
  for (int w = 0; w < 2; ++w) {
    mc.attention = w ? Kind::bf16_flash : Kind::fp32;
    auto model = make_model(mc, *be, 5);
    be->fill(model->params().grads, 0.0f);
    loss[w] = model->forward_backward(b, StepContext{}, nullptr);
  }
  CHECK(std::isfinite(loss[1]));
  CHECK(loss[0] != loss[1]);
  CHECK(std::fabs(loss[0] - loss[1]) < 1e-2 * std::fabs(loss[0]));
}
