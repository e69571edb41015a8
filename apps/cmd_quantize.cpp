// `fp4lab quantize` and `fp4lab bench quantize` (golden and verify: cmd_golden.cpp).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "core/error.hpp"
#include "core/npy.hpp"
#include "sim/block_rules.hpp"
#include "sim/quantizer.hpp"
#include "sim/block_scales.hpp"
#include "sim/grouped.hpp"
#include "train/numerics.hpp"
#ifdef FP4LAB_WITH_CUDA
#include "apps/bench_cuda.hpp"
#endif

namespace fp4lab {

namespace {

// ---- shared helpers -----------------------------------------------------------

// A 2-D float32 input (a 1-D array is one row).
Tensor<float> read_matrix(const std::string& path) {
  set_activity("reading " + path);
  Tensor<float> t = read_npy_float32(path);
  if (t.shape.size() == 1) t.shape = {1, t.shape[0]};
  if (t.shape.size() != 2)
    throw Error(path + ": expected a 2-D float32 array [rows, cols] (or 1-D), got shape " + shape_str(t.shape));
  return t;
}

// quant_stats() leaves NaN out of its maximum: these figures say how many
// outputs are NaN and give SQNR / max error over the elements whose input (in
// the quantized domain: after RHT) and output are both finite.
struct FiniteStats {
  int64_t nan_out = 0, finite = 0;
  bool any_nan = false, all_finite = true;  // NaN anywhere (in or out); every input and output finite
  double sqnr_db = 0, max_abs_error = 0;
};

FiniteStats finite_stats(const QuantizedTensor& q, MatrixView<const float> x) {
  const std::vector<float> t = quantizer_domain(q.spec, x);
  FiniteStats f;
  double sig = 0, err = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const double v = t[i], d = q.dequant[i];
    f.nan_out += std::isnan(d) ? 1 : 0;
    f.any_nan = f.any_nan || std::isnan(v) || std::isnan(d);
    if (!std::isfinite(v) || !std::isfinite(d)) {
      f.all_finite = false;
      continue;
    }
    ++f.finite, sig += v * v, err += (v - d) * (v - d);
    f.max_abs_error = std::max(f.max_abs_error, std::fabs(v - d));
  }
  f.sqnr_db = err == 0 ? INFINITY : 10.0 * std::log10(sig / err);
  return f;
}

// The figures of train/numerics.hpp (what a training run's numerics.jsonl and
// `fp4lab inspect` report for an operand) that quant_stats lacks.
void print_numerics(const QuantizedTensor& q, MatrixView<const float> x) {
  const train::NumericsCounts n = train::numerics_of(q, x);
  auto frac = [](int64_t a, int64_t b) { return b > 0 ? double(a) / double(b) : 0.0; };
  std::printf("inexact            %.6f   (fraction of elements whose dequantized value differs from the input)\n",
              frac(n.inexact, n.elements));
  if (n.scale_codes) {
    std::printf("scale_floor        %.6f   (fraction of blocks whose scale is the scale format's smallest, or 0)\n",
                frac(n.floor_blocks, n.blocks));
    std::printf("scale_ceil         %.6f   (fraction of blocks whose scale is the scale format's largest)\n",
                frac(n.ceil_blocks, n.blocks));
  }
  std::printf("zero_blocks        %.6f   (fraction of blocks that are all zero)\n", frac(n.zero_blocks, n.blocks));
  std::printf("amax               %s\n", fmt_float(float(n.amax())).c_str());
  if (n.sr && n.finite > 0) std::printf("mean_error         %.9g   (mean of dequant - input)\n", n.sum_err / double(n.finite));
}

void print_stats(const QuantizedTensor& q, const QuantStats& s, const FiniteStats& f) {
  const int64_t blocks = q.scale_rows * q.scale_cols, n = q.rows * q.cols;
  std::printf("quantizer          %s\n", describe(q.spec).c_str());
  std::printf("shape              [%" PRId64 ", %" PRId64 "], %" PRId64 " blocks ([%" PRId64 ", %" PRId64 "] scales)\n",
              q.rows, q.cols, blocks, q.scale_rows, q.scale_cols);
  if (f.all_finite) {
    std::printf("sqnr_db            %.4f\n", s.sqnr_db);
    std::printf("max_abs_error      %.9g\n", s.max_abs_error);
  } else {  // never an exact-looking result when inputs or outputs are NaN or Inf
    const char* head = f.any_nan ? "nan" : "inf";
    if (f.finite == 0) {
      std::printf("sqnr_db            %s   (no element has a finite input and output)\n", head);
      std::printf("max_abs_error      %s   (no element has a finite input and output)\n", head);
    } else {
      char over[96];
      std::snprintf(over, sizeof over, "over the %" PRId64 " element(s) with finite input and output", f.finite);
      std::printf("sqnr_db            %s   (%s: %.4f)\n", head, over, f.sqnr_db);
      std::printf("max_abs_error      %s   (%s: %.9g)\n", head, over, f.max_abs_error);
    }
  }
  std::printf("nan_outputs        %" PRId64 " of %" PRId64 "\n", f.nan_out, n);
  std::printf("flushed_to_zero    %.6f   (fraction of non-zero inputs that dequantize to 0)\n", s.flushed_to_zero);
  std::printf("saturated          %.6f   (fraction of elements clamped to +-max of %s)\n", s.saturated,
              std::string(short_format_name(*q.spec.element)).c_str());
  std::printf("scale_underflows   %" PRId64 " of %" PRId64 " blocks\n", s.scale_underflows, blocks);
  std::printf("scale_overflows    %" PRId64 " of %" PRId64 " blocks\n", s.scale_overflows, blocks);
  if (q.spec.global_scale == GlobalScale::tensor_amax)
    std::printf("global_decode      %s (%s)\n", fmt_float(q.global_decode).c_str(),
                hex_bits(float_bits(q.global_decode), 8).c_str());
}

// ---- fp4lab quantize ------------------------------------------------------------

struct QuantizeArgs {
  std::string quantizer, in, dequant, codes, scales, global, sr_bits, rbits, groups, swizzled;
  uint64_t seed = 0, stream = 0;
  bool stats = false;
};

// What the quantizer does with NaN and Inf inputs (docs/DESIGN.md sec. 3).
// With --groups (`grouped`) the global scale is each group's own.
std::string nonfinite_rule(const QuantizerSpec& s, const NonFinite& c, bool grouped) {
  const std::string el(short_format_name(*s.element)), sc(short_format_name(*s.scale));
  const std::string emax = fmt_float(max_finite(*s.element));
  std::string r = s.rht ? "RHT first spreads each NaN/Inf over its 16-element chunk; " : "";
  switch (block_rule_id(s)) {  // the emulations' own arithmetic (schemes/)
    case BlockRuleId::fp4tk:
      return r + "a NaN makes its whole block NaN; an Inf " +
             (s.scale == &float8_e8m0fnu ? "sets its block's scale to 2^127 and stays Inf (6 * 2^127)"
                                         : "sets its block's scale to 448 and becomes +-2688") +
             " (fp4-trainkit's arithmetic)";
    case BlockRuleId::te_fast_math:
      return r + "a NaN is left out of the amaxes (TE's max.xorsign.abs) and encodes as +6 (cvt.satfinite; e2m1 "
                 "has no NaN); an Inf sets the per-tensor scale to 1, its block's scale to 448 and itself to +-6";
    case BlockRuleId::quartet2:
      return r +
             "a NaN is left out of the amaxes and encodes as +6 (Quartet II's torch amax would propagate it and "
             "make every output NaN); an Inf makes the tensor scale Inf and its reciprocal 0: its block's scale "
             "NaN, every other block's 0, every output NaN";
    case BlockRuleId::te_fused_fast_math:
      return r +
             "a NaN makes its block's scale NaN (the kernel's max.NaN) and encodes as +6; an Inf makes the "
             "per-tensor scale 0 (TE's fused form): every output NaN";
    case BlockRuleId::tetrajet2:
      return r +
             "NaN and Inf are outside TetraJet-v2's arithmetic (its kernels' max reductions differ): the "
             "outputs of their 1x128 segment are not TetraJet-v2's";
    case BlockRuleId::quartet2_triton:
      return r +
             "a NaN makes the tensor scale NaN (torch's amax): every output NaN-derived; an Inf makes every "
             "other block's product 1 * Inf's scale (Quartet II's Triton arithmetic)";
    case BlockRuleId::quartet2_eden_triton:
      return r +
             "NaN and Inf are outside the modelled MS-EDEN arithmetic (the peer's tl.max and tl.sum trees): the "
             "outputs of their 128-element chunk, and with the tensor scale every output, are not the peer's";
    case BlockRuleId::standard:
    case BlockRuleId::te_reference:  // the nv rule's
    case BlockRuleId::te_nvfp4: break;
  }
  switch (s.scale_rule) {
    case ScaleRule::ocp:
    case ScaleRule::ceil:
    case ScaleRule::tetrajet:
      return r + "a NaN or Inf makes its block's " + sc + " scale NaN: that block's outputs are NaN";
    case ScaleRule::nv:
    case ScaleRule::nv_noglobal:
      if (s.global_scale == GlobalScale::tensor_amax) {
        if (c.nan)
          r += grouped ? "a NaN makes its group's global scale NaN: every output of that group is NaN"
                       : "a NaN makes the per-tensor scale NaN: every output is NaN";
        if (c.nan && c.inf()) r += "; ";
        if (c.inf())
          r += std::string(grouped ? "an Inf sets its group's global scale to 1 (no block of that group keeps the "
                                     "global scaling)"
                           : "an Inf sets the per-tensor scale to 1 (no block keeps the global scaling)") +
               ", its block's scale to " +
               fmt_float(max_finite(*s.scale)) + " and itself to +-" + emax;
        return r;
      }
      if (c.nan) r += "a NaN makes its block's " + sc + " scale NaN: that block's outputs are NaN";
      if (c.nan && c.inf()) r += "; ";
      if (c.inf())
        r += "an Inf saturates its block's scale to " + fmt_float(max_finite(*s.scale)) + " and itself to +-" + emax;
      return r;
    case ScaleRule::tensor_amax:
      return r + "a NaN or Inf makes the per-tensor scale 1 (no scaling); " +
             nonfinite_encoding(*s.element, s.round, s.overflow, c);
    case ScaleRule::torchao_floor:
    case ScaleRule::torchao_ceil:
    case ScaleRule::torchao_even:
    case ScaleRule::torchao_rceil:
      return r + "a NaN or Inf makes its block's e8m0 scale NaN (255, torchao's to_mx): that block's outputs are NaN";
    case ScaleRule::te_mxfp8:
      return r +
             "a NaN is left out of its block's amax (TransformerEngine's fmaxf) and encodes as NaN; an Inf sets "
             "its block's scale to 2^127 (E8M0 254, satfinite) and itself to +-" +
             emax;
    case ScaleRule::te_fp8_block:
      return r +
             "a NaN is left out of its block's amax (TransformerEngine's fmaxf) and encodes as NaN; an Inf "
             "makes its block's scale 1 (TE's compute_scale_from_amax) and itself +-" +
             emax;
    case ScaleRule::deepgemm:
      return r + (s.scale == &float32
                      ? "a NaN makes its block's scale NaN (every output of the block NaN); an Inf makes it Inf: "
                        "its elements are x * 0 (0, the Inf NaN), as DeepGEMM's casts give"
                      : "a NaN or Inf makes its block's power-of-two scale 2^127 (DeepGEMM's ceil_to_ue8m0): "
                        "the block's other elements flush to 0, a NaN stays NaN and an Inf becomes +-" +
                            emax);
    case ScaleRule::amax_div:
      return r +
             "a NaN makes its block's scale NaN (every output of the block NaN); an Inf makes it Inf: the "
             "block's elements are x / Inf (0, the Inf NaN)";
  }
  return r;
}

// --groups SIZES.npy: a 1-D int64 array of rows per group (the sum is checked
// against the input's rows later, by check_group_sizes).
std::vector<int64_t> read_group_sizes(const std::string& path) {
  set_activity("reading " + path);
  const NpyArray a = read_npy(path);
  if (a.dtype != DType::int64)
    throw Error(path + ": --groups needs int64 rows per group (numpy dtype '<i8'), got " + dtype_name(a.dtype));
  if (a.shape.size() != 1)
    throw Error(path + ": --groups needs a 1-D array of rows per group, got shape " + shape_str(a.shape));
  std::vector<int64_t> sizes(static_cast<size_t>(a.shape[0]));
  if (!sizes.empty()) std::memcpy(sizes.data(), a.bytes.data(), sizes.size() * sizeof(int64_t));
  return sizes;
}

// Group g of a grouped result as the QuantizedTensor of its own quantize() (for --stats).
QuantizedTensor group_tensor(const GroupedQuantizedTensor& g, size_t k, int64_t row) {
  QuantizedTensor t;
  t.spec = g.spec;
  t.rows = g.group_rows[k], t.cols = g.cols;
  t.scale_rows = g.scale_row_offset[k + 1] - g.scale_row_offset[k], t.scale_cols = g.scale_cols;
  const int64_t n = t.rows * t.cols, s0 = g.scale_row_offset[k] * g.scale_cols, ns = t.scale_rows * t.scale_cols;
  t.codes.assign(g.codes.begin() + row * g.cols, g.codes.begin() + row * g.cols + n);
  t.dequant.assign(g.dequant.begin() + row * g.cols, g.dequant.begin() + row * g.cols + n);
  t.scales.assign(g.scales.begin() + s0, g.scales.begin() + s0 + ns);
  if (!g.scale_codes.empty()) t.scale_codes.assign(g.scale_codes.begin() + s0, g.scale_codes.begin() + s0 + ns);
  t.global_decode = g.global_decode[k];
  return t;
}

void run_quantize(const QuantizeArgs& a) {
  QuantizerSpec spec = parse_quantizer(a.quantizer);
  if (!a.sr_bits.empty()) {
    spec.sr_bits = sr_bits_option(a.sr_bits);
    validate(spec, "--sr-bits " + a.sr_bits);
  }
  if ((!a.rbits.empty() || !a.sr_bits.empty()) && spec.round != Round::rs)
    throw Error("--rbits and --sr-bits apply to a quantizer with round 'rs'; " + describe(spec) + " rounds " +
                std::string(round_name(spec.round)));
  const bool grouped = !a.groups.empty();
  if (grouped && spec.block_rows == 0)
    throw Error("--groups: " + describe(spec) +
                " scales the whole tensor (block [0,0]); a grouped tensor needs a block-scaled quantizer");
  if (!a.swizzled.empty())
    if (const std::string why = swizzle_refusal(spec); !why.empty()) throw Error("--swizzled-scales: " + why);
  OutputSet out;  // every output is checked before any work, and all or none are written
  for (const std::string* p : {&a.dequant, &a.codes, &a.scales, &a.global, &a.swizzled})
    if (p == &a.dequant || !p->empty()) out.add(*p);
  std::vector<int64_t> sizes;
  if (grouped) sizes = read_group_sizes(a.groups);
  const Tensor<float> x = read_matrix(a.in);
  const int64_t rows = x.shape[0], cols = x.shape[1];
  if (grouped) check_group_sizes((a.groups + " (--groups, for " + a.in + ")").c_str(), sizes, rows);
  const MatrixView<const float> xv(x.data.data(), rows, cols);
  set_activity("quantizing " + a.in + " " + shape_str(x.shape) + " with " + describe(spec) +
               (grouped ? " in " + std::to_string(sizes.size()) + " groups" : ""));
  const NonFinite nf = count_nonfinite(x.data.data(), x.data.size());
  RandomStream rs{a.seed, a.stream};
  std::vector<uint32_t> words;
  int64_t per_row = 0;
  if (!a.rbits.empty()) {
    per_row = sr_words_per_row(spec.sr_bits, *spec.element, cols);
    words = read_rbits(a.rbits, uint64_t(rows * per_row),
                       "[" + std::to_string(rows) + ", " + std::to_string(per_row) + "]: rows x words a row under " +
                           sr_bits_name(spec.sr_bits));
    rs.words = words.data();
  }
  // Without --groups: one group of all the rows (quantize_grouped then equals quantize()).
  QuantizedTensor q;
  GroupedQuantizedTensor g;
  if (grouped) {
    std::vector<RandomStream> streams = consecutive_streams(a.seed, a.stream, sizes.size());
    if (!words.empty()) {  // --rbits: group k reads the words of its own rows (its word 0 at its first row)
      int64_t row = 0;
      for (size_t k = 0; k < sizes.size(); ++k) {
        streams[k].words = words.data() + row * per_row;
        row += sizes[k];
      }
    }
    g = quantize_grouped(spec, xv, sizes, streams);
  } else {
    q = quantize(spec, xv, rs);
  }
  const std::vector<float>& dequant = grouped ? g.dequant : q.dequant;
  if (nf.any()) {
    const NonFinite out_nf = count_nonfinite(dequant.data(), dequant.size());
    std::fprintf(stderr, "warning: %s: %s; %s: %s (%" PRId64 " of %zu outputs are NaN)\n", a.in.c_str(),
                 nonfinite_str(nf).c_str(), describe(spec).c_str(), nonfinite_rule(spec, nf, grouped).c_str(),
                 out_nf.nan, dequant.size());
  }
  out.write_npy(a.dequant, DType::float32, {rows, cols}, dequant.data());
  if (!a.codes.empty()) out.write_npy(a.codes, DType::uint8, {rows, cols}, (grouped ? g.codes : q.codes).data());
  if (grouped) {
    const int64_t groups = int64_t(sizes.size()), scale_rows = g.scale_row_offset.back();
    if (!a.scales.empty()) {
      if (scales_are_float(spec))
        out.write_npy(a.scales, DType::float32, {scale_rows, g.scale_cols}, g.scales.data());
      else
        out.write_npy(a.scales, DType::uint8, {scale_rows, g.scale_cols}, g.scale_codes.data());
    }
    if (!a.global.empty()) out.write_npy(a.global, DType::float32, {groups}, g.global_decode.data());
  } else {
    if (!a.scales.empty()) write_scales(out, a.scales, q);
    if (!a.global.empty()) out.write_npy(a.global, DType::float32, {1}, &q.global_decode);
  }
  if (!a.swizzled.empty()) {
    const std::vector<uint8_t> sw = grouped ? swizzled_scales(g) : swizzled_scales(q);
    out.write_npy(a.swizzled, DType::uint8, {int64_t(sw.size())}, sw.data());
  }
  out.commit();
  if (!a.stats) return;
  if (!grouped) return print_stats(q, quant_stats(q, xv), finite_stats(q, xv)), print_numerics(q, xv);
  int64_t row = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::printf("%sgroup %zu of %zu: rows [%" PRId64 ", %" PRId64 ")\n", k ? "\n" : "", k, sizes.size(), row,
                row + sizes[k]);
    if (sizes[k] > 0) {
      const QuantizedTensor t = group_tensor(g, k, row);
      const MatrixView<const float> gv(x.data.data() + row * cols, sizes[k], cols);
      print_stats(t, quant_stats(t, gv), finite_stats(t, gv));
      print_numerics(t, gv);
    }
    row += sizes[k];
  }
}

// ---- bench quantize ---------------------------------------------------------------------

struct BenchArgs {
  std::string backend = "cpu";
  int64_t rows = 4096, cols = 4096;
  int repeats = 5;
};

void run_bench_cpu(const BenchArgs& a) {
  const int64_t n = a.rows * a.cols;
  set_activity("allocating the float32 tensors of --rows " + std::to_string(a.rows) + " x --cols " +
               std::to_string(a.cols) + " for bench quantize");
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  set_activity("");
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = normal(rng);
  const double bytes = double(n) * 4.0;
  const int all = omp_get_max_threads();
  const int threads[2] = {1, all};
  auto restore = [&] {
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < 64; ++k) {
      const int64_t lo = n * k / 64, hi = n * (k + 1) / 64;
      std::memcpy(y.data() + lo, x.data() + lo, size_t(hi - lo) * 4);
    }
  };
  // best-of-repeats of fn() with `prep()` untimed before each run
  auto best = [&](auto prep, auto fn) {
    double b = 1e300;
    for (int r = 0; r < a.repeats; ++r) {
      prep();
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      b = std::min(b, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return b;
  };
  double t_memcpy[2];
  for (int t = 0; t < 2; ++t) {
    omp_set_num_threads(threads[t]);
    t_memcpy[t] = best([] {}, restore);
  }
  std::printf("fp4lab bench quantize (cpu): fake_quantize of a %" PRId64 " x %" PRId64
              " float32 N(0,1) tensor in place, best of %d\n",
              a.rows, a.cols, a.repeats);
  std::printf(
      "GB/s = input bytes read / time; 'x memcpy' = time / time of a memcpy of the same bytes (same run, same "
      "thread count)\n\n");
  std::printf("%-28s %10s %8s %9s | %10s %8s %9s\n", "case", "1 thr ms", "GB/s", "x memcpy", "all ms", "GB/s",
              "x memcpy");
  std::printf("%-28s %10.2f %8.2f %9.2f | %10.2f %8.2f %9.2f   (%d threads)\n", "memcpy", t_memcpy[0] * 1e3,
              bytes / t_memcpy[0] * 1e-9, 1.0, t_memcpy[1] * 1e3, bytes / t_memcpy[1] * 1e-9, 1.0, all);
  struct Case {
    std::string label;
    QuantizerSpec spec;
  };
  std::vector<Case> cases;
  for (const char* base : {"mxfp4", "mxfp8_e4m3", "nvfp4"}) {
    QuantizerSpec s = quantizer_by_name(base);
    cases.push_back({std::string(base) + " rn", s});
    s.round = Round::rs;
    cases.push_back({std::string(base) + " rs (SR)", s});
  }
  QuantizerSpec r = quantizer_by_name("nvfp4");
  r.rht = true;
  cases.push_back({"nvfp4 rn + RHT", r});
  double t_rn[2] = {0, 0};
  for (const Case& c : cases) {
    double t[2];
    for (int k = 0; k < 2; ++k) {
      omp_set_num_threads(threads[k]);
      t[k] = best(restore, [&] { fake_quantize(c.spec, MatrixView<float>(y.data(), a.rows, a.cols), {1, 2}); });
    }
    const bool is_rn = c.label.find(" rn") != std::string::npos && c.label.find("RHT") == std::string::npos;
    if (is_rn) t_rn[0] = t[0], t_rn[1] = t[1];
    char extra[96] = "";
    if (!is_rn) std::snprintf(extra, sizeof extra, "   overhead vs rn: %.2fx / %.2fx", t[0] / t_rn[0], t[1] / t_rn[1]);
    std::printf("%-28s %10.2f %8.2f %9.2f | %10.2f %8.2f %9.2f%s\n", c.label.c_str(), t[0] * 1e3, bytes / t[0] * 1e-9,
                t[0] / t_memcpy[0], t[1] * 1e3, bytes / t[1] * 1e-9, t[1] / t_memcpy[1], extra);
  }
  omp_set_num_threads(all);
}

void run_bench(const BenchArgs& a) {
  if (a.rows <= 0 || a.cols <= 0) throw Error("--rows and --cols must be positive");
  if (a.rows > INT64_MAX / a.cols) throw Error("--rows x --cols overflows 64 bits");
  if (a.repeats <= 0) throw Error("--repeats must be positive, got " + std::to_string(a.repeats));
  if (a.backend == "cpu") return run_bench_cpu(a);
  if (a.backend == "cuda") {
#ifdef FP4LAB_WITH_CUDA
    cuda::bench_quantize(a.rows, a.cols, {"mxfp4", "mxfp8_e4m3", "nvfp4"}, a.repeats);
    return;
#else
    throw Error(
        "--backend cuda: this fp4lab was built without the CUDA backend (configure with -DFP4LAB_CUDA=ON on a "
        "machine with nvcc)");
#endif
  }
  throw Error("--backend '" + a.backend + "' is unknown; valid: cpu, cuda");
}

}  // namespace

void register_quantize_commands(CLI::App& app) {
  auto qa = std::make_shared<QuantizeArgs>();
  CLI::App* q = app.add_subcommand(
      "quantize",
      "Block-quantize a 2-D float32 .npy tensor bit-exactly (MX with fp4lab's, torchao's and TE's scale rules,\n"
      "NVFP4 with TE's 4/6, row-scaled, reference (emulate te_reference), fast-math (emulate te_fast_math,\n"
      "te_fused_fast_math) and RHT (rht_signs te,\n"
      "rht_output bf16) forms, Quartet II's kernels and Triton simulation (emulate quartet2, quartet2_triton;\n"
      "its backward's MS-EDEN after its 128-point rotation: quartet2_eden_triton, rht_kind quartet2_128),\n"
      "TetraJet-v2's double-block quantizer (emulate tetrajet2_source, _triton, _kernel), per-tensor FP8, FP8\n"
      "block scaling as DeepGEMM, TE and DeepSeek-V3 compute it,\n"
      "fp4-trainkit's arithmetic with emulate fp4tk) and write its dequantized values, and optionally the\n"
      "element codes, block scales, global scale and swizzled scales.\n"
      "With --groups the rows are cut into consecutive groups (a mixture of experts' tokens by expert, or an\n"
      "expert weight [E,N,K] as E groups of N rows), each quantized alone (sim/grouped.hpp).\n"
      "Example: fp4lab quantize --quantizer nvfp4 x.npy --dequant xq.npy --codes c.npy --scales s.npy --stats\n"
      "         fp4lab quantize --quantizer nvfp4 x.npy --groups sizes.npy --dequant xq.npy --scales s.npy");
  std::string canned;  // the registry's names, so the help cannot go stale
  for (const std::string& n : quantizer_names()) canned += (canned.empty() ? "" : ", ") + n;
  q->add_option("--quantizer", qa->quantizer,
                "A canned name (" + canned + "), a JSON object such as\n"
                "'{\"element\":\"e2m1\",\"scale\":\"e8m0\",\"block\":[1,32],\"scale_rule\":\"ceil\"}', or a JSON file")
      ->required();
  q->add_option("IN.npy", qa->in, "Input: float32 [rows, cols] (a 1-D array is one row)")->required();
  q->add_option("--dequant", qa->dequant, "Output: float32 [rows, cols] dequantized values")->required();
  q->add_option("--codes", qa->codes, "Output: uint8 [rows, cols] element codes, one per byte");
  q->add_option(
      "--scales", qa->scales,
      "Output: [ceil(rows/br), ceil(cols/bc)] block scales: uint8 codes (e8m0, ue4m3) or float32 (per-tensor);\n"
      "with --groups each group's [ceil(rows_g/br), ceil(cols/bc)] scales, stacked in group order");
  q->add_option("--global-scale", qa->global,
                "Output: float32 [1], the global decode scale (NVFP4; 1 otherwise); with --groups float32\n"
                "[groups], each group's own (1 for an empty group)");
  q->add_option("--swizzled-scales", qa->swizzled,
                "Output: uint8 [bytes], the scale codes in cuBLASLt's swizzled layout (sim/packing.hpp) for 4-bit\n"
                "elements with blocks along a row ([1,bc]; a [br,bc] tile's scale repeated for its br rows):\n"
                "[rows, C] padded to round_up(rows,128) x round_up(C,4); with --groups each group's [rows_g, C]\n"
                "swizzled alone, groups one after another (an empty group takes no bytes)");
  q->add_option("--groups", qa->groups,
                "int64 .npy [groups] of rows per group (zeros allowed, summing to the input's rows): quantize each\n"
                "group of consecutive rows alone, with its own global scale and SR stream: group g draws from\n"
                "Philox (--seed, --stream + g), or with --rbits from the words of its own rows (its word 0 at its\n"
                "first row). Not for per-tensor quantizers");
  q->add_option("--seed", qa->seed, "Seed of the stochastic-rounding bits (Philox; see --sr-bits for the word of an element)")
      ->capture_default_str();
  q->add_option("--stream", qa->stream, "Philox stream id of the stochastic-rounding bits")->capture_default_str();
  q->add_option("--sr-bits", qa->sr_bits,
                "Random-bit contract of round rs, overriding the quantizer's sr_bits: per_element (32 bits an\n"
                "element, word r*cols+c) or ptx_x4 (PTX cvt.rs: word r*ceil(cols/4)+c/4, byte c%4 of it)");
  q->add_option("--rbits", qa->rbits,
                "uint32 .npy [rows, words a row] of random words to use instead of Philox (cols words a row for\n"
                "per_element, ceil(cols/4) for ptx_x4): reproduces a kernel's codes from its own random stream\n"
                "(with --groups a group numbers its words from its first row)");
  q->add_flag("--stats", qa->stats,
              "Print SQNR, max abs error, flushed-to-zero and saturated fractions, scale under/overflow counts,\n"
              "and the figures of a training run's numerics.jsonl (train/numerics.hpp): inexact fraction, scale\n"
              "floor/ceiling and zero-block fractions, amax, mean error under SR (with --groups, for each group)");
  q->callback([qa] { run_quantize(*qa); });
}

void register_bench_quantize(CLI::App& bench) {
  auto ba = std::make_shared<BenchArgs>();
  CLI::App* b = bench.add_subcommand(
      "quantize",
      "Quantizer throughput on a rows x cols tensor.\n"
      "cpu: mxfp4, mxfp8_e4m3 and nvfp4 fake quantization of float32, RN and SR, and NVFP4 with RHT, on 1 thread\n"
      "and all OpenMP threads, with the ratio to a memcpy of the same bytes.\n"
      "cuda: the fused kernels from bf16 and float32 input (RN; SR on MXFP4 and NVFP4; RHT with RN and SR on\n"
      "[1,16] and [16,1] blocks; NVFP4 16x16; amax given), the emulations on the generic rule kernels (Quartet\n"
      "II's forward and MS-EDEN, with and without its 128-point rotation; TetraJet-v2; TE fast math), the SR\n"
      "floors (Philox words and 4-bit output alone,\n"
      "and with core's E2M1 SR encoder), and the trainer's two NVFP4 operands of one tensor (two calls against\n"
      "one pass), as a fraction of a device-to-device copy measured in the same run.");
  b->add_option("--backend", ba->backend, "cpu, or cuda (needs the CUDA build)")->capture_default_str();
  b->add_option("--rows", ba->rows, "Tensor rows")->capture_default_str();
  b->add_option("--cols", ba->cols, "Tensor columns")->capture_default_str();
  b->add_option("--repeats", ba->repeats, "Runs per measurement; cpu reports the fastest, cuda the median (at least 3)")
      ->capture_default_str();
  b->callback([ba] { run_bench(*ba); });
}

}  // namespace fp4lab
