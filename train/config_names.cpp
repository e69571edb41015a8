// The run's recipe and directory names (config.hpp): resolve_recipe, recipe_label, run_directory.
#include <filesystem>
#include <string>

#include "train/config.hpp"

namespace fp4lab::train {

Recipe resolve_recipe(const RunConfig& c) {
  Recipe r = c.recipe.is_string() ? parse_recipe(c.recipe.get<std::string>()) : recipe_from_json(c.recipe, "recipe");
  for (const auto& p : c.keep_high_precision) r.keep_high_precision.push_back(p);
  return r;
}

std::string recipe_label(const RunConfig& c) {
  if (c.recipe.is_string()) {
    const std::string s = c.recipe.get<std::string>();
    if (!s.empty() && s.front() == '{') return resolve_recipe(c).name;
    if (s.find('/') != std::string::npos || s.ends_with(".json")) return std::filesystem::path(s).stem().string();
    return s;
  }
  if (c.recipe.contains("name") && c.recipe["name"].is_string()) return c.recipe["name"].get<std::string>();
  if (c.recipe.contains("extends") && c.recipe["extends"].is_string())
    return c.recipe["extends"].get<std::string>() + "_custom";
  return "custom";
}

std::string run_directory(const RunConfig& c) {
  // BF16 activations: "-bf16act" after the recipe, so that the fp32 run of a config has its own directory.
  const std::string act = c.activations == ActivationPrecision::bf16 ? "-bf16act" : "";
  const std::string n =
      c.output_name.empty() ? c.name + "-" + recipe_label(c) + act + "-s" + std::to_string(c.seed) : c.output_name;
  return (std::filesystem::path(c.output_dir) / n).string();
}

}  // namespace fp4lab::train
