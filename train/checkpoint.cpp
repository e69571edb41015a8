// checkpoint.bin reading and writing (checkpoint.hpp).
#include "train/checkpoint.hpp"

#include <unistd.h>

#include <cstring>
#include <fstream>

#include "core/error.hpp"
#include "core/json.hpp"

namespace fp4lab::train {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'F', 'P', '4', 'L', 'C', 'K', '0', '1'};

// The checkpoint's JSON header (step, adam_t, best, params, recipe, config_hash);
// `f` is left at the parameters.
json read_checkpoint_header(std::istream& f, const fs::path& path) {
  char magic[8];
  uint64_t len = 0;
  f.read(magic, 8);
  f.read(reinterpret_cast<char*>(&len), 8);
  if (!f || std::memcmp(magic, kMagic, 8) != 0 || len > (1u << 24))
    throw Error(path.string() + ": not an fp4lab checkpoint (bad magic/header)");
  std::string h(len, '\0');
  f.read(h.data(), std::streamsize(len));
  try {
    return parse_json(h, path.string() + " (checkpoint header)");
  } catch (const json::parse_error& e) {
    throw Error(path.string() + ": corrupt checkpoint header: " + e.what());
  }
}

}  // namespace

void write_atomic(const fs::path& path, const std::string& bytes) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error("cannot write " + tmp.string());
    f.write(bytes.data(), std::streamsize(bytes.size()));
    f.flush();
    if (!f) throw Error("writing " + tmp.string() + " failed (disk full?)");
  }
  fs::rename(tmp, path);
}

void save_checkpoint(const fs::path& path, const Checkpoint& c) {
  const std::string h = c.header.dump();
  std::string bytes(kMagic, 8);
  const uint64_t len = h.size();
  bytes.append(reinterpret_cast<const char*>(&len), 8);
  bytes += h;
  for (const auto* vec : {&c.values, &c.m, &c.v})
    bytes.append(reinterpret_cast<const char*>(vec->data()), vec->size() * sizeof(float));
  write_atomic(path, bytes);
}

json read_checkpoint_header(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return read_checkpoint_header(f, path);
}

Checkpoint load_checkpoint(const fs::path& path, int64_t n) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot resume: no checkpoint " + path.string());
  Checkpoint c;
  c.header = read_checkpoint_header(f, path);
  if (c.header.value("params", int64_t(-1)) != n)
    throw Error(path.string() + ": checkpoint holds " + c.header.value("params", json(-1)).dump() +
                " parameters but the model has " + std::to_string(n) + " (different config?)");
  for (auto* vec : {&c.values, &c.m, &c.v}) {
    vec->resize(size_t(n));
    f.read(reinterpret_cast<char*>(vec->data()), std::streamsize(size_t(n) * sizeof(float)));
  }
  if (!f) throw Error(path.string() + ": checkpoint is truncated");
  return c;
}

}  // namespace fp4lab::train
