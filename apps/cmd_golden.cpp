// `fp4lab golden` (a versioned suite of golden vectors) and `fp4lab verify`
// (a candidate's outputs against the suite, bit for bit).
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
#include "core/philox.hpp"
#include "core/error.hpp"
#include "core/json.hpp"
#include "core/npy.hpp"
#include "sim/packing.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

namespace {

namespace fs = std::filesystem;

// ---- helpers ---------------------------------------------------------------------------

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
  // The PTX cvt.rs random-bit contract (core/sr.hpp): byte k of one word per 4 row elements.
  auto ptx_rs = [](QuantizerSpec& s) { s.round = Round::rs, s.sr_bits = SrBits::ptx_x4; };
  variant("mxfp4_rs_ptx", "mxfp4", ptx_rs);
  variant("nvfp4_rs_ptx", "nvfp4", ptx_rs);
  variant("mxfp8_e4m3_rs_ptx", "mxfp8_e4m3", ptx_rs);
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
  const auto quantizers = golden_quantizers();
  const auto inputs = golden_inputs(a.seed);
  // Every file of the suite is checked first, written to a temporary name and
  // renamed into place at the end: a failure leaves an old suite as it was.
  struct Job {
    const GoldenInput* in;
    const GoldenQuantizer* gq;
    fs::path dir;
  };
  std::vector<Job> jobs;
  for (const auto& in : inputs)
    for (const auto& gq : quantizers) jobs.push_back({&in, &gq, fs::path(a.out) / (gq.name + "__" + in.name)});
  const char* files[] = {"input.npy", "codes.npy", "scales.npy", "dequant.npy", "rbits.npy"};
  OutputSet out;
  for (const Job& j : jobs)
    for (int f = 0; f < 4 + (j.gq->spec.round == Round::rs); ++f) out.add((j.dir / files[f]).string(), true);
  const std::string manifest = (fs::path(a.out) / "manifest.json").string();
  out.add(manifest, true);
  nlohmann::json cases = nlohmann::json::array();
  uint64_t stream = 0;
  int written = 0;
  for (const Job& j : jobs) {
    const GoldenInput& in = *j.in;
    const GoldenQuantizer& gq = *j.gq;
    const std::string name = j.dir.filename().string();
    const QuantizerSpec& s = gq.spec;
    set_activity("writing golden case " + name);
    const RandomStream rs{a.seed, stream++};
    const QuantizedTensor q = quantize(s, MatrixView<const float>(in.data.data(), in.rows, in.cols), rs);
    out.write_npy((j.dir / files[0]).string(), DType::float32, {in.rows, in.cols}, in.data.data());
    out.write_npy((j.dir / files[1]).string(), DType::uint8, {in.rows, in.cols}, q.codes.data());
    write_scales(out, (j.dir / files[2]).string(), q);
    out.write_npy((j.dir / files[3]).string(), DType::float32, {in.rows, in.cols}, q.dequant.data());
    // SR cases: the random words the codes were drawn with (word w = random_bits(seed, stream, w)),
    // [rows, words a row], for a kernel that takes its random words from outside (cvt.rs's rbits).
    const int64_t per_row = sr_words_per_row(s.sr_bits, *s.element, in.cols);
    if (s.round == Round::rs) {
      std::vector<uint32_t> words(size_t(in.rows * per_row));
      for (size_t w = 0; w < words.size(); ++w) words[w] = random_bits(rs.seed, rs.stream, w);
      out.write_npy((j.dir / files[4]).string(), DType::uint32, {in.rows, per_row}, words.data());
    }
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
    if (s.round == Round::rs) {
      c["sr_bits"] = sr_bits_name(s.sr_bits);
      c["rbits"] = files[4];
      c["rbits_shape"] = {in.rows, per_row};
    }
    c["global_decode"] = double(q.global_decode);
    c["global_decode_bits"] = hex_bits(float_bits(q.global_decode), 8);
    cases.push_back(c);
    ++written;
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
       "word w is random_bits(seed, stream, w): Philox4x32-10, key = seed, counter = (w/4, stream), word w%4 "
       "(core/philox.hpp); each rs case also stores its words in rbits.npy uint32 [rows, words a row]. sr_bits "
       "per_element: element (r, c) adds the low D bits of word r * cols + c to its D discarded bits; ptx_x4 (PTX "
       "cvt.rs): element (r, c) uses byte c % 4 of word r * ceil(cols / 4) + c / 4, added to the top 8 "
       "discarded bits (r/256 of a quantum, then truncation); see core/sr.hpp and core/encode.hpp"},
      {"rht",
       "16-point Hadamard with seed signs along the block axis before quantization; codes, scales and dequant "
       "are in the transformed domain (sim/rht.hpp gives the exact FP32 butterfly order)"},
      {"scale_rules",
       "sim/scale_rules.hpp (ocp, ceil, tetrajet, nv = TransformerEngine NVFP4, nv_noglobal, "
       "tensor_amax)"},
      {"compare", "fp4lab verify SUITE CANDIDATE_DIR: bitwise; NaN dequant values match any NaN"}};
  m["cases"] = cases;
  out.write_text(manifest, m.dump(2) + "\n");
  out.commit();
  std::printf("wrote %d cases (%zu quantizers x %zu inputs) to %s\n", written,
              quantizers.size(), inputs.size(), a.out.c_str());
}

// ---- verify ---------------------------------------------------------------------------

struct VerifyArgs {
  std::string suite, candidate;
  int max_report = 10;
  bool allow_missing = false, failures_only = false;
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
    m = parse_json(f, mpath.string());
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(mpath.string() + ": not valid JSON: " + json_message(e.what()));
  }
  if (!m.is_object() || !m.contains("suite") || !m["suite"].is_string() || m["suite"] != suite_format)
    throw Error(mpath.string() + ": not a fp4lab golden suite (key 'suite' is not '" + suite_format + "')");
  const nlohmann::json ver = m.contains("suite_version") ? m["suite_version"] : nlohmann::json();
  if (!ver.is_number_integer() || ver.get<int64_t>() != suite_version)
    throw Error(mpath.string() + ": suite_version " + json_excerpt(ver) + " is not supported by this fp4lab (supports " +
                std::to_string(suite_version) + ")");
  if (!m.contains("cases") || !m["cases"].is_array() || m["cases"].empty())
    throw Error(mpath.string() + ": key 'cases' is missing, not an array or empty");
  return m;
}

// One case of the suite against the candidate's files for it.
struct VerifyCase {
  std::string name;
  QuantizerSpec spec;
  int64_t rows = 0, cols = 0, srows = 0, scols = 0;
  DType scale_dtype = DType::uint8;
  fs::path gdir, cdir;  // golden and candidate directories of the case
  Tensor<float> input;  // the suite's files, checked against the manifest
  NpyArray codes, scales, dequant;
  int max_report = 10;
  // What the case's comparisons found.
  int compared = 0;  // files compared
  int64_t bad = 0;   // mismatches (a wrong file type or shape, or an unreadable file, counts one)
  std::vector<std::string> notes;

  std::string in_at(int64_t i) const {
    return fmt_float(input.data[size_t(i)]) + " (" + hex_bits(float_bits(input.data[size_t(i)]), 8) + ")";
  }
};

// [a, b] of non-negative integers from manifest key `key` of case c.
std::pair<int64_t, int64_t> dims(const nlohmann::json& c, const char* key) {
  const auto v = c.at(key).get<std::vector<int64_t>>();
  if (v.size() != 2 || v[0] < 0 || v[1] < 0)
    throw Error(std::string("key '") + key + "' is " + json_excerpt(c.at(key)) + ", expected [rows, cols] (non-negative)");
  return {v[0], v[1]};
}

// Case i of the manifest: its keys (errors name the manifest, case and key).
VerifyCase case_meta(const nlohmann::json& c, size_t i, const VerifyArgs& a, const fs::path& mpath) {
  VerifyCase v;
  const std::string where = mpath.string() + ": cases[" + std::to_string(i) + "]";
  try {
    v.name = c.at("name").get<std::string>();
    if (v.name.empty() || v.name.find('/') != std::string::npos || v.name == "." || v.name == "..")
      throw Error("key 'name' is '" + v.name + "', not a case directory name");
    v.spec = quantizer_from_json(c.at("quantizer"), mpath.string() + ": " + v.name + ".quantizer");
    std::tie(v.rows, v.cols) = dims(c, "shape");
    std::tie(v.srows, v.scols) = dims(c, "scale_shape");
    const std::string sd = c.value("scale_dtype", scales_are_float(v.spec) ? "float32" : "uint8");
    if (sd != "float32" && sd != "uint8") throw Error("key 'scale_dtype' is '" + sd + "' (valid: float32, uint8)");
    v.scale_dtype = sd == "float32" ? DType::float32 : DType::uint8;
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + (v.name.empty() ? "" : " (" + v.name + ")") + ": " + json_message(e.what()));
  } catch (const Error& e) {
    const std::string w = e.what();
    throw Error(w.rfind(mpath.string(), 0) == 0 ? w : where + (v.name.empty() ? "" : " (" + v.name + ")") + ": " + w);
  }
  v.gdir = fs::path(a.suite) / v.name, v.cdir = fs::path(a.candidate) / v.name;
  v.max_report = a.max_report;
  return v;
}

// The suite's own files of case v, each checked against the manifest's dtype
// and shape (a truncated or replaced suite file is an error naming it).
void load_suite_files(VerifyCase& v) {
  auto load = [&](const char* file, DType dtype, const Shape& shape) {
    const std::string path = (v.gdir / file).string();
    NpyArray arr = read_npy(path);
    if (arr.dtype != dtype || arr.shape != shape)
      throw Error(path + ": " + dtype_name(arr.dtype) + " " + shape_str(arr.shape) + ", but manifest.json says " +
                  dtype_name(dtype) + " " + shape_str(shape));
    return arr;
  };
  const NpyArray in = load("input.npy", DType::float32, {v.rows, v.cols});
  v.input = Tensor<float>({v.rows, v.cols});
  if (!in.bytes.empty()) std::memcpy(v.input.data.data(), in.bytes.data(), in.bytes.size());
  v.codes = load("codes.npy", DType::uint8, {v.rows, v.cols});
  v.scales = load("scales.npy", v.scale_dtype, {v.srows, v.scols});
  v.dequant = load("dequant.npy", DType::float32, {v.rows, v.cols});
}

// codes.npy: uint8 [rows, cols], or FP4 packed two per byte.
void verify_codes(VerifyCase& v) {
  const char* name = v.name.c_str();
  const int64_t rows = v.rows, cols = v.cols;
  const NpyArray& exp = v.codes;
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
  const NpyArray& exp = v.scales;
  const NpyArray got = read_npy((v.cdir / "scales.npy").string());
  if (got.dtype != exp.dtype || got.shape != exp.shape) {
    std::printf("FAIL %s: scales.npy is %s %s, expected %s [%" PRId64 ", %" PRId64 "]\n", name, dtype_name(got.dtype),
                shape_str(got.shape).c_str(), dtype_name(exp.dtype), srows, scols);
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
  const NpyArray got_raw = read_npy((v.cdir / "dequant.npy").string());
  if (got_raw.dtype != DType::float32 || got_raw.shape != Shape{rows, cols}) {
    std::printf("FAIL %s: dequant.npy is %s %s, expected float32 [%" PRId64 ", %" PRId64 "]\n", name,
                dtype_name(got_raw.dtype), shape_str(got_raw.shape).c_str(), rows, cols);
    ++v.bad;
    return;
  }
  ++v.compared;
  auto bits = [](const NpyArray& arr, int64_t i) {
    uint32_t x;
    std::memcpy(&x, arr.bytes.data() + size_t(i) * 4, 4);
    return x;
  };
  auto canon = [](uint32_t x) { return (x & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : x; };
  const int64_t nb = compare(
      "dequant", rows * cols, v.max_report, [&](int64_t i) { return canon(bits(v.dequant, i)); },
      [&](int64_t i) { return canon(bits(got_raw, i)); },
      [&](int64_t i) {
        const uint32_t e = bits(v.dequant, i), g = bits(got_raw, i);
        return "dequant[" + std::to_string(i / cols) + ", " + std::to_string(i % cols) + "] input " + v.in_at(i) +
               ": expected " + hex_bits(e, 8) + " (" + fmt_float(bits_float(e)) + ") got " + hex_bits(g, 8) + " (" +
               fmt_float(bits_float(g)) + ")";
      });
  if (nb) std::printf("FAIL %s: %" PRId64 " of %" PRId64 " dequant values differ (above)\n", name, nb, rows * cols);
  v.bad += nb;
}

// CANDIDATE_DIR: an existing, non-empty directory holding at least one of the
// suite's case directories; otherwise one error naming it (a typo is not "104 missing").
void check_candidate_dir(const VerifyArgs& a, const std::vector<VerifyCase>& cases) {
  std::error_code ec;
  const fs::file_status st = fs::status(a.candidate, ec);
  if (!fs::exists(st)) throw Error(a.candidate + ": candidate directory does not exist");
  if (!fs::is_directory(st))
    throw Error(a.candidate + ": not a directory (CANDIDATE_DIR holds one directory per case)");
  if (fs::directory_iterator(a.candidate, ec) == fs::directory_iterator()) {
    if (ec) throw Error(a.candidate + ": cannot list the candidate directory (" + ec.message() + ")");
    throw Error(a.candidate + ": candidate directory is empty (expected one sub-directory per case, e.g. " +
                cases.front().name + ")");
  }
  for (const VerifyCase& v : cases)
    if (fs::is_directory(v.cdir, ec)) return;
  throw Error(a.candidate + ": holds none of the suite's " + std::to_string(cases.size()) + " case directories (e.g. " +
              cases.front().name + "); is it the right directory?");
}

// A candidate's own random words (<case>/rbits.npy, SR cases): the expected
// outputs become those of the suite's input quantized with these words
// (uint32 [rows, words a row] of the case's sr_bits contract) instead of the
// suite's Philox words, so a kernel drawing its own random stream (cvt.rs's
// rbits) is checked bit for bit. False (nothing changed) without the file.
bool use_candidate_words(VerifyCase& v) {
  const fs::path path = v.cdir / "rbits.npy";
  std::error_code ec;
  if (!fs::exists(path, ec)) return false;
  if (v.spec.round != Round::rs)
    throw Error(path.string() + ": random words for a case that does not round stochastically (" +
                describe(v.spec) + ")");
  const int64_t per_row = sr_words_per_row(v.spec.sr_bits, *v.spec.element, v.cols);
  const std::vector<uint32_t> words =
      read_rbits(path.string(), uint64_t(v.rows * per_row),
                 "[" + std::to_string(v.rows) + ", " + std::to_string(per_row) + "]: rows x words a row under " +
                     sr_bits_name(v.spec.sr_bits));
  RandomStream rs;
  rs.words = words.data();
  const QuantizedTensor q = quantize(v.spec, MatrixView<const float>(v.input.data.data(), v.rows, v.cols), rs);
  auto array = [](DType d, const Shape& shape, const void* data, size_t bytes) {
    NpyArray a{d, shape, {}};
    a.bytes.assign(static_cast<const unsigned char*>(data), static_cast<const unsigned char*>(data) + bytes);
    return a;
  };
  v.codes = array(DType::uint8, {v.rows, v.cols}, q.codes.data(), q.codes.size());
  v.dequant = array(DType::float32, {v.rows, v.cols}, q.dequant.data(), q.dequant.size() * sizeof(float));
  if (v.scale_dtype == DType::float32)
    v.scales = array(DType::float32, {v.srows, v.scols}, q.scales.data(), q.scales.size() * sizeof(float));
  else
    v.scales = array(DType::uint8, {v.srows, v.scols}, q.scale_codes.data(), q.scale_codes.size());
  v.notes.push_back("the candidate's random words");
  return true;
}

// Compares one candidate file; an unreadable one fails the case and the run goes on.
void verify_file(VerifyCase& v, const char* file, void (*check)(VerifyCase&)) {
  std::error_code ec;
  if (!fs::exists(v.cdir / file, ec)) return;
  try {
    check(v);
  } catch (const Error& e) {
    std::printf("FAIL %s: %s\n", v.name.c_str(), e.what());
    ++v.bad;
  }
}

void run_verify(const VerifyArgs& a) {
  const fs::path mpath = fs::path(a.suite) / "manifest.json";
  set_activity("reading " + mpath.string());
  const nlohmann::json m = read_manifest(a.suite, mpath);
  std::vector<VerifyCase> cases;
  for (size_t i = 0; i < m["cases"].size(); ++i) cases.push_back(case_meta(m["cases"][i], i, a, mpath));
  check_candidate_dir(a, cases);
  int64_t cases_bad = 0, cases_ok = 0, cases_missing = 0, suite_bad = 0;
  for (VerifyCase& v : cases) {
    set_activity("verifying case " + v.name);
    try {
      load_suite_files(v);
    } catch (const Error& e) {
      ++suite_bad;
      std::printf("BAD-SUITE %s: %s\n", v.name.c_str(), e.what());
      continue;
    }
    try {
      use_candidate_words(v);
    } catch (const Error& e) {
      std::printf("FAIL %s: %s\n", v.name.c_str(), e.what());
      ++cases_bad;
      v = VerifyCase{};
      continue;
    }
    verify_file(v, "codes.npy", verify_codes);
    verify_file(v, "scales.npy", verify_scales);
    verify_file(v, "dequant.npy", verify_dequant);
    if (v.compared == 0 && v.bad == 0) {
      ++cases_missing;
      if (!(a.failures_only && a.allow_missing))
        std::printf("MISSING %s: no codes.npy, scales.npy or dequant.npy in %s\n", v.name.c_str(),
                    v.cdir.string().c_str());
    } else if (v.bad) {
      ++cases_bad;
    } else {
      ++cases_ok;
      if (!a.failures_only)
        std::printf("ok   %s (%d file%s%s)\n", v.name.c_str(), v.compared, v.compared == 1 ? "" : "s",
                    v.notes.empty() ? "" : (", " + v.notes[0]).c_str());
    }
    v = VerifyCase{};  // frees the case's arrays
  }
  std::printf("\nverify: %zu cases: %" PRId64 " passed, %" PRId64 " failed, %" PRId64 " missing%s\n", cases.size(),
              cases_ok, cases_bad, cases_missing,
              suite_bad ? (", " + std::to_string(suite_bad) + " with a bad suite file (BAD-SUITE above)").c_str() : "");
  std::fflush(stdout);
  if (suite_bad)
    throw Error(a.suite + ": " + std::to_string(suite_bad) +
                " case(s) have suite files that are unreadable or disagree with manifest.json (BAD-SUITE lines); "
                "regenerate the suite with `fp4lab golden`");
  if (cases_bad > 0 || (cases_missing > 0 && !a.allow_missing)) throw CommandExit{1};
}

}  // namespace

void register_golden_commands(CLI::App& app) {
  auto ga = std::make_shared<GoldenArgs>();
  CLI::App* g = app.add_subcommand(
      "golden",
      "Write a versioned suite of golden vectors for kernel authors: for every canned quantizer (plus ceil/tetrajet,\n"
      "SR, RHT, column-block and no-global-scale variants) and several inputs (normal, non-multiple sizes, tiny,\n"
      "adversarial, NaN/Inf), the input, codes, scales and dequantized values, with manifest.json naming quantizer,\n"
      "seed and fp4lab version; SR cases under both random-bit contracts (per_element, ptx_x4 = PTX cvt.rs) store\n"
      "their random words as rbits.npy. Check a kernel's outputs with `fp4lab verify`.");
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
      "mismatches with index, input value and both bit patterns, one line per case (--failures-only: failing ones)\n"
      "and a summary; exits 1 on any mismatch, unreadable candidate file or missing case, 2 on a bad suite.\n"
      "SR cases: a candidate's own random words in <case>/rbits.npy (uint32 [rows, words a row] of the case's\n"
      "sr_bits; per_element: cols a row, ptx_x4: ceil(cols/4)) replace the suite's: the expected outputs are\n"
      "recomputed with them, so a kernel drawing its own random stream (cvt.rs rbits) is checked bit for bit.");
  v->add_option("SUITE", va->suite, "Directory written by `fp4lab golden`")->required();
  v->add_option("CANDIDATE_DIR", va->candidate, "Directory with one sub-directory per case")->required();
  v->add_option("--max-report", va->max_report, "Mismatches printed per array")->capture_default_str();
  v->add_flag("--allow-missing", va->allow_missing, "Cases without candidate files do not fail the run");
  v->add_flag("--failures-only", va->failures_only,
              "Print only failing cases (FAIL, MISSING unless --allow-missing, BAD-SUITE) and the summary");
  v->callback([va] { run_verify(*va); });
}

}  // namespace fp4lab
