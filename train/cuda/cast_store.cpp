// The cuda backend's CastStore (cast_store.hpp).
#include "train/cuda/cast_store.hpp"

#include <vector>

namespace fp4lab::train {

namespace {

class DeviceCastStore final : public CastStore {
 public:
  explicit DeviceCastStore(std::span<const FlatTensor> tensors)
      : tensors_(tensors.begin(), tensors.end()), cast_(tensors) {
    // The device buffers are allocated once, so each tensor's form names the same memory for the store's life.
    stored_.resize(tensors_.size());
    for (size_t t = 0; t < tensors_.size(); ++t) stored_[t].form = cast_.packed_tensor(t);
  }
  Storage storage() const override { return Storage::nvfp4_2d; }
  std::span<const FlatTensor> tensors() const override { return tensors_; }
  PackedWindows windows(std::span<const ShardRange> shards) const override { return packed_windows(tensors_, shards); }
  int64_t bytes() const override {  // codes, one UE4M3 code a tile, one FP32 scale a tensor
    const FlatLayout l = flat_layout(tensors_);
    return l.packed_offset.back() + l.tile_offset.back() + int64_t(tensors_.size()) * 4;
  }
  bool device() const override { return true; }
  void partial_amax(const float* flat, ShardRange shard) override { cast_.partial_amax(flat, shard); }
  std::span<uint32_t> amax() override { return {cast_.amax(), size_t(cast_.amax_count())}; }
  void compute_scales() override { cast_.compute_scales(); }
  void cast(const float* flat, ShardRange shard) override { cast_.cast(flat, shard); }
  std::span<uint8_t> packed() override { return {cast_.packed(), size_t(cast_.packed_bytes())}; }
  ShardBytes span() const override { return cast_.span(); }
  void set_packed(const std::vector<uint8_t>& full) override { cast_.set_packed(full); }
  void or_windows(std::span<const uint8_t> windows, const PackedWindows& w) override { cast_.or_windows(windows, w); }
  void dequantize(float* flat) const override { cast_.dequantize(flat); }
  ShardScales scales() const override { return cast_.scales(); }
  const StoredWeight* stored(size_t t) const override { return &stored_.at(t); }

 private:
  std::vector<FlatTensor> tensors_;
  cuda::DeviceShardCast cast_;
  std::vector<StoredNvfp4> stored_;
};

}  // namespace

std::unique_ptr<CastStore> make_device_cast_store(std::span<const FlatTensor> tensors) {
  return std::make_unique<DeviceCastStore>(tensors);
}

}  // namespace fp4lab::train
