// `fp4lab bench gemm`: throughput of the CUDA GEMMs (cuBLAS BF16, the NVFP4 /
// MXFP4 / MXFP8 block-scaled GEMMs simulated exactly on BF16 tensor cores,
// MXFP8 on the FP8 tensor cores with per-block promotion, cuBLASLt FP8 with a
// per-tensor scale, FP8 block scaling through cuBLASLt's VEC128 / BLK128x128 scale modes) at m x n x k, measured in one run (apps/bench_cuda.hpp); and
// `fp4lab bench grouped-gemm`: a mixture of experts' grouped GEMM (cuBLAS grouped,
// a per-expert loop, fp4lab's NVFP4 grouped quantization + grouped GEMM). CUDA only.
#include <memory>
#include <string>
#include <vector>

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
struct GroupedBenchArgs {
  std::string backend = "cuda";
  std::vector<int64_t> experts{8, 64}, tokens{16384, 65536}, hidden{1024, 4096};
  std::string out = "bf16";
  int repeats = 20;
};

void check_positive(const char* opt, const std::vector<int64_t>& v) {
  if (v.empty()) throw Error(std::string(opt) + " needs at least one value");
  for (int64_t x : v)
    if (x <= 0) throw Error(std::string(opt) + " values must be positive, got " + std::to_string(x));
}

void run_bench_grouped(const GroupedBenchArgs& a) {
  if (a.backend != "cuda")
    throw Error("--backend '" + a.backend + "': `bench grouped-gemm` measures the CUDA GEMMs only; valid: cuda");
  check_positive("--experts", a.experts);
  check_positive("--tokens", a.tokens);
  check_positive("--hidden", a.hidden);
  if (a.out != "bf16" && a.out != "f32") throw Error("--out '" + a.out + "': valid: bf16, f32");
  if (a.repeats <= 0) throw Error("--repeats must be positive, got " + std::to_string(a.repeats));
#ifdef FP4LAB_WITH_CUDA
  cuda::bench_grouped_gemm(a.experts, a.tokens, a.hidden, a.out, a.repeats);
#else
  throw Error(
      "bench grouped-gemm --backend cuda: this fp4lab was built without the CUDA backend (configure with "
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
      "(sm_89+), FP8 block scaling (x 1x128, W 128x128) through cuBLASLt's block-scaled FP8 matmul (sm_90+), and\n"
      "cuBLASLt FP8 with one scale per tensor; TFLOP/s and % of BF16, one run (each row timed\n"
      "interleaved with the BF16 GEMM, so the ratio does not drift with the GPU's clock over the run).\n"
      "Example: fp4lab bench gemm --backend cuda --m 8192 --n 8192 --k 8192");
  g->add_option("--backend", ga->backend, "cuda (the only backend of this benchmark)")->capture_default_str();
  g->add_option("--m", ga->m, "Rows of A and y")->capture_default_str();
  g->add_option("--n", ga->n, "Rows of B (columns of y)")->capture_default_str();
  g->add_option("--k", ga->k, "Reduction length")->capture_default_str();
  g->add_option("--repeats", ga->repeats, "Timed runs (median reported)")->capture_default_str();
  g->callback([ga] { run_bench_gemm(*ga); });

  auto gg = std::make_shared<GroupedBenchArgs>();
  CLI::App* gr = bench.add_subcommand(
      "grouped-gemm",
      "Mixture-of-experts grouped GEMM on the GPU, forward y_g = x_g W_g^T per expert (K = N = hidden), for every\n"
      "combination of --experts, --tokens and --hidden, tokens per expert balanced and skewed (Zipf-like, every\n"
      "8th expert empty, fixed seed): median ms and TFLOP/s of (a) cuBLAS's grouped BF16 GEMM (one\n"
      "cublasGemmGroupedBatchedEx), (b) a loop of per-expert cuBLAS GEMMs, (c) fp4lab's NVFP4 grouped\n"
      "quantization of x (nvfp4 per expert) and W (nvfp4_2d per expert) + grouped GEMM, that GEMM alone, and\n"
      "(c)/(a); one run, the forms timed in interleaved rounds.\n"
      "Example: fp4lab bench grouped-gemm --backend cuda --experts 8 --tokens 16384 --hidden 4096");
  gr->add_option("--backend", gg->backend, "cuda (the only backend of this benchmark)")->capture_default_str();
  gr->add_option("--experts", gg->experts, "Numbers of experts (groups), comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  gr->add_option("--tokens", gg->tokens, "Total tokens (rows of x over all experts), comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  gr->add_option("--hidden", gg->hidden, "Hidden sizes K = N, comma-separated")->delimiter(',')->capture_default_str();
  gr->add_option("--out", gg->out, "Output type: bf16, or f32 (cuBLAS's grouped form then runs TF32 on widened "
                                   "operands, exact for BF16 values)")
      ->capture_default_str();
  gr->add_option("--repeats", gg->repeats, "Timed rounds (median reported, at least 3)")->capture_default_str();
  gr->callback([gg] { run_bench_grouped(*gg); });
}

}  // namespace fp4lab
