// Training data: MNIST from its four IDX files, char-level text with
// nanoGPT's vocabulary and split, and reproducible batch samplers.
//
// Samplers are pure functions of (seed, step): the batch of step s never
// depends on earlier draws, so a resumed run sees exactly the batches of an
// uninterrupted one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/model.hpp"

namespace fp4lab::train {

// Samples [begin, end) of a batch (a data-parallel rank's share).
Batch slice_batch(const Batch& b, int64_t begin, int64_t end);

// ---- MNIST ------------------------------------------------------------------
struct ImageSet {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // [count, rows*cols]
  std::vector<uint8_t> labels;  // [count], 0..9
};
// Reads <dir>/train-images-idx3-ubyte + train-labels-idx1-ubyte (train) or the
// t10k-* pair. Throws fp4lab::Error naming the file for a missing file, a bad
// magic number, a size that does not match the header (truncated/corrupt), a
// label outside 0..9 or image/label counts that differ.
ImageSet load_mnist(const std::string& dir, bool train);
// Parsers of single IDX files (exposed for tests).
std::vector<uint8_t> read_idx_images(const std::string& path, int64_t& count, int64_t& rows, int64_t& cols);
std::vector<uint8_t> read_idx_labels(const std::string& path, int64_t& count);

struct ImageSampler {
  const ImageSet* set = nullptr;
  int64_t batch_size = 64;
  int64_t limit = 0;                    // use only the first `limit` images (0 = all)
  float mean = 0.1307f, std = 0.3081f;  // (x/255 - mean) / std, torchvision's MNIST normalisation
  uint64_t seed = 0;
  int64_t size() const;
  int64_t steps_per_epoch() const;  // ceil(size / batch) (the last batch may be partial, drop_last=False)
  // Training batch of step s: epoch s / steps_per_epoch, shuffled by a
  // Philox-keyed Fisher-Yates permutation of that epoch.
  Batch train_batch(int64_t step) const;
  // Batch k of the sequential (unshuffled) pass used for evaluation.
  Batch eval_batch(int64_t k, int64_t eval_batch_size) const;

 private:
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
  Batch make(const std::vector<int64_t>& idx) const;
};

// ---- char-level text -----------------------------------------------------------
struct CharText {
  std::string vocab;                // sorted unique characters (nanoGPT prepare.py)
  std::vector<int32_t> train, val;  // first 90% / last 10% of the text, as ids
};
// Throws naming the file if it is missing, empty or shorter than needed.
CharText load_char_text(const std::string& path);
CharText make_char_text(const std::string& text);

struct TextSampler {
  const std::vector<int32_t>* data = nullptr;
  int64_t batch_size = 12, context = 64;
  uint64_t seed = 0;
  uint64_t stream = 0;  // separates train batches and the two eval splits
  // Batch `index`: sequences starting at Philox-drawn offsets in [0, len - context).
  Batch batch(int64_t index) const;
};

}  // namespace fp4lab::train
