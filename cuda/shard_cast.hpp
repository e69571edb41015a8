// The NVFP4 primary-weight cast of sim/shard_cast.hpp on the GPU: the same
// protocol steps on a flat FP32 device buffer, bit for bit the host
// functions' results (the same scalar codecs, core/encode.hpp and
// core/format.hpp; the library is built with --fmad=false).
//
//   1. partial_amax: this rank's maxima of |x| bit patterns per tensor and per
//      16x16 tile over its element range (integer atomicMax: order-independent,
//      so the result does not depend on timing). amax() holds the tensor
//      maxima, then the tile maxima (tile_offset order): one array for the
//      MAX all-reduce.
//   2. (the caller MAX-reduces amax() over the ranks)
//   3. compute_scales: sim's shard_scales from the reduced maxima, on the
//      device (the same scalar rules, sim/scale_rules.hpp): nothing travels.
//   4. cast: the rank's codes into packed() (the packed layout of all tensors,
//      zeroed first): every byte holding one of its elements is written whole,
//      foreign nibbles 0.
//   5. (the caller gathers every rank's window of packed() and ORs them in:
//      or_windows on the device, or set_packed from the host; primary_weights.hpp's run_cast)
//   6. dequantize: (decode(code) * decode(tile scale)) * g_dec into the flat
//      buffer at every tensor element (what sim's dequantize_packed writes).
// Afterwards packed_tensor(t) names tensor t's packed form on the device, which a
// linear layer decodes into its exact BF16 GEMM operand (cast_operand_device),
// or which a native FP4 GEMM takes as it is (cuda/packed_operand.hpp: the
// row-wise QuantOperand, and the column-wise one made from it by the
// nibble-packed transpose).
// Everything runs on the legacy default stream; every step but compute_scales
// (whose results only later steps read, in stream order) is complete on return.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/device.hpp"
#include "sim/shard_cast.hpp"

namespace fp4lab::cuda {

// One tensor's NVFP4 cast in its packed form, in device memory: the codes
// (E2M1 nibbles, ceil(cols/2) bytes a row, the even column in the low
// nibble), one UE4M3 code per 16x16 tile (ceil(cols/16) a row of tiles) and
// the global decode scale (one float): W = (decode(code) * decode(tile)) * g_dec.
struct PackedNvfp4 {
  const uint8_t* packed = nullptr;
  const uint8_t* tile_codes = nullptr;
  const float* g_dec = nullptr;
};

// The packed buffer of a device cast (DeviceShardCast, DeviceElementCast): the
// object's own (allocated with it) until the caller binds memory of its own
// (bind: `p` of bytes() bytes is the buffer from then on, the own one freed;
// null: none). `what` names the cast in errors ("shard cast", "element cast").
class PackedMemory {
 public:
  PackedMemory(int64_t bytes, const char* what);
  void bind(uint8_t* p);
  uint8_t* data() const { return ptr_; }
  int64_t bytes() const { return bytes_; }
  // data(), or Error naming `step` where no buffer is bound.
  uint8_t* need(const char* step) const;
  // The buffer set to `full` from the host (Error unless bytes() long).
  void upload(const std::vector<uint8_t>& full);

 private:
  DeviceBuffer<uint8_t> own_;
  uint8_t* ptr_ = nullptr;
  int64_t bytes_ = 0;
  const char* what_;
};

class DeviceShardCast {
 public:
  // The tensors as in sim/shard_cast.hpp (offsets into the flat buffer, back to back).
  explicit DeviceShardCast(std::span<const FlatTensor> tensors);

  void partial_amax(const float* flat, ShardRange shard);
  uint32_t* amax() { return amax_.data(); }
  int64_t amax_count() const { return int64_t(amax_.size()); }

  void compute_scales();
  // What compute_scales wrote, downloaded (for checks; the cast does not need it on the host).
  ShardScales scales() const;

  void cast(const float* flat, ShardRange shard);
  uint8_t* packed() { return packed_.data(); }
  int64_t packed_bytes() const { return packed_.bytes(); }
  // Where packed() lives: a buffer of the object's own, made by the constructor, unless the caller binds
  // memory of its own (ZeRO-3 holds a unit's full buffer only while the unit is gathered, in its backend's
  // pool: train/cuda/cast_store.cpp): `p` (packed_bytes() bytes of device memory, contents kept) is packed()
  // from then on, the own buffer freed; null leaves no packed buffer (packed() null: a step that reads or
  // writes it throws until the next bind). packed_tensor's pointers follow the binding.
  void bind_packed(uint8_t* p) { packed_.bind(p); }
  // The byte span the last cast wrote (sim's ShardBytes: what a rank sends), and
  // the full packed buffer put back (what the ranks' spans assemble to).
  ShardBytes span() const;
  void set_packed(const std::vector<uint8_t>& full);
  // Every rank's window (sim's packed_windows; `windows` device memory, rank
  // order) ORed into packed(): one thread a packed byte, no atomics.
  void or_windows(std::span<const uint8_t> windows, const PackedWindows& w);

  void dequantize(float* flat) const;
  // Tensor t's cast as the linear layers take it (the pointers are fixed
  // until the next bind_packed; the contents valid after compute_scales and
  // set_packed / cast, until the next cast).
  PackedNvfp4 packed_tensor(size_t t) const;
  // The column-wise copy of packed() (sim's transpose_packed) into `out`
  // (device, packed_bytes_transposed() bytes), every tensor at once. The
  // trainer's Hopper GEMMs do not take it: they decode the row-wise codes to
  // BF16 (packed_tensor()), for W and for W^T alike. A native FP4 GEMM's W^T
  // operand is one tensor's copy, made where that GEMM takes it by the same
  // transpose (packed_operand_columnwise, cuda/packed_operand.hpp).
  void transpose(uint8_t* out) const;
  int64_t packed_bytes_transposed() const;

 private:
  std::vector<FlatTensor> tensors_;
  FlatLayout layout_;
  DeviceBuffer<uint32_t> amax_;
  DeviceBuffer<float> tile_mult_;
  DeviceBuffer<uint8_t> tile_code_;
  PackedMemory packed_;
  DeviceBuffer<float> g_dec_;  // [tensors] the global decode scales
  int64_t span_begin_ = 0, span_end_ = 0;
  DeviceBuffer<int64_t> window_at_;  // or_windows' w.at
};

// Every window (sim's packed_windows: w.at.size() windows of w.size bytes at
// w.at, `windows` device memory, rank order) ORed into `packed` (device,
// `total` bytes): one thread a packed byte, no atomics. `at` is the caller's
// device room for w.at. Checks the windows lie inside the buffer.
void or_windows_device(uint8_t* packed, int64_t total, std::span<const uint8_t> windows, const PackedWindows& w,
                       DeviceBuffer<int64_t>& at);

// The exact BF16 GEMM operand of a cast [rows, cols] (row-major) into `out`
// (rows * cols values, device), on `stream`: decode(code) * decode(tile
// scale), which has at most 6 significant bits (e2m1: 2, ue4m3: 4) and lies in
// [2^-10, 6 * 448] or is 0, so it is exact in BF16, and the cast's value is
// out * g_dec in one FP32 multiply, bit for bit.
void cast_operand_device(const PackedNvfp4& c, int64_t rows, int64_t cols, uint16_t* out, cudaStream_t stream);

}  // namespace fp4lab::cuda
