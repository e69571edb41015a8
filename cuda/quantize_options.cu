// TransformerEngine's NVFP4 options on the GPU (quantize_options.hpp).
#include "cuda/quantize_options.hpp"

#include <algorithm>

#include "core/encode.hpp"
#include "core/nvfp4_options.hpp"
#include "cuda/device.hpp"
#include "cuda/quantize_kernels.cuh"
#include "sim/nvfp4_options.hpp"

namespace fp4lab::cuda {

namespace {

using qk::kThreads;
using qk::load1;

struct OptParams {
  int64_t rows, cols, br, bc, nbc, nblocks;
  Nvfp4Options o;
  bool row;  // global_scale row_amax
  Round round;
  Overflow overflow;
  const void* x;
  uint32_t* amax;  // [1 + nblocks + rows]: the tensor's amax bits, each block's, each row's (zeroed first)
  float* mult;     // [nblocks] element multipliers
  float* scale;    // [nblocks] final dequantization scales
  QuantOutputs out;
};

// 1. One thread per block: its amax bits (NaN dominates, as sim's), into the
// tensor's and (row_amax, [1,16] blocks: a block row is a row) the row's.
template <class In>
__global__ void __launch_bounds__(kThreads) options_amax_kernel(const OptParams p) {
  const int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (b >= p.nblocks) return;
  const int64_t bi = b / p.nbc, r0 = bi * p.br, c0 = (b - bi * p.nbc) * p.bc;
  const int64_t r1 = r0 + p.br < p.rows ? r0 + p.br : p.rows, c1 = c0 + p.bc < p.cols ? c0 + p.bc : p.cols;
  uint32_t m = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) m = umax(m, abs_bits(load1<In>(p.x, r * p.cols + c)));
  p.amax[1 + b] = m;
  if (m != 0) {
    atomicMax(p.amax, m);
    if (p.row) atomicMax(p.amax + 1 + p.nblocks + bi, m);
  }
}

// 2. One thread per block: sim's nvfp4_option_block on the block's elements.
template <class In>
__global__ void __launch_bounds__(kThreads) options_scale_kernel(const OptParams p) {
  const int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (b == 0) qk::store_global_decode(p.out, 1.0f);
  if (b >= p.nblocks) return;
  const int64_t bi = b / p.nbc, bj = b - bi * p.nbc;
  const float ga = bits_float(p.row ? p.amax[1 + p.nblocks + bi] : p.amax[0]);
  auto at = [&](int64_t r, int64_t c) { return load1<In>(p.x, r * p.cols + c); };
  const Nvfp4OptionBlock s =
      nvfp4_option_block(p.o, at, p.rows, p.cols, p.br, p.bc, bi, bj, bits_float(p.amax[1 + b]), ga);
  p.mult[b] = s.mult;
  p.scale[b] = s.final_scale;
  if (p.out.scale_codes) p.out.scale_codes[b] = uint8_t(s.code);
  if (p.out.scales) p.out.scales[b] = s.final_scale;
}

// 3. One thread per pair of columns (2k, 2k + 1) of a row: code = encode(x *
// mult) (RN for 4/6; row_amax alone may take another mode but rs), dequant =
// (decode(code) * scale) * 1, as sim's encode_tensor.
template <class In>
__global__ void __launch_bounds__(kThreads) options_element_kernel(const OptParams p) {
  const int64_t pairs = (p.cols + 1) / 2;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= p.rows * pairs) return;
  const int64_t r = t / pairs, c0 = (t - r * pairs) * 2;
  const QuantOutputs& o = p.out;
  constexpr Format e2m1 = float4_e2m1fn;  // a local copy: device code cannot refer to the host global
  uint32_t codes[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const int64_t c = c0 + k;
    if (c >= p.cols) break;
    const int64_t i = r * p.cols + c;
    const int64_t bid = (r / p.br) * p.nbc + c / p.bc;
    const float y = load1<In>(p.x, i) * p.mult[bid];
    const uint32_t code = p.round == Round::rn ? encode_rn_f32<float4_e2m1fn>(y, p.overflow)
                                               : encode(e2m1, y, p.round, p.overflow);
    codes[k] = code;
    const float d = (decode_f32<float4_e2m1fn>(code) * p.scale[bid]) * 1.0f;
    qk::store_element(o, i, code, d, d);
  }
  qk::store_code_pair(o, r, pairs, c0, codes);
}

unsigned blocks_for(int64_t work) {
  return unsigned(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 0x7FFFFFFF));
}

template <class In>
void launch(const OptParams& p, cudaStream_t stream) {
  options_amax_kernel<In><<<blocks_for(p.nblocks), kThreads, 0, stream>>>(p);
  check_launch("options_amax_kernel");
  options_scale_kernel<In><<<blocks_for(p.nblocks), kThreads, 0, stream>>>(p);
  check_launch("options_scale_kernel");
  options_element_kernel<In><<<blocks_for(p.rows * ((p.cols + 1) / 2)), kThreads, 0, stream>>>(p);
  check_launch("options_element_kernel");
}

}  // namespace

void quantize_options_device(const QuantizerSpec& q, const void* x, InputType type, int64_t rows, int64_t cols,
                             const QuantOutputs& out, QuantWorkspace& ws, cudaStream_t stream) {
  const BlockGrid g = block_grid(q, rows, cols);
  OptParams p{};
  p.rows = rows;
  p.cols = cols;
  p.br = g.br;
  p.bc = g.bc;
  p.nbc = g.nbc;
  p.nblocks = g.nbr * g.nbc;
  p.o = nvfp4_options_of(q);
  p.row = q.global_scale == GlobalScale::row_amax;
  p.round = q.round;
  p.overflow = q.overflow;
  p.x = x;
  p.out = out;
  if (rows == 0 || cols == 0) return;
  const size_t words = size_t(1 + p.nblocks + (p.row ? rows : 0));
  ws.amax.at_least(words);
  ws.amax_armed = false;  // this path leaves its amaxes in ws.amax
  check(cudaMemsetAsync(ws.amax.data(), 0, words * sizeof(uint32_t), stream), "cudaMemsetAsync(options amax)");
  ws.mult.at_least(size_t(p.nblocks));
  ws.scale.at_least(size_t(p.nblocks));
  p.amax = ws.amax.data();
  p.mult = ws.mult.data();
  p.scale = ws.scale.data();
  if (type == InputType::bf16)
    launch<uint16_t>(p, stream);
  else
    launch<float>(p, stream);
}

}  // namespace fp4lab::cuda
