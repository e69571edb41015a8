// .npy reading and writing: round trips for each dtype and shape, files laid
// out byte by byte as NumPy writes them, and the errors for bad files.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/npy.hpp"
#include "fuzz.hpp"

using namespace fp4lab;
namespace fs = std::filesystem;

namespace {

struct TmpDir {
  fs::path dir;
  TmpDir() {
    dir = fs::temp_directory_path() / ("fp4lab_test_npy_" + std::to_string(::getpid()));
    fs::create_directories(dir);
  }
  ~TmpDir() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
};

// A .npy v1.0 file with the given header dict (padded like NumPy: total
// header length a multiple of 64, ending in '\n') and raw data.
std::string npy_bytes(const std::string& dict, const std::string& data, char major = 1) {
  std::string h = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string out = "\x93NUMPY";
  out += major;
  out += '\0';
  if (major == 1) {
    out += char(h.size() & 0xFF);
    out += char(h.size() >> 8);
  } else {
    for (int i = 0; i < 4; ++i) out += char((h.size() >> (8 * i)) & 0xFF);
  }
  return out + h + data;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string error_of(const std::string& path) {
  try {
    read_npy(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("npy: round trip of every dtype and several shapes") {
  TmpDir tmp;
  const std::vector<Shape> shapes = {{}, {0}, {5}, {2, 3}, {2, 3, 4}, {1, 1, 1, 7}};
  for (const Shape& s : shapes) {
    const size_t n = size_t(shape_numel(s));
    std::vector<float> f(n);
    std::vector<double> d(n);
    std::vector<uint8_t> u8(n);
    std::vector<uint16_t> u16(n);
    for (size_t i = 0; i < n; ++i) {
      f[i] = float(i) * 0.25f - 1.0f;
      d[i] = double(i) / 3.0;
      u8[i] = uint8_t(i * 37);
      u16[i] = uint16_t(i * 4099);
    }
    struct Item {
      DType t;
      const void* p;
      size_t bytes;
    } items[] = {{DType::float32, f.data(), 4 * n},
                 {DType::float64, d.data(), 8 * n},
                 {DType::uint8, u8.data(), n},
                 {DType::uint16, u16.data(), 2 * n}};
    for (const Item& it : items) {
      INFO(dtype_name(it.t), " ", shape_str(s));
      const std::string p = tmp.path("a.npy");
      write_npy(p, it.t, s, it.p);
      const NpyArray a = read_npy(p);
      CHECK(a.dtype == it.t);
      CHECK(a.shape == s);
      REQUIRE(a.bytes.size() == it.bytes);
      CHECK((it.bytes == 0 || std::memcmp(a.bytes.data(), it.p, it.bytes) == 0));
      // Header as NumPy lays it out: magic, v1.0, data aligned to 64 bytes.
      const std::string raw = read_file(p);
      CHECK(raw.compare(0, 8, std::string("\x93NUMPY\x01\x00", 8)) == 0);
      CHECK((raw.size() - it.bytes) % 64 == 0);
    }
  }
  // Typed helpers.
  Tensor<float> t({2, 2}, std::vector<float>{1, 2, 3, 4});
  write_npy(tmp.path("t.npy"), t);
  CHECK(read_npy_float32(tmp.path("t.npy")).data == t.data);
  CHECK(read_npy_as_float64(tmp.path("t.npy")).data == std::vector<double>{1, 2, 3, 4});
  // No temporary files left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(tmp.dir)) files += e.is_regular_file();
  CHECK(files == 2);
}

TEST_CASE("npy: reads files laid out as NumPy writes them (v1 and v2 headers)") {
  TmpDir tmp;
  const float vals[3] = {1.5f, -2.0f, 0.0f};
  const std::string data(reinterpret_cast<const char*>(vals), 12);
  write_file(tmp.path("v1.npy"), npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", data));
  write_file(tmp.path("v2.npy"), npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }", data, 2));
  const NpyArray a = read_npy(tmp.path("v1.npy"));
  CHECK(a.shape == Shape{3});
  CHECK(std::memcmp(a.bytes.data(), vals, 12) == 0);
  const NpyArray b = read_npy(tmp.path("v2.npy"));
  CHECK(b.shape == Shape{1, 3});
  write_file(tmp.path("u8.npy"),
             npy_bytes("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2), }", "\x01\x02\x03\x04"));
  CHECK(read_npy(tmp.path("u8.npy")).dtype == DType::uint8);
}

TEST_CASE("npy: clear errors for bad files") {
  TmpDir tmp;
  const std::string f4(12, '\0');
  struct Bad {
    std::string name, bytes, expect;
  } bads[] = {
      {"magic.npy", "PK\x03\x04 this is a zip file, not a .npy file", "wrong magic"},
      {"empty.npy", "", "truncated"},
      {"i4.npy", npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", f4), "unsupported dtype '<i4'"},
      {"be.npy", npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }", f4), "unsupported dtype '>f4'"},
      {"fortran.npy", npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 1), }", f4), "Fortran"},
      {"short.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", f4), "truncated .npy data"},
      {"header.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f4).substr(0, 30),
       "truncated .npy header"},
      {"version.npy", std::string("\x93NUMPY\x09\x00", 8) + "xx", "version 9"},
  };
  for (const Bad& b : bads) {
    INFO(b.name);
    write_file(tmp.path(b.name), b.bytes);
    const std::string msg = error_of(tmp.path(b.name));
    CHECK(msg.find(b.expect) != std::string::npos);
    CHECK(msg.find(b.name) != std::string::npos);  // names the file
  }
  CHECK(error_of(tmp.path("missing.npy")).find("cannot open") != std::string::npos);
  // Typed reader rejects the wrong dtype.
  write_npy(tmp.path("u8.npy"), DType::uint8, {3}, "abc");
  CHECK_THROWS_AS(read_npy_float32(tmp.path("u8.npy")), Error);
  CHECK_THROWS_AS(read_npy_as_float64(tmp.path("u8.npy")), Error);
}

TEST_CASE("npy: a failed write leaves no file") {
  TmpDir tmp;
  const std::string p = tmp.path("no_such_dir/out.npy");
  const float x = 1.0f;
  CHECK_THROWS_AS(write_npy(p, DType::float32, {1}, &x), Error);
  CHECK(!fs::exists(p));
  // Writing over an existing file replaces it completely.
  const std::string q = tmp.path("q.npy");
  write_file(q, std::string(1000, 'x'));
  write_npy(q, DType::float32, {1}, &x);
  CHECK(read_npy(q).bytes.size() == 4);
}

TEST_CASE("npy: the header grammar NumPy writes and nothing looser; shapes checked before allocation") {
  TmpDir tmp;
  const std::string f4(16, '\0');
  auto dict = [](const std::string& shape) {
    return "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  };
  struct Bad {
    std::string name, bytes, expect;
  } bads[] = {
      // Shapes that an ad-hoc reader took for something else.
      {"pow.npy", npy_bytes(dict("(2**62)"), f4), "malformed .npy header"},
      {"float.npy", npy_bytes(dict("(1e3,)"), f4), "malformed .npy header"},
      {"junk.npy", npy_bytes(dict("(4x, 32)"), f4), "malformed .npy header"},
      {"neg.npy", npy_bytes(dict("(-4,)"), f4), "malformed .npy header"},
      {"noncomma.npy", npy_bytes(dict("(4)"), f4), "trailing comma"},
      {"big.npy", npy_bytes(dict("(99999999999999999999,)"), f4), "exceeds 2^63 - 1"},
      // A product that overflows (signed overflow before), and a huge valid
      // shape: both rejected before any allocation.
      {"overflow.npy", npy_bytes(dict("(4611686018427387904, 4)"), f4), "overflows 64 bits"},
      {"huge.npy", npy_bytes(dict("(1099511627776, 1024)"), f4), "truncated .npy data"},
      // Keys.
      {"nokey.npy", npy_bytes("{'descr': '<f4', 'shape': (4,), }", f4), "no 'fortran_order' entry"},
      {"extra.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}", f4),
       "unknown key 'x'"},
      {"twice.npy", npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,)}", f4),
       "given twice"},
      {"bool.npy", npy_bytes("{'descr': '<f4', 'fortran_order': 0, 'shape': (4,), }", f4), "True or False"},
      {"after.npy", npy_bytes(dict("(4,)") + " x", f4), "unexpected text"},
      // Data size against the file.
      {"long.npy", npy_bytes(dict("(3,)"), f4), "4 bytes after the .npy data"},
  };
  for (const Bad& b : bads) {
    INFO(b.name);
    write_file(tmp.path(b.name), b.bytes);
    const std::string msg = error_of(tmp.path(b.name));
    CHECK(msg.find(b.expect) != std::string::npos);
    CHECK(msg.find(b.name) != std::string::npos);
  }
  // What NumPy accepts: any key order, double quotes, no trailing comma, spaces.
  write_file(tmp.path("order.npy"),
             npy_bytes("{\"shape\": ( 2 , 2 ), \"fortran_order\": False, \"descr\": \"<f4\"}", f4));
  CHECK(read_npy(tmp.path("order.npy")).shape == Shape{2, 2});
  write_file(tmp.path("scalar.npy"), npy_bytes(dict("()"), f4.substr(0, 4)));
  CHECK(read_npy(tmp.path("scalar.npy")).shape == Shape{});
}

TEST_CASE("npy: zero-size arrays read and write without touching their (null) data") {
  TmpDir tmp;
  for (const Shape& s : {Shape{0}, Shape{0, 5}, Shape{3, 0}}) {
    INFO(shape_str(s));
    write_npy(tmp.path("z.npy"), DType::float32, s, nullptr);
    const Tensor<float> t = read_npy_float32(tmp.path("z.npy"));
    CHECK(t.shape == s);
    CHECK(t.data.empty());
    CHECK(read_npy_as_float64(tmp.path("z.npy")).data.empty());
  }
}

TEST_CASE("npy: a few hundred mutated files give a valid array or one clean error (fuzz)") {
  TmpDir tmp;
  const float f[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
  const double d[2] = {1.0 / 3, -2};
  const std::string seeds[] = {
      npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                std::string(reinterpret_cast<const char*>(f), 24)),
      npy_bytes("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", "\x01\x02\x03\x04"),
      npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), }",
                std::string(reinterpret_cast<const char*>(d), 16), 2),
  };
  test::FuzzCounts c;
  const std::string p = tmp.path("fuzz.npy");
  for (uint32_t k = 0; k < 360; ++k) {
    write_file(p, test::mutate_bytes(seeds[k % 3], k));
    test::classify(c, "mutation " + std::to_string(k), [&] {
      const NpyArray a = read_npy(p);
      REQUIRE(int64_t(a.bytes.size()) == shape_numel(a.shape) * int64_t(a.dtype == DType::float64   ? 8
                                                                        : a.dtype == DType::float32 ? 4
                                                                        : a.dtype == DType::uint16  ? 2
                                                                                                    : 1));
      if (a.dtype == DType::float32) (void)read_npy_float32(p);
    });
  }
  test::report("npy", c);
  CHECK(c.valid > 0);
  CHECK(c.clean_error > 0);
}
