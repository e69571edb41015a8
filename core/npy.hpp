// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0 on
// read; 1.0 on write, 2.0 when the header needs it), C order, little endian.
//
// Supported dtypes: float32 ('<f4'), float64 ('<f8'), uint8 ('|u1'),
// uint16 ('<u2'), uint32 ('<u4'), int64 ('<i8': group sizes). Anything else,
// a wrong magic, Fortran order or a truncated file throws fp4lab::Error naming
// the file and the problem.
// Writes are atomic: the data goes to "PATH.tmp.PID" and is renamed over PATH,
// so a failed write never leaves a partial file.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "core/tensor.hpp"

namespace fp4lab {

enum class DType { float32, float64, uint8, uint16, uint32, int64 };
const char* dtype_name(DType d);

struct NpyArray {
  DType dtype;
  Shape shape;
  std::vector<unsigned char> bytes;  // raw little-endian element data, C order
};

NpyArray read_npy(const std::string& path);
void write_npy(const std::string& path, DType dtype, const Shape& shape, const void* data);

// Typed helpers. read_npy_float32 accepts only float32 files (error otherwise);
// read_npy_as_float64 accepts float32 or float64 and widens exactly.
Tensor<float> read_npy_float32(const std::string& path);
Tensor<double> read_npy_as_float64(const std::string& path);  // float32 or float64 input, exact
template <class T>
void write_npy(const std::string& path, const Tensor<T>& t);

}  // namespace fp4lab
