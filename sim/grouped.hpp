// Grouped quantization: a tensor whose rows are cut into consecutive groups
// (a mixture of experts' tokens permuted by expert, or a 3-D expert weight
// [E, N, K] seen as E groups of N rows), each group quantized ALONE.
//
// Semantics (docs/DESIGN.md, "Mixture of experts"):
//  - group g is rows [offset_g, offset_g + rows_g) with offset_g the sum of the
//    earlier groups' sizes; sizes may be 0 (an expert that received no token)
//    and need not be multiples of the block;
//  - quantize_grouped(q, x, sizes, streams) equals, group by group,
//    quantize(q, rows of group g, streams[g]): blocks never cross a group
//    boundary (a group's last partial block follows the partial-block rule of
//    sim/quantizer.hpp), a [16,1] / [32,1] block runs down the columns of its
//    group only (the wgrad operand of an expert), a [16,16] tile lies inside
//    its group, the global scale (NVFP4's tensor_amax, row_amax) is the group's
//    own, RHT mixes rows of the group only, and stochastic rounding draws word
//    w of group g (sim/quantizer.hpp's numbering inside the group's slice)
//    from streams[g];
//  - the result concatenates the groups' outputs: codes and dequant are
//    [rows, cols] row-major (group g's rows at its offset); the block scales of
//    group g are its own [ceil(rows_g / block_rows), ceil(cols / block_cols)]
//    matrix, stacked in group order ([scale_row_offset(g) ...]); global_decode
//    has one entry per group (1 where the rule has none; also for an empty
//    group).
// Group sizes come from .npy files as int64 (the CLI's --groups).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

struct GroupedQuantizedTensor {
  QuantizerSpec spec;
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> group_rows;       // sizes, sum = rows
  std::vector<uint8_t> codes;            // [rows * cols], one code per byte
  int64_t scale_cols = 0;                // ceil(cols / block_cols)
  std::vector<int64_t> scale_row_offset;  // [groups + 1]: group g's scale rows are [off[g], off[g+1])
  std::vector<uint8_t> scale_codes;      // [off[groups] * scale_cols] (empty for float32 scales)
  std::vector<float> scales;             // [off[groups] * scale_cols] decoded
  std::vector<float> global_decode;      // [groups]
  std::vector<float> dequant;            // [rows * cols]
};

// Throws fp4lab::Error naming `what` unless every size is >= 0 and they sum to rows.
void check_group_sizes(const char* what, std::span<const int64_t> sizes, int64_t rows);

// Stochastic-rounding streams per group: one per group, or empty (every group
// draws from RandomStream{} like an unseeded quantize()).
GroupedQuantizedTensor quantize_grouped(const QuantizerSpec& q, MatrixView<const float> x,
                                        std::span<const int64_t> sizes, std::span<const RandomStream> streams = {});

// The CLI's streams for a grouped tensor: group g draws from
// RandomStream{seed, stream + g}.
std::vector<RandomStream> consecutive_streams(uint64_t seed, uint64_t stream, size_t groups);

// Block-scaled grouped GEMMs on Blackwell take each group's scales in the
// swizzled layout of sim/packing.hpp, groups one after another: group g's
// [rows_g, C] scale matrix (C = blocks along K) is swizzled alone (padded to
// round_up(rows_g, 128) x round_up(C, 4), padding 0) and placed at byte
// swizzled_group_offset(g), the sum of the earlier groups' padded sizes (an
// empty group takes no bytes).
std::vector<int64_t> swizzled_group_offsets(std::span<const int64_t> sizes, int64_t cols);  // [groups + 1]
std::vector<uint8_t> swizzle_scales_grouped(const uint8_t* scales, std::span<const int64_t> sizes, int64_t cols);

// Why q's scales have no swizzled layout ("" when they have one): the layout is
// the GEMM's scale operand of 4-bit elements (NVFP4, MXFP4), one scale row per
// row of the operand, blocks along K (the row): not for other elements, for
// per-tensor or float32 scales, or for column blocks ([br,1]).
std::string swizzle_refusal(const QuantizerSpec& q);
// The scales of a grouped quantization (one group: a plain one) in the
// swizzled layout: each group's scales expanded to one scale row per data row
// ([br,bc] tiles repeat their scale for their br rows, as the GEMM reads them),
// then swizzle_scales_grouped over the data rows of the groups. Throws
// fp4lab::Error with swizzle_refusal's reason where there is one.
std::vector<uint8_t> swizzled_scales(const GroupedQuantizedTensor& g);
// The same for a plain quantization (the grouped layout of a single group).
std::vector<uint8_t> swizzled_scales(const QuantizedTensor& q);

}  // namespace fp4lab
