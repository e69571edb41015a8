// The CPU backend: Eigen for the GEMM-shaped work, OpenMP over independent rows
// (or fixed blocks of rows) so results do not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include <Eigen/Core>

#include "train/backend.hpp"
#include "train/bf16_codes.hpp"
#include "train/cpu/attention_flash.hpp"
#include "train/cpu/bf16.hpp"
#include "train/cpu/linear.hpp"
#include "train/gelu_math.hpp"
#include "train/mx_rows.hpp"
#include "core/error.hpp"
#include "core/philox.hpp"

namespace fp4lab::train {

namespace {

// memcpy of n floats split over the OpenMP threads (a serial copy of an
// activation leaves the other threads idle).
void parallel_copy(float* dst, const float* src, int64_t n) {
  constexpr int64_t kChunk = int64_t(1) << 14;
#pragma omp parallel for schedule(static) if (n > kChunk)
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) std::memcpy(dst + c0, src + c0, size_t(std::min(kChunk, n - c0)) * 4);
}

using Stride = Eigen::OuterStride<>;
using ConstMap = Eigen::Map<const MatrixRM, 0, Stride>;
using Map = Eigen::Map<MatrixRM, 0, Stride>;

constexpr int64_t kRowBlock = 256;  // fixed row blocking of column reductions

// The Backend contract's shapes (train/backend.hpp): the models size every tensor from a checked config, so
// a mismatch is a bug of the caller (FP4LAB_CHECK: InternalError with file:line, exit 3).
void check_same(const char* fn, const Tensor& a, const Tensor& b) {
  FP4LAB_CHECK(a.rows == b.rows && a.cols == b.cols,
               std::string(fn) + ": shape mismatch [" + std::to_string(a.rows) + ", " + std::to_string(a.cols) +
                   "] vs [" + std::to_string(b.rows) + ", " + std::to_string(b.cols) + "]");
}

// Column sums of f(r, c) over all rows, deterministically: fixed blocks of
// kRowBlock rows summed in row order (float64), then the block partials in
// block order. out[c] += result.
template <class F>
void column_reduce(int64_t rows, int64_t cols, float* out, F f) {
  const int64_t nb = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<double> part(size_t(nb * cols), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; ++b) {
    double* p = part.data() + b * cols;
    const int64_t r1 = std::min(rows, (b + 1) * kRowBlock);
    for (int64_t r = b * kRowBlock; r < r1; ++r)
      for (int64_t c = 0; c < cols; ++c) p[c] += double(f(r, c));
  }
  for (int64_t c = 0; c < cols; ++c) {
    double s = 0.0;
    for (int64_t b = 0; b < nb; ++b) s += part[size_t(b * cols + c)];
    out[c] += float(s);
  }
}

// Element i of a dropout site is dropped iff random_bits(seed, stream, i) <
// threshold. DropoutWords draws those words for a run of elements at once through
// core's random_words (whole Philox groups, eight at a time with AVX2): the same
// bits as random_bits element by element, at a fraction of the cost.
// The dropout rule of one element with random word w (the GPU's drop1).
inline float drop(float v, uint32_t w, uint32_t threshold, float keep_scale) {
  return w < threshold ? 0.0f : v * keep_scale;
}
class DropoutWords {
 public:
  // The words of elements first .. first + n - 1 of key's stream (valid until the next call).
  const uint32_t* get(DropoutKey key, uint64_t first, uint64_t n) {
    words_.resize(size_t(n));
    scratch_.resize(size_t(4 * ((n + 3) / 4 + 1)));
    random_words(key.seed, key.stream, first, n, words_.data(), scratch_.data());
    return words_.data();
  }

 private:
  std::vector<uint32_t> words_, scratch_;
};

struct CpuLinearState : LinearState {
  LinearSaved saved;
};

// r() of n floats in place (train/cpu/bf16.hpp): in the calling thread (a
// row, inside a parallel loop), or split over the OpenMP threads (_n).
void round_bf16_row(float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = round_bf16_f32(p[i]);
}
void round_bf16_n(float* p, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = round_bf16_f32(p[i]);
}
void round_bf16_m(MatrixRM& m) { round_bf16_n(m.data(), m.size()); }

// t's elements copied into an (aligned) matrix: Eigen's small products take
// alignment-dependent paths, so the operands' addresses must not matter.
MatrixRM to_matrix(const Tensor& t) { return ConstMap(t.data, t.rows, t.cols, Stride(t.cols)); }

// The bytes of the backend's tensors in use, now and at the peak since the last reset (Backend::device_memory;
// on the CPU there is no cache: reserved = in use). Shared with every tensor's deleter, which may run on
// another thread (a thread rank's tensors outlive nothing of it, but a view may be dropped anywhere).
struct TensorBytes {
  std::atomic<int64_t> in_use{0}, peak{0};
  void acquire(int64_t b) {
    const int64_t now = in_use.fetch_add(b) + b;
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
  void release(int64_t b) { in_use.fetch_sub(b); }
};

// A linear layer's output m into out: out takes m's memory (no copy) unless
// out is already allocated with m's shape (the caller may hold views of it),
// then m is copied into it. The memory taken is counted in `bytes` while the tensor holds it.
void take_result(std::shared_ptr<MatrixRM> m, Tensor& out, const std::shared_ptr<TensorBytes>& bytes) {
  if (out.data != nullptr && out.rows == m->rows() && out.cols == m->cols()) {
    parallel_copy(out.data, m->data(), out.size());
    return;
  }
  Tensor t;
  t.rows = m->rows();
  t.cols = m->cols();
  const int64_t b = t.size() * int64_t(sizeof(float));
  bytes->acquire(b);
  float* data = m->data();
  t.mem = std::shared_ptr<float[]>(data, [m = std::move(m), bytes, b](float*) mutable {
    bytes->release(b);
    m.reset();
  });
  t.data = t.mem.get();
  out = std::move(t);
}

// The backend's OpenMP thread count for the duration of one operation (the
// calling thread's setting is restored after it), so that two CPU backends in
// one process each use their own. threads <= 0: OpenMP's default, untouched.
class ThreadCount {
 public:
  explicit ThreadCount(int threads) : saved_(omp_get_max_threads()), set_(threads > 0) {
    if (set_) omp_set_num_threads(threads);
  }
  ~ThreadCount() {
    if (set_) omp_set_num_threads(saved_);
  }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
  bool set_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads) {}
  std::string name() const override { return "cpu"; }
  bool host_tensors() const override { return true; }
  std::unique_ptr<CastStore> make_cast_store(Storage s, std::span<const FlatTensor> tensors) override {
    return s == Storage::nvfp4_2d ? make_host_cast_store(tensors) : make_host_element_store(s, tensors);
  }
  bool implements(ActivationPrecision) const override { return true; }

  Tensor empty(int64_t rows, int64_t cols) override {
    FP4LAB_CHECK(rows >= 0 && cols >= 0, "cpu backend: negative tensor shape");
    Tensor t;
    t.rows = rows;
    t.cols = cols;
    const int64_t n = std::max<int64_t>(1, rows * cols), b = n * int64_t(sizeof(float));
    bytes_->acquire(b);
    t.mem = std::shared_ptr<float[]>(new float[size_t(n)], [bytes = bytes_, b](float* q) {
      bytes->release(b);
      delete[] q;
    });
    t.data = t.mem.get();
    return t;
  }
  // The tensors' bytes (host memory; reserved = in use: no allocator cache of the backend's own).
  std::optional<DeviceMemory> device_memory() override {
    const int64_t peak = bytes_->peak.load(), now = bytes_->in_use.load();
    return DeviceMemory{peak, peak, now};
  }
  void reset_device_memory_peaks() override { bytes_->peak.store(bytes_->in_use.load()); }
  void fill(Tensor& t, float v) override {
    const ThreadCount use(threads_);
    constexpr int64_t kChunk = int64_t(1) << 14;
    const int64_t n = t.size();
#pragma omp parallel for schedule(static) if (n > kChunk)
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) std::fill(t.data + c0, t.data + std::min(n, c0 + kChunk), v);
  }
  void upload(const float* host, Tensor& t) override { std::memcpy(t.data, host, size_t(t.size()) * 4); }
  void download(const Tensor& t, float* host) override { std::memcpy(host, t.data, size_t(t.size()) * 4); }
  void copy(const Tensor& src, Tensor& dst) override {
    const ThreadCount use(threads_);
    FP4LAB_CHECK(src.size() == dst.size(), "cpu backend: copy between tensors of different sizes");
    parallel_copy(dst.data, src.data, src.size());
  }
  void copy_cols(const Tensor& src, int64_t sc, Tensor& dst, int64_t dc, int64_t n) override {
    const ThreadCount use(threads_);
    if (src.rows != dst.rows || sc + n > src.cols || dc + n > dst.cols)
      throw Error("cpu backend: copy_cols out of range");
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < src.rows; ++r) std::memcpy(dst.row(r) + dc, src.row(r) + sc, size_t(n) * 4);
  }

  using Backend::linear_forward;
  using Backend::linear_backward;
  // The CPU states no input needs (Backend::linear_input_needs), so no producer writes outputs for it, and
  // stores no BF16 (stores_bf16 false), so y_out / dx_out never ask for the BF16 alone.
  void linear_forward(const LayerPlan& l, const Tensor& x, const Tensor& w, const float* b, Tensor& y,
                      std::unique_ptr<LinearState>& state, const ProducerOutputs*, ProducerOutputs* y_out) override {
    const ThreadCount use(threads_);
    FP4LAB_CHECK(x.data || x.size() == 0, "cpu linear_forward: x has no FP32 values");
    FP4LAB_CHECK(!y_out || y_out->f32, "cpu linear_forward: the cpu backend stores no BF16-only output");
    auto st = std::make_unique<CpuLinearState>();
    auto ym = std::make_shared<MatrixRM>();
    if (bf16()) {  // x read as r(x), y = r(acc + r(b)) (backend.hpp)
      MatrixRM xr = to_matrix(x);
      round_bf16_m(xr);
      std::vector<float> br;
      if (b) {
        br.assign(b, b + w.rows);
        round_bf16_n(br.data(), w.rows);
      }
      fp4lab::linear_forward(l.ctx, l.plan, std::move(xr), to_matrix(w), b ? br.data() : nullptr, *ym, st->saved);
      round_bf16_m(*ym);
    } else {
      fp4lab::linear_forward(l.ctx, l.plan, to_matrix(x), to_matrix(w), b, *ym, st->saved);
    }
    take_result(std::move(ym), y, bytes_);
    state = std::move(st);
  }
  void linear_backward(const LayerPlan& l, const LinearState& state, const Tensor& w, const Tensor& dy,
                       Tensor& dx, Tensor& dw_acc, float* db_acc, const ProducerOutputs*,
                       ProducerOutputs* dx_out) override {
    const ThreadCount use(threads_);
    FP4LAB_CHECK(dy.data || dy.size() == 0, "cpu linear_backward: dy has no FP32 values");
    FP4LAB_CHECK(!dx_out || dx_out->f32, "cpu linear_backward: the cpu backend stores no BF16-only output");
    const auto& st = dynamic_cast<const CpuLinearState&>(state);
    auto dxm = std::make_shared<MatrixRM>();
    MatrixRM dwm;
    std::vector<float> db;
    if (db_acc) db.assign(size_t(w.rows), 0.0f);
    MatrixRM dym = to_matrix(dy);
    if (bf16()) round_bf16_m(dym);  // dy read as r(dy)
    fp4lab::linear_backward(l.ctx, l.plan, st.saved, to_matrix(w), std::move(dym), *dxm, dwm,
                            db_acc ? db.data() : nullptr);
    if (bf16()) {  // dx = r(acc); dW and db: the BF16 gradients, widened into the FP32 accumulators
      round_bf16_m(*dxm);
      round_bf16_m(dwm);
      round_bf16_n(db.data(), int64_t(db.size()));
    }
    take_result(std::move(dxm), dx, bytes_);
    check_same("linear_backward dW", w, dw_acc);
    float* d = dw_acc.data;
    const float* s = dwm.data();
    const int64_t n = dw_acc.size();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
    if (db_acc)
      for (int64_t i = 0; i < w.rows; ++i) db_acc[i] += db[size_t(i)];
  }

  void layernorm_forward(const Tensor& x, const float* gamma, const float* beta, float eps, Tensor& y, Tensor& mean,
                         Tensor& rstd, ProducerOutputs*) override {
    const ThreadCount use(threads_);
    const int64_t n = x.rows, c = x.cols;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x.row(r);
      double s = 0.0;
      for (int64_t j = 0; j < c; ++j) s += xr[j];
      const double mu = s / double(c);
      double v = 0.0;
      for (int64_t j = 0; j < c; ++j) v += (xr[j] - mu) * (xr[j] - mu);
      const float rs = float(1.0 / std::sqrt(v / double(c) + double(eps)));
      const float m = float(mu);
      mean.data[r] = m;
      rstd.data[r] = rs;
      float* yr = y.row(r);
      for (int64_t j = 0; j < c; ++j) {
        const float h = (xr[j] - m) * rs;
        yr[j] = h * gamma[j] + (beta ? beta[j] : 0.0f);
      }
      if (bf16()) round_bf16_row(yr, c);  // y = r(y)
    }
  }
  void layernorm_backward(const Tensor& dy, const Tensor& x, const float* gamma, const Tensor& mean, const Tensor& rstd,
                          Tensor& dx, float* dgamma, float* dbeta, const Tensor* residual,
                          const ProducerOutputs*) override {
    const ThreadCount use(threads_);
    const int64_t n = x.rows, c = x.cols;
    if (residual) check_same("layernorm_backward residual", x, *residual);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x.row(r);
      const float* gr = dy.row(r);
      const float m = mean.data[r], rs = rstd.data[r];
      double s1 = 0.0, s2 = 0.0;  // sum(g*gamma), sum(g*gamma*xhat)
      for (int64_t j = 0; j < c; ++j) {
        const float gg = gr[j] * gamma[j];
        s1 += gg;
        s2 += double(gg) * double((xr[j] - m) * rs);
      }
      const float a = float(s1 / double(c)), b = float(s2 / double(c));
      float* dr = dx.row(r);
      const float* res = residual ? residual->row(r) : nullptr;
      for (int64_t j = 0; j < c; ++j) {
        const float h = (xr[j] - m) * rs;
        const float d = rs * (gr[j] * gamma[j] - a - h * b);
        dr[j] = res ? d + res[j] : d;
      }
    }
    column_reduce(n, c, dgamma, [&](int64_t r, int64_t j) {
      return dy.data[r * c + j] * ((x.data[r * c + j] - mean.data[r]) * rstd.data[r]);
    });
    if (dbeta) column_reduce(n, c, dbeta, [&](int64_t r, int64_t j) { return dy.data[r * c + j]; });
  }

  // GELU and its derivative: train/gelu_math.hpp (the CUDA kernels' too, so
  // the same bits; vectorised, no libm call). dx may alias dy.
  void gelu_forward(const Tensor& x, Tensor& y, ProducerOutputs*, const ProducerOutputs*) override {
    const ThreadCount use(threads_);
    const int64_t n = x.size();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) y.data[i] = gelu_value(x.data[i]);
    if (bf16()) round_bf16_n(y.data, n);  // y = r(y)
  }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, ProducerOutputs*, const ProducerOutputs*,
                     const ProducerOutputs*) override {
    const ThreadCount use(threads_);
    const int64_t n = x.size();
    const float* xv = x.data;
    const float* g = dy.data;
    float* d = dx.data;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = gelu_grad(xv[i], g[i]);
    if (bf16()) round_bf16_n(d, n);  // dx = r(dx)
  }

  void attention_forward(const AttentionShape& s, const Tensor& qkv, Tensor& out, Tensor& probs, DropoutKey key,
                         ProducerOutputs*, const ProducerOutputs*) override {
    const ThreadCount use(threads_);
    const int64_t T = s.seq, H = s.heads, C = qkv.cols / 3, hd = C / H;
    check_attention(s, qkv);
    if (s.bf16_flash) {  // the CUDA flash kernels' twin (train/cpu/attention_flash.hpp); probs: its saved tensor
      flash_attention_forward_cpu(s, qkv, out, probs, key);
      if (bf16()) round_bf16_n(out.data, out.size());  // out = r(out); the saved O stays FP32
      return;
    }
    const uint32_t thr = dropout_threshold(s.dropout);
    const float keep_scale = s.dropout > 0.0f ? 1.0f / (1.0f - s.dropout) : 1.0f;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < s.batch * H; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* base = qkv.data + b * T * qkv.cols;
      ConstMap q(base + h * hd, T, hd, Stride(qkv.cols));
      ConstMap k(base + C + h * hd, T, hd, Stride(qkv.cols));
      ConstMap v(base + 2 * C + h * hd, T, hd, Stride(qkv.cols));
      Map p(probs.data + bh * T * T, T, T, Stride(T));
      p.noalias() = q * k.transpose();
      for (int64_t i = 0; i < T; ++i) {
        float* pr = p.data() + i * T;
        const int64_t lim = s.causal ? i + 1 : T;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < lim; ++j) {
          pr[j] *= s.scale;
          mx = std::max(mx, pr[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < lim; ++j) {
          pr[j] = std::exp(pr[j] - mx);
          sum += pr[j];
        }
        const float inv = float(1.0 / sum);
        for (int64_t j = 0; j < lim; ++j) pr[j] *= inv;
        for (int64_t j = lim; j < T; ++j) pr[j] = 0.0f;
      }
      Map o(out.data + b * T * C + h * hd, T, hd, Stride(C));
      if (thr == 0) {
        o.noalias() = p * v;
      } else {
        MatrixRM pd(T, T);
        DropoutWords dw;
        const uint32_t* w = dw.get(key, uint64_t(bh * T * T), uint64_t(T * T));
        for (int64_t i = 0; i < T * T; ++i) pd.data()[i] = drop(p.data()[i], w[i], thr, keep_scale);
        o.noalias() = pd * v;
      }
      if (bf16())  // out = r(out): this head's columns
        for (int64_t i = 0; i < T; ++i) round_bf16_row(o.data() + i * C, hd);
    }
  }
  void attention_backward(const AttentionShape& s, const Tensor& qkv, const Tensor& probs, const Tensor& dout,
                          Tensor& dqkv, DropoutKey key, ProducerOutputs*, const ProducerOutputs*,
                          const ProducerOutputs*) override {
    const ThreadCount use(threads_);
    const int64_t T = s.seq, H = s.heads, C = qkv.cols / 3, hd = C / H;
    check_attention(s, qkv);
    if (s.bf16_flash) {
      flash_attention_backward_cpu(s, qkv, probs, dout, dqkv, key);
      if (bf16()) round_bf16_n(dqkv.data, dqkv.size());  // dqkv = r(dqkv)
      return;
    }
    const uint32_t thr = dropout_threshold(s.dropout);
    const float keep_scale = s.dropout > 0.0f ? 1.0f / (1.0f - s.dropout) : 1.0f;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < s.batch * H; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* base = qkv.data + b * T * qkv.cols;
      ConstMap q(base + h * hd, T, hd, Stride(qkv.cols));
      ConstMap k(base + C + h * hd, T, hd, Stride(qkv.cols));
      ConstMap v(base + 2 * C + h * hd, T, hd, Stride(qkv.cols));
      ConstMap p(probs.data + bh * T * T, T, T, Stride(T));
      ConstMap dout_m(dout.data + b * T * C + h * hd, T, hd, Stride(C));
      float* dbase = dqkv.data + b * T * dqkv.cols;
      Map dq(dbase + h * hd, T, hd, Stride(dqkv.cols));
      Map dk(dbase + C + h * hd, T, hd, Stride(dqkv.cols));
      Map dv(dbase + 2 * C + h * hd, T, hd, Stride(dqkv.cols));
      MatrixRM dp = dout_m * v.transpose();  // d(dropped probs)
      if (thr == 0) {
        dv.noalias() = p.transpose() * dout_m;
      } else {
        MatrixRM pd(T, T);
        DropoutWords dw;
        const uint32_t* w = dw.get(key, uint64_t(bh * T * T), uint64_t(T * T));
        for (int64_t i = 0; i < T * T; ++i) {
          pd.data()[i] = drop(p.data()[i], w[i], thr, keep_scale);
          dp.data()[i] = drop(dp.data()[i], w[i], thr, keep_scale);
        }
        dv.noalias() = pd.transpose() * dout_m;
      }
      // Softmax backward: ds = p * (dp - sum_j dp*p), then the scale.
      for (int64_t i = 0; i < T; ++i) {
        const float* pr = p.data() + i * T;
        float* dr = dp.data() + i * T;
        double dot = 0.0;
        for (int64_t j = 0; j < T; ++j) dot += double(dr[j]) * double(pr[j]);
        const float d = float(dot);
        for (int64_t j = 0; j < T; ++j) dr[j] = pr[j] * (dr[j] - d) * s.scale;
      }
      dq.noalias() = dp * k;
      dk.noalias() = dp.transpose() * q;
      if (bf16())  // dqkv = r(dqkv): this head's columns of dq, dk, dv
        for (int64_t i = 0; i < T; ++i)
          for (float* d : {dq.data(), dk.data(), dv.data()}) round_bf16_row(d + i * dqkv.cols, hd);
    }
  }

  void dropout_forward(Tensor& x, float p, DropoutKey key) override {
    const ThreadCount use(threads_);
    dropout_apply(x, p, key);
  }
  void dropout_backward(Tensor& dy, float p, DropoutKey key) override {
    const ThreadCount use(threads_);
    dropout_apply(dy, p, key);
  }

  void add_inplace(Tensor& y, const Tensor& x) override {
    const ThreadCount use(threads_);
    check_same("add_inplace", y, x);
    const int64_t n = y.size();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) y.data[i] += x.data[i];
  }

  void embed_forward(const int32_t* idx, int64_t batch, int64_t seq, const Tensor& wte, const Tensor& wpe,
                     Tensor& out) override {
    const ThreadCount use(threads_);
    const int64_t C = wte.cols;
    for (int64_t i = 0; i < batch * seq; ++i)
      if (idx[i] < 0 || idx[i] >= wte.rows)
        throw Error("embedding: token id " + std::to_string(idx[i]) + " outside the vocabulary [0, " +
                    std::to_string(wte.rows) + ")");
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < batch * seq; ++i) {
      const float* e = wte.row(idx[i]);
      const float* p = wpe.row(i % seq);
      float* o = out.row(i);
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
  void embed_backward(const int32_t* idx, int64_t batch, int64_t seq, const Tensor& dout, Tensor& dwte,
                      Tensor& dwpe) override {
    const ThreadCount use(threads_);
    const int64_t C = dout.cols;
    // Rows in order (a scatter-add: a fixed order keeps it deterministic).
    for (int64_t i = 0; i < batch * seq; ++i) {
      const float* g = dout.row(i);
      float* e = dwte.row(idx[i]);
      for (int64_t c = 0; c < C; ++c) e[c] += g[c];
    }
    column_reduce_rows_mod(dout, seq, dwpe);
  }

  void vit_tokens_forward(const Tensor& patches, int64_t batch, const float* cls, const Tensor& pos,
                          Tensor& out) override {
    const ThreadCount use(threads_);
    const int64_t P = patches.rows / batch, C = patches.cols, L = P + 1;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < batch * L; ++r) {
      const int64_t b = r / L, t = r % L;
      const float* src = t == 0 ? cls : patches.row(b * P + t - 1);
      const float* pr = pos.row(t);
      float* o = out.row(r);
      for (int64_t c = 0; c < C; ++c) o[c] = src[c] + pr[c];
    }
  }
  void vit_tokens_backward(const Tensor& dout, int64_t batch, Tensor& dpatches, float* dcls, Tensor& dpos) override {
    const ThreadCount use(threads_);
    const int64_t L = dout.rows / batch, P = L - 1, C = dout.cols;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < batch * P; ++r) {
      const int64_t b = r / P, p = r % P;
      std::memcpy(dpatches.row(r), dout.row(b * L + 1 + p), size_t(C) * 4);
    }
    column_reduce_rows_mod(dout, L, dpos);
    column_reduce(batch, C, dcls, [&](int64_t b, int64_t c) { return dout.data[b * L * C + c]; });
  }
  void gather_rows(const Tensor& x, int64_t stride, Tensor& out) override {
    const ThreadCount use(threads_);
    for (int64_t r = 0; r < out.rows; ++r) std::memcpy(out.row(r), x.row(r * stride), size_t(x.cols) * 4);
  }
  void scatter_rows(const Tensor& dout, int64_t stride, Tensor& dx) override {
    const ThreadCount use(threads_);
    fill(dx, 0.0f);
    for (int64_t r = 0; r < dout.rows; ++r) std::memcpy(dx.row(r * stride), dout.row(r), size_t(dx.cols) * 4);
  }

  // The compact row codec on the tensors' own memory (train/mx_rows.hpp).
  void encode_rows_mx(const QuantizerSpec& q, const Tensor& x, Tensor& bytes) override {
    const ThreadCount use(threads_);
    const MxRows m = mx_rows_for("cpu backend encode_rows_mx", q, x.rows, x.cols, bytes.size() * 4);
    mx_encode_rows(m, x.data, x.rows, byte_data(bytes));
  }
  void decode_rows_mx(const QuantizerSpec& q, const Tensor& bytes, Tensor& x) override {
    const ThreadCount use(threads_);
    const MxRows m = mx_rows_for("cpu backend decode_rows_mx", q, x.rows, x.cols, bytes.size() * 4);
    mx_decode_rows(m, byte_data(bytes), x.rows, x.data);
  }

  // distributed.reduce bf16's element rules (train/bf16_codes.hpp) on the tensors' own memory.
  void round_bf16_codes(const Tensor& x, Tensor& codes) override {
    const ThreadCount use(threads_);
    check_bf16_codes("cpu backend round_bf16_codes", codes.size() * 4, 1, x.size());
    uint16_t* c = reinterpret_cast<uint16_t*>(codes.data);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < x.size(); ++i) c[i] = reduce_bf16_code(x.data[i]);
  }
  void sum_bf16_codes(const Tensor& codes, int64_t rows, Tensor& out) override {
    const ThreadCount use(threads_);
    check_bf16_codes("cpu backend sum_bf16_codes", codes.size() * 4, rows, out.size());
    const uint16_t* c = reinterpret_cast<const uint16_t*>(codes.data);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < out.size(); ++i) out.data[i] = reduce_bf16_sum(c, rows, out.size(), i);
  }

  void gather_rows_indexed(const Tensor& x, const int32_t* idx, Tensor& out) override {
    const ThreadCount use(threads_);
    check_same_cols("gather_rows_indexed", x, out);
    check_row_indices("gather_rows_indexed", idx, out.rows, x.rows);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < out.rows; ++r) {
      if (idx[r] < 0)
        std::fill(out.row(r), out.row(r) + x.cols, 0.0f);
      else
        std::memcpy(out.row(r), x.row(idx[r]), size_t(x.cols) * 4);
    }
  }
  void combine_rows(const Tensor& src, const int32_t* pos, const float* w, int64_t k, Tensor& out) override {
    const ThreadCount use(threads_);
    check_same_cols("combine_rows", src, out);
    check_row_indices("combine_rows", pos, out.rows * k, src.rows);
    const int64_t C = out.cols;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < out.rows; ++t) {
      float* o = out.row(t);
      for (int64_t c = 0; c < C; ++c) o[c] = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        if (pos[t * k + j] < 0) continue;  // a dropped slot
        const float* s = src.row(pos[t * k + j]);
        if (w) {
          const float wj = w[t * k + j];
          for (int64_t c = 0; c < C; ++c) o[c] = o[c] + wj * s[c];
        } else {
          for (int64_t c = 0; c < C; ++c) o[c] = o[c] + s[c];
        }
      }
    }
  }
  void combine_rows_backward(const Tensor& dout, const Tensor& src, const int32_t* pos, const float* w, int64_t k,
                             Tensor& dsrc, float* dw) override {
    const ThreadCount use(threads_);
    check_same_cols("combine_rows_backward", src, dout);
    check_same_cols("combine_rows_backward", src, dsrc);
    const int64_t named = check_row_indices("combine_rows_backward", pos, dout.rows * k, src.rows);
    const int64_t C = dout.cols;
    if (named < dsrc.rows) fill(dsrc, 0.0f);  // rows no slot names (capacity dispatch)
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < dout.rows * k; ++i) {
      if (pos[i] < 0) {
        dw[i] = 0.0f;
        continue;
      }
      const float* g = dout.row(i / k);
      const float* s = src.row(pos[i]);
      float* d = dsrc.row(pos[i]);
      double acc = 0.0;
      for (int64_t c = 0; c < C; ++c) {
        d[c] = w[i] * g[c];
        acc += double(g[c]) * double(s[c]);
      }
      dw[i] = float(acc);
    }
  }

  double cross_entropy(const Tensor& logits, const int32_t* targets, Tensor* dlogits, int64_t* correct) override {
    const ThreadCount use(threads_);
    const int64_t n = logits.rows, v = logits.cols;
    for (int64_t r = 0; r < n; ++r)
      if (targets[r] < 0 || targets[r] >= v)
        throw Error("cross_entropy: target " + std::to_string(targets[r]) + " outside [0, " + std::to_string(v) + ")");
    std::vector<double> loss(static_cast<size_t>(n));
    std::vector<uint8_t> ok(static_cast<size_t>(n));
    const float inv_n = 1.0f / float(n);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const float* l = logits.row(r);
      float mx = l[0];
      int64_t arg = 0;
      for (int64_t j = 1; j < v; ++j)
        if (l[j] > mx) mx = l[j], arg = j;
      double sum = 0.0;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(double(l[j] - mx));
      const double lse = double(mx) + std::log(sum);
      loss[size_t(r)] = lse - double(l[targets[r]]);
      ok[size_t(r)] = arg == targets[r];
      if (dlogits) {
        float* d = dlogits->row(r);
        for (int64_t j = 0; j < v; ++j) d[j] = float(std::exp(double(l[j]) - lse)) * inv_n;
        d[targets[r]] -= inv_n;
        if (bf16()) round_bf16_row(d, v);  // dlogits = r(dlogits)
      }
    }
    double s = 0.0;
    int64_t c = 0;
    for (int64_t r = 0; r < n; ++r) s += loss[size_t(r)], c += ok[size_t(r)];
    if (correct) *correct = c;
    return s / double(n);
  }

  double sum_squares(const Tensor& g) override {
    const ThreadCount use(threads_);
    const int64_t n = g.size(), blk = 1 << 14, nb = (n + blk - 1) / blk;
    std::vector<double> part(size_t(nb), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; ++b) {
      double s = 0.0;
      for (int64_t i = b * blk; i < std::min(n, (b + 1) * blk); ++i) s += double(g.data[i]) * double(g.data[i]);
      part[size_t(b)] = s;
    }
    double s = 0.0;
    for (double x : part) s += x;
    return s;
  }
  void scale(Tensor& g, float sc) override {
    const ThreadCount use(threads_);
    const int64_t n = g.size();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) g.data[i] *= sc;
  }
  void adamw_step(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, std::span<const IndexRange> decayed, float lr,
                  float b1, float b2, float eps, float wd, int64_t t, float grad_scale, MomentStorage moments) override {
    const ThreadCount use(threads_);
    const int64_t n = p.size();
    check_ranges("cpu backend adamw_step (decayed)", decayed, n);
    if (g.size() != n || m.size() != moment_floats(moments, n) || v.size() != moment_floats(moments, n))
      throw Error("cpu backend adamw_step: " + std::to_string(n) + " parameters, " + std::to_string(g.size()) +
                  " gradients, moments of " + std::to_string(m.size()) + " and " + std::to_string(v.size()) +
                  " floats (" + std::to_string(moment_floats(moments, n)) + " expected)");
    // The moments as FP32 (MomentStorage, train/backend.hpp): bf16 storage holds packed BF16 halves.
    const bool bf16_moments = moments == MomentStorage::bf16;
    uint16_t* const mh = reinterpret_cast<uint16_t*>(m.data);
    uint16_t* const vh = reinterpret_cast<uint16_t*>(v.data);
    auto load = [&](const Tensor& x, const uint16_t* h, int64_t i) {
      return bf16_moments ? bits_float(uint32_t(h[i]) << 16) : x.data[i];
    };
    auto store = [&](Tensor& x, uint16_t* h, int64_t i, float val) {
      if (bf16_moments)
        h[i] = uint16_t(float_bits(round_bf16_f32(val)) >> 16);
      else
        x.data[i] = val;
    };
    const float bc1 = float(1.0 - std::pow(double(b1), double(t)));
    const float bc2s = float(std::sqrt(1.0 - std::pow(double(b2), double(t))));
    const float step = lr / bc1;
    const float shrink = 1.0f - lr * wd;
    // Elements [a, b), decayed or not.
    auto update = [&](int64_t a, int64_t b, bool decay) {
#pragma omp parallel for schedule(static)
      for (int64_t i = a; i < b; ++i) {
        float x = p.data[i];
        if (decay) x *= shrink;
        const float gi = g.data[i] * grad_scale;
        const float m0 = load(m, mh, i), v0 = load(v, vh, i);
        const float mi = m0 + (gi - m0) * (1.0f - b1);  // torch lerp
        const float vi = v0 * b2 + (1.0f - b2) * gi * gi;
        store(m, mh, i, mi);
        store(v, vh, i, vi);
        const float denom = std::sqrt(vi) / bc2s + eps;
        p.data[i] = x - step * (mi / denom);
      }
    };
    int64_t done = 0;
    for (const IndexRange& r : decayed) {
      update(done, r.offset, false);
      update(r.offset, r.offset + r.size, wd != 0.0f);
      done = r.offset + r.size;
    }
    update(done, n, false);
  }

 private:
  static void check_attention(const AttentionShape& s, const Tensor& qkv) {
    if (qkv.cols % 3 != 0 || (qkv.cols / 3) % s.heads != 0 || qkv.rows != s.batch * s.seq)
      throw Error("attention: qkv [" + std::to_string(qkv.rows) + ", " + std::to_string(qkv.cols) +
                  "] does not fit batch " + std::to_string(s.batch) + " x seq " + std::to_string(s.seq) + ", " +
                  std::to_string(s.heads) + " heads");
  }
  bool bf16() const { return activations() == ActivationPrecision::bf16; }
  // x = drop(x) in place; in bf16 mode r(drop(x)), p = 0 included (backend.hpp).
  void dropout_apply(Tensor& x, float p, DropoutKey key) {
    if (p <= 0.0f) {
      if (bf16()) round_bf16_n(x.data, x.size());
      return;
    }
    const uint32_t thr = dropout_threshold(p);
    const float keep_scale = 1.0f / (1.0f - p);
    const int64_t n = x.size();
    constexpr int64_t kChunk = 4096;  // elements per batch of words
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel
    {
      DropoutWords dw;
#pragma omp for schedule(static)
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
        const uint32_t* w = dw.get(key, uint64_t(i0), uint64_t(len));
        float* xc = x.data + i0;
        for (int64_t i = 0; i < len; ++i) xc[i] = drop(xc[i], w[i], thr, keep_scale);
        if (bf16()) round_bf16_row(xc, len);
      }
    }
  }
  // acc[t] += sum over rows r with r % period == t of d[r] (deterministic order).
  void column_reduce_rows_mod(const Tensor& d, int64_t period, Tensor& acc) {
    const int64_t C = d.cols, reps = d.rows / period;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < period; ++t) {
      float* a = acc.row(t);
      std::vector<double> s(size_t(C), 0.0);
      for (int64_t b = 0; b < reps; ++b) {
        const float* g = d.row(b * period + t);
        for (int64_t c = 0; c < C; ++c) s[size_t(c)] += g[c];
      }
      for (int64_t c = 0; c < C; ++c) a[c] += float(s[size_t(c)]);
    }
  }

 private:
  int threads_ = 0;  // OpenMP threads of every operation (<= 0: the default)
  std::shared_ptr<TensorBytes> bytes_ = std::make_shared<TensorBytes>();  // device_memory's counts
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace fp4lab::train
