// The host loops of the compact row codec (mx_rows.hpp).
#include "train/mx_rows.hpp"

namespace fp4lab::train {

MxRows mx_rows_for(const char* what, const QuantizerSpec& q, int64_t rows, int64_t cols, int64_t capacity) {
  const MxRows m = mx_rows(q, cols);
  FP4LAB_CHECK(rows >= 0 && rows * m.row_bytes() <= capacity,
               std::string(what) + ": " + std::to_string(rows) + " rows of " + std::to_string(m.row_bytes()) +
                   " bytes do not fit a buffer of " + std::to_string(capacity) + " bytes");
  return m;
}

void mx_encode_rows(const MxRows& m, const float* x, int64_t rows, uint8_t* out) {
  const int64_t rb = m.row_bytes();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) mx_encode_row(m, x + r * m.cols, out + r * rb);
}

void mx_decode_rows(const MxRows& m, const uint8_t* in, int64_t rows, float* x) {
  const int64_t rb = m.row_bytes();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c) x[r * m.cols + c] = mx_decode_at(m, in + r * rb, c);
}

}  // namespace fp4lab::train
