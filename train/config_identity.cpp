// The run's identity (config.hpp): run_identity, config_hash, config_difference.
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.hpp"
#include "train/config.hpp"

namespace fp4lab::train {

using nlohmann::json;

json run_identity(json resolved, bool data_loaded) {
  resolved.erase("threads");
  resolved.erase("output");
  if (auto d = resolved.find("distributed"); d != resolved.end()) {  // timeout_s, prefetch: how, not what
    d->erase("timeout_s");
    d->erase("prefetch");  // the same bits either way (sharded_params.hpp)
    if (d->empty()) resolved.erase(d);
  }
  if (auto m = resolved.find("model"); m != resolved.end() && m->is_object()) {
    if (!data_loaded) m->erase("vocab_size");
    // model.attention "fp32" is the attention of runs written before the key was (config_to_json): the
    // same identity (and config_hash) with or without it.
    if (auto a = m->find("attention"); a != m->end() && *a == "fp32") m->erase(a);
  }
  return resolved;
}

namespace {

// "key old -> new" for each leaf where a and b differ (objects are walked, the rest compared whole).
void json_diff(const json& a, const json& b, const std::string& path, std::vector<std::string>& out) {
  if (a.is_object() && b.is_object()) {
    for (auto it = a.begin(); it != a.end(); ++it)
      json_diff(it.value(), b.contains(it.key()) ? b[it.key()] : json(), path + (path.empty() ? "" : ".") + it.key(),
                out);
    for (auto it = b.begin(); it != b.end(); ++it)
      if (!a.contains(it.key())) json_diff(json(), it.value(), path + (path.empty() ? "" : ".") + it.key(), out);
  } else if (a != b) {
    out.push_back(path + " " + (a.is_null() ? "(absent)" : json_excerpt(a)) + " -> " +
                  (b.is_null() ? "(absent)" : json_excerpt(b)));
  }
}

}  // namespace

std::string config_difference(json saved, json resolved) {
  std::vector<std::string> d;
  const json rs = saved.value("recipe_resolved", json()), rr = resolved.value("recipe_resolved", json());
  saved.erase("recipe_resolved"), resolved.erase("recipe_resolved");
  json_diff(saved, resolved, "", d);
  if (d.empty()) json_diff(rs, rr, "recipe_resolved", d);
  std::string s;
  for (size_t i = 0; i < d.size() && i < 5; ++i) s += (i ? ", " : "") + d[i];
  if (d.size() > 5) s += " and " + std::to_string(d.size() - 5) + " more";
  return s;
}

std::string fnv1a64_hex(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64: offset basis, then xor and multiply by the FNV prime
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", (unsigned long long)h);
  return b;
}

std::string config_hash(const json& resolved) { return fnv1a64_hex(run_identity(resolved).dump()); }

}  // namespace fp4lab::train
