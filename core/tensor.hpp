// Dense row-major tensors with a shape, and non-owning views of them.
//
// Tensor<T> owns a std::vector<T> in C order (last index fastest). Shapes are
// int64 extents; a 2-D tensor of shape {rows, cols} has element (r, c) at
// r * cols + c. The simulator works on 2-D views (MatrixView) of such data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace fp4lab {

using Shape = std::vector<int64_t>;

inline int64_t shape_numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, [](int64_t a, int64_t b) { return a * b; });
}
std::string shape_str(const Shape& s);  // "[3, 4]"

template <class T>
struct Tensor {
  Shape shape;
  std::vector<T> data;

  Tensor() = default;
  explicit Tensor(Shape s, T fill = T{}) : shape(std::move(s)), data(size_t(shape_numel(shape)), fill) {}
  Tensor(Shape s, std::vector<T> d) : shape(std::move(s)), data(std::move(d)) {
    if (int64_t(data.size()) != shape_numel(shape))
      throw Error("tensor data size does not match shape " + shape_str(shape));
  }
  int64_t numel() const { return int64_t(data.size()); }
  int64_t rows() const { return shape.size() == 2 ? shape[0] : 1; }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
};

// A non-owning row-major 2-D view: element (r, c) at data[r * stride + c].
template <class T>
struct MatrixView {
  T* data = nullptr;
  int64_t rows = 0, cols = 0, stride = 0;
  MatrixView() = default;
  MatrixView(T* d, int64_t r, int64_t c) : data(d), rows(r), cols(c), stride(c) {}
  MatrixView(T* d, int64_t r, int64_t c, int64_t s) : data(d), rows(r), cols(c), stride(s) {}
  T& operator()(int64_t r, int64_t c) const { return data[r * stride + c]; }
  int64_t numel() const { return rows * cols; }
};

}  // namespace fp4lab
