#include "train/stats.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "core/error.hpp"

namespace fp4lab::train {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The continued fraction of the incomplete beta function (modified Lentz),
// converging for x < (a + 1) / (a + b + 2).
double beta_fraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300, kEps = 1e-16;
  auto guard = [](double v) { return std::fabs(v) < kTiny ? kTiny : v; };
  double c = 1, d = 1 / guard(1 - (a + b) * x / (a + 1)), h = d;
  for (int m = 1; m <= 1000; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((a - 1 + m2) * (a + m2));
    d = 1 / guard(1 + aa * d);
    c = guard(1 + aa / c);
    h *= d * c;
    aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + 1 + m2));
    d = 1 / guard(1 + aa * d);
    c = guard(1 + aa / c);
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < kEps) break;
  }
  return h;
}

// The regularized incomplete beta function I_x(a, b), 0 <= x <= 1.
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1) / (a + b + 2)) return front * beta_fraction(a, b, x) / a;
  return 1 - front * beta_fraction(b, a, 1 - x) / b;
}

void check_df(double df, const char* what) {
  if (!(df > 0)) throw Error(std::string(what) + ": degrees of freedom must be > 0, got " + std::to_string(df));
}

// Two-sided p of a t statistic with df degrees of freedom.
double two_sided_p(double t, double df) { return std::min(1.0, 2 * student_t_cdf(-std::fabs(t), df)); }

double variance(const std::vector<double>& v, double mean) {
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return ss / double(v.size() - 1);
}

}  // namespace

double student_t_cdf(double t, double df) {
  check_df(df, "student_t_cdf");
  if (std::isnan(t)) throw Error("student_t_cdf: t is NaN");
  if (std::isinf(t)) return t > 0 ? 1.0 : 0.0;
  // P(|T| > |t|) = I_{df / (df + t^2)}(df / 2, 1 / 2).
  const double tail = 0.5 * incomplete_beta(0.5 * df, 0.5, df / (df + t * t));
  return t > 0 ? 1 - tail : tail;
}

double student_t_quantile(double p, double df) {
  check_df(df, "student_t_quantile");
  if (!(p > 0 && p < 1)) throw Error("student_t_quantile: p must be in (0, 1), got " + std::to_string(p));
  if (p < 0.5) return -student_t_quantile(1 - p, df);
  if (p == 0.5) return 0;
  double lo = 0, hi = 1;
  while (student_t_cdf(hi, df) < p) lo = hi, hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-15 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (student_t_cdf(mid, df) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double t975(int df) {
  if (df < 1) throw Error("t975: degrees of freedom must be >= 1");
  return student_t_quantile(0.975, df);
}

SampleStats sample_stats(const std::vector<double>& v) {
  SampleStats s{int(v.size()), kNaN, kNaN, kNaN, kNaN};
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  if (v.size() < 2) return s;
  s.std = std::sqrt(variance(v, s.mean));
  const double h = t975(s.n - 1) * s.std / std::sqrt(double(s.n));
  s.lo = s.mean - h;
  s.hi = s.mean + h;
  return s;
}

WelchDiff welch_diff(const std::vector<double>& a, const std::vector<double>& b) {
  WelchDiff w{kNaN, kNaN, kNaN, kNaN, kNaN, kNaN};
  if (a.empty() || b.empty()) return w;
  const double ma = std::accumulate(a.begin(), a.end(), 0.0) / double(a.size());
  const double mb = std::accumulate(b.begin(), b.end(), 0.0) / double(b.size());
  w.diff = ma - mb;
  if (a.size() < 2 || b.size() < 2) return w;
  const double qa = variance(a, ma) / double(a.size()), qb = variance(b, mb) / double(b.size());
  w.se = std::sqrt(qa + qb);
  if (w.se == 0) {
    w.lo = w.hi = w.diff;
    w.df = double(a.size() + b.size() - 2);
    w.p = w.diff == 0 ? 1.0 : 0.0;
    return w;
  }
  w.df = (qa + qb) * (qa + qb) / (qa * qa / double(a.size() - 1) + qb * qb / double(b.size() - 1));
  const double h = student_t_quantile(0.975, w.df) * w.se;
  w.lo = w.diff - h;
  w.hi = w.diff + h;
  w.p = two_sided_p(w.diff / w.se, w.df);
  return w;
}

PairedTest paired_test(const SampleStats& s) {
  if (s.n < 2 || std::isnan(s.std)) return {kNaN, kNaN, kNaN};
  const double df = s.n - 1;
  if (s.std == 0)
    return {s.mean == 0 ? 0.0 : std::copysign(std::numeric_limits<double>::infinity(), s.mean), df,
            s.mean == 0 ? 1.0 : 0.0};
  const double t = s.mean / (s.std / std::sqrt(double(s.n)));
  return {t, df, two_sided_p(t, df)};
}

std::vector<double> holm_adjust(const std::vector<double>& p) {
  std::vector<size_t> order;
  for (size_t i = 0; i < p.size(); ++i)
    if (!std::isnan(p[i])) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return p[x] < p[y]; });
  std::vector<double> out(p.size(), kNaN);
  const double m = double(order.size());
  double running = 0;
  for (size_t j = 0; j < order.size(); ++j) {
    running = std::max(running, std::min(1.0, (m - double(j)) * p[order[j]]));
    out[order[j]] = running;
  }
  return out;
}

double paired_mde(double sd, int n, double alpha, double power) {
  if (n < 2 || std::isnan(sd)) return kNaN;
  const double df = n - 1;
  return (student_t_quantile(1 - alpha / 2, df) + student_t_quantile(power, df)) * sd / std::sqrt(double(n));
}

int pairs_for_power(double sd, double effect, double alpha, double power, int max_n) {
  const double e = std::fabs(effect);
  if (!(e > 0) || std::isnan(sd) || max_n < 2) return -1;
  if (paired_mde(sd, 2, alpha, power) <= e) return 2;
  // paired_mde falls with n: double up to a bracket, then bisect.
  int lo = 2, hi = 4;
  while (hi < max_n && paired_mde(sd, hi, alpha, power) > e) lo = hi, hi *= 2;
  hi = std::min(hi, max_n);
  if (paired_mde(sd, hi, alpha, power) > e) return -1;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (paired_mde(sd, mid, alpha, power) > e ? lo : hi) = mid;
  }
  return hi;
}

}  // namespace fp4lab::train
