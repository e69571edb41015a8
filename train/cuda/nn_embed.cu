// The embedding kernels of train/cuda/nn.hpp (GPT's token + position lookup
// and its grouped backward, the ViT's token assembly), split from nn.cu by
// role: the ops at the model's input. Each mirrors the CPU backend's loop
// (train/cpu/backend.cpp) operation for operation.
#include <cstdint>

#include "core/error.hpp"
#include "train/cuda/nn.hpp"
#include "train/cuda/nn_device.cuh"

namespace fp4lab::cuda::nn {

using namespace detail;

namespace {

__global__ void embed_fwd_kernel(const int32_t* idx, int64_t n, int64_t seq, const float* wte, const float* wpe,
                                 int64_t C, float* out) {
  const int64_t total = n * C;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / C, c = e % C;
    out[e] = wte[int64_t(idx[i]) * C + c] + wpe[(i % seq) * C + c];
  }
}
// Block (g, column tile): one thread per column of group g's row.
__global__ void embed_bwd_kernel(const int32_t* rows, const int32_t* offsets, const int32_t* positions,
                                 const float* dout, int64_t C, float* dwte) {
  const int64_t g = blockIdx.x;
  const int64_t c = blockIdx.y * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float* e = dwte + int64_t(rows[g]) * C + c;
  float acc = *e;
  for (int32_t k = offsets[g]; k < offsets[g + 1]; ++k) acc += dout[int64_t(positions[k]) * C + c];
  *e = acc;
}

__global__ void vit_tokens_kernel(const float* patches, int64_t batch, int64_t P, int64_t C, const float* cls,
                                  const float* pos, float* out) {
  const int64_t L = P + 1, total = batch * L * C;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / C, c = e % C, b = r / L, t = r % L;
    const float src = t == 0 ? cls[c] : patches[(b * P + t - 1) * C + c];
    out[e] = src + pos[t * C + c];
  }
}

}  // namespace

void embed_forward(const int32_t* idx, int64_t batch, int64_t seq, const float* wte, const float* wpe, int64_t C,
                   float* out, cudaStream_t st) {
  const int64_t n = batch * seq;
  if (n <= 0 || C <= 0) return;
  embed_fwd_kernel<<<blocks_for(n * C), kThreads, 0, st>>>(idx, n, seq, wte, wpe, C, out);
  check_launch("embed_fwd_kernel");
}

void embed_backward_grouped(const int32_t* rows, const int32_t* offsets, const int32_t* positions, int64_t ngroups,
                            const float* dout, int64_t C, float* dwte_acc, cudaStream_t st) {
  if (ngroups <= 0 || C <= 0) return;
  const int64_t ct = (C + kThreads - 1) / kThreads;
  if (ct > 65535 || ngroups > (int64_t(1) << 31) - 1) throw Error("embed_backward: tensor too large");
  embed_bwd_kernel<<<dim3(unsigned(ngroups), unsigned(ct)), kThreads, 0, st>>>(rows, offsets, positions, dout, C,
                                                                               dwte_acc);
  check_launch("embed_bwd_kernel");
}

void vit_tokens_forward(const float* patches, int64_t batch, int64_t P, int64_t C, const float* cls, const float* pos,
                        float* out, cudaStream_t st) {
  const int64_t total = batch * (P + 1) * C;
  if (total <= 0) return;
  vit_tokens_kernel<<<blocks_for(total), kThreads, 0, st>>>(patches, batch, P, C, cls, pos, out);
  check_launch("vit_tokens_kernel");
}

}  // namespace fp4lab::cuda::nn
