// Mixture-of-experts routing on the GPU (the CUDA backend's Backend::moe_route
// and the calls after it): train/route.cpp's route() and router_logit_grad()
// bit for bit on the same logits. One thread a token runs the host's per-token
// loop verbatim in float64 (exp_f64 / log_f64, train/math_f64.hpp); the
// counts are an integer histogram; the grouping is a stable radix sort of the
// slots by expert (each expert's slots in slot order, i.e. tokens in order,
// as the host's loop); the auxiliary losses' sums run in the host's blocks
// (kRouteSumBlock). Compiled with --fmad=false (fp4lab_cuda_numerics). Device
// pointers; slot (t, j) at t * k + j; everything on `stream`, nothing waits.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace fp4lab::cuda::nn {

// One batch's routing in device memory: pieces of one block (route_layout).
struct RouteDevice {
  int64_t tokens = 0, experts = 0, k = 0;
  int64_t capacity = 0;       // rows an expert under capacity dispatch (expert_capacity); 0: dropless
  int64_t rows = 0;           // the grouped tensor's: tokens * k, or experts * capacity
  double* probs = nullptr;    // [tokens, experts] softmax
  double* lse = nullptr;      // [tokens]
  int32_t* expert = nullptr;  // [tokens * k] chosen experts (the sort's keys in slot order)
  float* gate = nullptr;      // [tokens * k]
  int32_t* pos = nullptr;     // [tokens * k] row of each slot in the grouped tensor (-1: dropped)
  int32_t* token = nullptr;   // [rows] token of each grouped row (-1: a row of zeros)
  int64_t* first = nullptr;   // [experts] capacity dispatch: each expert's first slot in the sorted order
  float* dgate = nullptr;     // [tokens * k] the gates' gradient (combine_rows_backward's dw)
  // [experts + 3] 8-byte words: the counts n_e (int64), then aux_loss and
  // z_loss (double bits), then the dropped slots (int64): what the host
  // downloads after route() (route_summary_bytes).
  int64_t* summary = nullptr;
  double* daux = nullptr;  // [experts] the load-balancing loss's d/dp
  double* psum = nullptr;  // [blocks, experts] P_e's block sums, then [experts] P_e
  double* zsum = nullptr;  // [blocks] the z sum's block sums
  int32_t *keys_out = nullptr, *slots_in = nullptr, *slots_out = nullptr;  // [tokens * k] the sort's
  void* sort_temp = nullptr;
  size_t sort_bytes = 0;
};

// Bytes of the block route_layout carves (any 256-byte aligned base).
// capacity: expert_capacity (train/route.hpp), 0 for dropless.
size_t route_bytes(int64_t tokens, int64_t experts, int64_t k, int64_t capacity);
RouteDevice route_layout(void* base, int64_t tokens, int64_t experts, int64_t k, int64_t capacity);
inline size_t route_summary_bytes(int64_t experts) { return size_t(experts + 3) * 8; }

// route() of logits [tokens, experts] into d (every array but dgate), with the
// summary words written last: route_local, route_group, route_losses (one
// process: the counts are the global counts). Coefficients: RouteParams's.
void route(const float* logits, const RouteDevice& d, bool normalize_top_k, double aux_loss, double z_loss,
           cudaStream_t stream = nullptr);
// train/route.hpp's split: per token (probs, lse, expert, gate), the counts
// into summary[0, E) and the block sums into psum / zsum.
void route_local(const float* logits, const RouteDevice& d, bool normalize_top_k, cudaStream_t stream = nullptr);
// The grouping (pos, token; capacity: the dropped count) on the counts in
// summary[0, E), which are the global counts in one process.
void route_group(const RouteDevice& d, cudaStream_t stream = nullptr);
// aux and z into the summary from the block sums and counts, on global_tokens.
void route_losses(const RouteDevice& d, double aux_loss, double z_loss, int64_t global_tokens,
                  cudaStream_t stream = nullptr);
// dlogits [tokens, experts] = router_logit_grad(routing d, d.dgate, loss_scale): f_e on the counts in
// summary[0, E) over global_tokens k, the 1/N over grad_tokens.
void router_grad(const RouteDevice& d, bool normalize_top_k, double aux_loss, double z_loss, float loss_scale,
                 int64_t global_tokens, int64_t grad_tokens, float* dlogits, cudaStream_t stream = nullptr);

}  // namespace fp4lab::cuda::nn
