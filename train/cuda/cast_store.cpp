// The cuda backend's CastStore (cast_store.hpp).
#include "train/cuda/cast_store.hpp"

#include <algorithm>
#include <vector>

#include "cuda/element_cast.hpp"
#include "sim/element_layout.hpp"

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

// bf16 / fp8_e4m3 on the device: one code an element (param_storage.hpp states the forms; the host store
// HostElementStore computes the same bits).
class DeviceElementStore final : public CastStore {
 public:
  DeviceElementStore(Storage s, std::span<const FlatTensor> tensors)
      : s_(s), tensors_(tensors.begin(), tensors.end()), cast_(tensors, s == Storage::fp8_e4m3) {}
  Storage storage() const override { return s_; }
  std::span<const FlatTensor> tensors() const override { return tensors_; }
  PackedWindows windows(std::span<const ShardRange> shards) const override {
    return element_windows(tensors_, code_bytes(s_), shards);
  }
  int64_t bytes() const override { return cast_.packed_bytes() + cast_.amax_count() * 4; }
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
  ShardScales scales() const override {
    ShardScales s;
    s.g_dec = cast_.decode_scales();
    return s;
  }
  const StoredWeight* stored(size_t) const override { return nullptr; }  // the layers read the FP32 values

 private:
  Storage s_;
  std::vector<FlatTensor> tensors_;
  cuda::DeviceElementCast cast_;
};

}  // namespace

std::unique_ptr<CastStore> make_device_cast_store(Storage s, std::span<const FlatTensor> tensors) {
  if (s == Storage::nvfp4_2d) return std::make_unique<DeviceCastStore>(tensors);
  if (s == Storage::bf16 || s == Storage::fp8_e4m3) return std::make_unique<DeviceElementStore>(s, tensors);
  throw Error("cuda backend: no cast store for storage " + storage_name(s));
}

}  // namespace fp4lab::train
