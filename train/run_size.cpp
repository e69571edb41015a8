// check_run_size (train/config.hpp): the memory a run needs, checked against
// the machine's before anything is allocated. Kept apart from the config
// parser it serves.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>

#include "core/error.hpp"
#include "train/config.hpp"
#include "train/tokens.hpp"

namespace fp4lab::train {

namespace {

// Unsigned 64-bit products and sums that stick at kSaturated instead of
// wrapping: a size that overflows is "more than 2^64 bytes", never a small number.
constexpr uint64_t kSaturated = std::numeric_limits<uint64_t>::max();
uint64_t mul(std::initializer_list<uint64_t> xs) {
  uint64_t r = 1;
  for (uint64_t x : xs)
    if (__builtin_mul_overflow(r, x, &r)) return kSaturated;
  return r;
}
uint64_t add(std::initializer_list<uint64_t> xs) {
  uint64_t r = 0;
  for (uint64_t x : xs)
    if (__builtin_add_overflow(r, x, &r)) return kSaturated;
  return r;
}
std::string bytes_text(uint64_t b) {
  if (b == kSaturated) return "more than 2^64 bytes";
  char s[64];
  std::snprintf(s, sizeof s, "%llu bytes (%.3g GiB)", (unsigned long long)b, double(b) / 1073741824.0);
  return s;
}

// One part of a run's memory: its bytes and the keys that drive it.
struct SizePart {
  const char* what;
  uint64_t bytes;
  std::string keys;
};

}  // namespace

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? mul({uint64_t(pages), uint64_t(page)}) : kSaturated;
}

void check_run_size(const RunConfig& c, uint64_t available, const std::string& where) {
  // FP32 counts, each a lower bound of what the model allocates (biases, LayerNorm
  // statistics and the recipes' quantized copies left out), so that a config this
  // refuses could never have run.
  const ModelConfig& m = c.model;
  const uint64_t L = uint64_t(m.layers), C = uint64_t(m.width), H = uint64_t(m.heads);
  uint64_t params = 0, acts = 0, out = 0;
  std::string param_keys, act_keys, out_keys;
  if (m.type == "gpt") {
    // Char data has at most 256 symbols (one a byte) and sets vocab_size from the text; token data from data.
    const uint64_t V = uint64_t(c.data.type == "char"     ? std::min<int64_t>(m.vocab_size, 256)
                                : c.data.type == "tokens" ? token_model_vocab(c.data) : m.vocab_size);
    const uint64_t T = uint64_t(m.context), B = uint64_t(c.training.batch_size);
    uint64_t mlp = mul({8, C, C});  // c_fc [4C x C] + c_proj [C x 4C]
    param_keys = "model.layers x model.width^2";
    if (m.moe.experts > 0) {
      const uint64_t E = uint64_t(m.moe.experts) + (m.moe.shared_expert ? 1 : 0);
      const uint64_t F = m.moe.expert_hidden > 0 ? uint64_t(m.moe.expert_hidden) : 4 * C / uint64_t(m.moe.top_k);
      mlp = add({mul({C, uint64_t(m.moe.experts)}), mul({E, 2, C, F})});
      param_keys = "model.layers x model.width x model.moe.experts x model.moe.expert_hidden";
    }
    params = add({mul({V, C}), mul({T, C}), mul({L, add({mul({4, C, C}), mlp})})});  // wte, wpe, blocks
    // Per block, at least 8 [B*T, C] tensors kept for the backward pass, and the
    // FP32 attention's probabilities [B, H, T, T] (bf16_flash keeps none).
    const uint64_t probs = m.attention == ModelConfig::Attention::fp32 ? mul({B, H, T, T}) : 0;
    acts = mul({L, add({mul({8, B, T, C}), probs})});
    act_keys = "training.batch_size x model.context x model.layers x (model.width" +
               std::string(probs ? " + model.heads x model.context)" : ")");
    out = mul({2, B, T, V});  // logits and their gradient
    out_keys = "training.batch_size x model.context x vocabulary";
  } else {
    const uint64_t G = uint64_t(m.image_size / m.patch_size), S = G * G + 1;  // patches + [CLS]
    const uint64_t F = uint64_t(double(m.width) * m.mlp_ratio);
    const uint64_t B = uint64_t(std::max(c.training.batch_size, c.training.eval_batch_size));
    const uint64_t patch_dim = mul({uint64_t(m.channels), uint64_t(m.patch_size), uint64_t(m.patch_size)});
    params = add({mul({patch_dim, C}), mul({S, C}), mul({L, add({mul({4, C, C}), mul({2, C, F})})}),
                  mul({C, uint64_t(m.classes)})});
    param_keys = "model.layers x model.width x (model.width + model.mlp_ratio)";
    acts = mul({L, add({mul({8, B, S, C}), mul({B, H, S, S})})});
    act_keys = "max(training.batch_size, training.eval_batch_size) x model.layers x (model.image_size / "
               "model.patch_size)^2 x model.width";
    out = mul({B, uint64_t(m.channels), uint64_t(m.image_size), uint64_t(m.image_size)});  // the batch's images
    out_keys = "max(training.batch_size, training.eval_batch_size) x model.image_size^2";
  }
  // Parameters and gradients, 4 bytes a float; AdamW's two moments, 4 bytes each or 2 (training.moments bf16).
  const uint64_t param_bytes = c.training.adamw.moments == MomentStorage::bf16 ? 12 : 16;
  SizePart parts[] = {{"parameters, gradients and AdamW moments", mul({param_bytes, params}), param_keys},
                      {"activations", mul({4, acts}), act_keys},
                      {m.type == "gpt" ? "logits" : "input images", mul({4, out}), out_keys}};
  const uint64_t need = add({parts[0].bytes, parts[1].bytes, parts[2].bytes});
  if (need <= available) return;
  const SizePart& big = *std::max_element(std::begin(parts), std::end(parts),
                                          [](const SizePart& a, const SizePart& b) { return a.bytes < b.bytes; });
  throw Error(where + ": the model and one training step need at least " + bytes_text(need) + " but this machine has " +
              bytes_text(available) + " of memory; the most is " + big.what + ", " + bytes_text(big.bytes) + " (" +
              big.keys + "); make those smaller");
}

}  // namespace fp4lab::train
