#include "core/npy.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <cstdint>

namespace fp4lab {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::uint8: return "uint8";
    case DType::uint16: return "uint16";
    case DType::uint32: return "uint32";
    case DType::int64: return "int64";
  }
  return "?";
}

namespace {

size_t dtype_size(DType d) {
  switch (d) {
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::uint8: return 1;
    case DType::uint16: return 2;
    case DType::uint32: return 4;
    case DType::int64: return 8;
  }
  return 0;
}

const char* dtype_descr(DType d) {
  switch (d) {
    case DType::float32: return "<f4";
    case DType::float64: return "<f8";
    case DType::uint8: return "|u1";
    case DType::uint16: return "<u2";
    case DType::uint32: return "<u4";
    case DType::int64: return "<i8";
  }
  return "";
}

// The header dict of a .npy file, parsed by the grammar NumPy writes and
// accepts (numpy.lib.format: a Python dict literal with exactly the keys
// 'descr', 'fortran_order' and 'shape', in any order, an optional trailing
// comma, then padding spaces and a newline):
//   header  := ws '{' ws entry (ws ',' ws entry)* (ws ',')? ws '}' ws
//   entry   := key ws ':' ws value
//   descr   := a quoted string ('...' or "...")
//   fortran := True | False
//   shape   := '(' ws ')' | '(' ws int ws ',' ws ')' | '(' ws int (ws ',' ws int)+ (ws ',')? ws ')'
//   int     := [0-9]+   (a dimension, at most 2^63 - 1)
// Anything else is an error naming the file and the offending text.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

// Header text for a one-line message: control and non-ASCII bytes as
// \xHH, at most 160 characters.
std::string printable(const std::string& t) {
  std::string out;
  for (const char ch : t) {
    const unsigned char u = static_cast<unsigned char>(ch);
    if (u >= 0x20 && u < 0x7F) {
      out += ch;
    } else {
      const char* hex = "0123456789ABCDEF";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    }
    if (out.size() >= 160) return out + "...";
  }
  return out;
}

class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : t_(text), path_(path) {}

  NpyHeader parse() {
    NpyHeader h;
    bool seen[3] = {false, false, false};
    ws();
    expect('{');
    for (;;) {
      ws();
      if (peek() == '}') break;
      const std::string key = quoted("a key");
      ws();
      expect(':');
      ws();
      int k = -1;
      if (key == "descr") {
        k = 0, h.descr = quoted("the descr string");
      } else if (key == "fortran_order") {
        k = 1, h.fortran_order = boolean();
      } else if (key == "shape") {
        k = 2, h.shape = shape();
      } else {
        fail("unknown key '" + printable(key) + "' (valid: 'descr', 'fortran_order', 'shape')");
      }
      if (seen[k]) fail("key '" + printable(key) + "' given twice");
      seen[k] = true;
      ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != '}') fail("expected ',' or '}'");
    }
    ++i_;
    ws();
    if (i_ != t_.size()) fail("unexpected text after the header dict");
    const char* names[3] = {"descr", "fortran_order", "shape"};
    for (int k = 0; k < 3; ++k)
      if (!seen[k]) throw Error(path_ + ": .npy header has no '" + names[k] + "' entry");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    const size_t from = i_ < t_.size() ? i_ : t_.size();
    throw Error(path_ + ": malformed .npy header: " + what + " at offset " + std::to_string(from) + " of \"" +
                printable(t_.substr(0, t_.find_last_not_of(" \n") + 1)) + "\"");
  }

  char peek() const { return i_ < t_.size() ? t_[i_] : '\0'; }
  void ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\t' || t_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string quoted(const char* what) {
    const char q = peek();
    if (q != '\'' && q != '"') fail(std::string("expected ") + what + " in quotes");
    const size_t e = t_.find(q, i_ + 1);
    if (e == std::string::npos) fail("unterminated string");
    std::string v = t_.substr(i_ + 1, e - i_ - 1);
    i_ = e + 1;
    return v;
  }
  bool boolean() {
    if (t_.compare(i_, 4, "True") == 0) return i_ += 4, true;
    if (t_.compare(i_, 5, "False") == 0) return i_ += 5, false;
    fail("expected True or False for 'fortran_order'");
  }
  int64_t integer() {
    if (peek() < '0' || peek() > '9') fail("expected a non-negative decimal integer in 'shape'");
    uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + uint64_t(peek() - '0');
      if (v > uint64_t(INT64_MAX)) fail("a dimension of 'shape' exceeds 2^63 - 1");
      ++i_;
    }
    return int64_t(v);
  }
  Shape shape() {
    Shape s;
    expect('(');
    ws();
    if (peek() == ')') return ++i_, s;
    for (;;) {
      s.push_back(integer());
      ws();
      if (peek() == ')') {
        if (s.size() == 1) fail("a 1-D shape needs a trailing comma, as in (n,)");
        ++i_;
        return s;
      }
      expect(',');
      ws();
      if (peek() == ')') return ++i_, s;
    }
  }

  const std::string& t_;
  const std::string& path_;
  size_t i_ = 0;
};

// Element count of a shape, or an error when it overflows int64.
int64_t checked_numel(const Shape& s, size_t elem_bytes, const std::string& path) {
  uint64_t n = 1;
  bool zero = false;
  for (int64_t d : s) zero = zero || d == 0;
  if (zero) return 0;
  for (int64_t d : s) {
    if (n > uint64_t(INT64_MAX) / uint64_t(d) / elem_bytes)
      throw Error(path + ": .npy shape " + shape_str(s) + " has more elements than fit in memory (the byte count " +
                  "overflows 64 bits)");
    n *= uint64_t(d);
  }
  return int64_t(n);
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open for reading");
  char magic[8];
  if (!in.read(magic, 8)) throw Error(path + ": truncated .npy file (no header)");
  if (std::memcmp(magic, "\x93NUMPY", 6) != 0) throw Error(path + ": not a .npy file (wrong magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) throw Error(path + ": truncated .npy header");
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) throw Error(path + ": truncated .npy header");
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  } else {
    throw Error(path + ": unsupported .npy format version " + std::to_string(major) + " (valid: 1, 2, 3)");
  }
  if (header_len > (1u << 24))
    throw Error(path + ": .npy header length " + std::to_string(header_len) + " is implausible");
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) throw Error(path + ": truncated .npy header");

  const NpyHeader h = HeaderParser(header, path).parse();
  const std::string& descr = h.descr;
  NpyArray arr;
  if (descr == "<f4")
    arr.dtype = DType::float32;
  else if (descr == "<f8")
    arr.dtype = DType::float64;
  else if (descr == "|u1" || descr == "<u1")
    arr.dtype = DType::uint8;
  else if (descr == "<u2")
    arr.dtype = DType::uint16;
  else if (descr == "<u4")
    arr.dtype = DType::uint32;
  else if (descr == "<i8")
    arr.dtype = DType::int64;
  else
    throw Error(path + ": unsupported dtype '" + printable(descr) +
                "' (valid: <f4 float32, <f8 float64, |u1 uint8, <u2 uint16, <u4 uint32, <i8 int64)");
  if (h.fortran_order) throw Error(path + ": Fortran-order arrays are not supported (save with np.ascontiguousarray)");
  arr.shape = h.shape;
  const size_t nbytes = size_t(checked_numel(arr.shape, dtype_size(arr.dtype), path)) * dtype_size(arr.dtype);
  // The data's size is checked against the file before anything is allocated.
  const std::streamoff data_at = in.tellg();
  in.seekg(0, std::ios::end);
  const std::streamoff file_end = in.tellg();
  in.seekg(data_at);
  if (data_at < 0 || file_end < data_at || !in) throw Error(path + ": cannot determine the file's size");
  const uint64_t have = uint64_t(file_end - data_at);
  if (have < nbytes)
    throw Error(path + ": truncated .npy data (expected " + std::to_string(nbytes) + " bytes for shape " +
                shape_str(arr.shape) + " " + dtype_name(arr.dtype) + ", the file holds " + std::to_string(have) + ")");
  if (have > nbytes)
    throw Error(path + ": " + std::to_string(have - nbytes) + " bytes after the .npy data (expected " +
                std::to_string(nbytes) + " bytes for shape " + shape_str(arr.shape) + " " + dtype_name(arr.dtype) +
                ")");
  arr.bytes.resize(nbytes);
  if (nbytes && !in.read(reinterpret_cast<char*>(arr.bytes.data()), std::streamsize(nbytes)))
    throw Error(path + ": truncated .npy data (expected " + std::to_string(nbytes) + " bytes for shape " +
                shape_str(arr.shape) + " " + dtype_name(arr.dtype) + ")");
  return arr;
}

void write_npy(const std::string& path, DType dtype, const Shape& shape, const void* data) {
  std::string dict = std::string("{'descr': '") + dtype_descr(dtype) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i)
    dict += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  dict += "), }";
  // Pad with spaces so that the data starts at a multiple of 64 bytes.
  size_t prefix = 10;
  bool v2 = false;
  size_t total = prefix + dict.size() + 1;
  if (total + (64 - total % 64) % 64 - prefix > 65535) {
    v2 = true;
    prefix = 12;
    total = prefix + dict.size() + 1;
  }
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(path + ": cannot open for writing");
    out.write("\x93NUMPY", 6);
    const char ver[2] = {char(v2 ? 2 : 1), 0};
    out.write(ver, 2);
    const uint32_t hl = uint32_t(dict.size());
    const unsigned char len[4] = {uint8_t(hl), uint8_t(hl >> 8), uint8_t(hl >> 16), uint8_t(hl >> 24)};
    out.write(reinterpret_cast<const char*>(len), v2 ? 4 : 2);
    out.write(dict.data(), std::streamsize(dict.size()));
    out.write(static_cast<const char*>(data), std::streamsize(size_t(shape_numel(shape)) * dtype_size(dtype)));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error(path + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(path + ": cannot rename temporary file into place");
  }
}

Tensor<float> read_npy_float32(const std::string& path) {
  NpyArray a = read_npy(path);
  if (a.dtype != DType::float32) throw Error(path + ": expected float32 data, got " + dtype_name(a.dtype));
  Tensor<float> t(a.shape);
  if (!a.bytes.empty()) std::memcpy(t.data.data(), a.bytes.data(), a.bytes.size());
  return t;
}

Tensor<double> read_npy_as_float64(const std::string& path) {
  NpyArray a = read_npy(path);
  Tensor<double> t(a.shape);
  if (a.dtype == DType::float64) {
    if (!a.bytes.empty()) std::memcpy(t.data.data(), a.bytes.data(), a.bytes.size());
  } else if (a.dtype == DType::float32) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      float f;
      std::memcpy(&f, a.bytes.data() + 4 * i, 4);
      t.data[size_t(i)] = f;
    }
  } else {
    throw Error(path + ": expected float32 or float64 data, got " + dtype_name(a.dtype));
  }
  return t;
}

template <class T>
void write_npy(const std::string& path, const Tensor<T>& t) {
  DType d;
  if constexpr (std::is_same_v<T, float>)
    d = DType::float32;
  else if constexpr (std::is_same_v<T, double>)
    d = DType::float64;
  else if constexpr (std::is_same_v<T, uint8_t>)
    d = DType::uint8;
  else if constexpr (std::is_same_v<T, uint16_t>)
    d = DType::uint16;
  else
    d = DType::uint32;
  write_npy(path, d, t.shape, t.data.data());
}
template void write_npy(const std::string&, const Tensor<float>&);
template void write_npy(const std::string&, const Tensor<double>&);
template void write_npy(const std::string&, const Tensor<uint8_t>&);
template void write_npy(const std::string&, const Tensor<uint16_t>&);
template void write_npy(const std::string&, const Tensor<uint32_t>&);

}  // namespace fp4lab
