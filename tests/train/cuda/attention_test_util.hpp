// Shared helpers of the CUDA attention tests (test_attention.cpp: fused FP32 and
// cuBLAS paths; test_attention_flash.cpp: BF16 flash): the AttentionDims of a
// test geometry, the dropout mask and keep scale as the kernels apply them
// (drawn from core's random_bits, independently of the kernels), normal test
// values (BF16-exact for the flash path), and the CAPTURE of a case.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/philox.hpp"
#include "gpu_test_util.hpp"
#include "train/backend_cases.hpp"
#include "train/cuda/nn.hpp"

namespace fp4lab::test {

// Batch B, sequence T, heads H, head dim hd (the backend table's geometry).
using AttentionGeo = fp4lab::train::test::AttentionGeometry;

// Attention of geometry g: width H * hd, the usual scale 1 / sqrt(hd), dropout
// p keyed by (seed, stream_id). bf16_flash stays off (the caller sets it).
inline cuda::nn::AttentionDims attention_dims(const AttentionGeo& g, bool causal, float p, uint64_t seed,
                                              uint64_t stream_id) {
  cuda::nn::AttentionDims d;
  d.batch = g.B, d.seq = g.T, d.heads = g.H, d.width = g.H * g.hd, d.causal = causal;
  d.scale = float(1.0 / std::sqrt(double(g.hd))), d.dropout = p, d.seed = seed, d.stream_id = stream_id;
  return d;
}

// Is element e = (bh T + i) T + j of the probabilities (row i, key j) dropped?
// random_bits(seed, stream_id, e) < dropout_threshold(p), as every path's mask
// (nothing dropped for p = 0).
inline bool attention_dropped(const cuda::nn::AttentionDims& d, int64_t e) {
  const uint32_t thr = d.dropout > 0.0f ? fp4lab::dropout_threshold(d.dropout) : 0u;
  return thr != 0 && fp4lab::random_bits(d.seed, d.stream_id, uint64_t(e)) < thr;
}

// The scale of the kept probabilities: 1 / (1 - p) computed in FP32 as the
// kernels' (1 for p = 0).
inline double attention_keep_scale(const cuda::nn::AttentionDims& d) {
  return d.dropout > 0.0f ? double(1.0f / (1.0f - d.dropout)) : 1.0;
}

// n normal values of standard deviation s (mt19937 seeded with `seed`).
inline std::vector<float> randn(size_t n, uint32_t seed, float s) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, s);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}
// The same values rounded to BF16 (RNE), so that the flash path's rounding of
// its inputs is exact.
inline std::vector<float> randn_bf16(size_t n, uint32_t seed, float s) {
  std::vector<float> v = randn(n, seed, s);
  round_to_bf16(v);
  return v;
}

}  // namespace fp4lab::test

// The CAPTURE of an attention case: geometry g (B, T, H, hd), causal, dropout p.
#define FP4LAB_CAPTURE_ATTENTION_CASE(g, causal, p) \
  CAPTURE(g.B);                                     \
  CAPTURE(g.T);                                     \
  CAPTURE(g.H);                                     \
  CAPTURE(g.hd);                                    \
  CAPTURE(causal);                                  \
  CAPTURE(p)
