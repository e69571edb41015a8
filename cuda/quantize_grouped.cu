// Single-launch grouped quantization (quantize_grouped.cuh): the grouped
// 16x16 tile kernel, the per-group amax pass, and the host side that runs a
// grouped tensor's plan in one launch (the grouped row and column kernels are
// in inst/rows_grouped_*.cu and inst/cols_grouped_*.cu). Built with --fmad=false as every quantization file.
#include <optional>

#include "cuda/quantize_grouped.cuh"
#include "cuda/quantize_kernels.cuh"
#include "cuda/quantize_tiles.cuh"

namespace fp4lab::cuda {
namespace {

using namespace qk;

// The tile kernel over the concatenated groups' tile rows (p.rows: all rows;
// tile_rows: the table's scale rows): warp w takes tile pair w % pairs of tile
// row w / pairs, in its group's narrowed parameters. FULL (with Fast::rn):
// every group's rows a multiple of 16 and full_spans_apply(p, 32) (an expert
// weight [E, N, K] with N % 16 == 0, K % 32 == 0): whole tile pairs, 32-bit
// indices, no bounds checks, as tile_kernel's FULL form.
template <class In, KernelKind K, Fast FM, bool FULL>
__global__ void __launch_bounds__(kThreads) grouped_tile_kernel(const KParams p, const GroupTable t, int64_t tile_rows) {
  const int lane = threadIdx.x & 31, half = lane >> 4;
  const int64_t tiles_c = (p.cols + 15) / 16;
  int64_t row_of_tiles, tc;
  if constexpr (FULL) {
    const uint32_t warp = (blockIdx.x * kThreads + threadIdx.x) >> 5;
    if (warp >= p.units) return;  // warp-uniform
    const uint32_t tr32 = p.unit_div.div(warp);
    row_of_tiles = tr32;
    tc = (warp - tr32 * uint32_t(tiles_c / 2)) * 2 + half;
  } else {
    const int64_t pairs_c = (tiles_c + 1) / 2;
    const int64_t warp = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
    if (warp >= tile_rows * pairs_c) return;  // warp-uniform
    row_of_tiles = warp / pairs_c;
    tc = (warp - row_of_tiles * pairs_c) * 2 + half;
  }
  const int g = group_of(t, row_of_tiles);
  const KParams q = group_params<In>(p, t, g);
  const int64_t tr = row_of_tiles - __ldg(t.soff + g);
  const int64_t r = tr * 16 + (lane & 15), c0 = tc * 16;
  const int valid = FULL ? 16 : (r < q.rows && c0 < q.cols) ? int(q.cols - c0 < 16 ? q.cols - c0 : 16) : 0;
  float v[16];
  load_n<In, 16, FULL>(q.x, r * q.cols + c0, valid, v);
  const uint32_t a = amax_bits(v);
  const Format f = kind_elem<K>(q), sf = kind_scale<K>(q);
  const NvGlobal g_nv = nv_global_of(q, f, sf);
  if (tr == 0 && lane == 0 && tc == 0) store_global_decode(q.out, g_nv.g_dec);
  tile_encode<K, FM, FULL>(q, f, sf, g_nv, tr, tc, r, c0, v, a, valid);
}

template <class In, KernelKind K>
void launch_grouped_tiles_kind(const KParams& p, const GroupTable& t, int64_t tile_rows, bool rows16, unsigned blocks,
                               cudaStream_t st) {
  if (K != KernelKind::runtime && fast_rn_applies(K, p)) {
    if (rows16 && full_spans_apply(p, 32)) {
      const KParams pf = full_params(p, tile_rows * (p.cols / 32), p.cols / 32);
      grouped_tile_kernel<In, K, Fast::rn, true><<<blocks, kThreads, 0, st>>>(pf, t, tile_rows);
    } else {
      grouped_tile_kernel<In, K, Fast::rn, false><<<blocks, kThreads, 0, st>>>(p, t, tile_rows);
    }
  } else {
    grouped_tile_kernel<In, K, Fast::none, false><<<blocks, kThreads, 0, st>>>(p, t, tile_rows);
  }
}

// rows16: every group's rows a multiple of 16 (the FULL form's condition on rows).
template <class In>
void launch_grouped_tiles(const KParams& p, const GroupTable& t, int64_t tile_rows, bool rows16, KernelKind kind,
                          cudaStream_t st) {
  const int64_t pairs = tile_rows * ((p.cols + 31) / 32);
  if (pairs == 0) return;
  const unsigned blocks = unsigned((pairs * 32 + kThreads - 1) / kThreads);
  if (kind == KernelKind::nvfp4)
    launch_grouped_tiles_kind<In, KernelKind::nvfp4>(p, t, tile_rows, rows16, blocks, st);
  else if (kind == KernelKind::e2m1)
    launch_grouped_tiles_kind<In, KernelKind::e2m1>(p, t, tile_rows, rows16, blocks, st);
  else
    grouped_tile_kernel<In, KernelKind::runtime, Fast::none, false><<<blocks, kThreads, 0, st>>>(p, t, tile_rows);
  check_launch("grouped_tile_kernel");
}

// Each group's amax in one launch: block b reduces work item b (a range of
// elements inside one group; t.items) and atomicMax-es it into t.amax[group];
// the last block to finish computes every group's NvGlobal into t.gparams
// (fin's formats; store_nv_global's rule) and re-arms the amax words and the
// counter. Loads are 16-byte vectors from the first aligned element of the
// range (an item may start anywhere).
template <class In>
__global__ void __launch_bounds__(kThreads) grouped_amax_kernel(const void* x, const GroupTable t,
                                                                const AmaxFinish fin) {
  const int64_t* item = t.items + 3 * int64_t(blockIdx.x);
  const int g = int(item[0]);
  const int64_t e0 = item[1], e1 = item[2];
  constexpr int64_t kVec = 16 / int64_t(sizeof(In));
  const In* base = static_cast<const In*>(x);
  const int64_t mis = int64_t((reinterpret_cast<uintptr_t>(base + e0) & 15) / sizeof(In));
  const int64_t head_end = mis == 0 ? e0 : (e0 + (kVec - mis) < e1 ? e0 + (kVec - mis) : e1);
  const int64_t nvec = (e1 - head_end) / kVec;
  uint32_t m = 0;
  for (int64_t i = e0 + threadIdx.x; i < head_end; i += kThreads) m = umax(m, abs_bits(load1<In>(x, i)));
  const uint4* xv = reinterpret_cast<const uint4*>(base + head_end);
  for (int64_t k = threadIdx.x; k < nvec; k += kThreads) {
    const uint4 u = __ldg(xv + k);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    if constexpr (sizeof(In) == 2) {
#pragma unroll
      for (int q = 0; q < 4; ++q) m = umax(m, umax((w[q] << 16) & 0x7FFF0000u, w[q] & 0x7FFF0000u));
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q) m = umax(m, w[q] & 0x7FFFFFFFu);
    }
  }
  for (int64_t i = head_end + nvec * kVec + threadIdx.x; i < e1; i += kThreads) m = umax(m, abs_bits(load1<In>(x, i)));
  amax_block_commit(m, t.amax + g);
  grouped_amax_done(t, fin);
}

}  // namespace

namespace qk {

bool grouped_fused_supported(const QuantizerSpec& q, QuantPath path) {
  if (path == QuantPath::generic) return false;
  const std::optional<Family> family = fused_family(q);
  if (!family) return false;
  if (*family == Family::cols) return true;  // RHT (fused_family's: [16,1], rht16) folded in
  return !q.rht && (*family == Family::rows || *family == Family::tiles);
}

KernelPlan grouped_plan(const QuantizerSpec& q, InputType type) {
  return plan_quantize(q, type, QuantPath::fused, false);
}

namespace {
// The grouped row launcher of plan's block and kind: the instantiated kinds
// of inst/rows_grouped_*.cu, the others through the runtime kind.
template <class In>
void launch_rows_grouped(const KernelPlan& plan, const KParams& p, const GroupTable& t, cudaStream_t st) {
  const KernelKind k = plan.kind;
  if (plan.block == 16) {
    if (k == KernelKind::nvfp4) return rows_grouped_launch<In, 16, KernelKind::nvfp4>(p, t, st);
    if (k == KernelKind::e2m1) return rows_grouped_launch<In, 16, KernelKind::e2m1>(p, t, st);
    return rows_grouped_launch<In, 16, KernelKind::runtime>(p, t, st);
  }
  if (e2m1_kind(k)) return rows_grouped_launch<In, 32, KernelKind::e2m1>(p, t, st);
  if (k == KernelKind::e4m3) return rows_grouped_launch<In, 32, KernelKind::e4m3>(p, t, st);
  rows_grouped_launch<In, 32, KernelKind::runtime>(p, t, st);
}

// The grouped column launcher of plan's block, RHT and kind (quantize_cols.cu's
// choice of instantiated kinds).
template <class In>
void launch_cols_grouped(const KernelPlan& plan, const KParams& p, const GroupTable& t, int64_t blocks,
                         cudaStream_t st) {
  using enum KernelKind;
  const KernelKind k = plan.kind;
  if (plan.block == 16) {
    if (plan.rht) {
      if (k == nvfp4) return cols_grouped_launch<In, 16, nvfp4, true>(p, t, blocks, st);
      return cols_grouped_launch<In, 16, runtime, true>(p, t, blocks, st);
    }
    if (k == nvfp4) return cols_grouped_launch<In, 16, nvfp4, false>(p, t, blocks, st);
    if (k == e2m1) return cols_grouped_launch<In, 16, e2m1, false>(p, t, blocks, st);
    return cols_grouped_launch<In, 16, runtime, false>(p, t, blocks, st);
  }
  switch (k) {
    case nvfp4: return cols_grouped_launch<In, 32, nvfp4, false>(p, t, blocks, st);
    case e2m1: return cols_grouped_launch<In, 32, e2m1, false>(p, t, blocks, st);
    case e4m3: return cols_grouped_launch<In, 32, e4m3, false>(p, t, blocks, st);
    case e5m2: return cols_grouped_launch<In, 32, e5m2, false>(p, t, blocks, st);
    default: return cols_grouped_launch<In, 32, runtime, false>(p, t, blocks, st);
  }
}
}  // namespace

void quantize_grouped_fused(const QuantizerSpec& q, const KernelPlan& plan, const void* x, InputType type, int64_t rows,
                            int64_t cols, int64_t scale_rows, bool rows16, int64_t col_blocks, const GroupTable& t,
                            const QuantOutputs& out, cudaStream_t stream) {
  const KParams p = make_params(q, x, rows, cols, RandomStream{}, out);
  const bool bf16 = type == InputType::bf16;
  GroupTable tt = t;
  if (plan.amax == AmaxStrategy::none) {
    tt.gparams = nullptr;
  } else if (plan.rht) {
    // The amax of each group's RHT output (the column kernel's own transform, as quantize_device's pass).
    const AmaxFinish fin{p.elem, p.sfmt, t.gparams, t.done};
    if (bf16)
      cols_grouped_amax_launch<uint16_t>(p, t, fin, col_blocks, stream);
    else
      cols_grouped_amax_launch<float>(p, t, fin, col_blocks, stream);
  } else if (t.n_items > 0) {
    const AmaxFinish fin{p.elem, p.sfmt, t.gparams, t.done};
    if (bf16)
      grouped_amax_kernel<uint16_t><<<unsigned(t.n_items), kThreads, 0, stream>>>(x, t, fin);
    else
      grouped_amax_kernel<float><<<unsigned(t.n_items), kThreads, 0, stream>>>(x, t, fin);
    check_launch("grouped_amax_kernel");
  }
  if (plan.family == Family::rows) {
    if (bf16)
      launch_rows_grouped<uint16_t>(plan, p, tt, stream);
    else
      launch_rows_grouped<float>(plan, p, tt, stream);
  } else if (plan.family == Family::cols) {
    if (bf16)
      launch_cols_grouped<uint16_t>(plan, p, tt, col_blocks, stream);
    else
      launch_cols_grouped<float>(plan, p, tt, col_blocks, stream);
  } else if (bf16) {
    launch_grouped_tiles<uint16_t>(p, tt, scale_rows, rows16, plan.kind, stream);
  } else {
    launch_grouped_tiles<float>(p, tt, scale_rows, rows16, plan.kind, stream);
  }
}

}  // namespace qk

}  // namespace fp4lab::cuda
