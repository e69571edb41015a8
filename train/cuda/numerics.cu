// Per-layer numerics statistics on the GPU (numerics.hpp; the definitions in
// train/numerics.hpp). Three kernels over the quantizer input t and its
// quantization (dequant, element codes, scale codes):
//   chunk_kernel  one thread per (row, chunk of kNumericsChunk columns): the
//                 element flags (integer counts by atomics, order-free), the
//                 amax (atomicMax of bits), the chunk's float64 sums left to
//                 right into partials[row][chunk]
//   row_kernel    one thread per row: its chunk sums in order
//   total_kernel  one thread: the row sums in order (the CPU's order exactly)
//   block_kernel  one thread per scale block: its amax bits, zero / floor /
//                 ceiling by block_flags()
#include "train/cuda/numerics.hpp"

#include <array>
#include <cstring>

#include "core/error.hpp"
#include "cuda/device.hpp"
#include "cuda/quantize.hpp"
#include "cuda/rht.hpp"
#include "sim/block_scales.hpp"

namespace fp4lab::train {

namespace {

struct DevCounts {
  unsigned long long nan, nonzero, flushed, saturated, inexact, finite, zero_blocks, floor_blocks, ceil_blocks;
  unsigned int amax;
  unsigned int pad;
  double x2, e2, e;
};

struct ScaleTable {
  uint8_t c[256];
};

__device__ inline uint32_t bits_of(float v) { return __float_as_uint(v); }

// dq == nullptr: amax and NaN only (no quantizer).
__global__ void chunk_kernel(const float* t, const float* dq, const uint8_t* codes, int64_t rows, int64_t cols,
                             int64_t nch, ElementRule er, double* partials, DevCounts* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * nch) return;
  const int64_t r = i / nch, k = i % nch;
  const int64_t c0 = k * kNumericsChunk, c1 = c0 + kNumericsChunk < cols ? c0 + kNumericsChunk : cols;
  unsigned long long nan = 0, nonzero = 0, flushed = 0, saturated = 0, inexact = 0, finite = 0;
  uint32_t amax = 0;
  double x2 = 0, e2 = 0, es = 0;
  for (int64_t c = c0; c < c1; ++c) {
    const float v = t[r * cols + c];
    if (dq == nullptr) {
      if (num_is_nan(v)) ++nan;
      else amax = max(amax, abs_bits(bits_of(v)));
      continue;
    }
    const float d = dq[r * cols + c];
    const uint32_t f = element_flags(v, d, codes[r * cols + c], er);
    nan += (f & kNumNan) ? 1 : 0;
    nonzero += (f & kNumNonzero) ? 1 : 0;
    flushed += (f & kNumFlushed) ? 1 : 0;
    saturated += (f & kNumSaturated) ? 1 : 0;
    inexact += (f & kNumInexact) ? 1 : 0;
    if (!(f & kNumNan)) amax = max(amax, abs_bits(bits_of(v)));
    if (f & kNumFinite) {
      ++finite;
      const double x = double(v), y = double(d), e = x - y;
      x2 = __dadd_rn(x2, __dmul_rn(x, x));
      e2 = __dadd_rn(e2, __dmul_rn(e, e));
      es = __dadd_rn(es, __dsub_rn(y, x));
    }
  }
  if (dq != nullptr) {
    partials[3 * i] = x2, partials[3 * i + 1] = e2, partials[3 * i + 2] = es;
  }
  if (nan) atomicAdd(&out->nan, nan);
  if (nonzero) atomicAdd(&out->nonzero, nonzero);
  if (flushed) atomicAdd(&out->flushed, flushed);
  if (saturated) atomicAdd(&out->saturated, saturated);
  if (inexact) atomicAdd(&out->inexact, inexact);
  if (finite) atomicAdd(&out->finite, finite);
  if (amax) atomicMax(&out->amax, amax);
}

__global__ void row_kernel(const double* partials, int64_t rows, int64_t nch, double* rowsums) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  double a = 0, b = 0, c = 0;
  for (int64_t k = 0; k < nch; ++k) {
    const double* p = partials + 3 * (r * nch + k);
    a = __dadd_rn(a, p[0]), b = __dadd_rn(b, p[1]), c = __dadd_rn(c, p[2]);
  }
  rowsums[3 * r] = a, rowsums[3 * r + 1] = b, rowsums[3 * r + 2] = c;
}

__global__ void total_kernel(const double* rowsums, int64_t rows, DevCounts* out) {
  double a = 0, b = 0, c = 0;
  for (int64_t r = 0; r < rows; ++r)
    a = __dadd_rn(a, rowsums[3 * r]), b = __dadd_rn(b, rowsums[3 * r + 1]), c = __dadd_rn(c, rowsums[3 * r + 2]);
  out->x2 = a, out->e2 = b, out->e = c;
}

__global__ void block_kernel(const float* t, const uint8_t* scale_codes, int64_t rows, int64_t cols, BlockGrid g,
                             ScaleTable table, DevCounts* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= g.nbr * g.nbc) return;
  const int64_t bi = i / g.nbc, bj = i % g.nbc;
  const int64_t r1 = (bi + 1) * g.br < rows ? (bi + 1) * g.br : rows;
  const int64_t c1 = (bj + 1) * g.bc < cols ? (bj + 1) * g.bc : cols;
  uint32_t a = 0;
  for (int64_t r = bi * g.br; r < r1; ++r)
    for (int64_t c = bj * g.bc; c < c1; ++c) a = max(a, abs_bits(bits_of(t[r * cols + c])));
  if (a == 0) atomicAdd(&out->zero_blocks, 1ull);
  if (scale_codes == nullptr) return;
  const uint8_t f = block_flags(a, scale_codes[i], table.c);
  if (f & kScaleFloor) atomicAdd(&out->floor_blocks, 1ull);
  if (f & kScaleCeil) atomicAdd(&out->ceil_blocks, 1ull);
}

unsigned grid_of(int64_t n, unsigned threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace

struct NumericsWorkspace {
  cuda::QuantWorkspace qws;
  cuda::DeviceBuffer<float> t, dq;
  cuda::DeviceBuffer<uint8_t> codes, scale_codes;
  cuda::DeviceBuffer<double> partials, rowsums;
  cuda::DeviceBuffer<DevCounts> counts{1};
};

void NumericsWorkspaceDeleter::operator()(NumericsWorkspace* w) const { delete w; }
NumericsWorkspacePtr make_numerics_workspace() { return NumericsWorkspacePtr(new NumericsWorkspace); }

NumericsCounts operand_numerics_device(const OperandPlan& p, const float* src, int64_t rows, int64_t cols,
                                       NumericsWorkspace& ws, cudaStream_t stream) {
  using cuda::check;
  const int64_t n = rows * cols;
  NumericsCounts res;
  res.elements = n;
  if (n == 0) return res;
  float* t = ws.t.at_least(size_t(n));
  check(cudaMemcpyAsync(t, src, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream), "numerics: copy");
  if (p.pre) cuda::fake_quantize_device(*p.pre, t, rows, cols, p.pre_stream, ws.qws, stream);
  if (p.rht) cuda::rht_forward_device(t, rows, cols, RhtAxis::cols, p.rht_seed, stream);
  check(cudaMemsetAsync(ws.counts.data(), 0, sizeof(DevCounts), stream), "numerics: clear");
  const int64_t nch = (cols + kNumericsChunk - 1) / kNumericsChunk;
  constexpr unsigned kThreads = 256;
  const float* dq = nullptr;
  uint8_t* codes = nullptr;
  uint8_t* scodes = nullptr;
  QuantizerSpec q;
  if (p.quantizer) {
    q = *p.quantizer;
    if (q.rht) {  // the quantizer's own RHT, along its block axis: t becomes its domain (sim's quantizer_domain)
      cuda::rht_forward_device(t, rows, cols, q.block_rows == 1 ? RhtAxis::rows : RhtAxis::cols, q.rht_seed, stream);
      q.rht = false;
    }
    int64_t sr = 0, sc = 0;
    cuda::scale_grid(q, rows, cols, sr, sc);
    const bool has_codes = q.scale != &float32;  // as sim's compute_block_scales
    cuda::QuantOutputs out;
    out.codes = codes = ws.codes.at_least(size_t(n));
    out.scale_codes = scodes = has_codes ? ws.scale_codes.at_least(size_t(sr * sc)) : nullptr;
    out.dequant = ws.dq.at_least(size_t(n));
    dq = out.dequant;
    cuda::quantize_device(q, t, cuda::InputType::f32, rows, cols, p.stream, out, ws.qws, stream);
  }
  double* partials = ws.partials.at_least(size_t(3 * rows * nch));
  chunk_kernel<<<grid_of(rows * nch, kThreads), kThreads, 0, stream>>>(
      t, dq, codes, rows, cols, nch, p.quantizer ? element_rule(*q.element) : ElementRule{}, partials,
      ws.counts.data());
  cuda::check_launch("numerics chunk_kernel");
  if (p.quantizer) {
    double* rowsums = ws.rowsums.at_least(size_t(3 * rows));
    row_kernel<<<grid_of(rows, kThreads), kThreads, 0, stream>>>(partials, rows, nch, rowsums);
    cuda::check_launch("numerics row_kernel");
    total_kernel<<<1, 1, 0, stream>>>(rowsums, rows, ws.counts.data());
    cuda::check_launch("numerics total_kernel");
    const BlockGrid g = block_grid(q, rows, cols);
    ScaleTable table;
    const std::array<uint8_t, 256> tab = scale_class_table(q);
    std::memcpy(table.c, tab.data(), 256);
    block_kernel<<<grid_of(g.nbr * g.nbc, kThreads), kThreads, 0, stream>>>(t, scodes, rows, cols, g, table,
                                                                              ws.counts.data());
    cuda::check_launch("numerics block_kernel");
    res.blocks = g.nbr * g.nbc;
    res.quantized = true;
    res.scale_codes = scodes != nullptr;
    res.sr = q.round == Round::rs;
  }
  DevCounts h;
  check(cudaMemcpyAsync(&h, ws.counts.data(), sizeof h, cudaMemcpyDeviceToHost, stream), "numerics: counts");
  check(cudaStreamSynchronize(stream), "numerics: synchronize");
  res.nan = int64_t(h.nan);
  res.amax_bits = h.amax;
  if (!p.quantizer) return res;
  res.nonzero = int64_t(h.nonzero), res.flushed = int64_t(h.flushed), res.saturated = int64_t(h.saturated);
  res.inexact = int64_t(h.inexact), res.finite = int64_t(h.finite), res.zero_blocks = int64_t(h.zero_blocks);
  res.floor_blocks = int64_t(h.floor_blocks), res.ceil_blocks = int64_t(h.ceil_blocks);
  res.sum_x2 = h.x2, res.sum_err2 = h.e2, res.sum_err = h.e;
  return res;
}

}  // namespace fp4lab::train
