#include "train/data.hpp"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>

#include "core/error.hpp"
#include "core/json.hpp"
#include "core/philox.hpp"

namespace fp4lab::train {

Batch slice_batch(const Batch& b, int64_t begin, int64_t end) {
  if (begin < 0 || end < begin || end > b.size)
    throw Error("slice_batch: samples [" + std::to_string(begin) + ", " + std::to_string(end) + ") of a batch of " +
                std::to_string(b.size));
  Batch out;
  out.size = end - begin;
  auto part = [&](const auto& v, auto& dst) {
    if (v.empty()) return;
    const size_t per = v.size() / size_t(b.size);
    dst.assign(v.begin() + std::ptrdiff_t(size_t(begin) * per), v.begin() + std::ptrdiff_t(size_t(end) * per));
  };
  part(b.images, out.images);
  part(b.tokens, out.tokens);
  part(b.targets, out.targets);
  return out;
}

namespace {

std::vector<uint8_t> read_file(const std::string& path) {
  reject_directory(path, "an MNIST IDX file (data.path is the directory holding them)", "data.path");
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw Error("cannot open " + path +
                " (missing? run scripts/get_mnist.sh, or set data.path to the directory holding the IDX files)");
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}
uint32_t be32(const std::vector<uint8_t>& b, size_t o) {
  return uint32_t(b[o]) << 24 | uint32_t(b[o + 1]) << 16 | uint32_t(b[o + 2]) << 8 | uint32_t(b[o + 3]);
}
constexpr uint64_t kShuffleStream = uint64_t(0xE) << 60;

// Uniform integer in [0, n) from 64 Philox bits (bias < n / 2^64).
uint64_t draw(uint64_t seed, uint64_t stream, uint64_t i, uint64_t n) {
  const uint64_t r = uint64_t(random_bits(seed, stream, 2 * i)) << 32 | random_bits(seed, stream, 2 * i + 1);
  return r % n;
}

}  // namespace

std::vector<uint8_t> read_idx_images(const std::string& path, int64_t& count, int64_t& rows, int64_t& cols) {
  std::vector<uint8_t> b = read_file(path);
  if (b.size() < 16) throw Error(path + ": " + std::to_string(b.size()) + " bytes, too short for an IDX3 header");
  if (be32(b, 0) != 0x803)
    throw Error(path + ": magic number " + std::to_string(be32(b, 0)) +
                " is not 2051 (IDX3 unsigned bytes); not an MNIST image file (or still gzip-compressed)");
  count = be32(b, 4), rows = be32(b, 8), cols = be32(b, 12);
  const uint64_t need = 16 + uint64_t(count) * uint64_t(rows) * uint64_t(cols);
  if (b.size() != need)
    throw Error(path + ": " + std::to_string(b.size()) + " bytes but the header (" + std::to_string(count) + " x " +
                std::to_string(rows) + " x " + std::to_string(cols) + ") needs " + std::to_string(need) +
                (b.size() < need ? "; the file is truncated" : "; the file is corrupt") +
                " (re-run scripts/get_mnist.sh)");
  return std::vector<uint8_t>(b.begin() + 16, b.end());
}

std::vector<uint8_t> read_idx_labels(const std::string& path, int64_t& count) {
  std::vector<uint8_t> b = read_file(path);
  if (b.size() < 8) throw Error(path + ": " + std::to_string(b.size()) + " bytes, too short for an IDX1 header");
  if (be32(b, 0) != 0x801)
    throw Error(path + ": magic number " + std::to_string(be32(b, 0)) +
                " is not 2049 (IDX1 unsigned bytes); not an MNIST label file (or still gzip-compressed)");
  count = be32(b, 4);
  if (b.size() != 8 + uint64_t(count))
    throw Error(path + ": " + std::to_string(b.size()) + " bytes but the header (" + std::to_string(count) +
                " labels) needs " + std::to_string(8 + count) +
                (b.size() < 8 + uint64_t(count) ? "; the file is truncated" : "; the file is corrupt") +
                " (re-run scripts/get_mnist.sh)");
  std::vector<uint8_t> l(b.begin() + 8, b.end());
  for (size_t i = 0; i < l.size(); ++i)
    if (l[i] > 9)
      throw Error(path + ": label " + std::to_string(l[i]) + " at index " + std::to_string(i) +
                  " is outside 0..9; the file is corrupt");
  return l;
}

ImageSet load_mnist(const std::string& dir, bool train) {
  const std::string pre = dir + "/" + (train ? "train" : "t10k");
  ImageSet s;
  int64_t nl = 0;
  s.pixels = read_idx_images(pre + "-images-idx3-ubyte", s.count, s.rows, s.cols);
  s.labels = read_idx_labels(pre + "-labels-idx1-ubyte", nl);
  if (nl != s.count)
    throw Error(pre + "-labels-idx1-ubyte holds " + std::to_string(nl) + " labels but " + pre +
                "-images-idx3-ubyte holds " + std::to_string(s.count) + " images");
  return s;
}

int64_t ImageSampler::size() const { return limit > 0 ? std::min(limit, set->count) : set->count; }
int64_t ImageSampler::steps_per_epoch() const { return (size() + batch_size - 1) / batch_size; }

Batch ImageSampler::make(const std::vector<int64_t>& idx) const {
  Batch b;
  b.size = int64_t(idx.size());
  const int64_t px = set->rows * set->cols;
  b.images.resize(size_t(b.size * px));
  b.targets.resize(size_t(b.size));
  const float inv = 1.0f / std;
  for (int64_t i = 0; i < b.size; ++i) {
    const uint8_t* src = set->pixels.data() + idx[size_t(i)] * px;
    float* dst = b.images.data() + i * px;
    for (int64_t k = 0; k < px; ++k) dst[k] = (float(src[k]) / 255.0f - mean) * inv;
    b.targets[size_t(i)] = set->labels[size_t(idx[size_t(i)])];
  }
  return b;
}

Batch ImageSampler::train_batch(int64_t step) const {
  const int64_t spe = steps_per_epoch(), n = size();
  const int64_t epoch = step / spe, j = step % spe;
  if (epoch != cached_epoch_) {
    perm_.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) perm_[size_t(i)] = i;
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(perm_[size_t(i)],
                perm_[size_t(draw(seed, kShuffleStream | uint64_t(epoch), uint64_t(i), uint64_t(i + 1)))]);
    cached_epoch_ = epoch;
  }
  const int64_t b0 = j * batch_size, b1 = std::min(n, b0 + batch_size);
  return make(std::vector<int64_t>(perm_.begin() + b0, perm_.begin() + b1));
}

Batch ImageSampler::eval_batch(int64_t k, int64_t eval_batch_size) const {
  const int64_t b0 = k * eval_batch_size, b1 = std::min(size(), b0 + eval_batch_size);
  std::vector<int64_t> idx;
  for (int64_t i = b0; i < b1; ++i) idx.push_back(i);
  return make(idx);
}

CharText make_char_text(const std::string& text) {
  CharText t;
  std::set<unsigned char> chars(text.begin(), text.end());
  t.vocab.assign(chars.begin(), chars.end());
  int32_t id[256];
  for (size_t i = 0; i < t.vocab.size(); ++i) id[uint8_t(t.vocab[i])] = int32_t(i);
  const size_t n = text.size(), ntrain = size_t(double(n) * 0.9);  // nanoGPT: int(n*0.9)
  t.train.reserve(ntrain);
  t.val.reserve(n - ntrain);
  for (size_t i = 0; i < n; ++i) (i < ntrain ? t.train : t.val).push_back(id[uint8_t(text[i])]);
  return t;
}

CharText load_char_text(const std::string& path) {
  reject_directory(path, "a text file (tiny Shakespeare's input.txt)", "data.path");
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw Error("cannot open text file " + path +
                " (set data.path to tiny Shakespeare's input.txt, or run scripts/get_shakespeare.sh)");
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  if (text.size() < 1000)
    throw Error(path + ": " + std::to_string(text.size()) + " bytes; too short for a char-level corpus (truncated?)");
  return make_char_text(text);
}

Batch TextSampler::batch(int64_t index) const {
  const int64_t n = int64_t(data->size());
  if (n <= context + 1)
    throw Error("text split of " + std::to_string(n) + " characters is too short for context " +
                std::to_string(context));
  Batch b;
  b.size = batch_size;
  b.tokens.resize(size_t(batch_size * context));
  b.targets.resize(size_t(batch_size * context));
  for (int64_t i = 0; i < batch_size; ++i) {
    // torch.randint(len(data) - block_size): offsets in [0, n - context).
    const int64_t o = int64_t(draw(seed, stream, uint64_t(index * batch_size + i), uint64_t(n - context)));
    for (int64_t t = 0; t < context; ++t) {
      b.tokens[size_t(i * context + t)] = (*data)[size_t(o + t)];
      b.targets[size_t(i * context + t)] = (*data)[size_t(o + t + 1)];
    }
  }
  return b;
}

}  // namespace fp4lab::train
