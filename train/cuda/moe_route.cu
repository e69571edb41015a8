// Mixture-of-experts routing on the GPU (moe_route.hpp): train/route.cpp's
// loops, each kernel's arithmetic in the host's order.
#include "train/cuda/moe_route.hpp"

#include <cmath>
#include <string>

#include <cub/device/device_radix_sort.cuh>

#include "core/error.hpp"
#include "cuda/device.hpp"
#include "train/cuda/nn_device.cuh"
#include "train/math_f64.hpp"
#include "train/route.hpp"

namespace fp4lab::cuda::nn {

namespace {

using detail::blocks_for;
using detail::kThreads;
using train::exp_f64;
using train::kRouteSumBlock;
using train::log_f64;

int64_t sum_blocks(int64_t tokens) { return (tokens + kRouteSumBlock - 1) / kRouteSumBlock; }

// The sort's key bits: experts 0..E-1 (one bit at least).
int key_bits(int64_t experts) {
  int b = 1;
  while ((int64_t(1) << b) < experts) ++b;
  return b;
}

size_t sort_temp_bytes(int64_t slots, int64_t experts) {
  size_t bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                        static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                        static_cast<int32_t*>(nullptr), int(slots), 0, key_bits(experts)),
        "moe route (radix sort temp size)");
  return bytes;
}

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// route(): per token, the host's loop verbatim (std::max as (mx < v) ? v : mx;
// strict > so the lower index wins ties); each slot's count by an integer
// atomic (exact, order-free) and its index as the sort's value.
__global__ void route_kernel(const float* __restrict__ logits, int64_t N, int64_t E, int64_t k, bool normalize,
                             double* __restrict__ probs, double* __restrict__ lse, int32_t* __restrict__ expert,
                             float* __restrict__ gate, int32_t* __restrict__ slots,
                             unsigned long long* __restrict__ count) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < N; t += int64_t(gridDim.x) * blockDim.x) {
    const float* l = logits + t * E;
    double* p = probs + t * E;
    double mx = -INFINITY;
    for (int64_t e = 0; e < E; ++e) {
      const double v = double(l[e]);
      mx = (mx < v) ? v : mx;
    }
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = exp_f64(double(l[e]) - mx));
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    lse[t] = mx + log_f64(sum);
    int32_t* chosen = expert + t * k;
    double sel = 0;
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || chosen[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = int32_t(e);
      }
      chosen[j] = best;
      sel += p[best];
    }
    for (int64_t j = 0; j < k; ++j) {
      const double pj = p[chosen[j]];
      gate[t * k + j] = float(normalize ? pj / sel : pj);
      slots[t * k + j] = int32_t(t * k + j);
      atomicAdd(count + chosen[j], 1ull);
    }
  }
}

// Row r of the grouped tensor holds slot sorted[r] (by expert, slots in order within one).
__global__ void place_kernel(const int32_t* __restrict__ sorted, int64_t M, int64_t k, int32_t* __restrict__ token,
                             int32_t* __restrict__ pos) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < M; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = sorted[r];
    token[r] = int32_t(s / k);
    pos[s] = int32_t(r);
  }
}

// Capacity dispatch: each expert's first slot in the sorted order (exclusive
// prefix sums of the counts, in expert order; one thread: E is small).
__global__ void first_slots_kernel(const int64_t* __restrict__ count, int64_t E, int64_t* __restrict__ first) {
  int64_t at = 0;
  for (int64_t e = 0; e < E; ++e) first[e] = at, at += count[e];
}

// Capacity dispatch: sorted row r holds slot s of expert e (the sort's key) at
// rank r - first[e] among e's slots (slot order); it is kept at row
// e * capacity + rank when the rank is below the capacity, else dropped
// (pos -1, counted by an integer atomic: exact, order-free). route()'s loop.
__global__ void place_capacity_kernel(const int32_t* __restrict__ sorted, const int32_t* __restrict__ keys,
                                      const int64_t* __restrict__ first, int64_t M, int64_t k, int64_t capacity,
                                      int32_t* __restrict__ token, int32_t* __restrict__ pos,
                                      unsigned long long* __restrict__ dropped) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < M; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = sorted[r], e = keys[r], rank = r - first[e];
    if (rank < capacity) {
      token[e * capacity + rank] = int32_t(s / k);
      pos[s] = int32_t(e * capacity + rank);
    } else {
      pos[s] = -1;
      atomicAdd(dropped, 1ull);
    }
  }
}

// Block b's sums (tokens [b B, min(N, (b + 1) B)) in order from 0): of
// probs[., e] into psum[b, e], and of lse^2 into zsum[b]. One CUDA block a
// sum block: its threads load tiles of whole token rows of probs (and lse)
// into shared memory with coalesced reads, then thread e % blockDim adds its
// columns' tile values in token order, so each sum is the serial loop over t,
// bit for bit; thread 0 adds the lse squares after its columns.
constexpr int kSumThreads = 256;
constexpr int64_t kSumTile = 2048;  // doubles of probs a tile holds at least
constexpr int kSumOwned = int((train::kMaxRouteExperts + kSumThreads - 1) / kSumThreads);  // columns a thread owns

__host__ __device__ int64_t sum_tile_tokens(int64_t E) {
  const int64_t t = kSumTile / E;
  return t < 1 ? 1 : (t > kRouteSumBlock ? kRouteSumBlock : t);
}
size_t sum_tile_bytes(int64_t E) { return size_t(sum_tile_tokens(E) * (E + 1)) * sizeof(double); }

__global__ void __launch_bounds__(kSumThreads)
    block_sums_kernel(const double* __restrict__ probs, const double* __restrict__ lse, int64_t N, int64_t E,
                      int64_t nb, double* __restrict__ psum, double* __restrict__ zsum) {
  extern __shared__ double tile[];  // [T][E] probs rows, then [T] lse
  const int64_t T = sum_tile_tokens(E);
  double* tl = tile + T * E;
  for (int64_t b = blockIdx.x; b < nb; b += gridDim.x) {
    const int64_t t0 = b * kRouteSumBlock, t1 = t0 + kRouteSumBlock < N ? t0 + kRouteSumBlock : N;
    double acc[kSumOwned];
#pragma unroll
    for (int m = 0; m < kSumOwned; ++m) acc[m] = 0;
    double z = 0;
    for (int64_t ta = t0; ta < t1; ta += T) {
      const int64_t nt = t1 - ta < T ? t1 - ta : T;
      __syncthreads();  // the previous tile is consumed
      for (int64_t i = threadIdx.x; i < nt * E; i += kSumThreads) tile[i] = probs[ta * E + i];
      for (int64_t i = threadIdx.x; i < nt; i += kSumThreads) tl[i] = lse[ta + i];
      __syncthreads();
#pragma unroll
      for (int m = 0; m < kSumOwned; ++m) {
        const int64_t e = threadIdx.x + int64_t(m) * kSumThreads;
        if (e < E)
          for (int64_t t = 0; t < nt; ++t) acc[m] += tile[t * E + e];
      }
      if (threadIdx.x == 0)
        for (int64_t t = 0; t < nt; ++t) z += tl[t] * tl[t];
    }
#pragma unroll
    for (int m = 0; m < kSumOwned; ++m) {
      const int64_t e = threadIdx.x + int64_t(m) * kSumThreads;
      if (e < E) psum[b * E + e] = acc[m];
    }
    if (threadIdx.x == 0) zsum[b] = z;
  }
}

// P_e = the block sums in block order (into psum[nb, e]); then one thread:
// the z sum, aux = sum_e f_e P_e / N in expert order, the coefficients
// (route_losses' expressions; N = N_g), written after the counts.
__global__ void finish_losses_kernel(int64_t N, int64_t E, int64_t k, int64_t nb, double aux_loss, double z_loss,
                                     double* __restrict__ psum, const double* __restrict__ zsum,
                                     int64_t* __restrict__ summary) {
  double* P = psum + nb * E;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    double acc = 0;
    for (int64_t b = 0; b < nb; ++b) acc += psum[b * E + e];
    P[e] = acc;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  double z = 0;
  for (int64_t b = 0; b < nb; ++b) z += zsum[b];
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += (double(summary[e]) / double(N * k)) * (P[e] / double(N));
  double* losses = reinterpret_cast<double*>(summary + E);
  losses[0] = aux_loss * double(E) * aux;
  losses[1] = z_loss * z / double(N);
}

// router_logit_grad's d/dp of the load-balancing loss, per expert (Ng: global tokens, N: grad_tokens).
__global__ void daux_kernel(const int64_t* __restrict__ count, int64_t Ng, int64_t N, int64_t E, int64_t k,
                            double aux_loss, float loss_scale, double* __restrict__ daux) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < E; e += int64_t(gridDim.x) * blockDim.x)
    daux[e] = double(loss_scale) * aux_loss * double(E) * (double(count[e]) / double(Ng * k)) / double(N);
}

// router_logit_grad per token (T tokens; N: grad_tokens): dp[e] = daux[e] (+ dg[j] where e = expert j,
// unnormalised), dl[e] = 0 (+ g_j (dg_j - s) where e = expert j, normalised):
// the host's arrays' values (a token's experts are distinct, so each gets at
// most one term), made on the fly, and the host's sums in its order.
__global__ void router_grad_kernel(const double* __restrict__ probs, const double* __restrict__ lse,
                                   const int32_t* __restrict__ expert, const float* __restrict__ gate,
                                   const float* __restrict__ dgate, const double* __restrict__ daux, int64_t T,
                                   int64_t N, int64_t E, int64_t k, bool normalize, double z_loss, float loss_scale,
                                   float* __restrict__ d) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < T; t += int64_t(gridDim.x) * blockDim.x) {
    const double* p = probs + t * E;
    const float* dg = dgate + t * k;
    const float* g = gate + t * k;
    const int32_t* ex = expert + t * k;
    double s = 0;
    if (normalize)
      for (int64_t j = 0; j < k; ++j) s += double(dg[j]) * double(g[j]);
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) {
      double dp = daux[e];
      if (!normalize)
        for (int64_t j = 0; j < k; ++j)
          if (ex[j] == e) dp += double(dg[j]);
      dot += p[e] * dp;
    }
    const double dz = double(loss_scale) * z_loss * 2.0 * lse[t] / double(N);
    for (int64_t e = 0; e < E; ++e) {
      double dl = 0.0, dp = daux[e];
      for (int64_t j = 0; j < k; ++j)
        if (ex[j] == e) {
          if (normalize)
            dl += double(g[j]) * (double(dg[j]) - s);
          else
            dp += double(dg[j]);
        }
      d[t * E + e] = float(dl + p[e] * (dp - dot) + dz * p[e]);
    }
  }
}

}  // namespace

namespace {

// The arrays of one routing at `base` (null: offsets only); *bytes: the block's size. The one place the layout is
// stated, so route_bytes and route_layout cannot disagree.
RouteDevice layout(char* base, int64_t tokens, int64_t experts, int64_t k, int64_t capacity, size_t* bytes) {
  FP4LAB_CHECK(tokens >= 0 && experts >= 1 && experts <= train::kMaxRouteExperts && k >= 1 && k <= experts &&
                   tokens * k < (int64_t(1) << 31) && capacity >= 0 && experts * capacity < (int64_t(1) << 31),
               "moe route: " + std::to_string(tokens) + " tokens, " + std::to_string(experts) + " experts, k " +
                   std::to_string(k) + ", capacity " + std::to_string(capacity));
  const int64_t M = tokens * k, nb = sum_blocks(tokens);
  size_t at = 0;
  auto take = [&](size_t n) {
    void* p = base ? base + at : nullptr;
    at += align256(n);
    return p;
  };
  RouteDevice d;
  d.tokens = tokens, d.experts = experts, d.k = k;
  d.capacity = capacity;
  d.rows = capacity > 0 ? experts * capacity : M;
  d.probs = static_cast<double*>(take(size_t(tokens * experts) * 8));
  d.lse = static_cast<double*>(take(size_t(tokens) * 8));
  d.expert = static_cast<int32_t*>(take(size_t(M) * 4));
  d.gate = static_cast<float*>(take(size_t(M) * 4));
  d.pos = static_cast<int32_t*>(take(size_t(M) * 4));
  d.token = static_cast<int32_t*>(take(size_t(d.rows) * 4));
  d.first = static_cast<int64_t*>(take(size_t(experts) * 8));
  d.dgate = static_cast<float*>(take(size_t(M) * 4));
  d.keys_out = static_cast<int32_t*>(take(size_t(M) * 4));
  d.slots_in = static_cast<int32_t*>(take(size_t(M) * 4));
  d.slots_out = static_cast<int32_t*>(take(size_t(M) * 4));
  d.summary = static_cast<int64_t*>(take(route_summary_bytes(experts)));
  d.daux = static_cast<double*>(take(size_t(experts) * 8));
  d.psum = static_cast<double*>(take(size_t((nb + 1) * experts) * 8));
  d.zsum = static_cast<double*>(take(size_t(nb) * 8));
  d.sort_bytes = M > 0 ? sort_temp_bytes(M, experts) : 0;
  d.sort_temp = take(d.sort_bytes);
  *bytes = at;
  return d;
}

}  // namespace

size_t route_bytes(int64_t tokens, int64_t experts, int64_t k, int64_t capacity) {
  size_t bytes = 0;
  layout(nullptr, tokens, experts, k, capacity, &bytes);
  return bytes;
}

RouteDevice route_layout(void* base, int64_t tokens, int64_t experts, int64_t k, int64_t capacity) {
  size_t bytes = 0;
  return layout(static_cast<char*>(base), tokens, experts, k, capacity, &bytes);
}

void route(const float* logits, const RouteDevice& d, bool normalize_top_k, double aux_loss, double z_loss,
           cudaStream_t st) {
  route_local(logits, d, normalize_top_k, st);
  route_group(d, st);
  route_losses(d, aux_loss, z_loss, d.tokens, st);
}

void route_local(const float* logits, const RouteDevice& d, bool normalize_top_k, cudaStream_t st) {
  const int64_t N = d.tokens, E = d.experts, k = d.k, nb = sum_blocks(N);
  check(cudaMemsetAsync(d.summary, 0, route_summary_bytes(E), st), "moe route (zero the counts)");
  if (N == 0) return;
  route_kernel<<<blocks_for(N, 128), 128, 0, st>>>(logits, N, E, k, normalize_top_k, d.probs, d.lse, d.expert, d.gate,
                                                   d.slots_in, reinterpret_cast<unsigned long long*>(d.summary));
  check_launch("route_kernel");
  block_sums_kernel<<<unsigned(std::min<int64_t>(nb, 1 << 20)), kSumThreads, sum_tile_bytes(E), st>>>(
      d.probs, d.lse, N, E, nb, d.psum, d.zsum);
  check_launch("block_sums_kernel");
}

void route_group(const RouteDevice& d, cudaStream_t st) {
  const int64_t N = d.tokens, E = d.experts, k = d.k, M = N * k;
  if (N == 0) return;
  size_t bytes = d.sort_bytes;
  check(
      cub::DeviceRadixSort::SortPairs(d.sort_temp, bytes, static_cast<const int32_t*>(d.expert), d.keys_out,
                                      static_cast<const int32_t*>(d.slots_in), d.slots_out, int(M), 0, key_bits(E), st),
      "moe route (radix sort of the slots by expert)");
  if (d.capacity == 0) {
    place_kernel<<<blocks_for(M), kThreads, 0, st>>>(d.slots_out, M, k, d.token, d.pos);
    check_launch("place_kernel");
    return;
  }
  check(cudaMemsetAsync(d.token, 0xFF, size_t(d.rows) * 4, st), "moe route (empty rows)");
  first_slots_kernel<<<1, 1, 0, st>>>(d.summary, E, d.first);
  check_launch("first_slots_kernel");
  place_capacity_kernel<<<blocks_for(M), kThreads, 0, st>>>(d.slots_out, d.keys_out, d.first, M, k, d.capacity, d.token,
                                                            d.pos,
                                                            reinterpret_cast<unsigned long long*>(d.summary + E + 2));
  check_launch("place_capacity_kernel");
}

void route_losses(const RouteDevice& d, double aux_loss, double z_loss, int64_t global_tokens, cudaStream_t st) {
  finish_losses_kernel<<<1, kThreads, 0, st>>>(global_tokens, d.experts, d.k, sum_blocks(d.tokens), aux_loss, z_loss,
                                               d.psum, d.zsum, d.summary);
  check_launch("finish_losses_kernel");
}

void router_grad(const RouteDevice& d, bool normalize_top_k, double aux_loss, double z_loss, float loss_scale,
                 int64_t global_tokens, int64_t grad_tokens, float* dlogits, cudaStream_t st) {
  const int64_t N = d.tokens, E = d.experts, k = d.k;
  if (N <= 0) return;
  daux_kernel<<<blocks_for(E), kThreads, 0, st>>>(d.summary, global_tokens, grad_tokens, E, k, aux_loss, loss_scale,
                                                  d.daux);
  check_launch("daux_kernel");
  router_grad_kernel<<<blocks_for(N, 128), 128, 0, st>>>(d.probs, d.lse, d.expert, d.gate, d.dgate, d.daux, N,
                                                         grad_tokens, E, k, normalize_top_k, z_loss, loss_scale,
                                                         dlogits);
  check_launch("router_grad_kernel");
}

}  // namespace fp4lab::cuda::nn
