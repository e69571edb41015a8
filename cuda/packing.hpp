// Storage layouts on the GPU: the same layouts as sim/packing.hpp (see there
// for the definitions), computed by kernels. Device pointers; `stream` orders.
#pragma once

#include <cstdint>
#include <span>

#include <cuda_runtime.h>

namespace fp4lab::cuda {

// codes [rows, cols] one per byte -> FP4 packed [rows, ceil(cols/2)] (low nibble = even column).
void pack_fp4_device(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* packed, cudaStream_t stream = nullptr);

// Nibble-packed transpose: packed FP4 [rows, ceil(cols/2)] -> packed FP4 of the
// transpose [cols, ceil(rows/2)] (sim's pack_fp4_transposed of the unpacked codes).
void transpose_fp4_packed_device(const uint8_t* packed, int64_t rows, int64_t cols, uint8_t* out,
                                 cudaStream_t stream = nullptr);

// Row-major scales [rows, cols] -> cuBLASLt swizzled layout of
// round_up(rows,128) * round_up(cols,4) bytes, padding 0 (sim's swizzle_scales).
// row_block > 1: `scales` holds one row per row_block rows, [ceil(rows /
// row_block), cols] (NVFP4 [16,16] tiles: each of a tile's 16 rows takes its
// tile's scale, the tile's equivalent [1,16] scales), expanded as it is read.
int64_t swizzled_scale_bytes(int64_t rows, int64_t cols);
void swizzle_scales_device(const uint8_t* scales, int64_t rows, int64_t cols, uint8_t* out,
                           cudaStream_t stream = nullptr, int64_t row_block = 1);

// Grouped (mixture-of-experts) scales: the layout of sim/grouped.hpp's
// swizzle_scales_grouped. Group g (sizes: its operand rows, host span, zeros
// allowed) has its scale rows at row sum_{h<g} sizes[h] of `scales` ([1,16] /
// [1,32] blocks; row_block 16: at sum_{h<g} ceil(sizes[h] / 16), one row per
// [16,16] tile, expanded as in swizzle_scales_device), swizzled alone and
// written at byte swizzled_group_offsets(sizes, cols)[g] of out (that
// vector's last entry bytes in all; an empty group takes none).
void swizzle_scales_grouped_device(const uint8_t* scales, std::span<const int64_t> sizes, int64_t cols, uint8_t* out,
                                   cudaStream_t stream = nullptr, int64_t row_block = 1);

}  // namespace fp4lab::cuda
