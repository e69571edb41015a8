// Token data (train/tokens.hpp): llm.c shards and raw uint16 files as the test writes them byte by byte,
// every malformed file's error, globs, the sampler's determinism and windows, the config keys and the task.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "train/config.hpp"
#include "train/task.hpp"
#include "train/token_fixture.hpp"
#include "train/tokens.hpp"

using namespace fp4lab::train;
using namespace fp4lab::train::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct TmpDir {
  fs::path p;
  explicit TmpDir(const std::string& name)
      : p(fs::temp_directory_path() / ("fp4lab_tokens_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~TmpDir() { fs::remove_all(p); }
  std::string file(const std::string& n) const { return (p / n).string(); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const fp4lab::Error& e) {
    return e.what();
  }
  return "(no error)";
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A file's shard with the mapping its tokens point into.
struct Mapped {
  std::shared_ptr<void> keep;
  TokenShard s;
};
Mapped read_one(const std::string& path, const std::string& format = "auto") {
  Mapped m;
  m.s = map_token_file(path, format, m.keep);
  return m;
}
std::string open_error(const std::string& pattern, int64_t vocab = 50257, int64_t min_tokens = 2,
                       const std::string& format = "auto") {
  return error_of([&] { TokenSet::open(pattern, "config.data.train", format, vocab, min_tokens); });
}

}  // namespace

TEST_CASE("tokens: an llm.c shard written byte by byte reads as its header's tokens") {
  TmpDir d("shard");
  const std::vector<uint16_t> toks = {50256, 15496, 995, 0, 1, 65535};
  const std::vector<uint8_t> bytes = llmc_shard(toks);
  // The header as llm.c's write_datafile lays it out: int32 20240520 little-endian is 88 d8 34 01, checked
  // literally, so that the fixture and the reader cannot agree on a wrong layout.
  REQUIRE(bytes.size() == 1024 + 2 * toks.size());
  CHECK(bytes[0] == 0x88);
  CHECK(bytes[1] == 0xd8);
  CHECK(bytes[2] == 0x34);
  CHECK(bytes[3] == 0x01);
  CHECK(bytes[4] == 1);
  CHECK(bytes[8] == 6);
  CHECK(bytes[1024] == 0x50);  // 50256 = 0xc450, low byte first
  CHECK(bytes[1025] == 0xc4);
  write_bytes(d.p / "a.bin", bytes);
  const Mapped m = read_one(d.file("a.bin"));
  const TokenShard& s = m.s;
  CHECK(s.llmc);
  CHECK(s.count == 6);
  CHECK(s.bytes == bytes.size());
  CHECK(std::vector<uint16_t>(s.tokens, s.tokens + s.count) == toks);
  // format "raw" reads the same bytes as 518 + 6 raw tokens: the header's words first.
  const Mapped mr = read_one(d.file("a.bin"), "raw");
  const TokenShard& r = mr.s;
  CHECK_FALSE(r.llmc);
  CHECK(r.count == 512 + 6);
  CHECK(r.tokens[0] == 55432);
  CHECK(r.tokens[1] == 308);
}

TEST_CASE("tokens: a raw file is little-endian uint16 from its first byte (nanoGPT's train.bin)") {
  TmpDir d("raw");
  write_bytes(d.p / "train.bin", {0x01, 0x00, 0x34, 0x12, 0xff, 0xff});
  const Mapped m = read_one(d.file("train.bin"));
  const TokenShard& s = m.s;
  CHECK_FALSE(s.llmc);
  REQUIRE(s.count == 3);
  CHECK(s.tokens[0] == 1);
  CHECK(s.tokens[1] == 0x1234);
  CHECK(s.tokens[2] == 0xffff);
}

TEST_CASE("tokens: every malformed file is one Error naming the file and the problem") {
  TmpDir d("bad");
  const std::vector<uint16_t> ten(10, 7), many(600, 7);
  struct Case {
    const char* name;
    std::vector<uint8_t> bytes;
    const char* format;
    const char* expect;
  };
  std::vector<uint8_t> truncated = llmc_shard(ten);
  truncated.pop_back();
  std::vector<uint8_t> trailing = llmc_shard(ten);
  trailing.push_back(0), trailing.push_back(0);
  const std::vector<Case> cases = {
      {"magic.bin", raw_tokens(many), "llmc", "bad magic 458759 for an llm.c shard"},
      {"eval.bin", llmc_shard(ten, 20240522), "auto", "multiple-choice eval file"},
      {"llama.bin", llmc_shard(ten, 20240801), "auto", "Llama-3 uint32 shard"},
      {"version.bin", llmc_shard(ten, 20240520, 2), "auto", "llm.c shard version 2; valid: 1"},
      {"count0.bin", llmc_shard({}, 20240520, 1, 0), "auto", "header counts 0 tokens; valid: > 0"},
      {"truncated.bin", truncated, "auto", "1043 bytes but its header counts 10 tokens (1044 bytes): truncated"},
      {"trailing.bin", trailing, "auto", "trailing bytes after the tokens"},
      {"short.bin", std::vector<uint8_t>(100, 0), "llmc", "shorter than an llm.c shard's 1024-byte header"},
      {"odd.bin", {1, 0, 2}, "auto", "3 bytes, an odd size for raw uint16 tokens"},
      {"empty.bin", {}, "auto", "empty file"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    write_bytes(d.p / c.name, c.bytes);
    const std::string e = error_of([&] { read_one(d.file(c.name), c.format); });
    CHECK(has(e, d.file(c.name)));
    CHECK(has(e, c.expect));
    // TokenSet::open raises the same error before anything trains.
    CHECK(open_error(d.file(c.name), 50257, 2, c.format) == e);
  }
  SUBCASE("a token >= vocab_size names it and its index") {
    std::vector<uint16_t> t = ten;
    t[7] = 50257;
    write_bytes(d.p / "vocab.bin", llmc_shard(t));
    const std::string e = open_error(d.file("vocab.bin"));
    CHECK(has(e, d.file("vocab.bin") + ": token 50257 at index 7 is outside data.vocab_size 50257"));
    CHECK(open_error(d.file("vocab.bin"), 50258) == "(no error)");
  }
  SUBCASE("a shard shorter than context + 1 tokens") {
    write_bytes(d.p / "few.bin", llmc_shard(ten));
    CHECK(has(open_error(d.file("few.bin"), 50257, 11),
              d.file("few.bin") + ": 10 tokens; a train shard needs at least model.context + 1 = 11"));
    CHECK(open_error(d.file("few.bin"), 50257, 10) == "(no error)");
  }
  SUBCASE("a glob matching nothing names the key and the glob; a matched directory names itself") {
    CHECK(has(open_error(d.file("nothing_*.bin")), "config.data.train: \"" + d.file("nothing_*.bin") + "\" matches no file"));
    fs::create_directories(d.p / "dir.bin");
    CHECK(has(open_error(d.file("dir.bin")), d.file("dir.bin") + ": is a directory"));
  }
}

TEST_CASE("tokens: a glob's shards are sorted by path and mapped in that order") {
  TmpDir d("glob");
  // Written out of order; shard k holds tokens 100 k .. 100 k + 40 + k.
  for (int k : {2, 0, 1}) {
    std::vector<uint16_t> t;
    for (int i = 0; i <= 40 + k; ++i) t.push_back(uint16_t(100 * k + i));
    write_bytes(d.p / ("train_00000" + std::to_string(k) + ".bin"), llmc_shard(t));
  }
  write_bytes(d.p / "val_000000.bin", raw_tokens(std::vector<uint16_t>(50, 3)));  // not matched
  const TokenSet set = TokenSet::open(d.file("train_*.bin"), "config.data.train", "auto", 50257, 17);
  REQUIRE(set.shards().size() == 3);
  for (int k = 0; k < 3; ++k) {
    CHECK(set.shards()[size_t(k)].path == d.file("train_00000" + std::to_string(k) + ".bin"));
    CHECK(set.shards()[size_t(k)].tokens[0] == 100 * k);
  }
  CHECK(set.total_tokens() == 41 + 42 + 43);
}

TEST_CASE("tokens: batches are a pure function of (seed, step); targets are the inputs shifted by one") {
  TmpDir d("sample");
  // Shards of distinct token ranges (shard k: 1000 k + i), so that each sequence shows where it came from.
  const int64_t sizes[3] = {40, 17, 300};
  for (int k = 0; k < 3; ++k) {
    std::vector<uint16_t> t;
    for (int64_t i = 0; i < sizes[k]; ++i) t.push_back(uint16_t(1000 * k + i));
    fs::path name = d.p / "s";
    name += std::to_string(k) + ".bin";  // (not "s" + to_string(k): GCC 12 -Wrestrict false positive)
    write_bytes(name, llmc_shard(t));
  }
  const int64_t T = 16;
  const TokenSet set = TokenSet::open(d.file("s*.bin"), "config.data.train", "auto", 50257, T + 1);
  TokenSampler s{&set, 8, T, 42, 7};
  REQUIRE(s.windows() == uint64_t((40 - T) + (17 - T) + (300 - T)));
  SUBCASE("the window map: shard by shard, starts 0 .. n - context - 1") {
    CHECK(s.window(0) == std::pair<size_t, int64_t>{0, 0});
    CHECK(s.window(23) == std::pair<size_t, int64_t>{0, 23});
    CHECK(s.window(24) == std::pair<size_t, int64_t>{1, 0});  // shard 1 (17 tokens) has one window
    CHECK(s.window(25) == std::pair<size_t, int64_t>{2, 0});
    CHECK(s.window(s.windows() - 1) == std::pair<size_t, int64_t>{2, 300 - T - 1});
  }
  // Batch 3 drawn first, then 0..3: the same bits whatever came before; another seed or stream differs.
  const Batch b3 = s.batch(3);
  std::vector<Batch> all;
  for (int64_t k = 0; k < 4; ++k) all.push_back(s.batch(k));
  CHECK(all[3].tokens == b3.tokens);
  CHECK(all[3].targets == b3.targets);
  CHECK(all[0].tokens != all[1].tokens);
  CHECK(TokenSampler{&set, 8, T, 43, 7}.batch(3).tokens != b3.tokens);
  CHECK(TokenSampler{&set, 8, T, 42, 8}.batch(3).tokens != b3.tokens);
  std::set<int> shards_seen;
  for (int64_t k = 0; k < 200; ++k) {
    const Batch b = s.batch(k);
    REQUIRE(b.size == 8);
    REQUIRE(b.tokens.size() == size_t(8 * T));
    for (int64_t i = 0; i < 8; ++i) {
      const int first = b.tokens[size_t(i * T)], shard = first / 1000;
      shards_seen.insert(shard);
      for (int64_t t = 0; t < T; ++t) {
        // Consecutive tokens of one shard: the targets are the next tokens, the last one inside the shard.
        REQUIRE(b.tokens[size_t(i * T + t)] == first + t);
        REQUIRE(b.targets[size_t(i * T + t)] == first + t + 1);
      }
      REQUIRE(first % 1000 + T < sizes[shard]);  // the last target is the shard's, never the next one's
    }
  }
  CHECK(shards_seen == std::set<int>{0, 1, 2});
}

TEST_CASE("tokens: config keys, defaults, errors; the task sets the model's vocabulary and fingerprints the files") {
  TmpDir d("config");
  write_bytes(d.p / "train_000000.bin", llmc_shard(token_stream(400, 50)));
  write_bytes(d.p / "val_000000.bin", raw_tokens(token_stream(100, 50, 1)));
  json j = {{"model", {{"type", "gpt"}, {"layers", 1}, {"heads", 2}, {"width", 8}, {"context", 16}}},
            {"data", {{"type", "tokens"}, {"train", d.file("train_*.bin")}, {"val", d.file("val_*.bin")}}},
            {"training", {{"steps", 1}, {"batch_size", 2}}}};
  RunConfig c = config_from_json(j);
  CHECK(c.data.vocab_size == 50257);
  CHECK(c.data.padded_vocab_size == 0);
  CHECK(c.data.format == "auto");
  const json resolved = config_to_json(c)["data"];
  CHECK(resolved == json{{"type", "tokens"},   {"train", c.data.train},     {"val", c.data.val},
                         {"format", "auto"},   {"vocab_size", 50257},       {"padded_vocab_size", 0}});
  CHECK(config_from_json(config_to_json(c)).data.train == c.data.train);
  auto err = [&](const std::string& key, const json& v) {
    json k = j;
    k["data"][key] = v;
    return error_of([&] { config_from_json(k); });
  };
  CHECK(has(err("padded_vocab_size", 100), "config.data.padded_vocab_size"));
  CHECK(has(err("vocab_size", 70000), "config.data.vocab_size"));
  CHECK(has(err("format", "bin"), "config.data.format"));
  CHECK(has(err("path", "x"), "config.data.path: unknown key"));
  CHECK(has(err("train", ""), "config.data.train: empty"));
  json vit = j;
  vit["model"] = {{"type", "vit"}};
  CHECK(has(error_of([&] { config_from_json(vit); }), "does not fit model.type \"vit\""));

  j["data"]["vocab_size"] = 50;
  j["data"]["padded_vocab_size"] = 64;
  c = config_from_json(j);
  const std::unique_ptr<Task> t = make_task(c);
  CHECK(c.model.vocab_size == 64);  // the padded vocabulary: rows of wte / lm_head no token uses
  CHECK(has(t->fingerprint, "tokens:500 files:2 meta-crc32:"));
  const Batch b = t->train_batch(0);
  CHECK(b.tokens.size() == 32);
  for (int32_t v : b.targets) CHECK(v < 50);
  // A changed file changes the fingerprint (size, mtime and count are in it).
  write_bytes(d.p / "val_000000.bin", raw_tokens(token_stream(102, 50, 1)));
  RunConfig c2 = config_from_json(j);
  CHECK(make_task(c2)->fingerprint != t->fingerprint);
  // Data checked before training: a token >= vocab_size fails make_task.
  j["data"]["vocab_size"] = 40;
  j["data"].erase("padded_vocab_size");
  RunConfig c3 = config_from_json(j);
  CHECK(has(error_of([&] { make_task(c3); }), "is outside data.vocab_size 40"));
}
