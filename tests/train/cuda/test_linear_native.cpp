// CudaLinear's native-operand route (train/cuda/linear_native.hpp) under the
// nvfp4 recipe with NVFP4-stored weights (LayerPlan::w_stored a StoredNvfp4).
//
// The route rule (host suite, no GPU): which GEMM takes which path.
// The wiring (GPU): the route forced with GemmPath::hopper_bf16
// (CudaLinear::force_native_route) runs every step of it but cuBLASLt's FP4
// call, on any GPU. For each layer shape (odd ones, W a tensor at a byte
// offset of a 5-tensor store that is not 256-byte aligned, with and without
// bias, FP32 and BF16 outputs):
//   - the operands handed to quantized_gemm_device, read back in the native
//     hook, equal sim's quantize() bit for bit (codes packed two a byte as
//     sim's pack_fp4, scale codes, g_dec): x / dy by the plan's quantizer and
//     random stream, the forward's W by quantize(nvfp4_2d, W's master) and
//     dgrad's W^T by quantize(nvfp4_2d, W's master transposed); the forward's
//     W codes 256-byte aligned (the copy of a misaligned tensor);
//   - y and dx equal the exact product of those sim operands (double on the
//     host, the global scales included) at a tolerance, and today's BF16
//     route's y and dx at the same tolerance. hopper_bf16 multiplies the same
//     BF16-exact values (decode(code) * block scale) that today's route does,
//     with alpha g_dec(x) * g_dec(W) in the epilogue: only the FP32
//     accumulation order differs, so |y - y_exact| <= ~(k + 2) 2^-24
//     sum_k |x_q||w_q|; the tolerance is (2k + 8) 2^-24 (sum_k |x_q||w_q| + |b|)
//     (FP32), plus 2^-8 (|y_exact| + |b|) for a BF16 output (its roundings);
//   - wgrad (dW, db) is today's BF16 route on either layer: the same bits;
//   - the operand hook (CudaLinear::set_operand_hook) reports the same values
//     on both routes (W's in W's layout).
// A missing alpha (g_dec(x) g_dec(W) ~ 1e-6 for these tensors), W given as
// W^T (the square 32 x 32 layer: same shape, other values; the others: a k
// mismatch, an exception), or y's layout transposed each fail the exact-product check.
// The blackwell_native GEMM itself needs sm_100: never executed here.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "core/bits.hpp"
#include "cuda/device.hpp"
#include "cuda/gemm.hpp"
#include "cuda/shard_cast.hpp"
#include "device_tensors.hpp"
#include "gpu_test_util.hpp"
#include "recipes/linear_plan.hpp"
#include "recipes/recipe.hpp"
#include "sim/packing.hpp"
#include "sim/quantizer.hpp"
#include "train/cuda/cast_store.hpp"
#include "train/cuda/linear.hpp"
#include "train/cuda/linear_native.hpp"

using namespace fp4lab;
using fp4lab::test::dev_upload;
using fp4lab::test::kAlloc;

namespace {

// The store: 5 tensors back to back with gaps, so that a tensor's packed codes start at bytes that are not
// 256-byte (nor 16-byte) aligned. W shapes [out, in]: odd both ways, square, tile-aligned, odd in.
struct Store {
  std::vector<FlatTensor> tensors;
  std::vector<float> master;  // the FP32 masters, flat
};
Store make_store() {
  Store s;
  const int64_t shapes[][2] = {{5, 3}, {37, 45}, {32, 32}, {48, 64}, {20, 33}};
  int64_t at = 0;
  for (const auto& sh : shapes) {
    s.tensors.push_back({sh[0], sh[1], at});
    at += sh[0] * sh[1] + 3;
  }
  s.master.assign(size_t(at), 0.0f);
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (float& v : s.master) v = nd(g);
  return s;
}

void cast_whole(cuda::DeviceShardCast& cast, const std::vector<float>& flat) {
  cuda::DeviceBuffer<float> d;
  d.upload(flat);
  const ShardRange all{0, int64_t(flat.size())};
  cast.partial_amax(d.data(), all);
  cast.compute_scales();
  cast.cast(d.data(), all);
  cuda::check(cudaDeviceSynchronize(), "cast");
}

std::vector<float> slice(const std::vector<float>& flat, const FlatTensor& t) {
  return std::vector<float>(flat.begin() + t.offset, flat.begin() + t.offset + t.rows * t.cols);
}
std::vector<float> transpose(const std::vector<float>& m, int64_t rows, int64_t cols) {
  std::vector<float> t(m.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = m[size_t(r * cols + c)];
  return t;
}
std::vector<uint8_t> download_bytes(const uint8_t* p, int64_t n) {
  std::vector<uint8_t> h(static_cast<size_t>(n));
  if (n > 0) cuda::check(cudaMemcpy(h.data(), p, size_t(n), cudaMemcpyDeviceToHost), "D2H bytes");
  return h;
}
std::vector<float> download_bf16(const uint16_t* p, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  if (n > 0) cuda::check(cudaMemcpy(h.data(), p, size_t(n) * 2, cudaMemcpyDeviceToHost), "D2H bf16");
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = bits_float(uint32_t(h[i]) << 16);
  return v;
}

// One operand the native hook saw, read back when reported.
struct Seen {
  cuda::QuantOperand q;
  cuda::GemmPath path;
  std::vector<uint8_t> codes, scale_codes;
  float g = 0.0f;
  bool aligned = false;  // codes at a kNativeAlign-aligned address
};
void record(std::map<Operand, Seen>& seen, Operand op, const cuda::QuantOperand& q, cuda::GemmPath path) {
  Seen s{q, path, {}, {}, 0.0f, false};
  int64_t sr = 0, sc = 0;
  cuda::scale_grid(q.spec, q.rows, q.cols, sr, sc);
  s.codes = download_bytes(q.codes, q.rows * ((q.cols + 1) / 2));
  s.scale_codes = download_bytes(q.scale_codes, sr * sc);
  cuda::check(cudaMemcpy(&s.g, q.global_decode, 4, cudaMemcpyDeviceToHost), "D2H g_dec");
  s.aligned = reinterpret_cast<uintptr_t>(q.codes) % train::linear_detail::kNativeAlign == 0;
  seen[op] = std::move(s);
}

// The operand the native hook saw equals sim's quantization, bit for bit.
void check_operand(const std::map<Operand, Seen>& seen, Operand op, const QuantizedTensor& sim, cuda::GemmPath path) {
  CAPTURE(int(op));
  const auto it = seen.find(op);
  REQUIRE(it != seen.end());
  const Seen& s = it->second;
  CHECK(s.path == path);
  CHECK(s.q.spec == sim.spec);
  CHECK(s.q.rows == sim.rows);
  CHECK(s.q.cols == sim.cols);
  CHECK(s.q.layout == cuda::CodeLayout::packed4);
  CHECK(test::same_bytes("codes vs sim's quantize (packed)", s.codes, pack_fp4(sim.codes.data(), sim.rows, sim.cols)));
  CHECK(test::same_bytes("scale codes vs sim's quantize", s.scale_codes, sim.scale_codes));
  CHECK(float_bits(s.g) == float_bits(sim.global_decode));
}

// y [m, n] = a [m, k] b [n, k]^T in double (the values multiplied: sim's dequant) and sum_k |a||b|.
struct Exact {
  std::vector<double> y, mag;
};
Exact exact_product(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t n, int64_t k) {
  Exact e{std::vector<double>(size_t(m * n)), std::vector<double>(size_t(m * n))};
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, g = 0;
      for (int64_t t = 0; t < k; ++t) {
        const double p = double(a[size_t(i * k + t)]) * double(b[size_t(j * k + t)]);
        s += p;
        g += std::fabs(p);
      }
      e.y[size_t(i * n + j)] = s;
      e.mag[size_t(i * n + j)] = g;
    }
  return e;
}

// got [m, n] (bias b[j] added to column j when given) within the tolerance of the file comment of e.
bool near_exact(const char* what, const std::vector<float>& got, const Exact& e, int64_t n, int64_t k,
                const std::vector<float>& b, bool bf16) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double bias = b.empty() ? 0.0 : double(b[i % size_t(n)]);
    const double want = e.y[i] + bias;
    double tol = double(2 * k + 8) * std::ldexp(1.0, -24) * (e.mag[i] + std::fabs(bias));
    if (bf16) tol += std::ldexp(1.0, -8) * (std::fabs(want) + std::fabs(bias));
    if (!(std::fabs(double(got[i]) - want) <= tol)) {
      std::printf("%s: element %zu: got %.9g, exact %.9g, tolerance %.3g\n", what, i, double(got[i]), want, tol);
      return false;
    }
  }
  return true;
}
bool near_each_other(const char* what, const std::vector<float>& a, const std::vector<float>& r, const Exact& e,
                     int64_t n, int64_t k, const std::vector<float>& b, bool bf16) {
  for (size_t i = 0; i < a.size(); ++i) {
    const double bias = b.empty() ? 0.0 : double(b[i % size_t(n)]);
    double tol = 2.0 * double(2 * k + 8) * std::ldexp(1.0, -24) * (e.mag[i] + std::fabs(bias));
    if (bf16) tol += std::ldexp(1.0, -7) * (std::fabs(e.y[i] + bias) + std::fabs(bias));
    if (!(std::fabs(double(a[i]) - double(r[i])) <= tol)) {
      std::printf("%s: element %zu: native route %.9g, BF16 route %.9g, tolerance %.3g\n", what, i, double(a[i]),
                  double(r[i]), tol);
      return false;
    }
  }
  return true;
}

// One forward and backward of a layer: y, dx (FP32, or decoded from their BF16 outputs), dW, db.
struct Pass {
  std::vector<float> y, dx, dw, db;
};
Pass run_layer(train::CudaLinear& lin, const train::LayerPlan& lp, const train::Tensor& w,
               const std::vector<float>& xh, const std::vector<float>& dyh, const std::vector<float>& bh, int64_t batch,
               bool bf16_out) {
  const int64_t out = w.rows, in = w.cols;
  const train::Tensor x = dev_upload(xh, batch, in), dy = dev_upload(dyh, batch, out);
  const train::Tensor b = dev_upload(bh.empty() ? std::vector<float>(size_t(out), 0.0f) : bh, 1, out);
  train::Tensor y, dx;
  train::Tensor dw = dev_upload(std::vector<float>(size_t(out * in), 0.0f), out, in);
  train::Tensor db = dev_upload(std::vector<float>(size_t(out), 0.0f), 1, out);
  cuda::DeviceBuffer<uint16_t> y16(size_t(batch * out) + 1), dx16(size_t(batch * in) + 1);
  std::unique_ptr<train::LinearState> st;
  lin.forward(lp, x, w, bh.empty() ? nullptr : b.data, y, st, kAlloc, nullptr, bf16_out ? y16.data() : nullptr);
  lin.backward(lp, *st, w, dy, dx, dw, db.data, kAlloc, nullptr, bf16_out ? dx16.data() : nullptr);
  cuda::check(cudaDeviceSynchronize(), "layer");
  Pass p;
  p.y = bf16_out ? download_bf16(y16.data(), batch * out) : test::dev_download(y.data, batch * out);
  p.dx = bf16_out ? download_bf16(dx16.data(), batch * in) : test::dev_download(dx.data, batch * in);
  p.dw = test::dev_download(dw.data, out * in);
  p.db = test::dev_download(db.data, out);
  return p;
}

}  // namespace

TEST_CASE("CudaLinear native route: the rule (NVFP4-stored W taken as it is, NVFP4 [1,16] other operand, sm_100+)" *
          doctest::test_suite("host")) {
  using train::linear_detail::native_route;
  const Recipe r = recipe_by_name("nvfp4");
  const QuantizerSpec nvfp4_2d = quantizer_by_name("nvfp4_2d");
  REQUIRE(r.operand(Operand::fwd_w).has_value());
  REQUIRE(*r.operand(Operand::fwd_w) == nvfp4_2d);  // the stored cast's spec is the recipe's W quantizer
  LinearContext ctx;
  ctx.recipe = &r;
  ctx.weight_cast = &nvfp4_2d;
  train::StoredNvfp4 stored;  // fields unused: the rule reads no device memory
  const train::LayerPlan lp{ctx, linear_plan(ctx), &stored};
  const auto x_q = *lp.plan.operand(Operand::fwd_x).quantizer, dy_q = *lp.plan.operand(Operand::dgrad_grad_y).quantizer;
  CHECK_FALSE(lp.plan.operand(Operand::fwd_w).changes());  // W as it is: the stored cast is the operand
  CHECK_FALSE(lp.plan.operand(Operand::dgrad_w).changes());
  for (const auto& [w_op, q] : {std::pair{Operand::fwd_w, x_q}, std::pair{Operand::dgrad_w, dy_q}}) {
    CAPTURE(int(w_op));
    // Hopper (the default route everywhere we run): the BF16 decode.
    CHECK_FALSE(native_route(lp, w_op, q, 64, 90, false).has_value());
    // sm_100: the native GEMM, W the stored cast.
    const auto bw = native_route(lp, w_op, q, 64, 100, false);
    REQUIRE(bw.has_value());
    CHECK(bw->path == cuda::GemmPath::blackwell_native);
    CHECK(bw->w == &stored);
    CHECK(bw->other == q);
    CHECK_FALSE(native_route(lp, w_op, q, 45, 100, false).has_value());  // k not a multiple of 16
    // The test switch: the same route with hopper_bf16 on any GPU and any k.
    for (int cc : {90, 100})
      for (int64_t k : {45, 64}) {
        const auto f = native_route(lp, w_op, q, k, cc, true);
        REQUIRE(f.has_value());
        CHECK(f->path == cuda::GemmPath::hopper_bf16);
      }
    // Not an NVFP4 [1,16] other operand: the BF16 route, forced or not.
    CHECK_FALSE(native_route(lp, w_op, std::nullopt, 64, 100, true).has_value());
    CHECK_FALSE(native_route(lp, w_op, nvfp4_2d, 64, 100, true).has_value());
    CHECK_FALSE(native_route(lp, w_op, quantizer_by_name("mxfp4"), 64, 100, true).has_value());
    // No stored cast, or W's values not the cast: the BF16 route.
    const train::LayerPlan no_store{ctx, lp.plan, nullptr};
    CHECK_FALSE(native_route(no_store, w_op, q, 64, 100, true).has_value());
    LinearContext master = ctx;
    master.weight_cast = nullptr;
    const train::LayerPlan fp32_primary{master, linear_plan(master), &stored};
    CHECK(fp32_primary.plan.operand(w_op).changes());
    CHECK_FALSE(native_route(fp32_primary, w_op, q, 64, 100, true).has_value());
  }
}

TEST_CASE("CudaLinear native route, forced with hopper_bf16: operands = sim's quantize, y / dx = the exact product "
          "and the BF16 route's, wgrad unchanged") {
  const Store s = make_store();
  cuda::DeviceShardCast cast(s.tensors);
  cast_whole(cast, s.master);
  cuda::DeviceBuffer<float> deq;
  deq.upload(s.master);
  cast.dequantize(deq.data());
  const std::vector<float> stored_values = deq.download();  // W's values: quantize(nvfp4_2d, master).dequant

  const Recipe r = recipe_by_name("nvfp4");
  const QuantizerSpec nvfp4_2d = quantizer_by_name("nvfp4_2d");
  REQUIRE(*r.operand(Operand::fwd_w) == nvfp4_2d);
  const bool blackwell = cuda::compute_capability() >= 100;
  bool misaligned = false;
  for (size_t t = 1; t < s.tensors.size(); ++t) {
    const FlatTensor& ft = s.tensors[t];
    const int64_t out = ft.rows, in = ft.cols;
    CAPTURE(out);
    CAPTURE(in);
    train::StoredNvfp4 stored;
    stored.form = cast.packed_tensor(t);
    misaligned = misaligned || reinterpret_cast<uintptr_t>(stored.form.packed) % train::linear_detail::kNativeAlign != 0;
    const std::vector<float> w_master = slice(s.master, ft);
    const train::Tensor w = dev_upload(slice(stored_values, ft), out, in);
    const QuantizedTensor qw = quantize(nvfp4_2d, MatrixView<const float>(w_master.data(), out, in));
    const std::vector<float> w_master_t = transpose(w_master, out, in);
    const QuantizedTensor qwt = quantize(nvfp4_2d, MatrixView<const float>(w_master_t.data(), in, out));
    for (const int64_t batch : {int64_t(19), int64_t(32)})
      for (const bool with_bias : {false, true})
        for (const bool bf16_out : {false, true}) {
          CAPTURE(batch);
          CAPTURE(with_bias);
          CAPTURE(bf16_out);
          LinearContext ctx;
          ctx.recipe = &r;
          ctx.seed = 17;
          ctx.layer_id = uint64_t(t);
          ctx.step = 3;
          ctx.weight_cast = &nvfp4_2d;
          const train::LayerPlan lp{ctx, linear_plan(ctx), &stored};
          const uint32_t seed = uint32_t(100 * t + uint32_t(batch) + (with_bias ? 7 : 0));
          const std::vector<float> xh = test::varied_randn(batch, in, seed, 4);
          const std::vector<float> dyh = test::varied_randn(batch, out, seed + 1, 4);
          std::vector<float> bh;
          if (with_bias) bh = test::varied_randn(1, out, seed + 2, 2);

          train::CudaLinear bf16_route, native;
          std::map<Operand, Seen> seen_default, seen;
          // The operand hook's values (W's in W's layout on both routes): the same on both.
          std::map<Operand, std::vector<float>> values_default, values;
          bf16_route.set_operand_hook([&](Operand op, const float* v, int64_t rows, int64_t cols) {
            values_default[op] = test::dev_download(v, rows * cols);
          });
          native.set_operand_hook([&](Operand op, const float* v, int64_t rows, int64_t cols) {
            values[op] = test::dev_download(v, rows * cols);
          });
          bf16_route.set_native_hook([&](Operand op, const cuda::QuantOperand& q, cuda::GemmPath p) {
            record(seen_default, op, q, p);
          });
          native.force_native_route(true);
          native.set_native_hook([&](Operand op, const cuda::QuantOperand& q, cuda::GemmPath p) { record(seen, op, q, p); });
          const Pass ref = run_layer(bf16_route, lp, w, xh, dyh, bh, batch, bf16_out);
          const Pass got = run_layer(native, lp, w, xh, dyh, bh, batch, bf16_out);

          // The route taken: forced, all four operands; by default none on Hopper (sm_100: the native GEMM).
          CHECK(seen.size() == 4);
          if (!blackwell) CHECK(seen_default.empty());
          if (blackwell) CHECK(seen_default.size() == size_t((in % 16 == 0 ? 2 : 0) + (out % 16 == 0 ? 2 : 0)));

          // The operands, independently: sim's quantize of x / dy (the plan's quantizer and stream) and of W's
          // master and its transpose (the stored cast as it is, and its column-wise form).
          const OperandPlan& fx = lp.plan.operand(Operand::fwd_x);
          const OperandPlan& dgy = lp.plan.operand(Operand::dgrad_grad_y);
          const QuantizedTensor qx = quantize(*fx.quantizer, MatrixView<const float>(xh.data(), batch, in), fx.stream);
          const QuantizedTensor qdy =
              quantize(*dgy.quantizer, MatrixView<const float>(dyh.data(), batch, out), dgy.stream);
          check_operand(seen, Operand::fwd_x, qx, cuda::GemmPath::hopper_bf16);
          check_operand(seen, Operand::fwd_w, qw, cuda::GemmPath::hopper_bf16);
          check_operand(seen, Operand::dgrad_grad_y, qdy, cuda::GemmPath::hopper_bf16);
          check_operand(seen, Operand::dgrad_w, qwt, cuda::GemmPath::hopper_bf16);
          CHECK(seen[Operand::fwd_w].aligned);  // a misaligned tensor's codes were copied (kNativeAlign)

          // y = Q(x) Q(W)^T (+ b) and dx = Q(dy) Q(W): the exact product of sim's operands (the global scales
          // in their dequant: the GEMM's alpha), in the layer's layout ([B, out], [B, in] row-major).
          const Exact ey = exact_product(qx.dequant, qw.dequant, batch, out, in);
          const Exact edx = exact_product(qdy.dequant, qwt.dequant, batch, in, out);
          CHECK(near_exact("y vs the exact product", got.y, ey, out, in, bh, bf16_out));
          CHECK(near_exact("dx vs the exact product", got.dx, edx, in, out, {}, bf16_out));
          if (!blackwell) {  // today's route: the BF16 decode (the native GEMM on sm_100)
            CHECK(near_exact("BF16 route's y vs the exact product", ref.y, ey, out, in, bh, bf16_out));
            CHECK(near_exact("BF16 route's dx vs the exact product", ref.dx, edx, in, out, {}, bf16_out));
          }
          CHECK(near_each_other("y", got.y, ref.y, ey, out, in, bh, bf16_out));
          CHECK(near_each_other("dx", got.dx, ref.dx, edx, in, out, {}, bf16_out));
          CHECK(values.size() == 6);
          CHECK(values_default.size() == 6);
          for (const auto& [op, v] : values_default) {
            CAPTURE(int(op));
            CHECK(test::same_bits("operand hook: native route vs BF16 route", values[op], v));
          }
          // wgrad is the BF16 route on both layers: the same operands (made in one dual pass or two single
          // ones: the same bits), the same GEMM.
          CHECK(test::same_bits("dW", got.dw, ref.dw));
          CHECK(test::same_bits("db", got.db, ref.db));
        }
  }
  CHECK(misaligned);  // the case the aligned copy is for was exercised
}
