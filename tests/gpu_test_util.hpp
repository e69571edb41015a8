// Shared helpers of the CUDA tests (executables whose main is tests/gpu_main.cpp,
// which reports SKIPPED without a GPU): test tensors, and bit-for-bit comparison of a GPU QuantizedTensor with sim's.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/bits.hpp"
#include "cuda/device.hpp"
#include "cuda/quantize.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab::test {

// Normal values whose scale varies per 8-element chunk over 2^-40 .. 2^40, so
// that blocks exercise many scales (and their under/overflow).
inline std::vector<float> varied_randn(int64_t rows, int64_t cols, uint32_t seed, int exp_range = 40) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-exp_range, exp_range);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  float s = 1.0f;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i % 8 == 0) s = std::ldexp(1.0f, e(g));
    v[i] = d(g) * s;
  }
  return v;
}

// Rounds every value to bfloat16 (RN) so that it can be fed as a bf16 input.
inline void round_to_bf16(std::vector<float>& v) {
  for (float& x : v) {
    uint32_t b = float_bits(x);
    if ((b & 0x7F800000u) == 0x7F800000u) {
      b &= 0xFFFF0000u;
      if ((float_bits(x) & 0x7FFFFFu) != 0) b |= 0x00400000u;  // keep NaN a NaN
    } else {
      b = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
    }
    x = bits_float(b);
  }
}

// Adversarial tensor: zeros, -0, NaN, +-Inf, FP32 subnormals, FLT_MAX, values
// at rounding ties of e2m1/e4m3 after a power-of-two scale, whole zero blocks.
inline std::vector<float> adversarial(int64_t rows, int64_t cols, uint32_t seed, bool with_nan_inf) {
  std::vector<float> v = varied_randn(rows, cols, seed, 20);
  std::mt19937 g(seed + 1);
  std::uniform_int_distribution<size_t> pick(0, v.size() - 1);
  const float specials[] = {0.0f,
                            -0.0f,
                            1e-45f,
                            -1e-45f,
                            1.17549435e-38f,
                            3.4028235e38f,
                            -3.4028235e38f,
                            0.25f,
                            0.75f,
                            1.25f,
                            1.75f,
                            2.5f,
                            3.5f,
                            5.0f,
                            -5.0f,
                            6.0f,
                            7.0f,
                            448.0f,
                            464.0f,
                            0.0009765625f,
                            2.384185791015625e-07f};
  for (size_t k = 0; k < v.size() / 6; ++k) v[pick(g)] = specials[k % (sizeof specials / sizeof *specials)];
  if (with_nan_inf && v.size() > 64) {
    v[pick(g)] = std::nanf("");
    v[pick(g)] = INFINITY;
    v[pick(g)] = -INFINITY;
  }
  // A zero run of 40 elements (whole zero blocks of 16/32 in most rows).
  for (size_t i = 0; i < std::min<size_t>(40, v.size()); ++i) v[i] = 0.0f;
  return v;
}

// Same float bits, or both NaN (any payload; see same_bits).
inline bool same_float(float a, float b) {
  return fp4lab::float_bits(a) == fp4lab::float_bits(b) || (std::isnan(a) && std::isnan(b));
}

// First mismatch, printed with index and both bit patterns; true if all equal.
// NaN equals NaN whatever its payload: the payload of a NaN produced by FP32
// arithmetic is hardware-specific (x86 propagates the operand's payload, NVIDIA
// GPUs return the canonical 0x7FFFFFFF), so it is not part of the contract.
// Element and scale codes (bytes) are compared exactly, NaN codes included.
inline bool same_bits(const char* what, const std::vector<float>& a, const std::vector<float>& b,
                      const std::vector<float>* input = nullptr) {
  if (a.size() != b.size()) {
    std::printf("%s: sizes differ (gpu %zu, cpu %zu)\n", what, a.size(), b.size());
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (float_bits(a[i]) != float_bits(b[i]) && !(std::isnan(a[i]) && std::isnan(b[i]))) {
      std::printf("%s: first mismatch at %zu: gpu %g (0x%08x) cpu %g (0x%08x)", what, i, double(a[i]), float_bits(a[i]),
                  double(b[i]), float_bits(b[i]));
      if (input && i < input->size()) std::printf(" input %g (0x%08x)", double((*input)[i]), float_bits((*input)[i]));
      std::printf("\n");
      return false;
    }
  }
  return true;
}
inline bool same_bytes(const char* what, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                       const std::vector<float>* input = nullptr) {
  if (a.size() != b.size()) {
    std::printf("%s: sizes differ (gpu %zu, cpu %zu)\n", what, a.size(), b.size());
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      std::printf("%s: first mismatch at %zu: gpu 0x%02x cpu 0x%02x", what, i, a[i], b[i]);
      if (input && i < input->size()) std::printf(" input %g (0x%08x)", double((*input)[i]), float_bits((*input)[i]));
      std::printf("\n");
      return false;
    }
  }
  return true;
}

// Compares every output of a GPU quantization with sim's, bit for bit.
inline bool same_quantized(const QuantizedTensor& gpu, const QuantizedTensor& cpu, const std::vector<float>& x) {
  bool ok = gpu.scale_rows == cpu.scale_rows && gpu.scale_cols == cpu.scale_cols;
  ok = same_bytes("codes", gpu.codes, cpu.codes, &x) && ok;
  ok = same_bytes("scale codes", gpu.scale_codes, cpu.scale_codes) && ok;
  ok = same_bits("scales", gpu.scales, cpu.scales) && ok;
  ok = same_bits("global decode", {gpu.global_decode}, {cpu.global_decode}) && ok;
  ok = same_bits("dequant", gpu.dequant, cpu.dequant, &x) && ok;
  return ok;
}

struct Size {
  int64_t rows, cols;
};

// Quantizes on CPU and GPU and compares; returns false (and prints the case) on a mismatch.
inline bool check_case(const QuantizerSpec& q, const std::vector<float>& x, Size s, RandomStream rs,
                       cuda::QuantPath path, bool bf16 = false) {
  const MatrixView<const float> v(x.data(), s.rows, s.cols);
  const QuantizedTensor cpu = quantize(q, v, rs);
  const QuantizedTensor gpu = cuda::quantize_gpu(q, v, rs, path, bf16);
  if (same_quantized(gpu, cpu, x)) return true;
  std::printf("  case: %s, %lld x %lld, path %s, input %s\n", describe(q).c_str(), (long long)s.rows, (long long)s.cols,
              path == cuda::QuantPath::fused     ? "fused"
              : path == cuda::QuantPath::generic ? "generic"
                                                 : "auto",
              bf16 ? "bf16" : "f32");
  return false;
}

inline std::vector<cuda::QuantPath> paths_for(const QuantizerSpec& q) {
  std::vector<cuda::QuantPath> p;
  p.push_back(cuda::QuantPath::generic);  // every spec, with or without RHT
  if (cuda::fused_supported(q)) p.push_back(cuda::QuantPath::fused);
  return p;
}

}  // namespace fp4lab::test
