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
    if (t.data == nullptr) return;  // a BF16-only tensor (CUDA): nothing FP32 to write
    std::vector<float> h(static_cast<size_t>(t.size()));
    be_.download(t, h.data());
    Tensor shape;
    shape.rows = t.rows, shape.cols = t.cols;
    names_.emplace_back(name, shape);
    data_.push_back(std::move(h));
  };
  return c;
}

void CaptureWriter::write(std::ostream& log) {
  const fs::path final_dir = dir_ / ("step_" + std::to_string(step_));
  const fs::path tmp = final_dir.string() + ".tmp." + std::to_string(::getpid());
  fs::create_directories(tmp);
  for (size_t i = 0; i < names_.size(); ++i)
    write_npy((tmp / (names_[i].first + ".npy")).string(), DType::float32,
              {names_[i].second.rows, names_[i].second.cols}, data_[i].data());
  std::error_code ec;
  fs::remove_all(final_dir, ec);  // a resumed run that captured this step before
  fs::rename(tmp, final_dir);
  log << "captured " << names_.size() << " operands of step " << step_ << " in " << final_dir.string() << "\n";
  names_.clear();
  data_.clear();
}

}  // namespace fp4lab::train
