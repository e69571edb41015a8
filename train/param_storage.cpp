// Parameter storage precisions and the host cast store (param_storage.hpp).
#include "train/param_storage.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace fp4lab::train {

std::string storage_name(Storage s) {
  switch (s) {
    case Storage::fp32: return "fp32";
    case Storage::nvfp4_2d: return "nvfp4_2d";
  }
  throw InternalError("storage_name: unknown Storage " + std::to_string(int(s)));
}

const QuantizerSpec* storage_cast(Storage s) {
  static const QuantizerSpec nvfp4_2d = quantizer_by_name("nvfp4_2d");
  switch (s) {
    case Storage::fp32: return nullptr;
    case Storage::nvfp4_2d: return &nvfp4_2d;
  }
  throw InternalError("storage_cast: unknown Storage " + std::to_string(int(s)));
}

namespace {

// sim/shard_cast.hpp's steps on host memory. amax_ holds the tensor maxima,
// then the tile maxima (the device store's layout: one array to reduce).
class HostCastStore final : public CastStore {
 public:
  explicit HostCastStore(std::span<const FlatTensor> tensors)
      : tensors_(tensors.begin(), tensors.end()), layout_(flat_layout(tensors)) {
    amax_.resize(tensors_.size() + size_t(layout_.tile_offset.back()));
    packed_.resize(size_t(layout_.packed_offset.back()));
  }
  std::span<const FlatTensor> tensors() const override { return tensors_; }
  bool device() const override { return false; }
  void partial_amax(const float* flat, ShardRange shard) override {
    const ShardAmax a = shard_partial_amax(tensors_, flat, shard);
    std::copy(a.tensor.begin(), a.tensor.end(), amax_.begin());
    std::copy(a.tile.begin(), a.tile.end(), amax_.begin() + std::ptrdiff_t(tensors_.size()));
  }
  std::span<uint32_t> amax() override { return amax_; }
  void compute_scales() override {
    ShardAmax a;
    a.tensor.assign(amax_.begin(), amax_.begin() + std::ptrdiff_t(tensors_.size()));
    a.tile.assign(amax_.begin() + std::ptrdiff_t(tensors_.size()), amax_.end());
    scales_ = shard_scales(tensors_, a);
  }
  void cast(const float* flat, ShardRange shard) override {
    span_ = shard_cast(tensors_, flat, shard, scales_);
    std::fill(packed_.begin(), packed_.end(), uint8_t(0));
    std::copy(span_.bytes.begin(), span_.bytes.end(), packed_.begin() + span_.first_byte);
  }
  std::span<uint8_t> packed() override { return packed_; }
  ShardBytes span() const override { return span_; }
  void set_packed(const std::vector<uint8_t>& full) override {
    if (full.size() != packed_.size())
      throw Error("shard cast: " + std::to_string(full.size()) + " packed bytes, the tensors need " +
                  std::to_string(packed_.size()));
    packed_ = full;
  }
  void or_windows(std::span<const uint8_t> windows, const PackedWindows& w) override {
    fp4lab::or_windows(packed_, windows, w);
  }
  void dequantize(float* flat) const override { dequantize_packed(tensors_, packed_, scales_, flat); }
  ShardScales scales() const override { return scales_; }
  const StoredWeight* stored(size_t) const override { return nullptr; }

 private:
  std::vector<FlatTensor> tensors_;
  FlatLayout layout_;
  std::vector<uint32_t> amax_;
  ShardScales scales_;
  ShardBytes span_;
  std::vector<uint8_t> packed_;
};

}  // namespace

std::unique_ptr<CastStore> make_host_cast_store(std::span<const FlatTensor> tensors) {
  return std::make_unique<HostCastStore>(tensors);
}

}  // namespace fp4lab::train
