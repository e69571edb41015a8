// The CPU reference for Python: formats, cast, decode, quantize (plain and
// grouped), the quantized GEMM simulation and the recipe registry. Each
// function is the library call the CLI's command makes (apps/cmd_formats.cpp,
// apps/cmd_quantize.cpp, apps/cmd_recipes.cpp), on numpy arrays instead of .npy
// files: the same codes, scales and values, byte for byte
// (tests/python/test_reference.py checks it over the golden suite).
//
// Arrays in: C-contiguous numpy arrays of the dtype each function names (the
// package converts torch CPU tensors with .numpy(), without a copy). Arrays
// out: new numpy arrays owned by Python.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cast.hpp"
#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/sr.hpp"
#include "python/src/module.hpp"
#include "recipes/recipe.hpp"
#include "sim/gemm.hpp"
#include "sim/grouped.hpp"
#include "sim/packing.hpp"
#include "sim/quantizer.hpp"

namespace py = pybind11;

namespace fp4lab::python {
namespace {

std::vector<int64_t> shape_of(const py::array& a) { return std::vector<int64_t>(a.shape(), a.shape() + a.ndim()); }

// Throws fp4lab::Error naming `what` unless a is C-contiguous.
void require_contiguous(const py::array& a, const char* what) {
  if (!(a.flags() & py::array::c_style))
    throw Error(std::string(what) + ": needs a C-contiguous array (numpy.ascontiguousarray makes one)");
}

template <class T>
py::array_t<T> new_array(const std::vector<int64_t>& shape) {
  return py::array_t<T>(std::vector<py::ssize_t>(shape.begin(), shape.end()));
}

// A [rows, cols] view of a 2-D float32 array.
// A numpy array whose storage is v's, moved into a capsule the array owns (no copy); shape's product
// must be v.size().
template <class T>
py::array_t<T> adopt(std::vector<T>&& v, const std::vector<int64_t>& shape) {
  if (v.empty()) return new_array<T>(shape);
  auto* heap = new std::vector<T>(std::move(v));
  const py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(std::vector<py::ssize_t>(shape.begin(), shape.end()), heap->data(), owner);
}

MatrixView<const float> matrix_of(const py::array& a, const char* what) {
  if (a.ndim() != 2)
    throw Error(std::string(what) + ": needs a 2-D array [rows, cols], got " + std::to_string(a.ndim()) + " dimension(s)");
  if (!py::isinstance<py::array_t<float>>(a) || a.dtype().kind() != 'f' || a.itemsize() != 4)
    throw Error(std::string(what) + ": needs float32 values, got dtype " + std::string(py::str(a.dtype())));
  require_contiguous(a, what);
  return MatrixView<const float>(static_cast<const float*>(a.data()), a.shape(0), a.shape(1));
}

py::dict format_dict(const Format& f) {
  py::dict d;
  d["name"] = std::string(f.name);
  d["short_name"] = std::string(short_format_name(f));
  d["bits"] = f.bits();
  d["exponent_bits"] = f.exp_bits;
  d["mantissa_bits"] = f.man_bits;
  d["bias"] = f.bias;
  d["signed"] = f.is_signed;
  d["integer"] = f.is_int;
  d["max"] = max_finite(f);
  d["min_normal"] = f.is_int ? std::ldexp(1.0f, -f.int_frac_bits()) : min_normal(f);
  d["min_subnormal"] = f.has_subnormals() ? min_subnormal(f) : (f.is_int ? std::ldexp(1.0f, -f.int_frac_bits()) : min_normal(f));
  d["has_inf"] = f.has_inf();
  d["has_nan"] = f.has_nan();
  d["nan_code"] = f.has_nan() ? py::object(py::int_(f.nan_code())) : py::object(py::none());
  d["code_dtype"] = code_bytes(f) == 2 ? "uint16" : (code_bytes(f) == 1 ? "uint8" : "uint32");
  return d;
}

// fp4lab cast: codes of x (float32 or float64, any shape) in format `to`.
py::array cast(const py::array& x, const std::string& to, const std::string& round, const std::string& overflow,
               uint64_t seed, const std::string& sr_bits, const py::object& rbits) {
  const Format& f = format_by_name(to);
  if (code_bytes(f) == 0)
    throw Error("to=" + to + ": float32 codes are 32-bit and cannot be returned; choose a format of at most 16 bits");
  CastOptions opt;
  opt.round = parse_round(round);
  opt.overflow = parse_overflow(overflow);
  opt.seed = seed;
  const auto sb = parse_sr_bits(sr_bits);
  if (!sb) throw Error("sr_bits='" + sr_bits + "': valid: " + sr_bits_names);
  opt.sr_bits = *sb;
  const bool is_f32 = x.dtype().kind() == 'f' && x.itemsize() == 4, is_f64 = x.dtype().kind() == 'f' && x.itemsize() == 8;
  if (!is_f32 && !is_f64) throw Error("cast needs float32 or float64 input, got dtype " + std::string(py::str(x.dtype())));
  require_contiguous(x, "cast");
  opt.row_length = x.ndim() == 0 ? 1 : uint64_t(x.shape(x.ndim() - 1));
  if (opt.round != Round::rs && (!rbits.is_none() || opt.sr_bits != SrBits::per_element))
    throw Error("rbits and sr_bits apply to round='rs' only, got round='" + round + "'");
  if (opt.round == Round::rs) check_sr_bits(opt.sr_bits, f, "to=" + to);
  const size_t n = size_t(x.size());
  py::array_t<uint32_t, py::array::c_style> words;
  if (!rbits.is_none()) {
    words = rbits.cast<py::array>();
    if (words.dtype().kind() != 'u' || words.itemsize() != 4)
      throw Error("rbits: needs uint32 random words, got dtype " + std::string(py::str(rbits.attr("dtype"))));
    const uint64_t need = sr_word_count(f, n, opt);
    if (uint64_t(words.size()) != need)
      throw Error("rbits: needs " + std::to_string(need) + " uint32 words (" +
                  (opt.sr_bits == SrBits::per_element ? std::string("one per element")
                                                      : "one per " + std::to_string(sr_group(opt.sr_bits, f)) +
                                                            " elements of the last axis, per row") +
                  "), got " + std::to_string(words.size()));
    opt.words = words.data();
  }
  const std::vector<int64_t> shape = shape_of(x);
  auto run = [&](auto* codes) {
    py::gil_scoped_release release;
    if (is_f32)
      encode_array(f, static_cast<const float*>(x.data()), codes, n, opt);
    else
      encode_array(f, static_cast<const double*>(x.data()), codes, n, opt);
  };
  if (code_bytes(f) == 2) {
    auto out = new_array<uint16_t>(shape);
    run(out.mutable_data());
    return out;
  }
  auto out = new_array<uint8_t>(shape);
  run(out.mutable_data());
  return out;
}

// fp4lab decode: exact float32 values of codes (uint8, or uint16 for 16-bit formats).
py::array_t<float> decode(const py::array& codes, const std::string& from) {
  const Format& f = format_by_name(from);
  if (code_bytes(f) == 0) throw Error("from_=" + from + ": float32 codes are not supported");
  const int want = code_bytes(f);
  if (codes.dtype().kind() != 'u' || codes.itemsize() != want)
    throw Error(std::string(f.name) + " codes must be " + (want == 2 ? "uint16" : "uint8") + ", got dtype " +
                std::string(py::str(codes.dtype())));
  require_contiguous(codes, "decode");
  const size_t n = size_t(codes.size());
  auto out = new_array<float>(shape_of(codes));
  float* o = out.mutable_data();
  size_t bad;
  if (want == 2)
    bad = first_invalid_code(f, static_cast<const uint16_t*>(codes.data()), n);
  else
    bad = first_invalid_code(f, static_cast<const uint8_t*>(codes.data()), n);
  if (bad < n) {
    const uint32_t c = want == 2 ? static_cast<const uint16_t*>(codes.data())[bad] : static_cast<const uint8_t*>(codes.data())[bad];
    throw Error("decode: element " + std::to_string(bad) + " is " + std::to_string(c) + ", not a code of " +
                std::string(f.name) + " (" + std::to_string(f.bits()) + " bits)");
  }
  py::gil_scoped_release release;
  if (want == 2)
    decode_array(f, static_cast<const uint16_t*>(codes.data()), o, n);
  else
    decode_array(f, static_cast<const uint8_t*>(codes.data()), o, n);
  return out;
}

// The amax of what the quantizer's codes see (quantizer_domain: RHT-transformed
// when the spec has RHT): max |x| as a float32, NaN if any element is NaN.
float domain_amax(const QuantizerSpec& q, MatrixView<const float> x) {
  std::vector<float> d;
  const float* p = x.data;
  if (q.rht) {
    d = quantizer_domain(q, x);
    p = d.data();
  }
  float m = 0.0f;
  const int64_t n = x.rows * x.cols;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(p[i])) return p[i];
    m = std::max(m, std::fabs(p[i]));
  }
  return m;
}

// fp4lab quantize: x [rows, cols] float32 with `quantizer` (canned name, JSON
// text or file). Returns a dict of numpy arrays: dequant float32 [rows, cols];
// codes uint8 [rows, cols]; scales as the CLI's --scales writes them (uint8
// scale codes, float32 for float32 scales); scale_values (decoded, float32);
// global_decode (float32 [groups] or [1]); swizzled (uint8, when asked); amax.
py::dict quantize(const py::array& x, const std::string& quantizer, uint64_t seed, uint64_t stream,
                  const py::object& rbits, const py::object& groups, bool swizzled) {
  const QuantizerSpec spec = parse_quantizer(quantizer);
  const MatrixView<const float> xv = matrix_of(x, "quantize: x");
  const int64_t rows = xv.rows, cols = xv.cols;
  if (swizzled)
    if (const std::string why = swizzle_refusal(spec); !why.empty()) throw Error("scale_layout='swizzled': " + why);
  const bool grouped = !groups.is_none();
  std::vector<int64_t> sizes;
  if (grouped) {
    const py::array g = groups.cast<py::array>();
    if (g.ndim() != 1 || g.dtype().kind() != 'i' || g.itemsize() != 8)
      throw Error("groups: needs a 1-D int64 array of rows per group");
    sizes.assign(static_cast<const int64_t*>(g.data()), static_cast<const int64_t*>(g.data()) + g.size());
    if (spec.block_rows == 0)
      throw Error("groups: " + describe(spec) +
                  " scales the whole tensor (block [0,0]); a grouped tensor needs a block-scaled quantizer");
    check_group_sizes("groups (for x)", sizes, rows);
  }
  RandomStream rs{seed, stream};
  py::array_t<uint32_t, py::array::c_style> words;
  int64_t per_row = 0;
  if (!rbits.is_none()) {
    if (spec.round != Round::rs)
      throw Error("rbits applies to a quantizer with round 'rs'; " + describe(spec) + " rounds " +
                  std::string(round_name(spec.round)));
    words = rbits.cast<py::array>();
    per_row = sr_words_per_row(spec.sr_bits, *spec.element, cols);
    if (words.dtype().kind() != 'u' || words.itemsize() != 4 || words.size() != rows * per_row)
      throw Error("rbits: needs " + std::to_string(rows * per_row) + " uint32 words ([" + std::to_string(rows) + ", " +
                  std::to_string(per_row) + "]: rows x words a row under " + sr_bits_name(spec.sr_bits) + ")");
    rs.words = words.data();
  }
  QuantizedTensor q;
  GroupedQuantizedTensor g;
  float amax;
  std::vector<uint8_t> sw;
  {
    py::gil_scoped_release release;
    if (grouped) {
      std::vector<RandomStream> streams = consecutive_streams(seed, stream, sizes.size());
      if (rs.words) {
        int64_t row = 0;
        for (size_t k = 0; k < sizes.size(); ++k) {
          streams[k].words = rs.words + row * per_row;
          row += sizes[k];
        }
      }
      g = quantize_grouped(spec, xv, sizes, streams);
      if (swizzled) sw = swizzled_scales(g);
    } else {
      q = quantize(spec, xv, rs);
      if (swizzled) sw = swizzled_scales(q);
    }
    amax = domain_amax(spec, xv);
  }
  const bool float_scales = spec.scale == &float32;
  const int64_t scale_rows = grouped ? g.scale_row_offset.back() : q.scale_rows;
  const int64_t scale_cols = grouped ? g.scale_cols : q.scale_cols;
  // The result's vectors become the arrays' storage (adopt: no copy).
  py::dict d;
  d["dequant"] = adopt(std::move(grouped ? g.dequant : q.dequant), {rows, cols});
  d["codes"] = adopt(std::move(grouped ? g.codes : q.codes), {rows, cols});
  d["scale_values"] = adopt(std::move(grouped ? g.scales : q.scales), {scale_rows, scale_cols});
  if (float_scales)
    d["scales"] = d["scale_values"];
  else
    d["scales"] = adopt(std::move(grouped ? g.scale_codes : q.scale_codes), {scale_rows, scale_cols});
  if (grouped) {
    const int64_t ng = int64_t(sizes.size());
    d["global_decode"] = adopt(std::move(g.global_decode), {ng});
    std::vector<int64_t> off(g.scale_row_offset.begin(), g.scale_row_offset.end());
    const int64_t noff = int64_t(off.size());
    d["scale_row_offset"] = adopt(std::move(off), {noff});
  } else {
    d["global_decode"] = adopt(std::vector<float>{q.global_decode}, {1});
  }
  if (swizzled) {
    const int64_t n = int64_t(sw.size());
    d["swizzled"] = adopt(std::move(sw), {n});
  }
  d["amax"] = amax;
  d["has_global_scale"] = spec.global_scale == GlobalScale::tensor_amax;
  d["spec"] = quantizer_to_json(spec).dump();
  d["describe"] = describe(spec);
  return d;
}

// The quantized GEMM simulation (sim/gemm.hpp): y = dq(a) dq(b)^T, a [m, k], b [n, k].
py::array_t<float> gemm(const py::array& a, const std::string& qa, const py::array& b, const std::string& qb,
                        uint64_t seed_a, uint64_t stream_a, uint64_t seed_b, uint64_t stream_b) {
  const MatrixView<const float> av = matrix_of(a, "gemm: a"), bv = matrix_of(b, "gemm: b");
  if (av.cols != bv.cols)
    throw Error("gemm: a is [" + std::to_string(av.rows) + ", " + std::to_string(av.cols) + "] and b [" +
                std::to_string(bv.rows) + ", " + std::to_string(bv.cols) + "]: both need k columns (y = a b^T)");
  auto out = new_array<float>({av.rows, bv.rows});
  if (qa.empty() != qb.empty()) throw Error("gemm: give both quantizers (qa, qb) or neither");
  if (qa.empty()) {
    py::gil_scoped_release release;
    gemm_nt(av, bv, MatrixView<float>(out.mutable_data(), av.rows, bv.rows));
    return out;
  }
  const QuantizerSpec sa = parse_quantizer(qa), sb = parse_quantizer(qb);
  Tensor<float> y;
  {
    py::gil_scoped_release release;
    y = quantized_gemm(sa, av, sb, bv, RandomStream{seed_a, stream_a}, RandomStream{seed_b, stream_b});
  }
  std::memcpy(out.mutable_data(), y.data.data(), y.data.size() * sizeof(float));
  return out;
}

}  // namespace

void bind_reference(py::module_& m) {
  m.def("formats", [] {
    py::list l;
    for (const Format* f : all_formats) l.append(format_dict(*f));
    return l;
  });
  m.def("format_info", [](const std::string& name) { return format_dict(format_by_name(name)); }, py::arg("name"));
  m.def("cast", &cast, py::arg("x"), py::arg("to"), py::arg("round"), py::arg("overflow"), py::arg("seed"),
        py::arg("sr_bits"), py::arg("rbits"));
  m.def("decode", &decode, py::arg("codes"), py::arg("from_"));
  m.def("quantize", &quantize, py::arg("x"), py::arg("quantizer"), py::arg("seed"), py::arg("stream"),
        py::arg("rbits"), py::arg("groups"), py::arg("swizzled"));
  m.def("quantizer_json", [](const std::string& q) { return quantizer_to_json(parse_quantizer(q)).dump(); },
        py::arg("quantizer"));
  m.def("quantizer_names", &quantizer_names);
  // sim/packing.hpp pack_fp4: 4-bit codes [rows, cols] two a byte, [rows, ceil(cols/2)], low nibble = even column.
  m.def(
      "pack_fp4",
      [](const py::array& codes) {
        if (codes.ndim() != 2 || codes.dtype().kind() != 'u' || codes.itemsize() != 1)
          throw Error("pack_fp4: needs 2-D uint8 codes [rows, cols]");
        require_contiguous(codes, "pack_fp4");
        const int64_t rows = codes.shape(0), cols = codes.shape(1);
        const std::vector<uint8_t> p = pack_fp4(static_cast<const uint8_t*>(codes.data()), rows, cols);
        auto out = new_array<uint8_t>({rows, (cols + 1) / 2});
        std::memcpy(out.mutable_data(), p.data(), p.size());
        return out;
      },
      py::arg("codes"));
  m.def(
      "domain_amax",
      [](const py::array& x, const std::string& q) {
        const QuantizerSpec spec = parse_quantizer(q);
        const MatrixView<const float> xv = matrix_of(x, "amax: x");
        py::gil_scoped_release release;
        return domain_amax(spec, xv);
      },
      py::arg("x"), py::arg("quantizer"));
  m.def("gemm", &gemm, py::arg("a"), py::arg("qa"), py::arg("b"), py::arg("qb"), py::arg("seed_a"),
        py::arg("stream_a"), py::arg("seed_b"), py::arg("stream_b"));
  m.def("recipe_names", &recipe_names);
  m.def("recipe_json", [](const std::string& name) { return recipe_to_json(parse_recipe(name)).dump(); },
        py::arg("name"));
}

}  // namespace fp4lab::python
