// The generic pipeline's kernels on a block rule and run_rule (declared, with its contract, in
// cuda/quantize_rule.cuh). Included only by the units that instantiate run_rule for one rule.
// The same FP4LAB_HD rule code as sim/quantizer.cpp's pipeline (built with --fmad=false): the same bits,
// whatever the thread layout.
#pragma once

#include <algorithm>

#include "core/philox.hpp"
#include "cuda/device.hpp"
#include "cuda/quantize_kernels.cuh"
#include "cuda/quantize_rule.cuh"

namespace fp4lab::cuda::qk {
namespace rule_detail {

// Where the outer amaxes live: ws.amax = [tensor, block 0 .. nblocks-1, row 0 .. nbr-1 (OuterAmax::rows)].
struct Outer {
  OuterAmax kind;
  uint32_t* rows;  // [nbr] (kind rows), else null
  bool drop_nan;   // the block amax leaves NaN out (amax_drops_nan)
};

// The rule's Global of block row bi.
template <class R>
__device__ __forceinline__ typename R::Global global_at(const KParams& p, const typename R::Params& rp, const Outer& o,
                                                        int64_t bi) {
  const uint32_t a = o.kind == OuterAmax::rows ? o.rows[bi] : o.kind == OuterAmax::tensor ? *p.gamax : 0u;
  return R::global(rp, a);
}

// 1. Block amaxes (and the tensor's into *gamax, each block row's into o.rows) for any block shape. The
// tensor's amax is kept per thread over the grid-stride loop and reduced per block into one atomic (an atomic
// per block group on the one word would serialise: 1.2M of them on a [16384, 1152] tensor in [1,16] blocks).
template <class In>
__global__ void __launch_bounds__(kThreads) rule_amax_kernel(const KParams p, const Outer o) {
  const int64_t n = p.rows * p.cols;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  uint32_t tensor_max = 0;
  for (int64_t i0 = int64_t(blockIdx.x) * kThreads; i0 < n; i0 += stride) {  // block-uniform loop
    const int64_t i = i0 + threadIdx.x;
    const bool ok = i < n;
    const int64_t r = ok ? i / p.cols : 0, c = ok ? i - r * p.cols : 0;
    const long long bid = ok ? (long long)((r / p.br) * p.nbc + c / p.bc) : -1;
    const uint32_t a = ok ? amax_bits_of(load1<In>(p.x, i), o.drop_nan) : 0u;
    tensor_max = a > tensor_max ? a : tensor_max;
    const unsigned group = __match_any_sync(0xFFFFFFFFu, bid);
    const uint32_t m = __reduce_max_sync(group, a);
    const int leader = __ffs(group) - 1;
    if (ok && (threadIdx.x & 31) == leader && m != 0) {
      atomicMax(p.block_amax + bid, m);
      if (o.rows) atomicMax(o.rows + r / p.br, m);
    }
  }
  __shared__ uint32_t warp_max[kThreads / 32];
  tensor_max = __reduce_max_sync(0xFFFFFFFFu, tensor_max);
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = tensor_max;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t m = 0;
    for (int w = 0; w < kThreads / 32; ++w) m = warp_max[w] > m ? warp_max[w] : m;
    if (m != 0) atomicMax(p.gamax, m);
  }
}

// The rule's block choice, out of line (compile time: the runtime encoders are large).
template <class R, class X>
__device__ __noinline__ BlockChoice choose_rt(const typename R::Params rp, const typename R::Global g, uint32_t amax,
                                              const X x, const BlockAt at) {
  return R::choose(rp, g, amax, x, at);
}
template <class R>
__device__ __noinline__ Element encode_rt(const typename R::Params rp, const BlockChoice c, float x, uint32_t rbits) {
  return R::encode(rp, c, x, rbits);
}

// Reads element (r, c) of the input: a rule's view of its block.
template <class In>
struct InputAt {
  const void* x;
  int64_t cols;
  __device__ float operator()(int64_t r, int64_t c) const { return load1<In>(x, r * cols + c); }
};

// 2. One thread per block: its choice (the rule may read the block through InputAt).
template <class In, class R>
__global__ void __launch_bounds__(kThreads)
    rule_scale_kernel(const KParams p, const typename R::Params rp, const Outer o, int64_t nblocks) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i == 0) store_global_decode(p.out, R::g_dec(global_at<R>(p, rp, o, 0)));
  if (i >= nblocks) return;
  const int64_t bi = i / p.nbc, bj = i - bi * p.nbc;
  const BlockChoice b = choose_rt<R>(rp, global_at<R>(p, rp, o, bi), p.block_amax[i], InputAt<In>{p.x, p.cols},
                                     BlockAt{p.rows, p.cols, p.br, p.bc, bi, bj, p.seed, p.stream});
  p.block_mult[i] = b.mult;
  p.block_scale[i] = b.scale;
  if (p.out.scale_codes) p.out.scale_codes[i] = uint8_t(b.code);
  if (p.out.scales) p.out.scales[i] = b.scale;
}

// 3. Elements: one thread per pair of columns (c = 2k, 2k + 1) of a row.
// SR: per_element one Philox call an element (random_bits of its index);
// ptx_x4 one for both (an even c0 and c0 + 1 share their group's word: G is
// 4, or 2 for 16-bit targets), the values its sr_element_bits (sr_word_bits with
// KParams::sr's lsb and width, quantize_encode.cuh).
template <class In, class R>
__global__ void __launch_bounds__(kThreads)
    rule_element_kernel(const KParams p, const typename R::Params rp, const Outer o) {
  const int64_t pairs = (p.cols + 1) / 2;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= p.rows * pairs) return;
  const int64_t r = t / pairs, c0 = (t - r * pairs) * 2;
  const float gd = R::g_dec(global_at<R>(p, rp, o, r / p.br));
  const QuantOutputs& out = p.out;
  const bool sr = p.round == Round::rs, x4 = sr && p.sr.bits != SrBits::per_element;
  const uint32_t word =
      x4 ? random_bits(p.seed, p.stream, uint64_t(r) * uint64_t(p.sr.words_per_row) + uint64_t(c0 / p.sr.group)) : 0u;
  uint32_t codes[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const int64_t c = c0 + k;
    if (c >= p.cols) break;
    const int64_t i = r * p.cols + c;
    const int64_t bid = (r / p.br) * p.nbc + c / p.bc;
    const uint32_t rbits = !sr  ? 0u
                           : x4 ? sr_word_bits(word, p.sr.lsb_step * int(c % p.sr.group), p.sr.width)
                                : random_bits(p.seed, p.stream, uint64_t(i));
    BlockChoice b;
    b.scale = p.block_scale[bid];
    b.mult = p.block_mult[bid];
    const Element e = encode_rt<R>(rp, b, load1<In>(p.x, i), rbits);
    codes[k] = e.code;
    const float d = e.value * b.scale;  // dequant_value without g_dec: the BF16 GEMM operand
    store_element(out, i, e.code, d * gd, out.bf16_gemm_operand ? d : d * gd);
  }
  store_code_pair(out, r, pairs, c0, codes);
}

inline unsigned grid_of(int64_t work) {
  return unsigned(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 0x7FFFFFFF));
}

template <class In, class R>
void launch_rule(const KParams& p, const typename R::Params& rp, const Outer& o, int64_t nblocks, bool amax_pass,
                 cudaStream_t stream) {
  if (amax_pass) {
    rule_amax_kernel<In><<<grid_of(p.rows * p.cols), kThreads, 0, stream>>>(p, o);
    check_launch("rule_amax_kernel");
  }
  rule_scale_kernel<In, R><<<grid_of(nblocks), kThreads, 0, stream>>>(p, rp, o, nblocks);
  check_launch("rule_scale_kernel");
  rule_element_kernel<In, R><<<grid_of(p.rows * ((p.cols + 1) / 2)), kThreads, 0, stream>>>(p, rp, o);
  check_launch("rule_element_kernel");
}

}  // namespace rule_detail

template <class R>
void run_rule(KParams& p, const typename R::Params& rp, const BlockGrid& grid, InputType type, QuantWorkspace& ws,
              cudaStream_t stream) {
  using namespace rule_detail;
  const int64_t nblocks = grid.nbr * grid.nbc;
  const OuterAmax outer = R::outer(rp);
  const size_t words = size_t(1 + nblocks + (outer == OuterAmax::rows ? grid.nbr : 0));
  ws.amax.at_least(words);
  ws.mult.at_least(size_t(nblocks));
  ws.scale.at_least(size_t(nblocks));
  p.gamax = ws.amax.data();
  p.block_amax = ws.amax.data() + 1;
  p.block_mult = ws.mult.data();
  p.block_scale = ws.scale.data();
  const Outer o{outer, outer == OuterAmax::rows ? ws.amax.data() + 1 + nblocks : nullptr, amax_drops_nan<R>(rp)};
  ws.amax_armed = false;  // this path leaves its amaxes there
  check(cudaMemsetAsync(ws.amax.data(), 0, words * sizeof(uint32_t), stream), "cudaMemsetAsync(rule amax)");
  const bool one_block = nblocks == 1 && !o.drop_nan;
  if (one_block) {
    // One block ([0,0], or a block larger than the tensor): the tensor amax kernel (per-warp atomics on one
    // word would serialise; it lets NaN dominate, so a rule that drops NaN takes the block kernel); it is
    // also the block's and its row's.
    tensor_amax_device(p.x, type, p.rows * p.cols, ws.amax.data(), stream);
    for (size_t w = 1; w < words; ++w)
      check(cudaMemcpyAsync(ws.amax.data() + w, ws.amax.data(), sizeof(uint32_t), cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync(rule amax)");
  }
  if (type == InputType::bf16)
    launch_rule<uint16_t, R>(p, rp, o, nblocks, !one_block, stream);
  else
    launch_rule<float, R>(p, rp, o, nblocks, !one_block, stream);
}

}  // namespace fp4lab::cuda::qk
