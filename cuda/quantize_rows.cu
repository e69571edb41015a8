// Fused quantization of row blocks [1,16] and [1,32]: one thread per block
// (16/32 consecutive elements of a row, 16-byte loads), optional RHT of the
// block (sim's rht16_forward), amax, scale, codes and outputs in one pass.
#include "cuda/quantize_kernels.cuh"

#include "cuda/device.hpp"

namespace fp4lab::cuda::qk {
namespace {

// FAST_RN: the kernel of a quantizer that fast_rn_applies() to (rn, kinds 1-4),
// so that none of the other modes' code (SR's Philox, the generic encoder)
// raises its register count: it runs at higher occupancy.
template <class In, int BC, int K, bool RHT, bool AMAX_ONLY, bool FAST_RN = false>
__global__ void __launch_bounds__(kThreads, FAST_RN && BC == 16 ? 4 : (BC == 32 && sizeof(In) == 4) ? 2 : 3)
    row_kernel(const KParams p) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t nblk = p.nbc;
  const bool ok = t < p.rows * nblk;
  int64_t r = 0, blk = 0;
  if (ok) {
    if (p.rows * nblk < (int64_t(1) << 32)) {  // 32-bit division where it suffices
      r = uint32_t(t) / uint32_t(nblk);
    } else {
      r = t / nblk;
    }
    blk = t - r * nblk;
  }
  const int64_t c0 = blk * BC;
  const int valid = ok ? int(p.cols - c0 < BC ? p.cols - c0 : BC) : 0;
  float v[BC];
  load_n<In, BC>(p.x, r * p.cols + c0, valid, v);
  if constexpr (RHT) {
    static_assert(BC == 16);
    rht16_forward(v, p.signs);  // cols % 16 == 0 (checked on the host): whole chunks
  }
  const uint32_t amax = amax_bits(v);
  if constexpr (AMAX_ONLY) {
    amax_warp_commit(amax, p.gamax);
    amax_pass_done(p.fin, p.gamax);
    return;
  } else {
    if (!ok) return;
    const Format f = kind_elem<K>(p), sf = kind_scale<K>(p);
    const NvGlobal g = nv_global_of(p, f, sf);
    if (t == 0 && p.out.global_decode) *p.out.global_decode = g.g_dec;
    BlockParams bp[1] = {block_params<K>(p, f, sf, amax, g)};
    const int64_t si = r * nblk + blk;
    if (p.out.scale_codes) p.out.scale_codes[si] = uint8_t(bp[0].code);
    if (p.out.scales) p.out.scales[si] = bp[0].scale;
    if constexpr (FAST_RN) {
      if (rn_fast_block(amax, bp[0].mult)) return encode_store_rn_fast<K, BC>(p, f, g, r, c0, v, bp, valid);
      // A block with NaN or Inf (or a non-finite multiplier): core's encode_rn_f32 per element.
      uint32_t code[BC];
#pragma unroll
      for (int j = 0; j < BC; ++j) code[j] = encode_rn<K>(f, v[j] * bp[0].mult, p.overflow);
      store_outputs<K, BC, 1>(p, f, g, r, c0, code, bp, valid, true);
    } else {
      encode_and_store<K, BC, 1>(p, f, g, r, c0, v, bp, valid);
    }
  }
}

template <class In, int BC, int K, bool RHT, bool AMAX, bool FAST_RN = false>
void go(const KParams& p, cudaStream_t st) {
  const int64_t threads = p.rows * p.nbc;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  if (blocks > 0) row_kernel<In, BC, K, RHT, AMAX, FAST_RN><<<unsigned(blocks), kThreads, 0, st>>>(p);
  check_launch("row_kernel");
}
// Kind K's kernel, its FAST_RN form where the quantizer allows.
template <class In, int BC, int K, bool RHT>
void go_kind(const KParams& p, cudaStream_t st) {
  if (fast_rn_applies(K, p)) return go<In, BC, K, RHT, false, true>(p, st);
  go<In, BC, K, RHT, false>(p, st);
}

template <class In>
void dispatch(const KParams& p, int bc, bool rht, int kind, bool amax_only, cudaStream_t st) {
  if (amax_only) return go<In, 16, 0, true, true>(p, st);  // only RHT needs its own amax pass
  if (bc == 16) {
    if (rht) {
      if (kind == 1) return go_kind<In, 16, 1, true>(p, st);
      return go<In, 16, 0, true, false>(p, st);
    }
    if (kind == 1) return go_kind<In, 16, 1, false>(p, st);
    if (kind == 2) return go_kind<In, 16, 2, false>(p, st);
    return go<In, 16, 0, false, false>(p, st);
  }
  switch (kind) {
    case 1: return go_kind<In, 32, 1, false>(p, st);
    case 2: return go_kind<In, 32, 2, false>(p, st);
    case 3: return go_kind<In, 32, 3, false>(p, st);
    case 4: return go_kind<In, 32, 4, false>(p, st);
    default: return go<In, 32, 0, false, false>(p, st);
  }
}

}  // namespace

void launch_rows(const KParams& p, int bc, bool rht, int kind, InputType in, bool amax_only, cudaStream_t st) {
  if (in == InputType::bf16)
    dispatch<uint16_t>(p, bc, rht, kind, amax_only, st);
  else
    dispatch<float>(p, bc, rht, kind, amax_only, st);
}

}  // namespace fp4lab::cuda::qk
