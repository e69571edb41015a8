// The trainer tests' generated char corpus: `sentences` short sentences in a
// repeating, learnable pattern with a little variety (20 distinct characters).
#pragma once

#include <string>

namespace fp4lab::train::test {

inline std::string words_corpus(int sentences = 600) {
  const char* words[] = {"the cat sat. ", "a dog ran! ", "we sing low; ", "to be or not. "};
  std::string s;
  for (int i = 0; i < sentences; ++i) s += words[(i * 7 + i / 3) % 4];
  return s;
}

}  // namespace fp4lab::train::test
