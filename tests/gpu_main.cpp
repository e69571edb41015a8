// main() of the GPU test executables (test_cuda, test_train_cuda). With a GPU
// every test case runs. Without one, only the cases of test suite "host" run
// (host-side code of the CUDA modules, and the no-GPU error paths); the
// executable then exits with kSkipped, which ctest reports as SKIPPED
// (SKIP_RETURN_CODE in tests/CMakeLists.txt), never as Passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "cuda/device.hpp"

namespace {
constexpr int kSkipped = 77;
}

int main(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
  if (fp4lab::cuda::gpu_available()) return ctx.run();
  ctx.addFilter("test-suite", "host");
  const int rc = ctx.run();
  if (rc != 0 || ctx.shouldExit()) return rc;
  std::printf("SKIPPED: no CUDA GPU (cudaGetDeviceCount failed or returned 0); only the host test suite ran\n");
  return kSkipped;
}
