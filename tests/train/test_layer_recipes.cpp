// Per-layer recipes and the evaluation recipe (train/layer_recipes.hpp):
// pattern rules (first match wins), their errors, the layer names against the
// models', and CPU runs: layer_recipes mapping every layer to R trains bit for
// bit as the recipe R, one layer in FP32 as an independent keep_high_precision
// construction, eval_recipe changes the evaluation and not the training, and
// summary.json's layer map.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "train/backend.hpp"
#include "train/config.hpp"
#include "train/layer_recipes.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"

using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// test::tiny_gpt_config with 2 layers, 12 steps (no warmup), evaluations every 6, seed 5.
json gpt2(const std::string& text, const std::string& out, const json& recipe = "fp32") {
  json j = test::tiny_gpt_config(text, out, recipe);
  j["name"] = "lr";
  j["model"]["layers"] = 2;
  j["training"] = {{"batch_size", 4}, {"steps", 12}, {"lr", 1e-2}, {"eval_interval", 6}, {"eval_iters", 2},
                   {"log_interval", 3}};
  j["seed"] = 5;
  return j;
}

struct Tmp {
  fs::path dir;
  std::string text;
  explicit Tmp(const char* name) : dir(fs::temp_directory_path() / name) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    text = test::write_words_corpus(dir);
  }
  ~Tmp() { fs::remove_all(dir); }
};

std::vector<double> eval_losses(const RunResult& r) {
  std::vector<double> v;
  for (const json& m : read_metrics((fs::path(r.dir) / "metrics.jsonl").string()))
    if (m.value("eval", false)) v.push_back(m.at("val_loss").get<double>());
  return v;
}

}  // namespace

TEST_CASE("layer_recipes: the first matching rule chooses a layer's recipe; unmatched layers run the config's") {
  json j = gpt2("x.txt", "runs", "nvfp4");
  j["layer_recipes"] = json::array({{{"layers", "h.1.*"}, {"recipe", "bf16"}},
                                    {{"layers", "*.attn.*"}, {"recipe", "mxfp8"}},
                                    {{"layers", "h.0.mlp.c_fc"}, {"recipe", {{"extends", "nvfp4"}, {"name", "mine"}}}}});
  const RunConfig c = config_from_json(j);
  const LayerRecipes lr = resolve_layer_recipes(c);
  REQUIRE(lr.layers.size() == 9);
  std::vector<std::optional<fp4lab::Recipe>> store;
  const auto t = lr.training_table(0, 12, store);
  auto name_of = [&](const std::string& layer) {
    for (size_t i = 0; i < lr.layers.size(); ++i)
      if (lr.layers[i].name == layer) return t[i]->name;
    return std::string("?");
  };
  CHECK(name_of("h.0.attn.c_attn") == "mxfp8");
  CHECK(name_of("h.0.attn.c_proj") == "mxfp8");
  CHECK(name_of("h.0.mlp.c_fc") == "mine");
  CHECK(name_of("h.0.mlp.c_proj") == "nvfp4");
  CHECK(name_of("h.1.attn.c_attn") == "bf16");  // rule 0 before rule 1
  CHECK(name_of("h.1.mlp.c_proj") == "bf16");
  CHECK(name_of("lm_head") == "nvfp4");
  // "h.1.*" is not "h.10.*"'s prefix: the whole name must match.
  CHECK_FALSE(fp4lab::name_matches("h.1.*", "h.10.attn.c_attn"));
  // The map: lm_head is kept in high precision by nvfp4's own keep_high_precision ("*head*").
  const json m = lr.map(t);
  CHECK(m["lm_head"]["recipe"] == "nvfp4");
  CHECK(m["lm_head"]["quantized"] == false);
  CHECK(m["h.0.mlp.c_proj"]["quantized"] == true);
  CHECK(m["h.1.mlp.c_proj"]["quantized"] == false);  // bf16 has no quantizer
  CHECK(m["h.0.mlp.c_fc"]["hash"] != m["h.0.mlp.c_proj"]["hash"]);
  // layers.keep_high_precision is added to every rule's recipe.
  j["layers"] = {{"keep_high_precision", {"h.0.attn.c_attn"}}};
  const LayerRecipes kept = resolve_layer_recipes(config_from_json(j));
  CHECK(kept.map(kept.training_table(0, 12, store))["h.0.attn.c_attn"]["quantized"] == false);
  // The config round-trips, and its hash covers the rules.
  CHECK(config_from_json(config_to_json(c)).layer_recipes == c.layer_recipes);
  json plain = config_to_json(config_from_json(gpt2("x.txt", "runs", "nvfp4")));
  json with = config_to_json(c);
  plain["recipe_resolved"] = with["recipe_resolved"] = fp4lab::recipe_to_json(resolve_recipe(c));
  add_resolved_layer_recipes(with, c);
  CHECK(with.contains("layer_recipes_resolved"));
  CHECK(config_hash(plain) != config_hash(with));
  CHECK(config_difference(plain, with).find("layer_recipes") != std::string::npos);
}

TEST_CASE("linear_layer_names agrees with the models' layers (ids and names)") {
  auto backend = make_backend("cpu", 1);
  auto check = [&](const ModelConfig& m) {
    const auto model = make_model(m, *backend, 1);
    const auto infos = model->linear_layers();
    const auto names = linear_layer_names(m);
    REQUIRE(infos.size() == names.size());
    for (const auto& l : infos) CHECK(names.at(size_t(l.id)).name == l.name);
  };
  ModelConfig vit;
  vit.type = "vit", vit.layers = 2, vit.width = 16, vit.heads = 2;
  check(vit);
  ModelConfig gpt;
  gpt.type = "gpt", gpt.layers = 2, gpt.width = 16, gpt.heads = 2, gpt.context = 8, gpt.vocab_size = 11;
  check(gpt);
  ModelConfig moe = gpt;
  moe.moe.experts = 3, moe.moe.top_k = 2, moe.moe.shared_expert = true;
  check(moe);
  CHECK(linear_layer_names(moe)[2].name == "h.0.mlp.router");
  CHECK(linear_layer_names(moe)[2].fp32_router);
}

TEST_CASE("layer_recipes errors name the key, the valid forms and the model's layers") {
  json j = gpt2("x.txt", "runs", "nvfp4");
  auto err = [&](const json& rules) {
    json k = j;
    k["layer_recipes"] = rules;
    return test::config_error(k);
  };
  std::string e = err(json::array({{{"layers", "blocks.0.*"}, {"recipe", "bf16"}}}));
  CHECK(e.find("config.layer_recipes[0].layers: \"blocks.0.*\" matches no layer") != std::string::npos);
  CHECK(e.find("h.0.attn.c_attn, h.0.attn.c_proj") != std::string::npos);
  CHECK(e.find("lm_head") != std::string::npos);
  e = err(json::array({{{"layers", "h.[01].*"}, {"recipe", "bf16"}}}));
  CHECK(e.find("config.layer_recipes[0].layers") != std::string::npos);
  CHECK(e.find("not regular expressions") != std::string::npos);
  CHECK(e.find("valid: a layer name or a glob") != std::string::npos);
  CHECK(err(json::array({{{"layers", "h.**"}, {"recipe", "bf16"}}})).find("\"**\" is ambiguous") != std::string::npos);
  CHECK(err(json::array({{{"layers", ""}, {"recipe", "bf16"}}})).find("empty pattern") != std::string::npos);
  // A rule whose layers an earlier rule takes would never apply; a repeated pattern likewise.
  e = err(json::array({{{"layers", "h.*"}, {"recipe", "bf16"}}, {{"layers", "h.0.*"}, {"recipe", "mxfp8"}}}));
  CHECK(e.find("config.layer_recipes[1].layers: \"h.0.*\" matches only layers that config.layer_recipes[0]") !=
        std::string::npos);
  CHECK(err(json::array({{{"layers", "lm_head"}, {"recipe", "bf16"}}, {{"layers", "lm_head"}, {"recipe", "fp32"}}}))
            .find("repeats") != std::string::npos);
  // Shapes and recipes.
  CHECK(err(json::object()).find("config.layer_recipes: {}: expected an array") != std::string::npos);
  CHECK(err(json::array({{{"layers", "*"}, {"recipe", "bf16"}, {"recipes", 1}}}))
            .find("config.layer_recipes[0].recipes: unknown key; valid keys here: layers, recipe") != std::string::npos);
  CHECK(err(json::array({{{"layers", "*"}}})).find("config.layer_recipes[0].recipe: missing") != std::string::npos);
  CHECK(err(json::array({{{"layers", 3}, {"recipe", "bf16"}}})).find("config.layer_recipes[0].layers: 3 has the wrong type") !=
        std::string::npos);
  e = err(json::array({{{"layers", "*"}, {"recipe", "nvfp5"}}}));
  CHECK(e.find("config.layer_recipes[0].recipe: ") != std::string::npos);
  CHECK(e.find("nvfp5") != std::string::npos);
  // eval_recipe: a recipe without a switch.
  json k = j;
  k["eval_recipe"] = 7;
  CHECK(test::config_error(k).find("config.eval_recipe: 7: expected a recipe name") != std::string::npos);
  k["eval_recipe"] = {{"extends", "nvfp4"}, {"switch_to", "bf16"}, {"switch_fraction", 0.5}};
  CHECK(test::config_error(k).find("config.eval_recipe: \"nvfp4_custom\" has switch_to") != std::string::npos);
  k["eval_recipe"] = "nope";
  CHECK(test::config_error(k).find("config.eval_recipe: ") != std::string::npos);
  // MoE routers run FP32 unless quantize_router: a rule for them alone does nothing, so it is an error.
  json moe = j;
  moe["model"]["moe"] = {{"experts", 2}, {"top_k", 1}};
  moe["layer_recipes"] = json::array({{{"layers", "*.router"}, {"recipe", "bf16"}}});
  CHECK(test::config_error(moe).find("matches only MoE routers") != std::string::npos);
  moe["model"]["moe"]["quantize_router"] = true;
  CHECK(test::config_error(moe).empty());
}

TEST_CASE("a run with layer_recipes mapping every layer to R is bit-identical to the run with recipe R") {
  Tmp t("fp4lab_test_layer_recipes_same");
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  const RunResult a = run_training(config_from_json(gpt2(t.text, (t.dir / "a").string(), "nvfp4")), o);
  json bj = gpt2(t.text, (t.dir / "b").string(), "fp32");
  bj["layer_recipes"] = json::array({{{"layers", "*"}, {"recipe", "nvfp4"}}});
  const RunResult b = run_training(config_from_json(bj), o);
  REQUIRE(a.step_losses.size() == 12);
  CHECK(a.step_losses == b.step_losses);
  CHECK(a.final_params == b.final_params);
  CHECK(eval_losses(a) == eval_losses(b));
  // Both summaries name nvfp4 for every layer (lm_head kept in high precision by its keep_high_precision).
  REQUIRE(a.summary.contains("layer_recipes"));
  CHECK(a.summary["layer_recipes"] == b.summary["layer_recipes"]);
  CHECK(a.summary["layer_recipes"].size() == 9);
  CHECK(a.summary["layer_recipes"]["h.1.mlp.c_fc"]["recipe"] == "nvfp4");
  CHECK(a.summary["layer_recipes"]["lm_head"]["quantized"] == false);
  const json sb = read_json_file((fs::path(b.dir) / "summary.json").string());
  CHECK(sb["layer_recipes"] == b.summary["layer_recipes"]);
  CHECK_FALSE(sb.contains("eval_layer_recipes"));
  // The config hash differs (another config), and config.json records the rules and their resolved recipes.
  CHECK(a.summary["config_hash"] != b.summary["config_hash"]);
  const json cb = read_json_file((fs::path(b.dir) / "config.json").string());
  CHECK(cb["layer_recipes"][0]["layers"] == "*");
  CHECK(cb["layer_recipes_resolved"][0]["name"] == "nvfp4");
  // Another rule on the same directory is a different run: the error names the key.
  bj["layer_recipes"][0]["recipe"] = "mxfp8";
  RunOptions res = o;
  res.resume = true;
  std::string e;
  try {
    run_training(config_from_json(bj), res);
  } catch (const fp4lab::Error& x) {
    e = x.what();
  }
  CHECK(e.find("layer_recipes") != std::string::npos);
}

TEST_CASE("one layer in FP32 by layer_recipes trains as the same layer kept in FP32 by keep_high_precision") {
  Tmp t("fp4lab_test_layer_recipes_one");
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  // nvfp4 with FP32 (not BF16) high precision, so that a kept layer computes as the fp32 recipe does.
  const json base = {{"extends", "nvfp4"}, {"name", "nvfp4_hp32"}, {"high_precision", "fp32"}};
  json aj = gpt2(t.text, (t.dir / "a").string(), base);
  aj["layer_recipes"] = json::array({{{"layers", "h.0.mlp.c_fc"}, {"recipe", "fp32"}}});
  json kept = base;
  kept["keep_high_precision"] = {"*head*", "h.0.mlp.c_fc"};
  const RunResult a = run_training(config_from_json(aj), o);
  const RunResult b = run_training(config_from_json(gpt2(t.text, (t.dir / "b").string(), kept)), o);
  const RunResult all = run_training(config_from_json(gpt2(t.text, (t.dir / "c").string(), base)), o);
  CHECK(a.step_losses == b.step_losses);
  CHECK(a.final_params == b.final_params);
  CHECK(a.step_losses.front() != all.step_losses.front());  // the one FP32 layer changes the run from step 0
  CHECK(a.final_params != all.final_params);
  const json& m = a.summary["layer_recipes"];
  CHECK(m["h.0.mlp.c_fc"]["recipe"] == "fp32");
  CHECK(m["h.0.mlp.c_fc"]["quantized"] == false);
  for (const char* l : {"h.0.attn.c_attn", "h.0.mlp.c_proj", "h.1.mlp.c_fc"}) {
    CHECK(m[l]["recipe"] == "nvfp4_hp32");
    CHECK(m[l]["quantized"] == true);
  }
}

TEST_CASE("eval_recipe changes the evaluation, not the training; the default evaluates with the training recipe") {
  Tmp t("fp4lab_test_layer_recipes_eval");
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  const RunResult a = run_training(config_from_json(gpt2(t.text, (t.dir / "a").string(), "nvfp4")), o);
  json bj = gpt2(t.text, (t.dir / "b").string(), "nvfp4");
  bj["eval_recipe"] = "fp32";
  const RunResult b = run_training(config_from_json(bj), o);
  json cj = gpt2(t.text, (t.dir / "c").string(), "nvfp4");
  cj["eval_recipe"] = "nvfp4";  // the training's recipe, given explicitly: the same evaluation
  const RunResult c = run_training(config_from_json(cj), o);
  CHECK(a.step_losses == b.step_losses);
  CHECK(a.final_params == b.final_params);
  const auto ea = eval_losses(a), eb = eval_losses(b), ec = eval_losses(c);
  REQUIRE(ea.size() == 3);  // steps 0, 6, 12
  REQUIRE(eb.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(ea[i] != eb[i]);
  CHECK(ea == ec);
  CHECK(b.summary["final"] != a.summary["final"]);
  REQUIRE(b.summary.contains("eval_layer_recipes"));
  CHECK(b.summary["eval_layer_recipes"]["h.0.attn.c_attn"]["recipe"] == "fp32");
  CHECK(b.summary["layer_recipes"]["h.0.attn.c_attn"]["recipe"] == "nvfp4");
  CHECK(b.summary["config_hash"] != a.summary["config_hash"]);
}
