// core/json.hpp: the depth-limited parser every reader of user JSON uses, and
// the excerpts error messages quote values with.
#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include "core/error.hpp"
#include "core/json.hpp"

using namespace fp4lab;

namespace {

// `depth` nested arrays around 1: "[[1]]" for 2.
std::string nested_arrays(int depth) { return std::string(size_t(depth), '[') + "1" + std::string(size_t(depth), ']'); }
// `depth` nested objects: {"a":{"a":1}} for 2.
std::string nested_objects(int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += "{\"a\":";
  return s + "1" + std::string(size_t(depth), '}');
}

}  // namespace

TEST_CASE("parse_json: the depth limit is accepted, one level more is an Error naming the source and the limit") {
  for (const auto& make : {nested_arrays, nested_objects}) {
    const nlohmann::json ok = parse_json(make(kJsonMaxDepth), "ok.json");
    CHECK(ok.dump() == make(kJsonMaxDepth));
    CHECK_THROWS_WITH_AS(parse_json(make(kJsonMaxDepth + 1), "configs/deep.json"),
                         doctest::Contains("configs/deep.json: JSON nested deeper than 64 levels"), Error);
  }
  // Mixed arrays and objects count alike.
  CHECK_THROWS_AS(parse_json("[{\"a\":" + nested_arrays(kJsonMaxDepth - 1) + "}]", "mixed"), Error);
  CHECK_NOTHROW(parse_json("[{\"a\":" + nested_arrays(kJsonMaxDepth - 2) + "}]", "mixed"));
  // Depth is nesting, not count: many siblings at depth 2 are fine.
  std::string wide = "[";
  for (int i = 0; i < 10000; ++i) wide += std::string(i ? "," : "") + "[1]";
  CHECK(parse_json(wide + "]", "wide").size() == 10000);
}

TEST_CASE("parse_json: 100000 nested '[' (closed or not) and a stream are refused without a crash") {
  const std::string open(100000, '[');
  CHECK_THROWS_WITH_AS(parse_json(open, "hostile.json"), doctest::Contains("hostile.json"), Error);
  CHECK_THROWS_AS(parse_json(open + std::string(100000, ']'), "hostile.json"), Error);
  std::istringstream f(std::string(100000, '['));
  CHECK_THROWS_AS(parse_json(f, "stream"), Error);
  std::istringstream g(nested_objects(200000));
  CHECK_THROWS_WITH_AS(parse_json(g, "g.json"), doctest::Contains("g.json: JSON nested deeper"), Error);
}

TEST_CASE("parse_json: a smaller max_depth; syntax errors stay parse_error") {
  CHECK_NOTHROW(parse_json(nested_arrays(3), "x", 3));
  CHECK_THROWS_WITH_AS(parse_json(nested_arrays(4), "--set a.b", 3),
                       doctest::Contains("--set a.b: JSON nested deeper than 3 levels"), Error);
  CHECK_THROWS_AS(parse_json("{\"a\": }", "x"), nlohmann::json::parse_error);
  // A number beyond a double: an Error naming the source and the key it is under.
  CHECK_THROWS_WITH_AS(parse_json("1e999", "x"), doctest::Contains("x: number overflow parsing '1e999'"), Error);
  CHECK_THROWS_WITH_AS(parse_json(R"({"training": {"lr": -1e999}})", "c.json"),
                       doctest::Contains("c.json: training.lr: number overflow"), Error);
  CHECK_THROWS_WITH_AS(parse_json(R"({"a": [1, {"b": 1e400}]})", "c.json"), doctest::Contains("c.json: a.[].b: number"),
                       Error);
}

TEST_CASE("json_excerpt and text_excerpt: at most ~60 characters, with the full length") {
  CHECK(json_excerpt(nlohmann::json{1, 2, 3}) == "[1,2,3]");
  nlohmann::json big = nlohmann::json::array();
  for (int i = 0; i < 1000; ++i) big.push_back(i);
  const std::string e = json_excerpt(big);
  CHECK(e.size() < 100);
  CHECK(e.find("... (") != std::string::npos);
  CHECK(e.find(std::to_string(big.dump().size()) + " characters)") != std::string::npos);
  CHECK(text_excerpt(std::string(1000000, '9')).size() < 100);
  CHECK(text_excerpt("short") == "short");
  // A deep value from parse_json dumps without trouble.
  CHECK(json_excerpt(parse_json(nested_arrays(kJsonMaxDepth), "x")).size() < 100);
}
