#include "train/compare.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>

#include "train/checksum.hpp"
#include "train/process.hpp"
#include "train/run_files.hpp"
#include "core/error.hpp"
#include "core/json.hpp"

namespace fp4lab::train {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Limits of what a run archive may hold: far above what fp4lab writes (a
// summary.json of about 1 KB, metrics lines of a few hundred bytes, nesting of
// 2-3 levels), low enough that a hostile archive cannot exhaust memory or time.
constexpr uintmax_t kMaxSummaryBytes = uintmax_t(1) << 20;
constexpr size_t kMaxMetricsLine = size_t(1) << 20;
constexpr size_t kMaxText = 256;  // a string value (recipe, metric, status, ...) in bytes

// Text from a run archive or a path, ready for a table or an error line.
std::string shown(const std::string& s) { return terminal_text(s); }
std::string shown(const fs::path& p) { return terminal_text(p.string()); }

std::string f(double v, const char* fmt = "%.4f") {
  if (std::isnan(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}
std::string pad(const std::string& s, size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

// A JSON value as an error message shows it: scalars as written (a string
// shortened and escaped), containers by their kind only (never dumped: no
// recursion over a hostile nesting, no megabytes in a message).
std::string describe(const json& v) {
  if (v.is_string()) {
    const std::string& t = v.get_ref<const std::string&>();
    return "string \"" + shown(t.size() > 40 ? t.substr(0, 40) + "..." : t) + "\"";
  }
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_number()) return "number " + v.dump();
  return v.dump();  // true, false, null
}

// JSON text parsed with the nesting limited (core/json.hpp); errors name `where`
// (a file, or file:line) and are one line.
json parse_archive_json(const std::string& text, const std::string& where) {
  try {
    return parse_json(text, where);  // core/json.hpp: nesting at most kJsonMaxDepth levels
  } catch (const json::exception& e) {
    throw Error(where + ": invalid JSON: " + shown(json_error_text(e.what())));
  }
}

// A file of a run archive, open for reading and closed when it goes.
struct CloseFile {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using ArchiveFile = std::unique_ptr<std::FILE, CloseFile>;

// Opens p, which must be a regular file (not a FIFO, whose open would block, a
// device or a directory); role: what its absence means, for the error.
ArchiveFile open_archive_file(const fs::path& p, const char* role) {
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) throw_errno("compare: cannot read " + shown(p), ec.value());
  if (!fs::exists(st))
    throw Error("compare: " + shown(p) + " not found (" + role + ")");
  if (!fs::is_regular_file(st)) throw Error("compare: " + shown(p) + " is not a regular file");
  ArchiveFile fp(std::fopen(p.c_str(), "rb"));
  if (!fp) throw_errno("compare: cannot open " + shown(p), errno);
  return fp;
}

// A summary.json or metrics.jsonl record's keys, read with their types checked:
// a wrong type is an Error naming the file (or file:line) and the key.
class Fields {
 public:
  Fields(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) throw Error(where_ + ": expected a JSON object, got " + describe(j_));
  }
  const json* find(const char* key) const {
    const auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  // A string of at most kMaxText bytes; `dflt` if absent.
  std::string text(const char* key, const std::string& dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_string()) bad(key, "expected a string, got " + describe(*v));
    const std::string& t = v->get_ref<const std::string&>();
    if (t.size() > kMaxText)
      bad(key, "a string of " + std::to_string(t.size()) + " bytes (at most " + std::to_string(kMaxText) + ")");
    return t;
  }
  // A finite number; NaN if absent or null (fp4lab writes a NaN as null).
  double number(const char* key) const {
    const json* v = find(key);
    if (!v || v->is_null()) return std::nan("");
    if (!v->is_number()) bad(key, "expected a number or null, got " + describe(*v));
    const double x = v->get<double>();
    if (!std::isfinite(x)) bad(key, "not a finite number");
    return x;
  }
  // An integer in [lo, INT64_MAX]; nullopt if absent.
  std::optional<int64_t> integer(const char* key, int64_t lo) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())))
      bad(key, "expected an integer, got " + describe(*v));
    const int64_t x = v->get<int64_t>();
    if (x < lo) bad(key, "expected an integer >= " + std::to_string(lo) + ", got " + std::to_string(x));
    return x;
  }
  bool flag(const char* key, bool dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_boolean()) bad(key, "expected true or false, got " + describe(*v));
    return v->get<bool>();
  }
  [[noreturn]] void bad(const char* key, const std::string& what) const {
    throw Error(where_ + ": key \"" + key + "\": " + what);
  }

 private:
  const json& j_;
  std::string where_;
};

// What compare reads of a summary.json (run.cpp's Training::summary writes it).
struct Summary {
  std::string recipe, metric, status, item, config_hash;
  bool has_recipe = false, higher_is_better = false;
  std::optional<int64_t> seed;
  double final = 0, best = 0, final_train_loss = 0, ms_per_step = 0, items_per_s = 0;
  // "checksums": the files the summary was computed from (run.cpp's Training::finish), by name.
  std::vector<std::pair<std::string, FileSum>> checksums;
  std::vector<std::string> checksum_hex;  // the recorded CRC-32 of each, as written
};

// A metric name: what metrics.jsonl keys and the plot's label use.
bool metric_name(const std::string& m) {
  return !m.empty() && std::all_of(m.begin(), m.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
           c == '-';
  });
}

// summary.json of a run: at most kMaxSummaryBytes, an object whose known keys
// have their types (the keys compare does not use are checked too: a wrong
// type there means the file is not what fp4lab wrote); unknown keys are ignored.
Summary read_summary(const fs::path& p) {
  const ArchiveFile fp = open_archive_file(p, "not a run directory, or the run has not finished");
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, fp.get())) > 0) {
    text.append(buf, n);
    if (text.size() > kMaxSummaryBytes)
      throw Error("compare: " + shown(p) + ": larger than " + std::to_string(kMaxSummaryBytes >> 20) +
                  " MiB; not a summary fp4lab writes");
  }
  if (std::ferror(fp.get())) throw_errno("compare: cannot read " + shown(p), errno);
  const std::string where = "compare: " + shown(p);
  const json j = parse_archive_json(text, where);
  const Fields k(j, where);
  Summary s;
  s.has_recipe = k.find("recipe") != nullptr;
  s.recipe = k.text("recipe", "");
  s.metric = k.text("metric", "");
  if (!k.find("metric")) k.bad("metric", "missing (the run's evaluation metric, e.g. \"val_loss\")");
  if (!metric_name(s.metric))
    k.bad("metric", "\"" + shown(s.metric) + "\" is not a metric name (letters, digits, '_', '.', '-')");
  s.status = k.text("status", "?");
  s.item = k.text("item", "items");
  s.config_hash = k.text("config_hash", "");
  for (const char* key : {"name", "model", "backend", "error"}) k.text(key, "");
  s.higher_is_better = k.flag("higher_is_better", false);
  s.seed = k.integer("seed", std::numeric_limits<int64_t>::min());
  for (const char* key : {"steps", "total_steps", "params"}) k.integer(key, 0);
  s.final = k.number("final");
  s.best = k.number("best");
  s.final_train_loss = k.number("final_train_loss");
  s.ms_per_step = k.number("ms_per_step");
  s.items_per_s = k.number("items_per_s");
  k.number("wall_s");
  if (const json* c = k.find("checksums")) {
    if (!c->is_object()) k.bad("checksums", "is " + describe(*c) + ", expected an object");
    for (const char* file : {"config.json", "metrics.jsonl"}) {
      const auto it = c->find(file);
      if (it == c->end()) continue;
      const auto b = it->find("bytes"), h = it->find("crc32");
      if (!it->is_object() || b == it->end() || h == it->end() || !b->is_number_unsigned() || !h->is_string() ||
          h->get<std::string>().size() != 8)
        k.bad(("checksums." + std::string(file)).c_str(), "is not {\"bytes\": N, \"crc32\": \"8 hex digits\"}");
      s.checksums.push_back({file, FileSum{b->get<uint64_t>(), 0}});
      s.checksum_hex.push_back(h->get<std::string>());
    }
  }
  return s;
}

// The run's files against summary.json's checksums: a file changed or swapped since the run finished
// (files of two runs mixed, a metrics.jsonl edited) is an error naming it.
void check_run_files(const fs::path& dir, const Summary& s) {
  for (size_t i = 0; i < s.checksums.size(); ++i) {
    const fs::path f = dir / s.checksums[i].first;
    const FileSum now = file_crc32(f);
    if (now.bytes != s.checksums[i].second.bytes || crc_hex(now.crc) != s.checksum_hex[i])
      throw Error("compare: " + shown(f) + ": changed since the run finished (" + std::to_string(now.bytes) +
                  " bytes, CRC-32 " + crc_hex(now.crc) + "; summary.json records " +
                  std::to_string(s.checksums[i].second.bytes) + " bytes, " + shown(s.checksum_hex[i]) +
                  "): files of two runs mixed, or edited by hand");
  }
}

// (step, value) pairs in step order.
using Curve = std::vector<std::pair<double, double>>;

// metrics.jsonl of a run, read line by line with each line at most
// kMaxMetricsLine bytes: the training loss points (lines with a "loss") and the
// evaluation points (lines with "eval" and the metric). Every non-empty line is
// an object with an integer "step" >= 0; "loss" and the metric are numbers or
// null (null: no point). An invalid line anywhere is an error naming file:line
// (a finished run has no torn last line).
void read_metrics_curves(const fs::path& p, const std::string& metric, Curve& loss, Curve& eval) {
  const ArchiveFile fp = open_archive_file(p, "not a run directory");
  std::string line;
  int64_t lineno = 0;
  const auto take = [&] {
    ++lineno;
    if (line.empty()) return;
    const std::string where = "compare: " + shown(p) + ":" + std::to_string(lineno);
    const json j = parse_archive_json(line, where);
    const Fields k(j, where);
    const std::optional<int64_t> step = k.integer("step", 0);
    if (!step) k.bad("step", "missing");
    if (k.find("eval") && k.find(metric.c_str())) {
      const double v = k.number(metric.c_str());
      if (!std::isnan(v)) eval.emplace_back(double(*step), v);
    } else if (k.find("loss")) {
      const double v = k.number("loss");
      if (!std::isnan(v)) loss.emplace_back(double(*step), v);
    }
  };
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, fp.get())) > 0) {
    for (size_t at = 0; at < n;) {
      const char* nl = static_cast<const char*>(std::memchr(buf + at, '\n', n - at));
      const size_t len = nl ? size_t(nl - (buf + at)) : n - at;
      if (line.size() + len > kMaxMetricsLine)
        throw Error("compare: " + shown(p) + ":" + std::to_string(lineno + 1) + ": a line longer than " +
                    std::to_string(kMaxMetricsLine >> 20) + " MiB; not a metrics line fp4lab writes");
      line.append(buf + at, len);
      at += len;
      if (nl) take(), line.clear(), ++at;
    }
  }
  if (std::ferror(fp.get())) throw_errno("compare: cannot read " + shown(p), errno);
  take();  // a last line without '\n'
}

// A finished run: its directory (as given, without trailing '/'), recipe label
// (summary "recipe", else the directory's name), summary and raw curves.
struct Run {
  std::string dir, label;
  Summary summary;
  Curve loss, eval;
};

std::string name_of(const Run& r) { return fs::path(r.dir).filename().string(); }

Run load_run(const std::string& d) {
  Run r;
  r.dir = d;  // "runs/x/" names the run "x", like "runs/x"
  while (r.dir.size() > 1 && r.dir.back() == '/') r.dir.pop_back();
  std::error_code ec;
  if (!fs::is_directory(d, ec)) throw Error("compare: " + shown(d) + " is not a directory");
  r.summary = read_summary(fs::path(d) / "summary.json");
  check_run_files(fs::path(d), r.summary);
  read_metrics_curves(fs::path(d) / "metrics.jsonl", r.summary.metric, r.loss, r.eval);
  r.label = r.summary.has_recipe ? r.summary.recipe : name_of(r);
  return r;
}

// The metric every run reports (an error if they differ).
std::string common_metric(const std::vector<Run>& runs) {
  const std::string& metric = runs[0].summary.metric;
  for (const auto& r : runs)
    if (r.summary.metric != metric)
      throw Error("compare: " + shown(r.dir) + " reports metric \"" + r.summary.metric + "\" but " + shown(runs[0].dir) +
                  " reports \"" + metric + "\"; compare runs of one task");
  return metric;
}

// The reference of the gaps: the first run of the recipe `baseline` (empty:
// the first fp32/bf16 run, else the first run); its value is the mean final
// metric over all runs of that recipe (several seeds).
struct Baseline {
  std::string label;
  double final = 0.0;
};

Baseline find_baseline(const std::vector<Run>& runs, const std::string& baseline) {
  int base = -1;
  for (size_t i = 0; i < runs.size() && base < 0; ++i)
    if (baseline.empty() ? (runs[i].label == "fp32" || runs[i].label == "bf16") : runs[i].label == baseline)
      base = int(i);
  if (base < 0 && !baseline.empty()) throw Error("compare: no run with recipe \"" + shown(baseline) + "\"");
  if (base < 0) base = 0;
  Baseline b{runs[size_t(base)].label, 0.0};
  int nb = 0;
  for (const auto& r : runs)
    if (r.label == b.label && std::isfinite(r.summary.final)) b.final += r.summary.final, ++nb;
  b.final = nb ? b.final / nb : std::nan("");
  return b;
}

std::string signed_f(double v, const char* fm) {
  std::string s = f(v, fm);
  if (!std::isnan(v) && v >= 0) s.insert(s.begin(), '+');  // (not "+" + s: GCC 12's -Wrestrict false positive)
  return s;
}

// How the tables show the metric.
struct MetricFormat {
  std::string metric, title;  // title: "top-1 %" for test_acc
  const char* fmt;            // printf format of its values
  bool higher;
};

MetricFormat metric_format(const std::string& metric, bool higher) {
  const bool acc = metric == "test_acc";
  return MetricFormat{metric, acc ? "top-1 %" : metric, acc ? "%.2f" : "%.4f", higher};
}

// One line per run (and its numbers as out.rows), then which way is better.
void run_table(std::ostream& t, const std::vector<Run>& runs, const Baseline& base, const MetricFormat& mf,
               json& rows) {
  const char* fm = mf.fmt;
  // Column widths fit the longest run directory name and recipe label as shown (+2 spaces).
  size_t wrun = 34, wrec = 26;
  for (const auto& r : runs) {
    wrun = std::max(wrun, shown(name_of(r)).size() + 2);
    wrec = std::max(wrec, shown(r.label).size() + 2);
  }
  t << pad("run", wrun) << pad("recipe", wrec) << pad("status", 10) << pad("final " + mf.title, 16, true)
    << pad("best", 10, true) << pad("gap", 9, true) << pad("train loss", 12, true) << pad("ms/step", 10, true)
    << pad(shown(runs[0].summary.item) + "/s", 12, true) << "\n";
  for (const auto& r : runs) {
    const Summary& s = r.summary;
    const double gap = s.final - base.final;
    t << pad(shown(name_of(r)), wrun) << pad(shown(r.label), wrec) << pad(shown(s.status), 10)
      << pad(f(s.final, fm), 16, true) << pad(f(s.best, fm), 10, true)
      << pad(signed_f(gap, fm), 9, true)
      << pad(f(s.final_train_loss), 12, true) << pad(f(s.ms_per_step, "%.1f"), 10, true)
      << pad(f(s.items_per_s, "%.0f"), 12, true) << "\n";
    rows.push_back({{"dir", r.dir},
                    {"recipe", r.label},
                    {"status", s.status},
                    {"final", s.final},
                    {"best", s.best},
                    {"gap", gap},
                    {"ms_per_step", s.ms_per_step},
                    {"items_per_s", s.items_per_s}});
  }
  t << "(" << mf.title << ": " << (mf.higher ? "higher" : "lower") << " is better; gap = final - final of "
    << shown(base.label) << ")\n";
}

// Per recipe (in order of first appearance): the statistics of its finite
// final metrics, and the paired differences against the baseline recipe over
// the seeds both have (a run's seed: summary "seed", else its ordinal among
// the recipe's runs; the first run of a seed counts).
std::vector<RecipeStats> recipe_stats(const std::vector<Run>& runs, const std::string& baseline) {
  std::vector<std::string> order;
  std::map<std::string, std::map<int64_t, double>> by_seed;
  std::map<std::string, std::vector<double>> finals;
  std::map<std::string, int64_t> count;
  for (const auto& r : runs) {
    if (!count.count(r.label)) order.push_back(r.label);
    const int64_t seed = r.summary.seed ? *r.summary.seed : count[r.label];
    ++count[r.label];
    const double fin = r.summary.final;
    if (!std::isfinite(fin)) continue;
    finals[r.label].push_back(fin);
    by_seed[r.label].emplace(seed, fin);
  }
  const double nan = std::nan("");
  std::vector<RecipeStats> out;
  std::vector<double> p;  // the paired tests' p, NaN for the baseline (not a comparison)
  for (const auto& k : order) {
    RecipeStats rs;
    rs.recipe = k;
    rs.final = sample_stats(finals[k]);
    std::vector<double> d;
    for (const auto& [seed, v] : by_seed[k]) {
      const auto& b = by_seed[baseline];
      if (auto it = b.find(seed); it != b.end()) d.push_back(v - it->second);
    }
    rs.diff = sample_stats(d);
    if (k == baseline) {
      rs.test = {nan, nan, nan};
      rs.mde80 = nan;
      rs.welch = {nan, nan, nan, nan, nan, nan};
    } else {
      rs.test = paired_test(rs.diff);
      rs.mde80 = paired_mde(rs.diff.std, rs.diff.n);
      rs.pairs_needed = pairs_for_power(rs.diff.std, rs.diff.mean);
      rs.welch = welch_diff(finals[k], finals[baseline]);
    }
    p.push_back(rs.test.p);
    out.push_back(rs);
  }
  const std::vector<double> holm = holm_adjust(p);
  for (size_t i = 0; i < out.size(); ++i) out[i].p_holm = holm[i];
  return out;
}

std::string interval(double lo, double hi, const char* fm, bool sign = false) {
  if (std::isnan(lo) || std::isnan(hi)) return "-";
  return "[" + (sign ? signed_f(lo, fm) : f(lo, fm)) + ", " + (sign ? signed_f(hi, fm) : f(hi, fm)) + "]";
}

std::string p_text(double p) {
  if (std::isnan(p)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, p < 1e-4 ? "%.1e" : "%.4f", p);
  return b;
}

// The tests against the baseline (train/stats.hpp): Welch's unpaired
// difference with its 95% CI, the paired t test's p, Holm's adjusted p over
// the table's recipes (* where < 0.05), the smallest paired difference 80%
// power detects at these pairs, and the pairs 80% power needs at the observed
// difference.
void tests_table(std::ostream& t, const std::vector<RecipeStats>& stats, const Baseline& base, const MetricFormat& mf,
                 size_t wrec) {
  const char* fm = mf.fmt;
  t << "\n"
    << pad("tests vs " + shown(base.label), wrec) << pad("Welch diff [95% CI]", 34, true) << pad("df", 6, true)
    << pad("paired p", 10, true) << pad("Holm p", 10, true) << pad("MDE80", 9, true) << pad("pairs80", 8, true) << "\n";
  for (const auto& s : stats) {
    if (s.recipe == base.label) continue;
    const std::string welch =
        std::isnan(s.welch.lo) ? "-" : signed_f(s.welch.diff, fm) + " " + interval(s.welch.lo, s.welch.hi, fm, true);
    char df[16] = "-";
    if (!std::isnan(s.welch.df)) std::snprintf(df, sizeof df, "%.1f", s.welch.df);
    const std::string holm = p_text(s.p_holm) + (s.p_holm < 0.05 ? "*" : "");
    t << pad(shown(s.recipe), wrec) << pad(welch, 34, true) << pad(df, 6, true) << pad(p_text(s.test.p), 10, true)
      << pad(holm, 10, true) << pad(std::isnan(s.mde80) ? "-" : f(s.mde80, fm), 9, true)
      << pad(s.pairs_needed < 0 ? "-" : std::to_string(s.pairs_needed), 8, true) << "\n";
  }
  t << "(Welch: unpaired difference of the means, Welch-Satterthwaite df; paired p: two-sided paired t test over"
    << " shared seeds; Holm p: step-down adjusted over this table's recipes, * = significant at family-wise 0.05;"
    << " MDE80: the smallest true paired difference detected with 80% power at two-sided 0.05 with these pairs;"
    << " pairs80: the pairs that power needs at the observed mean difference and spread)\n";
}

// The per-recipe table (n, mean, sample std, 95% CI of the mean, gap of the
// mean, paired difference vs the baseline with its 95% CI and number of
// pairs); printed only when some recipe has several runs (seeds).
void recipe_table(std::ostream& t, const std::vector<Run>& runs, const std::vector<RecipeStats>& stats,
                  const Baseline& base, const MetricFormat& mf) {
  std::map<std::string, int> n_runs;
  bool multi = false;
  for (const auto& r : runs) multi |= ++n_runs[r.label] > 1;
  if (!multi) return;
  const char* fm = mf.fmt;
  size_t wrec = 26;
  for (const auto& s : stats) wrec = std::max(wrec, shown(s.recipe).size() + 2);
  t << "\n"
    << pad("recipe", wrec) << pad("n", 4, true) << pad("mean final", 12, true) << pad("std", 9, true)
    << pad("95% CI", 22, true) << pad("gap", 9, true) << pad("paired diff vs " + shown(base.label), 34, true)
    << pad("pairs", 6, true) << "\n";
  for (const auto& s : stats) {
    const double gap = s.final.mean - base.final;
    const std::string diff = s.recipe == base.label || s.diff.n == 0
                                 ? "-"
                                 : signed_f(s.diff.mean, fm) + " " + interval(s.diff.lo, s.diff.hi, fm, true);
    t << pad(shown(s.recipe), wrec) << pad(std::to_string(s.final.n), 4, true) << pad(f(s.final.mean, fm), 12, true)
      << pad(f(s.final.std, fm), 9, true) << pad(interval(s.final.lo, s.final.hi, fm), 22, true)
      << pad(std::isnan(gap) ? "-" : signed_f(gap, fm), 9, true) << pad(diff, 34, true)
      << pad(s.recipe == base.label ? "-" : std::to_string(s.diff.n), 6, true) << "\n";
  }
  t << "(n: runs with a final " << mf.title << "; std: sample std (n-1); 95% CI of the mean: Student's t, n-1 df;"
    << " paired diff: mean of (recipe - " << shown(base.label) << ") over shared seeds, paired-t 95% CI)\n";
  tests_table(t, stats, base, mf, wrec);
}

// A number, or null where it is not finite (JSON has no NaN).
json num_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json stats_json(const SampleStats& s) {
  return {{"n", s.n}, {"mean", s.mean}, {"std", s.std}, {"ci95", {s.lo, s.hi}}};
}

// Run r's curves: the training loss as a moving average over a window of ~2%
// of the points (single-step losses are noisy), and the evaluation metric;
// (step, value) pairs in step order.
std::pair<Curve, Curve> run_curves(const Run& run) {
  const Curve& pts = run.loss;
  Curve loss;
  const size_t w = std::max<size_t>(1, pts.size() / 50);
  double s = 0;
  for (size_t k = 0; k < pts.size(); ++k) {
    s += pts[k].second;
    if (k >= w) s -= pts[k - w].second;
    if (k + 1 >= w) loss.emplace_back(pts[k].first, s / double(w));
  }
  return {loss, run.eval};
}

// The band of seed_band as gnuplot data "step mean lo hi" into f; false if empty.
bool write_band(const std::vector<Curve>& curves, const fs::path& f) {
  const std::vector<BandPoint> band = seed_band(curves);
  std::ofstream o(f);
  for (const BandPoint& b : band) o << b.step << " " << b.mean << " " << b.lo << " " << b.hi << "\n";
  return !band.empty();
}

// The gnuplot script of the two panels (loss curves, evaluation metric), run
// in dir (where it writes the curve files). Its text is constants, numbers,
// the fixed file names below (loss_3.dat, band_eval_1.dat, plot.png) and
// gnuplot_string literals of the titles: nothing from a run archive or a path
// is script text. A recipe with several runs (seeds) is drawn as its mean curve
// with a band of +-1 sample standard deviation at the steps all its runs
// share; a recipe with one run as that run's curve.
std::string plot_script(const std::vector<Run>& runs, const MetricFormat& mf, const fs::path& dir,
                        const std::string& title) {
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size 1400,560 font ',10'\nset output 'plot.png'\n"
     << "set multiplot layout 1,2" << (title.empty() ? "" : " title " + gnuplot_string(title)) << "\nset grid\nset key top right\nset xlabel 'step'\n"
     << "set style fill transparent solid 0.2 noborder\n";
  std::vector<std::string> labels;  // recipes in order of first appearance
  std::map<std::string, std::vector<size_t>> members;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!members.count(runs[i].label)) labels.push_back(runs[i].label);
    members[runs[i].label].push_back(i);
  }
  std::vector<std::pair<Curve, Curve>> curves;
  for (const Run& r : runs) curves.push_back(run_curves(r));
  std::string loss_plot, eval_plot;
  auto add = [](std::string& plot, const std::string& term) { plot += (plot.empty() ? "" : ", ") + term; };
  int color = 0;
  for (const std::string& label : labels) {
    const std::vector<size_t>& idx = members[label];
    if (idx.size() == 1) {
      const size_t i = idx[0];
      const std::string lf = "loss_" + std::to_string(i) + ".dat", ef = "eval_" + std::to_string(i) + ".dat";
      std::ofstream l(dir / lf), e(dir / ef);
      for (const auto& [x, y] : curves[i].first) l << x << " " << y << "\n";
      for (const auto& [x, y] : curves[i].second) e << x << " " << y << "\n";
      const std::string title = gnuplot_string(label + " (" + name_of(runs[i]) + ")");
      add(loss_plot, "'" + lf + "' with lines lw 2 title " + title);
      if (!curves[i].second.empty()) add(eval_plot, "'" + ef + "' with linespoints lw 2 title " + title);
      continue;
    }
    ++color;
    const std::string lc = " lc " + std::to_string(color);
    const std::string title = gnuplot_string(label + " (" + std::to_string(idx.size()) + " runs: mean, band +-1 std)");
    std::vector<Curve> lcs, ecs;
    for (size_t i : idx) lcs.push_back(curves[i].first), ecs.push_back(curves[i].second);
    const std::string lf = "band_loss_" + std::to_string(color) + ".dat",
                      ef = "band_eval_" + std::to_string(color) + ".dat";
    if (write_band(lcs, dir / lf)) {
      add(loss_plot, "'" + lf + "' using 1:3:4 with filledcurves" + lc + " notitle");
      add(loss_plot, "'" + lf + "' using 1:2 with lines lw 2" + lc + " title " + title);
    }
    if (write_band(ecs, dir / ef)) {
      add(eval_plot, "'" + ef + "' using 1:3:4 with filledcurves" + lc + " notitle");
      add(eval_plot, "'" + ef + "' using 1:2 with linespoints lw 2" + lc + " title " + title);
    }
  }
  gp << "set title 'training loss (moving average)'\nset ylabel 'loss'\nplot " << loss_plot << "\n";
  if (!eval_plot.empty())
    gp << "set title " << gnuplot_string("evaluation: " + mf.title) << "\nset ylabel " << gnuplot_string(mf.title)
       << "\nplot " << eval_plot << "\n";
  gp << "unset multiplot\n";
  return gp.str();
}

// The forest plot's rows: the recipes (table order) with a paired-t interval vs the baseline.
std::vector<const RecipeStats*> forest_rows(const std::vector<RecipeStats>& stats, const Baseline& base) {
  std::vector<const RecipeStats*> rows;
  for (const auto& s : stats)
    if (s.recipe != base.label && s.diff.n >= 2 && std::isfinite(s.diff.lo)) rows.push_back(&s);
  return rows;
}

// The forest plot's script (data written into dir): one row per recipe, top to
// bottom, its mean paired difference vs the baseline and the paired-t 95% CI as
// a horizontal error bar, a dashed line at 0; recipe names only as
// gnuplot_string literals.
std::string forest_script(const std::vector<const RecipeStats*>& rows, const Baseline& base, const MetricFormat& mf,
                          const fs::path& dir, const std::string& title) {
  std::ofstream d(dir / "forest.dat");
  d.precision(17);
  std::string tics;
  for (size_t i = 0; i < rows.size(); ++i) {
    const RecipeStats& s = *rows[i];
    d << i + 1 << " " << s.diff.mean << " " << s.diff.lo << " " << s.diff.hi << "\n";
    const std::string label = s.recipe + (s.p_holm < 0.05 ? " *" : "") + " (n=" + std::to_string(s.diff.n) + ")";
    tics += (tics.empty() ? "" : ", ") + gnuplot_string(label) + " " + std::to_string(i + 1);
  }
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size 900," << 160 + 45 * rows.size() << " font ',10'\n"
     << "set output 'plot.png'\n"
     << "set title " << gnuplot_string(title.empty() ? "paired differences vs " + base.label : title) << "\n"
     << "set xlabel "
     << gnuplot_string(mf.title + " of recipe - " + base.label +
                       " over shared seeds: mean and paired-t 95% CI (* Holm-adjusted p < 0.05)")
     << "\n"
     << "set grid x\nset ytics (" << tics << ")\nset yrange [" << rows.size() + 0.5 << ":0.5]\n"
     << "set arrow from 0, graph 0 to 0, graph 1 nohead dt 2\n"
     << "plot 'forest.dat' using 2:1:3:4 with xerrorbars pt 7 ps 1.2 lw 2 notitle\n";
  return gp.str();
}

// Draws png from a gnuplot script (writing its data into the directory it is
// given) in a private temporary directory, then writes it atomically; false if
// gnuplot is not installed. Throws with gnuplot's message if it fails.
template <class Script>
bool draw_png(const fs::path& png, Script&& script) {
  const TempDir tmp("fp4lab_compare_");
  try {
    run_gnuplot(script(tmp.path()), tmp.path());
  } catch (const ProgramNotFound&) {
    return false;
  } catch (const EnvironmentError& e) {
    throw EnvironmentError("compare: drawing " + shown(png) + ": " + e.what());
  } catch (const Error& e) {
    throw Error("compare: drawing " + shown(png) + ": " + e.what());
  }
  std::ifstream in(tmp.path() / "plot.png", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty()) throw Error("compare: drawing " + shown(png) + ": gnuplot wrote no image");
  if (fs::path(png).has_parent_path()) fs::create_directories(fs::path(png).parent_path());
  write_atomic(png, bytes);
  return true;
}

// The runs of dirs, each directory once: a directory given again (the same
// path, or another path to it: ./x and x, a symbolic link) is one run and is
// loaded once, with a note. Two directories holding the same run (equal
// config_hash and seed: a copy, or the same config trained twice, which is one
// sample and would shrink the confidence intervals if counted twice) are an
// error naming both.
std::vector<Run> load_runs(const std::vector<std::string>& dirs, std::vector<std::string>& notes) {
  std::vector<Run> runs;
  std::map<fs::path, std::string> seen;  // canonical path -> the path given first
  for (const auto& d : dirs) {
    std::error_code ec;
    const fs::path c = fs::canonical(d, ec);
    if (ec) throw_errno("compare: " + shown(d), ec.value());
    if (auto it = seen.find(c); it != seen.end()) {
      notes.push_back("note: " + shown(d) + " is " + shown(it->second) + " again (the same directory); counted once");
      continue;
    }
    seen.emplace(c, d);
    runs.push_back(load_run(d));
  }
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t k = 0; k < i; ++k) {
      const Summary &a = runs[k].summary, &b = runs[i].summary;
      if (a.config_hash.empty() || a.config_hash != b.config_hash || a.seed != b.seed) continue;
      throw Error("compare: " + shown(runs[k].dir) + " and " + shown(runs[i].dir) + " hold the same run (config_hash " +
                  shown(a.config_hash) + (a.seed ? ", seed " + std::to_string(*a.seed) : std::string()) +
                  "): one configuration and seed is one sample; give only one of them");
    }
  return runs;
}

}  // namespace

std::vector<BandPoint> seed_band(const std::vector<std::vector<std::pair<double, double>>>& curves) {
  std::map<double, std::vector<double>> at;
  for (const auto& c : curves)
    for (const auto& [step, v] : c) at[step].push_back(v);
  std::vector<BandPoint> out;
  for (const auto& [step, vs] : at) {
    if (vs.size() != curves.size()) continue;
    double m = 0, q = 0;
    for (double v : vs) m += v;
    m /= double(vs.size());
    for (double v : vs) q += (v - m) * (v - m);
    const double sd = vs.size() > 1 ? std::sqrt(q / double(vs.size() - 1)) : 0.0;
    out.push_back({step, m, m - sd, m + sd});
  }
  return out;
}

CompareResult compare_runs(const std::vector<std::string>& dirs, const CompareOptions& opt) {
  if (dirs.empty()) throw Error("compare: give at least one run directory");
  std::vector<std::string> notes;
  const std::vector<Run> runs = load_runs(dirs, notes);
  const std::string metric = common_metric(runs);
  const MetricFormat mf = metric_format(metric, runs[0].summary.higher_is_better);
  const Baseline base = find_baseline(runs, opt.baseline);

  CompareResult out;
  out.rows = json::array();
  std::ostringstream t;
  run_table(t, runs, base, mf, out.rows);
  out.baseline = base.label;
  out.recipes = recipe_stats(runs, base.label);
  recipe_table(t, runs, out.recipes, base, mf);
  for (const std::string& n : notes) t << n << "\n";
  out.table = t.str();

  const fs::path png = opt.plot.empty() || opt.plot == "-" ? fs::path(runs[0].dir).parent_path() / "compare.png"
                                                           : fs::path(opt.plot);
  json js = {{"metric", metric},
             {"higher_is_better", mf.higher},
             {"baseline", base.label},
             {"runs", out.rows},
             {"recipes", json::array()}};
  for (const auto& s : out.recipes) {
    json d = stats_json(s.diff), tests = nullptr;
    if (s.recipe == base.label) {
      d = nullptr;
    } else {
      tests = {{"paired_t", num_or_null(s.test.t)},
               {"paired_df", num_or_null(s.test.df)},
               {"paired_p", num_or_null(s.test.p)},
               {"paired_p_holm", num_or_null(s.p_holm)},
               {"mde80", num_or_null(s.mde80)},
               {"pairs_for_80pct_power", s.pairs_needed < 0 ? json(nullptr) : json(s.pairs_needed)},
               {"welch_diff", num_or_null(s.welch.diff)},
               {"welch_se", num_or_null(s.welch.se)},
               {"welch_df", num_or_null(s.welch.df)},
               {"welch_ci95", {num_or_null(s.welch.lo), num_or_null(s.welch.hi)}},
               {"welch_p", num_or_null(s.welch.p)}};
    }
    js["recipes"].push_back({{"recipe", s.recipe},
                             {"final", stats_json(s.final)},
                             {"paired_diff_vs_baseline", d},
                             {"tests_vs_baseline", tests}});
  }
  out.stats = fs::path(png).replace_extension(".json").string();
  // A directory name that is not UTF-8 is written with U+FFFD in place of its bad bytes (JSON text is UTF-8).
  if (fs::path(out.stats).has_parent_path()) fs::create_directories(fs::path(out.stats).parent_path());
  write_atomic(out.stats, js.dump(2, ' ', false, json::error_handler_t::replace) + "\n");

  if (opt.plot == "-") return out;
  if (!draw_png(png, [&](const fs::path& dir) { return plot_script(runs, mf, dir, opt.title); })) {
    out.plot_note = "gnuplot not found (apt-get install gnuplot-nox); no plot drawn";
    return out;
  }
  out.plot = png.string();
  const fs::path forest = fs::path(png).replace_extension().string() + "_forest.png";
  const std::vector<const RecipeStats*> rows = forest_rows(out.recipes, base);
  if (!rows.empty() &&
      draw_png(forest, [&](const fs::path& dir) { return forest_script(rows, base, mf, dir, opt.title); }))
    out.forest = forest.string();
  return out;
}

}  // namespace fp4lab::train
