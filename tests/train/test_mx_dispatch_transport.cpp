// The MXFP8 dispatch cast's compact transport (train/mx_rows.hpp; MoeMlp under
// expert parallelism): rows travel as C E4M3 codes plus ceil(C / 32) E8M0
// scale codes and decode to fake_quantize's values bit for bit. Checked
// against sim's quantizer (codes, scale codes, dequantized values), against
// oracles built another way (the E4M3 value table from its fields by formula;
// the scale as the smallest power of two that fits the block amax, searched in
// double), through thread ranks with CountingComm's byte counts, and as a
// whole: the layer with compact rows equals the layer with the FP32 rows bit
// for bit, and EP runs with the cast follow one process.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "recipes/recipe.hpp"
#include "sim/quantizer.hpp"
#include "train/dist/counting_comm.hpp"
#include "train/expert_parallel_case.hpp"
#include "train/mx_rows_case.hpp"
#include "train/mx_rows.hpp"
#include "train/text_fixture.hpp"
#include "train/thread_ranks.hpp"

namespace fp4lab::train {

namespace {

QuantizerSpec mxfp8_fwd_x() { return *recipe_by_name("mxfp8").operands[size_t(Operand::fwd_x)]; }

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// E4M3 (fn) by its fields: sign s, exponent e (bias 7), mantissa m (3 bits); e = 15, m = 7 is NaN (no Inf);
// e = 0 subnormal m / 8 * 2^-6. Computed in double from the definition, not from core's decoder.
double e4m3_by_formula(uint32_t code) {
  const uint32_t s = code >> 7, e = (code >> 3) & 15u, m = code & 7u;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? (m / 8.0) * std::ldexp(1.0, -6) : (1.0 + m / 8.0) * std::ldexp(1.0, int(e) - 7);
  return s ? -mag : mag;
}

// The E8M0 code of a block by search: amax 0 -> 2^-127; NaN or Inf -> 0xFF; else the smallest e with
// amax <= 448 * 2^e (in double: exact), clamped to [-127, 127].
uint8_t scale_by_search(const float* x, int64_t n) {
  double amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return 0xFF;
    amax = std::max(amax, std::fabs(double(x[i])));
  }
  if (amax == 0) return 0;
  int e = -200;
  while (448.0 * std::ldexp(1.0, e) < amax) ++e;
  return uint8_t(std::clamp(e, -127, 127) + 127);
}

}  // namespace

TEST_CASE("moe dispatch transport: every E4M3 code under every E8M0 scale decodes to its value by formula") {
  const MxRows m = mx_rows(mxfp8_fwd_x(), 32);
  CHECK(m.row_bytes() == 33);
  for (uint32_t s = 0; s < 256; ++s)
    for (uint32_t code = 0; code < 256; ++code) {
      CAPTURE(s);
      CAPTURE(code);
      const float got = mx_decode(m, uint8_t(code), uint8_t(s));
      const double v = e4m3_by_formula(code);
      if (s == 255 || std::isnan(v)) {
        CHECK(std::isnan(got));
        continue;
      }
      const float want = float(v * std::ldexp(1.0, int(s) - 127));  // exact, or FP32's overflow to Inf
      CHECK(same_bits(got, want));
    }
}

TEST_CASE(
    "moe dispatch transport: bytes are sim's codes and scale codes; decoded rows are fake_quantize's, bit for bit") {
  const QuantizerSpec q = mxfp8_fwd_x();
  std::mt19937 rng(4701);
  auto be = make_cpu_backend(2);
  for (const int64_t C : {32, 48, 70, 1, 31, 33, 96}) {
    CAPTURE(C);
    const int64_t N = 24;
    const std::vector<float> x = test::mx_hard_rows(N, C, rng);
    const MxRows m = mx_rows(q, C);
    const int64_t S = (C + 31) / 32;
    REQUIRE(m.row_bytes() == C + S);
    const QuantizedTensor want = quantize(q, MatrixView<const float>(x.data(), N, C));
    std::vector<float> fq = x;
    fake_quantize(q, MatrixView<float>(fq.data(), N, C));
    REQUIRE(test::ep_case::same_bits(fq, want.dequant));
    Tensor xt = be->empty(N, C), bytes = empty_bytes(*be, N * m.row_bytes()), back = be->empty(N, C);
    be->upload(x.data(), xt);
    for (const bool host_default : {false, true}) {
      CAPTURE(host_default);
      if (host_default)
        be->Backend::encode_rows_mx(q, xt, bytes);
      else
        be->encode_rows_mx(q, xt, bytes);
      const uint8_t* b = byte_data(bytes);
      int64_t code_diff = 0, scale_diff = 0, oracle_diff = 0;
      for (int64_t r = 0; r < N; ++r) {
        for (int64_t c = 0; c < C; ++c) code_diff += b[r * (C + S) + c] != want.codes[size_t(r * C + c)];
        for (int64_t j = 0; j < S; ++j) {
          const uint8_t sc = b[r * (C + S) + C + j];
          scale_diff += sc != want.scale_codes[size_t(r * S + j)];
          oracle_diff += sc != scale_by_search(x.data() + r * C + j * 32, std::min<int64_t>(32, C - j * 32));
        }
      }
      CHECK(code_diff == 0);
      CHECK(scale_diff == 0);
      CHECK(oracle_diff == 0);
      be->fill(back, 1.0f);
      if (host_default)
        be->Backend::decode_rows_mx(q, bytes, back);
      else
        be->decode_rows_mx(q, bytes, back);
      std::vector<float> got(size_t(N * C));
      be->download(back, got.data());
      CHECK(test::ep_case::same_bits(got, fq));
    }
    // The hard rows hold what they claim: NaN blocks, and scales near the top of E8M0 (FP32 values near its max).
    int64_t nan_blocks = 0, top_scales = 0;
    for (const uint8_t sc : want.scale_codes) nan_blocks += sc == 0xFF, top_scales += sc >= 127 + 118;
    CHECK(nan_blocks > 0);
    CHECK(top_scales > 0);
  }
}

TEST_CASE("moe dispatch transport: zero rows, unsupported quantizers and short buffers") {
  const QuantizerSpec q = mxfp8_fwd_x();
  auto be = make_cpu_backend(1);
  Tensor none = be->empty(0, 70), nb = empty_bytes(*be, 0);
  be->encode_rows_mx(q, none, nb);
  be->decode_rows_mx(q, nb, none);
  CHECK(mx_rows_supported(q));
  CHECK_FALSE(mx_rows_supported(quantizer_by_name("nvfp4")));
  CHECK_FALSE(mx_rows_supported(quantizer_by_name("fp8_e4m3_tensor")));
  QuantizerSpec sr = q;
  sr.round = Round::rs;
  CHECK_FALSE(mx_rows_supported(sr));
  CHECK_THROWS_AS(mx_rows(quantizer_by_name("nvfp4"), 32), Error);
  Tensor x = be->zeros(3, 70), small = empty_bytes(*be, 3 * 73 - 4);
  CHECK_THROWS(be->encode_rows_mx(q, x, small));
}

TEST_CASE("moe dispatch transport through thread ranks: CountingComm's bytes are rows * (C + ceil(C / 32))") {
  const QuantizerSpec q = mxfp8_fwd_x();
  for (const int R : {2, 4})
    for (const int64_t C : {32, 70}) {
      CAPTURE(R);
      CAPTURE(C);
      const int64_t rb = C + (C + 31) / 32;
      // counts[s][d]: rows rank s sends to rank d; zeros included, and nothing at all to rank R - 1.
      std::vector<std::vector<int64_t>> counts(static_cast<size_t>(R), std::vector<int64_t>(static_cast<size_t>(R)));
      for (int s = 0; s < R; ++s)
        for (int d = 0; d < R; ++d) counts[size_t(s)][size_t(d)] = d == R - 1 ? 0 : (3 * s + 5 * d + 1) % 7 * 5;
      auto comms = make_thread_comms(R);
      std::vector<int64_t> sent(static_cast<size_t>(R)), received(static_cast<size_t>(R));
      std::vector<int> ok(size_t(R), 0);
      std::vector<std::thread> th;
      for (int r = 0; r < R; ++r)
        th.emplace_back([&, r] {
          CountingComm counting(*comms[size_t(r)]);
          CommExpertExchange ex(counting);
          auto be = make_cpu_backend(1);
          std::vector<int64_t> send_rows(static_cast<size_t>(R)), recv_rows(static_cast<size_t>(R));
          int64_t ns = 0, nr = 0;
          for (int p = 0; p < R; ++p) {
            send_rows[size_t(p)] = counts[size_t(r)][size_t(p)], ns += send_rows[size_t(p)];
            recv_rows[size_t(p)] = counts[size_t(p)][size_t(r)], nr += recv_rows[size_t(p)];
          }
          std::mt19937 rng(uint32_t(100 + r));
          const std::vector<float> x = test::mx_hard_rows(ns, C, rng);
          Tensor xt = be->empty(ns, C), out = empty_bytes(*be, ns * rb), in = empty_bytes(*be, nr * rb);
          be->upload(x.data(), xt);
          be->encode_rows_mx(q, xt, out);
          ex.exchange_bytes(*be, out, send_rows, in, recv_rows, rb);
          Tensor got = be->empty(nr, C);
          be->decode_rows_mx(q, in, got);
          // The reference: the fake-quantized rows as FP32 through exchange_rows.
          Tensor fq = be->empty(ns, C), want = be->empty(nr, C);
          be->upload(x.data(), fq);
          be->fake_quantize(fq, q);
          ex.exchange_rows(*be, fq, send_rows, want, recv_rows);
          std::vector<float> g(size_t(nr * C)), w(size_t(nr * C));
          be->download(got, g.data());
          be->download(want, w.data());
          ok[size_t(r)] = test::ep_case::same_bits(g, w);
          const CollectiveCounts& a = counting.counts().at(-1).at("alltoallv");
          // Two calls: the compact rows, then the FP32 rows of the reference.
          ok[size_t(r)] &= a.calls == 2 && a.bytes_in == ns * rb + ns * C * 4 && a.bytes_out == nr * rb + nr * C * 4;
          sent[size_t(r)] = ns, received[size_t(r)] = nr;
        });
      for (auto& t : th) t.join();
      for (int r = 0; r < R; ++r) {
        CAPTURE(r);
        CHECK(ok[size_t(r)] == 1);
      }
      CHECK(received[size_t(R - 1)] == 0);
      MESSAGE("R = ", R, ", C = ", C, ": rank 0 sends ", sent[0], " rows as ", sent[0] * rb,
              " bytes (FP32: ", sent[0] * C * 4, ")");
    }
}

namespace {

// The EP layer of expert_parallel_case.hpp on R thread ranks, each through a CountingComm: every rank's
// LayerOut and its alltoallv counts.
struct EpLayer {
  std::vector<test::ep_case::LayerOut> out;
  std::vector<CollectiveCounts> a2a;
};
EpLayer ep_layer(const MoeConfig& c, const char* recipe_name, int R, int64_t C, bool compact,
                 const std::vector<float>& x, const std::vector<float>& dy) {
  const Recipe recipe = recipe_by_name(recipe_name);
  const int64_t n = test::ep_case::kTokens;
  auto comms = make_thread_comms(R);
  EpLayer e;
  e.out.resize(size_t(R));
  e.a2a.resize(size_t(R));
  std::vector<std::thread> th;
  for (int r = 0; r < R; ++r)
    th.emplace_back([&, r] {
      CountingComm counting(*comms[size_t(r)]);
      const auto part = [&](const std::vector<float>& v) {
        return std::vector<float>(v.begin() + r * n * C, v.begin() + (r + 1) * n * C);
      };
      e.out[size_t(r)] = test::ep_case::run_layer([] { return make_cpu_backend(1); }, c, &recipe, R, r, &counting,
                                                  part(x), part(dy), n, {}, C, compact);
      e.a2a[size_t(r)] = counting.counts().at(-1).at("alltoallv");
    });
  for (auto& t : th) t.join();
  return e;
}

// FNV-1a over the bits of a run's step losses and final parameters (to compare runs across builds).
uint64_t fingerprint(const RunResult& r) {
  uint64_t h = 1469598103934665603ull;
  const auto add = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  add(r.step_losses.data(), r.step_losses.size() * sizeof(double));
  add(r.final_params.data(), r.final_params.size() * sizeof(float));
  return h;
}

}  // namespace

TEST_CASE("moe dispatch cast mxfp8 under EP: compact rows give the FP32 rows' bits, at about a quarter of the bytes") {
  std::mt19937 rng(4702);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const char* recipe : {"fp32", "mxfp8"})
    for (const int R : {2, 4})
      for (const int64_t C : {48, 70}) {
        CAPTURE(recipe);
        CAPTURE(R);
        CAPTURE(C);
        MoeConfig c;
        c.experts = 8, c.top_k = 2, c.aux_loss = 0.01, c.z_loss = 0.001, c.expert_hidden = 64;
        c.dispatch_cast = MoeConfig::DispatchCast::mxfp8;
        const int64_t n = test::ep_case::kTokens, Ng = n * R;
        std::vector<float> x(size_t(Ng * C)), dy(size_t(Ng * C));
        for (auto& v : x) v = nd(rng) * (nd(rng) > 1.5f ? 30.0f : 1.0f);
        for (auto& v : dy) v = nd(rng);
        const EpLayer on = ep_layer(c, recipe, R, C, true, x, dy), off = ep_layer(c, recipe, R, C, false, x, dy);
        const int64_t rb = C + (C + 31) / 32, S = n * c.top_k;  // dropless: every slot of the share is sent
        for (int r = 0; r < R; ++r) {
          CAPTURE(r);
          const auto& a = on.out[size_t(r)];
          const auto& b = off.out[size_t(r)];
          CHECK(test::ep_case::same_bits(a.y, b.y));
          CHECK(test::ep_case::same_bits(a.dx, b.dx));
          REQUIRE(a.grads.size() == b.grads.size());
          for (size_t i = 0; i < a.grads.size(); ++i)
            CHECK_MESSAGE(test::ep_case::same_bits(a.grads[i], b.grads[i]), i);
          // Rows this rank's experts receive: the global counts of its experts.
          int64_t Rr = 0;
          for (int64_t e = r * c.experts / R; e < (r + 1) * c.experts / R; ++e) Rr += a.routing.count[size_t(e)];
          // Forward: dispatch (compact) and combine (FP32); backward: d_combined (compact) and dgrouped (FP32).
          const CollectiveCounts& k = on.a2a[size_t(r)];
          const CollectiveCounts& f = off.a2a[size_t(r)];
          CHECK(k.calls == 4);
          CHECK(k.bytes_in == 2 * S * rb + 2 * Rr * C * 4);
          CHECK(k.bytes_out == 2 * Rr * rb + 2 * S * C * 4);
          CHECK(f.bytes_in == 2 * S * C * 4 + 2 * Rr * C * 4);
          if (r == 0 && std::string(recipe) == "fp32")
            MESSAGE("R = ", R, ", C = ", C, ", rank 0: dispatch bytes sent a layer step ", 2 * S * rb, " (FP32 ",
                    2 * S * C * 4, ", ratio ", double(2 * S * rb) / double(2 * S * C * 4), "); all alltoallv bytes ",
                    k.bytes_in, " vs ", f.bytes_in);
        }
      }
}

TEST_CASE("expert parallel runs with dispatch_cast mxfp8: R ranks follow one process; the dispatch bytes shrink") {
  const auto dir = test::scratch_dir("fp4lab_mxdt_");
  const std::string text = test::write_words_corpus(dir), out = (dir / "runs").string();
  auto config = [&](const std::string& name, int R, bool cast) {
    nlohmann::json j = test::tiny_moe_config(text, out, name, R);
    j["model"]["layers"] = 1;  // one layer: its first routing is the same with and without the cast
    j["training"]["steps"] = 6;
    if (cast) j["model"]["moe"]["dispatch_cast"] = "mxfp8";
    return j;
  };
  const RunResult one = test::run_on_threads(1, config("one", 1, true));
  for (const int R : {2, 4}) {
    CAPTURE(R);
    const RunResult a = test::run_on_threads(R, config("mx" + std::to_string(R), R, true));
    const RunResult plain = test::run_on_threads(R, config("fp" + std::to_string(R), R, false));
    REQUIRE(a.step_losses.size() == one.step_losses.size());
    double worst = 0;
    for (size_t i = 0; i < a.step_losses.size(); ++i)
      worst = std::max(worst, std::fabs(a.step_losses[i] - one.step_losses[i]) / std::fabs(one.step_losses[i]));
    MESSAGE("R = ", R, ": largest relative loss difference to one process, with the cast: ", worst,
            "; fingerprint of the losses and final parameters ", fingerprint(a));
    CHECK(worst < 1e-4);
    // Rank 0's first step (the evaluation at the start included): each forward of the one layer (one routing
    // exchange, allgather_bytes, each) dispatches S = N_r k rows, as does the training step's backward
    // (d_combined); those rows travel as rb = C + 1 bytes instead of 4 C. The combine rows stay FP32.
    const nlohmann::json& pa = a.summary["distributed"]["collectives"]["per_step"];
    const nlohmann::json& pp = plain.summary["distributed"]["collectives"]["per_step"];
    const int64_t C = 32, rb = C + 1, S = 8 * 16 / R * 2;
    const int64_t forwards = pa["allgather_bytes"]["calls"].get<int64_t>(), dispatches = forwards + 1;
    CHECK(pa["alltoallv"]["calls"].get<int64_t>() == 2 * dispatches);
    const int64_t in_a = pa["alltoallv"]["bytes_in"].get<int64_t>(), in_p = pp["alltoallv"]["bytes_in"].get<int64_t>();
    CHECK(in_p - in_a == dispatches * S * (C * 4 - rb));
    MESSAGE("R = ", R, ", rank 0's first step (", forwards, " forwards, 1 backward): alltoallv sends ", in_a,
            " bytes with the cast, ", in_p, " without; the dispatch rows ", dispatches * S * rb, " bytes instead of ",
            dispatches * S * C * 4);
  }
}

}  // namespace fp4lab::train
