// The backend interface's free functions (backend.hpp): the choice of a
// backend by name and the checks of index ranges and row indices.
#include "train/backend.hpp"

#include <string>

#include "core/error.hpp"

namespace fp4lab::train {

void check_ranges(const char* what, std::span<const IndexRange> ranges, int64_t n) {
  int64_t end = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    const IndexRange& r = ranges[k];
    if (r.size <= 0 || r.offset < end || r.offset > n - r.size)
      throw Error(std::string(what) + ": range " + std::to_string(k) + " [" + std::to_string(r.offset) + ", " +
                  std::to_string(r.offset + r.size) + ") is " +
                  (r.size <= 0      ? "empty"
                   : r.offset < end ? "not after the previous range's end " + std::to_string(end)
                                    : "outside the buffer of " + std::to_string(n) + " elements") +
                  "; ranges must be non-empty, sorted, disjoint and inside [0, n)");
    end = r.offset + r.size;
  }
}

void check_same_cols(const char* what, const Tensor& a, const Tensor& b) {
  if (a.cols != b.cols)
    throw Error(std::string(what) + ": tensors of " + std::to_string(a.cols) + " and " + std::to_string(b.cols) +
                " columns; they must have the same width");
}

void check_row_indices(const char* what, const int32_t* idx, int64_t n, int64_t rows) {
  for (int64_t i = 0; i < n; ++i)
    if (idx[i] < 0 || idx[i] >= rows)
      throw Error(std::string(what) + ": index " + std::to_string(i) + " is " + std::to_string(idx[i]) +
                  ", outside the " + std::to_string(rows) + " rows [0, " + std::to_string(rows) + ")");
}

std::unique_ptr<Backend> make_backend(const std::string& name, int threads) {
  if (name == "cpu") return make_cpu_backend(threads);
  if (name == "cuda") {
#ifdef FP4LAB_WITH_CUDA
    return make_cuda_backend();
#else
    throw Error("backend \"cuda\": this fp4lab was built without CUDA (valid backends here: cpu)");
#endif
  }
  throw Error("backend \"" + name + "\" unknown; valid: cpu, cuda");
}

}  // namespace fp4lab::train
