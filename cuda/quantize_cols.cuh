// The column-block kernels ([16,1] and [32,1] blocks) and their launchers,
// private to cuda/: one thread per strip of BR rows x V consecutive columns
// (V blocks; each row of the strip one 8/16-byte load, coalesced across the
// warp), optional RHT down each column (sim's rht16_forward), amax, scales,
// codes and outputs in one pass. Only the instantiation files
// (cuda/inst/cols*.cu) include this header; the dispatch sees
// quantize_launch.cuh's declarations alone, so that each kernel is compiled
// in exactly one translation unit.
#pragma once

#include "cuda/device.hpp"
#include "cuda/quantize_kernels.cuh"
#include "cuda/quantize_launch.cuh"

namespace fp4lab::cuda::qk {
namespace cols_detail {

// The split form (col_kernel's SPLIT) of a strip kernel, and the rows of a
// strip each thread holds.
FP4LAB_HD constexpr bool split_form(int br, bool rht, Fast fm) {
  return br == 32 && !rht && (fm == Fast::rn_bf16 || fm == Fast::rs_bf16 || fm == Fast::rs_bf16_x4);
}
FP4LAB_HD constexpr int rows_a_thread(int br, bool split) { return split ? br / 2 : br; }

// FM: the fast form (quantize_kernels.cuh, Fast) of the quantizer's mode, whose
// kernel holds no other mode's code. FULL (with a fast form, V == 4, or a
// value form, V == 2; cols_full_apply()): every strip whole, bases 16-byte
// aligned, fewer than 2^31 elements: the strip of a thread by FastDivU31, no
// per-row bounds checks, each row's codes (values) one store (the checks are
// otherwise several integer and branch instructions per element).
// SPLIT (the FULL [32,1] value forms; go_fast()): two threads a strip,
// lanes l and l + 16 of a warp, each loading and encoding 16 of its 32 rows,
// the two halves' amaxes combined by a shuffle: half the registers a thread.
// One strip of col_kernel (and of the grouped column kernel,
// quantize_cols_grouped.cuh): thread t's strip (i, jg) of p (ok: the strip
// exists; half: SPLIT's half of it). AMAX_ONLY: returns the strip's amax bits
// (of its RHT output with RHT; 0 past the end), which the caller commits;
// else encodes and stores the strip and returns 0.
template <class In, int BR, int V, KernelKind K, bool RHT, bool AMAX_ONLY, Fast FM, bool FULL, bool SPLIT>
__device__ __forceinline__ uint32_t col_strip(const KParams& p, int64_t t, int64_t i, int64_t jg, bool ok, int half) {
  static_assert(!FULL || (FM != Fast::none && !AMAX_ONLY && (V == 4 || value_form(FM))));
  static_assert(!SPLIT || (FULL && split_form(BR, RHT, FM)));
  constexpr int RT = rows_a_thread(BR, SPLIT);
  const int64_t r0 = i * BR + half * RT, c0 = jg * V;
  const int valid_c = FULL ? V : ok ? int(p.cols - c0 < V ? p.cols - c0 : V) : 0;
  if (FULL && !SPLIT && !ok) return 0;
  float v[RT][V];
  const int rows_valid = int(p.rows - r0 < RT ? p.rows - r0 : RT);
  if constexpr (RHT) {
    static_assert(BR == 16);
    if (FULL || rows_valid == 16) {  // the signs folded into the loads
      uint32_t flip[16];
      rht_sign_flips(p.signs, flip);
      load_rows<In, BR, V, true>(p.x, r0 * p.cols + c0, p.cols, rows_valid, valid_c, v, flip);
      rht_columns<V, true>(v, p.signs);
    } else {  // a partial last chunk stays untransformed (sim/rht.hpp)
      load_rows<In, BR, V>(p.x, r0 * p.cols + c0, p.cols, rows_valid, valid_c, v);
    }
  } else {
    load_rows<In, RT, V>(p.x, r0 * p.cols + c0, p.cols, rows_valid, valid_c, v);
  }
  uint32_t amax[V];
#pragma unroll
  for (int cc = 0; cc < V; ++cc) {
    AmaxBits m;
#pragma unroll
    for (int rr = 0; rr < RT; ++rr) m.add(v[rr][cc]);
    amax[cc] = m.bits();
    if constexpr (SPLIT) amax[cc] = umax(amax[cc], __shfl_xor_sync(0xFFFFFFFFu, amax[cc], 16));
  }
  if constexpr (AMAX_ONLY) {
    uint32_t m = 0;
#pragma unroll
    for (int cc = 0; cc < V; ++cc) m = umax(m, amax[cc]);
    return m;
  } else {
    if (!ok) return 0;
    const Format f = kind_elem<K>(p), sf = kind_scale<K>(p);
    const NvGlobal g = nv_global_of(p, f, sf);
    if (t == 0) store_global_decode(p.out, g.g_dec);
    BlockParams bp[V];
    uint32_t sc[V];
#pragma unroll
    for (int cc = 0; cc < V; ++cc) {
      bp[cc] = block_params<K>(p, f, sf, amax[cc], g);
      sc[cc] = bp[cc].code;
    }
    const int64_t si = i * p.nbc + c0;  // nbc == cols
    if (half == 0) {                    // SPLIT: the strip's first half stores its scales
      if (p.out.scale_codes) store_bytes<V>(p.out.scale_codes + si, sc, valid_c);
      if (p.out.scales) {
        float s[V];
#pragma unroll
        for (int cc = 0; cc < V; ++cc) s[cc] = bp[cc].scale;
        store_f32<V>(p.out.scales + si, s, valid_c);
      }
    }
    if (p.round == Round::rs) {
      // Rolled over rows (code size: one Philox group per row), each row read
      // back from shared memory ([element][thread], conflict-free; launched
      // with stage_bytes): a run-time indexed register copy would live in
      // local memory, which spills out of L1 at this occupancy.
      extern __shared__ float col_stage[];
#pragma unroll
      for (int rr = 0; rr < RT; ++rr)
#pragma unroll
        for (int cc = 0; cc < V; ++cc) col_stage[(rr * V + cc) * kThreads + threadIdx.x] = v[rr][cc];
#pragma unroll 1
      for (int rr = 0; rr < RT; ++rr) {
        float row[V];
#pragma unroll
        for (int cc = 0; cc < V; ++cc) row[cc] = col_stage[(rr * V + cc) * kThreads + threadIdx.x];
        if (FULL || r0 + rr < p.rows) encode_and_store<K, V, V, FM, FULL>(p, f, g, r0 + rr, c0, row, bp, valid_c);
      }
    } else if constexpr (FULL && FM == Fast::rn) {
      // Every row's codes, then each output over the whole strip
      // (store_strip_full). Where no block holds a NaN product (rn_fast_block),
      // e2m1_rn_bytes4: 8 instructions an element instead of encode_rn's 12.
      uint32_t words[BR];
      bool fast = true;
      float mult[V];
#pragma unroll
      for (int cc = 0; cc < V; ++cc) {
        fast = fast && rn_fast_block(amax[cc], bp[cc].mult);
        mult[cc] = bp[cc].mult;
      }
      if (fast) {
#pragma unroll
        for (int rr = 0; rr < BR; ++rr) words[rr] = e2m1_rn_bytes4(v[rr], mult);
      } else {
#pragma unroll
        for (int rr = 0; rr < BR; ++rr) {
          uint32_t code[V];
#pragma unroll
          for (int cc = 0; cc < V; ++cc) code[cc] = encode_rn<K>(f, v[rr][cc] * mult[cc], p.overflow);
          words[rr] = pack_codes4<false>(code);
        }
      }
      store_strip_full<K, BR>(p, f, g, r0, c0, words, bp);
    } else {
#pragma unroll
      for (int rr = 0; rr < RT; ++rr) {
        if (FULL || r0 + rr < p.rows) encode_and_store<K, V, V, FM, FULL>(p, f, g, r0 + rr, c0, v[rr], bp, valid_c);
      }
    }
  }
  return 0;
}

template <class In, int BR, int V, KernelKind K, bool RHT, bool AMAX_ONLY, Fast FM = Fast::none, bool FULL = false,
          bool SPLIT = false>
__global__ void __launch_bounds__(kThreads, 2) col_kernel(const KParams p) {
  int64_t t, i, jg;
  bool ok;
  int half = 0;
  if constexpr (SPLIT) {
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t u = ((blockIdx.x * kThreads + threadIdx.x) >> 5) * 16u + (lane & 15u);
    half = int(lane >> 4);
    ok = u < p.units;
    const uint32_t in = ok ? u : 0u;  // both lanes of a strip stay for the shuffle; nothing is stored
    const uint32_t strip = p.unit_div.div(in);
    t = u, i = strip, jg = in - strip * uint32_t(p.cols / V);
  } else if constexpr (FULL) {
    const uint32_t u = blockIdx.x * kThreads + threadIdx.x;
    ok = u < p.units;
    const uint32_t strip = p.unit_div.div(u);
    t = u, i = strip, jg = u - strip * uint32_t(p.cols / V);
  } else {
    t = int64_t(amax_pass_block<AMAX_ONLY>()) * kThreads + threadIdx.x;
    const int64_t ngroups = (p.cols + V - 1) / V, nbr = (p.rows + BR - 1) / BR;
    ok = strip_of(t, nbr, ngroups, i, jg);
  }
  if (FULL && !SPLIT && !ok) return;
  const uint32_t m = col_strip<In, BR, V, K, RHT, AMAX_ONLY, FM, FULL, SPLIT>(p, t, i, jg, ok, half);
  if constexpr (AMAX_ONLY) {
    amax_block_commit(m, p.gamax);
    amax_pass_done(p.fin, p.gamax);
  }
}

template <class In, int BR, int V, KernelKind K, bool RHT, bool AMAX, Fast FM = Fast::none, bool FULL = false,
          bool SPLIT = false>
void go(const KParams& p, cudaStream_t st) {
  const int64_t strips = ((p.rows + BR - 1) / BR) * ((p.cols + V - 1) / V);
  const int64_t threads = SPLIT ? (strips + 15) / 16 * 32 : strips;  // SPLIT: 16 strips a warp
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  // Stochastic rounding stages a thread's rows in shared memory (col_kernel).
  constexpr size_t stage_bytes = size_t(rows_a_thread(BR, SPLIT)) * V * kThreads * sizeof(float);  // 64 / 32 KB
  const bool stage = !AMAX && p.round == Round::rs;
  auto* kernel = col_kernel<In, BR, V, K, RHT, AMAX, FM, FULL, SPLIT>;
  if (stage)
    allow_dynamic_smem<col_kernel<In, BR, V, K, RHT, AMAX, FM, FULL, SPLIT>>(stage_bytes,
                                                                             "col_kernel (stage shared memory)");
  if (blocks > 0)
    kernel<<<unsigned(blocks), kThreads, stage ? stage_bytes : 0, st>>>(FULL ? full_params(p, strips, p.cols / V) : p);
  check_launch("col_kernel");
}

// May the fast form of a BR x V strip kernel take its FULL form?
inline bool cols_full_apply(const KParams& p, int br, int v) {
  return p.rows % br == 0 && p.cols % v == 0 && index32_fits(p) && bases_aligned16(p);
}

// Where go_kind's choice of form goes: DenseCols runs col_kernel on p (go),
// with the FULL and SPLIT forms where they apply (kFull); the grouped
// launcher (quantize_cols_grouped.cuh) runs the checked forms only.
struct DenseCols {
  static constexpr bool kFull = true;
  template <class In, int BR, int V, KernelKind K, bool RHT, Fast FM, bool FULL, bool SPLIT>
  void run(const KParams& p, cudaStream_t st) const {
    go<In, BR, V, K, RHT, false, FM, FULL, SPLIT>(p, st);
  }
};

// FULL where it applies: 4-column strips in every fast form, 2-column strips
// (the [32,1] MX kernels) in the value forms (the trainer's wgrad operands,
// where the checked form's bookkeeping dominates the kernel).
template <class In, int BR, int V, KernelKind K, bool RHT, Fast FM, class L>
void go_fast(const KParams& p, const L& l, cudaStream_t st) {
  if constexpr (L::kFull) {
    if constexpr (split_form(BR, RHT, FM)) {
      if (cols_full_apply(p, BR, V)) return l.template run<In, BR, V, K, RHT, FM, true, true>(p, st);
    } else if constexpr (V == 4 || value_form(FM)) {
      if (cols_full_apply(p, BR, V)) return l.template run<In, BR, V, K, RHT, FM, true, false>(p, st);
    }
  }
  l.template run<In, BR, V, K, RHT, FM, false, false>(p, st);
}

// SR form FM (per_element's) in p's random-bit contract (sr_form: FM or its
// _x4 twin).
template <class In, int BR, int V, KernelKind K, bool RHT, Fast FM, class L>
void go_sr(const KParams& p, const L& l, cudaStream_t st) {
  if (p.sr.bits == SrBits::ptx_x4) return go_fast<In, BR, V, K, RHT, sr_form(FM, SrBits::ptx_x4)>(p, l, st);
  go_fast<In, BR, V, K, RHT, FM>(p, l, st);
}

// Kind K's kernel in the fast form its mode allows (rs: 4-column strips only,
// whole Philox groups per row, or whole ptx_x4 words); the value forms
// (Fast::rn_bf16 / rs_bf16) where the one output is the BF16 GEMM operand
// (the trainer's wgrad operands; rs_bf16 for E2M1 only, also in 2-column
// strips: cols % 4 == 0 puts each strip's row in one Philox group, ptx_x4 in
// one word).
template <class In, int BR, int V, KernelKind K, bool RHT, class L>
void go_kind(const KParams& p, const L& l, cudaStream_t st) {
  constexpr bool e2m1 = e2m1_kind(K);
  const bool values = bf16_operand_only(p);
  if constexpr (K == KernelKind::nvfp4) {
    if (values && p.rule == ScaleRule::nv_noglobal) {  // which the other fast forms exclude
      if (p.round == Round::rn) return go_fast<In, BR, V, K, RHT, Fast::rn_bf16_div>(p, l, st);
      if (p.round == Round::rs && sr_runs_aligned(p)) return go_sr<In, BR, V, K, RHT, Fast::rs_bf16_div>(p, l, st);
    }
  }
  if (fast_rn_applies(K, p)) {
    if (values) return go_fast<In, BR, V, K, RHT, Fast::rn_bf16>(p, l, st);
    return go_fast<In, BR, V, K, RHT, Fast::rn>(p, l, st);
  }
  if (fast_rs_applies(K, p)) {
    if constexpr (e2m1)
      if (values) return go_sr<In, BR, V, K, RHT, Fast::rs_bf16>(p, l, st);
    if constexpr (V == 4) return go_sr<In, BR, V, K, RHT, Fast::rs>(p, l, st);
  }
  l.template run<In, BR, V, K, RHT, Fast::none, false, false>(p, st);
}

}  // namespace cols_detail

template <class In, int BR, KernelKind K, bool RHT>
void cols_launch(const KParams& p, cudaStream_t st) {
  using namespace cols_detail;
  constexpr int V = BR == 16 ? 4 : 2;
  if constexpr (K == KernelKind::runtime)
    go<In, BR, V, KernelKind::runtime, RHT, false>(p, st);
  else
    go_kind<In, BR, V, K, RHT>(p, DenseCols{}, st);
}

template <class In>
void cols_amax_launch(const KParams& p, cudaStream_t st) {
  cols_detail::go<In, 16, 4, KernelKind::runtime, true, true>(p, st);
}

}  // namespace fp4lab::cuda::qk
