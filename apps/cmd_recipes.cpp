// `fp4lab recipes list|show|export|layers` and `fp4lab bench linear`.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "core/error.hpp"
#include "train/config.hpp"
#include "train/cpu/linear.hpp"
#include "recipes/recipe.hpp"
#include "sim/block_rules.hpp"

namespace fp4lab {

namespace {

// "e2m1 x e2m1" for one GEMM's two operands ("-" = high precision).
std::string gemm_summary(const Recipe& r, Operand a, Operand b) {
  auto one = [&](Operand op) -> std::string {
    const auto& q = r.operand(op);
    if (!q) return r.high_precision == HighPrecision::bf16 ? "bf16" : "fp32";
    std::string s = quantizer_to_json(*q)["element"].get<std::string>();
    s += q->round == Round::rs ? "(SR)" : "";
    return s;
  };
  return one(a) + " x " + one(b);
}

void print_list() {
  std::printf("%-31s %-22s %-22s %-22s %s\n", "recipe", "forward (x, W)", "dgrad (dy, W)", "wgrad (dy, x)", "other");
  for (const auto& n : recipe_names()) {
    const Recipe r = recipe_by_name(n);
    std::string other;
    if (r.double_quantization) other += r.double_quantization_x ? "double-quant " : "double-quant(W) ";
    if (!r.forward_bias) other += "no-fwd-bias ";
    for (const auto& q : r.operands)
      if (q && block_rule_id(*q) == BlockRuleId::fp4tk) {
        other += "fp4tk ";
        break;
      }
    if (r.wgrad_rht) other += "wgrad-RHT ";
    if (r.dgrad_rht) other += "dgrad-RHT ";
    if ((r.wgrad_rht || r.dgrad_rht) && r.rht_kind != RhtKind::rht16)
      other += std::string(rht_kind_name(r.rht_kind)) + " ";
    if ((r.wgrad_rht || r.dgrad_rht) && r.rht_schedule == RhtSchedule::per_step) other += "per-step-signs ";
    if (r.high_precision == HighPrecision::bf16) other += "hp=bf16 ";
    if (!r.keep_high_precision.empty()) {
      other += "keep:";
      for (const auto& p : r.keep_high_precision) other += " " + p;
    }
    std::printf("%-31s %-22s %-22s %-22s %s\n", n.c_str(), gemm_summary(r, Operand::fwd_x, Operand::fwd_w).c_str(),
                gemm_summary(r, Operand::dgrad_grad_y, Operand::dgrad_w).c_str(),
                gemm_summary(r, Operand::wgrad_grad_y, Operand::wgrad_x).c_str(), other.c_str());
  }
  std::printf(
      "\n(SR) = stochastic rounding, otherwise round-to-nearest. `fp4lab recipes show NAME` lists every quantizer.\n");
}

// `fp4lab recipes layers CONFIG.json`: every linear layer of the config's model with the recipe it trains
// with (train/layer_recipes.hpp; the map summary.json records), and the evaluation's where eval_recipe sets one.
void print_layers(const std::string& path, const std::vector<std::string>& sets) {
  nlohmann::json j = train::read_json_file(path);
  if (!j.is_object()) throw Error(path + ": the config is " + std::string(j.type_name()) + ", expected a JSON object");
  for (const auto& s : sets) train::apply_set(j, s);
  const train::RunConfig c = train::config_from_json(j);
  const train::LayerRecipes lr = train::resolve_layer_recipes(c);
  const int64_t total = std::max<int64_t>(c.training.steps, 1);  // epochs: the switch steps are not known here
  std::vector<std::optional<Recipe>> store;
  const nlohmann::json first = lr.map(lr.training_table(0, uint64_t(total), store));
  const nlohmann::json eval = lr.eval ? lr.map(lr.eval_table()) : first;
  size_t w = 5;
  for (const auto& l : lr.layers) w = std::max(w, l.name.size() + 2);
  auto cell = [](const nlohmann::json& e) {
    std::string s = e["recipe"].get<std::string>();
    if (e["hash"].is_string()) s += " #" + e["hash"].get<std::string>().substr(0, 8);
    return s + (e["quantized"].get<bool>() ? "" : " (high precision)");
  };
  std::printf("%-4s %-*s %-18s %-40s %s\n", "id", int(w), "layer", "from", "training recipe", "evaluation recipe");
  for (size_t i = 0; i < lr.layers.size(); ++i) {
    const std::string& n = lr.layers[i].name;
    const std::string from = lr.layers[i].fp32_router ? "(FP32 router)"
                             : lr.choice[i] > 0     ? "layer_recipes[" + std::to_string(lr.choice[i] - 1) + "]"
                                                    : "recipe";
    std::printf("%-4zu %-*s %-18s %-40s %s\n", i, int(w), n.c_str(), from.c_str(), cell(first[n]).c_str(),
                lr.eval ? cell(eval[n]).c_str() : "(training's)");
  }
  std::printf(
      "\nThe first matching layer_recipes rule chooses a layer's recipe, the others run \"recipe\"; #hash: FNV-1a of "
      "the recipe's JSON (summary.json's layer_recipes map).\n");
}

// ---- fp4lab bench linear -------------------------------------------------------

struct BenchArgs {
  int64_t size = 4096;   // in = out features
  int64_t batch = 4096;  // rows of x
  int repeats = 2;
  std::vector<std::string> recipes = {"fp32", "mxfp8", "mx_baseline", "nvfp4"};
};

void run_bench_linear(const BenchArgs& a) {
  if (a.size <= 0 || a.batch <= 0) throw Error("--size and --batch must be positive");
  if (a.repeats <= 0) throw Error("--repeats must be positive, got " + std::to_string(a.repeats));
  std::vector<Recipe> recipes;
  for (const auto& n : a.recipes) recipes.push_back(parse_recipe(n));

  std::mt19937 g(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  MatrixRM x(a.batch, a.size), w(a.size, a.size), dy(a.batch, a.size);
  for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = d(g);
  for (int64_t i = 0; i < w.size(); ++i) w.data()[i] = 0.02f * d(g);
  for (int64_t i = 0; i < dy.size(); ++i) dy.data()[i] = 1e-4f * d(g);
  std::vector<float> bias(size_t(a.size), 0.01f), db(size_t(a.size));

  const double flops = 3.0 * 2.0 * double(a.batch) * double(a.size) * double(a.size);
  std::printf(
      "fp4lab bench linear: y = x W^T + b, x [%lld, %lld], W [%lld, %lld]; forward + backward (3 GEMMs, %.1f GFLOP)\n",
      (long long)a.batch, (long long)a.size, (long long)a.size, (long long)a.size, flops * 1e-9);
  std::printf(
      "CPU, %d OpenMP threads, best of %d; fake quantization (quantize + dequantize to FP32) + FP32 Eigen GEMMs\n\n",
      omp_get_max_threads(), a.repeats);
  std::printf("%-31s %12s %10s %14s\n", "recipe", "fwd+bwd ms", "GFLOP/s", "overhead vs fp32");

  double t_fp32 = -1;
  std::vector<double> times;
  for (const Recipe& r : recipes) {
    LinearContext ctx{&r, 1, 0, 0};
    double best = 1e300;
    for (int rep = 0; rep < a.repeats; ++rep) {
      ctx.step = uint64_t(rep);
      MatrixRM y, dx, dw;
      LinearSaved saved;
      const auto t0 = std::chrono::steady_clock::now();
      linear_forward(ctx, x, w, bias.data(), y, saved);
      linear_backward(ctx, saved, w, dy, dx, dw, db.data());
      const auto t1 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    }
    if (r.name == "fp32" && t_fp32 < 0) t_fp32 = best;
    times.push_back(best);
    std::string over = "-";
    if (t_fp32 > 0 && r.name != "fp32") {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%+.1f%%", 100.0 * (best - t_fp32) / t_fp32);
      over = buf;
    }
    std::printf("%-31s %12.1f %10.1f %14s\n", r.name.c_str(), best * 1e3, flops / best * 1e-9, over.c_str());
    std::fflush(stdout);
  }
  if (t_fp32 < 0)
    std::printf("\n(no fp32 run in --recipes, so no overhead column)\n");
  else
    std::printf("\noverhead = (t_recipe - t_fp32) / t_fp32, both measured in this run; target <= +30%%\n");
}

void register_recipe_layers(CLI::App& rec) {
  auto path = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  CLI::App* l = rec.add_subcommand(
      "layers",
      "List a training config's linear layers and the recipe each one runs (config keys recipe, layer_recipes,\n"
      "eval_recipe and layers.keep_high_precision), as summary.json's layer_recipes map records it.");
  l->add_option("CONFIG", *path, "An experiment config (configs/*.json)")->required();
  l->add_option("--set", *sets, "Override a config key, key=value (dotted keys; repeatable)");
  l->callback([path, sets] { print_layers(*path, *sets); });
}

}  // namespace

void register_recipe_commands(CLI::App& app) {
  CLI::App* rec = app.add_subcommand(
      "recipes",
      "Training recipes: which quantizer each of the six GEMM operands of a linear layer uses\n"
      "(fwd_x, fwd_w for y = x W^T; dgrad_grad_y, dgrad_w for dx = dy W; wgrad_grad_y, wgrad_x for dW = dy^T x).");
  rec->require_subcommand(1);

  rec->add_subcommand("list", "List the canned recipes with the element format of each GEMM's operands")->callback([] {
    print_list();
  });

  auto show_name = std::make_shared<std::string>();
  CLI::App* show = rec->add_subcommand(
      "show",
      "Print every operand's quantizer (Q0..Q5, as fp4-trainkit lists them: element, block [rows,cols] in the\n"
      "operand's own layout, scale format, scale rule, rounding, overflow) and the recipe's other fields.");
  show->add_option("NAME", *show_name, "A canned recipe name (see `fp4lab recipes list`), a JSON file, or JSON text")
      ->required();
  show->callback([show_name] { std::fputs(describe(parse_recipe(*show_name)).c_str(), stdout); });

  auto export_name = std::make_shared<std::string>();
  CLI::App* exp = rec->add_subcommand(
      "export",
      "Write a recipe as JSON to stdout (every field explicit). Edit it, or write a smaller file with\n"
      "{\"extends\": \"nvfp4\", ...overrides}, and pass the file wherever a recipe name is accepted.");
  exp->add_option("NAME", *export_name, "A canned recipe name, a JSON file, or JSON text")->required();
  exp->callback([export_name] { std::printf("%s\n", recipe_to_json(parse_recipe(*export_name)).dump(2).c_str()); });
  register_recipe_layers(*rec);
}

void register_bench_linear(CLI::App& bench) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* b = bench.add_subcommand(
      "linear",
      "Forward + backward wall time of one linear layer (CPU, all OpenMP threads) per recipe, and each recipe's\n"
      "overhead over fp32 measured in the same run. Default: 4096x4096 weights, 4096-row batch (slow on few cores;\n"
      "use --size/--batch for a quick run).");
  b->add_option("--size", args->size, "in_features = out_features")->capture_default_str();
  b->add_option("--batch", args->batch, "Rows of x")->capture_default_str();
  b->add_option("--repeats", args->repeats, "Runs per recipe; the fastest is reported")->capture_default_str();
  b->add_option("--recipes", args->recipes,
                "Recipes to time (names or JSON files); include fp32 for the overhead column")
      ->delimiter(',')
      ->capture_default_str();
  b->callback([args] { run_bench_linear(*args); });
}

}  // namespace fp4lab
