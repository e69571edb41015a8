// Per-layer numerics statistics (train/numerics.hpp): the figures of a
// quantized operand against a brute-force construction from sim's quantize()
// output (decoded scales, core's decode of every scale code), against
// quant_stats (what `fp4lab quantize --stats` prints) where they overlap; the
// CPU linear layer's measurement equals the operand made by the plan; a short
// run writes the expected numerics.jsonl lines; resume neither duplicates nor
// loses a line.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/format.hpp"
#include "recipes/recipe.hpp"
#include "sim/block_scales.hpp"
#include "sim/rht.hpp"
#include "train/config.hpp"
#include "train/cpu/linear.hpp"
#include "train/numerics.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Values over many binades, exact zeros, a block of zeros, a block of tiny
// values (scale at the floor), a block of huge ones (ceiling of ue4m3 without
// a global scale).
std::vector<float> test_tensor(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-20, 6);
  std::vector<float> x(size_t(rows * cols));
  for (auto& v : x) v = n(g) * std::ldexp(1.0f, e(g));
  for (size_t i = 0; i < x.size(); i += 7) x[i] = 0.0f;
  for (int64_t c = 0; c < 32 && c < cols; ++c) x[size_t(c)] = 0.0f;                      // row 0: zero blocks
  for (int64_t c = 0; c < 32 && c < cols; ++c) x[size_t(cols + c)] = 1e-44f * float(c % 3);  // row 1: tiny
  for (int64_t c = 0; c < 32 && c < cols; ++c) x[size_t(2 * cols + c)] = 3e4f + float(c);  // row 2: huge
  return x;
}

struct Brute {
  int64_t nonzero = 0, flushed = 0, saturated = 0, inexact = 0, zero_blocks = 0, floor_blocks = 0, ceil_blocks = 0;
  float amax = 0;
};

// Counted from the quantize() output by another route: decoded block scales
// against the scale format's extreme values found by decoding every code;
// saturation as |dequant| equal to the block's largest representable value.
Brute brute(const QuantizerSpec& q, const QuantizedTensor& qt, const std::vector<float>& t) {
  Brute b;
  float minpos = INFINITY, maxfin = 0, emax = 0;
  for (uint32_t c = 0; c < (1u << q.scale->bits()) && c < 256; ++c) {
    const float v = decode(*q.scale, c);
    if (std::isfinite(v) && v > 0) minpos = std::min(minpos, v), maxfin = std::max(maxfin, v);
  }
  if (q.emulate == Emulation::fp4tk && q.scale == &float8_e8m0fnu) minpos = 0x1p-23f;
  for (uint32_t c = 0; c < (1u << q.element->bits()) && c < 256; ++c) {
    const float v = decode(*q.element, c);
    if (std::isfinite(v)) emax = std::max(emax, std::fabs(v));
  }
  const BlockGrid g = block_grid(q, qt.rows, qt.cols);
  for (int64_t r = 0; r < qt.rows; ++r)
    for (int64_t c = 0; c < qt.cols; ++c) {
      const size_t i = size_t(r * qt.cols + c);
      const float v = t[i], d = qt.dequant[i];
      const float s = qt.scales[size_t((r / g.br) * g.nbc + c / g.bc)];
      if (v != 0 && !std::isnan(v)) ++b.nonzero, b.flushed += d == 0 ? 1 : 0;
      if (!std::isnan(v) && d != v) ++b.inexact;
      const float top = (emax * s) * qt.global_decode;
      if (top != 0 && std::fabs(d) == top && std::fabs(v) > std::fabs(d)) ++b.saturated;  // a zero scale clamps nothing
      if (!std::isnan(v)) b.amax = std::max(b.amax, std::fabs(v));
    }
  for (int64_t bi = 0; bi < g.nbr; ++bi)
    for (int64_t bj = 0; bj < g.nbc; ++bj) {
      float a = 0;
      for (int64_t r = bi * g.br; r < std::min(qt.rows, (bi + 1) * g.br); ++r)
        for (int64_t c = bj * g.bc; c < std::min(qt.cols, (bj + 1) * g.bc); ++c)
          a = std::max(a, std::fabs(t[size_t(r * qt.cols + c)]));
      if (a == 0) {
        ++b.zero_blocks;
        continue;
      }
      if (qt.scale_codes.empty()) continue;
      const float s = decode(*q.scale, qt.scale_codes[size_t(bi * g.nbc + bj)]);
      b.floor_blocks += s <= minpos ? 1 : 0;
      b.ceil_blocks += s == maxfin ? 1 : 0;
    }
  return b;
}

}  // namespace

TEST_CASE("numerics_of equals a brute-force count over sim's quantize() output, and quant_stats where they overlap") {
  const int64_t rows = 48, cols = 96;
  const std::vector<float> x = test_tensor(rows, cols, 7);
  const MatrixView<const float> xv(x.data(), rows, cols);
  QuantizerSpec nv_rs = quantizer_by_name("nvfp4");
  nv_rs.round = Round::rs;
  QuantizerSpec rht_col = quantizer_by_name("nvfp4_col");
  rht_col.rht = true, rht_col.rht_seed = 5;
  QuantizerSpec fp4tk_rs = quantizer_by_name("fp4tk_nvfp4");
  fp4tk_rs.round = Round::rs;
  const std::vector<std::pair<std::string, QuantizerSpec>> specs = {
      {"mxfp4", quantizer_by_name("mxfp4")},         {"nvfp4", quantizer_by_name("nvfp4")},
      {"nvfp4 rs", nv_rs},                           {"nvfp4_2d", quantizer_by_name("nvfp4_2d")},
      {"nvfp4_col rht", rht_col},                    {"fp4tk_nvfp4", quantizer_by_name("fp4tk_nvfp4")},
      {"fp4tk_nvfp4 rs", fp4tk_rs},                  {"fp4tk_mxfp4", quantizer_by_name("fp4tk_mxfp4")},
      {"mxfp8_e4m3", quantizer_by_name("mxfp8_e4m3")}, {"fp8_e4m3_tensor", quantizer_by_name("fp8_e4m3_tensor")},
      {"mxint8", quantizer_by_name("mxint8")}};
  for (const auto& [name, q] : specs) {
    CAPTURE(name);
    const QuantizedTensor qt = quantize(q, xv, RandomStream{11, 3});
    const std::vector<float> t = quantizer_domain(q, xv);
    const NumericsCounts n = numerics_of(qt, xv);
    const Brute b = brute(q, qt, t);
    CHECK(n.quantized);
    CHECK(n.elements == rows * cols);
    CHECK(n.nonzero == b.nonzero);
    CHECK(n.flushed == b.flushed);
    CHECK(n.inexact == b.inexact);
    CHECK(n.zero_blocks == b.zero_blocks);
    CHECK(n.amax() == double(b.amax));
    CHECK(n.sr == (q.round == Round::rs));
    CHECK(n.scale_codes == !qt.scale_codes.empty());
    if (n.scale_codes) {
      CHECK(n.floor_blocks == b.floor_blocks);
      CHECK(n.ceil_blocks == b.ceil_blocks);
    }
    if (!q.element->is_int) CHECK(n.saturated == b.saturated);
    // quant_stats (fp4lab quantize --stats): the same fractions; SQNR to rounding of the sums.
    const QuantStats s = quant_stats(qt, xv);
    CHECK(double(n.flushed) / double(n.nonzero) == doctest::Approx(s.flushed_to_zero).epsilon(1e-15));
    CHECK(double(n.saturated) / double(n.elements) == s.saturated);  // one definition (sim/element_stats.hpp)
    CHECK(n.sqnr_db() == doctest::Approx(s.sqnr_db).epsilon(1e-9));
  }
  // The constructed cases are there: a floor under mxfp4 (the tiny row), a ceiling under fp4tk_nvfp4.
  CHECK(numerics_of(quantize(quantizer_by_name("mxfp4"), xv), xv).floor_blocks > 0);
  CHECK(numerics_of(quantize(quantizer_by_name("fp4tk_nvfp4"), xv), xv).ceil_blocks > 0);
  CHECK(numerics_of(quantize(quantizer_by_name("nvfp4"), xv), xv).flushed > 0);
}

namespace {
// numerics.hpp's tree written as a recursion (a different route from numerics_tree_sum's level loops).
double tree(const std::vector<double>& s, size_t lo, size_t hi) {
  return hi - lo == 1 ? s[lo] : tree(s, lo, (lo + hi) / 2) + tree(s, (lo + hi) / 2, hi);
}
}  // namespace

TEST_CASE("numerics_of's float64 sums follow numerics.hpp's lane order exactly, from a strided view") {
  // 700 x 190 = 133000 elements: more than kNumericsLanes, so lanes hold one or two elements and runs cross rows.
  const int64_t rows = 700, cols = 190, stride = 197;
  REQUIRE(rows * cols > kNumericsLanes);
  const std::vector<float> dense = test_tensor(rows, cols, 13);
  std::vector<float> padded(size_t(rows * stride), NAN);  // the gaps are never read
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) padded[size_t(r * stride + c)] = dense[size_t(r * cols + c)];
  const MatrixView<const float> xv(padded.data(), rows, cols, stride);
  for (const char* name : {"nvfp4", "mxfp8_e4m3"}) {
    CAPTURE(name);
    QuantizerSpec q = quantizer_by_name(name);
    q.round = Round::rs;
    const QuantizedTensor qt = quantize(q, MatrixView<const float>(dense.data(), rows, cols), RandomStream{3, 1});
    const NumericsCounts n = numerics_of(q, xv, qt.dequant.data(), qt.codes.data(), qt.scale_codes.data());
    std::vector<double> x2(static_cast<size_t>(kNumericsLanes)), e2(x2.size()), es(x2.size());
    long double lx2 = 0, le2 = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const double v = dense[size_t(i)], d = qt.dequant[size_t(i)];
      const size_t l = size_t(i % kNumericsLanes);
      x2[l] += v * v, e2[l] += (v - d) * (v - d), es[l] += d - v;
      lx2 += (long double)v * v, le2 += (long double)(v - d) * (v - d);
    }
    CHECK(n.sum_x2 == tree(x2, 0, x2.size()));
    CHECK(n.sum_err2 == tree(e2, 0, e2.size()));
    CHECK(n.sum_err == tree(es, 0, es.size()));
    CHECK(n.sum_x2 == doctest::Approx(double(lx2)).epsilon(1e-13));
    CHECK(n.sum_err2 == doctest::Approx(double(le2)).epsilon(1e-13));
    CHECK(n.finite == rows * cols);
  }
}

TEST_CASE("operand_numerics: the plan's pre and wgrad RHT come first; an operand without a quantizer gives amax only") {
  const int64_t rows = 32, cols = 48;
  const std::vector<float> x = test_tensor(rows, cols, 9);
  const MatrixView<const float> xv(x.data(), rows, cols);
  const Recipe r = recipe_by_name("tetrajet");  // double quantization: dgrad_w's pre
  LinearContext ctx{&r, 5, 2, 7};
  const LinearPlan plan = linear_plan(ctx);
  for (Operand op : {Operand::dgrad_w, Operand::wgrad_x, Operand::fwd_x}) {
    const OperandPlan& p = plan.operand(op);
    REQUIRE(p.quantizer != nullptr);
    std::vector<float> m = x;
    MatrixView<float> mv(m.data(), rows, cols);
    if (p.pre) fake_quantize(*p.pre, mv, p.pre_stream);
    if (p.rht) rht_forward(mv, RhtAxis::cols, p.rht_seed);
    const MatrixView<const float> tv(m.data(), rows, cols);
    CHECK(operand_numerics(p, xv) == numerics_of(quantize(*p.quantizer, tv, p.stream), tv));
  }
  Recipe nv = recipe_by_name("nvfp4");
  REQUIRE(nv.wgrad_rht);
  const LinearPlan pn = linear_plan(LinearContext{&nv, 5, 2, 7});
  const NumericsCounts a = operand_numerics(pn.operand(Operand::wgrad_x), xv);
  std::vector<float> m = x;
  rht_forward(MatrixView<float>(m.data(), rows, cols), RhtAxis::cols, pn.operand(Operand::wgrad_x).rht_seed);
  const MatrixView<const float> mv(m.data(), rows, cols);
  CHECK(a == numerics_of(quantize(*pn.operand(Operand::wgrad_x).quantizer, mv, pn.operand(Operand::wgrad_x).stream), mv));
  const LinearPlan fp = linear_plan(LinearContext{nullptr, 5, 2, 7});
  const NumericsCounts h = operand_numerics(fp.operand(Operand::fwd_x), xv);
  CHECK(!h.quantized);
  CHECK(h.amax() == double(numerics_of(quantize(quantizer_by_name("mxfp4"), xv), xv).amax()));
  const json j = json::parse(numerics_line(3, 0, "l", Operand::fwd_x, nullptr, h));
  CHECK(j["quantizer"].is_null());
  CHECK(!j.contains("flushed"));
  CHECK(j.contains("amax"));
}

TEST_CASE("the CPU linear layer measures its six operands only under a recorder, as operand_numerics does") {
  const int64_t B = 32, in = 48, out = 16;
  const std::vector<float> xs = test_tensor(B, in, 1), ws = test_tensor(out, in, 2), dys = test_tensor(B, out, 3);
  const Recipe r = recipe_by_name("nvfp4");
  const LinearContext ctx{&r, 5, 4, 9, "blocks.0.fc"};
  auto mat = [](const std::vector<float>& v, int64_t rr, int64_t cc) {
    return MatrixRM(Eigen::Map<const MatrixRM>(v.data(), rr, cc));
  };
  MatrixRM y, dx, dw;
  LinearSaved saved;
  {
    NumericsRecorder rec(10);
    {
      const NumericsScope scope(&rec);
      linear_forward(ctx, mat(xs, B, in), mat(ws, out, in), nullptr, y, saved);
      linear_backward(ctx, saved, mat(ws, out, in), mat(dys, B, out), dx, dw, nullptr);
    }
    const std::vector<std::string> lines = rec.lines();
    REQUIRE(lines.size() == 6);
    const LinearPlan plan = linear_plan(ctx);
    for (int k = 0; k < kOperandCount; ++k) {
      const Operand op = Operand(k);
      const json j = json::parse(lines[size_t(k)]);
      CHECK(j["operand"] == operand_name(op));
      CHECK(j["layer"] == "blocks.0.fc");
      CHECK(j["step"] == 10);
      const bool is_x = op == Operand::fwd_x || op == Operand::wgrad_x;
      const bool is_w = op == Operand::fwd_w || op == Operand::dgrad_w;
      const std::vector<float>& src = is_x ? xs : is_w ? ws : dys;
      const NumericsCounts n = operand_numerics(plan.operand(op), MatrixView<const float>(src.data(), is_x ? B : is_w ? out : B, is_w || is_x ? in : out));
      CHECK(lines[size_t(k)] == numerics_line(10, 4, "blocks.0.fc", op, plan.operand(op).quantizer, n));
    }
  }
  CHECK(numerics_recorder() == nullptr);
}

namespace {

// test::tiny_gpt_config measured every `every` steps.
json tiny(const std::string& text, const std::string& out, const std::string& recipe, int64_t steps, int64_t every) {
  json j = test::tiny_gpt_config(text, out, recipe);
  j["training"]["steps"] = steps;
  j["training"]["eval_interval"] = 10;
  j["output"]["numerics_interval"] = every;
  return j;
}

std::vector<std::string> file_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> v;
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

}  // namespace

TEST_CASE("a short run with output.numerics_interval writes one line per (step, layer, operand); resume keeps them") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_numerics_run";
  fs::remove_all(tmp);
  const std::string text = test::write_words_corpus(tmp);
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  o.progress = false;
  const json a = tiny(text, (tmp / "a").string(), "fp4_all_the_way", 30, 4);
  const RunResult full = run_training(config_from_json(a), o);
  const std::vector<std::string> la = file_lines(fs::path(full.dir) / "numerics.jsonl");
  std::map<int64_t, std::vector<json>> by_step;
  for (const std::string& l : la) {
    const json j = json::parse(l);
    by_step[j["step"].get<int64_t>()].push_back(j);
  }
  REQUIRE(by_step.size() == 7);  // steps 4, 8, ..., 28
  CHECK(by_step.begin()->first == 4);
  CHECK(by_step.rbegin()->first == 28);
  const size_t per_step = by_step.begin()->second.size();
  CHECK(per_step % 6 == 0);
  CHECK(per_step >= 6 * 4);  // at least the block's attention and MLP layers
  for (const auto& [s, v] : by_step) {
    REQUIRE(v.size() == per_step);
    for (size_t i = 0; i < v.size(); ++i) {
      CHECK(v[i]["operand"] == operand_name(Operand(i % 6)));  // ordered by layer, then operand
      if (!v[i]["quantizer"].is_null()) {
        CHECK(v[i]["flushed"].is_number());
        CHECK(v[i]["scale_floor"].is_number());
        const bool sr = v[i]["operand"] != "fwd_x" && v[i]["operand"] != "fwd_w" && v[i]["operand"] != "dgrad_w";
        CHECK(v[i]["mean_error"].is_number() == sr);  // fp4_all_the_way: SR on the backward's dy and x
      }
    }
  }
  // Interrupted after the checkpoint of step 20 (lines of step 24 written, then dropped on resume).
  json b = a;
  b["output"]["dir"] = (tmp / "b").string();
  RunOptions stop = o;
  stop.stop_after = 26;
  const RunResult part = run_training(config_from_json(b), stop);
  CHECK(part.status == "stopped");
  RunOptions res = o;
  res.resume = true;
  const RunResult rest = run_training(config_from_json(b), res);
  CHECK(rest.first_step == 20);
  CHECK(file_lines(fs::path(rest.dir) / "numerics.jsonl") == la);  // no line lost, none twice, same bits
  fs::remove_all(tmp);
}

// Issue 47 item 3: the statistics of a fine-grained MoE (DeepSeek style: many small routed experts, top k,
// one shared expert): numerics lines for every expert that received tokens at a measured step, the shared
// expert and the router (FP32: amax only), and per-layer expert loads in metrics.jsonl that sum to 1.
TEST_CASE("a fine-grained MoE run measures every expert with tokens, the shared expert and the router") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_numerics_moe";
  fs::remove_all(tmp);
  const std::string text = test::write_words_corpus(tmp);
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  o.progress = false;
  json j = tiny(text, (tmp / "run").string(), "nvfp4", 8, 4);
  j["model"]["moe"] = {{"experts", 16}, {"top_k", 4}, {"shared_expert", true}, {"expert_hidden", 16}};
  j["training"]["log_interval"] = 1;
  const RunResult r = run_training(config_from_json(j), o);
  REQUIRE(r.status == "completed");
  std::map<int64_t, std::set<std::string>> layers;  // step -> measured layers
  for (const std::string& l : file_lines(fs::path(r.dir) / "numerics.jsonl")) {
    const json n = json::parse(l);
    layers[n["step"].get<int64_t>()].insert(n["layer"].get<std::string>());
    if (n["layer"].get<std::string>().find("router") != std::string::npos) {
      CHECK(n["quantizer"].is_null());  // the router stays FP32 (moe.quantize_router false)
    }
  }
  REQUIRE(layers.size() == 2);  // steps 4 and 8
  // The expert loads of the metrics line of each step (one layer, 16 experts).
  std::map<int64_t, std::vector<double>> load;
  for (const std::string& l : file_lines(fs::path(r.dir) / "metrics.jsonl")) {
    const json m = json::parse(l);
    if (m.contains("expert_load")) load[m["step"].get<int64_t>()] = m["expert_load"][0].get<std::vector<double>>();
  }
  for (const auto& [step, names] : layers) {
    CAPTURE(step);
    CHECK(names.count("h.0.mlp.router") == 1);
    CHECK(names.count("h.0.mlp.shared_expert.c_fc") == 1);
    CHECK(names.count("h.0.mlp.shared_expert.c_proj") == 1);
    REQUIRE(load.count(step) == 1);
    const std::vector<double>& f = load[step];
    REQUIRE(f.size() == 16);
    double sum = 0;
    for (size_t e = 0; e < f.size(); ++e) {
      sum += f[e];
      const std::string p = "h.0.mlp.experts." + std::to_string(e) + ".";
      // An expert is measured exactly when it received tokens (f_e > 0).
      CHECK(names.count(p + "c_fc") == size_t(f[e] > 0));
      CHECK(names.count(p + "c_proj") == size_t(f[e] > 0));
    }
    CHECK(sum == doctest::Approx(1.0).epsilon(1e-12));
  }
  fs::remove_all(tmp);
}
