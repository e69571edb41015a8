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
};

// The group holding scale row s: the largest g with soff[g] <= s (empty
// groups, whose soff equals the next one's, are never chosen for a row).
__device__ __forceinline__ int group_of(const GroupTable& t, int64_t s) {
  int lo = 0, hi = t.groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(t.soff + mid) <= s)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// p (the whole grouped tensor's parameters: rows = all rows, outputs at the
// concatenated layout's starts) narrowed to group g: its input and output
// slices, its rows, its random stream, its amax / global scale, its g_dec and
// GEMM alpha slots.
template <class In>
__device__ __forceinline__ KParams group_params(const KParams& p, const GroupTable& t, int g) {
  KParams q = p;
  const int64_t r0 = __ldg(t.roff + g), s0 = __ldg(t.soff + g);
  q.rows = __ldg(t.roff + g + 1) - r0;
  q.x = static_cast<const In*>(p.x) + r0 * p.cols;
  const int64_t code_row = p.out.code_layout == CodeLayout::packed4 ? (p.cols + 1) / 2 : p.cols;
  if (q.out.codes) q.out.codes += r0 * code_row;
  if (q.out.scale_codes) q.out.scale_codes += s0 * p.nbc;
  if (q.out.scales) q.out.scales += s0 * p.nbc;
  if (q.out.dequant) q.out.dequant += r0 * p.cols;
  if (q.out.dequant_bf16) q.out.dequant_bf16 += r0 * p.cols;
  if (q.out.global_decode) q.out.global_decode += g;
  q.out.gemm_alpha = t.gemm_alpha ? t.gemm_alpha + g : nullptr;
  q.out.gemm_alpha_other = t.gemm_alpha_other ? t.gemm_alpha_other + g : nullptr;
  q.seed = __ldg(t.seeds + g);
  q.stream = __ldg(t.streams + g);
  q.gamax = t.amax ? t.amax + g : nullptr;
  q.gparams = t.gparams ? t.gparams + 3 * g : nullptr;
  return q;
}

// The kernels' parameters of quantizer q on x [rows, cols] (quantize.cu; no
// workspace yet: gamax, gparams and the generic path's buffers unset).
KParams make_params(const QuantizerSpec& q, const void* x, int64_t rows, int64_t cols, RandomStream rs,
                    const QuantOutputs& out);

// Host side (quantize_grouped.cu). Can the one-launch form run q (a fused plan of the
// rows family without RHT, or of 16x16 tiles; not QuantPath::generic)?
bool grouped_fused_supported(const QuantizerSpec& q, QuantPath path);
// The one-launch form's plan of q on `type` input (the fused path, no given
// amax): its family and kind pick the grouped kernel, and plan.amax !=
// AmaxStrategy::none where the rule needs each group's amax (an nv rule with a
// tensor amax). Computed once a call and passed to quantize_grouped_fused.
KernelPlan grouped_plan(const QuantizerSpec& q, InputType type);
// Every group of x [rows, cols] in one quantization launch (after one launch
// of the per-group amax pass where the rule needs it: t.items, t.amax zero,
// t.done zero, t.gparams [3 * groups]). plan: grouped_plan(q, type). out:
// the concatenated outputs' starts (global_decode: [groups]); scale_rows: the
// table's total (soff[groups]); rows16: every group's rows a multiple of 16
// (lets 16x16 tiles take their unchecked form where the columns and alignment
// allow too).
void quantize_grouped_fused(const QuantizerSpec& q, const KernelPlan& plan, const void* x, InputType type, int64_t rows,
                            int64_t cols, int64_t scale_rows, bool rows16, const GroupTable& t, const QuantOutputs& out,
                            cudaStream_t stream);

// Launchers (inst/rows_grouped_*.cu): every group's row blocks [1,BC] of kind
// K in one launch, p.rows = all rows (the scale rows of the table). No RHT.
template <class In, int BC, KernelKind K>
void rows_grouped_launch(const KParams& p, const GroupTable& t, cudaStream_t st);

}  // namespace fp4lab::cuda::qk
