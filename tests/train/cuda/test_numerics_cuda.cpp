// Numerics statistics on the GPU (train/cuda/numerics.hpp) equal the CPU's
// (train/numerics.hpp) bit for bit: every count, the amax and the float64
// sums (hence sqnr_db and mean_error), for the same operand plans and
// sources; and through the linear layers: a step measured by CudaLinear
// writes the same numerics.jsonl lines as the CPU layer. Recipes: nvfp4,
// mx_baseline (mxfp4), fp4_all_the_way (SR), tetrajet (double quantization,
// SR), fp4tk_fp4_all_the_way (fp4-trainkit's arithmetic).

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/device.hpp"
#include "gpu_test_util.hpp"
#include "recipes/recipe.hpp"
#include "train/cpu/linear.hpp"
#include "device_tensors.hpp"
#include "train/cuda/linear.hpp"
#include "train/cuda/numerics.hpp"
#include "train/numerics.hpp"

namespace fp4lab::train {
namespace {

using fp4lab::test::dev_tensor;
using fp4lab::test::dev_upload;
using fp4lab::test::kAlloc;

// Varied scales, exact zeros, a run of tiny values (scales at the floor).
std::vector<float> data(int64_t rows, int64_t cols, uint32_t seed, float scale) {
  std::vector<float> v = test::varied_randn(rows, cols, seed, 12);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] *= scale;
    if (i % 11 == 0) v[i] = 0.0f;
    if (i % 97 < 20) v[i] *= 1e-30f;
  }
  return v;
}

const char* kRecipes[] = {"nvfp4", "mx_baseline", "fp4_all_the_way", "tetrajet", "fp4tk_fp4_all_the_way"};

}  // namespace

TEST_CASE("cuda numerics: operand_numerics_device equals the CPU's operand_numerics bit for bit") {
  auto ws = make_numerics_workspace();
  for (const char* name : kRecipes) {
    const Recipe r = recipe_by_name(name);
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{64, 96}, {48, 600}, {160, 32}, {700, 190}}) {
      CAPTURE(name);
      CAPTURE(rows);
      CAPTURE(cols);
      const std::vector<float> h = data(rows, cols, uint32_t(rows * 7 + cols), 1e-3f);
      const Tensor d = dev_upload(h, rows, cols);
      const LinearPlan plan = linear_plan(LinearContext{&r, 17, 3, 42, "blocks.0.fc"});
      for (int k = 0; k < kOperandCount; ++k) {
        const OperandPlan& p = plan.operands[size_t(k)];
        CAPTURE(operand_name(p.op));
        const NumericsCounts cpu = operand_numerics(p, MatrixView<const float>(h.data(), rows, cols));
        const NumericsCounts gpu = operand_numerics_device(p, d.data, rows, cols, *ws);
        CHECK(gpu.elements == cpu.elements);
        CHECK(gpu.nonzero == cpu.nonzero);
        CHECK(gpu.flushed == cpu.flushed);
        CHECK(gpu.saturated == cpu.saturated);
        CHECK(gpu.inexact == cpu.inexact);
        CHECK(gpu.floor_blocks == cpu.floor_blocks);
        CHECK(gpu.ceil_blocks == cpu.ceil_blocks);
        CHECK(gpu.zero_blocks == cpu.zero_blocks);
        CHECK(gpu.amax_bits == cpu.amax_bits);
        CHECK(gpu == cpu);  // the float64 sums too, bit for bit
      }
    }
  }
}

TEST_CASE("cuda numerics: each block-grid path (one block, thread and warp per block) and NaN inputs equal the CPU") {
  auto ws = make_numerics_workspace();
  const int64_t rows = 680, cols = 200;  // 136000 elements: lanes hold one or two; partial 16x16 tiles
  std::vector<float> h = data(rows, cols, 5, 1.0f);
  for (const bool with_nan : {false, true}) {
    if (with_nan) h[size_t(37 * cols + 5)] = NAN, h[size_t(200 * cols + 100)] = -INFINITY;
    const Tensor d = dev_upload(h, rows, cols);
    for (const char* qname : {"fp8_e4m3_tensor", "nvfp4", "nvfp4_2d", "mxfp8_e4m3", "mxint8"}) {
      CAPTURE(qname);
      CAPTURE(with_nan);
      const QuantizerSpec q = quantizer_by_name(qname);
      OperandPlan p;
      p.quantizer = &q, p.stream = RandomStream{9, 2};
      const NumericsCounts cpu = operand_numerics(p, MatrixView<const float>(h.data(), rows, cols));
      const NumericsCounts gpu = operand_numerics_device(p, d.data, rows, cols, *ws);
      CHECK(gpu.zero_blocks == cpu.zero_blocks);
      CHECK(gpu.floor_blocks == cpu.floor_blocks);
      CHECK(gpu.nan == cpu.nan);
      CHECK(gpu == cpu);
    }
  }
}

TEST_CASE("cuda numerics: a measured step of CudaLinear writes the CPU layer's lines") {
  const int64_t B = 96, in = 64, out = 48;
  const std::vector<float> x = data(B, in, 1, 1.0f), w = data(out, in, 2, 0.05f), dy = data(B, out, 3, 1e-4f);
  CudaLinear lin;
  for (const char* name : kRecipes) {
    CAPTURE(name);
    const Recipe r = recipe_by_name(name);
    const LinearContext ctx{&r, 17, 3, 42, "blocks.0.fc"};
    NumericsRecorder cpu_rec(43), gpu_rec(43);
    {
      const NumericsScope scope(&cpu_rec);
      MatrixRM y, dx, dw;
      LinearSaved saved;
      auto mat = [](const std::vector<float>& v, int64_t rr, int64_t cc) {
        return MatrixRM(Eigen::Map<const MatrixRM>(v.data(), rr, cc));
      };
      linear_forward(ctx, mat(x, B, in), mat(w, out, in), nullptr, y, saved);
      linear_backward(ctx, saved, mat(w, out, in), mat(dy, B, out), dx, dw, nullptr);
    }
    {
      const NumericsScope scope(&gpu_rec);
      Tensor xd = dev_upload(x, B, in), wd = dev_upload(w, out, in), dyd = dev_upload(dy, B, out);
      Tensor y, dx, dw = dev_upload(std::vector<float>(size_t(out * in), 0.0f), out, in);
      std::unique_ptr<LinearState> st;
      lin.forward(ctx, xd, wd, nullptr, y, st, kAlloc);
      lin.backward(ctx, *st, wd, dyd, dx, dw, nullptr, kAlloc);
      cuda::check(cudaDeviceSynchronize(), "sync");
    }
    REQUIRE(cpu_rec.size() == 6);
    CHECK(gpu_rec.lines() == cpu_rec.lines());
  }
  // Off-steps: no recorder, nothing measured.
  CHECK(numerics_recorder() == nullptr);
}

}  // namespace fp4lab::train
