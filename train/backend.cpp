// The backend interface's free functions (backend.hpp): the choice of a
// backend by name and the check of flat-buffer index ranges.
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
