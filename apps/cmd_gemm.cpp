// `fp4lab bench gemm`: throughput of the CUDA GEMMs (cuBLAS BF16, the NVFP4 /
// MXFP4 / MXFP8 block-scaled GEMMs simulated exactly on BF16 tensor cores,
// MXFP8 on the FP8 tensor cores with per-block promotion, cuBLASLt FP8 with a
// per-tensor scale) at m x n x k, measured in one run (apps/bench_cuda.hpp). CUDA only.
#include <memory>
#include <string>

#include "apps/commands.hpp"
#include "core/error.hpp"
#ifdef FP4LAB_WITH_CUDA
#include "apps/bench_cuda.hpp"
#endif

namespace fp4lab {

namespace {
struct GemmBenchArgs {
  std::string backend = "cuda";
  int64_t m = 8192, n = 8192, k = 8192;
  int repeats = 20;
};

void run_bench_gemm(const GemmBenchArgs& a) {
  if (a.backend != "cuda")
    throw Error("--backend '" + a.backend + "': `bench gemm` measures the CUDA GEMMs only; valid: cuda");
  if (a.m <= 0 || a.n <= 0 || a.k <= 0)
    throw Error("--m, --n and --k must be positive, got " + std::to_string(a.m) + ", " + std::to_string(a.n) + ", " +
                std::to_string(a.k));
  if (a.repeats <= 0) throw Error("--repeats must be positive, got " + std::to_string(a.repeats));
#ifdef FP4LAB_WITH_CUDA
  cuda::bench_gemm(a.m, a.n, a.k, a.repeats);
#else
  throw Error(
      "bench gemm --backend cuda: this fp4lab was built without the CUDA backend (configure with "
      "-DFP4LAB_CUDA=ON on a machine with nvcc, and run it on a machine with an NVIDIA GPU)");
#endif
}
}  // namespace

void register_bench_gemm(CLI::App& bench) {
  auto ga = std::make_shared<GemmBenchArgs>();
  CLI::App* g = bench.add_subcommand(
      "gemm",
      "GEMM throughput on the GPU: cuBLAS BF16 against the NVFP4 / MXFP4 / MXFP8 GEMMs (quantize both operands +\n"
      "GEMM, that GEMM alone, and dequantize + GEMM from quantized operands), MXFP8 on the FP8 tensor cores\n"
      "(sm_89+), and cuBLASLt FP8 with one scale per tensor; TFLOP/s and % of BF16, one run (each row timed\n"
      "interleaved with the BF16 GEMM, so the ratio does not drift with the GPU's clock over the run).\n"
      "Example: fp4lab bench gemm --backend cuda --m 8192 --n 8192 --k 8192");
  g->add_option("--backend", ga->backend, "cuda (the only backend of this benchmark)")->capture_default_str();
  g->add_option("--m", ga->m, "Rows of A and y")->capture_default_str();
  g->add_option("--n", ga->n, "Rows of B (columns of y)")->capture_default_str();
  g->add_option("--k", ga->k, "Reduction length")->capture_default_str();
  g->add_option("--repeats", ga->repeats, "Timed runs (median reported)")->capture_default_str();
  g->callback([ga] { run_bench_gemm(*ga); });
}

}  // namespace fp4lab
