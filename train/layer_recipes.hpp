// Per-layer recipes (config "layer_recipes") and the evaluation recipe
// (config "eval_recipe"): which recipe each linear layer runs, decided once,
// where the LinearContext is built (LinearLayer::context reads the per-layer
// table of StepContext::layer_recipes), never inside a backend.
//
//   "layer_recipes": [{"layers": "h.3.*", "recipe": "bf16"},
//                     {"layers": "*.attn.*", "recipe": "mxfp8"}]
//
// Rules are tried in order and the FIRST rule whose pattern matches a layer's
// name chooses its recipe (as Megatron-LM's --te-precision-config-file
// matchers: "Matchers are ordered, and the first enabled matcher to match
// against a module name chooses the config"); a layer no rule matches runs the
// config's "recipe". A pattern is a layer name with '*' wildcards (any run of
// characters, '.' included; the whole name must match: recipes/recipe.hpp
// name_matches). A rule's recipe is what "recipe" accepts: a canned name, a
// recipe JSON file or an inline recipe object.
//
// Errors (each naming its key, e.g. config.layer_recipes[1].layers): a pattern
// that is empty, has a character other than letters, digits, '_', '.', '-'
// and '*', or has "**"; a pattern that matches no layer (the message lists the
// model's layer names); a rule every layer of which an earlier rule already
// takes (it would never apply); a pattern that matches only MoE routers while
// model.moe.quantize_router is false (routers run in FP32 whatever the recipe).
//
// keep_high_precision: each layer's recipe keeps its own keep_high_precision
// list (applied by linear_plan to the layers that run it), and the config's
// layers.keep_high_precision is added to every recipe of the run (the
// config's, each rule's and eval_recipe), so a layer it names stays in high
// precision whatever recipe it runs. A recipe's switch_to switches the layers
// that run that recipe, at that recipe's own switch step.
//
// eval_recipe: absent or null = every evaluation forward runs the training
// recipes (per layer, as training does at that step: the quantization a
// QAT/RL user deploys, bit-identical to training's forward). Else one recipe
// (name, file or object; no switch_to) for every linear layer of the
// evaluation forward (e.g. "fp32" to score the master weights, or a cheaper
// forward-only format); layers.keep_high_precision and the FP32 MoE routers
// still apply.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "recipes/recipe.hpp"
#include "train/model.hpp"

namespace fp4lab::train {

struct RunConfig;

struct LayerRecipeRule {
  std::string layers;     // the name pattern
  nlohmann::json recipe;  // as given: a name, a file path or an inline object
  bool operator==(const LayerRecipeRule&) const = default;
};

// config.layer_recipes: an array of {"layers": pattern, "recipe": recipe}
// (`where` is the key's path). Checks each pattern's form and each recipe's
// type; config_from_json resolves them later (check_layer_recipes).
std::vector<LayerRecipeRule> parse_layer_recipes(const nlohmann::json& j, const std::string& where);
nlohmann::json layer_recipes_to_json(const std::vector<LayerRecipeRule>& rules);
// Throws naming `path` unless p is a valid layer pattern (see above).
void check_layer_pattern(const std::string& p, const std::string& path);

// The linear layers of a model config, in layer-id order, as the models name
// them (gpt.cpp, vit.cpp, moe.cpp; test_layer_recipes checks they agree).
struct LayerName {
  std::string name;
  bool fp32_router = false;  // an MoE router without quantize_router: FP32 whatever the recipe
};
std::vector<LayerName> linear_layer_names(const ModelConfig& m);

// A recipe as "recipe" accepts it (name, file, JSON text or object), with the
// config's layers.keep_high_precision added; errors are prefixed by `where`.
Recipe recipe_from_spec(const nlohmann::json& spec, const std::vector<std::string>& keep, const std::string& where);

// Every layer's recipe for one run.
struct LayerRecipes {
  std::vector<Recipe> recipes;      // [0]: config.recipe; [1 + i]: layer_recipes[i]'s
  std::vector<LayerName> layers;    // per layer id
  std::vector<int> choice;          // per layer id: index into recipes (the rule that matched, or 0)
  std::optional<Recipe> eval;       // eval_recipe, if set

  // The recipe each layer runs (index = layer id; nullptr: plain FP32, an
  // FP32 router) at training step `step` of `total_steps` (recipes with
  // switch_to switch at their own switch step); `store` keeps the switched
  // recipes the pointers may point to (one slot per recipe).
  std::vector<const Recipe*> training_table(uint64_t step, uint64_t total_steps,
                                            std::vector<std::optional<Recipe>>& store) const;
  // The evaluation's per-layer recipes: the eval recipe for every layer (the
  // routers' FP32 kept), or an empty vector when there is none (evaluation
  // runs the training table).
  std::vector<const Recipe*> eval_table() const;
  // The map summary.json and `fp4lab recipes layers` show: layer name ->
  // {"recipe": name, "hash": recipe_hash, "quantized": bool} of `table`.
  nlohmann::json map(const std::vector<const Recipe*>& table) const;
  // summary.json's "layer_recipes" (the map at the first step), "layer_recipes_final" (at the last of
  // total_steps, where a switch changed it) and "eval_layer_recipes" (with eval_recipe). Above 4096
  // layers a one-line note instead (~0.5 MB at 4096: the summary stays within compare's 1 MiB).
  void add_to_summary(nlohmann::json& summary, uint64_t total_steps) const;
  // The weights distributed.primary_weights stores in low precision (NVFP4 primary weights): the weight
  // parameters of the layers that their own recipe does not keep in high precision (tied weights excluded).
  std::vector<int> low_precision_weight_params(const std::vector<LinearLayerInfo>& layers) const;
};

// Resolves and checks config.layer_recipes and config.eval_recipe against the
// model's layers (the errors of the header comment, prefixed by `where`).
LayerRecipes resolve_layer_recipes(const RunConfig& c, const std::string& where = "config");
// resolve_layer_recipes' checks where either key is set (config_from_json); nothing otherwise.
void check_layer_recipes(const RunConfig& c, const std::string& where = "config");
// FNV-1a 64 of recipe_to_json(r).dump(), 16 hex digits.
std::string recipe_hash(const Recipe& r);
// The resolved recipes of the new keys, added to a resolved config (next to
// "recipe_resolved") so that config_hash covers what a rule's recipe file
// holds: "layer_recipes_resolved" (one recipe JSON a rule) and
// "eval_recipe_resolved", each only when its key is set (older runs' hashes
// stay as they were).
void add_resolved_layer_recipes(nlohmann::json& resolved, const RunConfig& c);

}  // namespace fp4lab::train
