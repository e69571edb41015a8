// Storage layouts of quantized tensors: packed element codes and cuBLASLt's
// swizzled block-scale layout.
//
// Element codes (QuantizedTensor::codes holds one code per byte):
//   FP4 (4-bit formats): two codes per byte, row by row; code of column c goes
//     to byte c/2 of its row, in the LOW nibble when c is even, the HIGH nibble
//     when c is odd (PTX cvt.e2m1x2 / torch float4_e2m1fn_x2 / TE convention).
//     A row of `cols` codes takes ceil(cols/2) bytes; with odd cols the last
//     high nibble is 0. Example: codes [1, 2, 3] -> bytes [0x21, 0x03].
//   FP6 / FP8 / INT8: one code per byte (FP6 in the low 6 bits), unchanged.
// Nibble-packed transpose: the FP4 packing of the transposed code matrix
// ([cols, rows], each row of it = one column of the original), what the
// column-wise (wgrad) GEMM operand needs.
//
// Swizzled block scales (cuBLASLt CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 and
// VEC32_UE8M0, the layout TransformerEngine's nvte_swizzle_scaling_factors
// produces and its reference _recover_swizzled_scales undoes): the row-major
// scale matrix [R, C] (R = rows of the operand, C = its blocks along K) is
// zero-padded to [R128, C4] (R rounded up to a multiple of 128, C to 4) and cut
// into 128 x 4 tiles stored tile-row-major (tile (tr, tc) at
// (tr * C4/4 + tc) * 512 bytes). Inside a tile, scale (r, c) (r < 128, c < 4)
// sits at offset (r % 32) * 16 + (r / 32) * 4 + c. Equivalently the linear
// index of scale (i, j) is
//   ((i/128) * (C4/4) + j/4) * 512 + (i%32) * 16 + ((i%128)/32) * 4 + (j%4).
// Hand-checked example: for R = 256, C = 8, scale (i=37, j=6) is in tile
// (0, 1) at 1 * 512 + (37%32=5) * 16 + (37/32=1) * 4 + (6%4=2) = 512 + 80 + 4 + 2 = 598.
#pragma once

#include <cstdint>
#include <vector>

#include "core/format.hpp"

namespace fp4lab {

// FP4: two per byte as above. Input: rows x cols codes, one per byte (bits
// above 4 must be 0; they are masked).
std::vector<uint8_t> pack_fp4(const uint8_t* codes, int64_t rows, int64_t cols);
std::vector<uint8_t> unpack_fp4(const uint8_t* packed, int64_t rows, int64_t cols);
// FP4 packing of the transpose: result is [cols, ceil(rows/2)] bytes.
std::vector<uint8_t> pack_fp4_transposed(const uint8_t* codes, int64_t rows, int64_t cols);

// Storage for any element format: FP4 packed two per byte, others one per byte.
std::vector<uint8_t> pack_codes(const Format& f, const uint8_t* codes, int64_t rows, int64_t cols);
std::vector<uint8_t> unpack_codes(const Format& f, const uint8_t* packed, int64_t rows, int64_t cols);
int64_t packed_row_bytes(const Format& f, int64_t cols);

// Swizzled scale layout. `scales` is row-major [rows, cols] (one byte each);
// result has round_up(rows,128) * round_up(cols,4) bytes, padding 0.
int64_t swizzled_scale_offset(int64_t i, int64_t j, int64_t cols);
std::vector<uint8_t> swizzle_scales(const uint8_t* scales, int64_t rows, int64_t cols);
std::vector<uint8_t> unswizzle_scales(const uint8_t* swizzled, int64_t rows, int64_t cols);

}  // namespace fp4lab
