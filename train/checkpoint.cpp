// checkpoint.bin reading and writing (checkpoint.hpp).
#include "train/checkpoint.hpp"

#include <cmath>
#include <cstring>
#include <fstream>

#include "core/error.hpp"
#include "train/checksum.hpp"
#include "train/run_files.hpp"
#include "core/json.hpp"

namespace fp4lab::train {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr char kMagic1[8] = {'F', 'P', '4', 'L', 'C', 'K', '0', '1'};
constexpr char kMagic2[8] = {'F', 'P', '4', 'L', 'C', 'K', '0', '2'};
constexpr uint64_t kMaxHeader = uint64_t(1) << 20;

struct Header {
  json fields;
  int version = 2;
  uint64_t payload_offset = 0;  // bytes before the three arrays
};

[[noreturn]] void bad(const fs::path& path, const std::string& what) {
  throw Error(path.string() + ": " + what + " (a damaged or foreign checkpoint; --force starts the run anew)");
}

// An integer field in [lo, hi].
int64_t int_field(const json& h, const char* key, int64_t lo, int64_t hi, const fs::path& path) {
  const auto it = h.find(key);
  if (it == h.end()) bad(path, std::string("header field '") + key + "' is missing");
  if (!it->is_number_integer())
    bad(path, std::string("header field '") + key + "' is " + it->type_name() + ", expected an integer");
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    bad(path, std::string("header field '") + key + "' = " + std::to_string(v) + " is outside [" +
                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

void string_field(const json& h, const char* key, const fs::path& path) {
  const auto it = h.find(key);
  if (it == h.end()) bad(path, std::string("header field '") + key + "' is missing");
  if (!it->is_string())
    bad(path, std::string("header field '") + key + "' is " + it->type_name() + ", expected a string");
}

// Every field's type and range (those all versions have; v2's CRC fields too).
void check_fields(const Header& hd, const fs::path& path) {
  const json& h = hd.fields;
  if (!h.is_object()) bad(path, "the header is " + std::string(h.type_name()) + ", expected a JSON object");
  const int64_t step = int_field(h, "step", 0, int64_t(1) << 48, path);
  int_field(h, "adam_t", 0, step, path);
  int_field(h, "params", 1, int64_t(1) << 40, path);
  string_field(h, "recipe", path);
  string_field(h, "config_hash", path);
  const auto best = h.find("best");
  if (best == h.end() || !(best->is_number() || best->is_null()))
    bad(path, "header field 'best' is missing or not a number");
  if (h.contains("world")) int_field(h, "world", 1, 1 << 20, path);
  if (h.contains("data") && !h["data"].is_string()) bad(path, "header field 'data' is not a string");
  if (hd.version >= 2) {
    int_field(h, "payload_bytes", 0, int64_t(1) << 48, path);
    string_field(h, "payload_crc32", path);
  }
}

Header read_header(std::istream& f, const fs::path& path) {
  if (!f) throw_errno(path.string() + ": cannot open the checkpoint", errno);
  char magic[8] = {};
  uint64_t len = 0;
  f.read(magic, 8);
  f.read(reinterpret_cast<char*>(&len), 8);
  Header hd;
  if (f && std::memcmp(magic, kMagic1, 8) == 0)
    hd.version = 1;
  else if (!f || std::memcmp(magic, kMagic2, 8) != 0)
    throw Error(path.string() + ": not an fp4lab checkpoint (its first bytes are not FP4LCK01/FP4LCK02)");
  if (len == 0 || len > kMaxHeader)
    bad(path, "header length " + std::to_string(len) + " is outside [1, " + std::to_string(kMaxHeader) + "]");
  std::string h(len, '\0');
  f.read(h.data(), std::streamsize(len));
  if (!f) bad(path, "the file ends inside the header");
  hd.payload_offset = 16 + len;
  if (hd.version >= 2) {
    uint32_t crc = 0;
    f.read(reinterpret_cast<char*>(&crc), 4);
    if (!f) bad(path, "the file ends inside the header");
    if (crc != crc32(h.data(), h.size()))
      bad(path, "the header's CRC-32 is " + crc_hex(crc32(h.data(), h.size())) + ", the file records " +
                    crc_hex(crc));
    hd.payload_offset += 4;
  }
  try {
    hd.fields = parse_json(h, path.string() + " (checkpoint header)");
  } catch (const json::exception& e) {
    bad(path, "the header is not JSON: " + json_error_text(e.what()));
  }
  check_fields(hd, path);
  return hd;
}

}  // namespace

void save_checkpoint(const fs::path& path, const Checkpoint& c) {
  json h = c.header;
  uint32_t crc = 0;
  uint64_t bytes = 0;
  for (const auto* vec : {&c.values, &c.m, &c.v}) {
    crc = crc32(vec->data(), vec->size() * sizeof(float), crc);
    bytes += vec->size() * sizeof(float);
  }
  h["payload_bytes"] = bytes;
  h["payload_crc32"] = crc_hex(crc);
  const std::string text = h.dump();
  const uint64_t len = text.size();
  const uint32_t hcrc = crc32(text.data(), text.size());
  AtomicFile f(path);
  f.write(kMagic2, 8);
  f.write(&len, 8);
  f.write(text.data(), text.size());
  f.write(&hcrc, 4);
  for (const auto* vec : {&c.values, &c.m, &c.v}) f.write(vec->data(), vec->size() * sizeof(float));
  f.commit();
}

json read_checkpoint_header(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return read_header(f, path).fields;
}

Checkpoint load_checkpoint(const fs::path& path, const CheckpointExpect& expect) {
  std::ifstream f(path, std::ios::binary);
  if (!f && !fs::exists(path)) throw Error("cannot resume: no checkpoint " + path.string());
  const Header hd = read_header(f, path);
  Checkpoint c;
  c.header = hd.fields;
  const json& h = c.header;
  const int64_t n = h["params"].get<int64_t>();
  if (n != expect.params)
    throw Error(path.string() + ": holds " + std::to_string(n) + " parameters but the model has " +
                std::to_string(expect.params) + " (the checkpoint of another config?)");
  if (!expect.config_hash.empty() && h["config_hash"].get<std::string>() != expect.config_hash)
    throw Error(path.string() + ": written by a run with config_hash " + h["config_hash"].get<std::string>() +
                ", but this run's config (and config.json) hash to " + expect.config_hash +
                " (a checkpoint of another run was copied here?); --force starts the run anew");
  if (h["step"].get<int64_t>() > expect.total_steps)
    bad(path, "header field 'step' = " + h["step"].dump() + " exceeds the run's " +
                  std::to_string(expect.total_steps) + " steps");
  const uint64_t payload = 3 * uint64_t(n) * sizeof(float);
  if (hd.version >= 2 && h["payload_bytes"].get<uint64_t>() != payload)
    bad(path, "header field 'payload_bytes' = " + h["payload_bytes"].dump() + ", expected " +
                  std::to_string(payload) + " for " + std::to_string(n) + " parameters");
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (!ec && size != hd.payload_offset + payload)
    bad(path, "the file has " + std::to_string(size) + " bytes, its header accounts for " +
                  std::to_string(hd.payload_offset + payload) +
                  (size < hd.payload_offset + payload ? " (truncated)" : " (trailing bytes)"));
  uint32_t crc = 0;
  for (auto* vec : {&c.values, &c.m, &c.v}) {
    vec->resize(size_t(n));
    f.read(reinterpret_cast<char*>(vec->data()), std::streamsize(size_t(n) * sizeof(float)));
    if (!f) bad(path, "truncated");
    crc = crc32(vec->data(), vec->size() * sizeof(float), crc);
  }
  if (hd.version >= 2 && crc_hex(crc) != h["payload_crc32"].get<std::string>())
    bad(path, "the parameters' and moments' CRC-32 is " + crc_hex(crc) + ", the header records " +
                  h["payload_crc32"].get<std::string>() + " (bytes changed since it was written)");
  return c;
}

Checkpoint load_checkpoint(const fs::path& path, int64_t n) {
  return load_checkpoint(path, CheckpointExpect{n, int64_t(1) << 48, ""});
}

}  // namespace fp4lab::train
