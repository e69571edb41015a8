// Per-layer recipes and the evaluation recipe (layer_recipes.hpp).
#include "train/layer_recipes.hpp"

#include <cstdio>
#include <set>

#include "core/error.hpp"
#include "core/json.hpp"
#include "train/config.hpp"

namespace fp4lab::train {

using nlohmann::json;

namespace {

const char* kPatternForms =
    "valid: a layer name or a glob whose '*' matches any run of characters ('.' included), the whole name "
    "matching, of letters, digits, '_', '.', '-' and '*', e.g. \"lm_head\", \"h.3.*\", \"*.attn.*\"";

// "h.0.attn.c_attn, h.0.attn.c_proj, ..." (at most 40 names, then "and N more").
std::string name_list(const std::vector<LayerName>& layers) {
  std::string s;
  size_t shown = 0;
  for (const LayerName& l : layers) {
    if (shown == 40) break;
    s += (shown++ ? ", " : "") + l.name;
  }
  if (layers.size() > shown) s += " and " + std::to_string(layers.size() - shown) + " more";
  return s;
}

bool quantizes(const Recipe* r, const std::string& name) {
  LinearContext c;
  c.recipe = r;
  c.layer_name = name;
  if (!linear_is_quantized(c)) return false;
  for (const auto& q : r->operands)
    if (q) return true;
  return false;
}

}  // namespace

void check_layer_pattern(const std::string& p, const std::string& path) {
  if (p.empty()) throw Error(path + ": empty pattern; " + kPatternForms);
  for (unsigned char ch : p) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                    ch == '.' || ch == '-' || ch == '*';
    if (!ok) {
      std::string why = "the character '" + std::string(1, char(ch)) + "' is not a pattern character";
      if (ch == '?' || ch == '[' || ch == ']' || ch == '{' || ch == '}' || ch == '\\' || ch == '^' || ch == '$' ||
          ch == '|' || ch == '(' || ch == ')' || ch == '+')
        why += " (patterns are globs with '*' only, not regular expressions or full shell globs)";
      if (ch < 0x20 || ch >= 0x7f) why = "a control or non-ASCII character";
      throw Error(path + ": \"" + text_excerpt(p) + "\": " + why + "; " + kPatternForms);
    }
  }
  if (p.find("**") != std::string::npos)
    throw Error(path + ": \"" + text_excerpt(p) + "\": \"**\" is ambiguous here (one '*' already matches across '.'); " +
                kPatternForms);
}

std::vector<LayerRecipeRule> parse_layer_recipes(const json& j, const std::string& where) {
  const char* form = "expected an array of {\"layers\": PATTERN, \"recipe\": RECIPE} objects, e.g. "
                     "[{\"layers\": \"h.3.*\", \"recipe\": \"bf16\"}]";
  if (!j.is_array()) throw Error(where + ": " + json_excerpt(j) + ": " + form);
  std::vector<LayerRecipeRule> rules;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    const json& e = j[i];
    if (!e.is_object()) throw Error(at + ": " + json_excerpt(e) + ": " + form);
    for (auto it = e.begin(); it != e.end(); ++it)
      if (it.key() != "layers" && it.key() != "recipe")
        throw Error(at + "." + it.key() + ": unknown key; valid keys here: layers, recipe");
    if (!e.contains("layers")) throw Error(at + ".layers: missing (a layer-name pattern)");
    if (!e.contains("recipe")) throw Error(at + ".recipe: missing (a recipe name, file or inline object)");
    if (!e["layers"].is_string())
      throw Error(at + ".layers: " + json_excerpt(e["layers"]) + " has the wrong type; expected a string pattern");
    const json& r = e["recipe"];
    if (!r.is_string() && !r.is_object())
      throw Error(at + ".recipe: " + json_excerpt(r) +
                  ": expected a recipe name, a recipe file path or an inline recipe object");
    LayerRecipeRule rule{e["layers"].get<std::string>(), r};
    check_layer_pattern(rule.layers, at + ".layers");
    for (size_t k = 0; k < rules.size(); ++k)
      if (rules[k].layers == rule.layers)
        throw Error(at + ".layers: \"" + text_excerpt(rule.layers) + "\" repeats " + where + "[" + std::to_string(k) +
                    "].layers; the first match wins, so this rule would never apply: remove one");
    rules.push_back(std::move(rule));
  }
  return rules;
}

json layer_recipes_to_json(const std::vector<LayerRecipeRule>& rules) {
  json a = json::array();
  for (const auto& r : rules) a.push_back({{"layers", r.layers}, {"recipe", r.recipe}});
  return a;
}

std::vector<LayerName> linear_layer_names(const ModelConfig& m) {
  std::vector<LayerName> out;
  if (m.type == "vit") {
    out.push_back({"patch_embed"});
    for (int64_t i = 0; i < m.layers; ++i) {
      const std::string p = "blocks." + std::to_string(i) + ".";
      for (const char* n : {"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "ffn.up_proj", "ffn.down_proj"})
        out.push_back({p + n});
    }
    out.push_back({"head"});
    return out;
  }
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    out.push_back({p + "attn.c_attn"});
    out.push_back({p + "attn.c_proj"});
    if (m.moe.experts > 0) {
      out.push_back({p + "mlp.router", !m.moe.quantize_router});
      for (int64_t e = 0; e < m.moe.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        out.push_back({x + "c_fc"});
        out.push_back({x + "c_proj"});
      }
      if (m.moe.shared_expert) {
        out.push_back({p + "mlp.shared_expert.c_fc"});
        out.push_back({p + "mlp.shared_expert.c_proj"});
      }
    } else {
      out.push_back({p + "mlp.c_fc"});
      out.push_back({p + "mlp.c_proj"});
    }
  }
  out.push_back({"lm_head"});
  return out;
}

Recipe recipe_from_spec(const json& spec, const std::vector<std::string>& keep, const std::string& where) {
  Recipe r;
  try {
    r = spec.is_string() ? parse_recipe(spec.get<std::string>()) : recipe_from_json(spec, "recipe");
  } catch (const Error& e) {
    throw Error(where + ": " + e.what());
  }
  for (const auto& p : keep) r.keep_high_precision.push_back(p);
  return r;
}

std::string recipe_hash(const Recipe& r) { return fnv1a64_hex(recipe_to_json(r).dump()); }

LayerRecipes resolve_layer_recipes(const RunConfig& c, const std::string& where) {
  LayerRecipes out;
  out.recipes.push_back(resolve_recipe(c));
  out.layers = linear_layer_names(c.model);
  out.choice.assign(out.layers.size(), 0);
  std::vector<int> rule_of(out.layers.size(), -1);
  for (size_t i = 0; i < c.layer_recipes.size(); ++i) {
    const LayerRecipeRule& rule = c.layer_recipes[i];
    const std::string at = where + ".layer_recipes[" + std::to_string(i) + "]";
    check_layer_pattern(rule.layers, at + ".layers");
    out.recipes.push_back(recipe_from_spec(rule.recipe, c.keep_high_precision, at + ".recipe"));
    size_t matched = 0, taken = 0, routers = 0;
    int first_taker = -1;
    for (size_t l = 0; l < out.layers.size(); ++l) {
      if (!name_matches(rule.layers, out.layers[l].name)) continue;
      ++matched;
      if (rule_of[l] >= 0) {
        ++taken;
        if (first_taker < 0) first_taker = rule_of[l];
        continue;
      }
      if (out.layers[l].fp32_router) ++routers;
      rule_of[l] = int(i);
      out.choice[l] = int(i) + 1;
    }
    if (matched == 0)
      throw Error(at + ".layers: \"" + text_excerpt(rule.layers) + "\" matches no layer of this model; its layers: " +
                  name_list(out.layers));
    if (taken == matched)
      throw Error(at + ".layers: \"" + text_excerpt(rule.layers) + "\" matches only layers that " + where +
                  ".layer_recipes[" + std::to_string(first_taker) + "] (\"" +
                  text_excerpt(c.layer_recipes[size_t(first_taker)].layers) +
                  "\") already assigns; the first matching rule wins, so this one would never apply: put it first or "
                  "remove it");
    if (routers == matched - taken)
      throw Error(at + ".layers: \"" + text_excerpt(rule.layers) +
                  "\" matches only MoE routers, which run in FP32 whatever the recipe unless "
                  "model.moe.quantize_router is true");
  }
  if (!c.eval_recipe.is_null() && !c.eval_recipe.is_string() && !c.eval_recipe.is_object())
    throw Error(where + ".eval_recipe: " + json_excerpt(c.eval_recipe) +
                ": expected a recipe name, a recipe file path or an inline recipe object (null: the training recipes)");
  if (!c.eval_recipe.is_null()) {
    out.eval = recipe_from_spec(c.eval_recipe, c.keep_high_precision, where + ".eval_recipe");
    if (out.eval->switch_to)
      throw Error(where + ".eval_recipe: \"" + out.eval->name + "\" has switch_to (a training schedule); valid: a recipe " +
                  "without switch_to (the evaluation forward runs one recipe)");
  }
  return out;
}

void check_layer_recipes(const RunConfig& c, const std::string& where) {
  if (!c.layer_recipes.empty() || !c.eval_recipe.is_null()) resolve_layer_recipes(c, where);
}

std::vector<const Recipe*> LayerRecipes::training_table(uint64_t step, uint64_t total_steps,
                                                        std::vector<std::optional<Recipe>>& store) const {
  store.resize(recipes.size());
  std::vector<const Recipe*> now(recipes.size());
  for (size_t k = 0; k < recipes.size(); ++k) {
    now[k] = &recipes[k];
    if (recipes[k].switch_to && step >= switch_step(recipes[k], total_steps)) {
      if (!store[k]) store[k] = effective_recipe(recipes[k], total_steps - 1, total_steps);
      now[k] = &*store[k];
    }
  }
  std::vector<const Recipe*> t(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) t[l] = layers[l].fp32_router ? nullptr : now[size_t(choice[l])];
  return t;
}

std::vector<const Recipe*> LayerRecipes::eval_table() const {
  if (!eval) return {};
  std::vector<const Recipe*> t(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) t[l] = layers[l].fp32_router ? nullptr : &*eval;
  return t;
}

json LayerRecipes::map(const std::vector<const Recipe*>& table) const {
  json m = json::object();
  for (size_t l = 0; l < layers.size() && l < table.size(); ++l) {
    const Recipe* r = table[l];
    m[layers[l].name] = r ? json{{"recipe", r->name}, {"hash", recipe_hash(*r)}, {"quantized", quantizes(r, layers[l].name)}}
                          : json{{"recipe", "fp32"}, {"hash", nullptr}, {"quantized", false}};
  }
  return m;
}

void add_resolved_layer_recipes(json& resolved, const RunConfig& c) {
  if (c.layer_recipes.empty() && c.eval_recipe.is_null()) return;
  const LayerRecipes lr = resolve_layer_recipes(c);
  if (!c.layer_recipes.empty()) {
    json a = json::array();
    for (size_t k = 1; k < lr.recipes.size(); ++k) a.push_back(recipe_to_json(lr.recipes[k]));
    resolved["layer_recipes_resolved"] = a;
  }
  if (lr.eval) resolved["eval_recipe_resolved"] = recipe_to_json(*lr.eval);
}

void LayerRecipes::add_to_summary(nlohmann::json& s, uint64_t total_steps) const {
  if (layers.size() > 4096) {
    s["layer_recipes"] = std::to_string(layers.size()) +
                         " layers, too many to list here; `fp4lab recipes layers config.json` lists them";
    return;
  }
  std::vector<std::optional<Recipe>> store;
  s["layer_recipes"] = map(training_table(0, total_steps, store));
  const nlohmann::json last = map(training_table(total_steps - 1, total_steps, store));
  if (last != s["layer_recipes"]) s["layer_recipes_final"] = last;
  if (eval) s["eval_layer_recipes"] = map(eval_table());
}

std::vector<int> LayerRecipes::low_precision_weight_params(const std::vector<LinearLayerInfo>& infos) const {
  std::vector<int> nv;
  for (const LinearLayerInfo& l : infos)
    if (l.weight_param >= 0 && !recipes[size_t(choice.at(size_t(l.id)))].keeps_high_precision(l.name))
      nv.push_back(l.weight_param);
  return nv;
}

}  // namespace fp4lab::train
