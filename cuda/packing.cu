#include "cuda/packing.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "cuda/device.hpp"
#include "sim/grouped.hpp"

namespace fp4lab::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return unsigned(std::max<int64_t>(1, (n + kThreads - 1) / kThreads)); }

__global__ void pack_kernel(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* packed) {
  const int64_t pc = (cols + 1) / 2;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= rows * pc) return;
  const int64_t r = t / pc, b = t - r * pc, c = 2 * b;
  const uint32_t lo = codes[r * cols + c] & 0xFu;
  const uint32_t hi = c + 1 < cols ? (codes[r * cols + c + 1] & 0xFu) : 0u;
  packed[t] = uint8_t(lo | hi << 4);
}

// One thread per output byte (c, rb): nibbles of rows 2rb and 2rb+1 of column c.
// A 32 x 32 tile of output bytes per block, staged through shared memory so
// that both the reads and the writes are coalesced.
__global__ void transpose_kernel(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out) {
  // Tile: 64 input rows x 64 input columns (= 32 input bytes per row, 32 output bytes per row).
  __shared__ uint8_t tile[64][33];  // [input row][input byte]
  const int64_t in_pc = (cols + 1) / 2, out_pc = (rows + 1) / 2;
  const int64_t r0 = int64_t(blockIdx.y) * 64, b0 = int64_t(blockIdx.x) * 32;  // input rows, input bytes
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;                      // 32 x 8 threads
  for (int rr = ty; rr < 64; rr += 8) {
    const int64_t r = r0 + rr, b = b0 + tx;
    tile[rr][tx] = (r < rows && b < in_pc) ? in[r * in_pc + b] : uint8_t(0);
  }
  __syncthreads();
  // Output rows are input columns c = 2*(b0+k) + h; output bytes ob = r0/2 + tx.
  for (int cc = ty; cc < 64; cc += 8) {
    const int64_t c = 2 * b0 + cc, ob = r0 / 2 + tx;
    if (c >= cols || ob >= out_pc) continue;
    const int k = cc >> 1, shift = (cc & 1) * 4;
    const uint32_t lo = (tile[2 * tx][k] >> shift) & 0xFu;
    const uint32_t hi = (2 * ob + 1 < rows) ? (tile[2 * tx + 1][k] >> shift) & 0xFu : 0u;
    out[c * out_pc + ob] = uint8_t(lo | hi << 4);
  }
}

__global__ void swizzle_kernel(const uint8_t* s, int64_t rows, int64_t cols, int64_t row_block, uint8_t* out,
                               int64_t total) {
  const int64_t o = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (o >= total) return;
  const int64_t c4 = (cols + 3) / 4 * 4;
  const int64_t tile = o / 512, in_tile = o % 512;
  const int64_t tiles_c = c4 / 4;
  const int64_t tr = tile / tiles_c, tc = tile % tiles_c;
  const int64_t r32 = in_tile / 16, rest = in_tile % 16, rq = rest / 4, c = rest % 4;
  const int64_t i = tr * 128 + rq * 32 + r32, j = tc * 4 + c;
  out[o] = (i < rows && j < cols) ? s[(i / row_block) * cols + j] : uint8_t(0);
}

}  // namespace

void pack_fp4_device(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* packed, cudaStream_t stream) {
  const int64_t n = rows * ((cols + 1) / 2);
  if (n == 0) return;
  pack_kernel<<<blocks_for(n), kThreads, 0, stream>>>(codes, rows, cols, packed);
  check_launch("pack_kernel");
}

void transpose_fp4_packed_device(const uint8_t* packed, int64_t rows, int64_t cols, uint8_t* out, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t in_pc = (cols + 1) / 2;
  const dim3 grid(unsigned((in_pc + 31) / 32), unsigned((rows + 63) / 64));
  transpose_kernel<<<grid, kThreads, 0, stream>>>(packed, rows, cols, out);
  check_launch("transpose_kernel");
}

int64_t swizzled_scale_bytes(int64_t rows, int64_t cols) { return (rows + 127) / 128 * 128 * ((cols + 3) / 4 * 4); }

void swizzle_scales_device(const uint8_t* scales, int64_t rows, int64_t cols, uint8_t* out, cudaStream_t stream,
                           int64_t row_block) {
  if (row_block < 1) throw Error("swizzle_scales_device: row_block " + std::to_string(row_block) + " is not >= 1");
  const int64_t total = swizzled_scale_bytes(rows, cols);
  if (total == 0) return;
  swizzle_kernel<<<blocks_for(total), kThreads, 0, stream>>>(scales, rows, cols, row_block, out, total);
  check_launch("swizzle_kernel");
}

void swizzle_scales_grouped_device(const uint8_t* scales, std::span<const int64_t> sizes, int64_t cols, uint8_t* out,
                                   cudaStream_t stream, int64_t row_block) {
  if (row_block < 1)
    throw Error("swizzle_scales_grouped_device: row_block " + std::to_string(row_block) + " is not >= 1");
  const std::vector<int64_t> off = swizzled_group_offsets(sizes, cols);  // checks the sizes
  int64_t scale_row = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    if (sizes[g] == 0) continue;
    swizzle_scales_device(scales + scale_row * cols, sizes[g], cols, out + off[g], stream, row_block);
    scale_row += (sizes[g] + row_block - 1) / row_block;
  }
}

}  // namespace fp4lab::cuda
