// The float64 evaluation of the BF16 flash attention and its element-wise
// bound (attention_flash_ref.hpp).
#include "train/attention_flash_ref.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/philox.hpp"
#include "train/attention_flash.hpp"

namespace fp4lab::train::test {

namespace {

constexpr double kU = 0x1p-8;    // BF16's unit roundoff
constexpr double kTiny = 1e-30;  // absolute slack: exp2 results flushed below FLT_MIN, subnormal products
constexpr double kInf = std::numeric_limits<double>::infinity();

// An input rounded to BF16 by core's codec.
double bf16_in(float x) { return double(decode(bfloat16, encode_rn_f32<bfloat16>(x, Overflow::nonsaturate))); }

// gamma_n: the relative bound of an n-step FP32 sum of products.
double gamma(double n, double eps) { return n * eps / (1.0 - n * eps); }

// May the FP32 value of x (within d of it) round to another BF16 than x does?
// Near zero (d not small against |x|) the sign itself may differ: fragile too.
bool fragile(double x, double d) { return d > 0.0 && (bf16_boundary_distance(x) <= d || d >= 0x1p-10 * std::fabs(x)); }
// How far apart the two roundings of a fragile value can be: |r(x) - r(x')| <= u|x| + d + u(|x| + d).
double flip(double x, double d) { return 2.0 * kU * std::fabs(x) + 2.0 * d; }

}  // namespace

double bf16_rne64(double x) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  const double ulp = std::ldexp(1.0, std::ilogb(x) - 7);
  return std::nearbyint(x / ulp) * ulp;  // the default rounding mode: half to even
}

double bf16_boundary_distance(double x) {
  const double a = std::fabs(x);
  if (a == 0.0 || !std::isfinite(a)) return kInf;
  const int e = std::ilogb(a);
  const double ulp = std::ldexp(1.0, e - 7);
  const double q = a / ulp;  // in [128, 256)
  // The midpoint above floor(q) ulp is the nearest one inside the binade; the
  // binade's lower edge 2^e has the midpoint 2^e - 2^(e-9) below it.
  const double inside = std::fabs(q - (std::floor(q) + 0.5)) * ulp;
  return std::min(inside, a - (std::ldexp(1.0, e) - std::ldexp(1.0, e - 9)));
}

FlashRef flash_reference(const AttentionShape& s, const std::vector<float>& qkv, const std::vector<float>& dout,
                         DropoutKey key, const FlashBoundModel& model, const std::vector<float>* saved) {
  const int64_t B = s.batch, T = s.seq, H = s.heads;
  FP4LAB_CHECK(B > 0 && T > 0 && H > 0 && qkv.size() % size_t(B * T) == 0, "flash_reference: qkv size");
  const int64_t ld = int64_t(qkv.size()) / (B * T), C = ld / 3, hd = C / H;
  FP4LAB_CHECK(ld == 3 * C && C == H * hd && int64_t(dout.size()) == B * T * C, "flash_reference: shapes");
  FP4LAB_CHECK(!saved || int64_t(saved->size()) == B * H * T * (hd + 1), "flash_reference: saved size");
  const double E = model.eps, X = model.exp2_rel, ln2 = std::log(2.0);
  const float scale2f = s.scale * kFlashLog2e;  // the FP32 product both implementations form
  const double scale2 = scale2f, scale = s.scale;
  const uint32_t thr = s.dropout > 0.0f ? dropout_threshold(s.dropout) : 0u;
  const double keep = thr != 0 ? double(1.0f / (1.0f - s.dropout)) : 1.0;
  const int64_t step = flash_forward_key_step(int(hd));

  FlashRef r;
  r.out.assign(size_t(B * T * C), 0.0);
  r.tol_out.assign(r.out.size(), 0.0);
  r.lse.assign(size_t(B * H * T), 0.0);
  r.tol_lse.assign(r.lse.size(), 0.0);
  r.dqkv.assign(size_t(B * T * ld), 0.0);
  r.tol_dqkv.assign(r.dqkv.size(), 0.0);
  r.dropped.assign(size_t(B * H * T * T), 0);
  const size_t nT = size_t(T), nh = size_t(hd);
  std::vector<double> q(nT * nh), k(nT * nh), v(nT * nh), g(nT * nh), gf(nT * nh);
  std::vector<double> S(nT * nT), errS(nT * nT);  // exact scores v = s scale2, and their FP32 error bound
  std::vector<double> O(nT * nh), tolO(nT * nh), L(nT), tolL(nT);
  std::vector<double> ds(nT * nT), dsf(nT * nT), pd(nT * nT), pdf(nT * nT);  // rounded values, flip bounds
  std::vector<double> mu_of(nT), pt_of(nT), rho_of(nT);
  auto at = [&](int64_t i, int64_t j) { return size_t(i) * nT + size_t(j); };
  auto hx = [&](int64_t i, int64_t c) { return size_t(i) * nh + size_t(c); };

  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t c = 0; c < hd; ++c) {
        const size_t src = size_t((b * T + i) * ld + h * hd + c);
        q[hx(i, c)] = bf16_in(qkv[src]);
        k[hx(i, c)] = bf16_in(qkv[src + size_t(C)]);
        v[hx(i, c)] = bf16_in(qkv[src + size_t(2 * C)]);
        gf[hx(i, c)] = double(dout[size_t((b * T + i) * C + h * hd + c)]);
        g[hx(i, c)] = bf16_in(dout[size_t((b * T + i) * C + h * hd + c)]);
      }
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) {
        double acc = 0.0, mag = 0.0;
        for (int64_t c = 0; c < hd; ++c) acc += q[hx(i, c)] * k[hx(j, c)], mag += std::fabs(q[hx(i, c)] * k[hx(j, c)]);
        S[at(i, j)] = acc * scale2;
        // FP32 dot of hd products, then the product with scale2.
        errS[at(i, j)] = std::fabs(scale2) * gamma(double(hd), E) * mag * (1.0 + E) + E * std::fabs(acc * scale2);
        const uint64_t e = uint64_t((bh * T + i) * T + j);
        r.dropped[size_t(bh * T * T) + at(i, j)] = thr != 0 && random_bits(key.seed, key.stream, e) < thr;
      }
    const uint8_t* drop = r.dropped.data() + bh * T * T;

    // ---- forward: the online softmax of the twin and the kernels, step by step ----
    for (int64_t i = 0; i < T; ++i) {
      const int64_t lim = s.causal ? i + 1 : T;
      double m = -kInf, dm = 0.0, rho_alpha = 0.0, rho_max = 0.0;
      int64_t nsteps = 0;
      for (int64_t k0 = 0; k0 < lim; k0 += step, ++nsteps) {
        const int64_t k1 = std::min(k0 + step, lim);
        double mx = -kInf, dmx = 0.0;
        for (int64_t j = k0; j < k1; ++j) mx = std::max(mx, S[at(i, j)]), dmx = std::max(dmx, errS[at(i, j)]);
        const double mu = std::max(m, mx);
        const double dmu = std::max(dm, dmx);  // the max of values each within its d: within the largest d
        if (m != -kInf)  // alpha = exp2(m_old - mu) (0 exactly on both sides for the first step)
          rho_alpha = std::max(rho_alpha, ln2 * (dm + dmu + E * std::fabs(m - mu)) + X);
        m = mu, dm = dmu;
        for (int64_t j = k0; j < k1; ++j) {
          mu_of[size_t(j)] = mu;
          pt_of[size_t(j)] = std::exp2(S[at(i, j)] - mu);
          rho_of[size_t(j)] = ln2 * (errS[at(i, j)] + dmu + E * std::fabs(S[at(i, j)] - mu)) + X;
          rho_max = std::max(rho_max, rho_of[size_t(j)]);
        }
      }
      double l = 0.0;
      for (int64_t j = 0; j < lim; ++j) l += std::exp2(S[at(i, j)] - m);
      const double f = keep / l;
      // o and l: FP32 sums of lim terms rescaled nsteps times; O = o * (keep / l).
      const double g_sum = gamma(double(2 * lim + 3 * nsteps + 4), E);
      const double rel_l = g_sum + rho_max + double(nsteps) * rho_alpha;
      const double eta = (g_sum + double(nsteps) * rho_alpha) + rel_l + 3.0 * E;
      for (int64_t c = 0; c < hd; ++c) O[hx(i, c)] = 0.0, tolO[hx(i, c)] = 0.0;
      std::vector<double> mag(nh, 0.0), fl(nh, 0.0);
      for (int64_t j = 0; j < lim; ++j) {
        const double w = std::exp2(mu_of[size_t(j)] - m) * f;  // exact rescaling to the final max, and 1/l
        const double pt = pt_of[size_t(j)], dp = rho_of[size_t(j)] * pt * (1.0 + 1e-6);
        const bool dr = drop[at(i, j)] != 0;
        const double a = dr ? 0.0 : bf16_rne64(pt);
        const bool fr = !dr && fragile(pt, dp);
        r.rounded += !dr, r.fragile += fr;
        for (int64_t c = 0; c < hd; ++c) {
          const double vj = v[hx(j, c)];
          O[hx(i, c)] += a * w * vj;
          mag[size_t(c)] += std::fabs(a * w * vj);
          if (fr) fl[size_t(c)] += flip(pt, dp) * w * std::fabs(vj);
        }
      }
      for (int64_t c = 0; c < hd; ++c) {
        tolO[hx(i, c)] = (eta * mag[size_t(c)] + fl[size_t(c)] * (1.0 + eta)) * (1.0 + 1e-6) + kTiny;
        const size_t oi = size_t((b * T + i) * C + h * hd + c);
        r.out[oi] = O[hx(i, c)];
        r.tol_out[oi] = tolO[hx(i, c)];
      }
      // lse2 = m + log2(l) in FP32 (log2f within 1 ulp of its result, the sum rounded).
      L[size_t(i)] = m + std::log2(l);
      tolL[size_t(i)] = (dm + rel_l / ln2 * (1.0 + rel_l) + 2.0 * E * std::fabs(std::log2(l)) +
                         E * std::fabs(L[size_t(i)])) * (1.0 + 1e-6) + kTiny;
      r.lse[size_t(bh * T + i)] = L[size_t(i)];
      r.tol_lse[size_t(bh * T + i)] = tolL[size_t(i)];
    }

    // ---- backward: P from lse2, dS and drop(P) rounded, then the three products ----
    if (saved)  // the backward of a given forward: its O and lse2 are inputs, exact as given
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t c = 0; c < hd; ++c)
          O[hx(i, c)] = double((*saved)[size_t((bh * T + i) * hd + c)]), tolO[hx(i, c)] = 0.0;
        L[size_t(i)] = double((*saved)[size_t(B * H * T * hd + bh * T + i)]), tolL[size_t(i)] = 0.0;
      }
    for (int64_t i = 0; i < T; ++i) {
      double D = 0.0, tD = 0.0, mD = 0.0;
      for (int64_t c = 0; c < hd; ++c) {
        D += gf[hx(i, c)] * O[hx(i, c)];
        tD += std::fabs(gf[hx(i, c)]) * tolO[hx(i, c)];
        mD += std::fabs(gf[hx(i, c)] * O[hx(i, c)]);
      }
      tD += gamma(double(hd), E) * (mD + tD) + kTiny;
      const int64_t lim = s.causal ? i + 1 : T;
      for (int64_t j = 0; j < T; ++j) ds[at(i, j)] = dsf[at(i, j)] = pd[at(i, j)] = pdf[at(i, j)] = 0.0;
      for (int64_t j = 0; j < lim; ++j) {
        const double x = S[at(i, j)] - L[size_t(i)];
        const double p = std::exp2(x);
        const double dp = p * (ln2 * (errS[at(i, j)] + tolL[size_t(i)] + E * std::fabs(x)) + X) * (1.0 + 1e-6) + kTiny;
        double dP = 0.0, mP = 0.0;
        for (int64_t c = 0; c < hd; ++c) dP += g[hx(i, c)] * v[hx(j, c)], mP += std::fabs(g[hx(i, c)] * v[hx(j, c)]);
        const bool dr = drop[at(i, j)] != 0;
        const double gg = dr ? 0.0 : dP * keep;
        const double dg = dr ? 0.0 : keep * gamma(double(hd), E) * mP + 2.0 * E * std::fabs(gg);
        const double diff = gg - D, ddiff = dg + tD + E * std::fabs(diff);
        const double x_ds = p * diff * scale;
        const double d_ds = scale * (dp * std::fabs(diff) + p * ddiff + dp * ddiff) + 2.0 * E * std::fabs(x_ds);
        ds[at(i, j)] = bf16_rne64(x_ds);
        const bool fds = fragile(x_ds, d_ds);
        dsf[at(i, j)] = fds ? flip(x_ds, d_ds) : 0.0;
        const double x_pd = dr ? 0.0 : p, d_pd = dr ? 0.0 : dp;
        pd[at(i, j)] = bf16_rne64(x_pd);
        const bool fpd = !dr && fragile(x_pd, d_pd);
        pdf[at(i, j)] = fpd ? flip(x_pd, d_pd) : 0.0;
        r.rounded += 1 + !dr, r.fragile += fds + fpd;
      }
    }
    const double gT = gamma(double(T + 1), E);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t c = 0; c < hd; ++c) {
        double dq = 0.0, tq = 0.0, dk = 0.0, tk = 0.0, dv = 0.0, tv = 0.0;
        for (int64_t j = 0; j < T; ++j) {  // dQ row i over keys j; dK, dV row i (a key) over queries j
          dq += ds[at(i, j)] * k[hx(j, c)];
          tq += gT * std::fabs(ds[at(i, j)] * k[hx(j, c)]) + dsf[at(i, j)] * std::fabs(k[hx(j, c)]);
          dk += ds[at(j, i)] * q[hx(j, c)];
          tk += gT * std::fabs(ds[at(j, i)] * q[hx(j, c)]) + dsf[at(j, i)] * std::fabs(q[hx(j, c)]);
          dv += pd[at(j, i)] * g[hx(j, c)];
          tv += (gT + E) * std::fabs(pd[at(j, i)] * g[hx(j, c)]) + pdf[at(j, i)] * std::fabs(g[hx(j, c)]);
        }
        const size_t qi = size_t((b * T + i) * ld + h * hd + c);
        r.dqkv[qi] = dq, r.tol_dqkv[qi] = tq * (1.0 + 1e-6) + kTiny;
        r.dqkv[qi + size_t(C)] = dk, r.tol_dqkv[qi + size_t(C)] = tk * (1.0 + 1e-6) + kTiny;
        r.dqkv[qi + size_t(2 * C)] = dv * keep, r.tol_dqkv[qi + size_t(2 * C)] = tv * keep * (1.0 + 1e-6) + kTiny;
      }
  }
  return r;
}

BoundExcess outside_bound(std::span<const float> got, std::span<const double> want, std::span<const double> bound) {
  if (got.size() != want.size() || got.size() != bound.size())
    throw fp4lab::Error("outside_bound: " + std::to_string(got.size()) + " values, " + std::to_string(want.size()) +
                        " references, " + std::to_string(bound.size()) + " bounds");
  BoundExcess r;
  for (size_t i = 0; i < got.size(); ++i) {
    const double ratio = std::fabs(double(got[i]) - want[i]) / bound[i];
    if (!(ratio <= 1.0)) ++r.outside;
    if (!std::isnan(r.worst) && !(ratio <= r.worst)) r.worst = ratio, r.at = i;
  }
  return r;
}

}  // namespace fp4lab::train::test
