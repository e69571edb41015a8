// Parameter storage precisions and the host cast stores (param_storage.hpp, storage.hpp).
#include "train/param_storage.hpp"

#include <algorithm>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "sim/element_layout.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab::train {

std::string storage_name(Storage s) {
  switch (s) {
    case Storage::fp32: return "fp32";
    case Storage::nvfp4_2d: return "nvfp4_2d";
    case Storage::bf16: return "bf16";
    case Storage::fp8_e4m3: return "fp8_e4m3";
  }
  throw InternalError("storage_name: unknown Storage " + std::to_string(int(s)));
}

const QuantizerSpec* storage_cast(Storage s) {
  static const QuantizerSpec nvfp4_2d = quantizer_by_name("nvfp4_2d");
  static const QuantizerSpec fp8_tensor = quantizer_by_name("fp8_e4m3_tensor");
  switch (s) {
    case Storage::fp32: return nullptr;
    case Storage::bf16: return nullptr;  // RNE to BF16 is idempotent: no layer's rounding needs dropping
    case Storage::nvfp4_2d: return &nvfp4_2d;
    case Storage::fp8_e4m3: return &fp8_tensor;
  }
  throw InternalError("storage_cast: unknown Storage " + std::to_string(int(s)));
}

const char* gather_format_name(GatherFormat g) {
  switch (g) {
    case GatherFormat::fp32: return "fp32";
    case GatherFormat::bf16: return "bf16";
    case GatherFormat::fp8: return "fp8";
    case GatherFormat::nvfp4: return "nvfp4";
  }
  throw InternalError("gather_format_name: unknown GatherFormat " + std::to_string(int(g)));
}

GatherFormat gather_format_of(Storage s) {
  switch (s) {
    case Storage::fp32: return GatherFormat::fp32;
    case Storage::bf16: return GatherFormat::bf16;
    case Storage::fp8_e4m3: return GatherFormat::fp8;
    case Storage::nvfp4_2d: return GatherFormat::nvfp4;
  }
  throw InternalError("gather_format_of: unknown Storage " + std::to_string(int(s)));
}

int64_t code_bytes(Storage s) {
  if (s == Storage::bf16) return 2;
  if (s == Storage::fp8_e4m3) return 1;
  throw InternalError("code_bytes: storage " + storage_name(s) + " has no one-code-an-element form");
}

namespace {

// A host store's full packed buffer and its kept window (CastStore's keep_window / release_packed /
// restore_packed), shared by both host stores.
class HostPackedStore : public CastStore {
 public:
  std::span<uint8_t> packed() override { return packed_; }
  void set_packed(const std::vector<uint8_t>& full) override {
    if (int64_t(full.size()) != full_bytes_)
      throw Error("shard cast: " + std::to_string(full.size()) + " packed bytes, the tensors need " +
                  std::to_string(full_bytes_));
    packed_ = full;
  }
  void or_windows(std::span<const uint8_t> windows, const PackedWindows& w) override {
    fp4lab::or_windows(mem("or_windows"), windows, w);
  }
  void keep_window(int64_t at, int64_t size) override {
    const std::vector<uint8_t>& p = mem("keep_window");
    if (at < 0 || size < 0 || at + size > full_bytes_)
      throw InternalError("keep_window: [" + std::to_string(at) + ", +" + std::to_string(size) +
                          ") outside the packed buffer of " + std::to_string(full_bytes_) + " bytes");
    window_.assign(p.begin() + at, p.begin() + at + size);
    window_at_ = at;
    has_window_ = true;
  }
  int64_t packed_bytes() const override { return full_bytes_; }
  void release_packed() override { std::vector<uint8_t>().swap(packed_); }
  void restore_packed() override {
    packed_.assign(size_t(full_bytes_), uint8_t(0));
    if (has_window_) std::copy(window_.begin(), window_.end(), packed_.begin() + window_at_);
  }

 protected:
  explicit HostPackedStore(int64_t full_bytes) : full_bytes_(full_bytes), packed_(size_t(full_bytes)) {}
  // The codes bytes() counts: the kept window, else the full buffer.
  int64_t codes_bytes() const { return has_window_ ? int64_t(window_.size()) : full_bytes_; }
  // The full buffer, or InternalError naming `step` where it was released and not restored.
  std::vector<uint8_t>& mem(const char* step) {
    if (int64_t(packed_.size()) != full_bytes_)
      throw InternalError(std::string("cast store: ") + step + " with the packed buffer released");
    return packed_;
  }
  const std::vector<uint8_t>& mem(const char* step) const { return const_cast<HostPackedStore*>(this)->mem(step); }

 private:
  int64_t full_bytes_;
  std::vector<uint8_t> packed_, window_;
  int64_t window_at_ = 0;
  bool has_window_ = false;
};

// sim/shard_cast.hpp's steps on host memory. amax_ holds the tensor maxima,
// then the tile maxima (the device store's layout: one array to reduce).
class HostCastStore final : public HostPackedStore {
 public:
  explicit HostCastStore(std::span<const FlatTensor> tensors)
      : HostPackedStore(flat_layout(tensors).packed_offset.back()),
        tensors_(tensors.begin(), tensors.end()),
        layout_(flat_layout(tensors)) {
    amax_.resize(tensors_.size() + size_t(layout_.tile_offset.back()));
  }
  Storage storage() const override { return Storage::nvfp4_2d; }
  std::span<const FlatTensor> tensors() const override { return tensors_; }
  PackedWindows windows(std::span<const ShardRange> shards) const override { return packed_windows(tensors_, shards); }
  int64_t bytes() const override {  // codes, one UE4M3 code a tile, one FP32 scale a tensor
    return codes_bytes() + layout_.tile_offset.back() + int64_t(tensors_.size()) * 4;
  }
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
    std::vector<uint8_t>& packed = mem("cast");
    span_ = shard_cast(tensors_, flat, shard, scales_);
    std::fill(packed.begin(), packed.end(), uint8_t(0));
    std::copy(span_.bytes.begin(), span_.bytes.end(), packed.begin() + span_.first_byte);
  }
  ShardBytes span() const override { return span_; }
  void dequantize(float* flat) const override { dequantize_packed(tensors_, mem("dequantize"), scales_, flat); }
  ShardScales scales() const override { return scales_; }
  const StoredWeight* stored(size_t) const override { return nullptr; }

 private:
  std::vector<FlatTensor> tensors_;
  FlatLayout layout_;
  std::vector<uint32_t> amax_;
  ShardScales scales_;
  ShardBytes span_;
};

// The element-wise forms (bf16, fp8_e4m3; param_storage.hpp states them): one code of code_bytes(s) bytes an
// element, the tensors' codes back to back in tensor order (little-endian for BF16), so a shard's elements
// are one contiguous byte span and no byte is shared between ranks. fp8_e4m3 keeps one scale a tensor from
// the tensor's MAX-reduced amax.
class HostElementStore final : public HostPackedStore {
 public:
  HostElementStore(Storage s, std::span<const FlatTensor> tensors)
      : HostPackedStore(element_bytes(tensors, code_bytes(s))),
        s_(s),
        b_(code_bytes(s)),
        tensors_(tensors.begin(), tensors.end()) {
    code_at_ = element_code_at(tensors_);
    if (s_ == Storage::fp8_e4m3) amax_.resize(tensors_.size());
    encode_.assign(tensors_.size(), 1.0f);
    decode_.assign(tensors_.size(), 1.0f);
  }
  Storage storage() const override { return s_; }
  std::span<const FlatTensor> tensors() const override { return tensors_; }
  PackedWindows windows(std::span<const ShardRange> shards) const override {
    return element_windows(tensors_, b_, shards);
  }
  int64_t bytes() const override { return codes_bytes() + int64_t(amax_.size()) * 4; }
  bool device() const override { return false; }
  void partial_amax(const float* flat, ShardRange shard) override {
    std::fill(amax_.begin(), amax_.end(), 0u);
    for (size_t t = 0; t < amax_.size(); ++t) {
      const ShardRange p = tensor_part(tensors_[t], shard);
      for (int64_t i = p.begin; i < p.end; ++i) amax_[t] = std::max(amax_[t], abs_bits(flat[tensors_[t].offset + i]));
    }
  }
  std::span<uint32_t> amax() override { return amax_; }
  void compute_scales() override {
    for (size_t t = 0; t < amax_.size(); ++t) {  // fp8_e4m3 only: bf16 has no scale
      const TensorScale ts = tensor_amax_scale(bits_float(amax_[t]), max_finite(float8_e4m3fn));
      encode_[t] = ts.encode;
      decode_[t] = ts.decode;
    }
  }
  void cast(const float* flat, ShardRange shard) override {
    std::vector<uint8_t>& packed = mem("cast");
    std::fill(packed.begin(), packed.end(), uint8_t(0));
    for (size_t t = 0; t < tensors_.size(); ++t) {
      const ShardRange p = tensor_part(tensors_[t], shard);
      for (int64_t i = p.begin; i < p.end; ++i)
        put(packed, code_at_[t] + i, encode(t, flat[tensors_[t].offset + i]));
    }
    const ShardRange sp = byte_span(shard);
    span_.first_byte = sp.begin;
    span_.bytes.assign(packed.begin() + sp.begin, packed.begin() + sp.end);
  }
  ShardBytes span() const override { return span_; }
  void dequantize(float* flat) const override {
    const std::vector<uint8_t>& packed = mem("dequantize");
    for (size_t t = 0; t < tensors_.size(); ++t)
      for (int64_t i = 0; i < tensors_[t].rows * tensors_[t].cols; ++i)
        flat[tensors_[t].offset + i] = decode_value(t, get(packed, code_at_[t] + i));
  }
  ShardScales scales() const override {
    ShardScales s;
    if (s_ == Storage::fp8_e4m3) s.g_dec = decode_;
    return s;
  }
  const StoredWeight* stored(size_t) const override { return nullptr; }

 private:
  ShardRange byte_span(ShardRange shard) const { return element_byte_span(tensors_, code_at_, b_, shard); }
  uint32_t encode(size_t t, float x) const {
    // nonsaturate: IEEE round to nearest even (past the largest finite BF16 gives Inf, Inf stays Inf), the
    // layers' BF16 rounding (recipes/linear_plan.hpp); NaN gives the canonical 0x7FFF.
    if (s_ == Storage::bf16) return encode_rn_f32<bfloat16>(x, Overflow::nonsaturate);
    return encode_rn_f32<float8_e4m3fn>(x * encode_[t], Overflow::saturate);
  }
  float decode_value(size_t t, uint32_t code) const {
    if (s_ == Storage::bf16) return decode(bfloat16, code);
    return decode(float8_e4m3fn, code) * decode_[t];
  }
  void put(std::vector<uint8_t>& packed, int64_t k, uint32_t code) const {
    for (int64_t b = 0; b < b_; ++b) packed[size_t(k * b_ + b)] = uint8_t(code >> (8 * b));
  }
  uint32_t get(const std::vector<uint8_t>& packed, int64_t k) const {
    uint32_t c = 0;
    for (int64_t b = 0; b < b_; ++b) c |= uint32_t(packed[size_t(k * b_ + b)]) << (8 * b);
    return c;
  }
  Storage s_;
  int64_t b_;
  std::vector<FlatTensor> tensors_;
  std::vector<int64_t> code_at_;  // per tensor: its first element's code index in packed_
  std::vector<uint32_t> amax_;    // fp8_e4m3: the tensors' maxima (bit patterns); bf16: none
  std::vector<float> encode_, decode_;
  ShardBytes span_;
};

}  // namespace

std::unique_ptr<CastStore> make_host_element_store(Storage s, std::span<const FlatTensor> tensors) {
  return std::make_unique<HostElementStore>(s, tensors);
}

std::unique_ptr<CastStore> make_host_cast_store(std::span<const FlatTensor> tensors) {
  return std::make_unique<HostCastStore>(tensors);
}

}  // namespace fp4lab::train
