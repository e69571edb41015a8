// The element-wise parameter casts (train/param_storage.hpp's bf16 and
// fp8_e4m3 storage) on the GPU: the steps of sim/shard_cast.hpp's protocol
// with one code an element, bit for bit what the host store
// (train/param_storage.cpp HostElementStore) computes with the same scalar
// codecs (core/encode.hpp, sim/scale_rules.hpp; the library is built with
// --fmad=false):
//   bf16      code = encode_rn_f32<bfloat16>(x, nonsaturate), 2 bytes
//             (little-endian) an element; no maxima, no scale.
//   fp8_e4m3  per tensor the maxima of |x| bit patterns (integer atomicMax:
//             order-independent), the caller's MAX all-reduce, then
//             tensor_amax_scale(amax, 448) on the device; code =
//             encode_rn_f32<float8_e4m3fn>(x * encode, saturate), 1 byte.
// packed() holds the tensors' codes back to back in tensor order, so a
// shard's codes are one contiguous byte span. Everything runs on the legacy
// default stream and is complete on return, but compute_scales (whose
// results only later steps read, in stream order).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/device.hpp"
#include "cuda/shard_cast.hpp"  // PackedMemory
#include "sim/shard_cast.hpp"

namespace fp4lab::cuda {

class DeviceElementCast {
 public:
  // fp8: the fp8_e4m3 form, else bf16. The tensors as in sim/shard_cast.hpp.
  DeviceElementCast(std::span<const FlatTensor> tensors, bool fp8);

  // fp8: this shard's per-tensor maxima into amax() (zeroed first); bf16: nothing (amax_count() 0).
  void partial_amax(const float* flat, ShardRange shard);
  uint32_t* amax() { return amax_.data(); }
  int64_t amax_count() const { return int64_t(amax_.size()); }
  void compute_scales();
  // The per-tensor decode scales (fp8; empty for bf16), downloaded (for checks).
  std::vector<float> decode_scales() const;

  // packed() zeroed, then this shard's codes written.
  void cast(const float* flat, ShardRange shard);
  uint8_t* packed() { return packed_.data(); }
  int64_t packed_bytes() const { return packed_.bytes(); }
  // packed()'s memory, as DeviceShardCast::bind_packed (cuda/shard_cast.hpp): the caller's `p`
  // (packed_bytes() bytes) from then on, the own buffer freed; null: none until the next bind.
  void bind_packed(uint8_t* p) { packed_.bind(p); }
  // The bytes [begin, end) of packed() that hold `shard`'s tensor elements ({0, 0}: none).
  ShardRange byte_span(ShardRange shard) const;
  ShardBytes span() const;  // the last cast's span, downloaded
  void set_packed(const std::vector<uint8_t>& full);
  void or_windows(std::span<const uint8_t> windows, const PackedWindows& w);
  // Every tensor element of `flat` (device) set to its stored value; other elements unchanged.
  void dequantize(float* flat) const;

 private:
  std::vector<FlatTensor> tensors_;
  std::vector<int64_t> code_at_;  // per tensor: its first element's code index
  bool fp8_;
  int64_t code_bytes_;
  DeviceBuffer<uint32_t> amax_;          // fp8: [tensors]
  DeviceBuffer<float> encode_, decode_;  // fp8: [tensors]
  PackedMemory packed_;
  ShardRange span_;
  DeviceBuffer<int64_t> window_at_;
};

}  // namespace fp4lab::cuda
