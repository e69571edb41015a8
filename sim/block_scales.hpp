// The block grid and per-block scales of a quantizer (sim/quantizer.hpp), the
// building blocks its quantize() uses, public so that the CUDA backend's host
// code, the CLI's statistics and tests compute the same grid and scales.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "sim/block_rule.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

// Block tiling of a [rows, cols] tensor: blocks of br x bc ([0,0] -> one block
// of the whole tensor), nbr x nbc of them, the last row/column of blocks
// possibly partial.
struct BlockGrid {
  int64_t br = 1, bc = 1, nbr = 0, nbc = 0;
};
BlockGrid block_grid(const QuantizerSpec& q, int64_t rows, int64_t cols);

// max(|x| bit pattern) over each block's valid elements, [nbr * nbc] row-major; with drop_nan, NaN elements
// count as 0 (sim/block_rule.hpp's amax_bits_of).
std::vector<uint32_t> block_amax_bits(const BlockGrid& g, MatrixView<const float> x, bool drop_nan = false);

// Per-block scales of a tensor by its spec's block rule (sim/block_rule.hpp; no RHT applied here).
struct BlockScales {
  BlockGrid grid;
  bool has_codes = true;             // false for float32 scales
  std::vector<uint8_t> scale_codes;  // [nbr*nbc] scale-format codes (empty for float32)
  std::vector<float> scales;         // decoded scale: dequant = (value(code) * scale) * g_dec
  std::vector<float> mult;           // element operand factor (BlockChoice::mult)
  std::vector<uint8_t> flags;        // flag_underflow | flag_overflow | flag_nan (sim/block_rule.hpp)
  float g_dec = 1.0f;                // the rule's global decode scale
};
BlockScales compute_block_scales(const QuantizerSpec& q, MatrixView<const float> x);

// decode(f, c) for c < 256 (NaN beyond the format's codes): a cache of
// core's decode(), not a second source of truth.
std::array<float, 256> decode_table(const Format& f);

}  // namespace fp4lab
