// Data (train/data.cpp): IDX parsing with clear errors, nanoGPT's char vocabulary and split, samplers.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "train/data.hpp"
#include "core/error.hpp"

using namespace fp4lab::train;
namespace fs = std::filesystem;

namespace {
void be32(std::ofstream& f, uint32_t v) {
  const char b[4] = {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  f.write(b, 4);
}
// n images of 28x28 (pixel value = image index) and labels i % 10.
void write_mnist(const fs::path& dir, const char* pre, uint32_t n, uint32_t truncate_by = 0) {
  fs::create_directories(dir);
  {
    std::ofstream f(dir / (std::string(pre) + "-images-idx3-ubyte"), std::ios::binary);
    be32(f, 0x803), be32(f, n), be32(f, 28), be32(f, 28);
    for (uint32_t i = 0; i < n; ++i) f << std::string(784 - (i + 1 == n ? truncate_by : 0), char(i));
  }
  std::ofstream f(dir / (std::string(pre) + "-labels-idx1-ubyte"), std::ios::binary);
  be32(f, 0x801), be32(f, n);
  for (uint32_t i = 0; i < n; ++i) f.put(char(i % 10));
}
std::string error_of(const std::string& dir) {
  try {
    load_mnist(dir, true);
  } catch (const fp4lab::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("MNIST IDX: loads a generated fixture; missing, truncated and corrupt files fail clearly") {
  const fs::path d = fs::temp_directory_path() / "fp4lab_test_mnist";
  fs::remove_all(d);
  CHECK(error_of(d.string()).find("train-images-idx3-ubyte") != std::string::npos);  // missing
  write_mnist(d, "train", 10);
  ImageSet s = load_mnist(d.string(), true);
  CHECK(s.count == 10);
  CHECK(s.pixels[3 * 784 + 5] == 3);
  CHECK(s.labels[7] == 7);
  write_mnist(d, "train", 10, 100);
  CHECK(error_of(d.string()).find("truncated") != std::string::npos);
  {
    std::ofstream f(d / "train-images-idx3-ubyte", std::ios::binary);
    const std::string gz("\x1f\x8b\x08\x00garbage-garbage-garbage", 27);
    f << gz;
  }
  CHECK(error_of(d.string()).find("magic number") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("image sampler: every image once per epoch, reproducible, partial last batch, normalisation") {
  const fs::path d = fs::temp_directory_path() / "fp4lab_test_mnist2";
  write_mnist(d, "train", 10);
  ImageSet s = load_mnist(d.string(), true);
  ImageSampler smp;
  smp.set = &s;
  smp.batch_size = 4;
  smp.seed = 5;
  CHECK(smp.steps_per_epoch() == 3);
  std::vector<int> seen(10, 0);
  for (int st = 0; st < 3; ++st) {
    Batch b = smp.train_batch(st);
    CHECK(b.size == (st == 2 ? 2 : 4));
    for (int i = 0; i < b.size; ++i) {
      const int img = int(std::lround((b.images[size_t(i * 784)] * 0.3081f + 0.1307f) * 255.0f));
      seen[size_t(img)]++;
      CHECK(b.targets[size_t(i)] == img % 10);
    }
  }
  for (int c : seen) CHECK(c == 1);
  ImageSampler other = smp;
  CHECK(other.train_batch(4).targets == smp.train_batch(4).targets);  // pure function of (seed, step)
  fs::remove_all(d);
}

TEST_CASE("char text: sorted vocabulary, 90/10 split, batches shifted by one") {
  CharText t = make_char_text("hello world, hello there!!");
  CHECK(t.vocab == " !,dehlortw");
  CHECK(t.train.size() == 23);  // int(26 * 0.9)
  CHECK(t.val.size() == 3);
  CHECK(t.train[0] == 5);  // 'h' is the 6th character of the vocabulary
  std::vector<int32_t> data;
  for (int i = 0; i < 100; ++i) data.push_back(i);
  TextSampler s{&data, 3, 8, 1, 2};
  Batch b = s.batch(7);
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 8; ++k) {
      CHECK(b.targets[size_t(i * 8 + k)] == b.tokens[size_t(i * 8 + k)] + 1);
      CHECK(b.tokens[size_t(i * 8 + k)] <= 91);
    }
  CHECK_THROWS_AS(load_char_text("/nonexistent/input.txt"), fp4lab::Error);
}
