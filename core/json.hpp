// JSON text from users (configs, recipes, quantizer specs, checkpoint headers,
// `--set` values, suite manifests) goes through parse_json: nlohmann's parser
// with a nesting limit. nlohmann parses iteratively, but copying, comparing and
// dump()ing a value recurse once per level, so a file of 100000 '[' would
// overflow the stack later; parse_json refuses it while parsing, as an
// fp4lab::Error naming the source and the limit.
//
// Syntax errors stay nlohmann::json::parse_error, for the caller to word
// (json_error_text in core/error.hpp strips the library's tag). A number beyond
// a double (1e999) is an fp4lab::Error naming the source and the key it is under.
//
// json_excerpt(v) is how an error message quotes a value: its dump, cut to
// about 60 characters ("[1,2,3,...] (1205 characters)"), so that a message
// stays one short line whatever the value; text_excerpt cuts any quoted text so.
// reject_directory(path, ...) is the readers' check that a named file is not a
// directory (which std::ifstream opens, then reads as empty).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace fp4lab {

// The most levels of nested arrays and objects a JSON input may have ("[]" is 1,
// "[[]]" is 2). The files the project writes need a few; 64 leaves room for
// inline recipes and hand-written configs.
inline constexpr int kJsonMaxDepth = 64;

// Text quoted in an error message: at most `max` characters of it, then
// "..." and its full length.
inline std::string text_excerpt(std::string s, size_t max = 60) {
  if (s.size() <= max) return s;
  const size_t n = s.size();
  s.resize(max);
  return s + "... (" + std::to_string(n) + " characters)";
}

// Parses `text` (a std::string, a std::istream or anything nlohmann::json::parse
// takes); `source` names it in the depth error ("configs/x.json", "--set a.b").
// `max_depth` below kJsonMaxDepth is for a value that goes into a deeper place
// of a document (`--set a.b=VALUE`), so that the whole stays within the limit.
template <class Input>
nlohmann::json parse_json(Input&& text, const std::string& source, int max_depth = kJsonMaxDepth) {
  using nlohmann::json;
  // The keys open at the point the parser has reached ("" in an array), so that
  // an error inside a number can name the key: nlohmann refuses 1e999 (beyond
  // double) with out_of_range 406 and no path.
  std::vector<std::string> keys;
  // The callback sees every array/object start with the number of containers
  // already open; the new one is one level deeper.
  const json::parser_callback_t track = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= max_depth)
          throw Error(source + ": JSON nested deeper than " + std::to_string(max_depth) +
                      " levels of arrays/objects; valid: at most " + std::to_string(max_depth));
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string()) keys.back() = parsed.get<std::string>();
        break;
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(std::forward<Input>(text), track);
  } catch (const json::out_of_range& e) {
    if (e.id != 406) throw;  // 406: a number beyond a double
    std::string path;
    for (const std::string& k : keys) path += (path.empty() ? "" : ".") + (k.empty() ? std::string("[]") : k);
    throw Error(source + (path.empty() ? "" : ": " + text_excerpt(path)) + ": " + text_excerpt(json_error_text(e.what()), 100) +
                "; valid: a number within a double's range (about +-1.8e308)");
  }
}

// A directory named where a file belongs: std::ifstream opens one and then
// reads nothing (or fails with a bare "Is a directory"), so readers check first.
// Throws "KEY: PATH is a directory; expected EXPECTED" (no "KEY: " when key is empty).
inline void reject_directory(const std::string& path, const std::string& expected, const std::string& key = "") {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error((key.empty() ? "" : key + ": ") + path + " is a directory; expected " + expected);
}

// The value's JSON text for an error message, cut as text_excerpt does (invalid
// UTF-8 replaced). Values come from parse_json (bounded depth), so dump() is safe.
inline std::string json_excerpt(const nlohmann::json& v, size_t max = 60) {
  return text_excerpt(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), max);
}

}  // namespace fp4lab
