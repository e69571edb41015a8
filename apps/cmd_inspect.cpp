// `fp4lab inspect RUN_DIR`: the numerics statistics of a run (numerics.jsonl,
// written with output.numerics_interval; definitions in train/numerics.hpp and
// docs/DESIGN.md, "Numerics statistics") as layer x operand tables of one step,
// and a layer x step heatmap PNG of one statistic (gnuplot, through
// train/process.hpp: no shell, a script of constants and escaped titles).
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/commands.hpp"
#include "core/error.hpp"
#include "recipes/recipe.hpp"
#include "train/numerics.hpp"
#include "train/process.hpp"
#include "train/run.hpp"
#include "train/run_files.hpp"

namespace fp4lab {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct InspectArgs {
  std::string dir, stat, operand, heatmap;
  int64_t step = -1;
};

struct Record {
  int64_t step;
  uint64_t layer_id;
  std::string layer;
  int op;
  json j;
};

bool known_stat(const std::string& s) {
  for (const auto& [n, _] : train::numerics_stat_names())
    if (n == s) return true;
  return false;
}

std::string stat_list() {
  std::string s;
  for (const auto& [n, _] : train::numerics_stat_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// The value of stat in a record: NaN when absent or null (not measured, not
// applicable, or exact for sqnr_db).
double value_of(const json& j, const std::string& stat) {
  if (!j.contains(stat) || !j[stat].is_number()) return std::nan("");
  return j[stat].get<double>();
}

std::string cell(const json& j, const std::string& stat) {
  if (stat != "amax" && j.value("quantizer", json(nullptr)).is_null()) return "hp";
  if (stat == "sqnr_db" && j.contains("sqnr_db") && j["sqnr_db"].is_null() && j.value("elements", 0) > 0)
    return "exact";
  const double v = value_of(j, stat);
  if (std::isnan(v)) return "-";
  char b[32];
  if (stat == "amax" || stat == "mean_error")
    std::snprintf(b, sizeof b, "%.3g", v);
  else if (stat == "sqnr_db")
    std::snprintf(b, sizeof b, "%.2f", v);
  else
    std::snprintf(b, sizeof b, "%.4f", v);
  return b;
}

std::vector<Record> load(const fs::path& dir) {
  const fs::path p = dir / "numerics.jsonl";
  if (!fs::exists(p))
    throw Error(p.string() + " does not exist: train with --set output.numerics_interval=N (N > 0) to write it");
  std::string torn;
  std::vector<json> lines = train::read_metrics(p.string(), &torn);
  if (!torn.empty()) std::fprintf(stderr, "warning: %s\n", train::terminal_text(torn).c_str());
  std::vector<Record> out;
  for (json& l : lines) {
    if (!l.is_object() || !l.contains("step") || !l.contains("layer") || !l.contains("operand")) continue;
    out.push_back(Record{l["step"].get<int64_t>(), l.value("layer_id", uint64_t(0)), l["layer"].get<std::string>(),
                         int(operand_by_name(l["operand"].get<std::string>())), std::move(l)});
  }
  if (out.empty()) throw Error(p.string() + " holds no statistics yet");
  return out;
}

// Layers in id order, each once.
std::vector<std::pair<uint64_t, std::string>> layers_of(const std::vector<Record>& rs) {
  std::map<uint64_t, std::string> m;
  for (const Record& r : rs) m.emplace(r.layer_id, r.layer);
  return {m.begin(), m.end()};
}

void print_table(const std::vector<Record>& rs, int64_t step, const std::string& stat, const std::vector<int>& ops) {
  std::printf("%s at step %" PRId64 "  (%s)\n", stat.c_str(), step, [&] {
    for (const auto& [n, d] : train::numerics_stat_names())
      if (n == stat) return d.c_str();
    return "";
  }());
  size_t w = 5;
  const auto layers = layers_of(rs);
  for (const auto& [id, name] : layers) w = std::max(w, train::terminal_text(name).size());
  std::printf("%-*s", int(w), "layer");
  for (int op : ops) std::printf("  %12s", operand_name(Operand(op)));
  std::printf("\n");
  for (const auto& [id, name] : layers) {
    std::printf("%-*s", int(w), train::terminal_text(name).c_str());
    for (int op : ops) {
      std::string c = "";
      for (const Record& r : rs)
        if (r.step == step && r.layer_id == id && r.op == op) c = cell(r.j, stat);
      std::printf("  %12s", c.empty() ? "." : c.c_str());
    }
    std::printf("\n");
  }
}

// The heatmap: rows = layers (x operands when more than one), columns = steps.
void draw_heatmap(const std::vector<Record>& rs, const std::string& stat, const std::vector<int>& ops,
                  const fs::path& run, const fs::path& png) {
  std::set<int64_t> steps_set;
  for (const Record& r : rs) steps_set.insert(r.step);
  const std::vector<int64_t> steps(steps_set.begin(), steps_set.end());
  std::vector<std::pair<uint64_t, int>> rows;
  std::vector<std::string> labels;
  for (const auto& [id, name] : layers_of(rs))
    for (int op : ops) {
      rows.emplace_back(id, op);
      labels.push_back(ops.size() > 1 ? name + " " + operand_name(Operand(op)) : name);
    }
  std::map<std::tuple<int64_t, uint64_t, int>, double> val;
  for (const Record& r : rs) val[{r.step, r.layer_id, r.op}] = value_of(r.j, stat);
  const train::TempDir tmp("fp4lab_inspect_");
  {
    std::ofstream d(tmp.path() / "heat.dat");
    for (const auto& [id, op] : rows) {
      for (size_t k = 0; k < steps.size(); ++k) {
        const auto it = val.find({steps[k], id, op});
        const double v = it == val.end() ? std::nan("") : it->second;
        char b[40];
        std::snprintf(b, sizeof b, "%s%.9g", k ? " " : "", v);
        d << (std::isnan(v) ? std::string(k ? " NaN" : "NaN") : std::string(b));
      }
      d << "\n";
    }
    if (!d) throw EnvironmentError("inspect: cannot write the heatmap's data in " + tmp.path().string());
  }
  const bool fraction = stat != "sqnr_db" && stat != "amax" && stat != "mean_error";
  const int height = std::clamp(int(rows.size()) * 16 + 160, 300, 4000);
  const int width = std::clamp(int(steps.size()) * 12 + 500, 700, 4000);
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size " << width << "," << height << " font ',9'\nset output 'heatmap.png'\n"
     << "set title " << train::gnuplot_string(run.filename().string() + ": " + stat) << "\n"
     << "set xlabel 'step'\nunset key\nset palette defined (0 '#000004', 1 '#3b0f70', 2 '#8c2981', 3 '#de4968', 4 '#fe9f6d', 5 '#fcfdbf')\n"
     << "set xrange [-0.5:" << double(steps.size()) - 0.5 << "]\nset yrange [" << double(rows.size()) - 0.5
     << ":-0.5]\n"
     << (fraction ? "set cbrange [0:1]\n" : "") << "set cblabel " << train::gnuplot_string(stat) << "\n";
  gp << "set ytics (";
  for (size_t i = 0; i < labels.size(); ++i) gp << (i ? ", " : "") << train::gnuplot_string(labels[i]) << " " << i;
  gp << ")\nset xtics rotate by 45 right (";
  const size_t every = std::max<size_t>(1, steps.size() / 30);
  for (size_t k = 0, n = 0; k < steps.size(); k += every, ++n) gp << (n ? ", " : "") << "'" << steps[k] << "' " << k;
  gp << ")\nplot 'heat.dat' matrix with image\n";
  try {
    train::run_gnuplot(gp.str(), tmp.path());
  } catch (const train::ProgramNotFound&) {
    std::printf("gnuplot not found (apt-get install gnuplot-nox); no heatmap drawn\n");
    return;
  }
  std::ifstream in(tmp.path() / "heatmap.png", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty()) throw Error("inspect: gnuplot wrote no image");
  train::write_atomic(png, bytes);
  std::printf("heatmap of %s (%zu rows x %zu steps): %s\n", stat.c_str(), rows.size(), steps.size(),
              train::terminal_text(png.string()).c_str());
}

void run_inspect(const InspectArgs& a) {
  if (!a.stat.empty() && !known_stat(a.stat))
    throw Error("--stat " + a.stat + ": unknown statistic; valid: " + stat_list());
  std::vector<int> ops;
  if (!a.operand.empty())
    ops.push_back(int(operand_by_name(a.operand)));
  else
    for (int k = 0; k < kOperandCount; ++k) ops.push_back(k);
  const std::vector<Record> rs = load(a.dir);
  int64_t step = a.step;
  if (step < 0) {
    for (const Record& r : rs) step = std::max(step, r.step);
  } else if (std::none_of(rs.begin(), rs.end(), [&](const Record& r) { return r.step == step; })) {
    std::string have;
    std::set<int64_t> s;
    for (const Record& r : rs) s.insert(r.step);
    for (int64_t v : s) have += (have.empty() ? "" : ", ") + std::to_string(v);
    throw Error("--step " + std::to_string(step) + ": no statistics at that step; the run has steps " + have);
  }
  std::vector<std::string> stats;
  if (!a.stat.empty())
    stats.push_back(a.stat);
  else
    for (const auto& [n, _] : train::numerics_stat_names()) stats.push_back(n);
  for (size_t i = 0; i < stats.size(); ++i) {
    if (i) std::printf("\n");
    print_table(rs, step, stats[i], ops);
  }
  if (!a.heatmap.empty()) draw_heatmap(rs, a.stat.empty() ? "scale_floor" : a.stat, ops, fs::path(a.dir), a.heatmap);
}

}  // namespace

void register_inspect_commands(CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  CLI::App* c = app.add_subcommand("inspect", "Per-layer quantization statistics of a run (numerics.jsonl): tables, heatmap");
  c->add_option("run_dir", a->dir, "Run directory (trained with output.numerics_interval > 0)")
      ->required()
      ->check(CLI::ExistingDirectory);
  c->add_option("--step", a->step, "The step of the tables (default: the last measured)");
  c->add_option("--stat", a->stat, "One statistic (default: every one in the tables, scale_floor in the heatmap)");
  c->add_option("--operand", a->operand,
                "One operand: fwd_x, fwd_w, dgrad_grad_y, dgrad_w, wgrad_grad_y, wgrad_x (default: all six)");
  c->add_option("--heatmap", a->heatmap, "Draw a layer x step heatmap of the statistic into this PNG (gnuplot)");
  std::string foot =
      "Every output.numerics_interval steps a run measures each linear layer's six GEMM operands, each\n"
      "against its quantizer input (after double quantization and the wgrad RHT: RHT operands count in\n"
      "the RHT domain). Statistics (docs/DESIGN.md, \"Numerics statistics\"; train/numerics.hpp):\n";
  for (const auto& [n, d] : train::numerics_stat_names()) foot += "  " + n + std::string(13 - n.size(), ' ') + d + "\n";
  foot +=
      "Cells: 'hp' = operand in high precision (no quantizer: only amax is measured), '-' = not applicable\n"
      "(scale_floor/ceil of float32 scales, mean_error of round-to-nearest operands), 'exact' = sqnr of an\n"
      "error-free operand, '.' = not measured at that step.\n"
      "Heatmap: one row per layer (per layer and operand without --operand), one column per measured step,\n"
      "colour = the statistic (fractions on a fixed 0..1 scale; blank = not applicable). A gradient operand\n"
      "(dgrad_grad_y, wgrad_grad_y) whose scale_floor row turns bright is collapsing: its blocks' scales sit\n"
      "at the format's smallest value and its small values flush to zero.\n"
      "Example: fp4lab inspect runs/vit_mnist-fp4tk_fp4_all_the_way-s1 --stat scale_floor --operand wgrad_grad_y\n"
      "         --heatmap floor.png";
  c->footer(foot);
  c->callback([a] { run_inspect(*a); });
}

}  // namespace fp4lab
