// `fp4lab compare`'s reading of run archives (train/compare_archive.hpp).
#include "train/compare_archive.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "train/process.hpp"
#include "train/run_files.hpp"
#include "core/error.hpp"
#include "core/json.hpp"

namespace fp4lab::train::compare_archive {

using nlohmann::json;
namespace fs = std::filesystem;

std::string shown(const std::string& s) { return terminal_text(s); }
std::string shown(const fs::path& p) { return terminal_text(p.string()); }

namespace {

// Limits of what a run archive may hold: far above what fp4lab writes (a
// summary.json of about 1 KB, metrics lines of a few hundred bytes, nesting of
// 2-3 levels), low enough that a hostile archive cannot exhaust memory or time.
constexpr uintmax_t kMaxSummaryBytes = uintmax_t(1) << 20;
constexpr size_t kMaxMetricsLine = size_t(1) << 20;
constexpr size_t kMaxText = 256;  // a string value (recipe, metric, status, ...) in bytes

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

// A small JSON file of a run archive (summary.json, config.json): at most
// kMaxSummaryBytes, parsed with the nesting limited; role: what its absence
// means; noun: what fp4lab writes there, for the error.
json read_small_json(const fs::path& p, const char* role, const char* noun) {
  const ArchiveFile fp = open_archive_file(p, role);
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, fp.get())) > 0) {
    text.append(buf, n);
    if (text.size() > kMaxSummaryBytes)
      throw Error("compare: " + shown(p) + ": larger than " + std::to_string(kMaxSummaryBytes >> 20) +
                  " MiB; not a " + noun + " fp4lab writes");
  }
  if (std::ferror(fp.get())) throw_errno("compare: cannot read " + shown(p), errno);
  return parse_archive_json(text, "compare: " + shown(p));
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
  const std::string where = "compare: " + shown(p);
  const json j = read_small_json(p, "not a run directory, or the run has not finished", "summary");
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

Run load_run(const std::string& d) {
  Run r;
  r.dir = d;  // "runs/x/" names the run "x", like "runs/x"
  while (r.dir.size() > 1 && r.dir.back() == '/') r.dir.pop_back();
  std::error_code ec;
  if (!fs::is_directory(d, ec)) throw Error("compare: " + shown(d) + " is not a directory");
  r.summary = read_summary(fs::path(d) / "summary.json");
  check_run_files(fs::path(d), r.summary);
  read_metrics_curves(fs::path(d) / "metrics.jsonl", r.summary.metric, r.loss, r.eval);
  r.recipe = r.summary.has_recipe ? r.summary.recipe : name_of(r);
  r.label = r.recipe;
  return r;
}

// A dotted config key as --by takes it: components of letters, digits and '_'
// (at most 16 of them, 200 bytes in all) joined by '.'.
bool config_key(const std::string& k) {
  if (k.empty() || k.size() > 200 || k.front() == '.' || k.back() == '.' || k.find("..") != std::string::npos)
    return false;
  return std::count(k.begin(), k.end(), '.') < 16 && std::all_of(k.begin(), k.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
         });
}

// A scalar as an arm shows it: a string as is, a number as JSON writes it, true/false.
std::string scalar_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// The value of `key` (a config_key) in the config j read from `where`: nullopt if absent.
std::optional<std::string> key_value(const json& j, const std::string& key, const std::string& where) {
  const json* cur = &j;
  for (size_t start = 0;;) {
    const size_t dot = key.find('.', start);
    if (!cur->is_object())
      throw Error(where + ": key \"" + key + "\": \"" + key.substr(0, start - 1) + "\" is " + describe(*cur) +
                  ", not an object");
    const auto it = cur->find(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (it == cur->end()) return std::nullopt;
    cur = &*it;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (cur->is_string() && cur->get_ref<const std::string&>().size() > kMaxText)
    throw Error(where + ": key \"" + key + "\": a string of " +
                std::to_string(cur->get_ref<const std::string&>().size()) + " bytes (at most " +
                std::to_string(kMaxText) + ")");
  if (!cur->is_string() && !cur->is_number() && !cur->is_boolean())
    throw Error(where + ": key \"" + key + "\": " + describe(*cur) +
                "; --by takes keys whose values are strings, numbers or true/false (e.g. model.attention)");
  return scalar_text(*cur);
}

}  // namespace

std::string name_of(const Run& r) { return fs::path(r.dir).filename().string(); }

// The metric every run reports (an error if they differ).
std::string common_metric(const std::vector<Run>& runs) {
  const std::string& metric = runs[0].summary.metric;
  for (const auto& r : runs)
    if (r.summary.metric != metric)
      throw Error("compare: " + shown(r.dir) + " reports metric \"" + r.summary.metric + "\" but " + shown(runs[0].dir) +
                  " reports \"" + metric + "\"; compare runs of one task");
  return metric;
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

json archived_default(const std::string& key) {
  // config_to_json's defaults (DistributedConfig, MoeConfig, TrainingConfig, RunConfig), checked against it
  // by tests/train/test_compare_arms.cpp.
  static const std::map<std::string, json> defaults = {
      {"model.attention", "fp32"},
      {"model.moe.experts", 0},
      {"model.moe.dispatch", "dropless"},
      {"model.moe.dispatch_cast", "none"},
      {"precision.activations", "fp32"},
      {"training.loss_scale", 1.0},
      {"training.moments", "fp32"},
      {"distributed.zero", 0},
      {"distributed.primary_weights", "fp32"},
      {"distributed.shard_cast", true},
      {"distributed.expert_parallel", 1},
      {"distributed.reduce", "fp32"},
      {"distributed.timeout_s", 600.0},
      {"output.numerics_interval", 0},
  };
  const auto it = defaults.find(key);
  return it == defaults.end() ? json() : it->second;
}

void set_arms(std::vector<Run>& runs, const std::vector<std::string>& by) {
  for (Run& r : runs) r.label = r.recipe;
  if (by.empty()) return;
  for (size_t i = 0; i < by.size(); ++i) {
    if (!config_key(by[i]))
      throw Error("compare: --by \"" + shown(by[i]) +
                  "\": not a config key; valid: dotted names of letters, digits and '_' (e.g. model.attention, "
                  "precision.activations, training.lr) or recipe");
    if (std::find(by.begin(), by.begin() + long(i), by[i]) != by.begin() + long(i))
      throw Error("compare: --by \"" + shown(by[i]) + "\" given twice");
  }
  const bool need_config = std::any_of(by.begin(), by.end(), [](const std::string& k) { return k != "recipe"; });
  std::vector<bool> found(by.size(), false);  // some run's config has the key
  for (Run& r : runs) {
    json cfg;
    const fs::path p = fs::path(r.dir) / "config.json";
    if (need_config) cfg = read_small_json(p, "the run's config, which --by reads", "config");
    const std::string where = "compare: " + shown(p);
    if (need_config && !cfg.is_object()) throw Error(where + ": expected a JSON object, got " + describe(cfg));
    std::string label;
    for (size_t i = 0; i < by.size(); ++i) {
      std::optional<std::string> v;
      if (by[i] == "recipe") {
        v = r.recipe;
      } else if ((v = key_value(cfg, by[i], where))) {
        found[i] = true;
      } else {
        const json d = archived_default(by[i]);
        v = d.is_null() ? "missing" : scalar_text(d);
      }
      label += (i ? "," : "") + *v;
    }
    r.label = label;
  }
  for (size_t i = 0; i < by.size(); ++i)
    if (by[i] != "recipe" && !found[i] && archived_default(by[i]).is_null())
      throw Error("compare: --by \"" + shown(by[i]) +
                  "\": no run's config.json has this key; valid: a key of the runs' config.json (e.g. "
                  "model.attention, precision.activations, training.lr) or recipe");
}

void set_values(std::vector<Run>& runs, bool best) {
  for (Run& r : runs) {
    if (!best) {
      r.value = r.summary.final;
      continue;
    }
    const bool higher = r.summary.higher_is_better;
    double b = std::nan("");
    for (const auto& [step, v] : r.eval)
      if (std::isnan(b) || (higher ? v > b : v < b)) b = v;
    if (!std::isnan(b) && !std::isnan(r.summary.best) && b != r.summary.best) {
      const auto g = [](double x) {
        char t[32];
        std::snprintf(t, sizeof t, "%.17g", x);
        return std::string(t);
      };
      throw Error("compare: " + shown(r.dir) + ": summary.json's best " + g(r.summary.best) + " is not the best " +
                  r.summary.metric + " " + g(b) +
                  " of metrics.jsonl's evaluations (files of two runs mixed, or edited by hand)");
    }
    r.value = b;
  }
}

}  // namespace fp4lab::train::compare_archive
