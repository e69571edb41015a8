// The shipped-config matrix (config_matrix.hpp).
#include "train/config_matrix.hpp"
#include "train/text_fixture.hpp"
#include "train/token_fixture.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "recipes/recipe.hpp"
#include "train/config.hpp"
#include "train/run.hpp"

namespace fp4lab::train::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void be32(std::ofstream& f, uint32_t v) {
  const char b[4] = {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  f.write(b, 4);
}

// n MNIST-shaped images (28x28, pixel values varying with the image) and labels.
void write_mnist_split(const fs::path& dir, const char* pre, uint32_t n) {
  {
    std::ofstream f(dir / (std::string(pre) + "-images-idx3-ubyte"), std::ios::binary);
    be32(f, 0x803), be32(f, n), be32(f, 28), be32(f, 28);
    for (uint32_t i = 0; i < n; ++i)
      for (uint32_t p = 0; p < 784; ++p) f.put(char((i * 37 + p * (i % 7 + 1)) & 0xFF));
  }
  std::ofstream f(dir / (std::string(pre) + "-labels-idx1-ubyte"), std::ios::binary);
  be32(f, 0x801), be32(f, n);
  for (uint32_t i = 0; i < n; ++i) f.put(char(i % 10));
}

struct Fixtures {
  fs::path root;
  std::string text, mnist, tokens;
  Fixtures() {
    root = fs::temp_directory_path() / ("fp4lab_config_matrix_" + std::to_string(::getpid()));
    fs::remove_all(root);
    fs::create_directories(root / "mnist");
    text = (root / "text.txt").string();
    std::ofstream t(text);
    t << test::words_corpus(800);
    // 40 test images: an evaluation batch of 40 x 17 = 680 rows, not a
    // multiple of 16 (as the shipped 1000 x 17): partial RHT chunks.
    write_mnist_split(root / "mnist", "train", 40);
    write_mnist_split(root / "mnist", "t10k", 40);
    mnist = (root / "mnist").string();
    // Token data: one llm.c shard per split, of a vocabulary of 64 (the shipped GPT-2 vocabulary's
    // 50257-row embedding would make every recipe's steps slow on CI; tests/train/test_tokens.cpp and
    // tests/cli/test_tokens.py cover GPT-2's sizes).
    fs::create_directories(root / "tokens");
    write_bytes(root / "tokens" / "train_000000.bin", llmc_shard(token_stream(4000, 64)));
    write_bytes(root / "tokens" / "val_000000.bin", llmc_shard(token_stream(500, 64, 1)));
    tokens = (root / "tokens").string();
  }
  ~Fixtures() { fs::remove_all(root); }
};

std::vector<fs::path> shipped_configs() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fs::path(FP4LAB_SOURCE_DIR) / "configs"))
    if (e.is_regular_file() && e.path().extension() == ".json") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The shipped config with the matrix's tiny overrides.
json tiny(json j, const Fixtures& fx, const std::string& backend, int threads, const fs::path& out) {
  const bool tokens = j.at("data").at("type") == "tokens", text = j.at("data").at("type") == "char" || tokens;
  if (tokens) {
    j["data"]["train"] = fx.tokens + "/train_*.bin";
    j["data"]["val"] = fx.tokens + "/val_*.bin";
    j["data"]["vocab_size"] = 64;
    if (j["data"].value("padded_vocab_size", int64_t(0)) > 0) j["data"]["padded_vocab_size"] = 128;
  } else {
    j["data"]["path"] = text ? fx.text : fx.mnist;
  }
  j["data"].erase("train_limit");
  j["data"].erase("test_limit");
  json& t = j["training"];
  t.erase("epochs");
  t["steps"] = 2;
  // Row counts of a training batch stay multiples of 16, as the wgrad RHT
  // needs (GPT: batch x context; ViT: 16 images x 17 tokens).
  t["batch_size"] = text ? 1 : 16;
  t["eval_interval"] = 2;
  t["eval_iters"] = 1;
  t["log_interval"] = 1;
  t["warmup_steps"] = 1;
  t["decay_steps"] = 2;
  if (text) j["model"]["context"] = std::min<int64_t>(j["model"].value("context", int64_t(16)), 16);
  // GPT-2-small-shaped configs (85M parameters): 2 layers of width 8 per head, so that every
  // recipe's two steps stay fast on CI's 2 cores; the heads and everything else as shipped.
  // MoE configs (8 experts of the dense config's linear shapes, which the dense configs already run):
  // the same narrowing, so that CI's cost is the routing's, not 28M parameters' init and checkpoints.
  const bool moe = j["model"].contains("moe") && j["model"].value("width", int64_t(0)) > 128;
  if (j["model"].value("width", int64_t(0)) > 384 || moe) {
    j["model"]["layers"] = 2;
    j["model"]["width"] = 8 * j["model"].value("heads", int64_t(1));
  }
  j["backend"] = backend;
  j["threads"] = threads;
  j["output"] = {{"dir", out.string()}};
  return j;
}

}  // namespace

void check_config_matrix(const std::string& backend, int threads, const std::string& activations,
                         const std::vector<std::string>& only) {
  const Fixtures fx;
  const std::vector<fs::path> configs = shipped_configs();
  REQUIRE(configs.size() >= 4);  // gpt_baby, gpt_shakespeare_char, vit_mnist, vit_mnist_quick
  int64_t ran = 0;
  for (const fs::path& path : configs) {
    if (!only.empty() && std::find(only.begin(), only.end(), path.stem().string()) == only.end()) continue;
    ++ran;
    const json shipped = read_json_file(path.string());
    for (const std::string& recipe : recipe_names()) {
      INFO(path.filename().string(), " x ", recipe, " on ", backend, ", activations ", activations);
      json j = tiny(shipped, fx, backend, threads, fx.root / "runs");
      j["recipe"] = recipe;
      if (activations != "fp32") j["precision"] = {{"activations", activations}};
      std::ostringstream log;
      RunOptions opt;
      opt.progress = false;
      opt.log = &log;
      RunResult r;
      try {
        r = run_training(config_from_json(j), opt);
      } catch (const std::exception& e) {
        const std::string what = std::string("the run threw: ") + e.what();
        FAIL_CHECK(what);
        continue;
      }
      CHECK(r.status == "completed");
      const json& final_metric = r.summary["final"];
      CHECK((final_metric.is_number() && std::isfinite(final_metric.get<double>())));
    }
  }
  CHECK(ran == int64_t(only.empty() ? configs.size() : only.size()));  // every config named exists
}

}  // namespace fp4lab::train::test
