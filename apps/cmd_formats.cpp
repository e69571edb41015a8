// `fp4lab formats`, `fp4lab cast`, `fp4lab decode` and `fp4lab bench cast`.
//
// cast/decode are thin wrappers around core/cast.hpp: check the output path,
// read a .npy, convert, write a .npy atomically (OutputSet), so a failure
// never leaves a partial output file. cast warns (stderr, one line) about NaN
// and Inf inputs and says what the target format makes of them.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "core/cast.hpp"
#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/npy.hpp"
#include "sim/packing.hpp"

namespace fp4lab {

namespace {

// ---- fp4lab formats -----------------------------------------------------------

// A limit as text: powers of two beyond 2^+-4 as "2^k", else up to 9 digits.
std::string limit_str(float v) {
  int e = 0;
  const float m = std::frexp(v, &e);
  char buf[64];
  if (m == 0.5f && (e - 1 > 4 || e - 1 < -4)) {
    std::snprintf(buf, sizeof buf, "2^%d", e - 1);
  } else {
    std::snprintf(buf, sizeof buf, "%.9g", double(v));
  }
  return buf;
}

std::string hex_code(const Format& f, uint32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof buf, f.bits() > 8 ? "0x%04X" : "0x%02X", c);
  return buf;
}

std::string nan_str(const Format& f) {
  switch (f.special) {
    case Special::none: return "none";
    case Special::ieee: return hex_code(f, f.nan_code()) + " (+others)";
    case Special::fn:
      return f.is_signed ? hex_code(f, f.nan_code()) + "," + hex_code(f, f.nan_code() | f.sign_bit())
                         : hex_code(f, f.nan_code());
    default: return hex_code(f, f.nan_code());
  }
}

std::string inf_str(const Format& f) {
  if (!f.has_inf()) return "none";
  return "+" + hex_code(f, f.inf_code()) + " -" + hex_code(f, f.inf_code() | f.sign_bit());
}

const char* note_str(const Format& f) {
  if (f.is_int) return "MXINT8 element: two's complement k, value k/64";
  switch (f.special) {
    case Special::none: return "all codes finite; NaN in -> +max, overflow saturates";
    case Special::ieee: return "IEEE-style Inf and NaN";
    case Special::fn: return f.is_signed ? "no Inf; NaN = S.1111.111" : "unsigned (NVFP4 block scale); no Inf";
    case Special::fnuz: return "no Inf, no -0; NaN = 0x80";
    case Special::e8m0: return "unsigned power of two 2^(c-127); no zero";
  }
  return "";
}

void print_formats() {
  std::printf("%-16s %4s %2s %2s %4s  %-14s %-12s %-14s %-20s %-15s %s\n", "format", "bits", "E", "M", "bias",
              "max finite", "min normal", "min subnormal", "NaN codes", "Inf codes", "notes");
  for (const Format* fp : all_formats) {
    const Format& f = *fp;
    const std::string e = f.is_int ? "-" : std::to_string(f.exp_bits);
    const std::string bias = f.is_int ? "-" : std::to_string(f.bias);
    const std::string sub = f.has_subnormals() ? limit_str(min_subnormal(f)) : "-";
    std::printf("%-16s %4d %2s %2d %4s  %-14s %-12s %-14s %-20s %-15s %s\n", std::string(f.name).c_str(), f.bits(),
                e.c_str(), f.man_bits, bias.c_str(), limit_str(max_finite(f)).c_str(), limit_str(min_normal(f)).c_str(),
                sub.c_str(), nan_str(f).c_str(), inf_str(f).c_str(), note_str(f));
  }
  std::printf(
      "\nCodes are the format's bits, right-aligned (e2m1: 0..15, sign in bit 3). Rounding modes: rn rna rz rp rm rs;\n"
      "overflow policies: saturate (to +-max finite) or nonsaturate (to Inf, else NaN, where the format has them).\n"
      "Names accepted on input: %s\n",
      format_names().c_str());
}

// ---- fp4lab cast / decode ---------------------------------------------------------

struct CastArgs {
  std::string to, round = "rn", overflow = "saturate", in, out, sr_bits = "per_element", rbits;
  uint64_t seed = 0;
  bool packed = false;
};

// Packed FP4 storage (sim/packing.hpp): two 4-bit codes a byte along the last
// axis, element 2k in the LOW nibble of byte k and element 2k+1 in the HIGH
// nibble (PTX cvt.e2m1x2, torch.float4_e2m1fn_x2, TransformerEngine); a last
// axis of odd length leaves the last high nibble 0. Rows = every axis but the last.
void check_packable(const Format& f, const std::string& what) {
  if (f.bits() != 4)
    throw Error(what + ": --packed stores two 4-bit codes a byte; " + std::string(f.name) + " codes are " +
                std::to_string(f.bits()) + "-bit (choose e2m1, or drop --packed)");
}

template <class T, class C>
void cast_typed(const Format& f, const NpyArray& a, const CastOptions& opt, const CastArgs& args, OutputSet& out,
                DType out_dtype) {
  const size_t n = size_t(shape_numel(a.shape));
  set_activity("casting " + args.in + " (" + std::to_string(n) + " elements) to " + std::string(f.name));
  std::vector<T> x(n);
  if (n) std::memcpy(x.data(), a.bytes.data(), n * sizeof(T));
  const NonFinite nf = count_nonfinite(x.data(), n);
  if (nf.any())
    std::fprintf(stderr, "warning: %s: %s; %s\n", args.in.c_str(), nonfinite_str(nf).c_str(),
                 nonfinite_encoding(f, opt.round, opt.overflow, nf).c_str());
  std::vector<C> codes(n);
  encode_array(f, x.data(), codes.data(), n, opt);
  if constexpr (sizeof(C) == 1) {
    if (args.packed) {
      const int64_t cols = a.shape.back(), rows = cols ? int64_t(n) / cols : 0;
      Shape shape = a.shape;
      shape.back() = (cols + 1) / 2;
      const std::vector<uint8_t> bytes = pack_fp4(codes.data(), rows, cols);
      out.write_npy(args.out, DType::uint8, shape, bytes.data());
      out.commit();
      return;
    }
  }
  out.write_npy(args.out, out_dtype, a.shape, codes.data());
  out.commit();
}

void run_cast(const CastArgs& args) {
  const Format& f = format_by_name(args.to);
  CastOptions opt;
  opt.round = parse_round(args.round);
  opt.overflow = parse_overflow(args.overflow);
  opt.seed = args.seed;
  opt.stream = 0;
  if (code_bytes(f) == 0)
    throw Error("--to " + args.to +
                ": float32 codes are 32-bit and cannot be written; choose a format of at most 16 bits");
  OutputSet out;
  out.add(args.out);
  set_activity("reading " + args.in);
  const NpyArray a = read_npy(args.in);
  if (a.dtype != DType::float32 && a.dtype != DType::float64)
    throw Error(args.in + ": cast needs float32 or float64 input, got " + dtype_name(a.dtype));
  if (args.packed) {
    check_packable(f, "--to " + args.to);
    if (a.shape.empty()) throw Error(args.in + ": --packed needs an array of at least one axis, got a scalar");
  }
  // SR: the contract's groups run along the last axis (a row); given words replace Philox.
  opt.sr_bits = sr_bits_option(args.sr_bits);
  opt.row_length = a.shape.empty() ? 1 : uint64_t(a.shape.back());
  std::vector<uint32_t> words;
  if (opt.round != Round::rs && (!args.rbits.empty() || opt.sr_bits != SrBits::per_element))
    throw Error("--rbits and --sr-bits apply to --round rs only, got --round " + args.round);
  if (opt.round == Round::rs) check_sr_bits(opt.sr_bits, f, "--to " + args.to);
  if (!args.rbits.empty()) {
    const uint64_t n = uint64_t(shape_numel(a.shape));
    const uint64_t rows = opt.row_length ? n / opt.row_length : 0;
    words = read_rbits(args.rbits, sr_word_count(f, n, opt),
                       opt.sr_bits == SrBits::per_element
                           ? "one word per element"
                           : std::to_string(rows) + " rows x " +
                                 std::to_string(sr_words_per_row(opt.sr_bits, f, int64_t(opt.row_length))) +
                                 " words a row: one per " + std::to_string(sr_group(opt.sr_bits, f)) +
                                 " elements of the last axis");
    opt.words = words.data();
  }
  const bool wide = code_bytes(f) == 2;
  const DType out_dtype = wide ? DType::uint16 : DType::uint8;
  if (a.dtype == DType::float32) {
    wide ? cast_typed<float, uint16_t>(f, a, opt, args, out, out_dtype)
         : cast_typed<float, uint8_t>(f, a, opt, args, out, out_dtype);
  } else {
    wide ? cast_typed<double, uint16_t>(f, a, opt, args, out, out_dtype)
         : cast_typed<double, uint8_t>(f, a, opt, args, out, out_dtype);
  }
}

struct DecodeArgs {
  std::string from, in, out;
  bool packed = false;
  int64_t cols = -1;  // --packed: length of the unpacked last axis (-1: twice the bytes)
};

// --packed: uint8 [..., B] bytes of two codes each -> [..., cols] codes, one a byte.
NpyArray unpack_input(const NpyArray& a, const DecodeArgs& args) {
  if (a.shape.empty()) throw Error(args.in + ": --packed needs an array of at least one axis, got a scalar");
  const int64_t b = a.shape.back();
  const int64_t cols = args.cols < 0 ? 2 * b : args.cols;
  if ((cols + 1) / 2 != b)
    throw Error("--cols " + std::to_string(cols) + ": " + args.in + "'s last axis holds " + std::to_string(b) +
                " bytes, which pack " + std::to_string(2 * b - 1) + " or " + std::to_string(2 * b) + " codes");
  const int64_t rows = b ? shape_numel(a.shape) / b : 0;
  NpyArray u;
  u.dtype = DType::uint8;
  u.shape = a.shape;
  u.shape.back() = cols;
  if (rows == 0) return u;
  const std::vector<uint8_t> codes = unpack_fp4(a.bytes.data(), rows, cols);
  u.bytes.assign(codes.begin(), codes.end());
  return u;
}

template <class C>
void decode_typed(const Format& f, const NpyArray& a, const DecodeArgs& args, OutputSet& dst) {
  const size_t n = size_t(shape_numel(a.shape));
  set_activity("decoding " + args.in + " (" + std::to_string(n) + " codes)");
  std::vector<C> codes(n);
  if (n) std::memcpy(codes.data(), a.bytes.data(), n * sizeof(C));
  const size_t bad = first_invalid_code(f, codes.data(), n);
  if (bad < n)
    throw Error(args.in + ": element " + std::to_string(bad) + " holds code " + std::to_string(codes[bad]) + ", but " +
                std::string(f.name) + " codes are 0.." + std::to_string(f.code_count() - 1));
  std::vector<float> out(n);
  decode_array(f, codes.data(), out.data(), n);
  dst.write_npy(args.out, DType::float32, a.shape, out.data());
  dst.commit();
}

void run_decode(const DecodeArgs& args) {
  const Format& f = format_by_name(args.from);
  if (code_bytes(f) == 0)
    throw Error("--from " + args.from + ": float32 codes are not supported; choose a format of at most 16 bits");
  if (args.packed) check_packable(f, "--from " + args.from);
  if (args.cols >= 0 && !args.packed) throw Error("--cols applies to --packed input only");
  OutputSet dst;
  dst.add(args.out);
  set_activity("reading " + args.in);
  const NpyArray a = read_npy(args.in);
  const DType want = code_bytes(f) == 2 ? DType::uint16 : DType::uint8;
  if (a.dtype != want)
    throw Error(args.in + ": " + std::string(f.name) + " codes must be stored as " + dtype_name(want) + ", got " +
                dtype_name(a.dtype));
  if (args.packed)
    decode_typed<uint8_t>(f, unpack_input(a, args), args, dst);
  else if (want == DType::uint8)
    decode_typed<uint8_t>(f, a, args, dst);
  else
    decode_typed<uint16_t>(f, a, args, dst);
}

// ---- fp4lab bench cast --------------------------------------------------------

struct BenchArgs {
  int64_t elements = int64_t(1) << 24;
  int repeats = 5;
};

// Best-of-`repeats` wall time of fn(), in seconds.
template <class Fn>
double best_time(int repeats, Fn fn) {
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

void run_bench_cast(const BenchArgs& args) {
  if (args.elements <= 0) throw Error("--elements must be positive, got " + std::to_string(args.elements));
  if (args.repeats <= 0) throw Error("--repeats must be positive, got " + std::to_string(args.repeats));
  const size_t n = size_t(args.elements);
  set_activity("allocating the arrays of --elements " + std::to_string(n) + " for bench cast");
  // Inputs: magnitudes log-uniform in [2^-12, 2^12] with random signs, so every
  // format sees its subnormal, normal and overflow ranges.
  std::vector<float> x(n), copy(n);
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<float> ex(-12.0f, 12.0f);
  for (size_t i = 0; i < n; ++i) x[i] = ((rng() & 1) ? -1.0f : 1.0f) * std::exp2(ex(rng));
  std::vector<uint8_t> c8(n);
  std::vector<uint16_t> c16(n);
  set_activity("");

  const int all = omp_get_max_threads();
  const int thread_counts[2] = {1, all};
  auto memcpy_all = [&]() {
    // The same bytes split over threads, as the encoders split their work.
    const int64_t chunks = 64;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < chunks; ++k) {
      const size_t lo = n * size_t(k) / chunks, hi = n * size_t(k + 1) / chunks;
      std::memcpy(copy.data() + lo, x.data() + lo, (hi - lo) * sizeof(float));
    }
  };
  double memcpy_rate[2];
  for (int t = 0; t < 2; ++t) {
    omp_set_num_threads(thread_counts[t]);
    memcpy_rate[t] = double(n) / best_time(args.repeats, memcpy_all);
  }

  std::printf("fp4lab bench cast: %zu float32 elements (|x| log-uniform in [2^-12, 2^12]), best of %d runs\n", n,
              args.repeats);
  std::printf(
      "G el/s = 10^9 elements per second; 'x memcpy' = encode rate / rate of memcpy of the same float32 data\n\n");
  std::printf("%-16s %-6s %12s %10s %14s %10s\n", "format", "round", "1 thread", "x memcpy", "threads", "x memcpy");
  std::printf("%-16s %-6s %12.3f %10s %11.3f@%-2d %10s\n", "(memcpy)", "-", memcpy_rate[0] * 1e-9, "1",
              memcpy_rate[1] * 1e-9, all, "1");
  struct Case {
    const Format* f;
    Round r;
  };
  std::vector<Case> cases;
  for (const Format* f : all_formats)
    if (code_bytes(*f) != 0) cases.push_back({f, Round::rn});
  cases.push_back({&float4_e2m1fn, Round::rz});
  cases.push_back({&float4_e2m1fn, Round::rs});
  cases.push_back({&float8_e4m3fn, Round::rz});
  cases.push_back({&float8_e4m3fn, Round::rs});
  for (const Case& c : cases) {
    CastOptions opt;
    opt.round = c.r;
    opt.seed = 1;
    double rate[2];
    for (int t = 0; t < 2; ++t) {
      omp_set_num_threads(thread_counts[t]);
      rate[t] = double(n) / best_time(args.repeats, [&] {
                  if (code_bytes(*c.f) == 1)
                    encode_array(*c.f, x.data(), c8.data(), n, opt);
                  else
                    encode_array(*c.f, x.data(), c16.data(), n, opt);
                });
    }
    std::printf("%-16s %-6s %12.3f %10.2f %11.3f@%-2d %10.2f\n", std::string(c.f->name).c_str(),
                std::string(round_name(c.r)).c_str(), rate[0] * 1e-9, rate[0] / memcpy_rate[0], rate[1] * 1e-9, all,
                rate[1] / memcpy_rate[1]);
  }
  omp_set_num_threads(all);
}

}  // namespace

void register_format_commands(CLI::App& app) {
  CLI::App* formats = app.add_subcommand(
      "formats",
      "List every number format fp4lab knows (FP4/FP6/FP8 elements, E8M0/UE4M3 block scales, MXINT8, bf16, fp16, "
      "fp32)\n"
      "with its field widths, exponent bias, largest/smallest values and how it encodes NaN and Inf.");
  formats->callback([] { print_formats(); });

  auto cargs = std::make_shared<CastArgs>();
  CLI::App* cast = app.add_subcommand(
      "cast",
      "Round every element of a float32 or float64 .npy array to a low-precision format and write the codes\n"
      "(the format's bit patterns: uint8 for formats of up to 8 bits, uint16 for bfloat16/float16), same shape.\n"
      "Example: fp4lab cast --to e2m1 x.npy x_codes.npy     (then: fp4lab decode --from e2m1 x_codes.npy x_fp4.npy)");
  cast->add_option("--to", cargs->to,
                   "Target format, e.g. float4_e2m1fn (alias e2m1), float8_e4m3fn (e4m3); see `fp4lab formats`")
      ->required();
  cast->add_option(
          "--round", cargs->round,
          "Rounding: rn = nearest, ties to even (default); rna = nearest, ties away from zero; rz = toward zero;\n"
          "rp = toward +inf; rm = toward -inf; rs = stochastic (random bits from --seed)")
      ->capture_default_str();
  cast->add_option("--overflow", cargs->overflow,
                   "What values beyond the largest finite value become: saturate = +-max finite (default);\n"
                   "nonsaturate = +-Inf where the format has Inf, else NaN (formats with neither always saturate)")
      ->capture_default_str();
  cast->add_option(
          "--seed", cargs->seed,
          "Seed of the random bits for --round rs (Philox4x32-10, stream 0, counter = element index in C order);\n"
          "the same seed gives the same codes on any machine and thread count")
      ->capture_default_str();
  cast->add_option("--sr-bits", cargs->sr_bits,
                   "Random-bit contract of --round rs: per_element = 32 bits an element (element i: word i);\n"
                   "ptx_x4 = PTX cvt.rs: 4 consecutive elements of the last axis share one word (2 for bfloat16/\n"
                   "float16), element k of the group uses its byte k (bits 16k.. for bf16/f16: 16 / 13 bits)")
      ->capture_default_str();
  cast->add_option("--rbits", cargs->rbits,
                   "uint32 .npy of the random words to use instead of Philox: one per element (per_element), or\n"
                   "[rows, ceil(last axis / 4)] (ptx_x4), so a kernel's codes from its own words can be reproduced");
  cast->add_option("IN.npy", cargs->in, "Input: float32 or float64 .npy array (C order, any shape)")->required();
  cast->add_flag("--packed", cargs->packed,
                 "e2m1 only: two codes a byte along the last axis, element 2k in the LOW nibble of byte k, 2k+1 in\n"
                 "the HIGH nibble (torch.float4_e2m1fn_x2, TransformerEngine, PTX cvt.e2m1x2); the last axis becomes\n"
                 "ceil(n/2) bytes (odd n: the last high nibble is 0)");
  cast->add_option("OUT.npy", cargs->out, "Output: codes, written atomically (never left half-written)")->required();
  cast->callback([cargs] { run_cast(*cargs); });

  auto dargs = std::make_shared<DecodeArgs>();
  CLI::App* dec = app.add_subcommand(
      "decode",
      "Turn codes of a format (as written by `fp4lab cast`) back into their exact float32 values, same shape.\n"
      "NaN codes decode to NaN, Inf codes to +-Inf. Example: fp4lab decode --from e4m3 codes.npy values.npy\n"
      "Packed FP4 (two codes a byte, low nibble first): fp4lab decode --from e2m1 --packed packed.npy values.npy");
  dec->add_option("--from", dargs->from, "Format of the codes, e.g. float8_e4m3fn (alias e4m3); see `fp4lab formats`")
      ->required();
  dec->add_option("IN.npy", dargs->in, "Input: codes as uint8 (formats of up to 8 bits) or uint16 (bfloat16, float16)")
      ->required();
  dec->add_flag("--packed", dargs->packed,
                "e2m1 only: IN holds two codes a byte (uint8 [..., B]) along the last axis, element 2k in the LOW\n"
                "nibble of byte k and 2k+1 in the HIGH nibble (torch.float4_e2m1fn_x2 viewed as uint8,\n"
                "TransformerEngine, `fp4lab cast --packed`); OUT is [..., 2B] (or [..., --cols])");
  dec->add_option("--cols", dargs->cols,
                  "With --packed: length of the unpacked last axis, 2B or 2B-1 (odd: the last high nibble is "
                  "ignored); default 2B");
  dec->add_option("OUT.npy", dargs->out, "Output: float32 values, written atomically")->required();
  dec->callback([dargs] { run_decode(*dargs); });
}

void register_bench_cast(CLI::App& bench) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* b = bench.add_subcommand(
      "cast",
      "Encode throughput of every format (float32 in, codes out), on 1 thread and on all OpenMP threads,\n"
      "and its ratio to a memcpy of the same float32 data measured in the same run.");
  b->add_option("--elements", args->elements, "Number of float32 elements per run")->capture_default_str();
  b->add_option("--repeats", args->repeats, "Runs per measurement; the fastest is reported")->capture_default_str();
  b->callback([args] { run_bench_cast(*args); });
}

}  // namespace fp4lab
