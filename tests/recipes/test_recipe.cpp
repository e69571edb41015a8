// Recipes (recipes/recipe.hpp, registry.cpp): the canned recipes against their
// sources (fp4-trainkit's table, the NVFP4 and MXFP8 papers), JSON round trips,
// extends/overrides, error messages, layer patterns and the precision switch.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "fuzz.hpp"
#include "recipes/linear_plan.hpp"
#include "recipes/recipe.hpp"

using namespace fp4lab;

namespace {

// The error message of f(), or "" if it does not throw.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

const Operand kOps[kOperandCount] = {Operand::fwd_x,   Operand::fwd_w,        Operand::dgrad_grad_y,
                                     Operand::dgrad_w, Operand::wgrad_grad_y, Operand::wgrad_x};

}  // namespace

TEST_CASE("recipe registry lists the canned recipes") {
  const std::vector<std::string> expected = {"fp4tk_mx_baseline",
                                             "fp4tk_nvidia_round_to_infinity",
                                             "fp4tk_tetrajet",
                                             "fp4tk_fp4_all_the_way",
                                             "fp32",
                                             "bf16",
                                             "mxfp8",
                                             "mx_baseline",
                                             "nvidia_round_to_infinity",
                                             "tetrajet",
                                             "fp4_all_the_way",
                                             "nvfp4_fwd_mxfp8_bwd",
                                             "nvfp4",
                                             "nvfp4_4over6",
                                             "nvfp4_row_scaled",
                                             "fp8_blockwise",
                                             "te_fp8_blockwise",
                                             "quartet2"};
  const auto names = recipe_names();
  for (const auto& n : expected) {
    CAPTURE(n);
    CHECK(std::find(names.begin(), names.end(), n) != names.end());
    const Recipe r = recipe_by_name(n);
    CHECK(r.name == n);
    CHECK_FALSE(r.source.empty());
  }
  CHECK(names.size() == expected.size());
  const std::string e = error_of([] { recipe_by_name("nvfp5"); });
  CHECK(contains(e, "nvfp5"));
  CHECK(contains(e, "mx_baseline"));
}

TEST_CASE("fp4-trainkit's table is reproduced exactly") {
  // README.md of github.com/vuiseng9/fp4-trainkit, "Supported Recipes and Very
  // Early Results": rounding per operand (Q0..Q5 = X, W^T, grad_Y, W, grad_Y^T, X),
  // format, block size, scale format, scale implementation, double quantization.
  struct Row {
    const char* name;
    const char* rounding;  // Q0..Q5, 'N' = RTN, 'S' = SR
    const Format* element;
    int block;
    const Format* scale;
    ScaleRule rule;
    bool double_q;
  };
  const Row table[] = {
      {"mx_baseline", "NNNNNN", &float4_e2m1fn, 32, &float8_e8m0fnu, ScaleRule::ocp, false},
      {"nvidia_round_to_infinity", "NNNNNN", &float4_e2m1fn, 32, &float8_e8m0fnu, ScaleRule::ceil, false},
      {"tetrajet", "NNSSSS", &float4_e2m1fn, 32, &float8_e8m0fnu, ScaleRule::tetrajet, true},
      {"fp4_all_the_way", "NNSNSS", &float4_e2m1fn, 16, &ufloat8_e4m3, ScaleRule::nv_noglobal, false},
  };
  for (const Row& row : table) {
    const Recipe r = recipe_by_name(row.name);
    CAPTURE(row.name);
    CHECK(r.double_quantization == row.double_q);
    CHECK_FALSE(r.wgrad_rht);
    for (int i = 0; i < kOperandCount; ++i) {
      CAPTURE(i);
      REQUIRE(r.operands[size_t(i)].has_value());
      const QuantizerSpec& q = *r.operands[size_t(i)];
      CHECK(q.round == (row.rounding[i] == 'S' ? Round::rs : Round::rn));
      CHECK(q.element == row.element);
      CHECK(q.scale == row.scale);
      CHECK(q.scale_rule == row.rule);
      CHECK(q.global_scale == GlobalScale::none);
      CHECK_FALSE(q.rht);
      // Blocks along the reduction axis: rows for Q0..Q2, columns for Q3..Q5.
      CHECK(q.block_rows == (i < 3 ? 1 : row.block));
      CHECK(q.block_cols == (i < 3 ? row.block : 1));
    }
  }
}

// configs/recipes/fp4_all_the_way_two_level.json: the canned fp4_all_the_way
// (fp4-trainkit's single-level eq. 3, the ViT anchor) with the per-tensor FP32
// scale of the paper's reference code on every operand, everything else
// (blocks, rounding, scale format) unchanged.
TEST_CASE("configs/recipes/fp4_all_the_way_two_level.json") {
  // The source root from the build (not __FILE__, which a compiler cache or -fmacro-prefix-map makes relative).
  const Recipe r = parse_recipe(std::string(FP4LAB_SOURCE_DIR) + "/configs/recipes/fp4_all_the_way_two_level.json");
  const Recipe base = recipe_by_name("fp4_all_the_way");
  CHECK(r.name == "fp4_all_the_way_two_level");
  CHECK(r.double_quantization == base.double_quantization);
  CHECK(r.wgrad_rht == base.wgrad_rht);
  for (int i = 0; i < kOperandCount; ++i) {
    CAPTURE(i);
    REQUIRE(r.operands[size_t(i)].has_value());
    const QuantizerSpec& q = *r.operands[size_t(i)];
    const QuantizerSpec& b = *base.operands[size_t(i)];
    CHECK(q.scale_rule == ScaleRule::nv);
    CHECK(q.global_scale == GlobalScale::tensor_amax);
    CHECK(q.round == b.round);
    CHECK(q.element == b.element);
    CHECK(q.scale == b.scale);
    CHECK(q.block_rows == b.block_rows);
    CHECK(q.block_cols == b.block_cols);
  }
}

TEST_CASE("nvfp4 recipe follows arXiv 2509.25149") {
  const Recipe r = recipe_by_name("nvfp4");
  const int blocks[kOperandCount][2] = {{1, 16}, {16, 16}, {1, 16}, {16, 16}, {16, 1}, {16, 1}};
  const Round rounds[kOperandCount] = {Round::rn, Round::rn, Round::rs, Round::rn, Round::rs, Round::rn};
  for (int i = 0; i < kOperandCount; ++i) {
    CAPTURE(i);
    REQUIRE(r.operands[size_t(i)].has_value());
    const QuantizerSpec& q = *r.operands[size_t(i)];
    CHECK(q.element == &float4_e2m1fn);
    CHECK(q.scale == &ufloat8_e4m3);
    CHECK(q.scale_rule == ScaleRule::nv);
    CHECK(q.global_scale == GlobalScale::tensor_amax);
    CHECK(q.block_rows == blocks[i][0]);
    CHECK(q.block_cols == blocks[i][1]);
    CHECK(q.round == rounds[i]);
  }
  CHECK(r.wgrad_rht);
  CHECK_FALSE(r.double_quantization);
  CHECK(r.high_precision == HighPrecision::bf16);
  CHECK(r.keeps_high_precision("head"));
  CHECK(r.keeps_high_precision("lm_head"));
  CHECK_FALSE(r.keeps_high_precision("blocks.0.attn.qkv"));
}

TEST_CASE("mxfp8, nvfp4_fwd_mxfp8_bwd, fp32 and bf16 recipes") {
  const Recipe m = recipe_by_name("mxfp8");
  for (int i = 0; i < kOperandCount; ++i) {
    const QuantizerSpec& q = *m.operands[size_t(i)];
    CHECK(q.element == &float8_e4m3fn);
    CHECK(q.scale == &float8_e8m0fnu);
    CHECK(q.scale_rule == ScaleRule::ceil);
    CHECK(q.round == Round::rn);
    CHECK(q.block_rows * q.block_cols == 32);
    CHECK(q.block_rows == (i < 3 ? 1 : 32));
  }
  const Recipe h = recipe_by_name("nvfp4_fwd_mxfp8_bwd");
  CHECK(h.operand(Operand::fwd_x)->scale_rule == ScaleRule::nv);
  CHECK(h.operand(Operand::fwd_w)->block_cols == 16);
  CHECK(h.operand(Operand::fwd_w)->block_rows == 1);
  for (Operand op : {Operand::dgrad_grad_y, Operand::dgrad_w, Operand::wgrad_grad_y, Operand::wgrad_x}) {
    CHECK(h.operand(op)->element == &float8_e4m3fn);
    CHECK(h.operand(op)->scale_rule == ScaleRule::ceil);
  }
  const Recipe f = recipe_by_name("fp32"), b = recipe_by_name("bf16");
  for (int i = 0; i < kOperandCount; ++i) {
    CHECK_FALSE(f.operands[size_t(i)].has_value());
    CHECK_FALSE(b.operands[size_t(i)].has_value());
  }
  CHECK(f.high_precision == HighPrecision::fp32);
  CHECK(b.high_precision == HighPrecision::bf16);
}

TEST_CASE("JSON round trip of every canned recipe") {
  for (const auto& n : recipe_names()) {
    CAPTURE(n);
    const Recipe r = recipe_by_name(n);
    const nlohmann::json j = recipe_to_json(r);
    const Recipe back = recipe_from_json(j);
    CHECK(back == r);
    CHECK(recipe_to_json(back) == j);
    // Through text as well (what `recipes export` writes).
    CHECK(parse_recipe(j.dump(2)) == r);
    // Every key is written (nothing left to defaults).
    for (const char* k : {"name", "source", "fwd_x", "fwd_w", "dgrad_grad_y", "dgrad_w", "wgrad_grad_y", "wgrad_x",
                          "double_quantization", "wgrad_rht", "rht_seed", "high_precision", "keep_high_precision",
                          "switch_to", "switch_fraction"})
      CHECK(j.contains(k));
  }
  // A recipe with every optional field set.
  Recipe r = recipe_by_name("tetrajet");
  r.name.assign("all_fields");
  r.keep_high_precision = {"embed*", "*head"};
  r.switch_to = "bf16";
  r.switch_fraction = 0.1;
  r.high_precision = HighPrecision::bf16;
  r.rht_seed = 77;
  CHECK(recipe_from_json(recipe_to_json(r)) == r);
}

TEST_CASE("extends and overrides") {
  const Recipe base = recipe_by_name("nvfp4");
  const Recipe r = parse_recipe(R"({"extends": "nvfp4", "name": "nvfp4_rn", "dgrad_grad_y": {"round": "rn"},
                                     "wgrad_grad_y": {"round": "rn"}, "keep_high_precision": []})");
  CHECK(r.name == "nvfp4_rn");
  CHECK(r.operand(Operand::dgrad_grad_y)->round == Round::rn);
  CHECK(r.operand(Operand::wgrad_grad_y)->round == Round::rn);
  // Only the named key changed.
  QuantizerSpec expect = *base.operand(Operand::dgrad_grad_y);
  expect.round = Round::rn;
  CHECK(*r.operand(Operand::dgrad_grad_y) == expect);
  CHECK(r.operand(Operand::fwd_w) == base.operand(Operand::fwd_w));
  CHECK(r.wgrad_rht);
  CHECK(r.keep_high_precision.empty());
  // null = high precision; a canned quantizer name replaces.
  const Recipe r2 = parse_recipe(R"({"extends": "mx_baseline", "fwd_x": null, "fwd_w": "mxfp4"})");
  CHECK_FALSE(r2.operand(Operand::fwd_x).has_value());
  CHECK(r2.operand(Operand::fwd_w)->block_cols == 32);
  CHECK(r2.name == "mx_baseline_custom");
  // Without extends every operand defaults to high precision.
  const Recipe r3 = parse_recipe(R"({"name": "only_fwd_x", "fwd_x": "nvfp4"})");
  CHECK(r3.operand(Operand::fwd_x).has_value());
  for (int i = 1; i < kOperandCount; ++i) CHECK_FALSE(r3.operands[size_t(i)].has_value());
}

TEST_CASE("recipe sr_bits: the contract of every stochastically rounded operand") {
  for (const char* base : {"nvfp4", "tetrajet", "fp4_all_the_way"}) {
    CAPTURE(base);
    const Recipe b = recipe_by_name(base);
    const Recipe r = parse_recipe(std::string(R"({"extends": ")") + base + R"(", "sr_bits": "ptx_x4"})");
    int sr = 0;
    for (int i = 0; i < kOperandCount; ++i) {
      const auto& q = r.operands[size_t(i)];
      if (!q) continue;
      const bool rs = q->round == Round::rs;
      sr += rs;
      CHECK(q->sr_bits == (rs ? SrBits::ptx_x4 : SrBits::per_element));
      QuantizerSpec back = *q;
      back.sr_bits = SrBits::per_element;
      CHECK(back == *b.operands[size_t(i)]);  // nothing else changed
    }
    CHECK(sr >= 2);
    CHECK(recipe_from_json(recipe_to_json(r)) == r);  // stored per operand
  }
  CHECK_THROWS_WITH_AS(parse_recipe(R"({"extends": "nvfp4", "sr_bits": "x4"})"),
                       doctest::Contains("recipe.sr_bits: unknown sr_bits \"x4\"; valid: per_element, ptx_x4"), Error);
}

TEST_CASE("bad recipe JSON gives the JSON path and the valid choices") {
  struct Case {
    const char* json;
    std::vector<std::string> must;
  };
  const Case cases[] = {
      {R"({"extends": "nvfp4", "fwd_y": null})", {"recipe.fwd_y", "unknown key", "fwd_x", "wgrad_rht"}},
      {R"({"extends": "nvfp5"})", {"recipe.extends", "nvfp5", "mx_baseline"}},
      {R"({"extends": 3})", {"recipe.extends", "expected a string"}},
      {R"({"double_quantization": "yes"})", {"recipe.double_quantization", "true or false"}},
      {R"({"high_precision": "fp16"})", {"recipe.high_precision", "fp32, bf16"}},
      {R"({"keep_high_precision": "head"})", {"recipe.keep_high_precision", "array"}},
      {R"({"keep_high_precision": ["head", 3]})", {"recipe.keep_high_precision[1]"}},
      {R"({"fwd_x": 5})", {"recipe.fwd_x", "null"}},
      {R"({"fwd_x": "mxfp5"})", {"recipe.fwd_x", "mxfp4"}},
      {R"({"fwd_x": {"elemnt": "e2m1"}})", {"recipe.fwd_x.elemnt", "element"}},
      {R"({"fwd_x": {"element": "e9m9"}})", {"recipe.fwd_x.element"}},
      // A block across the reduction axis.
      {R"({"extends": "mx_baseline", "fwd_x": {"block": [32, 1]}})", {"recipe.fwd_x.block", "[1,K]", "reduction"}},
      {R"({"extends": "mx_baseline", "wgrad_x": {"block": [1, 32]}})", {"recipe.wgrad_x.block", "[K,1]"}},
      // Blocks the format does not allow.
      {R"({"extends": "mx_baseline", "fwd_x": {"block": [1, 16]}})", {"recipe.fwd_x.block", "[1,32]", "[32,32]"}},
      {R"({"extends": "nvfp4", "fwd_x": {"block": [1, 32]}})", {"recipe.fwd_x.block", "[1,16]", "[16,16]"}},
      {R"({"extends": "nvfp4", "fwd_x": {"scale_rule": "ocp"}})", {"recipe.fwd_x", "e8m0"}},
      // RHT with a block length that is not 16.
      {R"({"extends": "mx_baseline", "wgrad_rht": true})", {"recipe.wgrad_rht", "[16,1]", "[32,1]"}},
      {R"({"extends": "mx_baseline", "fwd_x": {"rht": true}})", {"recipe.fwd_x", "rht", "[1,16]"}},
      {R"({"extends": "nvfp4", "wgrad_x": {"rht": true}})", {"recipe.wgrad_x.rht", "wgrad_rht"}},
      {R"({"extends": "nvfp4", "dgrad_rht": true})", {"recipe.dgrad_rht", "recipe.dgrad_w", "[16,1]", "[16,16]"}},
      {R"({"extends": "quartet2", "dgrad_w": {"rht": true, "rht_kind": "quartet2_128"}})",
       {"recipe.dgrad_w.rht", "dgrad_rht"}},
      {R"({"extends": "quartet2", "rht_kind": "rht32"})", {"recipe.rht_kind", "rht32", "quartet2_128"}},
      {R"({"extends": "quartet2", "rht_schedule": "daily"})", {"recipe.rht_schedule", "per_step"}},
      {R"({"double_quantization": true})", {"recipe.double_quantization", "fwd_x"}},
      {R"({"switch_to": "bf16"})", {"recipe.switch_fraction"}},
      {R"({"switch_fraction": 0.1})", {"recipe.switch_to", "bf16"}},
      {R"({"switch_to": "nope", "switch_fraction": 0.1})", {"recipe.switch_to", "nope"}},
      {R"({"switch_to": "bf16", "switch_fraction": 1.5})", {"recipe.switch_fraction", "[0, 1]"}},
      {R"({"rht_seed": -1})", {"recipe.rht_seed", "non-negative"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.json);
    const std::string e = error_of([&] { parse_recipe(c.json); });
    CAPTURE(e);
    REQUIRE_FALSE(e.empty());
    for (const auto& m : c.must) CHECK(contains(e, m));
  }
  CHECK(contains(error_of([] { recipe_from_json(nlohmann::json::array({1, 2})); }), "JSON object"));
  // Not JSON, not a name, not a file.
  CHECK(contains(error_of([] { parse_recipe("{oops"); }), "does not parse"));
  CHECK(contains(error_of([] { parse_recipe("no_such_recipe_or_file"); }), "nvfp4"));
}

TEST_CASE("recipe files, with their name in errors") {
  const std::string path = "test_recipe_tmp.json";
  {
    std::ofstream f(path);
    f << R"({"extends": "tetrajet", "name": "tj_rn_bwd", "dgrad_w": {"round": "rn"}})";
  }
  const Recipe r = parse_recipe(path);
  CHECK(r.name == "tj_rn_bwd");
  CHECK(r.operand(Operand::dgrad_w)->round == Round::rn);
  CHECK(r.double_quantization);
  {
    std::ofstream f(path);
    f << R"({"extends": "tetrajet", "dgrad_w": {"block": [16, 1]}})";
  }
  const std::string e = error_of([&] { parse_recipe(path); });
  CHECK(contains(e, path));
  CHECK(contains(e, "recipe.dgrad_w.block"));
  std::remove(path.c_str());
}

TEST_CASE("layer-name patterns") {
  CHECK(name_matches("head", "head"));
  CHECK_FALSE(name_matches("head", "lm_head"));
  CHECK(name_matches("*head", "lm_head"));
  CHECK(name_matches("*head*", "head.proj"));
  CHECK(name_matches("blocks.*.attn.*", "blocks.3.attn.qkv"));
  CHECK_FALSE(name_matches("blocks.*.attn.*", "blocks.3.mlp.fc1"));
  CHECK(name_matches("*", ""));
  CHECK(name_matches("a*b*c", "aXbYbZc"));
  CHECK_FALSE(name_matches("a*b*c", "aXbYbZ"));
  CHECK(name_matches("**x", "x"));
  // The forms config layer_recipes rules use (train/layer_recipes.hpp): '*' crosses '.', block
  // indices match whole ("blocks.1.*" is not "blocks.10.*"), '?' and '[' are literal characters.
  CHECK(name_matches("blocks.10.*", "blocks.10.ffn.up_proj"));
  CHECK_FALSE(name_matches("blocks.1.*", "blocks.10.ffn.up_proj"));
  CHECK(name_matches("*.attn.*", "blocks.0.attn.q_proj"));
  CHECK_FALSE(name_matches("*.attn.*", "attn.q_proj"));
  CHECK(name_matches("h.*.mlp.experts.*.c_fc", "h.3.mlp.experts.12.c_fc"));
  CHECK_FALSE(name_matches("h.?.mlp.c_fc", "h.1.mlp.c_fc"));
  CHECK_FALSE(name_matches("h.[01].mlp.c_fc", "h.1.mlp.c_fc"));
  Recipe r;
  r.keep_high_precision = {"embed", "blocks.0.*"};
  CHECK(r.keeps_high_precision("embed"));
  CHECK(r.keeps_high_precision("blocks.0.mlp.fc2"));
  CHECK_FALSE(r.keeps_high_precision("blocks.1.mlp.fc2"));
}

TEST_CASE("precision switch for the last fraction of training") {
  Recipe r = parse_recipe(R"({"extends": "nvfp4", "switch_to": "bf16", "switch_fraction": 0.1})");
  CHECK(switch_step(r, 1000) == 900);
  CHECK(effective_recipe(r, 899, 1000).name == r.name);
  CHECK(effective_recipe(r, 900, 1000).name == "bf16");
  CHECK(effective_recipe(r, 999, 1000).name == "bf16");
  CHECK(switch_step(r, 15) == 13);  // round(1.5) = 2 steps at the end
  const Recipe plain = recipe_by_name("nvfp4");
  CHECK(switch_step(plain, 1000) == 1000);
  CHECK(effective_recipe(plain, 999, 1000) == plain);
  r.switch_fraction = 1.0;
  CHECK(switch_step(r, 10) == 0);
}

TEST_CASE("describe lists Q0..Q5 and the other fields") {
  const std::string s = describe(recipe_by_name("tetrajet"));
  for (const char* k : {"Q0 (fwd_x", "Q1 (fwd_w", "Q2 (dgrad_grad_y", "Q3 (dgrad_w", "Q4 (wgrad_grad_y", "Q5 (wgrad_x",
                        "double_quantization : yes", "wgrad_rht           : no", "SR", "RTN", "tetrajet"})
    CHECK(contains(s, k));
  const std::string f = describe(recipe_by_name("fp32"));
  CHECK(contains(f, "high precision (fp32)"));
  CHECK(operand_by_name("wgrad_x") == Operand::wgrad_x);
  CHECK(contains(error_of([] { operand_by_name("bwd_x"); }), "wgrad_grad_y"));
  for (Operand op : kOps) CHECK(operand_by_name(operand_name(op)) == op);
}

TEST_CASE("recipe JSON: a few hundred mutated recipes give a valid recipe or one clean error (fuzz)") {
  test::FuzzCounts c;
  const std::vector<std::string> names = recipe_names();
  uint32_t k = 0;
  for (const std::string& name : names) {
    const nlohmann::json base = recipe_to_json(recipe_by_name(name));
    for (int i = 0; i < 30; ++i, ++k) {
      const nlohmann::json j = test::mutate_json(base, k);
      test::classify(c, name + " json mutation " + std::to_string(k), [&] {
        const Recipe r = recipe_from_json(j);
        validate(r);
      });
      // The same document as text, mutated byte-wise (parse_recipe's JSON-text form).
      const std::string text = test::mutate_bytes(base.dump(), k);
      if (!text.empty() && text[0] == '{')
        test::classify(c, name + " text mutation " + std::to_string(k), [&] { validate(parse_recipe(text)); });
    }
  }
  test::report("recipe JSON", c);
  CHECK(c.valid > 0);
  CHECK(c.clean_error > 0);
}

TEST_CASE("fp4tk recipes: fp4-trainkit's per-operand choices, W-only double quantization, no forward bias; JSON") {
  struct Row {
    const char* name;
    ScaleRule rule;
    int k;
    std::array<Round, 6> rounds;
    bool dq;
  };
  const Round N = Round::rn, S = Round::rs;
  const Row rows[] = {{"fp4tk_mx_baseline", ScaleRule::ocp, 32, {N, N, N, N, N, N}, false},
                      {"fp4tk_nvidia_round_to_infinity", ScaleRule::ceil, 32, {N, N, N, N, N, N}, false},
                      {"fp4tk_tetrajet", ScaleRule::tetrajet, 32, {N, N, S, S, S, S}, true},
                      {"fp4tk_fp4_all_the_way", ScaleRule::nv_noglobal, 16, {N, N, S, N, S, S}, false}};
  for (const Row& row : rows) {
    CAPTURE(row.name);
    const Recipe r = recipe_by_name(row.name);
    CHECK_FALSE(r.forward_bias);
    CHECK(r.double_quantization == row.dq);
    if (row.dq) CHECK_FALSE(r.double_quantization_x);
    for (int i = 0; i < 6; ++i) {
      const QuantizerSpec& q = *r.operands[size_t(i)];
      CHECK(q.emulate == Emulation::fp4tk);
      CHECK(q.scale_rule == row.rule);
      CHECK(q.round == row.rounds[size_t(i)]);
      CHECK(q.block_rows * q.block_cols == row.k);
      CHECK(q.block_rows == (i < 3 ? 1 : row.k));  // fwd and dgrad_grad_y along rows, the rest along columns
    }
  }
  // "weights": re-quantize W only; true / false as before; anything else is one clear error.
  const Recipe w = parse_recipe(R"({"extends": "tetrajet", "double_quantization": "weights", "forward_bias": false})");
  CHECK(w.double_quantization);
  CHECK_FALSE(w.double_quantization_x);
  CHECK_FALSE(w.forward_bias);
  CHECK(recipe_to_json(w)["double_quantization"] == "weights");
  CHECK(parse_recipe(recipe_to_json(w).dump()) == w);
  const Recipe t = parse_recipe(R"({"extends": "fp4tk_tetrajet", "double_quantization": true})");
  CHECK(t.double_quantization_x);
  const std::string e = error_of([] { parse_recipe(R"({"double_quantization": "x"})"); });
  CHECK(contains(e, "recipe.double_quantization"));
  CHECK(contains(e, "weights"));
  CHECK(contains(error_of([] { parse_recipe(R"({"forward_bias": 1})"); }), "recipe.forward_bias"));
}

TEST_CASE("TransformerEngine NVFP4 option recipes: nvfp4_4over6, nvfp4_row_scaled; JSON; validation errors") {
  const Recipe nv = recipe_by_name("nvfp4");
  // 4/6 on x and W in every GEMM (TE's one quantizer per tensor), along each
  // operand's reduction axis; no RHT; the gradients as nvfp4.
  const Recipe f = recipe_by_name("nvfp4_4over6");
  const int blocks[kOperandCount][2] = {{1, 16}, {16, 16}, {1, 16}, {16, 16}, {16, 1}, {16, 1}};
  for (int i = 0; i < kOperandCount; ++i) {
    CAPTURE(i);
    REQUIRE(f.operands[size_t(i)].has_value());
    const QuantizerSpec& q = *f.operands[size_t(i)];
    CHECK(q.block_rows == blocks[i][0]);
    CHECK(q.block_cols == blocks[i][1]);
    const bool grad = Operand(i) == Operand::dgrad_grad_y || Operand(i) == Operand::wgrad_grad_y;
    if (grad) {
      CHECK(q == *nv.operands[size_t(i)]);
      CHECK(q.round == Round::rs);
    } else {
      CHECK(q.scale_select == ScaleSelect::four_over_six);
      CHECK(q.select_error == SelectError::mae);
      CHECK(q.e4m3_max == 256);
      CHECK(q.round == Round::rn);
      CHECK(q.global_scale == GlobalScale::tensor_amax);
      CHECK_FALSE(q.rht);
    }
  }
  CHECK(*f.operands[size_t(Operand::dgrad_w)] == *f.operands[size_t(Operand::fwd_w)]);  // one Q(W) for both GEMMs
  CHECK_FALSE(f.wgrad_rht);
  CHECK(f.high_precision == nv.high_precision);
  CHECK(f.keep_high_precision == nv.keep_high_precision);
  // Row-scaled x in the forward GEMM only.
  const Recipe r = recipe_by_name("nvfp4_row_scaled");
  for (int i = 0; i < kOperandCount; ++i) {
    CAPTURE(i);
    if (Operand(i) == Operand::fwd_x) {
      CHECK(r.operands[size_t(i)]->global_scale == GlobalScale::row_amax);
      CHECK(r.operands[size_t(i)]->block_cols == 16);
    } else {
      CHECK(*r.operands[size_t(i)] == *nv.operands[size_t(i)]);
    }
  }
  CHECK(r.wgrad_rht == nv.wgrad_rht);
  // JSON: the new keys travel, also through extends with partial overrides.
  for (const Recipe* c : {&f, &r}) {
    const nlohmann::json j = recipe_to_json(*c);
    CHECK(recipe_from_json(j) == *c);
    CHECK(j["fwd_x"].contains("scale_select"));
  }
  CHECK(recipe_to_json(f)["fwd_w"]["scale_select"] == "four_over_six");
  CHECK(recipe_to_json(f)["fwd_w"]["e4m3_max"] == 256);
  CHECK(recipe_to_json(r)["fwd_x"]["global_scale"] == "row_amax");
  const Recipe e = parse_recipe(R"({"extends": "nvfp4", "name": "x46", "fwd_x": {"scale_select": "four_over_six",
                                    "select_error": "mse_fp16"}})");
  CHECK(e.operands[0]->scale_select == ScaleSelect::four_over_six);
  CHECK(e.operands[0]->select_error == SelectError::mse_fp16);
  CHECK(e.operands[0]->e4m3_max == 448);  // the extended operand's
  // Errors name the operand and key, and the valid choices.
  struct Case {
    const char* json;
    std::vector<std::string> must;
  };
  const Case cases[] = {
      // Row scaling scales row blocks: a column operand cannot take it.
      {R"({"extends": "nvfp4", "wgrad_x": {"global_scale": "row_amax"}})", {"recipe.wgrad_x", "row_amax", "[1,16]"}},
      {R"({"extends": "nvfp4", "fwd_w": {"global_scale": "row_amax"}})", {"recipe.fwd_w", "[1,16], got [16,16]"}},
      // 4/6 under the recipe's wgrad RHT (TE refuses 4/6 with an RHT).
      {R"({"extends": "nvfp4", "wgrad_x": {"scale_select": "four_over_six"}})",
       {"recipe.wgrad_rht", "recipe.wgrad_x", "four_over_six", "wgrad_rht false"}},
      {R"({"extends": "nvfp4_4over6", "dgrad_grad_y": {"scale_select": "four_over_six"}})",
       {"recipe.dgrad_grad_y", "round must not be 'rs'"}},
      {R"({"extends": "nvfp4_4over6", "fwd_x": {"select_error": "l2"}})",
       {"recipe.fwd_x.select_error", "mae, mse, mae_fp16, mse_fp16"}},
      {R"({"extends": "nvfp4_4over6", "fwd_x": {"e4m3_max": 512}})", {"recipe.fwd_x.e4m3_max", "448 or 256"}},
      {R"({"extends": "nvfp4", "fwd_x": {"e4m3_max": 256}})", {"recipe.fwd_x", "e4m3_max 256", "four_over_six"}},
      {R"({"extends": "nvfp4", "fwd_x": {"scale_select": "six"}})", {"recipe.fwd_x.scale_select", "max, four_over_six"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.json);
    const std::string err = error_of([&] { parse_recipe(c.json); });
    CAPTURE(err);
    REQUIRE_FALSE(err.empty());
    for (const auto& m : c.must) CHECK(contains(err, m));
  }
}

TEST_CASE("backward_override: the plan's backward operands (TE's NVTE_BACKWARD_OVERRIDE), JSON, errors") {
  const Recipe nv = recipe_by_name("nvfp4");
  for (const char* mode : {"high_precision", "dequantized"}) {
    CAPTURE(mode);
    const Recipe r = parse_recipe(std::string(R"({"extends": "nvfp4", "backward_override": ")") + mode + "\"}");
    CHECK(r.backward_override ==
          (std::string(mode) == "dequantized" ? BackwardOverride::dequantized : BackwardOverride::high_precision));
    CHECK(recipe_from_json(recipe_to_json(r)) == r);
    CHECK(recipe_to_json(r)["backward_override"] == mode);
    const LinearContext ctx{&r, 9, 4, 12, "h.0.mlp.c_fc"};
    const LinearPlan p = linear_plan(ctx), base = linear_plan(LinearContext{&nv, 9, 4, 12, "h.0.mlp.c_fc"});
    // The forward is nvfp4's.
    for (Operand op : {Operand::fwd_x, Operand::fwd_w}) {
      REQUIRE(p.operand(op).quantizer != nullptr);
      CHECK(*p.operand(op).quantizer == *base.operand(op).quantizer);
      CHECK(p.operand(op).stream.stream == base.operand(op).stream.stream);
    }
    CHECK_FALSE(p.reuse_fwd_w);
    // No gradient is quantized, nothing is rotated, the recipe's high precision (bf16) applies.
    for (Operand op : {Operand::dgrad_grad_y, Operand::dgrad_w, Operand::wgrad_grad_y, Operand::wgrad_x}) {
      CAPTURE(operand_name(op));
      const OperandPlan& o = p.operand(op);
      CHECK(o.quantizer == nullptr);
      CHECK_FALSE(o.rht);
      CHECK(o.round_bf16 == (nv.high_precision == HighPrecision::bf16));
      const bool deq = std::string(mode) == "dequantized" && (op == Operand::dgrad_w || op == Operand::wgrad_x);
      if (deq) {  // the forward's quantizer and stream: Q_fwd(.) again, the forward's bits
        const Operand src = op == Operand::dgrad_w ? Operand::fwd_w : Operand::fwd_x;
        REQUIRE(o.pre != nullptr);
        CHECK(*o.pre == *base.operand(src).quantizer);
        CHECK(o.pre_stream.seed == base.operand(src).stream.seed);
        CHECK(o.pre_stream.stream == base.operand(src).stream.stream);
      } else {
        CHECK(o.pre == nullptr);
      }
    }
  }
  // Unset: absent from the JSON (resolved recipes of older runs keep their text), and the plan is nvfp4's.
  CHECK_FALSE(recipe_to_json(nv).contains("backward_override"));
  CHECK(parse_recipe(R"({"extends": "nvfp4", "backward_override": null})").backward_override == BackwardOverride::none);
  try {
    parse_recipe(R"({"extends": "nvfp4", "backward_override": "fp8"})");
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("recipe.backward_override") != std::string::npos);
    CHECK(m.find("high_precision, dequantized") != std::string::npos);
  }
}

TEST_CASE("fp8_blockwise: recipes take 128-long blocks along the reduction axis") {
  Recipe r = recipe_by_name("fp8_blockwise");
  CHECK(r.operand(Operand::fwd_x)->block_cols == 128);
  CHECK(r.operand(Operand::fwd_w)->block_rows == 128);
  CHECK(r.operand(Operand::wgrad_x)->block_rows == 128);
  QuantizerSpec bad = *r.operand(Operand::fwd_x);
  bad.block_cols = 32;
  r.operands[size_t(Operand::fwd_x)] = bad;
  CHECK_THROWS_WITH_AS(validate(r, "recipe"), doctest::Contains("[1,128]"), std::exception);
}

namespace {

// Leaf paths ("fwd_x.round") of a recipe's JSON whose values differ between a
// and b, name and source left out.
std::vector<std::string> changed_paths(const nlohmann::json& a, const nlohmann::json& b, const std::string& at = "") {
  std::vector<std::string> out;
  if (a.is_object() && b.is_object()) {
    std::vector<std::string> keys;
    for (auto it = a.begin(); it != a.end(); ++it) keys.push_back(it.key());
    for (auto it = b.begin(); it != b.end(); ++it)
      if (!a.contains(it.key())) keys.push_back(it.key());
    for (const std::string& k : keys) {
      if (at.empty() && (k == "name" || k == "source")) continue;
      const nlohmann::json none;
      const auto sub =
          changed_paths(a.contains(k) ? a[k] : none, b.contains(k) ? b[k] : none, at.empty() ? k : at + "." + k);
      out.insert(out.end(), sub.begin(), sub.end());
    }
  } else if (a != b) {
    out.push_back(at);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

// configs/recipes/mx_factorial/: mx_baseline to tetrajet one factor at a time
// (issue 49's MX factorial), checked against the canned recipes: each file
// differs from the one before it in exactly its named factor, and the last one
// is the canned tetrajet in every field.
TEST_CASE("configs/recipes/mx_factorial: one factor a step, ending at the canned tetrajet") {
  const std::string dir = std::string(FP4LAB_SOURCE_DIR) + "/configs/recipes/mx_factorial/";
  auto json_of = [&](const std::string& file) { return recipe_to_json(parse_recipe(dir + file + ".json")); };
  const nlohmann::json base = recipe_to_json(recipe_by_name("mx_baseline"));
  const nlohmann::json f1 = json_of("mxf1_sr_dy"), f2 = json_of("mxf2_sr_bwd"), f3 = json_of("mxf3_sr_bwd_dq"),
                       f4 = json_of("mxf4_tetrajet");
  CHECK(changed_paths(base, f1) == sorted({"dgrad_grad_y.round", "wgrad_grad_y.round"}));
  CHECK(changed_paths(f1, f2) == sorted({"dgrad_w.round", "wgrad_x.round"}));
  CHECK(changed_paths(f2, f3) == sorted({"double_quantization"}));
  std::vector<std::string> rules;
  for (const char* op : {"fwd_x", "fwd_w", "dgrad_grad_y", "dgrad_w", "wgrad_grad_y", "wgrad_x"})
    rules.push_back(std::string(op) + ".scale_rule");
  CHECK(changed_paths(f3, f4) == sorted(rules));
  CHECK(changed_paths(recipe_to_json(recipe_by_name("tetrajet")), f4).empty());

  // Blocks of 16 and E4M3 scales: the factor and hardware_blocks false, nothing else.
  std::vector<std::string> blocks{"hardware_blocks"}, scales{"hardware_blocks"};
  for (const char* op : {"fwd_x", "fwd_w", "dgrad_grad_y", "dgrad_w", "wgrad_grad_y", "wgrad_x"}) {
    blocks.push_back(std::string(op) + ".block");  // [1,32] -> [1,16], [32,1] -> [16,1] (a JSON array: one leaf)
    scales.push_back(std::string(op) + ".scale");
    scales.push_back(std::string(op) + ".scale_rule");
  }
  CHECK(changed_paths(base, json_of("mxf_block16")) == sorted(blocks));
  CHECK(changed_paths(base, json_of("mxf_e4m3")) == sorted(scales));
}

TEST_CASE("hardware_blocks false: any run of K >= 2 along the reduction axis, 1-D or square") {
  auto with = [](const std::string& ops) {
    return nlohmann::json::parse(R"({"name": "t", "extends": "mx_baseline", "hardware_blocks": false, )" + ops + "}");
  };
  const Recipe r16 = recipe_from_json(with(R"("fwd_x": {"block": [1, 16]}, "dgrad_w": {"block": [8, 8]})"), "recipe");
  CHECK(r16.operand(Operand::fwd_x)->block_cols == 16);
  CHECK(r16.operand(Operand::dgrad_w)->block_rows == 8);
  CHECK_FALSE(r16.hardware_blocks);
  // The JSON round trip keeps it; a recipe that does not set it writes nothing new.
  CHECK(recipe_from_json(recipe_to_json(r16), "recipe").hardware_blocks == false);
  CHECK_FALSE(recipe_to_json(recipe_by_name("mx_baseline")).contains("hardware_blocks"));
  // Still refused: a block across the reduction axis, a 1-long run, a non-square tile.
  CHECK(error_of([&] {
          recipe_from_json(with(R"("fwd_x": {"block": [16, 1]})"), "recipe");
        }).find("runs across the reduction axis") != std::string::npos);
  CHECK(error_of([&] {
          recipe_from_json(with(R"("fwd_x": {"block": [4, 16]})"), "recipe");
        }).find("recipe.fwd_x.block: [4,16] is not a block of K >= 2 elements along in") != std::string::npos);
  // Without the key: the hardware's sizes.
  CHECK(error_of([] {
          recipe_from_json(
              nlohmann::json::parse(R"({"name": "t", "extends": "mx_baseline", "fwd_x": {"block": [1, 16]}})"),
              "recipe");
        }).find("valid: [1,32] or [32,32]") != std::string::npos);
  CHECK(error_of([] {
          recipe_from_json(nlohmann::json::parse(R"({"name": "t", "extends": "mx_baseline", "hardware_blocks": 1})"),
                           "recipe");
        }).find("recipe.hardware_blocks: expected true or false") != std::string::npos);
}
