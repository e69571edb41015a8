// Operand capture (capture.hpp).
#include "train/capture.hpp"

#include <unistd.h>

#include <system_error>

#include "core/npy.hpp"

namespace fp4lab::train {

namespace fs = std::filesystem;

OperandCapture CaptureWriter::hook() {
  OperandCapture c;
  c.step = step_;
  c.save = [this](const std::string& name, const Tensor& t) {
    if (t.data == nullptr) return;  // BF16 only (ProducerOutputs::f32 false, CUDA): nothing FP32 to write
    Operand o{name, t.rows, t.cols, std::vector<float>(static_cast<size_t>(t.size()))};
    be_.download(t, o.data.data());
    operands_.push_back(std::move(o));
  };
  return c;
}

void CaptureWriter::write(std::ostream& log) {
  const fs::path final_dir = dir_ / ("step_" + std::to_string(step_));
  const fs::path tmp = final_dir.string() + ".tmp." + std::to_string(::getpid());
  fs::create_directories(tmp);
  for (const Operand& o : operands_)
    write_npy((tmp / (o.name + ".npy")).string(), DType::float32, {o.rows, o.cols}, o.data.data());
  std::error_code ec;
  fs::remove_all(final_dir, ec);  // a resumed run that captured this step before
  fs::rename(tmp, final_dir);
  log << "captured " << operands_.size() << " operands of step " << step_ << " in " << final_dir.string() << "\n";
  operands_.clear();
}

}  // namespace fp4lab::train
