// Deterministic input fuzzing for the readers of user files (.npy, config and
// recipe JSON, MNIST IDX): a seed-indexed mutation of a valid input, and the
// classification of what the reader did with it.
//
// Contract checked (issue "runs and outputs that are never lost, stale or
// silently wrong"): every mutated input gives either a valid result or a clean
// error, an fp4lab::Error with a one-line, non-empty message; never another
// exception type, never a crash (run under -DFP4LAB_SANITIZE=ON to catch memory
// errors and undefined behaviour as crashes).
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace fp4lab::test {

// Byte-level mutation number `k` of `s`: bit flips, special bytes, deletions,
// duplications, truncation, insertions, and digit runs made huge or negative.
inline std::string mutate_bytes(const std::string& s, uint32_t k) {
  std::mt19937 g(k * 2654435761u + 17);
  std::string m = s;
  auto pos = [&](size_t n) { return n == 0 ? size_t(0) : size_t(g() % n); };
  const int edits = 1 + int(g() % 3);
  for (int e = 0; e < edits; ++e) {
    switch (g() % 8) {
      case 0:
        if (!m.empty()) m[pos(m.size())] ^= char(1u << (g() % 8));
        break;
      case 1: {
        const char special[] = {'\0', '\xFF', '\x7F', '\x80', '9', ',', ')', '('};
        if (!m.empty()) m[pos(m.size())] = special[g() % 8];
        break;
      }
      case 2:
        if (!m.empty()) {
          const size_t a = pos(m.size());
          m.erase(a, 1 + pos(16));
        }
        break;
      case 3:
        if (!m.empty()) {
          const size_t a = pos(m.size());
          m.insert(a, m.substr(a, 1 + pos(32)));
        }
        break;
      case 4: m.resize(pos(m.size() + 1)); break;
      case 5: {
        std::string junk(1 + pos(8), '\0');
        for (char& c : junk) c = char(g());
        m.insert(pos(m.size() + 1), junk);
        break;
      }
      case 6:
      case 7: {  // a run of digits becomes huge, negative or fractional
        const size_t a = m.find_first_of("0123456789", pos(m.size()));
        if (a == std::string::npos) break;
        const size_t b = m.find_first_not_of("0123456789", a);
        const char* repl[] = {"99999999999999999999", "-1", "4611686018427387904", "1e30", "0", "1.5", "2**62",
                              "18446744073709551616"};
        m.replace(a, (b == std::string::npos ? m.size() : b) - a, repl[g() % 8]);
        break;
      }
    }
  }
  return m;
}

// Structure-aware mutation number `k` of a JSON document: one value replaced
// by another type or an extreme, one key dropped, renamed or misspelled.
inline nlohmann::json mutate_json(nlohmann::json j, uint32_t k) {
  std::mt19937 g(k * 40503u + 3);
  // Collect the paths of every value.
  std::vector<nlohmann::json::json_pointer> paths;
  std::function<void(const nlohmann::json&, const nlohmann::json::json_pointer&)> walk =
      [&](const nlohmann::json& v, const nlohmann::json::json_pointer& p) {
        if (!p.empty()) paths.push_back(p);
        if (v.is_object())
          for (auto it = v.begin(); it != v.end(); ++it) walk(it.value(), p / it.key());
        if (v.is_array())
          for (size_t i = 0; i < v.size(); ++i) walk(v[i], p / i);
      };
  walk(j, nlohmann::json::json_pointer());
  if (paths.empty()) return j;
  const nlohmann::json::json_pointer p = paths[g() % paths.size()];
  const nlohmann::json replacements[] = {nullptr,
                                         "text",
                                         -1,
                                         0,
                                         1e308,
                                         -1e308,
                                         9223372036854775807LL,
                                         18446744073709551615ULL,
                                         0.5,
                                         true,
                                         nlohmann::json::array(),
                                         nlohmann::json::object(),
                                         nlohmann::json::array({1, 2, 3}),
                                         "../../escape",
                                         ""};
  switch (g() % 4) {
    case 0:
    case 1: j[p] = replacements[g() % (sizeof(replacements) / sizeof(replacements[0]))]; break;
    case 2: {  // drop the key (or array element)
      nlohmann::json& parent = j[p.parent_pointer()];
      if (parent.is_object())
        parent.erase(p.back());
      else if (parent.is_array() && !parent.empty())
        parent.erase(parent.begin());
      break;
    }
    case 3: {  // misspell the key
      nlohmann::json& parent = j[p.parent_pointer()];
      if (parent.is_object()) {
        nlohmann::json v = parent[p.back()];
        parent.erase(p.back());
        parent[p.back() + "x"] = v;
      }
      break;
    }
  }
  return j;
}

// What a reader did with one input.
struct FuzzCounts {
  int valid = 0, clean_error = 0, unclean = 0;
  std::string first_unclean;
};

// Runs f on one input and classifies the outcome.
inline void classify(FuzzCounts& c, const std::string& label, const std::function<void()>& f) {
  try {
    f();
    ++c.valid;
  } catch (const fp4lab::Error& e) {
    const std::string what = e.what();
    if (what.empty() || what.find('\n') != std::string::npos) {
      if (c.unclean++ == 0) c.first_unclean = label + ": an error that is not one line: " + what;
    } else {
      ++c.clean_error;
    }
  } catch (const std::exception& e) {
    if (c.unclean++ == 0) c.first_unclean = label + ": " + typeid(e).name() + ": " + e.what();
  }
}

// The counts in the test log, and the contract checked.
inline void report(const char* what, const FuzzCounts& c) {
  MESSAGE(std::string(what) << ": " << c.valid << " valid, " << c.clean_error << " clean errors, " << c.unclean
                            << " unclean");
  CHECK_MESSAGE(c.unclean == 0, c.first_unclean);
}

}  // namespace fp4lab::test
