// Token data (tokens.hpp): llm.c shards and raw uint16 files, memory-mapped, checked, sampled.
#include "train/tokens.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "core/error.hpp"
#include "core/philox.hpp"
#include "train/checksum.hpp"

namespace fp4lab::train {

static_assert(std::endian::native == std::endian::little, "token files are little-endian; mapped as they are");

// A read-only private mapping of a whole file, unmapped on destruction.
struct TokenSet::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
};

namespace {

// llm.c's other header magics (dev/data/data_common.py): files that are not GPT-2 uint16 tokens.
constexpr int32_t kLlmcEvalMagic = 20240522, kLlmcLlama3Magic = 20240801;

int32_t le32(const unsigned char* p) {
  return int32_t(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
}

}  // namespace

void check_token_config(const DataConfig& dc, const std::string& where, const std::string& model_type) {
  const std::string dp = where + ".data.";
  if (dc.train.empty()) throw Error(dp + "train: empty; valid: a glob of llm.c shards or raw uint16 token files");
  if (dc.val.empty()) throw Error(dp + "val: empty; valid: a glob of llm.c shards or raw uint16 token files");
  if (dc.format != "auto" && dc.format != "llmc" && dc.format != "raw")
    throw Error(dp + "format: \"" + dc.format + "\" is not valid; valid: auto, llmc, raw");
  if (dc.vocab_size < 1 || dc.vocab_size > 65536)
    throw Error(dp + "vocab_size: " + std::to_string(dc.vocab_size) +
                " is out of range; valid: an integer in 1..65536 (tokens are uint16; GPT-2's is 50257)");
  if (dc.padded_vocab_size != 0 && (dc.padded_vocab_size < dc.vocab_size || dc.padded_vocab_size > (1 << 24)))
    throw Error(dp + "padded_vocab_size: " + std::to_string(dc.padded_vocab_size) +
                " is out of range; valid: 0 (= vocab_size) or an integer in " + std::to_string(dc.vocab_size) +
                "..16777216 (llm.c pads GPT-2's 50257 to 50304)");
  if (model_type != "gpt")
    throw Error(where + ".data.type: \"tokens\" does not fit model.type \"" + model_type + "\" (gpt trains on tokens)");
}

nlohmann::json token_config_json(const DataConfig& dc) {
  return {{"type", dc.type},     {"train", dc.train},           {"val", dc.val},
          {"format", dc.format}, {"vocab_size", dc.vocab_size}, {"padded_vocab_size", dc.padded_vocab_size}};
}

TokenShard map_token_file(const std::string& path, const std::string& format, std::shared_ptr<void>& keep) {
  TokenShard s;
  s.path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open token file " + path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw_errno("cannot stat token file " + path, e);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": is a directory; expected a token file (llm.c shard or raw uint16)");
  }
  s.bytes = uint64_t(st.st_size);
  s.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (s.bytes == 0) {
    ::close(fd);
    throw Error(path + ": empty file; expected an llm.c shard or raw uint16 tokens");
  }
  auto map = std::make_shared<TokenSet::Mapping>();
  map->addr = ::mmap(nullptr, size_t(s.bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (map->addr == MAP_FAILED) {
    map->addr = nullptr;
    throw_errno("cannot map token file " + path, e);
  }
  map->size = size_t(s.bytes);
  keep = map;
  const auto* b = static_cast<const unsigned char*>(map->addr);
  const int32_t first = s.bytes >= 4 ? le32(b) : 0;
  if (format != "raw" && (first == kLlmcEvalMagic || first == kLlmcLlama3Magic))
    throw Error(path + ": starts with llm.c's magic " + std::to_string(first) +
                (first == kLlmcEvalMagic ? " (a multiple-choice eval file)" : " (a Llama-3 uint32 shard)") +
                ", not GPT-2 tokens; valid: an llm.c GPT-2 shard (magic 20240520) or raw uint16 tokens");
  s.llmc = format == "llmc" || (format == "auto" && first == kLlmcMagic);
  if (s.llmc) {
    // llmc/dataloader.h dataloader_load_shard_: magic, version 1, ntok > 0 and a file size of exactly
    // HEADER_SIZE * sizeof(int) + ntok * sizeof(uint16_t).
    if (s.bytes < uint64_t(kLlmcHeaderBytes))
      throw Error(path + ": " + std::to_string(s.bytes) + " bytes, shorter than an llm.c shard's " +
                  std::to_string(kLlmcHeaderBytes) + "-byte header (truncated?)");
    if (first != kLlmcMagic)
      throw Error(path + ": bad magic " + std::to_string(first) + " for an llm.c shard (data.format \"llmc\"); valid: " +
                  std::to_string(kLlmcMagic));
    const int32_t version = le32(b + 4), n = le32(b + 8);
    if (version != kLlmcVersion)
      throw Error(path + ": llm.c shard version " + std::to_string(version) + "; valid: 1 (GPT-2 uint16 tokens)");
    if (n <= 0) throw Error(path + ": llm.c shard header counts " + std::to_string(n) + " tokens; valid: > 0");
    const uint64_t need = uint64_t(kLlmcHeaderBytes) + 2 * uint64_t(n);
    if (s.bytes != need)
      throw Error(path + ": " + std::to_string(s.bytes) + " bytes but its header counts " + std::to_string(n) +
                  " tokens (" + std::to_string(need) + " bytes): " +
                  (s.bytes < need ? "truncated" : "trailing bytes after the tokens"));
    s.tokens = reinterpret_cast<const uint16_t*>(b + kLlmcHeaderBytes);
    s.count = n;
  } else {
    if (s.bytes % 2 != 0)
      throw Error(path + ": " + std::to_string(s.bytes) +
                  " bytes, an odd size for raw uint16 tokens (truncated?); an llm.c shard starts with magic " +
                  std::to_string(kLlmcMagic));
    s.tokens = reinterpret_cast<const uint16_t*>(b);
    s.count = int64_t(s.bytes / 2);
  }
  return s;
}

TokenSet TokenSet::open(const std::string& pattern, const std::string& key, const std::string& format,
                        int64_t vocab_size, int64_t min_tokens) {
  glob_t g{};
  // No GLOB_ERR: a directory of the pattern that does not exist is "no match", not a failure.
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty()))
    throw Error(key + ": \"" + pattern + "\" matches no file (run scripts/prepare_tokens.sh, or set " + key +
                " to a glob of llm.c shards or raw uint16 token files)");
  if (rc != 0) throw Error(key + ": \"" + pattern + "\": glob failed (out of memory or an unreadable directory)");
  std::sort(paths.begin(), paths.end());  // byte order, whatever the locale's collation
  TokenSet set;
  for (const std::string& p : paths) {
    std::shared_ptr<void> keep;
    TokenShard s = map_token_file(p, format, keep);
    set.maps_.push_back(std::static_pointer_cast<Mapping>(keep));
    if (s.count < min_tokens)
      throw Error(p + ": " + std::to_string(s.count) + " tokens; a " + key.substr(key.rfind('.') + 1) +
                  " shard needs at least model.context + 1 = " + std::to_string(min_tokens) +
                  " (sequences do not straddle shards)");
    // One pass: the maximum vectorises; the offending index is looked up only on failure.
    uint16_t mx = 0;
    for (int64_t i = 0; i < s.count; ++i) mx = std::max(mx, s.tokens[i]);
    if (int64_t(mx) >= vocab_size) {
      const int64_t at = std::find_if(s.tokens, s.tokens + s.count, [&](uint16_t t) { return t >= vocab_size; }) - s.tokens;
      throw Error(p + ": token " + std::to_string(s.tokens[at]) + " at index " + std::to_string(at) +
                  " is outside data.vocab_size " + std::to_string(vocab_size) + " (valid: 0.." +
                  std::to_string(vocab_size - 1) + "; a file of another tokenizer?)");
    }
    set.shards_.push_back(std::move(s));
  }
  return set;
}

int64_t TokenSet::total_tokens() const {
  int64_t n = 0;
  for (const TokenShard& s : shards_) n += s.count;
  return n;
}

std::string token_fingerprint(const std::vector<const TokenSet*>& sets) {
  uint32_t crc = 0;
  int64_t tokens = 0, files = 0;
  for (const TokenSet* set : sets)
    for (const TokenShard& s : set->shards()) {
      const int64_t meta[3] = {int64_t(s.bytes), s.mtime_ns, s.count};
      crc = crc32(s.path.data(), s.path.size() + 1, crc);  // with its NUL: "a" + "bc" differs from "ab" + "c"
      crc = crc32(meta, sizeof meta, crc);
      tokens += s.count, ++files;
    }
  return "tokens:" + std::to_string(tokens) + " files:" + std::to_string(files) + " meta-crc32:" + crc_hex(crc);
}

uint64_t TokenSampler::windows() const {
  uint64_t w = 0;
  for (const TokenShard& s : set->shards()) w += uint64_t(s.count - context);
  return w;
}

std::pair<size_t, int64_t> TokenSampler::window(uint64_t u) const {
  const auto& sh = set->shards();
  for (size_t k = 0; k < sh.size(); ++k) {
    const uint64_t w = uint64_t(sh[k].count - context);
    if (u < w) return {k, int64_t(u)};
    u -= w;
  }
  throw InternalError("TokenSampler::window: index beyond the split's windows");
}

Batch TokenSampler::batch(int64_t index) const {
  const uint64_t W = windows();  // TokenSet::open checked each shard holds >= context + 1 tokens
  FP4LAB_CHECK(W > 0, "a token split without a window");
  Batch b;
  b.size = batch_size;
  b.tokens.resize(size_t(batch_size * context));
  b.targets.resize(size_t(batch_size * context));
  for (int64_t i = 0; i < batch_size; ++i) {
    const uint64_t j = uint64_t(index * batch_size + i);
    const uint64_t r = uint64_t(random_bits(seed, stream, 2 * j)) << 32 | random_bits(seed, stream, 2 * j + 1);
    const auto [k, o] = window(r % W);
    const uint16_t* src = set->shards()[k].tokens + o;
    for (int64_t t = 0; t < context; ++t) {
      b.tokens[size_t(i * context + t)] = src[t];
      b.targets[size_t(i * context + t)] = src[t + 1];
    }
  }
  return b;
}

}  // namespace fp4lab::train
