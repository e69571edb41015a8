#include "core/npy.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

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
  }
  return 0;
}

const char* dtype_descr(DType d) {
  switch (d) {
    case DType::float32: return "<f4";
    case DType::float64: return "<f8";
    case DType::uint8: return "|u1";
    case DType::uint16: return "<u2";
  }
  return "";
}

// Value of `key` in the header dict, e.g. 'descr': '<f4' -> "<f4".
std::string header_value(const std::string& header, const std::string& key, const std::string& path) {
  const auto k = header.find("'" + key + "'");
  if (k == std::string::npos) throw Error(path + ": .npy header has no '" + key + "' entry");
  auto p = header.find(':', k);
  if (p == std::string::npos) throw Error(path + ": malformed .npy header near '" + key + "'");
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  if (p >= header.size()) throw Error(path + ": malformed .npy header near '" + key + "'");
  if (header[p] == '\'') {
    const auto e = header.find('\'', p + 1);
    if (e == std::string::npos) throw Error(path + ": malformed .npy header near '" + key + "'");
    return header.substr(p + 1, e - p - 1);
  }
  if (header[p] == '(') {
    const auto e = header.find(')', p);
    if (e == std::string::npos) throw Error(path + ": malformed .npy header near '" + key + "'");
    return header.substr(p + 1, e - p - 1);
  }
  auto e = p;
  while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
  return header.substr(p, e - p);
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

  const std::string descr = header_value(header, "descr", path);
  NpyArray arr;
  if (descr == "<f4")
    arr.dtype = DType::float32;
  else if (descr == "<f8")
    arr.dtype = DType::float64;
  else if (descr == "|u1" || descr == "<u1")
    arr.dtype = DType::uint8;
  else if (descr == "<u2")
    arr.dtype = DType::uint16;
  else
    throw Error(path + ": unsupported dtype '" + descr + "' (valid: <f4 float32, <f8 float64, |u1 uint8, <u2 uint16)");
  const std::string fortran = header_value(header, "fortran_order", path);
  if (fortran.find("True") != std::string::npos)
    throw Error(path + ": Fortran-order arrays are not supported (save with np.ascontiguousarray)");
  const std::string shape_text = header_value(header, "shape", path);
  std::stringstream ss(shape_text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto first = item.find_first_not_of(" ");
    if (first == std::string::npos) continue;
    try {
      size_t used = 0;
      const long long v = std::stoll(item.substr(first), &used);
      if (v < 0) throw Error("");
      arr.shape.push_back(v);
    } catch (...) {
      throw Error(path + ": bad shape entry '" + item + "' in .npy header");
    }
  }
  const size_t nbytes = size_t(shape_numel(arr.shape)) * dtype_size(arr.dtype);
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
  std::memcpy(t.data.data(), a.bytes.data(), a.bytes.size());
  return t;
}

Tensor<double> read_npy_as_float64(const std::string& path) {
  NpyArray a = read_npy(path);
  Tensor<double> t(a.shape);
  if (a.dtype == DType::float64) {
    std::memcpy(t.data.data(), a.bytes.data(), a.bytes.size());
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
  else
    d = DType::uint16;
  write_npy(path, d, t.shape, t.data.data());
}
template void write_npy(const std::string&, const Tensor<float>&);
template void write_npy(const std::string&, const Tensor<double>&);
template void write_npy(const std::string&, const Tensor<uint8_t>&);
template void write_npy(const std::string&, const Tensor<uint16_t>&);

}  // namespace fp4lab
