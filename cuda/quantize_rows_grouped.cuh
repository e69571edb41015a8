// The grouped row-block kernel ([1,16] and [1,32] blocks, no RHT) and its
// launcher, private to cuda/: every group of a grouped tensor in one launch,
// one thread per block, each thread working on its group's narrowed KParams
// (quantize_grouped.cuh) with the dense row kernels' row_block. Only the
// instantiation files inst/rows_grouped_*.cu include this header.
//
// Forms: the fast rn / SR forms of the dense row kernels where they apply
// (fast_rn_applies, fast_rs_applies with per_element random bits, the _bf16
// value forms where the one output is the BF16 GEMM operand), one block per
// thread and never FULL (a group's rows start anywhere, so the checked loads
// and stores); every other mode through the form of every mode.
#pragma once

#include "cuda/quantize_grouped.cuh"
#include "cuda/quantize_rows.cuh"

namespace fp4lab::cuda::qk {
namespace rows_grouped_detail {

template <class In, int BC, KernelKind K, Fast FM>
__global__ void __launch_bounds__(kThreads, rows_detail::row_min_blocks<In, BC, FM, 1>())
    grouped_row_kernel(const KParams p, const GroupTable t) {
  const int64_t unit = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (unit >= p.rows * p.nbc) return;
  const int64_t row = unit / p.nbc, blk = unit - row * p.nbc;
  const int g = group_of(t, row);
  const KParams q = group_params<In>(p, t, g);
  const int64_t r = row - __ldg(t.roff + g);  // the row within the group
  const int64_t c0 = blk * BC;
  const int valid = int(q.cols - c0 < BC ? q.cols - c0 : BC);
  float v[BC];
  load_n<In, BC>(q.x, r * q.cols + c0, valid, v);
  const Format f = kind_elem<K>(q), sf = kind_scale<K>(q);
  const NvGlobal gl = nv_global_of(q, f, sf);
  if (r == 0 && blk == 0) store_global_decode(q.out, gl.g_dec);
  rows_detail::row_block<BC, K, false, FM>(q, f, sf, gl, r, blk, v, valid);
}

template <class In, int BC, KernelKind K, Fast FM>
void go(const KParams& p, const GroupTable& t, cudaStream_t st) {
  const int64_t blocks = (p.rows * p.nbc + kThreads - 1) / kThreads;
  if (blocks > 0) grouped_row_kernel<In, BC, K, FM><<<unsigned(blocks), kThreads, 0, st>>>(p, t);
  check_launch("grouped_row_kernel");
}

}  // namespace rows_grouped_detail

template <class In, int BC, KernelKind K>
void rows_grouped_launch(const KParams& p, const GroupTable& t, cudaStream_t st) {
  using namespace rows_grouped_detail;
  if constexpr (K != KernelKind::runtime) {
    const bool values = bf16_operand_only(p);
    if (fast_rn_applies(K, p)) {
      if (values) return go<In, BC, K, Fast::rn_bf16>(p, t, st);
      return go<In, BC, K, Fast::rn>(p, t, st);
    }
    if (fast_rs_applies(K, p) && p.sr.bits == SrBits::per_element) {
      if constexpr (e2m1_kind(K) && BC == 16)
        if (values) return go<In, BC, K, Fast::rs_bf16>(p, t, st);
      return go<In, BC, K, Fast::rs>(p, t, st);
    }
  }
  go<In, BC, K, Fast::none>(p, t, st);
}

}  // namespace fp4lab::cuda::qk
