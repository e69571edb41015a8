// Fuzzing of the trainer's input readers (tests/fuzz.hpp): mutated MNIST IDX
// files and mutated experiment configs give a valid result or one clean
// fp4lab::Error, never another exception or a crash.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz.hpp"
#include "train/config.hpp"
#include "train/data.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
namespace fs = std::filesystem;

namespace {

std::string be32(uint32_t v) { return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; }

std::string idx_images(uint32_t n) {
  std::string s = be32(0x803) + be32(n) + be32(28) + be32(28);
  for (uint32_t i = 0; i < n * 784; ++i) s += char(i * 7);
  return s;
}
std::string idx_labels(uint32_t n) {
  std::string s = be32(0x801) + be32(n);
  for (uint32_t i = 0; i < n; ++i) s += char(i % 10);
  return s;
}
void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace

TEST_CASE("MNIST IDX: a few hundred mutated files load or fail with one clean error (fuzz)") {
  const fs::path d = fs::temp_directory_path() / ("fp4lab_fuzz_idx_" + std::to_string(::getpid()));
  fs::create_directories(d);
  const std::string images = idx_images(6), labels = idx_labels(6);
  test::FuzzCounts c;
  for (uint32_t k = 0; k < 300; ++k) {
    // Mutate the images, the labels, or both.
    write(d / "train-images-idx3-ubyte", k % 3 != 1 ? test::mutate_bytes(images, k) : images);
    write(d / "train-labels-idx1-ubyte", k % 3 != 0 ? test::mutate_bytes(labels, k + 7919) : labels);
    test::classify(c, "mutation " + std::to_string(k), [&] { (void)load_mnist(d.string(), true); });
  }
  fs::remove_all(d);
  test::report("MNIST IDX", c);
  CHECK(c.valid > 0);
  CHECK(c.clean_error > 0);
}

TEST_CASE("configs: a few hundred mutated shipped configs parse or fail with one clean error (fuzz)") {
  test::FuzzCounts c;
  uint32_t k = 0;
  for (const auto& e : fs::directory_iterator(fs::path(FP4LAB_SOURCE_DIR) / "configs")) {
    if (!e.is_regular_file() || e.path().extension() != ".json") continue;
    const nlohmann::json base = read_json_file(e.path().string());
    const std::string name = e.path().filename().string();
    for (int i = 0; i < 80; ++i, ++k) {
      const nlohmann::json j = test::mutate_json(base, k);
      test::classify(c, name + " json mutation " + std::to_string(k), [&] {
        const RunConfig cfg = config_from_json(j);
        (void)resolve_recipe(cfg);
        (void)run_directory(cfg);
      });
    }
    // Byte-level mutations of the file's text, through the file reader.
    const fs::path p = fs::temp_directory_path() / ("fp4lab_fuzz_cfg_" + std::to_string(::getpid()) + ".json");
    std::ifstream in(e.path());
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    for (int i = 0; i < 20; ++i, ++k) {
      write(p, test::mutate_bytes(text, k));
      test::classify(c, name + " text mutation " + std::to_string(k),
                     [&] { (void)config_from_json(read_json_file(p.string())); });
    }
    fs::remove(p);
  }
  test::report("configs", c);
  CHECK(c.valid > 0);
  CHECK(c.clean_error > 0);
}
