// Single-launch grouped quantization, private to cuda/: the device table of a
// grouped tensor's groups (GroupTable) and the two device helpers that let one
// kernel quantize every group as if each were quantized alone (group_of,
// group_params). Used by the grouped row kernels (quantize_rows_grouped.cuh,
// instantiated in inst/rows_grouped_*.cu), the grouped tile kernel and the
// per-group amax pass (quantize_grouped.cu); the host side is grouped.cu.
//
// A thread (a warp for tiles) maps its work unit to a scale row of the
// concatenated grouped layout (sim/grouped.hpp: the groups' scale matrices
// stacked), finds the group that holds it, and from then on works on a KParams
// whose input and output pointers start at that group's slices, whose row
// count is the group's, and whose random stream and global scale are the
// group's: the dense kernels' code then runs unchanged on the group, which is
// what makes the result equal quantize_device on each group's slice (and sim's
// quantize_grouped), bit for bit.
#pragma once

#include <cstdint>

#include "cuda/quantize_amax.cuh"
#include "cuda/quantize_params.cuh"

namespace fp4lab::cuda::qk {

// Device arrays describing the groups (all device pointers).
struct GroupTable {
  int groups = 0;
  const int64_t* soff = nullptr;     // [groups + 1] first scale row of each group (rows for [1,n] blocks)
  const int64_t* roff = nullptr;     // [groups + 1] first row of each group
  const uint64_t* seeds = nullptr;   // [groups] each group's RandomStream::seed
  const uint64_t* streams = nullptr; // [groups] each group's RandomStream::stream
  uint32_t* amax = nullptr;          // [groups] amax bits (zero between passes; rules with a tensor amax)
  float* gparams = nullptr;          // [3 * groups] NvGlobal of each group's amax, or null (no global scale)
  float* gemm_alpha = nullptr;       // [groups] optional: g_dec * gemm_alpha_other (QuantOutputs::gemm_alpha)
  const float* gemm_alpha_other = nullptr;  // [groups] optional
  const int64_t* items = nullptr;    // amax pass work items [3 * n_items]: group, first element, end element
  int64_t n_items = 0;
  uint32_t* done = nullptr;          // amax pass block counter (zero between passes)
  // [groups] optional: the element of x where group g's rows start (the experts' W at a parameter
  // stride); null: the concatenated layout's roff[g] * cols.
  const int64_t* xoff = nullptr;
  // [groups] optional: the element where group g's dequant / dequant_bf16 start (aligned GEMM
  // operand starts); null: the concatenated layout's roff[g] * cols.
  const int64_t* ooff = nullptr;
  // [groups + 1] the column kernels' first block of each group: a block never spans two groups, so
  // a block's amax commit goes to one group's word (quantize_cols_grouped.cuh).
  const int64_t* boff = nullptr;
};

// The largest g with off[g] <= s over off[0 .. groups - 1] (empty groups, whose
// offset equals the next one's, are never chosen).
__device__ __forceinline__ int group_at(const int64_t* off, int groups, int64_t s) {
  int lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(off + mid) <= s)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}
// The group holding scale row s.
__device__ __forceinline__ int group_of(const GroupTable& t, int64_t s) { return group_at(t.soff, t.groups, s); }

// p (the whole grouped tensor's parameters: rows = all rows, outputs at the
// concatenated layout's starts) narrowed to group g: its input and output
// slices, its rows, its random stream, its amax / global scale, its g_dec and
// GEMM alpha slots.
template <class In>
__device__ __forceinline__ KParams group_params(const KParams& p, const GroupTable& t, int g) {
  KParams q = p;
  const int64_t r0 = __ldg(t.roff + g), s0 = __ldg(t.soff + g);
  q.rows = __ldg(t.roff + g + 1) - r0;
  q.x = static_cast<const In*>(p.x) + (t.xoff ? __ldg(t.xoff + g) : r0 * p.cols);
  const int64_t o0 = t.ooff ? __ldg(t.ooff + g) : r0 * p.cols;
  const int64_t code_row = p.out.code_layout == CodeLayout::packed4 ? (p.cols + 1) / 2 : p.cols;
  if (q.out.codes) q.out.codes += r0 * code_row;
  if (q.out.scale_codes) q.out.scale_codes += s0 * p.nbc;
  if (q.out.scales) q.out.scales += s0 * p.nbc;
  if (q.out.dequant) q.out.dequant += o0;
  if (q.out.dequant_bf16) q.out.dequant_bf16 += o0;
  if (q.out.global_decode) q.out.global_decode += g;
  q.out.gemm_alpha = t.gemm_alpha ? t.gemm_alpha + g : nullptr;
  q.out.gemm_alpha_other = t.gemm_alpha_other ? t.gemm_alpha_other + g : nullptr;
  q.seed = __ldg(t.seeds + g);
  q.stream = __ldg(t.streams + g);
  q.gamax = t.amax ? t.amax + g : nullptr;
  q.gparams = t.gparams ? t.gparams + 3 * g : nullptr;
  return q;
}

// The end of a per-group amax pass: every thread of every block calls it after
// its block's amax_block_commit into its group's word; the grid's last block
// computes each group's NvGlobal into fin.out ([3 * groups], fin's formats:
// store_nv_global's rule) and re-arms the amax words and the counter t.done.
__device__ __forceinline__ void grouped_amax_done(const GroupTable& t, const AmaxFinish& fin) {
  if (!last_block_to_arrive(t.done)) return;
  __threadfence();
  for (int h = threadIdx.x; h < t.groups; h += blockDim.x) {
    const uint32_t bits = atomicOr(t.amax + h, 0u);
    const NvGlobal gl = nv_global(bits_float(bits), max_finite(fin.sfmt), max_finite(fin.elem));
    fin.out[3 * h] = gl.g_enc;
    fin.out[3 * h + 1] = gl.g_dec;
    fin.out[3 * h + 2] = gl.mult;
    t.amax[h] = 0;
  }
  if (threadIdx.x == 0) *t.done = 0;
}

// The kernels' parameters of quantizer q on x [rows, cols] (quantize.cu; no
// workspace yet: gamax, gparams and the generic path's buffers unset).
KParams make_params(const QuantizerSpec& q, const void* x, int64_t rows, int64_t cols, RandomStream rs,
                    const QuantOutputs& out);

// Host side (quantize_grouped.cu). Can the one-launch form run q (a fused plan of the
// rows family without RHT, of 16x16 tiles, or of column blocks [16,1] / [32,1]
// with or without their RHT; not QuantPath::generic)?
bool grouped_fused_supported(const QuantizerSpec& q, QuantPath path);
// The one-launch form's plan of q on `type` input (the fused path, no given
// amax): its family and kind pick the grouped kernel, and plan.amax !=
// AmaxStrategy::none where the rule needs each group's amax (an nv rule with a
// tensor amax). Computed once a call and passed to quantize_grouped_fused.
KernelPlan grouped_plan(const QuantizerSpec& q, InputType type);
// Every group of x [rows, cols] in one quantization launch (after one launch
// of the per-group amax pass where the rule needs it: t.amax zero, t.done
// zero, t.gparams [3 * groups]; t.items for the element-wise pass, the column
// kernel's RHT pass for column blocks with RHT). plan: grouped_plan(q, type).
// out: the concatenated outputs' starts (global_decode: [groups]);
// scale_rows: the table's total (soff[groups]); rows16: every group's rows a
// multiple of 16 (lets 16x16 tiles take their unchecked form where the
// columns and alignment allow too); col_blocks: the column kernels' blocks
// (t.boff's total; 0 for the other families).
void quantize_grouped_fused(const QuantizerSpec& q, const KernelPlan& plan, const void* x, InputType type, int64_t rows,
                            int64_t cols, int64_t scale_rows, bool rows16, int64_t col_blocks, const GroupTable& t,
                            const QuantOutputs& out, cudaStream_t stream);

// Launchers (inst/rows_grouped_*.cu): every group's row blocks [1,BC] of kind
// K in one launch, p.rows = all rows (the scale rows of the table). No RHT.
template <class In, int BC, KernelKind K>
void rows_grouped_launch(const KParams& p, const GroupTable& t, cudaStream_t st);
// (inst/cols_grouped_*.cu) every group's column blocks [BR,1] of kind K (RHT
// down each group's 16-row chunks with RHT) in one launch of `blocks` blocks
// (t.boff: each group's first block, cols_grouped_blocks). The RHT amax pass:
// each group's amax of its RHT output into t.amax, its NvGlobal into fin.out.
template <class In, int BR, KernelKind K, bool RHT>
void cols_grouped_launch(const KParams& p, const GroupTable& t, int64_t blocks, cudaStream_t st);
template <class In>
void cols_grouped_amax_launch(const KParams& p, const GroupTable& t, const AmaxFinish& fin, int64_t blocks,
                              cudaStream_t st);
// The blocks of the column kernel of [br,1] blocks on a group of n rows (kThreads
// threads a block, one strip of br rows x V columns a thread).
inline int64_t cols_grouped_blocks(int br, int64_t n, int64_t cols) {
  const int v = br == 16 ? 4 : 2;
  const int64_t strips = (n + br - 1) / br * ((cols + v - 1) / v);
  return (strips + kThreads - 1) / kThreads;
}

}  // namespace fp4lab::cuda::qk
