// NVFP4 primary weights cast shard by shard (ZeRO-1 / FSDP), the scheme of
// TransformerEngine PR #2691 made exact at every offset.
//
// The flat parameter buffer holds the weight tensors back to back
// (FlatTensor: rows, cols and the flat index of element (0, 0); row-major).
// A rank owns the flat element range [begin, end): any boundaries (odd,
// mid-row, mid-tile, spanning tensors). The cast of each tensor is the canned
// `nvfp4_2d` quantizer (16x16 tiles, UE4M3 tile scales of the nv rule, FP32
// per-tensor scale from the tensor's amax, round to nearest), and the
// protocol below gives bit for bit what quantize(nvfp4_2d, W) gives for every
// tensor, whatever the number of ranks and their boundaries:
//   1. shard_partial_amax: each rank's max |x| bit patterns, per tensor and
//      per 16x16 tile (tiles numbered tensor by tensor, row-major in each),
//      over its own elements (0 where it has none);
//   2. the caller MAX-reduces both vectors over the ranks (element-wise
//      unsigned max of the bit patterns: the max magnitude, NaN dominating;
//      two all-reduces, MPI_MAX / ncclMax on uint32), so that
//   3. shard_scales gives every rank the same tile scales and per-tensor
//      scales: scales are never gathered;
//   4. shard_cast writes the rank's codes into the packed layout (FP4, two
//      codes a byte, sim/packing.hpp; tensor t's rows at packed_offset[t]):
//      the contiguous byte span that holds its elements, every nibble it does
//      not own 0;
//   5. assemble_packed ORs every rank's span into the full buffer. A byte
//      split between two ranks (a boundary at an odd column) takes each nibble
//      from its owner, and since each contribution's foreign nibbles are 0
//      nothing stale survives. (TE's #2691 indexes a rank's bytes by
//      (i - start) >> 1, wrong for odd starts, where (i >> 1) - (start >> 1)
//      is meant, and gathers whole bytes, keeping a stale nibble; its tests
//      use even offsets only.)
// The column-wise copy (the dgrad / wgrad operand) is pack_fp4_transposed of
// the same codes: 16x16 tiles are the same tiles transposed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace fp4lab {

struct FlatTensor {
  int64_t rows = 0, cols = 0;
  int64_t offset = 0;  // flat index of element (0, 0)
};

struct ShardRange {
  int64_t begin = 0, end = 0;  // flat element indices [begin, end)
};

// Where each tensor's tiles and packed bytes start (tile_offset, packed_offset,
// one more entry than tensors: the totals last).
struct FlatLayout {
  std::vector<int64_t> tile_offset;
  std::vector<int64_t> packed_offset;
};
FlatLayout flat_layout(std::span<const FlatTensor> tensors);

// Step 1. `flat` is the whole flat buffer (only [shard.begin, shard.end) is
// read); the results hold one amax bit pattern per tensor and per tile.
struct ShardAmax {
  std::vector<uint32_t> tensor;
  std::vector<uint32_t> tile;
};
ShardAmax shard_partial_amax(std::span<const FlatTensor> tensors, const float* flat, ShardRange shard);
// The MAX reduction of step 2 done in one process (in-process ranks; what
// MPI_MAX / ncclMax compute): element-wise max into `acc`.
void max_into(ShardAmax& acc, const ShardAmax& other);

// Step 3: per tile the UE4M3 scale code and the element multiplier, per
// tensor g_dec (the dequantized value is (decode(code) * decode(scale)) * g_dec).
struct ShardScales {
  std::vector<uint8_t> tile_code;
  std::vector<float> tile_mult;
  std::vector<float> g_dec;
};
ShardScales shard_scales(std::span<const FlatTensor> tensors, const ShardAmax& global);

// Step 4: the rank's bytes of the packed buffer, bytes [first_byte,
// first_byte + bytes.size()).
struct ShardBytes {
  int64_t first_byte = 0;
  std::vector<uint8_t> bytes;
};
ShardBytes shard_cast(std::span<const FlatTensor> tensors, const float* flat, ShardRange shard,
                      const ShardScales& scales);
// The bytes [begin, end) of the packed buffer that step 4 writes for `shard`
// (shard_cast's first_byte and size), from the geometry alone: every rank
// knows every rank's span. {0, 0} for a shard without tensor elements.
ShardRange packed_span(std::span<const FlatTensor> tensors, ShardRange shard);

// Step 5: the full packed buffer (flat_layout(...).packed_offset.back() bytes).
std::vector<uint8_t> assemble_packed(std::span<const FlatTensor> tensors, std::span<const ShardBytes> parts);

// Step 5 as one all-gather of equal parts (ncclAllGather; no OR reduction,
// which NCCL lacks): rank r sends the `size` bytes at[r] of its packed
// buffer after step 4, a window that holds its span (packed_span) and
// otherwise zeros (step 4 zeroes the buffer), so ORing every rank's window
// into place gives assemble_packed's buffer. size = the longest span;
// at[r] = min(span begin, total - size) keeps the window inside the buffer.
struct PackedWindows {
  int64_t size = 0;
  std::vector<int64_t> at;  // one per shard
};
PackedWindows packed_windows(std::span<const FlatTensor> tensors, std::span<const ShardRange> shards);
// `windows`: w.at.size() windows of w.size bytes back to back (rank order),
// each ORed into `packed` at its w.at.
void or_windows(std::span<uint8_t> packed, std::span<const uint8_t> windows, const PackedWindows& w);

// The dequantized values of the packed codes (assemble_packed's buffer) into
// the flat buffer at each tensor's elements: (decode(code) * decode(tile
// scale)) * g_dec, what quantize(nvfp4_2d, W).dequant holds. Other elements
// of `flat` are left as they are.
void dequantize_packed(std::span<const FlatTensor> tensors, std::span<const uint8_t> packed, const ShardScales& scales,
                       float* flat);

// The column-wise copy (the dgrad / wgrad operand): every tensor's codes of
// `packed` as the packing of its transpose, [cols, ceil(rows/2)] bytes each,
// back to back in tensor order (the 16x16 tiles and scales are the same tiles
// transposed, so the codes equal quantize(nvfp4_2d, W^T)'s).
std::vector<uint8_t> transpose_packed(std::span<const FlatTensor> tensors, std::span<const uint8_t> packed);
// The column-wise copy's tile codes: every tensor's UE4M3 tile codes
// (ShardScales::tile_code, [ceil(rows/16), ceil(cols/16)] row-major each) as
// those of its transpose, [ceil(cols/16), ceil(rows/16)] each, back to back in
// tensor order (the same offsets: a tensor has as many tiles as its transpose).
// quantize(nvfp4_2d, W^T)'s scale codes: the tile (j, i) of W^T is the tile
// (i, j) of W, with the same amax, and W^T has W's tensor amax.
std::vector<uint8_t> transpose_tile_codes(std::span<const FlatTensor> tensors, std::span<const uint8_t> tile_code);

// Geometry shared by the host protocol and the GPU one (cuda/shard_cast.hpp):
// the part of `shard` inside tensor t as tensor-local element indices
// (empty: begin >= end), and the tensor-local packed bytes [begin, end) that
// hold the elements of such a part (a part starting or ending on an odd
// column shares its first or last byte with a neighbour).
ShardRange tensor_part(const FlatTensor& t, ShardRange shard);
ShardRange packed_bytes_of(const FlatTensor& t, ShardRange part);

// Splits [0, total) into n ranges of sizes differing by at most one (the
// first total % n ranges one longer): ZeRO-1's default shards.
std::vector<ShardRange> even_shards(int64_t total, int n);

}  // namespace fp4lab
