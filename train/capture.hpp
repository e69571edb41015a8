// Operand capture (config output.capture_step): collects the FP32 operands a
// model's linear layers hand to Model::set_capture at one training step and
// writes them as <dir>/step_<N>/<layer>.<x|w|dy>.npy, all or none (a
// temporary directory renamed into place).
#pragma once

#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "train/backend.hpp"
#include "train/model.hpp"

namespace fp4lab::train {

class CaptureWriter {
 public:
  // dir: where step_<step>/ goes (the run's capture/ directory).
  CaptureWriter(Backend& be, std::filesystem::path dir, int64_t step) : be_(be), dir_(std::move(dir)), step_(step) {}
  // The hook for Model::set_capture (copies each operand to the host).
  OperandCapture hook();
  // Writes what the hook collected (after the step's backward); logs one line.
  void write(std::ostream& log);

 private:
  Backend& be_;
  std::filesystem::path dir_;
  int64_t step_;
  struct Operand {
    std::string name;
    int64_t rows, cols;
    std::vector<float> data;  // host copy
  };
  std::vector<Operand> operands_;
};

}  // namespace fp4lab::train
