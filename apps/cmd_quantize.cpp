// `fp4lab quantize`, `fp4lab golden`, `fp4lab verify` and `fp4lab bench quantize`.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "core/error.hpp"
#include "core/npy.hpp"
#include "sim/packing.hpp"
#include "sim/quantizer.hpp"
#include "sim/block_scales.hpp"
#ifdef FP4LAB_WITH_CUDA
#include "apps/bench_cuda.hpp"
#endif

namespace fp4lab {

namespace {

namespace fs = std::filesystem;

// ---- shared helpers -----------------------------------------------------------

// A 2-D float32 input (a 1-D array is one row).
Tensor<float> read_matrix(const std::string& path) {
  Tensor<float> t = read_npy_float32(path);
  if (t.shape.size() == 1) t.shape = {1, t.shape[0]};
  if (t.shape.size() != 2)
    throw Error(path + ": expected a 2-D float32 array [rows, cols] (or 1-D), got shape " + shape_str(t.shape));
  return t;
}

std::string hex_bits(uint32_t v, int digits) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%0*X", digits, v);
  return b;
}

std::string fmt_float(float v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", double(v));
  return b;
}

bool scales_are_float(const QuantizerSpec& q) { return q.scale == &float32; }

void write_scales(const std::string& path, const QuantizedTensor& q) {
  const Shape shape = {q.scale_rows, q.scale_cols};
  if (scales_are_float(q.spec)) {
    write_npy(path, DType::float32, shape, q.scales.data());
  } else {
    write_npy(path, DType::uint8, shape, q.scale_codes.data());
  }
}

void print_stats(const QuantizedTensor& q, const QuantStats& s) {
  const int64_t blocks = q.scale_rows * q.scale_cols;
  std::printf("quantizer          %s\n", describe(q.spec).c_str());
  std::printf("shape              [%" PRId64 ", %" PRId64 "], %" PRId64 " blocks ([%" PRId64 ", %" PRId64 "] scales)\n",
              q.rows, q.cols, blocks, q.scale_rows, q.scale_cols);
  std::printf("sqnr_db            %.4f\n", s.sqnr_db);
  std::printf("max_abs_error      %.9g\n", s.max_abs_error);
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
  std::string quantizer, in, dequant, codes, scales, global;
  uint64_t seed = 0, stream = 0;
  bool stats = false;
};

void run_quantize(const QuantizeArgs& a) {
  const QuantizerSpec spec = parse_quantizer(a.quantizer);
  const Tensor<float> x = read_matrix(a.in);
  const int64_t rows = x.shape[0], cols = x.shape[1];
  const MatrixView<const float> xv(x.data.data(), rows, cols);
  const QuantizedTensor q = quantize(spec, xv, RandomStream{a.seed, a.stream});
  write_npy(a.dequant, DType::float32, {rows, cols}, q.dequant.data());
  if (!a.codes.empty()) write_npy(a.codes, DType::uint8, {rows, cols}, q.codes.data());
  if (!a.scales.empty()) write_scales(a.scales, q);
  if (!a.global.empty()) write_npy(a.global, DType::float32, {1}, &q.global_decode);
  if (a.stats) print_stats(q, quant_stats(q, xv));
}

// ---- golden suite -------------------------------------------------------------------

constexpr const char* suite_format = "fp4lab-golden";
constexpr int suite_version = 1;

struct GoldenQuantizer {
  std::string name;
  QuantizerSpec spec;
};

std::vector<GoldenQuantizer> golden_quantizers() {
  std::vector<GoldenQuantizer> v;
  for (const std::string& n : quantizer_names()) v.push_back({n, quantizer_by_name(n)});
  auto variant = [&](const std::string& name, const std::string& base, auto edit) {
    QuantizerSpec s = quantizer_by_name(base);
    edit(s);
    v.push_back({name, s});
  };
  variant("mxfp8_e4m3_ceil", "mxfp8_e4m3", [](QuantizerSpec& s) { s.scale_rule = ScaleRule::ceil; });
  variant("mxfp4_ceil", "mxfp4", [](QuantizerSpec& s) { s.scale_rule = ScaleRule::ceil; });
  variant("mxfp4_tetrajet", "mxfp4", [](QuantizerSpec& s) { s.scale_rule = ScaleRule::tetrajet; });
  variant("mxfp4_col", "mxfp4", [](QuantizerSpec& s) { s.block_rows = 32, s.block_cols = 1; });
  variant("mxfp4_rs", "mxfp4", [](QuantizerSpec& s) { s.round = Round::rs; });
  variant("mxfp8_e4m3_rz", "mxfp8_e4m3", [](QuantizerSpec& s) { s.round = Round::rz; });
  variant("mxfp8_e5m2_nonsat", "mxfp8_e5m2", [](QuantizerSpec& s) { s.overflow = Overflow::nonsaturate; });
  variant("nvfp4_rs", "nvfp4", [](QuantizerSpec& s) { s.round = Round::rs; });
  variant("nvfp4_rht", "nvfp4", [](QuantizerSpec& s) { s.rht = true, s.rht_seed = 7; });
  variant("nvfp4_noglobal", "nvfp4", [](QuantizerSpec& s) {
    s.scale_rule = ScaleRule::nv_noglobal;
    s.global_scale = GlobalScale::none;
  });
  return v;
}

struct GoldenInput {
  std::string name, description;
  int64_t rows, cols;
  std::vector<float> data;
};

std::vector<GoldenInput> golden_inputs(uint64_t seed) {
  std::vector<GoldenInput> v;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto randn = [&](int64_t r, int64_t c, float sigma) {
    std::vector<float> d(static_cast<size_t>(r * c));
    for (auto& x : d) x = sigma * normal(rng);
    return d;
  };
  v.push_back({"normal", "N(0,1), 128 x 256 (multiples of every block)", 128, 256, randn(128, 256, 1.0f)});
  v.push_back({"odd", "N(0,3^2), 37 x 75 (partial edge blocks in both directions)", 37, 75, randn(37, 75, 3.0f)});
  v.push_back({"tiny",
               "N(0,(1e-6)^2), 64 x 64 (gradient-like magnitudes: UE4M3 scale underflow without a global scale)", 64,
               64, randn(64, 64, 1e-6f)});
  // Adversarial, 64 x 64; each group of 32 columns of a row is one MX block and
  // two NVFP4 blocks. Row kinds (r % 16):
  GoldenInput adv{"adversarial",
                  "64 x 64 crafted rows: element ties at scale 1, zero blocks, -0, power-of-two and just-below amax, "
                  "FP32 subnormals, huge values near FLT_MAX, a single outlier, mixed magnitudes",
                  64, 64, randn(64, 64, 1.0f)};
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.125f, 0.375f, 6.5f, 7.0f, 448.0f - 8.0f};
  for (int64_t r = 0; r < 64; ++r) {
    float* row = adv.data.data() + r * 64;
    switch (r % 16) {
      case 0:  // e2m1 ties with block amax 6 (scale 1 under ocp)
        for (int c = 0; c < 64; ++c) row[c] = (c % 2 ? -1.0f : 1.0f) * ties[c % 7];
        row[0] = 6.0f, row[16] = 6.0f, row[32] = -6.0f, row[48] = 6.0f;
        break;
      case 1:  // all zero, with -0
        for (int c = 0; c < 64; ++c) row[c] = (c % 3 == 0) ? -0.0f : 0.0f;
        break;
      case 2:  // amax exactly a power of two
        for (int c = 0; c < 64; ++c) row[c] *= 0.5f;
        row[3] = 4.0f, row[20] = -8.0f, row[40] = 0x1p-20f, row[60] = 1.0f;
        break;
      case 3:  // amax just below the next power of two / just above max
        row[1] = std::nextafter(8.0f, 0.0f), row[17] = std::nextafter(6.0f, 7.0f);
        row[33] = std::nextafter(448.0f, 500.0f), row[49] = std::nextafter(4.0f, 0.0f);
        break;
      case 4:  // FP32 subnormals only
        for (int c = 0; c < 64; ++c) row[c] = row[c] * 1e-40f;
        break;
      case 5:  // near FLT_MAX
        for (int c = 0; c < 64; ++c) row[c] = row[c] * 1e37f;
        row[7] = 3.4e38f, row[40] = -3.4028235e38f;
        break;
      case 6:  // single huge outlier among small values
        for (int c = 0; c < 64; ++c) row[c] *= 1e-3f;
        row[9] = 1e4f;
        break;
      case 7:  // values at element ties for e4m3 (scale 1 under ceil with amax 448)
        for (int c = 0; c < 64; ++c) row[c] = (c % 2 ? -1.0f : 1.0f) * (1.0f + 0.0625f * float(c % 16));
        row[0] = 448.0f, row[32] = 448.0f;
        break;
      case 8:  // mixed magnitudes across 20 binades
        for (int c = 0; c < 64; ++c) row[c] = row[c] * std::ldexp(1.0f, (c % 20) - 10);
        break;
      default: break;
    }
  }
  v.push_back(std::move(adv));
  GoldenInput sp{"specials", "32 x 64: NaN, +Inf and -Inf in separate blocks (block NaN rules)", 32, 64,
                 randn(32, 64, 1.0f)};
  sp.data[size_t(3 * 64 + 5)] = NAN;
  sp.data[size_t(10 * 64 + 40)] = INFINITY;
  sp.data[size_t(20 * 64 + 17)] = -INFINITY;
  v.push_back(std::move(sp));
  return v;
}

struct GoldenArgs {
  std::string out = "golden";
  uint64_t seed = 1234;
};

void run_golden(const GoldenArgs& a) {
  fs::create_directories(a.out);
  const auto quantizers = golden_quantizers();
  const auto inputs = golden_inputs(a.seed);
  nlohmann::json cases = nlohmann::json::array();
  uint64_t stream = 0;
  int written = 0;
  for (const auto& in : inputs) {
    for (const auto& gq : quantizers) {
      const std::string name = gq.name + "__" + in.name;
      const QuantizerSpec& s = gq.spec;
      if (s.rht && ((s.block_rows == 1 && in.cols % 16) || (s.block_cols == 1 && in.rows % 16))) continue;
      const RandomStream rs{a.seed, stream++};
      const QuantizedTensor q = quantize(s, MatrixView<const float>(in.data.data(), in.rows, in.cols), rs);
      const fs::path dir = fs::path(a.out) / name;
      fs::create_directories(dir);
      write_npy((dir / "input.npy").string(), DType::float32, {in.rows, in.cols}, in.data.data());
      write_npy((dir / "codes.npy").string(), DType::uint8, {in.rows, in.cols}, q.codes.data());
      write_scales((dir / "scales.npy").string(), q);
      write_npy((dir / "dequant.npy").string(), DType::float32, {in.rows, in.cols}, q.dequant.data());
      nlohmann::json c;
      c["name"] = name;
      c["quantizer_name"] = gq.name;
      c["quantizer"] = quantizer_to_json(s);
      c["describe"] = describe(s);
      c["input"] = in.name;
      c["input_description"] = in.description;
      c["shape"] = {in.rows, in.cols};
      c["scale_shape"] = {q.scale_rows, q.scale_cols};
      c["scale_dtype"] = scales_are_float(s) ? "float32" : "uint8";
      c["seed"] = rs.seed;
      c["stream"] = rs.stream;
      c["global_decode"] = double(q.global_decode);
      c["global_decode_bits"] = hex_bits(float_bits(q.global_decode), 8);
      cases.push_back(c);
      ++written;
    }
  }
  nlohmann::json m;
  m["suite"] = suite_format;
  m["suite_version"] = suite_version;
  m["fp4lab_version"] = FP4LAB_VERSION;
  m["seed"] = a.seed;
  m["conventions"] = {
      {"files",
       "<case>/input.npy float32 [rows, cols]; codes.npy uint8 [rows, cols], one element code per byte "
       "(right-aligned bits of the element format; 4-bit candidates may also give packed [rows, ceil(cols/2)], "
       "low nibble = even column); scales.npy [scale_rows, scale_cols]: uint8 scale-format codes (e8m0, ue4m3) "
       "or float32 decode scales (per-tensor fp8); dequant.npy float32 [rows, cols] = value(code) * scale * "
       "global_decode"},
      {"blocks",
       "block [br, bc] tiles the row-major tensor from (0,0); edge blocks are partial, their amax is over "
       "the valid elements only; scale (i, j) belongs to rows [i*br, (i+1)*br), cols [j*bc, (j+1)*bc)"},
      {"stochastic_rounding",
       "element (r, c) draws random_bits(seed, stream, r * cols + c): Philox4x32-10, key = seed, counter = (index/4, "
       "stream), word index%4; see core/philox.hpp and core/encode.hpp (PTX cvt.rs semantics)"},
      {"rht",
       "16-point Hadamard with seed signs along the block axis before quantization; codes, scales and dequant "
       "are in the transformed domain (sim/rht.hpp gives the exact FP32 butterfly order)"},
      {"scale_rules",
       "sim/scale_rules.hpp (ocp, ceil, tetrajet, nv = TransformerEngine NVFP4, nv_noglobal, "
       "tensor_amax)"},
      {"compare", "fp4lab verify SUITE CANDIDATE_DIR: bitwise; NaN dequant values match any NaN"}};
  m["cases"] = cases;
  std::ofstream f(fs::path(a.out) / "manifest.json");
  if (!f) throw Error("cannot write " + (fs::path(a.out) / "manifest.json").string());
  f << m.dump(2) << "\n";
  if (!f) throw Error("failed writing " + (fs::path(a.out) / "manifest.json").string());
  std::printf("wrote %d cases (%zu quantizers x %zu inputs, RHT only where the size allows) to %s\n", written,
              quantizers.size(), inputs.size(), a.out.c_str());
}

// ---- verify ---------------------------------------------------------------------------

struct VerifyArgs {
  std::string suite, candidate;
  int max_report = 10;
  bool allow_missing = false;
};

// Compares one array; prints the first `max_report` mismatches.
template <class GetExp, class GetGot, class Describe>
int64_t compare(const std::string& what, int64_t n, int max_report, GetExp exp, GetGot got, Describe describe_at) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (exp(i) == got(i)) continue;
    if (bad < max_report) std::printf("    %s\n", describe_at(i).c_str());
    ++bad;
  }
  if (bad > max_report) std::printf("    ... %" PRId64 " more %s mismatches\n", bad - max_report, what.c_str());
  return bad;
}

// The suite's manifest.json, checked for its format and version.
nlohmann::json read_manifest(const std::string& suite, const fs::path& mpath) {
  std::ifstream f(mpath);
  if (!f)
    throw Error(mpath.string() + ": cannot read the suite manifest (is " + suite + " a `fp4lab golden` directory?)");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(f);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(mpath.string() + ": not valid JSON: " + e.what());
  }
  if (m.value("suite", "") != suite_format)
    throw Error(mpath.string() + ": not a fp4lab golden suite (key 'suite' is not '" + suite_format + "')");
  if (m.value("suite_version", 0) != suite_version)
    throw Error(mpath.string() + ": suite_version " + std::to_string(m.value("suite_version", 0)) +
                " is not supported by this fp4lab (supports " + std::to_string(suite_version) + ")");
  return m;
}

// One case of the suite against the candidate's files for it.
struct VerifyCase {
  std::string name;
  QuantizerSpec spec;
  int64_t rows = 0, cols = 0, srows = 0, scols = 0;
  fs::path gdir, cdir;  // golden and candidate directories of the case
  Tensor<float> input;
  int max_report = 10;
  // What the case's comparisons found.
  int compared = 0;  // files compared
  int64_t bad = 0;   // mismatches (a wrong file type or shape counts one)
  std::vector<std::string> notes;

  std::string in_at(int64_t i) const {
    return fmt_float(input.data[size_t(i)]) + " (" + hex_bits(float_bits(input.data[size_t(i)]), 8) + ")";
  }
};

VerifyCase load_case(const nlohmann::json& c, const VerifyArgs& a, const fs::path& mpath) {
  VerifyCase v;
  v.name = c.at("name");
  v.spec = quantizer_from_json(c.at("quantizer"), mpath.string() + ": " + v.name + ".quantizer");
  v.rows = c.at("shape")[0], v.cols = c.at("shape")[1];
  v.srows = c.at("scale_shape")[0], v.scols = c.at("scale_shape")[1];
  v.gdir = fs::path(a.suite) / v.name, v.cdir = fs::path(a.candidate) / v.name;
  v.input = read_npy_float32((v.gdir / "input.npy").string());
  v.max_report = a.max_report;
  return v;
}

// codes.npy: uint8 [rows, cols], or FP4 packed two per byte.
void verify_codes(VerifyCase& v) {
  const char* name = v.name.c_str();
  const int64_t rows = v.rows, cols = v.cols;
  const NpyArray exp = read_npy((v.gdir / "codes.npy").string());
  const NpyArray got = read_npy((v.cdir / "codes.npy").string());
  std::vector<uint8_t> g;
  const bool fp4 = v.spec.element->bits() == 4;
  if (got.dtype != DType::uint8) {
    std::printf("FAIL %s: codes.npy must be uint8, got %s\n", name, dtype_name(got.dtype));
    ++v.bad;
  } else if (got.shape == Shape{rows, cols}) {
    g.assign(got.bytes.begin(), got.bytes.end());
  } else if (fp4 && got.shape == Shape{rows, (cols + 1) / 2}) {
    g = unpack_fp4(got.bytes.data(), rows, cols);
    v.notes.push_back("codes packed");
  } else {
    std::printf("FAIL %s: codes.npy shape %s, expected [%" PRId64 ", %" PRId64 "]%s\n", name,
                shape_str(got.shape).c_str(), rows, cols, fp4 ? " (or packed [rows, ceil(cols/2)])" : "");
    ++v.bad;
  }
  if (g.empty() && rows * cols != 0) return;
  ++v.compared;
  const uint8_t* e = exp.bytes.data();
  const Format& el = *v.spec.element;
  const int digits = el.bits() <= 4 ? 1 : 2;
  const int64_t nb = compare(
      "codes", rows * cols, v.max_report, [&](int64_t i) { return e[i]; }, [&](int64_t i) { return g[size_t(i)]; },
      [&](int64_t i) {
        return "codes[" + std::to_string(i / cols) + ", " + std::to_string(i % cols) + "] input " + v.in_at(i) +
               ": expected " + hex_bits(e[i], digits) + " (" + fmt_float(decode(el, e[i])) + ") got " +
               hex_bits(g[size_t(i)], digits) + " (" + fmt_float(decode(el, g[size_t(i)])) + ")";
      });
  if (nb) std::printf("FAIL %s: %" PRId64 " of %" PRId64 " codes differ (above)\n", name, nb, rows * cols);
  v.bad += nb;
}

// scales.npy: the suite's dtype and shape (uint8 codes or float32).
void verify_scales(VerifyCase& v) {
  const char* name = v.name.c_str();
  const int64_t srows = v.srows, scols = v.scols;
  const NpyArray exp = read_npy((v.gdir / "scales.npy").string());
  const NpyArray got = read_npy((v.cdir / "scales.npy").string());
  if (got.dtype != exp.dtype || got.shape != exp.shape) {
    std::printf("FAIL %s: scales.npy is %s %s, expected %s [%" PRId64 ", %" PRId64 "]\n", name,
                dtype_name(got.dtype), shape_str(got.shape).c_str(), dtype_name(exp.dtype), srows, scols);
    ++v.bad;
    return;
  }
  ++v.compared;
  const bool fl = exp.dtype == DType::float32;
  const size_t w = fl ? 4 : 1;
  auto word = [&](const NpyArray& arr, int64_t i) {
    uint32_t x = 0;
    std::memcpy(&x, arr.bytes.data() + size_t(i) * w, w);
    return x;
  };
  auto val = [&](uint32_t x) { return fl ? fmt_float(bits_float(x)) : fmt_float(decode(*v.spec.scale, x)); };
  const int64_t nb = compare(
      "scales", srows * scols, v.max_report, [&](int64_t i) { return word(exp, i); },
      [&](int64_t i) { return word(got, i); },
      [&](int64_t i) {
        return "scales[" + std::to_string(i / scols) + ", " + std::to_string(i % scols) + "] (block rows " +
               std::to_string((i / scols) * v.spec.block_rows) + "..., cols " +
               std::to_string((i % scols) * v.spec.block_cols) + "...): expected " +
               hex_bits(word(exp, i), fl ? 8 : 2) + " (" + val(word(exp, i)) + ") got " +
               hex_bits(word(got, i), fl ? 8 : 2) + " (" + val(word(got, i)) + ")";
      });
  if (nb) std::printf("FAIL %s: %" PRId64 " of %" PRId64 " scales differ (above)\n", name, nb, srows * scols);
  v.bad += nb;
}

// dequant.npy: float32 [rows, cols], bitwise; any NaN matches any NaN.
void verify_dequant(VerifyCase& v) {
  const char* name = v.name.c_str();
  const int64_t rows = v.rows, cols = v.cols;
  const Tensor<float> exp = read_npy_float32((v.gdir / "dequant.npy").string());
  const NpyArray got_raw = read_npy((v.cdir / "dequant.npy").string());
  if (got_raw.dtype != DType::float32 || got_raw.shape != Shape{rows, cols}) {
    std::printf("FAIL %s: dequant.npy is %s %s, expected float32 [%" PRId64 ", %" PRId64 "]\n", name,
                dtype_name(got_raw.dtype), shape_str(got_raw.shape).c_str(), rows, cols);
    ++v.bad;
    return;
  }
  ++v.compared;
  auto gbits = [&](int64_t i) {
    uint32_t x;
    std::memcpy(&x, got_raw.bytes.data() + size_t(i) * 4, 4);
    return x;
  };
  auto canon = [](uint32_t x) { return (x & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : x; };
  const int64_t nb = compare(
      "dequant", rows * cols, v.max_report, [&](int64_t i) { return canon(float_bits(exp.data[size_t(i)])); },
      [&](int64_t i) { return canon(gbits(i)); },
      [&](int64_t i) {
        return "dequant[" + std::to_string(i / cols) + ", " + std::to_string(i % cols) + "] input " + v.in_at(i) +
               ": expected " + hex_bits(float_bits(exp.data[size_t(i)]), 8) + " (" + fmt_float(exp.data[size_t(i)]) +
               ") got " + hex_bits(gbits(i), 8) + " (" + fmt_float(bits_float(gbits(i))) + ")";
      });
  if (nb) std::printf("FAIL %s: %" PRId64 " of %" PRId64 " dequant values differ (above)\n", name, nb, rows * cols);
  v.bad += nb;
}

void run_verify(const VerifyArgs& a) {
  const fs::path mpath = fs::path(a.suite) / "manifest.json";
  const nlohmann::json m = read_manifest(a.suite, mpath);
  int64_t cases_bad = 0, cases_ok = 0, cases_missing = 0;
  for (const auto& c : m.at("cases")) {
    VerifyCase v = load_case(c, a, mpath);
    if (fs::exists(v.cdir / "codes.npy")) verify_codes(v);
    if (fs::exists(v.cdir / "scales.npy")) verify_scales(v);
    if (fs::exists(v.cdir / "dequant.npy")) verify_dequant(v);
    if (v.compared == 0 && v.bad == 0) {
      ++cases_missing;
      std::printf("MISSING %s: no codes.npy, scales.npy or dequant.npy in %s\n", v.name.c_str(),
                  v.cdir.string().c_str());
    } else if (v.bad) {
      ++cases_bad;
    } else {
      ++cases_ok;
      std::printf("ok   %s (%d file%s%s)\n", v.name.c_str(), v.compared, v.compared == 1 ? "" : "s",
                  v.notes.empty() ? "" : (", " + v.notes[0]).c_str());
    }
  }
  std::printf("\n%" PRId64 " cases match, %" PRId64 " mismatch, %" PRId64 " missing\n", cases_ok, cases_bad,
              cases_missing);
  if (cases_bad > 0 || (cases_missing > 0 && !a.allow_missing)) throw CommandExit{1};
}

// ---- bench quantize ---------------------------------------------------------------------

struct BenchArgs {
  std::string backend = "cpu";
  int64_t rows = 4096, cols = 4096;
  int repeats = 5;
};

void run_bench_cpu(const BenchArgs& a) {
  const int64_t n = a.rows * a.cols;
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
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
      "Block-quantize a 2-D float32 .npy tensor bit-exactly (MX, NVFP4, per-tensor FP8) and write its dequantized\n"
      "values, and optionally the element codes, block scales and global scale.\n"
      "Example: fp4lab quantize --quantizer nvfp4 x.npy --dequant xq.npy --codes c.npy --scales s.npy --stats");
  q->add_option("--quantizer", qa->quantizer,
                "A canned name (mxfp4, mxfp6_e2m3, mxfp6_e3m2, mxfp8_e4m3, mxfp8_e5m2, mxint8, nvfp4, nvfp4_2d,\n"
                "nvfp4_col, fp8_e4m3_tensor, fp8_e5m2_tensor), a JSON object such as\n"
                "'{\"element\":\"e2m1\",\"scale\":\"e8m0\",\"block\":[1,32],\"scale_rule\":\"ceil\"}', or a JSON file")
      ->required();
  q->add_option("IN.npy", qa->in, "Input: float32 [rows, cols] (a 1-D array is one row)")->required();
  q->add_option("--dequant", qa->dequant, "Output: float32 [rows, cols] dequantized values")->required();
  q->add_option("--codes", qa->codes, "Output: uint8 [rows, cols] element codes, one per byte");
  q->add_option(
      "--scales", qa->scales,
      "Output: [ceil(rows/br), ceil(cols/bc)] block scales: uint8 codes (e8m0, ue4m3) or float32 (per-tensor)");
  q->add_option("--global-scale", qa->global, "Output: float32 [1], the global decode scale (NVFP4; 1 otherwise)");
  q->add_option("--seed", qa->seed, "Seed of the stochastic-rounding bits (Philox; element (r,c) uses index r*cols+c)")
      ->capture_default_str();
  q->add_option("--stream", qa->stream, "Philox stream id of the stochastic-rounding bits")->capture_default_str();
  q->add_flag("--stats", qa->stats,
              "Print SQNR, max abs error, flushed-to-zero and saturated fractions, scale under/overflow counts");
  q->callback([qa] { run_quantize(*qa); });

  auto ga = std::make_shared<GoldenArgs>();
  CLI::App* g = app.add_subcommand(
      "golden",
      "Write a versioned suite of golden vectors for kernel authors: for every canned quantizer (plus ceil/tetrajet,\n"
      "SR, RHT, column-block and no-global-scale variants) and several inputs (normal, non-multiple sizes, tiny,\n"
      "adversarial, NaN/Inf), the input, codes, scales and dequantized values, with manifest.json naming quantizer,\n"
      "seed and fp4lab version. Check a kernel's outputs with `fp4lab verify`.");
  g->add_option("--out", ga->out, "Suite directory (created)")->capture_default_str();
  g->add_option("--seed", ga->seed, "Seed of the inputs and of the SR bits (stream = case number)")
      ->capture_default_str();
  g->callback([ga] { run_golden(*ga); });

  auto va = std::make_shared<VerifyArgs>();
  CLI::App* v = app.add_subcommand(
      "verify",
      "Compare a candidate's outputs with a golden suite, bit for bit. CANDIDATE_DIR/<case>/ holds any of codes.npy\n"
      "(uint8, one per byte or FP4 packed two per byte), scales.npy and dequant.npy, as in the suite. Prints the "
      "first\n"
      "mismatches with index, input value and both bit patterns; exits 1 on any mismatch (or missing case).");
  v->add_option("SUITE", va->suite, "Directory written by `fp4lab golden`")->required();
  v->add_option("CANDIDATE_DIR", va->candidate, "Directory with one sub-directory per case")->required();
  v->add_option("--max-report", va->max_report, "Mismatches printed per array")->capture_default_str();
  v->add_flag("--allow-missing", va->allow_missing, "Cases without candidate files do not fail the run");
  v->callback([va] { run_verify(*va); });
}

void register_bench_quantize(CLI::App& bench) {
  auto ba = std::make_shared<BenchArgs>();
  CLI::App* b = bench.add_subcommand(
      "quantize",
      "Quantizer throughput on a rows x cols tensor.\n"
      "cpu: mxfp4, mxfp8_e4m3 and nvfp4 fake quantization of float32, RN and SR, and NVFP4 with RHT, on 1 thread\n"
      "and all OpenMP threads, with the ratio to a memcpy of the same bytes.\n"
      "cuda: the fused kernels from bf16 and float32 input (RN; SR on MXFP4 and NVFP4; RHT with RN and SR on\n"
      "[1,16] and [16,1] blocks; NVFP4 16x16; amax given), the SR floors (Philox words and 4-bit output alone,\n"
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
