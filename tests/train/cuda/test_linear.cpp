// The GPU quantized linear layer (train/cuda/linear.hpp) against the CPU
// reference (train/cpu/linear.hpp), for every canned recipe plus
// double quantization, layers kept in high precision, mixed FP32 / quantized
// GEMMs and quantizers whose BF16 operand would not be exact:
//  - every prepared GEMM operand (test hook) is bit-identical to the CPU's
//    (apply_operand_plan on the host);
//  - y, dx, dW (accumulated) match the CPU at FP32 accumulation-order
//    tolerance: |gpu - cpu| <= tol(k) * (sum_k |a_ik| |b_kj| + |added term|)
//    with tol(k) = 4 (k + 8) 2^-24. Each of the two FP32 sums is within
//    about k u (u = 2^-24) of the exact sum of the same exactly-representable
//    products (the quantized operands' products are exact in FP32), so their
//    difference is within 2 (k + O(1)) u; the extra factor 2 allows the tensor
//    cores' accumulation (not necessarily one RN per add). TF32 (10-bit
//    mantissas) or a wrong operand breaks it by orders of magnitude; also the
//    relative Frobenius error must be < 1e-5;
//  - db is bit-identical (float64 sums in row order, rows <= 256) or within
//    float64 reassociation (more rows);
//  - two runs give identical bits; errors match the CPU's (RHT sizes).
// Also the RHT kernel (cuda/rht.hpp) bit for bit against sim's.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "train/cuda/linear.hpp"
#include "core/bits.hpp"
#include "core/error.hpp"
#include "cuda/device.hpp"
#include "gpu_test_util.hpp"
#include "cuda/rht.hpp"
#include "device_tensors.hpp"
#include "train/cpu/linear.hpp"
#include "sim/rht.hpp"

// Inside fp4lab::train: Tensor is the backend's tensor (not core's Tensor<T>).
namespace fp4lab::train {
namespace {

std::vector<float> randv(int64_t n, uint32_t seed, float sigma) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    x = d(g);
    if (x == 0.0f) x = sigma;  // never zeros
  }
  return v;
}

using fp4lab::test::dev_download;
using fp4lab::test::dev_tensor;
using fp4lab::test::dev_upload;
using fp4lab::test::kAlloc;

bool same_bits(const std::vector<float>& a, const float* b, size_t n) {
  return a.size() == n && (n == 0 || std::memcmp(a.data(), b, n * sizeof(float)) == 0);
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) { return same_bits(a, b.data(), b.size()); }

MatrixRM to_m(const std::vector<float>& v, int64_t r, int64_t c) {
  MatrixRM m(r, c);
  if (r * c > 0) std::memcpy(m.data(), v.data(), v.size() * sizeof(float));
  return m;
}

struct Shape3 {
  int64_t batch, in, out;
};

struct Inputs {
  int64_t B, in, out;
  std::vector<float> x, w, b, dy, dw0, db0;
};
Inputs make_inputs(Shape3 s, uint32_t seed) {
  Inputs t{s.batch, s.in, s.out, {}, {}, {}, {}, {}, {}};
  t.x = randv(s.batch * s.in, seed, 1.0f);
  t.w = randv(s.out * s.in, seed + 1, 0.1f);
  t.b = randv(s.out, seed + 2, 1.0f);
  t.dy = randv(s.batch * s.out, seed + 3, 1e-3f);
  t.dw0 = randv(s.out * s.in, seed + 4, 1e-2f);
  t.db0 = randv(s.out, seed + 5, 1e-2f);
  return t;
}

struct GpuResult {
  std::vector<float> y, dx, dw, db;
  std::map<Operand, std::vector<float>> ops;
};

GpuResult run_gpu(CudaLinear& lin, const LinearContext& ctx, const Inputs& t, bool record) {
  GpuResult r;
  if (record) {
    lin.set_operand_hook(
        [&r](Operand op, const float* p, int64_t rows, int64_t cols) { r.ops[op] = dev_download(p, rows * cols); });
  } else {
    lin.set_operand_hook(nullptr);
  }
  Tensor x = dev_upload(t.x, t.B, t.in), w = dev_upload(t.w, t.out, t.in), b = dev_upload(t.b, 1, t.out);
  Tensor dy = dev_upload(t.dy, t.B, t.out), dw = dev_upload(t.dw0, t.out, t.in), db = dev_upload(t.db0, 1, t.out);
  Tensor y, dx;
  std::unique_ptr<LinearState> st;
  lin.forward(ctx, x, w, b.data, y, st, kAlloc);
  REQUIRE(y.rows == t.B);
  REQUIRE(y.cols == t.out);
  lin.backward(ctx, *st, w, dy, dx, dw, db.data, kAlloc);
  REQUIRE(dx.rows == t.B);
  REQUIRE(dx.cols == t.in);
  cuda::check(cudaDeviceSynchronize(), "test sync");
  r.y = dev_download(y.data, y.size());
  r.dx = dev_download(dx.data, dx.size());
  r.dw = dev_download(dw.data, dw.size());
  r.db = dev_download(db.data, db.size());
  lin.set_operand_hook(nullptr);
  return r;
}

// |g - c| <= tol(k) * (mag + |extra|) elementwise and relative Frobenius < 1e-5.
// mag[i] = sum_k |a||b| of output i.
void check_close(const char* what, const std::vector<float>& g, const std::vector<float>& c,
                 const std::vector<double>& mag, const std::vector<float>* extra, int64_t k) {
  CAPTURE(what);
  REQUIRE(g.size() == c.size());
  const double tol = 4.0 * double(k + 8) * 0x1p-24;
  double num = 0, den = 0, worst = 0;
  int64_t bad = 0, first_bad = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    const double d = double(g[i]) - double(c[i]);
    const double bound = tol * (mag[i] + (extra ? std::fabs(double((*extra)[i])) : 0.0)) + 1e-30;
    num += d * d;
    den += double(c[i]) * double(c[i]);
    worst = std::max(worst, std::fabs(d) / bound);
    if (!(std::fabs(d) <= bound)) {
      if (first_bad < 0) first_bad = int64_t(i);
      ++bad;
    }
  }
  CAPTURE(first_bad);
  CAPTURE(worst);
  CHECK(bad == 0);
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  CAPTURE(rel);
  CHECK(rel < 1e-5);
}

// mag of C [m, n] = A [m, k] * B, where B is given as [n, k] (bt = true) or [k, n].
std::vector<double> abs_product(const MatrixRM& a, const MatrixRM& b, bool bt) {
  const int64_t m = a.rows(), k = a.cols(), n = bt ? b.rows() : b.cols();
  std::vector<double> out(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q) s += std::fabs(double(a(i, q))) * std::fabs(double(bt ? b(j, q) : b(q, j)));
      out[size_t(i * n + j)] = s;
    }
  return out;
}

std::vector<float> flat(const MatrixRM& m) { return std::vector<float>(m.data(), m.data() + m.size()); }

MatrixRM cpu_operand(const LinearPlan& plan, Operand op, const MatrixRM& src) {
  MatrixRM m = src;
  apply_operand_plan(plan.operand(op), MatrixView<float>(m.data(), m.rows(), m.cols()));
  return m;
}

// The whole comparison for one recipe / layer / shape. Returns false if the CPU
// refused the shape (the GPU must then refuse it too).
bool compare_one(CudaLinear& lin, const Recipe* r, const char* layer_name, Shape3 s, uint32_t seed) {
  const Inputs t = make_inputs(s, seed);
  LinearContext ctx{r, 987654321ull, 5, 11};
  ctx.layer_name = layer_name;
  const MatrixRM x = to_m(t.x, t.B, t.in), w = to_m(t.w, t.out, t.in), dy = to_m(t.dy, t.B, t.out);

  // CPU reference.
  MatrixRM y, dx, dw;
  std::vector<float> db(static_cast<size_t>(t.out));
  try {
    LinearSaved saved;
    linear_forward(ctx, x, w, t.b.data(), y, saved);
    linear_backward(ctx, saved, w, dy, dx, dw, db.data());
  } catch (const Error& e) {
    MESSAGE("CPU refuses the shape: " << std::string(e.what()));
    CHECK_THROWS_AS(run_gpu(lin, ctx, t, false), Error);
    cuda::check(cudaDeviceSynchronize(), "sync after refusal");
    return false;
  }

  const GpuResult g = run_gpu(lin, ctx, t, true);
  const GpuResult g2 = run_gpu(lin, ctx, t, false);

  // Operands bit for bit.
  const LinearPlan plan = linear_plan(ctx);
  const MatrixRM ox = cpu_operand(plan, Operand::fwd_x, x), ow = cpu_operand(plan, Operand::fwd_w, w);
  const MatrixRM og = cpu_operand(plan, Operand::dgrad_grad_y, dy), ow2 = cpu_operand(plan, Operand::dgrad_w, w);
  const MatrixRM og2 = cpu_operand(plan, Operand::wgrad_grad_y, dy), ox2 = cpu_operand(plan, Operand::wgrad_x, x);
  const std::pair<Operand, const MatrixRM*> expect[] = {{Operand::fwd_x, &ox},         {Operand::fwd_w, &ow},
                                                        {Operand::dgrad_grad_y, &og},  {Operand::dgrad_w, &ow2},
                                                        {Operand::wgrad_grad_y, &og2}, {Operand::wgrad_x, &ox2}};
  for (const auto& [op, m] : expect) {
    CAPTURE(operand_name(op));
    REQUIRE(g.ops.count(op) == 1);
    CHECK(same_bits(g.ops.at(op), m->data(), size_t(m->size())));
  }

  // Outputs at FP32 accumulation tolerance.
  {
    std::vector<float> bias_full(static_cast<size_t>(t.B * t.out));
    for (int64_t i = 0; i < t.B; ++i)
      for (int64_t j = 0; j < t.out; ++j) bias_full[size_t(i * t.out + j)] = t.b[size_t(j)];
    check_close("y", g.y, flat(y), abs_product(ox, ow, true), &bias_full, t.in);
  }
  check_close("dx", g.dx, flat(dx), abs_product(og, ow2, false), nullptr, t.out);
  {
    std::vector<float> dw_exp(static_cast<size_t>(dw.size()));
    for (size_t i = 0; i < dw_exp.size(); ++i) dw_exp[i] = t.dw0[i] + dw.data()[i];
    const MatrixRM og2t = og2.transpose();
    check_close("dW", g.dw, dw_exp, abs_product(og2t, ox2, false), &t.dw0, t.B);
  }
  {
    std::vector<float> db_exp(db.size());
    for (size_t i = 0; i < db.size(); ++i) db_exp[i] = t.db0[i] + db[i];
    if (t.B <= 256) {
      CHECK(same_bits(g.db, db_exp));
    } else {
      for (size_t i = 0; i < db.size(); ++i)
        CHECK(std::fabs(g.db[i] - db_exp[i]) <= 1e-6f * std::fabs(db_exp[i]) + 1e-12f);
    }
  }

  // Determinism.
  CHECK(same_bits(g.y, g2.y));
  CHECK(same_bits(g.dx, g2.dx));
  CHECK(same_bits(g.dw, g2.dw));
  CHECK(same_bits(g.db, g2.db));
  return true;
}

// {96, 32, 48}: both x and dy have sides that are multiples of 16 (the one-pass pair of operands).
const Shape3 kShapes[] = {{48, 80, 40}, {37, 50, 29}, {64, 96, 136}, {272, 48, 75}, {96, 32, 48}};

// Extra recipes: double quantization on top of nvfp4 and mxfp8; a high-precision
// FP32 recipe with some operands unquantized (mixed GEMMs) and quantizers whose
// BF16 operand is not exact (quantizer-level RHT, FP32 per-tensor scale).
std::vector<Recipe> extra_recipes() {
  std::vector<Recipe> v;
  {
    Recipe r = recipe_by_name("nvfp4");
    r.name = "nvfp4+dq";
    r.double_quantization = true;
    v.push_back(r);
  }
  {
    Recipe r = recipe_by_name("mxfp8");
    r.name = "mxfp8+dq";
    r.double_quantization = true;
    v.push_back(r);
  }
  {
    Recipe r = recipe_by_name("nvfp4_fwd_mxfp8_bwd");
    r.name = "mixed";
    QuantizerSpec q = quantizer_by_name("nvfp4");  // [1,16] along in
    q.rht = true;
    q.rht_seed = 7;
    r.operands[size_t(Operand::fwd_x)] = q;
    r.operands[size_t(Operand::dgrad_grad_y)] = quantizer_by_name("fp8_e4m3_tensor");
    r.operands[size_t(Operand::wgrad_x)].reset();
    v.push_back(r);
  }
  {
    Recipe r = recipe_by_name("mx_baseline");
    r.name = "mx_baseline+keep";
    r.keep_high_precision = {"*head*"};
    r.operands[size_t(Operand::fwd_w)].reset();  // fwd GEMM: quantized x, FP32 W
    v.push_back(r);
  }
  // TE's backward_override (recipes/recipe.hpp): the backward from the forward's dequantized x and W
  // (the `pre` without a quantizer), and from the original ones.
  {
    Recipe r = recipe_by_name("nvfp4");
    r.name = "nvfp4+bwd_dequantized";
    r.backward_override = BackwardOverride::dequantized;
    v.push_back(r);
  }
  {
    Recipe r = recipe_by_name("mxfp8");
    r.name = "mxfp8+bwd_high_precision";
    r.backward_override = BackwardOverride::high_precision;
    v.push_back(r);
  }
  for (const Recipe& r : v) validate(r, "test recipe " + r.name);
  return v;
}

}  // namespace

TEST_CASE("cuda linear: the test's extra recipes are valid") { CHECK(extra_recipes().size() == 6); }

TEST_CASE("cuda linear: RHT kernel equals sim's bit for bit, partial last chunks included") {
  // Whole chunks along both axes, and partial last chunks (left untransformed,
  // sim/rht.hpp) along rows, columns or both, shorter than one chunk too.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{32, 48}, {48, 7}, {16, 1}, {5, 64}, {272, 80}, {37, 45},
                            {20, 3}, {3, 20}, {680, 40}, {1, 1}}) {
    for (RhtAxis axis : {RhtAxis::rows, RhtAxis::cols}) {
      CAPTURE(rows);
      CAPTURE(cols);
      std::vector<float> h = randv(rows * cols, uint32_t(rows * 31 + cols), 1.0f);
      h[0] = 1e-39f;  // a subnormal input (the 0.25 scaling of subnormals must match)
      std::vector<float> fwd = h, inv = h;
      rht_forward(MatrixView<float>(fwd.data(), rows, cols), axis, 12345);
      rht_inverse(MatrixView<float>(inv.data(), rows, cols), axis, 12345);
      Tensor d = dev_upload(h, rows, cols);
      cuda::rht_forward_device(d.data, rows, cols, axis, 12345);
      CHECK(same_bits(dev_download(d.data, rows * cols), fwd));
      Tensor e = dev_upload(h, rows, cols);
      cuda::rht_inverse_device(e.data, rows, cols, axis, 12345);
      CHECK(same_bits(dev_download(e.data, rows * cols), inv));
      // Out of place with the output's amax (max |x| bit pattern), as quantize's tensor amax.
      uint32_t want = 0;
      for (float v : fwd) want = std::max(want, float_bits(v) & 0x7FFFFFFFu);
      Tensor src = dev_upload(h, rows, cols), dst = dev_tensor(rows, cols);
      cuda::DeviceBuffer<uint32_t> amax(1);
      amax.fill_bytes(0x7F);  // the call must reset it
      cuda::rht_forward_device(src.data, dst.data, rows, cols, axis, 12345, nullptr, amax.data());
      CHECK(same_bits(dev_download(dst.data, rows * cols), fwd));
      CHECK(same_bits(dev_download(src.data, rows * cols), h));
      CHECK(amax.download()[0] == want);
    }
  }
}

TEST_CASE("cuda linear: Quartet II's 128-point rotation equals sim's bit for bit, both axes, partial chunks") {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{256, 384}, {130, 200}, {384, 130}, {5, 128}, {128, 5},
                            {1, 1}, {300, 40}}) {
    for (RhtAxis axis : {RhtAxis::rows, RhtAxis::cols}) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(int(axis));
      std::vector<float> h = randv(rows * cols, uint32_t(rows * 17 + cols), 1.0f);
      h[0] = 1e-39f;
      std::vector<float> fwd = h;
      rht_forward(MatrixView<float>(fwd.data(), rows, cols), axis, RhtKind::quartet2_128, 77);
      Tensor src = dev_upload(h, rows, cols), dst = dev_tensor(rows, cols);
      cuda::rht_forward_device(src.data, dst.data, rows, cols, axis, RhtKind::quartet2_128, 77, nullptr);
      CHECK(same_bits(dev_download(dst.data, rows * cols), fwd));
      CHECK(same_bits(dev_download(src.data, rows * cols), h));
      cuda::rht_forward_device(src.data, src.data, rows, cols, axis, RhtKind::quartet2_128, 77, nullptr);  // in place
      CHECK(same_bits(dev_download(src.data, rows * cols), fwd));
    }
  }
}

TEST_CASE("cuda linear: quartet2 matches the CPU layer on whole 128-chunks") {
  CudaLinear lin;
  const Recipe r = recipe_by_name("quartet2");
  CHECK(compare_one(lin, &r, "blocks.0.mlp.fc", Shape3{256, 128, 384}, 4242));
  CHECK(compare_one(lin, &r, "blocks.0.mlp.fc", Shape3{384, 256, 128}, 4243));
}

TEST_CASE("cuda linear: every canned recipe matches the CPU layer") {
  CudaLinear lin;
  uint32_t seed = 100;
  for (const std::string& name : recipe_names()) {
    const Recipe r = recipe_by_name(name);
    CAPTURE(name);
    int done = 0;
    for (const Shape3& s : kShapes) {
      CAPTURE(s.batch);
      CAPTURE(s.in);
      CAPTURE(s.out);
      done += compare_one(lin, &r, "blocks.0.mlp.fc", s, seed += 10) ? 1 : 0;
    }
    CHECK(done >= 2);
  }
}

TEST_CASE("cuda linear: double quantization, mixed, backward-override and high-precision layers match the CPU") {
  CudaLinear lin;
  uint32_t seed = 500;
  const std::vector<Recipe> extra = extra_recipes();
  const Recipe nv = recipe_by_name("nvfp4");
  for (const Recipe& r : extra) {
    CAPTURE(r.name);
    int done = 0;
    for (const Shape3& s : kShapes) done += compare_one(lin, &r, "blocks.1.attn.proj", s, seed += 10) ? 1 : 0;
    CHECK(done >= 1);
  }
  // Layers kept in high precision: nvfp4's "*head*" (bf16 operands) and the FP32 one.
  for (const Recipe* r : {&nv, &extra[3]}) {
    CAPTURE(r->name);
    CHECK_FALSE(linear_is_quantized(LinearContext{r, 0, 0, 0, "lm_head"}));
    for (const Shape3& s : kShapes) CHECK(compare_one(lin, r, "lm_head", s, seed += 10));
  }
  // No recipe at all: plain FP32.
  for (const Shape3& s : kShapes) CHECK(compare_one(lin, nullptr, "x", s, seed += 10));
}

TEST_CASE("cuda linear: shape errors name the input") {
  CudaLinear lin;
  Tensor x = dev_tensor(4, 8), w = dev_tensor(3, 7), y;
  std::unique_ptr<LinearState> st;
  CHECK_THROWS_WITH_AS(lin.forward(LinearContext{}, x, w, nullptr, y, st, kAlloc), doctest::Contains("in_features"),
                       Error);
}

TEST_CASE("cuda linear: backward refuses a context other than the forward's when wgrad's x was computed early") {
  CudaLinear lin;
  const Recipe r = recipe_by_name("nvfp4");  // wgrad_x: RHT + NVFP4 [16,1], a BF16 operand made in the forward
  const Inputs t = make_inputs({32, 48, 16}, 77);
  Tensor x = dev_upload(t.x, t.B, t.in), w = dev_upload(t.w, t.out, t.in), dy = dev_upload(t.dy, t.B, t.out);
  Tensor dw = dev_upload(t.dw0, t.out, t.in), y, dx;
  LinearContext ctx{&r, 1, 2, 3, "blocks.0.mlp.fc"};
  std::unique_ptr<LinearState> st;
  lin.forward(ctx, x, w, nullptr, y, st, kAlloc);
  LinearContext later = ctx;
  later.step = 4;  // another stochastic stream for wgrad's x
  CHECK_THROWS_WITH_AS(lin.backward(later, *st, w, dy, dx, dw, nullptr, kAlloc),
                       doctest::Contains("forward's LinearContext"), Error);
  CHECK_NOTHROW(lin.backward(ctx, *st, w, dy, dx, dw, nullptr, kAlloc));
  cuda::check(cudaDeviceSynchronize(), "test sync");
}

TEST_CASE("cuda linear: a forward-only layer (evaluation) takes any row count and keeps nothing for backward") {
  // Evaluation batches need not be multiples of 16 (the ViT's 1000 images x 17
  // tokens): the forward prepares no wgrad operand, whose RHT needs whole
  // 16-row chunks. Its y is the training forward's y bit for bit (the same
  // operand bits, the same GEMM), and close to the CPU's.
  CudaLinear lin;
  for (const char* name : {"nvfp4", "tetrajet", "mxfp8", "bf16", "fp4_all_the_way", "nvfp4_fwd_mxfp8_bwd"}) {
    INFO(name);
    const Recipe r = recipe_by_name(name);
    for (const int64_t rows : {int64_t(64), int64_t(680)}) {
      INFO("rows ", rows);
      const Inputs t = make_inputs({rows, 64, 48}, 91);
      Tensor x = dev_upload(t.x, t.B, t.in), w = dev_upload(t.w, t.out, t.in), y_eval, y_train;
      LinearContext ctx{&r, 1, 2, 3, "blocks.0.mlp.fc"};
      LinearContext eval = ctx;
      eval.backward = false;
      std::unique_ptr<LinearState> st_eval, st_train;
      REQUIRE_NOTHROW(lin.forward(eval, x, w, nullptr, y_eval, st_eval, kAlloc));
      Tensor dy = dev_upload(t.dy, t.B, t.out), dw = dev_upload(t.dw0, t.out, t.in), dx;
      CHECK_THROWS_WITH_AS(lin.backward(eval, *st_eval, w, dy, dx, dw, nullptr, kAlloc),
                           doctest::Contains("kept nothing"), Error);
      cuda::check(cudaDeviceSynchronize(), "test sync");
      const std::vector<float> ye = dev_download(y_eval.data, y_eval.size());
      // The CPU reference forward (forward-only as well).
      MatrixRM y_cpu;
      LinearSaved saved;
      linear_forward(eval, to_m(t.x, t.B, t.in), to_m(t.w, t.out, t.in), nullptr, y_cpu, saved);
      CHECK(saved.forward_only);
      CHECK(saved.x.size() == 0);
      double err = 0, ref = 0;
      for (int64_t i = 0; i < rows * t.out; ++i) {
        err = std::max(err, std::abs(double(ye[size_t(i)]) - double(y_cpu.data()[i])));
        ref = std::max(ref, std::abs(double(y_cpu.data()[i])));
      }
      CHECK(err <= 1e-4 * (1.0 + ref));
      if (rows % 16 == 0) {
        lin.forward(ctx, x, w, nullptr, y_train, st_train, kAlloc);
        cuda::check(cudaDeviceSynchronize(), "test sync");
        CHECK(same_bits(ye, dev_download(y_train.data, y_train.size())));
      }
    }
  }
}

}  // namespace fp4lab::train
