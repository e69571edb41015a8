// The trainer tests' generated char corpus: `sentences` short sentences in a
// repeating, learnable pattern with a little variety (20 distinct characters);
// the file they train on, the tiny GPT config they start from, and the message
// a config is refused with.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "train/config.hpp"

namespace fp4lab::train::test {

inline std::string words_corpus(int sentences = 600) {
  const char* words[] = {"the cat sat. ", "a dog ran! ", "we sing low; ", "to be or not. "};
  std::string s;
  for (int i = 0; i < sentences; ++i) s += words[(i * 7 + i / 3) % 4];
  return s;
}

// words_corpus() written to dir/text.txt (dir created); its path.
inline std::string write_words_corpus(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path p = dir / "text.txt";
  std::ofstream(p) << words_corpus();
  return p.string();
}

// A tiny char GPT (1 layer, 2 heads, width 16, context 16, dropout 0.1; batch 4, 60 steps, lr 1e-2, warmup 5,
// evaluation every 20 steps on 2 batches, a metrics line every 5; seed 3) on `text`, its run directory under
// `out`. Tests change the keys they are about.
inline nlohmann::json tiny_gpt_config(const std::string& text, const std::string& out,
                                      const nlohmann::json& recipe = "fp32") {
  return nlohmann::json{
      {"name", "tiny"},
      {"model", {{"type", "gpt"}, {"layers", 1}, {"heads", 2}, {"width", 16}, {"context", 16}, {"dropout", 0.1}}},
      {"data", {{"type", "char"}, {"path", text}}},
      {"training",
       {{"batch_size", 4},
        {"steps", 60},
        {"lr", 1e-2},
        {"warmup_steps", 5},
        {"eval_interval", 20},
        {"eval_iters", 2},
        {"log_interval", 5}}},
      {"recipe", recipe},
      {"seed", 3},
      {"output", {{"dir", out}}}};
}

// A tiny MoE GPT (2 layers of 8 experts, top 2, width 32, context 16, dropout 0; 8 sequences a step, a
// multiple of 2 and 4 ranks; 10 steps, evaluation every 5 on 2 batches, a metrics line every step; seed 5) on
// `text`, named `name`; expert_parallel > 1 sets distributed.expert_parallel.
inline nlohmann::json tiny_moe_config(const std::string& text, const std::string& out, const std::string& name,
                                      int expert_parallel = 1) {
  nlohmann::json j{{"name", name},
                   {"model",
                    {{"type", "gpt"},
                     {"layers", 2},
                     {"heads", 2},
                     {"width", 32},
                     {"context", 16},
                     {"dropout", 0.0},
                     {"moe", {{"experts", 8}, {"top_k", 2}, {"aux_loss", 0.01}, {"z_loss", 0.001}}}}},
                   {"data", {{"type", "char"}, {"path", text}}},
                   {"training",
                    {{"batch_size", 8},
                     {"steps", 10},
                     {"lr", 1e-2},
                     {"grad_clip", 1.0},
                     {"eval_interval", 5},
                     {"eval_iters", 2},
                     {"log_interval", 1}}},
                   {"seed", 5},
                   {"threads", 1},
                   {"output", {{"dir", out}}}};
  if (expert_parallel != 1) j["distributed"] = {{"expert_parallel", expert_parallel}};
  return j;
}

// The message config_from_json(j) refuses j with; "" when it is valid.
inline std::string config_error(const nlohmann::json& j) {
  try {
    config_from_json(j);
  } catch (const fp4lab::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace fp4lab::train::test
