// Storage layouts on the GPU: the same layouts as sim/packing.hpp (see there
// for the definitions), computed by kernels. Device pointers; `stream` orders.
#pragma once

#include <cstdint>

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

}  // namespace fp4lab::cuda
