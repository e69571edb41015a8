// The cuda backend's CastStore (cast_store.hpp).
#include "train/cuda/cast_store.hpp"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "cuda/element_cast.hpp"
#include "sim/element_layout.hpp"

namespace fp4lab::train {

namespace {

// A device store's full packed buffer and kept window (CastStore's keep_window / release_packed /
// restore_packed), both in the backend's pool, so the device-memory figures (Backend::device_memory) count
// them and a released buffer is reused without a cudaFree. `bind` hands the cast object the full buffer's
// address (null: released). Copies run on the legacy default stream, in order with the cast's kernels.
class DevicePacked {
 public:
  DevicePacked(Backend& be, int64_t bytes, std::function<void(uint8_t*)> bind)
      : be_(be), bytes_(bytes), bind_(std::move(bind)) {
    allocate();
  }
  void keep_window(int64_t at, int64_t size) {
    if (!full_.data || at < 0 || size < 0 || at + size > bytes_)
      throw InternalError("keep_window: [" + std::to_string(at) + ", +" + std::to_string(size) + ") of a " +
                          (full_.data ? "" : "released ") + "packed buffer of " + std::to_string(bytes_) + " bytes");
    window_ = be_.empty(1, words(size));
    cuda::check(cudaMemcpyAsync(window_.data, bytes_of(full_) + at, size_t(size), cudaMemcpyDeviceToDevice, nullptr),
                "cast store: keep_window");
    window_at_ = at, window_size_ = size, has_window_ = true;
  }
  void release() {
    bind_(nullptr);
    full_ = Tensor{};
  }
  void restore() {
    allocate();
    cuda::check(cudaMemsetAsync(full_.data, 0, size_t(bytes_), nullptr), "cast store: restore_packed");
    if (has_window_ && window_size_ > 0)
      cuda::check(cudaMemcpyAsync(bytes_of(full_) + window_at_, window_.data, size_t(window_size_),
                                  cudaMemcpyDeviceToDevice, nullptr),
                  "cast store: restore_packed");
  }
  int64_t codes_bytes() const { return has_window_ ? window_size_ : bytes_; }  // what bytes() counts

 private:
  static int64_t words(int64_t bytes) { return std::max<int64_t>((bytes + 3) / 4, 1); }
  static uint8_t* bytes_of(const Tensor& t) { return reinterpret_cast<uint8_t*>(t.data); }
  void allocate() {
    if (!full_.data) full_ = be_.empty(1, words(bytes_));
    bind_(bytes_of(full_));
  }
  Backend& be_;
  int64_t bytes_;
  std::function<void(uint8_t*)> bind_;
  Tensor full_, window_;
  int64_t window_at_ = 0, window_size_ = 0;
  bool has_window_ = false;
};

class DeviceCastStore final : public CastStore {
 public:
  DeviceCastStore(std::span<const FlatTensor> tensors, Backend& be)
      : tensors_(tensors.begin(), tensors.end()),
        cast_(tensors),
        stored_(tensors_.size()),
        mem_(be, cast_.packed_bytes(), [this](uint8_t* p) { bind(p); }) {}
  Storage storage() const override { return Storage::nvfp4_2d; }
  std::span<const FlatTensor> tensors() const override { return tensors_; }
  PackedWindows windows(std::span<const ShardRange> shards) const override { return packed_windows(tensors_, shards); }
  int64_t bytes() const override {  // codes, one UE4M3 code a tile, one FP32 scale a tensor
    return mem_.codes_bytes() + flat_layout(tensors_).tile_offset.back() + int64_t(tensors_.size()) * 4;
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
  void keep_window(int64_t at, int64_t size) override { mem_.keep_window(at, size); }
  int64_t packed_bytes() const override { return cast_.packed_bytes(); }
  void release_packed() override { mem_.release(); }
  void restore_packed() override { mem_.restore(); }
  // The layers read the form when they run (LayerPlan::w_stored), so a rebinding reaches them.
  const StoredWeight* stored(size_t t) const override { return &stored_.at(t); }

 private:
  void bind(uint8_t* p) {  // the packed buffer moved: the cast and every tensor's form follow
    cast_.bind_packed(p);
    for (size_t t = 0; t < tensors_.size(); ++t) stored_[t].form = cast_.packed_tensor(t);
  }
  std::vector<FlatTensor> tensors_;
  cuda::DeviceShardCast cast_;
  std::vector<StoredNvfp4> stored_;
  DevicePacked mem_;  // last: its constructor binds the buffer into cast_ and stored_
};

// bf16 / fp8_e4m3 on the device: one code an element (param_storage.hpp states the forms; the host store
// HostElementStore computes the same bits).
class DeviceElementStore final : public CastStore {
 public:
  DeviceElementStore(Storage s, std::span<const FlatTensor> tensors, Backend& be)
      : s_(s),
        tensors_(tensors.begin(), tensors.end()),
        cast_(tensors, s == Storage::fp8_e4m3),
        mem_(be, cast_.packed_bytes(), [this](uint8_t* p) { cast_.bind_packed(p); }) {}
  Storage storage() const override { return s_; }
  std::span<const FlatTensor> tensors() const override { return tensors_; }
  PackedWindows windows(std::span<const ShardRange> shards) const override {
    return element_windows(tensors_, code_bytes(s_), shards);
  }
  int64_t bytes() const override { return mem_.codes_bytes() + cast_.amax_count() * 4; }
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
  void keep_window(int64_t at, int64_t size) override { mem_.keep_window(at, size); }
  int64_t packed_bytes() const override { return cast_.packed_bytes(); }
  void release_packed() override { mem_.release(); }
  void restore_packed() override { mem_.restore(); }
  const StoredWeight* stored(size_t) const override { return nullptr; }  // the layers read the FP32 values

 private:
  Storage s_;
  std::vector<FlatTensor> tensors_;
  cuda::DeviceElementCast cast_;
  DevicePacked mem_;  // last: its constructor binds the buffer into cast_
};

}  // namespace

std::unique_ptr<CastStore> make_device_cast_store(Storage s, std::span<const FlatTensor> tensors, Backend& be) {
  if (s == Storage::nvfp4_2d) return std::make_unique<DeviceCastStore>(tensors, be);
  if (s == Storage::bf16 || s == Storage::fp8_e4m3) return std::make_unique<DeviceElementStore>(s, tensors, be);
  throw Error("cuda backend: no cast store for storage " + storage_name(s));
}

}  // namespace fp4lab::train
