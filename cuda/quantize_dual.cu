// Two NVFP4 quantizations of one tensor in one pass (quantize.hpp,
// quantize_dual_device): row blocks [1,16] (pr) and column blocks [16,1] (pc,
// optionally after the RHT down each column), the two operands the trainer
// makes of x (forward, wgrad) and of dy (dgrad, wgrad). One thread per strip
// of 16 rows x 4 consecutive columns, as quantize_cols.cu; a row block's 16
// columns are the strips of 4 adjacent lanes (cols % 16 == 0, so lane % 4 ==
// strip column % 4), whose amaxes meet through two shuffles. Every numeric step
// is the single-quantizer kernels' (quantize_kernels.cuh), so each output is
// bit-identical to quantize_device's for the same spec.
#include "cuda/quantize_kernels.cuh"

#include <algorithm>

#include "cuda/device.hpp"

namespace fp4lab::cuda::qk {
namespace {

// The encodes are rolled over the 16 rows (one Philox group per row with SR):
// unrolled, two operands' code overflows the instruction cache. The
// rolled loop reads its row from shared memory, laid out [row][thread] so that
// a warp's accesses are contiguous: a run-time indexed register array would
// live in local memory, which at this occupancy spills out of L1.
constexpr size_t kStageBytes = 16 * kThreads * (sizeof(float4) + 2 * sizeof(float));  // 96 KB

struct Stage {
  float4* v;     // [16][kThreads]: 4 columns of each row
  float* mult;   // [16][kThreads]: the row blocks' element multipliers
  float* scale;  // [16][kThreads]: and decoded scales
};

__device__ __forceinline__ Stage stage_of() {
  extern __shared__ float4 dual_stage[];
  float* m = reinterpret_cast<float*>(dual_stage + 16 * kThreads);
  return Stage{dual_stage, m, m + 16 * kThreads};
}

__device__ __forceinline__ void stage_rows(const Stage& s, const float (&v)[16][4]) {
#pragma unroll
  for (int rr = 0; rr < 16; ++rr)
    s.v[rr * kThreads + threadIdx.x] = make_float4(v[rr][0], v[rr][1], v[rr][2], v[rr][3]);
}
__device__ __forceinline__ void unstage_row(const Stage& s, int rr, float (&r)[4]) {
  const float4 u = s.v[rr * kThreads + threadIdx.x];
  r[0] = u.x, r[1] = u.y, r[2] = u.z, r[3] = u.w;
}

// FM: Fast::rn or Fast::rs (rs_x4: ptx_x4) when both quantizers round that
// way (SR: in one random-bit contract) and every base pointer is 16-byte
// aligned (only that mode's code is compiled, its stores unchecked:
// encode_and_store's FULL), their _bf16 forms when both outputs are only BF16
// GEMM operands, else Fast::none.
template <class In, bool RHT, Fast FM = Fast::none>
__global__ void __launch_bounds__(kThreads, 2) dual_kernel(const KParams pr, const KParams pc) {
  constexpr KernelKind K = KernelKind::nvfp4;  // e2m1 elements, ue4m3 scales (checked on the host)
  // The row loops below: 4 rows an iteration with SR (four independent Philox
  // chains in flight), 1 otherwise (rn gains nothing from more).
  constexpr int kRowUnroll = code_form_sr(FM) || value_form_sr(FM) ? 4 : 1;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t ngroups = pr.cols / 4, nstrips = pr.rows / 16;  // both multiples of 16 (host)
  int64_t i, jg;
  const bool ok = strip_of(t, nstrips, ngroups, i, jg);
  const int64_t r0 = i * 16, c0 = jg * 4;
  float v[16][4];
  load_rows<In, 16, 4>(pr.x, r0 * pr.cols + c0, pr.cols, ok ? 16 : 0, 4, v);

  // Row blocks: the amax of each of the 16 rows over this lane's 4 columns and
  // its 3 neighbours' (every lane takes part, in range or not).
  uint32_t ramax[16];
#pragma unroll
  for (int rr = 0; rr < 16; ++rr) {
    uint32_t m = 0;
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) m = umax(m, abs_bits(v[rr][cc]));
    m = umax(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
    ramax[rr] = umax(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
  }
  // The 4 lanes of a row block (lane % 4 == jg % 4: ngroups % 4 == 0) share
  // its parameters: lane q computes those of rows 4k + q (k < 4) and writes
  // their scales; every lane then takes each row's multiplier and scale from
  // its owner by a shuffle (all lanes, in range or not).
  const Format f = kind_elem<K>(pr), sf = kind_scale<K>(pr);
  const NvGlobal gr = nv_global_of(pr, f, sf), gc = nv_global_of(pc, f, sf);
  const int q = threadIdx.x & 3;
  BlockParams own[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t m = q == 0 ? ramax[4 * k] : q == 1 ? ramax[4 * k + 1] : q == 2 ? ramax[4 * k + 2] : ramax[4 * k + 3];
    own[k] = block_params<K>(pr, f, sf, m, gr);
    if (ok) {
      const int64_t si = (r0 + 4 * k + q) * pr.nbc + c0 / 16;
      if (pr.out.scale_codes) pr.out.scale_codes[si] = uint8_t(own[k].code);
      if (pr.out.scales) pr.out.scales[si] = own[k].scale;
    }
  }
  const Stage stage = stage_of();
  const int group = threadIdx.x & ~3;
#pragma unroll
  for (int rr = 0; rr < 16; ++rr) {
    const int src = (group | (rr & 3)) & 31;
    stage.mult[rr * kThreads + threadIdx.x] = __shfl_sync(0xFFFFFFFFu, own[rr >> 2].mult, src);
    stage.scale[rr * kThreads + threadIdx.x] = __shfl_sync(0xFFFFFFFFu, own[rr >> 2].scale, src);
  }
  if (!ok) return;
  if (t == 0) {
    store_global_decode(pr.out, gr.g_dec);
    store_global_decode(pc.out, gc.g_dec);
  }

  // pr: row r0 + rr, columns c0..c0+3, block (r0 + rr, c0 / 16).
  stage_rows(stage, v);
#pragma unroll kRowUnroll
  for (int rr = 0; rr < 16; ++rr) {
    float row[4];
    unstage_row(stage, rr, row);
    const int at = rr * kThreads + threadIdx.x;
    const BlockParams b[1] = {BlockParams{0u, stage.scale[at], stage.mult[at]}};
    encode_and_store<K, 4, 1, FM, FM != Fast::none>(pr, f, gr, r0 + rr, c0, row, b, 4);
  }
  // v is dead across that loop: back from the stage.
#pragma unroll
  for (int rr = 0; rr < 16; ++rr) unstage_row(stage, rr, v[rr]);

  // pc: the RHT down each column (whole 16-row chunks), then blocks (r0 / 16, c0 + cc).
  if constexpr (RHT) rht_columns(v, pc.signs);
  BlockParams bpc[4];
  uint32_t sc[4];
#pragma unroll
  for (int cc = 0; cc < 4; ++cc) {
    uint32_t m = 0;
#pragma unroll
    for (int rr = 0; rr < 16; ++rr) m = umax(m, abs_bits(v[rr][cc]));
    bpc[cc] = block_params<K>(pc, f, sf, m, gc);
    sc[cc] = bpc[cc].code;
  }
  const int64_t si = i * pc.nbc + c0;  // nbc == cols
  if (pc.out.scale_codes) store_bytes<4>(pc.out.scale_codes + si, sc, 4);
  if (pc.out.scales) {
    float s[4];
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) s[cc] = bpc[cc].scale;
    store_f32<4>(pc.out.scales + si, s, 4);
  }
  stage_rows(stage, v);  // this thread's own slots: no synchronisation
#pragma unroll kRowUnroll
  for (int rr = 0; rr < 16; ++rr) {
    float row[4];
    unstage_row(stage, rr, row);
    encode_and_store<K, 4, 4, FM, FM != Fast::none>(pc, f, gc, r0 + rr, c0, row, bpc, 4);
  }
}

template <class In, bool RHT, Fast FM = Fast::none>
void go(const KParams& pr, const KParams& pc, cudaStream_t st) {
  const int64_t threads = (pr.rows / 16) * (pr.cols / 4);
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  allow_dynamic_smem<dual_kernel<In, RHT, FM>>(kStageBytes, "dual_kernel (96 KB shared memory)");
  if (blocks > 0) dual_kernel<In, RHT, FM><<<unsigned(blocks), kThreads, kStageBytes, st>>>(pr, pc);
  check_launch("dual_kernel");
}

// The two tensor amaxes ahead of the quantization pass: pr's of x into
// *pr.gamax, pc's (of the RHT output with RHT) into *pc.gamax, finished by
// pr.fin / pc.fin (amax_pass_done). One thread per strip of 16 rows x V
// columns (V = 4 / sizeof(In): one 4-byte load per row, a warp reading 128
// contiguous bytes of it), the grid persistent over the strips: the next
// strip's loads are in flight while this one is reduced (one strip a thread
// at once leaves the SMs waiting on L2 first and issuing after). The strips go
// from the tensor's end to its start, so that the quantization pass that
// follows finds its first bytes in L2. The amaxes are strip_amaxes' (amax_device.cuh: the RHT's
// final quarter applied once, to this thread's largest |t|).
template <class In, bool RHT>
__global__ void __launch_bounds__(kThreads, 4) dual_amax_kernel(const KParams pr, const KParams pc) {
  constexpr int V = 4 / int(sizeof(In));
  const int64_t nstrips = pr.rows / 16, ngroups = pr.cols / V, units = nstrips * ngroups;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  // A strip is 16 words, one per row: an f32 element or two BF16 ones.
  // BF16 words at a base that is not 4-byte aligned: two 2-byte loads each.
  const bool halves = V == 2 && (reinterpret_cast<uintptr_t>(pr.x) & 3u) != 0;
  auto load = [&](int64_t k, uint32_t(&w)[16]) {
    int64_t i, jg;
    strip_of(units - 1 - k, nstrips, ngroups, i, jg);
    const In* s = static_cast<const In*>(pr.x) + i * 16 * pr.cols + jg * V;
    if (halves) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(s);
#pragma unroll
      for (int rr = 0; rr < 16; ++rr)
        w[rr] = uint32_t(__ldg(h + rr * pr.cols)) | uint32_t(__ldg(h + rr * pr.cols + 1)) << 16;
    } else {
#pragma unroll
      for (int rr = 0; rr < 16; ++rr) w[rr] = __ldg(reinterpret_cast<const unsigned int*>(s + rr * pr.cols));
    }
  };
  uint32_t mr = 0, mt = 0;
  auto reduce = [&](const uint32_t(&w)[16]) {
    float v[16][V];
#pragma unroll
    for (int rr = 0; rr < 16; ++rr) {
      if constexpr (V == 1) {
        v[rr][0] = bits_float(w[rr]);
      } else {
        v[rr][0] = bits_float(w[rr] << 16);
        v[rr][1] = bits_float(w[rr] & 0xFFFF0000u);
      }
    }
    strip_amaxes<V, RHT>(v, pc.signs, mr, mt);
  };
  uint32_t a[16], b[16];
  int64_t k = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (k < units) load(k, a);
  for (; k < units; k += 2 * stride) {
    if (k + stride < units) load(k + stride, b);
    reduce(a);
    if (k + 2 * stride < units) load(k + 2 * stride, a);
    if (k + stride < units) reduce(b);
  }
  const uint32_t mc = RHT ? rht_quarter(mt) : mr;
  amax_block_commit(mr, pr.gamax, mc, pc.gamax);
  amax_pass_done(pr.fin, pr.gamax, pc.fin, pc.gamax);  // re-arms both words
}

template <class In, bool RHT>
void go_amax(const KParams& pr, const KParams& pc, cudaStream_t st) {
  static const int64_t resident = std::max<int64_t>(resident_blocks(dual_amax_kernel<In, RHT>), 1);
  const int64_t units = (pr.rows / 16) * (pr.cols / (4 / int64_t(sizeof(In))));
  const int64_t blocks = std::min((units + kThreads - 1) / kThreads, resident);
  if (blocks > 0) dual_amax_kernel<In, RHT><<<unsigned(blocks), kThreads, 0, st>>>(pr, pc);
  check_launch("dual_amax_kernel");
}

// The quantization pass in the fast form both quantizers allow (rows of 4
// elements: every span is aligned given aligned bases, cols % 16 == 0; fewer
// than 2^31 elements, index32_fits).
template <class In, bool RHT>
void go_fast(const KParams& pr, const KParams& pc, cudaStream_t st) {
  if (!bases_aligned16(pr) || !bases_aligned16(pc) || !index32_fits(pr)) return go<In, RHT>(pr, pc, st);
  const bool operands = bf16_operand_only(pr) && bf16_operand_only(pc);
  if (fast_rn_applies(KernelKind::nvfp4, pr) && fast_rn_applies(KernelKind::nvfp4, pc)) {
    if (operands) return go<In, RHT, Fast::rn_bf16>(pr, pc, st);
    return go<In, RHT, Fast::rn>(pr, pc, st);
  }
  // SR: one contract for both (the kernel's form draws that contract's words);
  // mixed contracts take the form of every mode, which reads each one's.
  if (fast_rs_applies(KernelKind::nvfp4, pr) && fast_rs_applies(KernelKind::nvfp4, pc) && pr.sr.bits == pc.sr.bits) {
    if (pr.sr.bits == SrBits::ptx_x4) {
      if (operands) return go<In, RHT, Fast::rs_bf16_x4>(pr, pc, st);
      return go<In, RHT, Fast::rs_x4>(pr, pc, st);
    }
    if (operands) return go<In, RHT, Fast::rs_bf16>(pr, pc, st);
    return go<In, RHT, Fast::rs>(pr, pc, st);
  }
  go<In, RHT>(pr, pc, st);
}

template <class In>
void dispatch(const KParams& pr, const KParams& pc, bool rht, bool amax_only, cudaStream_t st) {
  if (rht) return amax_only ? go_amax<In, true>(pr, pc, st) : go_fast<In, true>(pr, pc, st);
  return amax_only ? go_amax<In, false>(pr, pc, st) : go_fast<In, false>(pr, pc, st);
}

}  // namespace

void launch_dual(const KParams& pr, const KParams& pc, bool rht, InputType in, bool amax_only, cudaStream_t st) {
  if (in == InputType::bf16)
    dispatch<uint16_t>(pr, pc, rht, amax_only, st);
  else
    dispatch<float>(pr, pc, rht, amax_only, st);
}

}  // namespace fp4lab::cuda::qk
