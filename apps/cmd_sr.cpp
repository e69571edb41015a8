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
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/npy.hpp"
#include "core/sr.hpp"
#include "sim/quantizer.hpp"
#include "train/process.hpp"

namespace fp4lab {

namespace {

struct SrBiasArgs {
  std::string format = "e2m1", csv, plot, tensor, quantizer;
  int points = 49;
  uint64_t stream = 0;
  int64_t rows = 0;  // --tensor: the first `rows` rows only (0: all)
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

// The script run_gnuplot runs in its directory: it reads data.txt and writes
// out.png there (fixed names, no path in the script); fmt is a format's name.
std::string gnuplot_script(const std::string& fmt) {
  const std::string data = "'data.txt'";
  std::ostringstream g;
  g << "set terminal pngcairo noenhanced size 1400,560 font ',10'\nset output 'out.png'\n"
    << "set multiplot layout 1,2\nset grid\nset logscale x 2\nset format x '2^{%L}'\nset key bottom right\n"
    << "set xlabel 'residual f = (|x| - lo) / quantum'\n"
    << "set title " << train::gnuplot_string(fmt + ": relative bias E[q(x) - x] / (f quantum)")
    << "\nset ylabel 'share of the residual'\n"
    << "set yrange [-1.05:0.05]\n"
    << "plot " << data << " using 1:($2/$1) with linespoints lw 2 title 'per_element (32 bits)', " << data
    << " using 1:($4/$1) with linespoints lw 2 title 'ptx_x4 (8 bits)'\n"
    << "set title " << train::gnuplot_string(fmt + ": variance Var[q(x)] / quantum^2")
    << "\nset ylabel 'variance (quanta^2)'\n"
    << "set logscale y 10\nset format y '%g'\nset yrange [*:*]\nset key bottom right\n"
    << "plot " << data << " using 1:3 with linespoints lw 2 title 'per_element (32 bits)', " << data
    << " using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 title 'ptx_x4 (8 bits; 0 below 1/256: not drawn)'\n"
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
    // gnuplot runs without a shell in a private directory (train/process.hpp).
    const train::TempDir tmp("fp4lab_sr_bias_");
    std::string s = csv.str();
    for (char& c : s)
      if (c == ',') c = ' ';
    std::ofstream(tmp.path() / "data.txt") << s.substr(s.find('\n') + 1);
    try {
      train::run_gnuplot(gnuplot_script(std::string(f.name)), tmp.path());
    } catch (const train::ProgramNotFound&) {
      throw RuntimeFailure("sr-bias --plot " + train::terminal_text(a.plot) +
                           ": gnuplot not found (apt-get install gnuplot-nox)");
    } catch (const Error& e) {
      throw RuntimeFailure("sr-bias: drawing " + train::terminal_text(a.plot) + ": " + e.what());
    }
    std::ifstream png(tmp.path() / "out.png", std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(png)), std::istreambuf_iterator<char>());
    if (bytes.empty()) throw RuntimeFailure("sr-bias: gnuplot wrote no image for " + train::terminal_text(a.plot));
    out.write_text(a.plot, bytes);
  }
  out.commit();
}

// ---- sr-bias --tensor: the contracts on a real tensor ------------------------------------

// Per-element statistics of one contract over `draws` quantizations of x.
struct TensorSr {
  double rel_bias = 0;       // ||E[dq] - x|| / ||x||
  double shrink = 0;         // <E[dq] - x, x> / ||x||^2 (negative: the expectation shrinks toward zero)
  double rel_std = 0;        // sqrt(mean over elements of Var[dq]) / rms(x)
  double deterministic = 0;  // share of elements with dq != x whose every draw gives the same value
};

// x in the quantizer's domain (RHT-transformed when the spec says so) and the
// mean / variance of dq over the draws; draw(i) returns the RandomStream of draw i.
template <class Draw>
TensorSr tensor_sr(const QuantizerSpec& q, const Tensor<float>& x, int draws, Draw draw) {
  const int64_t rows = x.shape[0], cols = x.shape[1], n = rows * cols;
  const MatrixView<const float> xv(x.data.data(), rows, cols);
  std::vector<double> s(size_t(n), 0.0), s2(size_t(n), 0.0);
  std::vector<float> lo(size_t(n), INFINITY), hi(size_t(n), -INFINITY);
  for (int i = 0; i < draws; ++i) {
    const QuantizedTensor t = quantize(q, xv, draw(i));
    for (int64_t k = 0; k < n; ++k) {
      const float d = t.dequant[size_t(k)];
      s[size_t(k)] += d, s2[size_t(k)] += double(d) * d;
      lo[size_t(k)] = std::min(lo[size_t(k)], d), hi[size_t(k)] = std::max(hi[size_t(k)], d);
    }
  }
  const std::vector<float> xt = quantizer_domain(q, xv);
  double bias2 = 0, along = 0, norm2 = 0, var = 0;
  int64_t moved = 0, fixed = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double m = s[size_t(k)] / draws, v = xt[size_t(k)];
    bias2 += (m - v) * (m - v), along += (m - v) * v, norm2 += v * v;
    var += std::max(0.0, s2[size_t(k)] / draws - m * m);
    if (lo[size_t(k)] == hi[size_t(k)] && double(lo[size_t(k)]) != v) ++fixed;
    if (!(lo[size_t(k)] == hi[size_t(k)] && double(lo[size_t(k)]) == v)) ++moved;
  }
  TensorSr r;
  r.rel_bias = std::sqrt(bias2 / norm2);
  r.shrink = along / norm2;
  r.rel_std = std::sqrt(var / double(n)) / std::sqrt(norm2 / double(n));
  r.deterministic = moved ? double(fixed) / double(moved) : 0.0;
  return r;
}

void run_sr_tensor(const SrBiasArgs& a) {
  // The command measures stochastic rounding: a quantizer that rounds otherwise (every canned one) is
  // measured with round rs, and the output says so.
  const std::string qname = a.quantizer.empty() ? "nvfp4" : a.quantizer;
  QuantizerSpec q = parse_quantizer(qname);
  std::string round_note;
  if (q.round != Round::rs) {
    round_note = "(quantizer " + train::terminal_text(qname) + " rounds " + std::string(round_name(q.round)) +
                 "; measured with round rs, the same quantizer otherwise)\n";
    q.round = Round::rs;
  }
  QuantizerSpec q8 = q, q32 = q;
  q8.sr_bits = SrBits::ptx_x4;
  q32.sr_bits = SrBits::per_element;
  validate(q8, "--quantizer (under ptx_x4)");
  set_activity("reading " + a.tensor);
  Tensor<float> x = read_npy_float32(a.tensor);
  if (x.shape.size() == 1) x.shape = {1, x.shape[0]};
  if (x.shape.size() != 2) throw Error(a.tensor + ": expected a 2-D float32 array, got shape " + shape_str(x.shape));
  if (a.rows < 0) throw Error("--rows must be >= 0 (0: all), got " + std::to_string(a.rows));
  if (a.rows > 0 && a.rows < x.shape[0]) {
    x.shape[0] = a.rows;
    x.data.resize(size_t(a.rows * x.shape[1]));
  }
  const int64_t rows = x.shape[0], per_row = sr_words_per_row(SrBits::ptx_x4, *q.element, x.shape[1]);
  set_activity("quantizing " + a.tensor + " 256 times per contract");
  // ptx_x4: draw b gives every element the byte b (words b * 0x01010101): all 256 values, an exact mean.
  std::vector<uint32_t> words(size_t(rows * per_row));
  const TensorSr r8 = tensor_sr(q8, x, 256, [&](int b) {
    std::fill(words.begin(), words.end(), uint32_t(b) * 0x01010101u);
    RandomStream rs;
    rs.words = words.data();
    return rs;
  });
  // per_element: 256 Philox seeds (a sample: its bias figure carries sampling noise ~ rel_std / 16).
  const TensorSr r32 = tensor_sr(q32, x, 256, [&](int i) { return RandomStream{uint64_t(i) + 1, a.stream}; });
  std::printf("fp4lab sr-bias --tensor %s [%" PRId64 ", %" PRId64 "], quantizer %s\n", a.tensor.c_str(), rows,
              x.shape[1], describe(q).c_str());
  std::printf("%s(in the quantizer's domain: after its RHT, if any; 256 draws per contract)\n\n", round_note.c_str());
  std::printf("%-26s %-14s %-14s %-14s %s\n", "contract", "|bias|/|x|", "shrink", "std/rms(x)",
              "never-dithered share");
  const char* names[2] = {"per_element (32 bits)*", "ptx_x4 (8 bits, exact)"};
  const TensorSr* rs[2] = {&r32, &r8};
  for (int i = 0; i < 2; ++i) {
    std::printf("%-26s %-14.6g %-14.6g %-14.6g ", names[i], rs[i]->rel_bias, rs[i]->shrink, rs[i]->rel_std);
    if (i == 0)
      std::printf("n/a (sampled)\n");
    else
      std::printf("%.6f\n", rs[i]->deterministic);
  }
  std::printf("\n* sampled (256 Philox seeds): |bias| is mostly sampling noise (about std/16 per element); shrink\n"
              "= <E[dq] - x, x> / |x|^2, which also holds the quantizer's own saturation (both contracts);\n"
              "never-dithered share (exact under 8 bits): of the elements not represented exactly, those every\n"
              "random byte rounds the same way (a residual below 1/256 of a quantum).\n");
}

}  // namespace

void register_sr_commands(CLI::App& app) {
  auto args = std::make_shared<SrBiasArgs>();
  CLI::App* c = app.add_subcommand(
      "sr-bias",
      "Measure the bias and variance of stochastic rounding under both random-bit contracts (per_element: 32\n"
      "random bits an element; ptx_x4: PTX cvt.rs's 8) as a function of the residual, by exhaustive encoding.\n"
      "Example: fp4lab sr-bias --format e2m1 --csv sr.csv --plot sr.png\n"
      "On a real tensor: fp4lab sr-bias --tensor dy.npy --quantizer nvfp4    (any .npy of float32 [rows, cols];\n"
      "--quantizer defaults to nvfp4, a canned name or JSON object / file, and is measured with round rs)");
  c->add_option("--format", args->format, "Element format: e2m1, e2m3, e3m2, e4m3, e5m2")->capture_default_str();
  c->add_option("--points", args->points, "Log-spaced residuals from 2^-16 to 1 (plus both sides of 1/256, 2/256)")
      ->capture_default_str();
  c->add_option("--csv", args->csv, "Output: the table as CSV (written atomically)");
  c->add_option("--plot", args->plot, "Output: PNG of bias and variance against the residual (needs gnuplot)");
  c->add_option("--tensor", args->tensor,
                "Instead: a float32 .npy tensor (e.g. a gradient from `train --set output.capture_step=N`): bias,\n"
                "shrinkage and spread of --quantizer's SR under both contracts, 256 draws each");
  c->add_option("--quantizer", args->quantizer,
                "With --tensor: the quantizer, measured with round rs (default nvfp4): a canned name (mxfp4,\n"
                "nvfp4, ...), a JSON object such as '{\"element\":\"e2m1\",\"scale\":\"ue4m3\",\"block\":[16,1],\n"
                "\"scale_rule\":\"nv\",\"global_scale\":\"tensor_amax\",\"rht\":true}', or a JSON file");
  c->add_option("--stream", args->stream, "With --tensor: Philox stream of the per_element draws")->capture_default_str();
  c->add_option("--rows", args->rows, "With --tensor: use its first N rows only (0: all)")->capture_default_str();
  c->callback([args] { args->tensor.empty() ? run_sr_bias(*args) : run_sr_tensor(*args); });
}

}  // namespace fp4lab
