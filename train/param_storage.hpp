// How a parameter is stored: the precision every reader of its values sees
// (the model's layers, evaluation, final_params), recorded per parameter in
// the ParamStore (train/params.hpp). The optimiser's FP32 master values are
// apart from it (train/dist/data_parallel.hpp keeps them); after every step a
// parameter's values are storage_cast(storage) of its master, exactly.
//
// The stored form of the low-precision tensors lives in a CastStore, which
// the backend makes (Backend::make_cast_store): for nvfp4_2d the host
// protocol of sim/shard_cast.hpp on the CPU, its device kernels
// (cuda/shard_cast.hpp) on the GPU; for bf16 and fp8_e4m3 one code an
// element (make_host_element_store; host only so far). A layer gets its
// tensor's form as an opaque StoredWeight (LayerPlan::w_stored) and hands it
// back to the backend that made it.
//
// The forms (config distributed.primary_weights "fp32" | "bf16" | "fp8" | "nvfp4"):
//   fp32      the master itself.
//   bf16      round to nearest even of the master to BF16 (core's
//             encode_rn_f32<bfloat16>): 2 bytes an element. A NaN master is
//             stored as the canonical BF16 NaN 0x7FFF (sign dropped; core's
//             codec), decoding to a quiet NaN; +-Inf and -0 are kept, and
//             magnitudes past BF16's largest finite round to Inf (IEEE, the
//             layers' BF16 rounding: Overflow::nonsaturate); float32
//             subnormals round to BF16's (same exponent range).
//   fp8_e4m3  torchao's float8 tensorwise cast (sim's "fp8_e4m3_tensor"):
//             per tensor encode = 448 / amax in FP32 (amax over the whole
//             tensor, every rank's part: the MAX all-reduce of the cast),
//             decode = 1 / encode; amax 0, Inf or NaN gives encode = decode =
//             1 (sim/scale_rules.hpp tensor_amax_scale); an encode above
//             FLT_MAX is clamped to it. Each element E4M3(x * encode), round
//             to nearest even, saturating at +-448 (NaN -> 0x7F); its value
//             decode(code) * decode. 1 byte an element plus one FP32 a tensor.
//   nvfp4_2d  NVFP4 with 16x16 tiles (sim's "nvfp4_2d"): 0.5 byte an element,
//             one UE4M3 code a tile, one FP32 a tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sim/quantizer.hpp"
#include "sim/shard_cast.hpp"
#include "train/storage.hpp"

namespace fp4lab::train {

// The name summaries and messages use: "fp32", "bf16", "fp8_e4m3", "nvfp4_2d".
std::string storage_name(Storage s);

// The quantizer whose output a parameter stored as `s` holds (nvfp4_2d:
// quantizer_by_name("nvfp4_2d"); fp8_e4m3: "fp8_e4m3_tensor"), or null where
// the values are the master's (fp32) or its BF16 rounding (bf16: a layer that
// rounds W to BF16 again gets the same values, RNE being idempotent, so no
// quantizer needs dropping). A linear layer takes it as
// LinearContext::weight_cast. The pointer is valid for the program's life.
const QuantizerSpec* storage_cast(Storage s);

// One tensor's stored form in a backend's memory, as that backend defines it
// (the cuda backend: its packed NVFP4 codes, tile codes and g_dec,
// train/cuda/cast_store.hpp). Other code passes it on untouched.
class StoredWeight {
 public:
  virtual ~StoredWeight() = default;
};

// The cast of a set of tensors of a flat FP32 buffer to one storage form, in
// one backend's memory: the steps of sim/shard_cast.hpp's protocol (written
// for NVFP4; the element-wise forms follow the same steps with one code of
// 1 or 2 bytes an element, no tile maxima and, for bf16, no maxima at all),
// which train/dist/primary_weights.hpp's run_cast drives over a
// communicator. `flat` is the whole flat buffer in the backend's memory
// (device() says which); a shard is a range of its elements.
class CastStore {
 public:
  virtual ~CastStore() = default;
  virtual Storage storage() const = 0;
  // The tensors, in the order of the packed layout (increasing offsets).
  virtual std::span<const FlatTensor> tensors() const = 0;
  // Every shard's window of packed() (what gather_windows moves): equal sizes, each holding its shard's
  // bytes (sim's packed_windows for NVFP4).
  virtual PackedWindows windows(std::span<const ShardRange> shards) const = 0;
  // Bytes the store holds while its tensors are not in use: the packed codes (the full buffer, or the kept
  // window where one is kept and the buffer released: below) and the scales.
  virtual int64_t bytes() const = 0;
  // amax() and packed() are device memory (else host memory).
  virtual bool device() const = 0;
  // Step 1: this shard's maxima into amax(): the tensors' maxima, then every tile's (tile_offset order;
  // nvfp4_2d), the tensors' only (fp8_e4m3), none (bf16: amax() is empty and nothing is reduced).
  virtual void partial_amax(const float* flat, ShardRange shard) = 0;
  // Step 2 is the caller's: amax() MAX-reduced in place over the ranks.
  virtual std::span<uint32_t> amax() = 0;
  // Step 3: the tile and tensor scales from amax().
  virtual void compute_scales() = 0;
  // Step 4: packed() zeroed, then this shard's codes written (the bytes that hold its elements).
  virtual void cast(const float* flat, ShardRange shard) = 0;
  // The full packed buffer (nvfp4_2d: flat_layout(tensors()).packed_offset.back() bytes; element-wise: the
  // tensors' codes back to back, code_bytes(storage()) an element).
  virtual std::span<uint8_t> packed() = 0;
  // The byte span the last cast wrote (what a rank sends), on the host.
  virtual ShardBytes span() const = 0;
  // Step 5 done elsewhere: the assembled full packed buffer (host memory) put back.
  virtual void set_packed(const std::vector<uint8_t>& full) = 0;
  // Step 5 from every rank's window (sim's packed_windows), `windows` in the
  // store's memory: ORed into packed() (sim's or_windows).
  virtual void or_windows(std::span<const uint8_t> windows, const PackedWindows& w) = 0;
  // Step 6: every tensor element of `flat` set to its dequantized cast; other elements unchanged.
  virtual void dequantize(float* flat) const = 0;
  // What compute_scales wrote, on the host (for checks; element-wise: g_dec only, fp8_e4m3's decode scales).
  virtual ShardScales scales() const = 0;
  // A store may hold only one window of packed() while its tensors are not in use (ZeRO-3 keeps this rank's
  // between gathers: train/dist/sharded_params.hpp). A store starts with its full buffer and no window.
  // keep_window(at, size): a copy of packed()'s bytes [at, at + size) kept (after a cast whose span lies
  // inside it: what this rank sends, the rest of packed() zero). release_packed(): the full buffer freed
  // (packed() empty; the stored() forms name no codes until restore_packed). restore_packed(): a full
  // buffer again, zero but for the kept window (if any) in its place: packed() as the cast left it.
  virtual void keep_window(int64_t at, int64_t size) = 0;
  virtual int64_t packed_bytes() const = 0;  // the full buffer's size (held or released)
  virtual void release_packed() = 0;
  virtual void restore_packed() = 0;
  // Tensor t's stored form for the layers (valid while the store lives; each cast rewrites what it
  // names), or null where the layers take the dequantized values (the host store).
  virtual const StoredWeight* stored(size_t t) const = 0;
};

// The nvfp4_2d CastStore of a backend whose tensors are host memory (the cpu
// backend): sim/shard_cast.hpp's functions. stored() is null: the layers read
// the dequantized values.
std::unique_ptr<CastStore> make_host_cast_store(std::span<const FlatTensor> tensors);
// The bf16 or fp8_e4m3 CastStore in host memory (the forms above; stored() null).
std::unique_ptr<CastStore> make_host_element_store(Storage s, std::span<const FlatTensor> tensors);
// Bytes a code of an element-wise storage takes (bf16 2, fp8_e4m3 1); Error for the others.
int64_t code_bytes(Storage s);

}  // namespace fp4lab::train
