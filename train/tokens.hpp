// Token data for the GPT (config `"data": {"type": "tokens", ...}`, issue 44): GPT-2 BPE token ids in llm.c
// shards or raw uint16 files, memory-mapped, and a batch sampler that is a pure function of (seed, step).
//
// Files. `data.train` and `data.val` are glob(3) patterns; their matches, sorted by byte order of the path,
// are the split's shards. A pattern matching nothing is an error naming the key and the pattern.
//   - llm.c shard (karpathy/llm.c, dev/data/data_common.py `write_datafile` and llmc/dataloader.h
//     `dataloader_load_shard_`): a header of 256 little-endian int32, header[0] = 20240520 (magic),
//     header[1] = 1 (version), header[2] = the token count n (> 0), the rest unused; then n little-endian
//     uint16 tokens; the file is exactly 1024 + 2 n bytes.
//   - raw: the whole file is little-endian uint16 tokens (nanoGPT's data/*/prepare.py train.bin, val.bin).
//   `data.format` "auto" (default) reads a file as a shard when its first 4 bytes are llm.c's magic, as raw
//   otherwise; a file starting with the magic of llm.c's other formats (20240522, its multiple-choice eval
//   files; 20240801, its Llama-3 uint32 shards) is an error, not raw tokens. "llmc" requires every file to be a
//   shard (another first word is "bad magic"); "raw" reads every file as raw (for a raw file whose first two
//   tokens happen to spell the magic: 55432, 308).
// Checks, all before training (TokenSet::open): each one is an fp4lab::Error naming the file and the problem:
// a directory, an unreadable or empty file, bad magic (format llmc), a version other than 1, a header count
// <= 0 or a size other than 1024 + 2 n (truncated or trailing bytes), an odd size of a raw file, fewer than
// context + 1 tokens in a shard, and (one pass over every token) a token >= data.vocab_size, with its index.
//
// Sampling (TokenSampler, the counterpart of data.hpp's TextSampler). A window is context + 1 consecutive
// tokens of one shard: inputs are its first context tokens, targets the same shifted by one. A shard of n
// tokens has n - context windows (starts 0 .. n - context - 1), so no window straddles two shards. Sequence
// i of batch k takes window u = draw(seed, stream, k * batch_size + i) mod W of the W windows of all shards
// in order (shard 0's, then shard 1's, ...): uniform over the split's windows, shards weighted by their
// length, nothing depending on earlier draws (a resumed run sees the batches of an uninterrupted one).
// The draw is TextSampler's (64 Philox bits of (seed, stream, 2j) and (2j + 1), modulo W).
//
// Fingerprint (checkpoint header and summary.json's "data"): "tokens:<T> files:<F> meta-crc32:<hex>" where
// the CRC-32 runs over each file's path (as globbed), byte size, mtime (ns) and token count, train files then
// val files. The contents are not hashed (a multi-GB corpus would need another full read at each start): a
// changed, added, removed or renamed shard changes the fingerprint; so does touching or moving the corpus.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/config.hpp"
#include "train/model.hpp"

namespace fp4lab::train {

// llm.c's GPT-2 shard header (dev/data/data_common.py HEADERS_INFO["gpt-2"]).
inline constexpr int32_t kLlmcMagic = 20240520, kLlmcVersion = 1;
inline constexpr int64_t kLlmcHeaderInts = 256, kLlmcHeaderBytes = kLlmcHeaderInts * 4;
// GPT-2's vocabulary (r50k_base: 50256 BPE merges + <|endoftext|> = 50256) and llm.c's padded size
// (the next multiple of 128, for faster matrix multiplies).
inline constexpr int64_t kGpt2Vocab = 50257, kGpt2PaddedVocab = 50304;

// config.data of type "tokens" (DataConfig): `get(key, field)` reads a key of the data object as
// train/config.cpp's strict reader does (types, integer ranges), `finish()` refuses the keys not read
// (unknown-key errors); then the values are checked (check_token_config). `where` prefixes error paths.
void check_token_config(const DataConfig& dc, const std::string& where, const std::string& model_type);
template <class Get, class Finish>
void parse_token_config(Get&& get, Finish&& finish, const std::string& where, const std::string& model_type,
                        DataConfig& dc) {
  get("train", dc.train);
  get("val", dc.val);
  get("format", dc.format);
  get("vocab_size", dc.vocab_size);
  get("padded_vocab_size", dc.padded_vocab_size);
  finish();
  check_token_config(dc, where, model_type);
}
// The resolved data section (config.json) and the model's vocabulary: padded_vocab_size, or vocab_size if 0.
nlohmann::json token_config_json(const DataConfig& dc);
inline int64_t token_model_vocab(const DataConfig& dc) { return std::max(dc.vocab_size, dc.padded_vocab_size); }

// One memory-mapped token file (read-only; unmapped with the TokenSet).
struct TokenShard {
  std::string path;
  bool llmc = false;                // an llm.c shard (else raw uint16)
  const uint16_t* tokens = nullptr;  // into the mapping (little-endian hosts only)
  int64_t count = 0;
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
};

class TokenSet {
 public:
  // Globs `pattern` (`key` names it in errors: "config.data.train"), maps and checks every file (the
  // header comment's list), including that each holds at least min_tokens tokens and none is >= vocab_size.
  static TokenSet open(const std::string& pattern, const std::string& key, const std::string& format,
                       int64_t vocab_size, int64_t min_tokens);
  TokenSet() = default;
  TokenSet(TokenSet&&) noexcept = default;
  TokenSet& operator=(TokenSet&&) noexcept = default;

  const std::vector<TokenShard>& shards() const { return shards_; }
  int64_t total_tokens() const;
  struct Mapping;  // one file's read-only mapping (tokens.cpp)

 private:
  std::vector<TokenShard> shards_;
  std::vector<std::shared_ptr<Mapping>> maps_;
};

// Reads one file as TokenSet::open does (format "auto" | "llmc" | "raw"), without the vocabulary and
// length checks; exposed for tests. `keep` receives the mapping that owns shard.tokens.
TokenShard map_token_file(const std::string& path, const std::string& format, std::shared_ptr<void>& keep);

// "tokens:<T> files:<F> meta-crc32:<hex>" over the sets in order (header comment).
std::string token_fingerprint(const std::vector<const TokenSet*>& sets);

struct TokenSampler {
  const TokenSet* set = nullptr;
  int64_t batch_size = 8, context = 1024;
  uint64_t seed = 0;
  uint64_t stream = 0;  // separates train batches and the two eval splits
  // Batch `index` (header comment): batch_size windows of context + 1 tokens, none straddling two shards.
  Batch batch(int64_t index) const;
  // The (shard, start) of window u of the split, u < windows(); exposed for tests.
  std::pair<size_t, int64_t> window(uint64_t u) const;
  uint64_t windows() const;
};

}  // namespace fp4lab::train
