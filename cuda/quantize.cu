// GPU block quantization (quantize.hpp). Every numeric step calls the same
// FP4LAB_HD functions as sim/quantizer.cpp: core's encode()/encode_rn_f32()/
// decode()/random_bits(), core/sr.hpp's random-bit contracts,
// sim/scale_rules.hpp and sim/rht.hpp's sign rule.
// Built with --fmad=false so no FP32 sequence is contracted into an FMA.
#include "cuda/quantize.hpp"
#include "cuda/quantize_grouped.cuh"
#include "cuda/quantize_kernels.cuh"
#include "cuda/quantize_rule.cuh"
#include "cuda/quantize_tiles.cuh"
#include "cuda/rht.hpp"

#include <cooperative_groups.h>

#include <algorithm>
#include <array>
#include <string>

#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/philox.hpp"
#include "core/sr.hpp"
#include "sim/block_scales.hpp"
#include "sim/block_rules.hpp"
#include "sim/rht.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab::cuda {
namespace {

using namespace qk;

// ---- 16x16 tiles: one warp per two side-by-side tiles (tile_encode: quantize_tiles.cuh)
// tile_kernel: lane l takes row l % 16 of tile 2w + l / 16 of the warp's tile row: 16
// consecutive elements (one or two 16-byte loads per lane; a row's two tiles
// are 64 contiguous bytes of BF16). Each tile's amax is one warp reduction
// in which the other tile's lanes contribute 0. FM: Fast::rn for a quantizer
// that fast_rn_applies() to (as the row kernels'), else Fast::none. FULL (with
// Fast::rn): rows % 16 == 0 and full_spans_apply(p, 32): whole tile pairs,
// 32-bit indices, the tile row of a warp by FastDivU31, no bounds checks.
// GRID_AMAX (an nv rule with a tensor amax, launched cooperatively, every
// block resident): the tensor amax in the same kernel, from the values each
// lane already holds: commit, grid-wide barrier, the global scale from the
// amax word in every block; the last block to read it re-arms the word and the
// counter p.fin.done (QuantWorkspace::amax_armed). Same values as the amax
// pass + tile_kernel.
template <class In, KernelKind K, Fast FM = Fast::none, bool FULL = false, bool GRID_AMAX = false>
__global__ void __launch_bounds__(kThreads) tile_kernel(const KParams p) {
  static_assert(FM != Fast::rs && (!FULL || FM == Fast::rn));
  const int lane = threadIdx.x & 31, half = lane >> 4;
  int64_t tr = 0, tc = 0, r = 0, c0 = 0;
  int valid;
  bool active;  // warp-uniform: the warp has a tile pair (GRID_AMAX keeps the others to the barrier)
  const int64_t tiles_c = (p.cols + 15) / 16;
  if constexpr (FULL) {
    const uint32_t warp = (blockIdx.x * kThreads + threadIdx.x) >> 5;
    active = warp < p.units;
    if (!GRID_AMAX && !active) return;
    const uint32_t tr32 = p.unit_div.div(warp);
    const uint32_t tc32 = (warp - tr32 * uint32_t(tiles_c / 2)) * 2 + half;
    tr = tr32, tc = tc32, r = tr32 * 16 + (lane & 15), c0 = tc32 * 16;
    valid = 16;
  } else {
    const int64_t warp = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
    const int64_t pairs_c = (tiles_c + 1) / 2, pairs = ((p.rows + 15) / 16) * pairs_c;
    active = warp < pairs;
    if (!GRID_AMAX && !active) return;
    tr = pairs < (int64_t(1) << 32) ? int64_t(uint32_t(warp) / uint32_t(pairs_c)) : warp / pairs_c;
    tc = (warp - tr * pairs_c) * 2 + half;
    r = tr * 16 + (lane & 15), c0 = tc * 16;
    valid = (r < p.rows && c0 < p.cols) ? int(p.cols - c0 < 16 ? p.cols - c0 : 16) : 0;
  }
  float v[16];
  if (GRID_AMAX && !active) {
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = 0.0f;
  } else {
    load_n<In, 16, FULL>(p.x, r * p.cols + c0, valid, v);
  }
  const uint32_t a = amax_bits(v);
  const Format f = kind_elem<K>(p), sf = kind_scale<K>(p);
  NvGlobal g;
  if constexpr (GRID_AMAX) {
    amax_block_commit(a, p.gamax);
    cooperative_groups::this_grid().sync();
    g = nv_global(bits_float(__ldcg(p.gamax)), max_finite(sf), max_finite(f));
    if (last_block_to_arrive(p.fin.done) && threadIdx.x == 0) {  // every block has read the amax word
      *p.gamax = 0;
      *p.fin.done = 0;
    }
    if (!active) return;
  } else {
    g = nv_global_of(p, f, sf);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) store_global_decode(p.out, g.g_dec);
  tile_encode<K, FM, FULL>(p, f, sf, g, tr, tc, r, c0, v, a, valid);
}

// Kind K's tile kernel, its Fast::rn form where the quantizer allows (FULL
// where the shape and alignment allow).
template <class In, KernelKind K>
void launch_tile_kind(const KParams& p, unsigned blocks, cudaStream_t st) {
  if (fast_rn_applies(K, p)) {
    if (p.rows % 16 == 0 && full_spans_apply(p, 32)) {
      const KParams pf = full_params(p, (p.rows / 16) * (p.cols / 32), p.cols / 32);
      tile_kernel<In, K, Fast::rn, true><<<blocks, kThreads, 0, st>>>(pf);
    } else {
      tile_kernel<In, K, Fast::rn><<<blocks, kThreads, 0, st>>>(p);
    }
  } else {
    tile_kernel<In, K><<<blocks, kThreads, 0, st>>>(p);
  }
}

template <class In>
void launch_tile_kernel(const KParams& p, KernelKind kind, unsigned blocks, cudaStream_t st) {
  if (kind == KernelKind::nvfp4)
    launch_tile_kind<In, KernelKind::nvfp4>(p, blocks, st);
  else if (kind == KernelKind::e2m1)
    launch_tile_kind<In, KernelKind::e2m1>(p, blocks, st);
  else
    tile_kernel<In, KernelKind::runtime><<<blocks, kThreads, 0, st>>>(p);
}

// How many blocks of the cooperative tile kernel of (In, FULL) the GPU holds at once.
template <class In, bool FULL>
int64_t tiles_grid_capacity() {
  static const int64_t capacity = resident_blocks(tile_kernel<In, KernelKind::nvfp4, Fast::rn, FULL, true>);
  return capacity;
}

// The NVFP4 tile quantization with its tensor amax in one cooperative launch
// (tile_kernel's GRID_AMAX; AmaxStrategy::cooperative, whose plan has the rn
// rounding of its Fast::rn form), when every block of the grid can be resident
// at once (the trainer's weights); false (nothing launched) otherwise. p.gamax
// must be zero (re-armed by the kernel), p.fin.done the zeroed counter.
template <class In, bool FULL>
bool try_tiles_grid_amax(const KParams& p, unsigned blocks, cudaStream_t st) {
  const auto kernel = tile_kernel<In, KernelKind::nvfp4, Fast::rn, FULL, true>;
  if (int64_t(blocks) > tiles_grid_capacity<In, FULL>()) return false;
  KParams arg = p;
  void* args[] = {&arg};
  check(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(blocks), dim3(kThreads), args, 0, st),
        "cudaLaunchCooperativeKernel (tile_kernel, tensor amax)");
  return true;
}
// The grid of launch_tiles_grid_amax: its blocks (0: no tile) and its FULL form.
unsigned tiles_grid_blocks(const KParams& p, bool& full) {
  const int64_t pairs = ((p.rows + 15) / 16) * ((p.cols + 31) / 32);
  full = p.rows % 16 == 0 && full_spans_apply(p, 32);
  return unsigned((pairs * 32 + kThreads - 1) / kThreads);
}
// Would launch_tiles_grid_amax(p, in) launch (rather than leave the amax to a pre-pass)?
bool tiles_grid_amax_fits(const KParams& p, InputType in) {
  bool full = false;
  const unsigned blocks = tiles_grid_blocks(p, full);
  if (blocks == 0) return false;
  const int64_t capacity = in == InputType::bf16
                               ? (full ? tiles_grid_capacity<uint16_t, true>() : tiles_grid_capacity<uint16_t, false>())
                               : (full ? tiles_grid_capacity<float, true>() : tiles_grid_capacity<float, false>());
  return int64_t(blocks) <= capacity;
}
bool launch_tiles_grid_amax(const KParams& p, InputType in, cudaStream_t st) {
  bool full = false;
  const unsigned blocks = tiles_grid_blocks(p, full);
  if (blocks == 0) return false;
  const KParams pf = full ? full_params(p, (p.rows / 16) * (p.cols / 32), p.cols / 32) : p;
  if (in == InputType::bf16)
    return full ? try_tiles_grid_amax<uint16_t, true>(pf, blocks, st)
                : try_tiles_grid_amax<uint16_t, false>(pf, blocks, st);
  return full ? try_tiles_grid_amax<float, true>(pf, blocks, st) : try_tiles_grid_amax<float, false>(pf, blocks, st);
}

void launch_tiles(const KParams& p, KernelKind kind, InputType in, cudaStream_t st) {
  const int64_t pairs = ((p.rows + 15) / 16) * ((p.cols + 31) / 32);  // one warp per two tiles
  const unsigned blocks = unsigned((pairs * 32 + kThreads - 1) / kThreads);
  if (pairs == 0) return;
  if (in == InputType::bf16)
    launch_tile_kernel<uint16_t>(p, kind, blocks, st);
  else
    launch_tile_kernel<float>(p, kind, blocks, st);
  check_launch("tile_kernel");
}

// ---- tensor amax ---------------------------------------------------------------
// Sweeps the tensor from its end to its start (vector nv - 1 - k at step k):
// the last bytes it reads are the tensor's first, which the quantization pass
// that follows reads first, while they are still in L2 (50 MB on H100).
template <class In>
__global__ void __launch_bounds__(kThreads) amax_kernel(const void* x, int64_t n, uint32_t* out, const AmaxFinish fin) {
  uint32_t m = 0;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if constexpr (sizeof(In) == 2) {
    const int64_t nv = n / 8;  // 16-byte vectors
    const uint4* xv = static_cast<const uint4*>(x);
    for (int64_t k = i; k < nv; k += stride) {
      const uint4 u = __ldg(xv + (nv - 1 - k));
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) m = umax(m, umax((w[q] << 16) & 0x7FFF0000u, w[q] & 0x7FFF0000u));
    }
    for (int64_t k = nv * 8 + i; k < n; k += stride) m = umax(m, abs_bits(load1<In>(x, k)));
  } else {
    const int64_t nv = n / 4;
    const float4* xv = static_cast<const float4*>(x);
    for (int64_t k = i; k < nv; k += stride) {
      const float4 u = __ldg(xv + (nv - 1 - k));
      m = umax(m, umax(umax(abs_bits(u.x), abs_bits(u.y)), umax(abs_bits(u.z), abs_bits(u.w))));
    }
    for (int64_t k = nv * 4 + i; k < n; k += stride) m = umax(m, abs_bits(load1<In>(x, k)));
  }
  amax_block_commit(m, out);
  amax_pass_done(fin, out);
}

// NvGlobal of the tensor amax, once per tensor (not once per thread).
__global__ void nv_global_kernel(const KParams p, float* out) {
  const NvGlobal g = nv_global_of(p, p.elem, p.sfmt);
  out[0] = g.g_enc;
  out[1] = g.g_dec;
  out[2] = g.mult;
}

}  // namespace

void scale_grid(const QuantizerSpec& q, int64_t rows, int64_t cols, int64_t& scale_rows, int64_t& scale_cols) {
  const BlockGrid g = block_grid(q, rows, cols);
  scale_rows = g.nbr;
  scale_cols = g.nbc;
}

namespace qk {

// The kernels' parameters of quantizer q on x [rows, cols] (no workspace yet; declared in
// quantize_grouped.cuh for the grouped kernels' host side).
KParams make_params(const QuantizerSpec& q, const void* x, int64_t rows, int64_t cols, RandomStream rs,
                    const QuantOutputs& out) {
  const BlockGrid grid = block_grid(q, rows, cols);
  KParams p{};
  p.elem = *q.element;
  p.sfmt = *q.scale;
  p.rule = q.scale_rule;
  p.round = q.round;
  p.overflow = q.overflow;
  p.global = q.global_scale == GlobalScale::tensor_amax;
  p.rows = rows;
  p.cols = cols;
  p.nbc = grid.nbc;
  p.br = grid.br;
  p.bc = grid.bc;
  p.x = x;
  p.seed = rs.seed;
  p.stream = rs.stream;
  p.sr = sr_layout(q, cols);
  if (q.rht) {
    const std::array<float, 16> s = rht_signs(q.rht_signs, q.rht_seed);
    std::copy(s.begin(), s.end(), p.signs);
  }
  p.out = out;
  return p;
}

}  // namespace qk

namespace {

// tensor_amax_device, plus the optional NvGlobal of the result (fin).
// armed: *amax_bits is already zero (QuantWorkspace::amax_armed), no memset.
void tensor_amax_pass(const void* x, InputType type, int64_t n, uint32_t* amax_bits, const AmaxFinish& fin,
                      cudaStream_t stream, bool armed = false) {
  if (!armed) check(cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync(amax)");
  if (n <= 0) return;
  static int sms = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 132;
  }();
  const unsigned blocks = unsigned(std::min<int64_t>(int64_t(sms) * 8, (n / 8 + kThreads - 1) / kThreads + 1));
  if (type == InputType::bf16) {
    amax_kernel<uint16_t><<<blocks, kThreads, 0, stream>>>(x, n, amax_bits, fin);
  } else {
    amax_kernel<float><<<blocks, kThreads, 0, stream>>>(x, n, amax_bits, fin);
  }
  check_launch("amax_kernel");
}

// Where the NvGlobal of a tensor amax goes: ws.global[3 * slot .. 3 * slot + 2]
// (slot 0, or 1 for quantize_dual's second quantizer).
float* global_slot(QuantWorkspace& ws, int slot) {
  ws.global.at_least(6);
  return ws.global.data() + 3 * slot;
}

// The AmaxFinish of a fused quantization's amax pass: NvGlobal into global_slot(ws, slot).
AmaxFinish finish_into(const KParams& p, QuantWorkspace& ws, cudaStream_t stream, int slot = 0) {
  float* out = global_slot(ws, slot);
  if (ws.done.size() == 0) {
    ws.done.resize(1);
    check(cudaMemsetAsync(ws.done.data(), 0, sizeof(uint32_t), stream), "cudaMemsetAsync(amax counter)");
  }
  return AmaxFinish{p.elem, p.sfmt, out, ws.done.data()};
}


// Given random words (RandomStream::words, host memory) replace Philox on the
// CPU only: the kernels draw their words themselves.
void check_stream(const RandomStream& rs) {
  if (rs.words)
    throw Error(
        "quantize (cuda): given random words (RandomStream::words) are CPU-only; the GPU draws its words from "
        "Philox (seed, stream): pass words = nullptr");
}

// quantize_device's checks of the call, before any plan: the spec, the random
// stream, the shape and the code layout.
void check_call(const QuantizerSpec& q, const RandomStream& rs, const QuantOutputs& out, int64_t rows, int64_t cols) {
  validate(q, "quantize (cuda)");
  check_stream(rs);
  if (rows < 0 || cols < 0) throw Error("quantize (cuda): negative shape");
  if (out.code_layout == CodeLayout::packed4 && out.codes && q.element->bits() != 4)
    throw Error("quantize (cuda): packed4 code layout needs a 4-bit element, got '" + std::string(q.element->name) +
                "'");
}

// The quantization kernel of a fused plan (rows, cols or tiles).
void launch_family(const KernelPlan& plan, const KParams& p, cudaStream_t stream) {
  switch (plan.family) {
    case Family::rows: return launch_rows(p, plan.block, plan.rht, plan.kind, plan.input, stream);
    case Family::cols: return launch_cols(p, plan.block, plan.rht, plan.kind, plan.input, stream);
    case Family::tiles: return launch_tiles(p, plan.kind, plan.input, stream);
    default: throw Error("quantize (cuda): not a fused family");
  }
}

// A fused plan: its amax strategy (the global scale into global_slot(ws, 0),
// read by the quantization kernel through p.gparams), then its kernel.
void run_fused(const KernelPlan& plan, KParams& p, QuantWorkspace& ws, cudaStream_t stream,
               const uint32_t* tensor_amax_bits) {
  switch (plan.amax) {
    case AmaxStrategy::none:
      break;
    case AmaxStrategy::given:
      p.gamax = const_cast<uint32_t*>(tensor_amax_bits);  // only read by the quantize pass
      nv_global_kernel<<<1, 1, 0, stream>>>(p, global_slot(ws, 0));
      check_launch("nv_global_kernel");
      break;
    case AmaxStrategy::cooperative:
    case AmaxStrategy::pre_pass: {
      // The amax pass's last block also computes the global scale (amax_pass_done)
      // and re-arms the amax word (zero again for the next pass).
      KParams pa = p;
      pa.fin = finish_into(p, ws, stream);
      if (!ws.amax_armed) check(cudaMemsetAsync(p.gamax, 0, 2 * sizeof(uint32_t), stream), "cudaMemsetAsync(amax)");
      // NVFP4 16x16 tiles of a tensor whose grid fits on the GPU at once (the
      // trainer's weights): amax and quantization in one launch.
      if (plan.amax == AmaxStrategy::cooperative && launch_tiles_grid_amax(pa, plan.input, stream)) {
        ws.amax_armed = true;
        return;
      }
      if (plan.rht && plan.family == Family::rows)
        launch_rows_amax(pa, plan.input, stream);
      else if (plan.rht)
        launch_cols_amax(pa, plan.input, stream);
      else
        tensor_amax_pass(p.x, plan.input, p.rows * p.cols, p.gamax, pa.fin, stream, /*armed=*/true);
      ws.amax_armed = true;
      break;
    }
  }
  if (plan.amax != AmaxStrategy::none) p.gparams = global_slot(ws, 0);
  launch_family(plan, p, stream);
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

// quantize.hpp's alignment rule. The one kernel that needs more than element
// alignment of any pointer is amax_kernel (tensor_amax_pass), whose 16-byte
// loads of x are unchecked; every other kernel checks each vector access
// (quantize_io.cuh, quantize_fast.cuh: aligned<W>()), takes its FULL form only
// where bases_aligned16(), or loads and stores element by element. Does plan
// run amax_kernel on x? The fused amax pass of a rule with a tensor amax,
// without RHT (the RHT passes are the checked row / column kernels): always
// as pre_pass; as cooperative where the one-launch tile kernel does not fit
// (tiles_grid_amax_fits, the test launch_tiles_grid_amax makes); and the
// generic path's amax of a one-block tensor.
bool runs_amax_kernel_on_x(const KernelPlan& plan, const BlockGrid& grid, const KParams& p) {
  if (plan.family == Family::generic) return grid.nbr * grid.nbc == 1;
  if (plan.rht) return false;
  if (plan.amax == AmaxStrategy::pre_pass) return true;
  if (plan.amax == AmaxStrategy::cooperative) return !tiles_grid_amax_fits(p, plan.input);
  return false;
}

// The bytes of p.x that quantize_device copies into QuantWorkspace::staging:
// the whole input where the plan's kernels need it 16-byte aligned and it is
// not, else 0. An aligned x costs one pointer test.
size_t staging_bytes(const KernelPlan& plan, const BlockGrid& grid, const KParams& p, InputType type) {
  if (aligned16(p.x) || p.rows == 0 || p.cols == 0 || !runs_amax_kernel_on_x(plan, grid, p)) return 0;
  return size_t(p.rows * p.cols) * (type == InputType::bf16 ? sizeof(uint16_t) : sizeof(float));
}

}  // namespace

void tensor_amax_device(const void* x, InputType type, int64_t n, uint32_t* amax_bits, cudaStream_t stream) {
  if (n > 0 && !aligned16(x))
    throw Error("tensor_amax_device: x must be 16-byte aligned (its kernel's vector loads); quantize_device stages an "
                "unaligned input itself");
  tensor_amax_pass(x, type, n, amax_bits, AmaxFinish{}, stream);
}

size_t quantize_staging_bytes(const QuantizerSpec& q, const void* x, InputType type, int64_t rows, int64_t cols,
                              QuantPath path, bool tensor_amax_given) {
  validate(q, "quantize (cuda)");
  if (aligned16(x) || rows <= 0 || cols <= 0) return 0;
  const KernelPlan plan = plan_quantize(q, type, path, tensor_amax_given);
  return staging_bytes(plan, block_grid(q, rows, cols), make_params(q, x, rows, cols, RandomStream{}, QuantOutputs{}),
                       type);
}

void quantize_device(const QuantizerSpec& q, const void* x, InputType type, int64_t rows, int64_t cols, RandomStream rs,
                     const QuantOutputs& out, QuantWorkspace& ws, cudaStream_t stream, QuantPath path,
                     const uint32_t* tensor_amax_bits) {
  check_call(q, rs, out, rows, cols);
  const KernelPlan plan = plan_quantize(q, type, path, tensor_amax_bits != nullptr);
  const BlockGrid grid = block_grid(q, rows, cols);
  KParams p = make_params(q, x, rows, cols, rs, out);
  // Fused: the two words quantize_dual uses too; generic: the tensor amax, then the block amaxes.
  const size_t amax_words = size_t(plan.family == Family::generic ? 1 + grid.nbr * grid.nbc : 2);
  if (ws.amax.size() < amax_words) ws.amax_armed = false;  // grown: contents undefined
  ws.amax.at_least(amax_words);
  p.gamax = ws.amax.data();
  if (rows == 0 || cols == 0) return;
  // An x its kernels need 16-byte aligned that is not: they read an aligned copy.
  if (const size_t bytes = staging_bytes(plan, grid, p, type)) {
    uint8_t* copy = ws.staging.at_least(bytes);
    check(cudaMemcpyAsync(copy, x, bytes, cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync (quantize: aligned copy of the input)");
    p.x = copy;
  }
  if (plan.family == Family::generic && q.rht) {  // transformed (and rounded) into ws.transformed, FP32
    float* t = ws.transformed.at_least(size_t(rows * cols));
    rht_forward_device(q, x, type == InputType::bf16, t, rows, cols, stream);
    p.x = t;
    with_block_rule(
        q, [&]<class R>(const typename R::Params& rp) { run_rule<R>(p, rp, grid, InputType::f32, ws, stream); });
  } else if (plan.family == Family::generic)
    with_block_rule(q, [&]<class R>(const typename R::Params& rp) { run_rule<R>(p, rp, grid, type, ws, stream); });
  else
    run_fused(plan, p, ws, stream, tensor_amax_bits);
}

void quantize_dual_device(const QuantizerSpec& row_q, RandomStream row_rs, const QuantOutputs& row_out,
                          const QuantizerSpec& col_q, RandomStream col_rs, const QuantOutputs& col_out, const void* x,
                          InputType type, int64_t rows, int64_t cols, QuantWorkspace& ws, cudaStream_t stream,
                          const uint32_t* amax_given) {
  validate(row_q, "quantize_dual (cuda), row quantizer");
  validate(col_q, "quantize_dual (cuda), column quantizer");
  check_stream(row_rs);
  check_stream(col_rs);
  if (rows < 0 || cols < 0) throw Error("quantize_dual (cuda): negative shape");
  const std::optional<KernelPlan> plan = plan_dual(row_q, col_q, type, rows, cols, amax_given != nullptr);
  if (!plan)
    throw Error(
        "quantize_dual (cuda): needs NVFP4-kind quantizers (e2m1 elements, ue4m3 scales, nv rule, rn or rs) with "
        "blocks [1,16] (no RHT) and [16,1] (RHT allowed) on a tensor whose sides are multiples of 16; got " +
        describe(row_q) + " and " + describe(col_q) + " on [" + std::to_string(rows) + ", " + std::to_string(cols) +
        "]");
  KParams pr = make_params(row_q, x, rows, cols, row_rs, row_out);
  KParams pc = make_params(col_q, x, rows, cols, col_rs, col_out);
  if (ws.amax.size() < 2) ws.amax_armed = false;  // grown: contents undefined
  ws.amax.at_least(2);
  pr.gamax = ws.amax.data();
  pc.gamax = ws.amax.data() + 1;
  if (rows == 0 || cols == 0) return;
  const bool need_r = row_q.global_scale == GlobalScale::tensor_amax;
  const bool need_c = col_q.global_scale == GlobalScale::tensor_amax;
  if (plan->amax == AmaxStrategy::given) {
    // Only read by the quantization pass (each thread computes NvGlobal from them).
    pr.gamax = const_cast<uint32_t*>(amax_given);
    pc.gamax = const_cast<uint32_t*>(amax_given) + 1;
  } else if (plan->amax == AmaxStrategy::pre_pass) {
    // One pass for both amaxes (the column operand's of its RHT output); its
    // last block computes both global scales and re-arms both amax words.
    if (!ws.amax_armed)
      check(cudaMemsetAsync(ws.amax.data(), 0, 2 * sizeof(uint32_t), stream), "cudaMemsetAsync(amax)");
    KParams ar = pr, ac = pc;
    if (need_r) ar.fin = finish_into(pr, ws, stream, 0);
    if (need_c) ac.fin = finish_into(pc, ws, stream, 1);
    launch_dual(ar, ac, plan->rht, type, true, stream);
    ws.amax_armed = true;
    if (need_r) pr.gparams = global_slot(ws, 0);
    if (need_c) pc.gparams = global_slot(ws, 1);
  }
  launch_dual(pr, pc, plan->rht, type, false, stream);
}

void fake_quantize_device(const QuantizerSpec& q, float* x, int64_t rows, int64_t cols, RandomStream rs,
                          QuantWorkspace& ws, cudaStream_t stream, QuantPath path) {
  // In place: every kernel writes an element only after the same thread has
  // read it, and no thread reads another's elements after the amax passes.
  // (Where quantize_device stages x, the kernels read the copy and write x.)
  check_stream(rs);
  QuantOutputs o;
  o.dequant = x;
  quantize_device(q, x, InputType::f32, rows, cols, rs, o, ws, stream, path);
  if (q.rht) rht_inverse_device(q, x, rows, cols, stream);
}

void fake_quantize_gpu(const QuantizerSpec& q, MatrixView<float> x, RandomStream rs, QuantPath path) {
  std::vector<float> h(static_cast<size_t>(x.rows * x.cols));
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) h[size_t(r * x.cols + c)] = x(r, c);
  DeviceBuffer<float> d;
  d.upload(h);
  QuantWorkspace ws;
  fake_quantize_device(q, d.data(), x.rows, x.cols, rs, ws, nullptr, path);
  check(cudaDeviceSynchronize(), "fake_quantize_gpu");
  h = d.download();
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) x(r, c) = h[size_t(r * x.cols + c)];
}

DeviceInput upload_input(MatrixView<const float> x, bool bf16, const char* what) {
  DeviceInput in;
  std::vector<float> host(static_cast<size_t>(x.rows * x.cols));
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) host[size_t(r * x.cols + c)] = x(r, c);
  if (bf16) {
    std::vector<uint16_t> h16(host.size());
    for (size_t i = 0; i < h16.size(); ++i) {
      const uint32_t b = float_bits(host[i]);
      if ((b & 0xFFFFu) != 0)
        throw Error(std::string(what) + ": bf16_input but element " + std::to_string(i) + " is not a bfloat16 value");
      h16[i] = uint16_t(b >> 16);
    }
    if (!h16.empty()) in.bf16.upload(h16);
    in.data = in.bf16.data();
    in.type = InputType::bf16;
  } else {
    if (!host.empty()) in.f32.upload(host);
    in.data = in.f32.data();
  }
  return in;
}

QuantizedTensor quantize_gpu(const QuantizerSpec& q, MatrixView<const float> x, RandomStream rs, QuantPath path,
                             bool bf16_input) {
  const int64_t rows = x.rows, cols = x.cols, n = rows * cols;
  const DeviceInput in = upload_input(x, bf16_input, "quantize_gpu");
  int64_t sr = 0, sc = 0;
  scale_grid(q, rows, cols, sr, sc);
  const bool has_codes = q.scale != &float32;
  DeviceBuffer<uint8_t> codes(static_cast<size_t>(n)), scodes(has_codes ? static_cast<size_t>(sr * sc) : 0);
  DeviceBuffer<float> scales(static_cast<size_t>(sr * sc)), dq(static_cast<size_t>(n)), gdec(1);
  // Poison the outputs so that an unwritten element cannot pass.
  codes.fill_bytes(0xA5);
  scodes.fill_bytes(0xA5);
  scales.fill_bytes(0xA5);
  dq.fill_bytes(0xA5);
  gdec.fill_bytes(0xA5);
  QuantOutputs o;
  o.codes = codes.data();
  o.scale_codes = has_codes ? scodes.data() : nullptr;
  o.scales = scales.data();
  o.dequant = dq.data();
  o.global_decode = gdec.data();
  QuantWorkspace ws;
  quantize_device(q, in.data, in.type, rows, cols, rs, o, ws, nullptr, path);
  check(cudaDeviceSynchronize(), "quantize_gpu");
  QuantizedTensor t;
  t.spec = q;
  t.rows = rows;
  t.cols = cols;
  t.codes = codes.download();
  t.scale_rows = sr;
  t.scale_cols = sc;
  if (has_codes) t.scale_codes = scodes.download();
  t.scales = scales.download();
  t.global_decode = gdec.download()[0];
  t.dequant = dq.download();
  return t;
}


}  // namespace fp4lab::cuda
