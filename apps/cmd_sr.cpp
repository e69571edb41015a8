// `fp4lab sr-bias`: the bias and variance of stochastic rounding under each
// random-bit contract (core/sr.hpp) as a function of the residual, measured
// by encoding (core/encode.hpp), not by formula: for a residual f (in units
// of the target's quantum) the value x = 1 + f * 2^-M is encoded with every
// random value that matters, 256 bytes under ptx_x4 and all 2^D values of the
// D discarded bits under per_element (which uses the low D bits of its word),
// so the means are exact.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "apps/commands.hpp"
#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/sr.hpp"

namespace fp4lab {

namespace {

namespace fs = std::filesystem;

struct SrBiasArgs {
  std::string format = "e2m1", csv, plot;
  int points = 49;
};

// Mean and variance of q(x) - x over random values r in [0, n) (in units of the quantum).
struct Moments {
  double bias = 0, var = 0;
};

Moments moments(const Format& f, float x, double quantum, int width, uint64_t n) {
  double s = 0, s2 = 0;
  for (uint64_t r = 0; r < n; ++r) {
    const double e = (double(decode(f, encode(f, x, Round::rs, Overflow::saturate, uint32_t(r), width))) - x) / quantum;
    s += e, s2 += e * e;
  }
  const double m = s / double(n);
  return {m, s2 / double(n) - m * m};
}

struct Row {
  double f;
  Moments w32, w8;
};

// Residuals: log-spaced from 2^-16 to 1 - 2^-10, plus each side of 1/256 and 2/256.
std::vector<double> residuals(int points, int man_bits) {
  std::vector<double> v;
  const double lo = std::log2(std::ldexp(1.0, -16)), hi = std::log2(1.0 - 1.0 / 1024);
  for (int i = 0; i < points; ++i) v.push_back(std::exp2(lo + (hi - lo) * i / (points - 1)));
  for (double k : {1.0, 2.0}) {
    v.push_back(k / 256 - 1.0 / 65536);
    v.push_back(k / 256);
  }
  std::sort(v.begin(), v.end());
  // Representable as 1 + f * 2^-M in float32: f a multiple of 2^-(23 - M).
  for (double& f : v) f = std::ldexp(std::round(std::ldexp(f, 23 - man_bits)), man_bits - 23);
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

std::string gnuplot_script(const std::string& data, const std::string& png, const std::string& fmt) {
  std::ostringstream g;
  g << "set terminal pngcairo noenhanced size 1400,560 font ',10'\nset output '" << png << "'\n"
    << "set multiplot layout 1,2\nset grid\nset logscale x 2\nset format x '2^{%L}'\nset key bottom right\n"
    << "set xlabel 'residual f = (|x| - lo) / quantum'\n"
    << "set title '" << fmt << ": relative bias E[q(x) - x] / (f quantum)'\nset ylabel 'share of the residual'\n"
    << "set yrange [-1.05:0.05]\n"
    << "plot '" << data << "' using 1:($2/$1) with linespoints lw 2 title 'per_element (32 bits)', '" << data
    << "' using 1:($4/$1) with linespoints lw 2 title 'ptx_x4 (8 bits)'\n"
    << "set title '" << fmt << ": variance Var[q(x)] / quantum^2'\nset ylabel 'variance (quanta^2)'\n"
    << "set logscale y 10\nset format y '%g'\nset yrange [*:*]\nset key bottom right\n"
    << "plot '" << data << "' using 1:3 with linespoints lw 2 title 'per_element (32 bits)', '" << data
    << "' using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 title 'ptx_x4 (8 bits; 0 below 1/256: not drawn)'\n"
    << "unset multiplot\n";
  return g.str();
}

void run_sr_bias(const SrBiasArgs& a) {
  const Format& f = format_by_name(a.format);
  if (!sr_ptx_format(f) || sr_x2_format(f))
    throw Error("--format " + a.format + ": choose an FP4/FP6/FP8 format cvt.rs converts (e2m1, e2m3, e3m2, e4m3, e5m2)");
  if (a.points < 2 || a.points > 1000) throw Error("--points must be in [2, 1000], got " + std::to_string(a.points));
  OutputSet out;
  if (!a.csv.empty()) out.add(a.csv);
  if (!a.plot.empty()) out.add(a.plot);
  const int M = f.man_bits, D = 23 - M, W8 = sr_width(SrBits::ptx_x4, f);
  const double quantum = std::ldexp(1.0, -M);  // at 1.0, a normal binade of every format here
  std::vector<Row> rows;
  for (double res : residuals(a.points, M)) {
    const float x = float(1.0 + res * quantum);
    set_activity("encoding the residual " + std::to_string(res));
    rows.push_back({res, moments(f, x, quantum, 32, uint64_t(1) << D), moments(f, x, quantum, W8, uint64_t(1) << W8)});
  }
  std::printf("fp4lab sr-bias: %s, x = 1 + f * 2^-%d; exact means over every random value that matters\n"
              "(per_element: all 2^%d values of the %d discarded bits' random addend; ptx_x4: all %d values of its "
              "%d bits)\n\n",
              std::string(f.name).c_str(), M, D, D, 1 << W8, W8);
  std::printf("%-14s %-14s %-14s %-14s %-14s %s\n", "residual f", "bias 32-bit", "var 32-bit", "bias 8-bit",
              "var 8-bit", "8-bit bias / f");
  std::ostringstream csv;
  csv << "residual,bias_per_element,var_per_element,bias_ptx_x4,var_ptx_x4\n";
  for (const Row& r : rows) {
    std::printf("%-14.8g %-14.6g %-14.6g %-14.6g %-14.6g %.4f\n", r.f, r.w32.bias, r.w32.var, r.w8.bias, r.w8.var,
                r.w8.bias / r.f);
    char line[200];
    std::snprintf(line, sizeof line, "%.10g,%.10g,%.10g,%.10g,%.10g\n", r.f, r.w32.bias, r.w32.var, r.w8.bias,
                  r.w8.var);
    csv << line;
  }
  std::printf("\nptx_x4 rounds up with probability floor(256 f) / 256: its bias is -(f - floor(256 f)/256) quanta,\n"
              "all of f below 1/256 (such values are flushed to lo, never dithered); per_element's bias is below "
              "2^-%d.\n",
              D);
  if (!a.csv.empty()) out.write_text(a.csv, csv.str());
  if (!a.plot.empty()) {
    const fs::path tmp = fs::temp_directory_path() / ("fp4lab_sr_bias_" + std::to_string(::getpid()));
    fs::create_directories(tmp);
    std::string s = csv.str();
    for (char& c : s)
      if (c == ',') c = ' ';
    std::ofstream(tmp / "data.txt") << s.substr(s.find('\n') + 1);
    std::ofstream(tmp / "plot.gp") << gnuplot_script((tmp / "data.txt").string(), (tmp / "out.png").string(),
                                                     std::string(f.name));
    const int rc = std::system(("gnuplot '" + (tmp / "plot.gp").string() + "' 2>/dev/null").c_str());
    std::ifstream png(tmp / "out.png", std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(png)), std::istreambuf_iterator<char>());
    fs::remove_all(tmp);
    if (rc != 0 || bytes.empty()) throw RuntimeFailure("sr-bias: gnuplot could not draw " + a.plot + " (is it installed?)");
    out.write_text(a.plot, bytes);
  }
  out.commit();
}

}  // namespace

void register_sr_commands(CLI::App& app) {
  auto args = std::make_shared<SrBiasArgs>();
  CLI::App* c = app.add_subcommand(
      "sr-bias",
      "Measure the bias and variance of stochastic rounding under both random-bit contracts (per_element: 32\n"
      "random bits an element; ptx_x4: PTX cvt.rs's 8) as a function of the residual, by exhaustive encoding.\n"
      "Example: fp4lab sr-bias --format e2m1 --csv sr.csv --plot sr.png");
  c->add_option("--format", args->format, "Element format: e2m1, e2m3, e3m2, e4m3, e5m2")->capture_default_str();
  c->add_option("--points", args->points, "Log-spaced residuals from 2^-16 to 1 (plus both sides of 1/256, 2/256)")
      ->capture_default_str();
  c->add_option("--csv", args->csv, "Output: the table as CSV (written atomically)");
  c->add_option("--plot", args->plot, "Output: PNG of bias and variance against the residual (needs gnuplot)");
  c->callback([args] { run_sr_bias(*args); });
}

}  // namespace fp4lab
