// The CPU twin of the BF16 flash attention: what it computes and its accuracy
// bound against the CUDA kernels are in attention_flash.hpp.
#include "train/cpu/attention_flash.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "core/error.hpp"
#include "core/philox.hpp"
#include "train/attention_flash.hpp"
#include "train/cpu/bf16.hpp"

namespace fp4lab::train {

namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The geometry and the dropout constants of one call, as the kernels' Args
// (train/cuda/attention_flash.cu make_args) hold them.
struct Geo {
  int64_t B, T, H, C, hd, ld;
  float scale, scale2;
  bool causal;
  uint32_t thr;      // dropout threshold; 0: no dropout
  float keep_scale;  // 1 / (1 - p), applied only when thr != 0
};

Geo geo_of(const AttentionShape& s, const Tensor& qkv) {
  Geo g{};
  g.B = s.batch, g.T = s.seq, g.H = s.heads;
  if (qkv.cols % 3 != 0 || s.heads <= 0 || (qkv.cols / 3) % s.heads != 0 || qkv.rows != s.batch * s.seq)
    throw Error("attention: qkv [" + std::to_string(qkv.rows) + ", " + std::to_string(qkv.cols) +
                "] does not fit batch " + std::to_string(s.batch) + " x seq " + std::to_string(s.seq) + ", " +
                std::to_string(s.heads) + " heads");
  g.C = qkv.cols / 3, g.hd = g.C / g.H, g.ld = qkv.cols;
  if (!flash_head_dim_ok(g.hd))
    throw Error("attention: bf16_flash cannot run head dim " + std::to_string(g.hd) +
                " (bf16_flash takes 16, 32, 64 or 128)");
  g.scale = s.scale;
  g.scale2 = s.scale * kFlashLog2e;  // one FP32 product, as make_args
  g.causal = s.causal;
  // dropout_params (train/cuda/nn_device.cuh): the threshold and 1 / (1 - p) in FP32, for p > 0 only.
  g.thr = s.dropout > 0.0f ? dropout_threshold(s.dropout) : 0u;
  g.keep_scale = s.dropout > 0.0f ? 1.0f / (1.0f - s.dropout) : 1.0f;
  return g;
}

// exp2 with the kernels' flush to zero of results below FLT_MIN (ex2.approx.ftz).
inline float exp2_ftz(float x) {
  const float y = std::exp2(x);
  return y < FLT_MIN ? 0.0f : y;
}

// Rows 0..T-1 of the hd columns at `src` (rows `ld` floats apart), each value
// rounded to BF16: the tiles the kernels load.
Mat bf16_rows(const float* src, int64_t T, int64_t hd, int64_t ld) {
  Mat m(T, hd);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t c = 0; c < hd; ++c) m(i, c) = round_bf16_f32(src[i * ld + c]);
  return m;
}

// The dropout words of query row i of (sequence, head) bh: elements (bh T + i) T + j, j < T.
class RowWords {
 public:
  const uint32_t* get(DropoutKey key, int64_t bh, int64_t T, int64_t i) {
    words_.resize(size_t(T));
    scratch_.resize(size_t(4 * ((T + 3) / 4 + 1)));
    random_words(key.seed, key.stream, uint64_t((bh * T + i) * T), uint64_t(T), words_.data(), scratch_.data());
    return words_.data();
  }

 private:
  std::vector<uint32_t> words_, scratch_;
};

// One (sequence, head) of the forward: out's columns of head h, saved's O rows and lse2.
void forward_head(const Geo& g, int64_t bh, const float* qkv, float* out, float* saved, DropoutKey key) {
  const int64_t T = g.T, hd = g.hd, b = bh / g.H, h = bh % g.H;
  const float* base = qkv + b * T * g.ld + h * hd;
  const Mat q = bf16_rows(base, T, hd, g.ld), k = bf16_rows(base + g.C, T, hd, g.ld),
            v = bf16_rows(base + 2 * g.C, T, hd, g.ld);
  const Mat s = q * k.transpose();  // FP32 scores (any FP32 summation order: the bound's eta)
  const int64_t step = flash_forward_key_step(int(hd));
  float* const so = saved + bh * T * hd;
  float* const lse = saved + g.B * g.H * T * hd + bh * T;
  std::vector<float> o(static_cast<size_t>(hd)), sv(static_cast<size_t>(step));
  RowWords rw;
  for (int64_t i = 0; i < T; ++i) {
    const uint32_t* w = g.thr != 0 ? rw.get(key, bh, T, i) : nullptr;
    const int64_t lim = g.causal ? i + 1 : T;  // keys past lim are masked (-inf): their steps change nothing
    float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
    std::fill(o.begin(), o.end(), 0.0f);
    for (int64_t k0 = 0; k0 < lim; k0 += step) {
      const int64_t n = std::min(step, lim - k0);
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        sv[size_t(j)] = s(i, k0 + j) * g.scale2;
        mx = std::max(mx, sv[size_t(j)]);
      }
      const float mn = std::max(m, mx);
      const float mu = mn == -std::numeric_limits<float>::infinity() ? 0.0f : mn;
      const float alpha = exp2_ftz(m - mu);
      m = mn;
      l *= alpha;
      for (float& x : o) x *= alpha;
      for (int64_t j = 0; j < n; ++j) {
        float p = exp2_ftz(sv[size_t(j)] - mu);
        l += p;
        if (w && w[k0 + j] < g.thr) p = 0.0f;
        const float pr = round_bf16_f32(p);  // P rounded to BF16 before P.V
        const float* vj = v.data() + (k0 + j) * hd;
        for (int64_t c = 0; c < hd; ++c) o[size_t(c)] += pr * vj[c];
      }
    }
    const float f = (g.thr != 0 ? g.keep_scale : 1.0f) / l;
    float* orow = out + (b * T + i) * g.C + h * hd;
    for (int64_t c = 0; c < hd; ++c) {
      const float y = o[size_t(c)] * f;
      so[i * hd + c] = y;
      orow[c] = y;
    }
    lse[i] = m + std::log2(l);
  }
}

// One (sequence, head) of the backward: dq, dk, dv's columns of head h.
void backward_head(const Geo& g, int64_t bh, const float* qkv, const float* saved, const float* dout, float* dqkv,
                   DropoutKey key) {
  const int64_t T = g.T, hd = g.hd, b = bh / g.H, h = bh % g.H;
  const float* base = qkv + b * T * g.ld + h * hd;
  const float* gbase = dout + b * T * g.C + h * hd;
  const Mat q = bf16_rows(base, T, hd, g.ld), k = bf16_rows(base + g.C, T, hd, g.ld),
            v = bf16_rows(base + 2 * g.C, T, hd, g.ld), go = bf16_rows(gbase, T, hd, g.C);
  const float* so = saved + bh * T * hd;
  const float* lse = saved + g.B * g.H * T * hd + bh * T;
  const Mat s = q * k.transpose();
  const Mat dp = go * v.transpose();
  Mat ds = Mat::Zero(T, T), pd = Mat::Zero(T, T);  // r(dS), r(drop(P)); masked elements 0
  RowWords rw;
  for (int64_t i = 0; i < T; ++i) {
    // D = rowsum(dout * O), the FP32 dout (not its BF16) and the saved FP32 O, as the dQ kernel.
    float d = 0.0f;
    for (int64_t c = 0; c < hd; ++c) d += gbase[i * g.C + c] * so[i * hd + c];
    const uint32_t* w = g.thr != 0 ? rw.get(key, bh, T, i) : nullptr;
    const int64_t lim = g.causal ? i + 1 : T;
    for (int64_t j = 0; j < lim; ++j) {
      const float p = exp2_ftz(s(i, j) * g.scale2 - lse[i]);
      float gij = dp(i, j), pdij = p;
      if (w) {
        if (w[j] < g.thr) gij = 0.0f, pdij = 0.0f;
        gij *= g.keep_scale;
      }
      ds(i, j) = round_bf16_f32(p * (gij - d) * g.scale);
      pd(i, j) = round_bf16_f32(pdij);
    }
  }
  const Mat dq = ds * k, dk = ds.transpose() * q;
  Mat dv = pd.transpose() * go;
  if (g.thr != 0) dv *= g.keep_scale;  // the dK/dV kernel's final scaling of its FP32 sums
  float* dbase = dqkv + b * T * g.ld + h * hd;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t c = 0; c < hd; ++c) {
      dbase[i * g.ld + c] = dq(i, c);
      dbase[i * g.ld + g.C + c] = dk(i, c);
      dbase[i * g.ld + 2 * g.C + c] = dv(i, c);
    }
}

}  // namespace

void flash_attention_forward_cpu(const AttentionShape& s, const Tensor& qkv, Tensor& out, Tensor& saved,
                                 DropoutKey key) {
  const Geo g = geo_of(s, qkv);
  FP4LAB_CHECK(out.rows == g.B * g.T && out.cols == g.C, "flash attention: out shape");
  FP4LAB_CHECK(saved.size() == g.B * g.H * g.T * (g.hd + 1), "flash attention: saved shape");
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < g.B * g.H; ++bh) forward_head(g, bh, qkv.data, out.data, saved.data, key);
}

void flash_attention_backward_cpu(const AttentionShape& s, const Tensor& qkv, const Tensor& saved, const Tensor& dout,
                                  Tensor& dqkv, DropoutKey key) {
  const Geo g = geo_of(s, qkv);
  FP4LAB_CHECK(dout.rows == g.B * g.T && dout.cols == g.C, "flash attention: dout shape");
  FP4LAB_CHECK(dqkv.rows == qkv.rows && dqkv.cols == qkv.cols, "flash attention: dqkv shape");
  FP4LAB_CHECK(saved.size() == g.B * g.H * g.T * (g.hd + 1), "flash attention: saved shape");
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < g.B * g.H; ++bh) backward_head(g, bh, qkv.data, saved.data, dout.data, dqkv.data, key);
}

}  // namespace fp4lab::train
