// Per-layer numerics statistics on the GPU (numerics.hpp; the definitions in
// train/numerics.hpp). Kernels over the quantizer input t and its quantization
// (dequant, element codes, scale codes):
//   lane_kernel    one thread per lane of the float64 sums (kNumericsLanes,
//                  kNumericsLaneGroup a block; coalesced: lane l reads
//                  elements l, l + L, ...): the element flags (integer counts
//                  reduced per warp, then atomics: order-free), the amax
//                  (max of bits), the lane's sums; the block adds its lanes
//                  by the first levels of numerics_tree_sum's tree
//   finish_kernel  one thread a group: the remaining levels of the tree over
//                  the group sums (the CPU's tree exactly); for a one-block grid (per-tensor
//                  scales) that block's flags, from the tensor's amax and NaN
//                  count
//   block_kernel   one thread (blocks of at most 64 elements) or one warp
//                  (larger) per scale block: its amax bits, zero / floor /
//                  ceiling by block_flags()
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

constexpr int kLanes = int(kNumericsLanes), kGroup = int(kNumericsLaneGroup), kGroups = kLanes / kGroup;
static_assert(kGroup == 256 && kLanes % kGroup == 0, "lane_kernel's block is one lane group");

__device__ inline void warp_add(unsigned long long* dst, unsigned v) {
  v = __reduce_add_sync(0xFFFFFFFFu, v);
  if ((threadIdx.x & 31) == 0 && v) atomicAdd(dst, (unsigned long long)v);
}

// dq == nullptr: amax and NaN only (no quantizer). group_sums[3 * g + k]: group
// g's x2, err2, err after the tree levels inside the group.
__global__ void __launch_bounds__(256) lane_kernel(const float* t, const float* dq, const uint8_t* codes, int64_t n,
                                                   ElementRule er, double* group_sums, DevCounts* out) {
  const int64_t lane = int64_t(blockIdx.x) * kGroup + threadIdx.x;
  unsigned nan = 0, nonzero = 0, flushed = 0, saturated = 0, inexact = 0, finite = 0;
  uint32_t amax = 0;
  double x2 = 0, e2 = 0, es = 0;
  for (int64_t i = lane; i < n; i += kLanes) {
    const float v = t[i];
    if (dq == nullptr) {
      if (num_is_nan(v)) ++nan;
      else amax = max(amax, abs_bits(bits_of(v)));
      continue;
    }
    const float d = dq[i];
    const uint32_t f = element_flags(v, d, codes[i], er);
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
  warp_add(&out->nan, nan);
  amax = __reduce_max_sync(0xFFFFFFFFu, amax);
  if ((threadIdx.x & 31) == 0 && amax) atomicMax(&out->amax, amax);
  if (dq == nullptr) return;
  warp_add(&out->nonzero, nonzero);
  warp_add(&out->flushed, flushed);
  warp_add(&out->saturated, saturated);
  warp_add(&out->inexact, inexact);
  warp_add(&out->finite, finite);
  __shared__ double s[3][kGroup];
  const int j = int(threadIdx.x);
  s[0][j] = x2, s[1][j] = e2, s[2][j] = es;
  __syncthreads();
  for (int h = 1; h < kGroup; h *= 2) {  // numerics_tree_sum's levels inside the group
    if (j % (2 * h) == 0)
      for (int k = 0; k < 3; ++k) s[k][j] = __dadd_rn(s[k][j], s[k][j + h]);
    __syncthreads();
  }
  if (j < 3) group_sums[3 * blockIdx.x + j] = s[j][0];
}

// The group sums' tree (the levels above kGroup lanes, one thread a group) and a one-block grid's flags.
__global__ void __launch_bounds__(kGroups) finish_kernel(const double* group_sums, bool one_block,
                                                         const uint8_t* scale_codes, ScaleTable table, DevCounts* out) {
  __shared__ double s[3][kGroups];
  const int j = int(threadIdx.x);
  for (int k = 0; k < 3; ++k) s[k][j] = group_sums[3 * j + k];
  __syncthreads();
  for (int h = 1; h < kGroups; h *= 2) {  // numerics_tree_sum's levels above the groups
    if (j % (2 * h) == 0)
      for (int k = 0; k < 3; ++k) s[k][j] = __dadd_rn(s[k][j], s[k][j + h]);
    __syncthreads();
  }
  if (j != 0) return;
  out->x2 = s[0][0], out->e2 = s[1][0], out->e = s[2][0];
  if (!one_block) return;
  // The block is the tensor: its amax bits are a NaN's when any element is NaN (numerics.hpp).
  const uint32_t a = out->nan ? 0x7FC00000u : out->amax;
  if (a == 0) out->zero_blocks = 1;
  if (scale_codes == nullptr) return;
  const uint8_t f = block_flags(a, scale_codes[0], table.c);
  if (f & kScaleFloor) out->floor_blocks = 1;
  if (f & kScaleCeil) out->ceil_blocks = 1;
}

// Thread per block (threads_per_block 1) or warp per block (32): the block's amax
// bits over its elements, then its flags.
__global__ void block_kernel(const float* t, const uint8_t* scale_codes, int64_t rows, int64_t cols, BlockGrid g,
                             int threads_per_block, ScaleTable table, DevCounts* out) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t i = tid / threads_per_block;
  const int sub = int(tid % threads_per_block);
  const bool live = i < g.nbr * g.nbc;
  uint32_t a = 0;
  if (live) {
    const int64_t bi = i / g.nbc, bj = i % g.nbc;
    const int64_t r0 = bi * g.br, c0 = bj * g.bc;
    const int64_t h = ((bi + 1) * g.br < rows ? (bi + 1) * g.br : rows) - r0;
    const int64_t w = ((bj + 1) * g.bc < cols ? (bj + 1) * g.bc : cols) - c0;
    for (int64_t k = sub; k < h * w; k += threads_per_block) a = max(a, abs_bits(bits_of(t[(r0 + k / w) * cols + c0 + k % w])));
  }
  if (threads_per_block == 32) a = __reduce_max_sync(0xFFFFFFFFu, a);
  if (!live || sub != 0) return;
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
  cuda::DeviceBuffer<double> group_sums;
  // One DevCounts per measurement of a step (read back at its end); grown on
  // the first measuring step, then reused: begin_measuring() rewinds `used`.
  std::vector<std::unique_ptr<cuda::DeviceBuffer<DevCounts>>> slots;
  size_t used = 0;
  DevCounts* next_slot() {
    if (used == slots.size()) slots.push_back(std::make_unique<cuda::DeviceBuffer<DevCounts>>(1));
    return slots[used++]->data();
  }
};

void begin_measuring(NumericsWorkspace& ws) { ws.used = 0; }

void NumericsWorkspaceDeleter::operator()(NumericsWorkspace* w) const { delete w; }
NumericsWorkspacePtr make_numerics_workspace() { return NumericsWorkspacePtr(new NumericsWorkspace); }

std::function<NumericsCounts()> operand_numerics_device_async(const OperandPlan& p, const float* src, int64_t rows,
                                                              int64_t cols, NumericsWorkspace& ws,
                                                              cudaStream_t stream) {
  using cuda::check;
  const int64_t n = rows * cols;
  NumericsCounts res;
  res.elements = n;
  if (n == 0) return [res] { return res; };
  DevCounts* counts = ws.next_slot();
  // t: the quantizer input. The source itself unless a step rewrites it (pre, RHTs): then a scratch copy.
  const bool rewrites = p.pre || p.rht || (p.quantizer && p.quantizer->rht);
  float* t = rewrites ? ws.t.at_least(size_t(n)) : const_cast<float*>(src);  // read-only below when !rewrites
  if (rewrites)
    check(cudaMemcpyAsync(t, src, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream), "numerics: copy");
  if (p.pre) cuda::fake_quantize_device(*p.pre, t, rows, cols, p.pre_stream, ws.qws, stream);
  if (p.rht) cuda::rht_forward_device(t, t, rows, cols, p.rht_axis, p.rht_kind, p.rht_seed, stream);
  check(cudaMemsetAsync(counts, 0, sizeof(DevCounts), stream), "numerics: clear");
  const float* dq = nullptr;
  uint8_t* codes = nullptr;
  uint8_t* scodes = nullptr;
  QuantizerSpec q;
  if (p.quantizer) {
    q = *p.quantizer;
    if (q.rht) {  // the quantizer's own RHT, along its block axis: t becomes its domain (sim's quantizer_domain)
      cuda::rht_forward_device(q, t, false, t, rows, cols, stream);  // its signs, kind and output rounding
      q.rht = false;
      q.rht_signs = RhtSigns::philox;
      q.rht_output = RhtOutput::f32;
      q.rht_kind = RhtKind::rht16;
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
  double* group_sums = ws.group_sums.at_least(size_t(3 * kGroups));
  lane_kernel<<<kGroups, kGroup, 0, stream>>>(t, dq, codes, n, p.quantizer ? element_rule(*q.element) : ElementRule{},
                                              group_sums, counts);
  cuda::check_launch("numerics lane_kernel");
  if (p.quantizer) {
    const BlockGrid g = block_grid(q, rows, cols);
    ScaleTable table;
    const std::array<uint8_t, 256> tab = scale_class_table(q);
    std::memcpy(table.c, tab.data(), 256);
    const int64_t nblocks = g.nbr * g.nbc;
    if (nblocks > 1) {
      const int per = g.br * g.bc <= 64 ? 1 : 32;
      constexpr unsigned kThreads = 256;
      block_kernel<<<grid_of(nblocks * per, kThreads), kThreads, 0, stream>>>(t, scodes, rows, cols, g, per, table,
                                                                             counts);
      cuda::check_launch("numerics block_kernel");
    }
    finish_kernel<<<1, kGroups, 0, stream>>>(group_sums, nblocks == 1, scodes, table, counts);
    cuda::check_launch("numerics finish_kernel");
    res.blocks = nblocks;
    res.quantized = true;
    res.scale_codes = scodes != nullptr;
    res.sr = q.round == Round::rs;
  }
  return [res, counts, stream, quantized = p.quantizer != nullptr]() mutable {
    DevCounts h;
    check(cudaMemcpyAsync(&h, counts, sizeof h, cudaMemcpyDeviceToHost, stream), "numerics: counts");
    check(cudaStreamSynchronize(stream), "numerics: synchronize");
    res.nan = int64_t(h.nan);
    res.amax_bits = h.amax;
    if (!quantized) return res;
    res.nonzero = int64_t(h.nonzero), res.flushed = int64_t(h.flushed), res.saturated = int64_t(h.saturated);
    res.inexact = int64_t(h.inexact), res.finite = int64_t(h.finite), res.zero_blocks = int64_t(h.zero_blocks);
    res.floor_blocks = int64_t(h.floor_blocks), res.ceil_blocks = int64_t(h.ceil_blocks);
    res.sum_x2 = h.x2, res.sum_err2 = h.e2, res.sum_err = h.e;
    return res;
  };
}

NumericsCounts operand_numerics_device(const OperandPlan& p, const float* src, int64_t rows, int64_t cols,
                                       NumericsWorkspace& ws, cudaStream_t stream) {
  begin_measuring(ws);
  return operand_numerics_device_async(p, src, rows, cols, ws, stream)();
}

}  // namespace fp4lab::train
