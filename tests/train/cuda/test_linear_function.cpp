// The standalone layer over caller memory (train/linear_function.hpp) on the
// CUDA backend, with device pointers the test owns: bit for bit the CUDA
// backend's own linear layer on owned tensors (the trainer's path), run to run
// the same bits (SR included), within FP32 accumulation tolerance of the CPU
// standalone layer (the operands agree bit for bit, train/cuda/linear.hpp; only
// GEMM summation orders differ), db equal to the CPU's (<= 256 rows).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/device.hpp"
#include "recipes/recipe.hpp"
#include "train/backend.hpp"
#include "train/linear_function.hpp"

using namespace fp4lab;
using namespace fp4lab::train;

namespace {

using Vec = std::vector<float>;
constexpr int64_t kRows = 40, kIn = 48, kOut = 24;
constexpr uint64_t kSeed = 99, kLayer = 5, kStep = 11;

Vec randv(size_t n, uint32_t seed, float sigma) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  Vec v(n);
  for (float& f : v) f = d(g);
  return v;
}

struct Inputs {
  Vec x = randv(size_t(kRows * kIn), 1, 1.0f), w = randv(size_t(kOut * kIn), 2, 0.1f), b = randv(size_t(kOut), 3, 1.0f),
      dy = randv(size_t(kRows * kOut), 4, 1e-3f);
};

struct Outs {
  Vec y, dx, dw, db;
};

fp4lab::cuda::DeviceBuffer<float> upload(const Vec& v) {
  fp4lab::cuda::DeviceBuffer<float> d(v.size());
  fp4lab::cuda::check(cudaMemcpy(d.data(), v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload");
  return d;
}
Vec download(const float* d, size_t n) {
  Vec v(n);
  fp4lab::cuda::check(cudaMemcpy(v.data(), d, n * 4, cudaMemcpyDeviceToHost), "download");
  return v;
}

Outs run_function(const std::string& backend, const std::string& recipe, const Inputs& in, uint64_t seed) {
  LinearFunction f(LinearFunctionOptions{backend, recipe, "blocks.0.fc", kLayer, seed, 0});
  Outs o;
  if (backend == "cpu") {
    o.y.resize(size_t(kRows * kOut)), o.dx.resize(in.x.size()), o.dw.resize(in.w.size()), o.db.resize(in.b.size());
    auto s = f.forward(kStep, in.x.data(), kRows, kIn, in.w.data(), kOut, in.b.data(), o.y.data());
    f.backward(*s, in.w.data(), in.dy.data(), o.dx.data(), o.dw.data(), o.db.data());
    return o;
  }
  auto x = upload(in.x), w = upload(in.w), b = upload(in.b), dy = upload(in.dy);
  auto garbage = upload(Vec(in.w.size(), NAN));  // dW and db are written, not accumulated
  fp4lab::cuda::DeviceBuffer<float> y(size_t(kRows * kOut)), dx(in.x.size()), db(in.b.size());
  auto s = f.forward(kStep, x.data(), kRows, kIn, w.data(), kOut, b.data(), y.data());
  f.backward(*s, w.data(), dy.data(), dx.data(), garbage.data(), db.data());
  f.synchronize();
  o.y = download(y.data(), y.size());
  o.dx = download(dx.data(), dx.size());
  o.dw = download(garbage.data(), garbage.size());
  o.db = download(db.data(), db.size());
  return o;
}

// The trainer's path: the CUDA backend on owned tensors, dW/db zeroed and accumulated into.
Outs run_backend(const std::string& recipe, const Inputs& in) {
  const Recipe r = parse_recipe(recipe);
  auto be = make_backend("cuda");
  LinearContext ctx{&r, kSeed, kLayer, kStep, "blocks.0.fc", true};
  train::Tensor x = be->empty(kRows, kIn), w = be->empty(kOut, kIn), dy = be->empty(kRows, kOut), b = be->empty(1, kOut);
  be->upload(in.x.data(), x), be->upload(in.w.data(), w), be->upload(in.dy.data(), dy), be->upload(in.b.data(), b);
  train::Tensor y, dx, dw = be->zeros(kOut, kIn), db = be->zeros(1, kOut);
  std::unique_ptr<LinearState> st;
  be->linear_forward(ctx, x, w, b.data, y, st);
  be->linear_backward(ctx, *st, w, dy, dx, dw, db.data);
  Outs o;
  o.y.resize(size_t(y.size())), o.dx.resize(size_t(dx.size())), o.dw.resize(size_t(dw.size())), o.db.resize(size_t(kOut));
  be->download(y, o.y.data()), be->download(dx, o.dx.data()), be->download(dw, o.dw.data()), be->download(db, o.db.data());
  return o;
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// max |a - b| <= tol * (1 + max |a|)
bool close(const Vec& a, const Vec& b, double tol) {
  double m = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i]))), d = std::max(d, double(std::fabs(a[i] - b[i])));
  return a.size() == b.size() && d <= tol * (1 + m);
}

}  // namespace

TEST_CASE("LinearFunction on cuda: the CUDA backend's layer bit for bit, run to run, the CPU's within FP32 tolerance") {
  const Inputs in;
  for (const char* name : {"fp32", "mx_baseline", "tetrajet", "nvfp4", "fp4tk_tetrajet", "nvfp4_fwd_mxfp8_bwd"}) {
    CAPTURE(name);
    const Outs f = run_function("cuda", name, in, kSeed), g = run_function("cuda", name, in, kSeed);
    const Outs t = run_backend(name, in);
    for (auto [a, b] : {std::pair{&f.y, &t.y}, {&f.dx, &t.dx}, {&f.dw, &t.dw}, {&f.db, &t.db}}) CHECK(same_bits(*a, *b));
    for (auto [a, b] : {std::pair{&f.y, &g.y}, {&f.dx, &g.dx}, {&f.dw, &g.dw}, {&f.db, &g.db}}) CHECK(same_bits(*a, *b));
    const Outs c = run_function("cpu", name, in, kSeed);
    CHECK(close(c.y, f.y, 1e-4));
    CHECK(close(c.dx, f.dx, 1e-4));
    CHECK(close(c.dw, f.dw, 1e-4));
    CHECK(same_bits(c.db, f.db));
  }
}
