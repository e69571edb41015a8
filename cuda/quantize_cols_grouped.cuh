// The grouped column-block kernel ([16,1] and [32,1] blocks, with or without
// the RHT down each group's 16-row chunks) and its launchers, private to
// cuda/: every group of a grouped tensor in one launch. Each block belongs to
// one group (GroupTable::boff: a group's blocks are consecutive, the last one
// partly idle), so the RHT amax pass commits a block's amax to its group's
// word; each thread works on its group's narrowed KParams (group_params) with
// the dense kernel's own strip code (cols_detail::col_strip) and the dense
// launcher's choice of fast form (go_kind) in its checked, non-FULL forms: a
// group's rows start anywhere, and its chunks and strips start at its first
// row, so the result is quantize_device's on each group's slice. Only the
// instantiation files inst/cols_grouped_*.cu include this header.
#pragma once

#include "cuda/quantize_cols.cuh"
#include "cuda/quantize_grouped.cuh"

namespace fp4lab::cuda::qk {
namespace cols_grouped_detail {

template <class In, int BR, int V, KernelKind K, bool RHT, bool AMAX_ONLY, Fast FM>
__global__ void __launch_bounds__(kThreads, 2)
    grouped_col_kernel(const KParams p, const GroupTable t, const AmaxFinish fin) {
  const int g = group_at(t.boff, t.groups, int64_t(blockIdx.x));  // block-uniform
  const KParams q = group_params<In>(p, t, g);
  const int64_t lt = (int64_t(blockIdx.x) - __ldg(t.boff + g)) * kThreads + threadIdx.x;  // the thread in its group
  const int64_t ngroups = (q.cols + V - 1) / V, nbr = (q.rows + BR - 1) / BR;
  int64_t i, jg;
  const bool ok = strip_of(lt, nbr, ngroups, i, jg);
  const uint32_t m = cols_detail::col_strip<In, BR, V, K, RHT, AMAX_ONLY, FM, false, false>(q, lt, i, jg, ok, 0);
  if constexpr (AMAX_ONLY) {
    amax_block_commit(m, q.gamax);
    grouped_amax_done(t, fin);
  }
}

// go_kind's target for the grouped kernel: the checked forms, `blocks` blocks.
struct GroupedCols {
  static constexpr bool kFull = false;
  GroupTable t;
  int64_t blocks = 0;
  template <class In, int BR, int V, KernelKind K, bool RHT, Fast FM, bool FULL, bool SPLIT>
  void run(const KParams& p, cudaStream_t st) const {
    static_assert(!FULL && !SPLIT);
    // Stochastic rounding stages a thread's rows in shared memory (col_strip), as col_kernel.
    constexpr size_t stage_bytes = size_t(BR) * V * kThreads * sizeof(float);
    const bool stage = p.round == Round::rs;
    if (stage)
      allow_dynamic_smem<grouped_col_kernel<In, BR, V, K, RHT, false, FM>>(stage_bytes,
                                                                           "grouped_col_kernel (stage shared memory)");
    if (blocks > 0)
      grouped_col_kernel<In, BR, V, K, RHT, false, FM>
          <<<unsigned(blocks), kThreads, stage ? stage_bytes : 0, st>>>(p, t, AmaxFinish{});
    check_launch("grouped_col_kernel");
  }
};

}  // namespace cols_grouped_detail

template <class In, int BR, KernelKind K, bool RHT>
void cols_grouped_launch(const KParams& p, const GroupTable& t, int64_t blocks, cudaStream_t st) {
  using namespace cols_grouped_detail;
  constexpr int V = BR == 16 ? 4 : 2;
  const GroupedCols l{t, blocks};
  if constexpr (K == KernelKind::runtime)
    l.run<In, BR, V, KernelKind::runtime, RHT, Fast::none, false, false>(p, st);
  else
    cols_detail::go_kind<In, BR, V, K, RHT>(p, l, st);
}

template <class In>
void cols_grouped_amax_launch(const KParams& p, const GroupTable& t, const AmaxFinish& fin, int64_t blocks,
                              cudaStream_t st) {
  using namespace cols_grouped_detail;
  if (blocks > 0)
    grouped_col_kernel<In, 16, 4, KernelKind::runtime, true, true, Fast::none>
        <<<unsigned(blocks), kThreads, 0, st>>>(p, t, fin);
  check_launch("grouped_col_kernel (RHT amax)");
}

}  // namespace fp4lab::cuda::qk
