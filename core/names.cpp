// Text names of formats, rounding modes, overflow policies and SR contracts.
#include <string>

#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/sr.hpp"

namespace fp4lab {

namespace {
struct Alias {
  std::string_view alias;
  const Format* format;
};
// The first alias of a format is its short name (short_format_name), so the
// order within one format matters.
constexpr Alias aliases[] = {
    {"e2m1", &float4_e2m1fn},
    {"fp4", &float4_e2m1fn},
    {"e2m3", &float6_e2m3fn},
    {"e3m2", &float6_e3m2fn},
    {"e4m3", &float8_e4m3fn},
    {"e4m3fn", &float8_e4m3fn},
    {"e5m2", &float8_e5m2},
    {"e4m3fnuz", &float8_e4m3fnuz},
    {"e5m2fnuz", &float8_e5m2fnuz},
    {"e8m0", &float8_e8m0fnu},
    {"e8m0fnu", &float8_e8m0fnu},
    {"ue4m3", &ufloat8_e4m3},
    {"int8", &int8_mx},
    {"mxint8", &int8_mx},
    {"bf16", &bfloat16},
    {"f16", &float16},
    {"fp16", &float16},
    {"half", &float16},
    {"f32", &float32},
    {"fp32", &float32},
};
}  // namespace

std::string_view short_format_name(const Format& f) {
  for (const Alias& a : aliases)
    if (a.format == &f) return a.alias;
  return f.name;
}

std::string format_names() {
  std::string out;
  for (const Format* f : all_formats) {
    if (!out.empty()) out += ", ";
    out += f->name;
  }
  out += " (aliases:";
  for (const Alias& a : aliases) {
    out += ' ';
    out += a.alias;
  }
  return out + ")";
}

const Format& format_by_name(std::string_view name) {
  for (const Format* f : all_formats)
    if (f->name == name) return *f;
  for (const Alias& a : aliases)
    if (a.alias == name) return *a.format;
  throw Error("unknown format '" + std::string(name) + "'; valid: " + format_names());
}

std::string_view round_name(Round r) {
  constexpr std::string_view names[] = {"rn", "rna", "rz", "rp", "rm", "rs"};
  return names[int(r)];
}

Round parse_round(std::string_view s) {
  if (s == "rn" || s == "nearest_even" || s == "nearest") return Round::rn;
  if (s == "rna" || s == "nearest_away") return Round::rna;
  if (s == "rz" || s == "toward_zero") return Round::rz;
  if (s == "rp" || s == "up" || s == "toward_positive") return Round::rp;
  if (s == "rm" || s == "down" || s == "toward_negative") return Round::rm;
  if (s == "rs" || s == "stochastic") return Round::rs;
  throw Error("unknown rounding mode '" + std::string(s) +
              "'; valid: rn (nearest_even), rna (nearest_away), rz (toward_zero), rp (up), rm (down), rs (stochastic)");
}

std::string_view overflow_name(Overflow o) { return o == Overflow::saturate ? "saturate" : "nonsaturate"; }

Overflow parse_overflow(std::string_view s) {
  if (s == "saturate" || s == "satfinite") return Overflow::saturate;
  if (s == "nonsaturate" || s == "nosat") return Overflow::nonsaturate;
  throw Error("unknown overflow policy '" + std::string(s) + "'; valid: saturate, nonsaturate");
}

const char* sr_bits_name(SrBits b) { return b == SrBits::per_element ? "per_element" : "ptx_x4"; }

std::optional<SrBits> parse_sr_bits(std::string_view s) {
  if (s == "per_element") return SrBits::per_element;
  if (s == "ptx_x4") return SrBits::ptx_x4;
  return std::nullopt;
}

void check_sr_bits(SrBits b, const Format& f, const std::string& where) {
  if (b == SrBits::ptx_x4 && !sr_ptx_format(f))
    throw Error(where + ": sr_bits ptx_x4 needs a format PTX cvt.rs converts to (e2m1, e2m3, e3m2, e4m3, e5m2, "
                "float16, bfloat16), got '" + std::string(f.name) + "'; use per_element");
}

}  // namespace fp4lab
