// A tensor's packed NVFP4 cast (PackedNvfp4, cuda/shard_cast.hpp) as a
// quantized GEMM operand (QuantOperand, cuda/gemm.hpp), with nothing
// quantized again: what a native FP4 GEMM (GemmPath::blackwell_native) takes
// for a primary weight W [rows, cols] stored as its nvfp4_2d cast.
//
//   row-wise     [rows, cols], k = cols (fprop's W): a view of the cast itself.
//   column-wise  [cols, rows], k = rows (dgrad's W^T): made from the gathered
//                row-wise codes by the nibble-packed transpose (transpose_fp4_packed_device,
//                the column-wise copy of DeviceShardCast::transpose; the scheme of
//                TransformerEngine PR #2691: columnwise from the rowwise gather, so
//                only the row-wise codes travel), and W^T's tile codes, the tile
//                grid transposed. A 16x16 tile of W is a 16x16 tile of W^T with the
//                same amax, and the tensor amax is the same, so both equal
//                quantize(nvfp4_2d, W^T)'s codes and scale codes bit for bit
//                (sim/shard_cast.hpp, transpose_packed and transpose_tile_codes).
//                Made only where a caller asks, into its scratch: the store keeps
//                no second copy.
//
// Layout: exactly what quantize_device writes for an nvfp4_2d operand, so no
// conversion: codes CodeLayout::packed4 (ceil(cols/2) bytes a row, the even
// column in the low nibble, an odd last column's high nibble 0), the scale
// codes row-major [ceil(rows/16), ceil(cols/16)] (scale_grid's shape; the
// cast's tile order, tile (i, j) at i * ceil(cols/16) + j), one UE4M3 code a
// tile, and global_decode = the cast's g_dec (the GEMM's alpha):
// value = (decode(code) * decode(tile code)) * g_dec.
//
// Alignment: the row-wise codes lie at the tensor's offset in the store's
// packed buffer (flat_layout: back to back, any byte), so they need not be
// aligned. dequant_operand_bf16 (hopper_bf16) takes any address; cuBLASLt
// (blackwell_native) assumes aligned operands (its heuristic's default: 256
// bytes), so a native caller checks the address first, or copies the codes to
// aligned memory. The column-wise scratch is cudaMalloc's (aligned).
//
// Consumer: CudaLinear's native-operand route (train/cuda/linear_native.hpp):
// its forward takes packed_operand (copying misaligned codes to aligned
// scratch first), its dgrad packed_operand_columnwise; blackwell_native on
// sm_100+ (compiled, never executed here), hopper_bf16 under its test switch.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/device.hpp"
#include "cuda/gemm.hpp"
#include "cuda/shard_cast.hpp"

namespace fp4lab::cuda {

// The row-wise operand of the cast c of a [rows, cols] tensor: host only (fills
// the fields, no device work). Throws fp4lab::Error on a negative shape or
// incomplete c (null codes, tile codes or g_dec) of a non-empty tensor.
QuantOperand packed_operand(const PackedNvfp4& c, int64_t rows, int64_t cols);

// Scratch of the column-wise operand (grow-only), the caller's: W^T's packed
// codes (cols * ceil(rows/2) bytes) and tile codes (ceil(cols/16) * ceil(rows/16)).
struct ColumnwiseScratch {
  DeviceBuffer<uint8_t> codes, tile_codes;
};

// The column-wise operand [cols, rows] of the cast c of a [rows, cols] tensor:
// W^T's codes and tile codes written into s on `stream` (asynchronous; the
// operand is valid in stream order, until s is written again). Throws as
// packed_operand.
QuantOperand packed_operand_columnwise(const PackedNvfp4& c, int64_t rows, int64_t cols, ColumnwiseScratch& s,
                                       cudaStream_t stream = nullptr);

}  // namespace fp4lab::cuda
