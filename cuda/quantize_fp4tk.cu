// fp4-trainkit's quantizers on the GPU (quantize_fp4tk.hpp).
#include "cuda/quantize_fp4tk.hpp"

#include <algorithm>

#include "core/encode.hpp"
#include "core/fp4tk.hpp"
#include "core/philox.hpp"
#include "cuda/device.hpp"
#include "cuda/quantize_kernels.cuh"
#include "sim/block_scales.hpp"

namespace fp4lab::cuda {

namespace {

using qk::kThreads;
using qk::load1;

struct Fp4tkParams {
  int64_t rows, cols, br, bc, nbc, nblocks;
  bool mx, sr;
  Fp4tkMxRule rule;
  uint64_t seed, stream;
  const void* x;
  float* scale;  // [nblocks] the block scales (workspace)
  QuantOutputs out;
};

// 1. One thread per block: amax (NaN dominates), the scale and its code.
template <class In>
__global__ void __launch_bounds__(kThreads) fp4tk_scale_kernel(const Fp4tkParams p) {
  const int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (b == 0) qk::store_global_decode(p.out, 1.0f);
  if (b >= p.nblocks) return;
  const int64_t r0 = (b / p.nbc) * p.br, c0 = (b % p.nbc) * p.bc;
  const int64_t r1 = r0 + p.br < p.rows ? r0 + p.br : p.rows, c1 = c0 + p.bc < p.cols ? c0 + p.bc : p.cols;
  uint32_t m = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const uint32_t a = abs_bits(load1<In>(p.x, r * p.cols + c));
      m = a > m ? a : m;
    }
  const bool nan = m > 0x7F800000u;
  float s;
  uint32_t code;
  if (p.mx) {
    s = fp4tk_mx_scale(bits_float(m), p.rule);
    code = nan ? 0xFFu : float_bits(s) >> 23;
  } else {
    code = nan ? float8_e4m3fn.nan_code() : encode_rn_f32<float8_e4m3fn>(fp4tk_nv_scale_f(bits_float(m)), Overflow::saturate);
    s = nan ? quiet_nan_f() : decode_f32<float8_e4m3fn>(code);
  }
  p.scale[b] = s;
  if (p.out.scale_codes) p.out.scale_codes[b] = uint8_t(code);
  if (p.out.scales) p.out.scales[b] = s;
}

// 2. One thread per pair of columns (2k, 2k + 1) of a row: the elements.
template <class In>
__global__ void __launch_bounds__(kThreads) fp4tk_element_kernel(const Fp4tkParams p) {
  const int64_t pairs = (p.cols + 1) / 2;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= p.rows * pairs) return;
  const int64_t r = t / pairs, c0 = (t - r * pairs) * 2;
  const QuantOutputs& o = p.out;
  uint32_t codes[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const int64_t c = c0 + k;
    if (c >= p.cols) break;
    const int64_t i = r * p.cols + c;
    const float s = p.scale[(r / p.br) * p.nbc + c / p.bc];
    const float noise = p.sr ? fp4tk_noise(random_bits(p.seed, p.stream, uint64_t(i))) : 0.0f;
    const float v = fp4tk_e2m1(load1<In>(p.x, i) / s, p.sr, noise);
    const float d = s * v;
    const uint32_t code = v != v ? 0x7u : encode_rn_f32<float4_e2m1fn>(v, Overflow::saturate);
    codes[k] = code;
    qk::store_element(o, i, code, d, d);
  }
  qk::store_code_pair(o, r, pairs, c0, codes);
}

unsigned blocks_for(int64_t work) {
  return unsigned(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 0x7FFFFFFF));
}

}  // namespace

void quantize_fp4tk_device(const QuantizerSpec& q, const void* x, InputType type, int64_t rows, int64_t cols,
                           RandomStream rs, const QuantOutputs& out, QuantWorkspace& ws, cudaStream_t stream) {
  const BlockGrid g = block_grid(q, rows, cols);
  Fp4tkParams p{};
  p.rows = rows;
  p.cols = cols;
  p.br = g.br;
  p.bc = g.bc;
  p.nbc = g.nbc;
  p.nblocks = g.nbr * g.nbc;
  p.mx = q.scale_rule != ScaleRule::nv_noglobal;
  p.rule = q.scale_rule == ScaleRule::ocp    ? Fp4tkMxRule::ocp
           : q.scale_rule == ScaleRule::ceil ? Fp4tkMxRule::ceil
                                             : Fp4tkMxRule::tetrajet;
  p.sr = q.round == Round::rs;
  p.seed = rs.seed;
  p.stream = rs.stream;
  p.x = x;
  p.out = out;
  if (rows == 0 || cols == 0) return;
  ws.scale.at_least(size_t(p.nblocks));
  p.scale = ws.scale.data();
  const int64_t elem_threads = rows * ((cols + 1) / 2);
  if (type == InputType::bf16) {
    fp4tk_scale_kernel<uint16_t><<<blocks_for(p.nblocks), kThreads, 0, stream>>>(p);
    check_launch("fp4tk_scale_kernel");
    fp4tk_element_kernel<uint16_t><<<blocks_for(elem_threads), kThreads, 0, stream>>>(p);
  } else {
    fp4tk_scale_kernel<float><<<blocks_for(p.nblocks), kThreads, 0, stream>>>(p);
    check_launch("fp4tk_scale_kernel");
    fp4tk_element_kernel<float><<<blocks_for(elem_threads), kThreads, 0, stream>>>(p);
  }
  check_launch("fp4tk_element_kernel");
}

}  // namespace fp4lab::cuda
