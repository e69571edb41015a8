// Statistics of finished runs across seeds (`fp4lab compare`, train/compare.hpp):
// Student's t distribution, confidence intervals of a mean, Welch's unpaired
// difference, the paired t test, Holm's step-down adjustment over a table's
// comparisons, and the power of a paired comparison. Every function is plain
// float64 arithmetic; probabilities are exact to ~1e-12 (the regularized
// incomplete beta function by its continued fraction).
#pragma once

#include <vector>

namespace fp4lab::train {

// P(T <= t) for Student's t with df > 0 degrees of freedom (real df: Welch's).
// Throws fp4lab::Error for df <= 0 or NaN arguments.
double student_t_cdf(double t, double df);
// The p-quantile of Student's t with df > 0 degrees of freedom, 0 < p < 1
// (inverse of student_t_cdf to ~1e-12 relative).
double student_t_quantile(double p, double df);
// t_{0.975, df}, the two-sided 95% quantile; df >= 1.
double t975(int df);

// Mean, sample standard deviation (n-1) and the 95% confidence interval of
// the mean (Student's t, n-1 degrees of freedom) of n values; std/lo/hi are
// NaN when n < 2 (mean NaN when n == 0).
struct SampleStats {
  int n = 0;
  double mean = 0, std = 0, lo = 0, hi = 0;
};
SampleStats sample_stats(const std::vector<double>& v);

// Welch's comparison of two independent samples: diff = mean(a) - mean(b),
// se = sqrt(var_a / n_a + var_b / n_b), df by Welch-Satterthwaite, the 95%
// interval diff +- t_{0.975, df} se and the two-sided p of diff / se. Needs
// n >= 2 in each sample; otherwise every field but diff is NaN (diff NaN
// when a sample is empty). se 0 (constant samples): p is 1 for diff 0, else 0.
struct WelchDiff {
  double diff = 0, se = 0, df = 0, lo = 0, hi = 0, p = 0;
};
WelchDiff welch_diff(const std::vector<double>& a, const std::vector<double>& b);

// The paired t test of differences d with statistics s (sample_stats(d)):
// t = mean / (std / sqrt(n)), df = n - 1, two-sided p. NaN for n < 2; for
// std 0, p is 1 when the mean is 0, else 0.
struct PairedTest {
  double t = 0, df = 0, p = 0;
};
PairedTest paired_test(const SampleStats& s);

// Holm's step-down adjustment of m p-values (one table's comparisons): with
// p sorted ascending, adjusted p_(i) = max over j <= i of min(1, (m - j + 1)
// p_(j)); returned in the input's order. NaN entries are not comparisons: they
// stay NaN and do not count in m. A comparison is significant at family-wise
// level alpha when its adjusted p < alpha.
std::vector<double> holm_adjust(const std::vector<double>& p);

// The smallest true mean difference a paired t test on n pairs with
// difference standard deviation sd detects with probability `power` at
// two-sided level alpha, by the usual noncentral approximation
// (t_{1 - alpha/2, n-1} + t_{power, n-1}) sd / sqrt(n). NaN for n < 2 or sd NaN.
double paired_mde(double sd, int n, double alpha = 0.05, double power = 0.8);
// The fewest pairs (n >= 2) whose paired_mde is at most |effect|; -1 when
// none up to max_n does (or effect is 0 or NaN, or sd NaN).
int pairs_for_power(double sd, double effect, double alpha = 0.05, double power = 0.8, int max_n = 100000);

}  // namespace fp4lab::train
