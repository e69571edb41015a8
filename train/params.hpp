// All trainable parameters of a model in one flat float32 buffer (plus one
// flat gradient buffer of the same layout), with named 2-D views.
//
// 1-D parameters (biases, LayerNorm gains) are stored as [1, n]. `decay` marks
// the parameters AdamW decays (nanoGPT: every parameter with dim >= 2, i.e.
// weight matrices and embeddings; never biases or LayerNorm gains).
//
// Initialisation is reproducible from (seed, parameter index): element i of
// parameter k draws from Philox (core/philox.hpp) with stream kInitStream | k
// and counter i, so it does not depend on the thread count or on other
// parameters' sizes.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "train/backend.hpp"

namespace fp4lab::train {

enum class Init : uint8_t {
  zeros,
  ones,
  normal,        // N(0, std^2)
  trunc_normal,  // N(0, std^2) truncated to [-2, 2] (absolute, as torch.nn.init.trunc_normal_'s defaults)
  uniform,       // U(-bound, bound)
};

struct ParamInfo {
  std::string name;
  int64_t offset = 0, rows = 0, cols = 0;
  bool decay = false;
  Init init = Init::zeros;
  float init_arg = 0.0f;  // std (normal, trunc_normal) or bound (uniform)
  int64_t size() const { return rows * cols; }
};

class ParamStore {
 public:
  // Declares a parameter; returns its index. Names must be unique.
  int add(const std::string& name, int64_t rows, int64_t cols, bool decay, Init init, float init_arg = 0.0f);
  // Allocates the buffers on `be` and initialises the values from `seed`.
  void finalize(Backend& be, uint64_t seed);

  int64_t size() const { return total_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo& info(int i) const { return infos_[size_t(i)]; }
  int index(const std::string& name) const;  // throws naming the valid names
  Tensor value(int i) const { return view_of(values.data + infos_[size_t(i)].offset, info(i).rows, info(i).cols); }
  Tensor grad(int i) const { return view_of(grads.data + infos_[size_t(i)].offset, info(i).rows, info(i).cols); }
  float* value_ptr(int i) const { return values.data + infos_[size_t(i)].offset; }
  float* grad_ptr(int i) const { return grads.data + infos_[size_t(i)].offset; }

  Tensor values, grads;                  // [1, size()] each
  std::vector<IndexRange> decay_ranges;  // the decayed parameters' elements, merged where adjacent
 private:
  std::vector<ParamInfo> infos_;
  std::unordered_set<std::string> names_;  // infos_' names: add() checks uniqueness in O(1), not O(count)
  int64_t total_ = 0;
};

// Host-side initial values of one parameter (what finalize() uploads).
std::vector<float> init_values(const ParamInfo& p, uint64_t seed, int index);

}  // namespace fp4lab::train
