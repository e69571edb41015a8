// A packed NVFP4 cast as a quantized GEMM operand (packed_operand.hpp).
#include "cuda/packed_operand.hpp"

#include <algorithm>
#include <string>

#include "cuda/packing.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kTile = 16;

int64_t tiles_along(int64_t n) { return (n + kTile - 1) / kTile; }

// out[j * ntr + i] = in[i * ntc + j]: a [ntr, ntc] grid of tile codes as its
// transpose (a tensor has about rows * cols / 256 tiles: one thread each).
__global__ void transpose_tiles_kernel(const uint8_t* in, int64_t ntr, int64_t ntc, uint8_t* out) {
  const int64_t n = ntr * ntc, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < n; o += stride) {
    const int64_t j = o / ntr, i = o - j * ntr;
    out[o] = in[i * ntc + j];
  }
}

void check_cast(const PackedNvfp4& c, int64_t rows, int64_t cols, const char* what) {
  if (rows < 0 || cols < 0)
    throw Error(std::string(what) + ": negative shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  if (rows * cols > 0 && (c.packed == nullptr || c.tile_codes == nullptr || c.g_dec == nullptr))
    throw Error(std::string(what) + ": the cast is incomplete (null packed codes, tile codes or g_dec)");
}

// The operand fields common to both forms: the nvfp4_2d spec (sim's registry: the quantizer the cast equals),
// packed codes, tile codes as the [16,16] blocks' scale codes, g_dec.
QuantOperand operand_of(int64_t rows, int64_t cols, const uint8_t* codes, const uint8_t* tile_codes,
                        const float* g_dec) {
  static const QuantizerSpec nvfp4_2d = quantizer_by_name("nvfp4_2d");  // looked up once, not per GEMM
  QuantOperand q;
  q.spec = nvfp4_2d;
  q.rows = rows;
  q.cols = cols;
  q.codes = codes;
  q.layout = CodeLayout::packed4;
  q.scale_codes = tile_codes;
  q.scales = nullptr;  // decode(scale code): the nv rule's scales come from their codes
  q.global_decode = g_dec;
  return q;
}

}  // namespace

QuantOperand packed_operand(const PackedNvfp4& c, int64_t rows, int64_t cols) {
  check_cast(c, rows, cols, "packed_operand");
  return operand_of(rows, cols, c.packed, c.tile_codes, c.g_dec);
}

QuantOperand packed_operand_columnwise(const PackedNvfp4& c, int64_t rows, int64_t cols, ColumnwiseScratch& s,
                                       cudaStream_t stream) {
  check_cast(c, rows, cols, "packed_operand_columnwise");
  const int64_t ntr = tiles_along(rows), ntc = tiles_along(cols);
  uint8_t* codes = s.codes.at_least(size_t(cols * ((rows + 1) / 2)));
  uint8_t* tiles = s.tile_codes.at_least(size_t(ntr * ntc));
  if (rows * cols > 0) {
    transpose_fp4_packed_device(c.packed, rows, cols, codes, stream);
    const int64_t n = ntr * ntc;
    const unsigned blocks = unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
    transpose_tiles_kernel<<<blocks, kThreads, 0, stream>>>(c.tile_codes, ntr, ntc, tiles);
    check_launch("transpose_tiles_kernel");
  }
  return operand_of(cols, rows, codes, tiles, c.g_dec);
}

}  // namespace fp4lab::cuda
