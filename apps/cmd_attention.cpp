// `fp4lab bench attention`: the trainer's attention on the GPU, the fused FP32
// kernels against the cuBLAS SGEMM path, forward and backward, in one run
// (apps/bench_cuda.hpp). CUDA only.
#include <memory>
#include <string>

#include "apps/commands.hpp"
#include "core/error.hpp"
#ifdef FP4LAB_WITH_CUDA
#include "apps/bench_cuda.hpp"
#endif

namespace fp4lab {

namespace {
struct AttentionBenchArgs {
  std::string backend = "cuda";
  int64_t batch = 64, seq = 256, heads = 6, head_dim = 64;  // configs/gpt_shakespeare_char.json
  bool causal = true;
  float dropout = 0.2f;
  int repeats = 20;
};

void run_bench_attention(const AttentionBenchArgs& a) {
  if (a.backend != "cuda")
    throw Error("--backend '" + a.backend + "': `bench attention` measures the CUDA attention only; valid: cuda");
  if (a.batch <= 0 || a.seq <= 0 || a.heads <= 0 || a.head_dim <= 0)
    throw Error("--batch, --seq, --heads and --head-dim must be positive, got " + std::to_string(a.batch) + ", " +
                std::to_string(a.seq) + ", " + std::to_string(a.heads) + ", " + std::to_string(a.head_dim));
  if (!(a.dropout >= 0.0f && a.dropout < 1.0f))
    throw Error("--dropout must be in [0, 1), got " + std::to_string(a.dropout));
  if (a.repeats <= 0) throw Error("--repeats must be positive, got " + std::to_string(a.repeats));
#ifdef FP4LAB_WITH_CUDA
  cuda::bench_attention(a.batch, a.seq, a.heads, a.head_dim, a.causal, a.dropout, a.repeats);
#else
  throw Error(
      "bench attention --backend cuda: this fp4lab was built without the CUDA backend (configure with "
      "-DFP4LAB_CUDA=ON on a machine with nvcc, and run it on a machine with an NVIDIA GPU)");
#endif
}
}  // namespace

void register_bench_attention(CLI::App& bench) {
  auto aa = std::make_shared<AttentionBenchArgs>();
  CLI::App* c = bench.add_subcommand(
      "attention",
      "The trainer's multi-head attention on the GPU (FP32): the fused kernels against the cuBLAS SGEMM path,\n"
      "forward and backward, ms and TFLOP/s, one run. Defaults: the shakespeare_char GPT's geometry.\n"
      "Example: fp4lab bench attention --backend cuda --batch 64 --seq 256 --heads 6 --head-dim 64");
  c->add_option("--backend", aa->backend, "cuda (the only backend of this benchmark)")->capture_default_str();
  c->add_option("--batch", aa->batch, "Sequences")->capture_default_str();
  c->add_option("--seq", aa->seq, "Sequence length T")->capture_default_str();
  c->add_option("--heads", aa->heads, "Heads")->capture_default_str();
  c->add_option("--head-dim", aa->head_dim, "Head dimension (the fused kernels take 16, 32, 64, 128)")
      ->capture_default_str();
  c->add_option("--causal", aa->causal, "Causal mask (true/false)")->capture_default_str();
  c->add_option("--dropout", aa->dropout, "Dropout probability on the attention weights")->capture_default_str();
  c->add_option("--repeats", aa->repeats, "Timed runs (median reported)")->capture_default_str();
  c->callback([aa] { run_bench_attention(*aa); });
}

}  // namespace fp4lab
