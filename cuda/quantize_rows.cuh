// The row-block kernels ([1,16] and [1,32] blocks) and their launchers,
// private to cuda/: one thread per block (16/32 consecutive elements of a
// row, 16-byte loads; two [1,16] blocks per thread for BF16 input in the fast
// forms), optional RHT of the block (sim's rht16_forward), amax, scale, codes
// and outputs in one pass. Only the instantiation files (cuda/inst/rows*.cu)
// include this header; the dispatch sees quantize_launch.cuh's declarations
// alone, so that each kernel is compiled in exactly one translation unit.
#pragma once

#include "cuda/device.hpp"
#include "cuda/quantize_kernels.cuh"
#include "cuda/quantize_launch.cuh"

namespace fp4lab::cuda::qk {
namespace rows_detail {

// Everything after the load for one block (row r, block blk, columns c0 ..
// c0 + valid - 1, values v; the thread's formats and NvGlobal): (RHT,) amax,
// block parameters, codes, outputs. FULL: see row_kernel.
template <int BC, KernelKind K, bool RHT, Fast FM, bool FULL = false>
__device__ __forceinline__ void row_block(const KParams& p, const Format& f, const Format& sf, const NvGlobal& g,
                                          int64_t r, int64_t blk, float (&v)[BC], int valid) {
  if constexpr (RHT) {
    static_assert(BC == 16);
    if (FULL || valid == BC) rht16_forward(v, p.signs);  // a partial last chunk stays untransformed (sim/rht.hpp)
  }
  const int64_t c0 = blk * BC;
  const uint32_t amax = amax_bits(v);
  BlockParams bp[1] = {block_params<K>(p, f, sf, amax, g)};
  const int64_t si = r * p.nbc + blk;
  if (p.out.scale_codes) p.out.scale_codes[si] = uint8_t(bp[0].code);
  if (p.out.scales) p.out.scales[si] = bp[0].scale;
  if constexpr (FM == Fast::rn) {
    encode_store_rn<K, BC, FULL>(p, f, g, r, c0, v, bp, valid, amax);
  } else if constexpr (code_form_sr(FM)) {
    encode_store_rs_fast<K, BC, FULL, x4_form(FM)>(p, f, g, r, c0, v, bp, valid, amax);
  } else if constexpr (value_form(FM)) {
    encode_and_store<K, BC, 1, FM, FULL>(p, f, g, r, c0, v, bp, valid);
  } else {
    encode_and_store<K, BC, 1>(p, f, g, r, c0, v, bp, valid);
  }
}

// Minimum resident blocks per SM (register cap): 4 for the fast rn kernel of
// 16 elements per thread, 2 for 32 float32 elements or 32 SR elements (whose
// registers spill under a cap of 3), else 3.
template <class In, int BC, Fast FM, int BPT>
constexpr int row_min_blocks() {
  if ((FM == Fast::rn || FM == Fast::rn_bf16 || FM == Fast::rn_bf16_div) && BC * BPT == 16) return 4;
  return BC == 32 && (sizeof(In) == 4 || code_form_sr(FM)) ? 2 : 3;
}

// One thread per BPT consecutive blocks of a row (BPT > 1: more bytes in
// flight per thread where one block is only 32 bytes of BF16).
// FM: the fast form (Fast) of a quantizer that fast_rn_applies() or
// fast_rs_applies() to (every kind but runtime), Fast::none for every other.
// FULL (with a fast form; full_spans_apply()): every thread's BPT blocks are whole
// and its loads and stores 16-byte aligned, and the tensor has fewer than 2^31
// elements: 32-bit index arithmetic, the row of a thread by FastDivU31, no
// bounds or alignment checks. The per-thread and per-block bookkeeping is a
// large part of these kernels' instructions from BF16.
template <class In, int BC, KernelKind K, bool RHT, bool AMAX_ONLY, Fast FM = Fast::none, int BPT = 1, bool FULL = false>
__global__ void __launch_bounds__(kThreads, row_min_blocks<In, BC, FM, BPT>()) row_kernel(const KParams p) {
  if constexpr (FULL) {
    static_assert(FM != Fast::none && !AMAX_ONLY);
    const uint32_t t = blockIdx.x * kThreads + threadIdx.x;
    if (t >= p.units) return;
    const uint32_t r = p.unit_div.div(t), u = t - r * uint32_t(p.nbc / BPT);
    const uint32_t c0 = u * (BPT * BC);
    float v[BPT * BC];
    load_n<In, BPT * BC, true>(p.x, r * uint32_t(p.cols) + c0, BPT * BC, v);
    const Format f = kind_elem<K>(p), sf = kind_scale<K>(p);
    const NvGlobal g = nv_global_of(p, f, sf);
    if (t == 0) store_global_decode(p.out, g.g_dec);
#pragma unroll
    for (int b = 0; b < BPT; ++b) {
      float vb[BC];
#pragma unroll
      for (int j = 0; j < BC; ++j) vb[j] = v[b * BC + j];
      row_block<BC, K, RHT, FM, true>(p, f, sf, g, r, u * BPT + b, vb, BC);
    }
    return;
  }
  const int64_t t = int64_t(amax_pass_block<AMAX_ONLY>()) * kThreads + threadIdx.x;
  const int64_t nunit = (p.nbc + BPT - 1) / BPT;  // threads per row
  const bool ok = t < p.rows * nunit;
  int64_t r = 0, u = 0;
  if (ok) {
    if (p.rows * nunit < (int64_t(1) << 32)) {  // 32-bit division where it suffices
      r = uint32_t(t) / uint32_t(nunit);
    } else {
      r = t / nunit;
    }
    u = t - r * nunit;
  }
  const int64_t c0 = u * BPT * BC;
  const int valid = ok ? int(p.cols - c0 < BPT * BC ? p.cols - c0 : BPT * BC) : 0;
  float v[BPT * BC];
  load_n<In, BPT * BC>(p.x, r * p.cols + c0, valid, v);
  if constexpr (AMAX_ONLY) {
    static_assert(BPT == 1);
    if constexpr (RHT)
      if (valid == 16) rht16_forward(v, p.signs);  // the elements past `valid` are zeros
    amax_block_commit(amax_bits(v), p.gamax);
    amax_pass_done(p.fin, p.gamax);
  } else {
    if (!ok) return;
    const Format f = kind_elem<K>(p), sf = kind_scale<K>(p);
    const NvGlobal g = nv_global_of(p, f, sf);
    if (t == 0) store_global_decode(p.out, g.g_dec);
#pragma unroll
    for (int b = 0; b < BPT; ++b) {
      if (b * BC >= valid) break;
      float vb[BC];
#pragma unroll
      for (int j = 0; j < BC; ++j) vb[j] = v[b * BC + j];
      row_block<BC, K, RHT, FM>(p, f, sf, g, r, u * BPT + b, vb, valid - b * BC < BC ? valid - b * BC : BC);
    }
  }
}

template <class In, int BC, KernelKind K, bool RHT, bool AMAX, Fast FM = Fast::none, int BPT = 1, bool FULL = false>
void go(const KParams& p, cudaStream_t st) {
  const int64_t threads = p.rows * ((p.nbc + BPT - 1) / BPT);
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  if (blocks > 0) row_kernel<In, BC, K, RHT, AMAX, FM, BPT, FULL><<<unsigned(blocks), kThreads, 0, st>>>(p);
  check_launch("row_kernel");
}

// Kind K's FM form, FULL where full_spans_apply() to BPT blocks per thread.
template <class In, int BC, KernelKind K, bool RHT, Fast FM, int BPT>
void go_fast(const KParams& p, cudaStream_t st) {
  if (full_spans_apply(p, BPT * BC))
    return go<In, BC, K, RHT, false, FM, BPT, true>(full_params(p, p.rows * (p.nbc / BPT), p.nbc / BPT), st);
  go<In, BC, K, RHT, false, FM, BPT>(p, st);
}

// SR form FM (per_element's) in p's random-bit contract (sr_form: FM or its
// _x4 twin).
template <class In, int BC, KernelKind K, bool RHT, Fast FM, int BPT>
void go_sr(const KParams& p, cudaStream_t st) {
  if (p.sr.bits == SrBits::ptx_x4) return go_fast<In, BC, K, RHT, sr_form(FM, SrBits::ptx_x4), BPT>(p, st);
  go_fast<In, BC, K, RHT, FM, BPT>(p, st);
}

// Kind K's kernel: its rn form (two 16-element blocks per thread from BF16)
// or SR form where the quantizer allows, else the form of every mode.
template <class In, int BC, KernelKind K, bool RHT>
void go_kind(const KParams& p, cudaStream_t st) {
  constexpr int bpt = BC == 16 && sizeof(In) == 2 ? 2 : 1;
  // The value forms where the one output is the BF16 GEMM operand (rs_bf16: E2M1 only;
  // the _div forms: nv_noglobal, which the other fast forms exclude).
  constexpr bool e2m1 = e2m1_kind(K);
  const bool values = bf16_operand_only(p);
  if constexpr (K == KernelKind::nvfp4) {
    if (values && p.rule == ScaleRule::nv_noglobal) {
      if (p.round == Round::rn) return go_fast<In, BC, K, RHT, Fast::rn_bf16_div, bpt>(p, st);
      if constexpr (BC == 16)
        if (p.round == Round::rs && sr_runs_aligned(p)) return go_sr<In, BC, K, RHT, Fast::rs_bf16_div, 1>(p, st);
    }
  }
  if (fast_rn_applies(K, p)) {
    if (values) return go_fast<In, BC, K, RHT, Fast::rn_bf16, bpt>(p, st);
    return go_fast<In, BC, K, RHT, Fast::rn, bpt>(p, st);
  }
  if (fast_rs_applies(K, p)) {
    if constexpr (e2m1 && BC == 16)
      if (values) return go_sr<In, BC, K, RHT, Fast::rs_bf16, 1>(p, st);
    return go_sr<In, BC, K, RHT, Fast::rs, 1>(p, st);
  }
  go<In, BC, K, RHT, false>(p, st);
}

}  // namespace rows_detail

template <class In, int BC, KernelKind K, bool RHT>
void rows_launch(const KParams& p, cudaStream_t st) {
  using namespace rows_detail;
  if constexpr (K == KernelKind::runtime)
    go<In, BC, KernelKind::runtime, RHT, false>(p, st);
  else
    go_kind<In, BC, K, RHT>(p, st);
}

template <class In>
void rows_amax_launch(const KParams& p, cudaStream_t st) {
  rows_detail::go<In, 16, KernelKind::runtime, true, true>(p, st);  // only RHT needs its own amax pass
}

}  // namespace fp4lab::cuda::qk
