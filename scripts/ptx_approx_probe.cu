// Measures the approximate PTX arithmetic that peers' NVFP4 kernels use, on the GPU it runs on, so that
// core/ptx_approx.hpp can model it bit for bit (issue 48; docs/log/2026-12-01-tetrajet2-quartet2-plan.md 3.7, 4.3).
//
//   rcp.approx.ftz.f32  TransformerEngine's fast-math RHT cast, Quartet II's kernels (utils.cuh), TetraJet-v2's
//                       `1.0f/x` under --use_fast_math
//   div.approx.ftz.f32  TetraJet-v2's `/` under --use_fast_math
//   div.full.f32        Triton's fp32 `/` (TetraJet-v2's and Quartet II's Triton quantizers)
//
// Writes into OUTDIR:
//   rcp_approx_ftz_sm90.bin  the mantissa table, 2 bits an entry (2 MiB): for x = 1 + m * 2^-23, m = 0 .. 2^23-1,
//                    rcp.approx.ftz.f32(x) minus the correctly rounded 1/x in units in the last place (bit-pattern
//                    difference) coded 0: 0, 1: +1, 2: -1 (3: beyond one ulp, never seen; the run fails then),
//                    entry m in byte m / 4 at bits 2 (m % 4) .. 2 (m % 4) + 1: core/ptx_approx.cpp embeds it
//   probe.json       the GPU, the delta histogram, and the checks below with their mismatch counts and first
//                    mismatches (hex bit patterns)
// Checks: (a) over all 2^32 inputs, rcp.approx.ftz.f32(x) against the table model (scale by the exponent;
// +-0 and subnormal x -> +-Inf; +-Inf -> +-0; NaN -> NaN; a result below 2^-126 in magnitude -> +-0);
// (b) div.approx.ftz.f32(a, b) against mul.rn.ftz(a, rcp.approx.ftz(b)) and (c) div.full.f32(a, b) against
// four candidate models, over 2^30 pseudo-random pairs (full-range bit patterns and same-binade pairs) plus edges.
// Build: nvcc -O3 -arch=sm_90a -o ptx_approx_probe scripts/ptx_approx_probe.cu   Run: ./ptx_approx_probe OUTDIR
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      return 3;                                                                        \
    }                                                                                  \
  } while (0)

__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float div_approx_ftz(float a, float b) {
  float r;
  asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float div_full(float a, float b) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float mul_rn_ftz(float a, float b) {
  float r;
  asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// The mantissa table: delta[m] = bits(rcp(1 + m 2^-23)) - bits(fl(1/x)).
__global__ void binade_kernel(int8_t* delta, unsigned long long* hist) {
  uint32_t m = blockIdx.x * blockDim.x + threadIdx.x;
  if (m >= (1u << 23)) return;
  float x = __uint_as_float(0x3F800000u | m);
  int32_t d = (int32_t)__float_as_uint(rcp_approx_ftz(x)) - (int32_t)__float_as_uint(__frcp_rn(x));
  int c = d < -8 ? -8 : (d > 8 ? 8 : d);
  delta[m] = (int8_t)c;
  atomicAdd(&hist[c + 8], 1ull);
}

// The model of rcp.approx.ftz.f32 from the table (the same function core/ptx_approx.hpp states).
__device__ float rcp_model(uint32_t xb, const int8_t* delta) {
  uint32_t s = xb & 0x80000000u, e = (xb >> 23) & 0xFF, m = xb & 0x7FFFFF;
  if (e == 0xFF) return m ? __uint_as_float(0x7FFFFFFFu) : __uint_as_float(s);  // NaN; +-Inf -> +-0
  if (e == 0) return __uint_as_float(s | 0x7F800000u);                          // +-0, subnormal -> +-Inf
  uint32_t r1 = (uint32_t)((int32_t)__float_as_uint(__frcp_rn(__uint_as_float(0x3F800000u | m))) + delta[m]);
  // r1 = rcp(1.m) in (0.5, 1]; rcp(2^(e-127) 1.m) = 2^(127-e) r1.
  int32_t re = (int32_t)((r1 >> 23) & 0xFF) + 127 - (int32_t)e;
  if (re <= 0) return __uint_as_float(s);  // below 2^-126: flushed
  return __uint_as_float(s | ((uint32_t)re << 23) | (r1 & 0x7FFFFF));
}

struct Mismatch {
  unsigned long long count;
  uint32_t first[16][4];  // a, b, got, want
};

__device__ void record(Mismatch* mm, uint32_t a, uint32_t b, uint32_t got, uint32_t want) {
  unsigned long long i = atomicAdd(&mm->count, 1ull);
  if (i < 16) {
    mm->first[i][0] = a;
    mm->first[i][1] = b;
    mm->first[i][2] = got;
    mm->first[i][3] = want;
  }
}

__device__ bool same(float x, float y) { return __float_as_uint(x) == __float_as_uint(y) || (isnan(x) && isnan(y)); }

__global__ void all_inputs_kernel(uint64_t base, const int8_t* delta, Mismatch* mm) {
  uint64_t i = base + (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t xb = (uint32_t)i;
  float got = rcp_approx_ftz(__uint_as_float(xb)), want = rcp_model(xb, delta);
  if (!same(got, want)) record(mm, xb, 0, __float_as_uint(got), __float_as_uint(want));
}

__device__ uint32_t mix(uint64_t x) {  // splitmix64, for pseudo-random test pairs only
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return (uint32_t)(x ^ (x >> 31));
}

// mm[0]: div.approx.ftz vs mul_ftz(a, rcp_ftz(b)); mm[1..5]: div.full vs fl(a/b), mul(a, rcp(b)),
// mul(a, rcp_ftz(b)), mul(a, rcp(b)) with b, a scaled by 1/4 where |b| > 2^126 (the PTX ISA's
// "full-range" note), and core/ptx_approx.hpp's model (read from ptxas's SASS: also zero and subnormal b and
// a scaled by 2^24).
__global__ void pairs_kernel(uint64_t base, int mode, Mismatch* mm) {
  uint64_t i = base + (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t a = mix(2 * i), b = mix(2 * i + 1);
  if (mode == 1) {  // both in sane binades: the quantizers' domain
    a = (a & 0x807FFFFFu) | ((100u + (a >> 23) % 56u) << 23);
    b = (b & 0x807FFFFFu) | ((100u + (b >> 23) % 56u) << 23);
  }
  float fa = __uint_as_float(a), fb = __uint_as_float(b);
  float d0 = div_approx_ftz(fa, fb), m0 = mul_rn_ftz(fa, rcp_approx_ftz(fb));
  if (!same(d0, m0)) record(&mm[0], a, b, __float_as_uint(d0), __float_as_uint(m0));
  float df = div_full(fa, fb);
  float cand[4];
  cand[0] = __fdiv_rn(fa, fb);
  cand[1] = mul_rn(fa, rcp_approx(fb));
  cand[2] = mul_rn(fa, rcp_approx_ftz(fb));
  cand[3] = fabsf(fb) > 0x1p126f ? mul_rn(fa * 0.25f, rcp_approx(fb * 0.25f)) : mul_rn(fa, rcp_approx(fb));
  const float s = fabsf(fb) > 0x1p126f ? 0.25f : (fabsf(fb) < 0x1p-126f ? 16777216.0f : 1.0f);
  const float cand4 = mul_rn(rcp_approx_ftz(fb * s), fa * s);
  if (!same(df, cand4)) record(&mm[5], a, b, __float_as_uint(df), __float_as_uint(cand4));
  for (int k = 0; k < 4; ++k)
    if (!same(df, cand[k])) record(&mm[1 + k], a, b, __float_as_uint(df), __float_as_uint(cand[k]));
}

static void put_mm(FILE* f, const char* name, const Mismatch& m, bool last) {
  std::fprintf(f, "  \"%s\": {\"mismatches\": %llu, \"first\": [", name, m.count);
  for (unsigned long long i = 0; i < m.count && i < 16; ++i)
    std::fprintf(f, "%s[\"%08x\", \"%08x\", \"%08x\", \"%08x\"]", i ? ", " : "", m.first[i][0], m.first[i][1],
                 m.first[i][2], m.first[i][3]);
  std::fprintf(f, "]}%s\n", last ? "" : ",");
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ptx_approx_probe OUTDIR\n");
    return 2;
  }
  std::string out = argv[1];
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int8_t* d_delta;
  unsigned long long* d_hist;
  Mismatch* d_mm;
  const int n_mm = 7;
  CK(cudaMalloc(&d_delta, 1u << 23));
  CK(cudaMalloc(&d_hist, 17 * sizeof(unsigned long long)));
  CK(cudaMalloc(&d_mm, n_mm * sizeof(Mismatch)));
  CK(cudaMemset(d_hist, 0, 17 * sizeof(unsigned long long)));
  CK(cudaMemset(d_mm, 0, n_mm * sizeof(Mismatch)));
  binade_kernel<<<(1u << 23) / 256, 256>>>(d_delta, d_hist);
  CK(cudaGetLastError());
  const uint64_t chunk = 1ull << 30;
  for (uint64_t base = 0; base < (1ull << 32); base += chunk)
    all_inputs_kernel<<<(unsigned)(chunk / 256), 256>>>(base, d_delta, d_mm);
  CK(cudaGetLastError());
  for (int mode = 0; mode < 2; ++mode)
    pairs_kernel<<<(unsigned)((1ull << 29) / 256), 256>>>((uint64_t)mode << 40, mode, d_mm + 1);
  CK(cudaDeviceSynchronize());
  std::vector<int8_t> delta(1u << 23);
  unsigned long long hist[17];
  Mismatch mm[n_mm];
  CK(cudaMemcpy(delta.data(), d_delta, delta.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hist, d_hist, sizeof hist, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(mm, d_mm, sizeof mm, cudaMemcpyDeviceToHost));
  std::vector<uint8_t> packed(delta.size() / 4, 0);
  bool beyond = false;
  for (size_t m = 0; m < delta.size(); ++m) {
    const int d = delta[m];
    const uint8_t c = d == 0 ? 0 : d == 1 ? 1 : d == -1 ? 2 : 3;
    beyond |= c == 3;
    packed[m / 4] |= uint8_t(c << (2 * (m % 4)));
  }
  FILE* fb = std::fopen((out + "/rcp_approx_ftz_sm90.bin").c_str(), "wb");
  if (!fb || std::fwrite(packed.data(), 1, packed.size(), fb) != packed.size()) return 3;
  std::fclose(fb);
  FILE* f = std::fopen((out + "/probe.json").c_str(), "w");
  if (!f) return 3;
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  std::fprintf(f, "{\n  \"device\": \"%s\", \"capability\": \"%d.%d\", \"runtime\": %d, \"driver\": %d,\n", prop.name,
               prop.major, prop.minor, rt, drv);
  std::fprintf(f, "  \"rcp_binade_delta_histogram\": {");
  for (int k = 0; k < 17; ++k) std::fprintf(f, "%s\"%d\": %llu", k ? ", " : "", k - 8, hist[k]);
  std::fprintf(f, "},\n");
  put_mm(f, "rcp_all_inputs_vs_table_model", mm[0], false);
  put_mm(f, "div_approx_ftz_vs_mul_ftz_rcp_ftz", mm[1], false);
  put_mm(f, "div_full_vs_ieee_div", mm[2], false);
  put_mm(f, "div_full_vs_mul_rcp", mm[3], false);
  put_mm(f, "div_full_vs_mul_rcp_ftz", mm[4], false);
  put_mm(f, "div_full_vs_mul_rcp_scaled", mm[5], false);
  put_mm(f, "div_full_vs_model", mm[6], true);
  std::fprintf(f, "}\n");
  std::fclose(f);
  if (beyond) std::printf("rcp: a delta beyond one ulp: the 2-bit table cannot hold it\n");
  std::printf("rcp delta histogram:");
  for (int k = 0; k < 17; ++k)
    if (hist[k]) std::printf(" %d:%llu", k - 8, hist[k]);
  std::printf(
      "\nmismatches: rcp model %llu, div.approx %llu, div.full vs ieee %llu / mul_rcp %llu / mul_rcp_ftz %llu "
      "/ scaled %llu / model %llu\n",
      mm[0].count, mm[1].count, mm[2].count, mm[3].count, mm[4].count, mm[5].count, mm[6].count);
  return beyond || mm[0].count || mm[1].count || mm[6].count ? 1 : 0;
}
