// `fp4lab bench attention`: the trainer's attention on the GPU, the fused FP32
// kernels against the cuBLAS SGEMM path, forward and backward, in one run
// (apps/bench_cuda.hpp); then the BF16 flash path (model.attention
// "bf16_flash") against the FP32 path the trainer takes, at the given shape,
// the same without dropout, and GPT-2 small's (T 1024, 12 heads of 64). CUDA only.
#include <memory>
#include <string>

#include "apps/commands.hpp"
#include "core/error.hpp"
#ifdef FP4LAB_WITH_CUDA
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "apps/bench_cuda.hpp"
#include "cuda/device.hpp"
#include "train/cuda/nn.hpp"
#endif

namespace fp4lab {

namespace {
struct AttentionBenchArgs {
  std::string backend = "cuda";
  int64_t batch = 64, seq = 256, heads = 6, head_dim = 64;  // configs/gpt_shakespeare_char.json
  bool causal = true;
  float dropout = 0.2f;
  int repeats = 20;
  bool flash = true;  // the bf16_flash comparison after the FP32 table
  int64_t gpt2_batch = 8;  // batch of the GPT-2-small shape (0: skip it)
};

#ifdef FP4LAB_WITH_CUDA
// bf16_flash against the FP32 path the trainer takes (fused where it applies,
// else cuBLAS) at one shape: forward, backward, interleaved medians.
struct FlashRow {
  double fwd32, bwd32, fwdf, bwdf;
};
FlashRow time_flash(int64_t B, int64_t T, int64_t H, int64_t hd, bool causal, float dropout, int repeats) {
  namespace nn = cuda::nn;
  nn::AttentionDims d;
  d.batch = B, d.seq = T, d.heads = H, d.width = H * hd, d.causal = causal;
  d.scale = float(1.0 / std::sqrt(double(hd))), d.dropout = dropout, d.seed = 1, d.stream_id = 2;
  nn::AttentionDims df = d;
  df.bf16_flash = true;
  const int64_t BT = B * T, C = d.width;
  std::mt19937 gen(21);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> h(size_t(BT * 3 * C));
  for (float& x : h) x = nd(gen);
  cuda::DeviceBuffer<float> qkv(h.size()), out(size_t(BT * C)), dout(size_t(BT * C)), dqkv(h.size()),
      probs(size_t(nn::Attention::saved_floats(d))), saved(size_t(nn::Attention::saved_floats(df)));
  qkv.upload(h.data(), h.size());
  dout.upload(h.data(), size_t(BT * C));
  nn::Attention att(nullptr, nn::AttentionPath::automatic);
  const auto [f32, ff] = cuda::time_interleaved_median_ms(
      [&] { att.forward(d, qkv.data(), out.data(), probs.data()); },
      [&] { att.forward(df, qkv.data(), out.data(), saved.data()); }, 2, repeats);
  const auto [b32, bf] = cuda::time_interleaved_median_ms(
      [&] { att.backward(d, qkv.data(), probs.data(), dout.data(), dqkv.data()); },
      [&] { att.backward(df, qkv.data(), saved.data(), dout.data(), dqkv.data()); }, 2, repeats);
  return FlashRow{f32, b32, ff, bf};
}

void bench_flash(const AttentionBenchArgs& a) {
  struct Shape {
    const char* name;
    int64_t B, T, H, hd;
    float p;
  };
  std::vector<Shape> shapes = {{"given", a.batch, a.seq, a.heads, a.head_dim, a.dropout}};
  if (a.dropout > 0.0f) shapes.push_back({"given, dropout 0", a.batch, a.seq, a.heads, a.head_dim, 0.0f});
  if (a.gpt2_batch > 0) shapes.push_back({"GPT-2 small", a.gpt2_batch, 1024, 12, 64, 0.0f});
  std::printf("\nbf16_flash (BF16 tensor cores, online softmax, no [T, T] saved) against the FP32 path the trainer\n"
              "takes (fused kernels where they apply, else cuBLAS), %s, interleaved medians of %d\n",
              a.causal ? "causal" : "full", std::max(a.repeats, 3));
  std::printf("%-18s %5s %5s %4s %4s %5s | %9s %9s %8s %8s | %9s %9s %8s %8s | %7s\n", "shape", "B", "T", "H", "hd",
              "drop", "fp32 fwd", "fp32 bwd", "TF/s f", "TF/s b", "flash fwd", "flash bwd", "TF/s f", "TF/s b",
              "speedup");
  for (const Shape& s : shapes) {
    const std::string why = cuda::nn::Attention::flash_unsupported(
        cuda::nn::AttentionDims{s.B, s.T, s.H, s.H * s.hd, a.causal, 1.0f, 0.0f, 0, 0, true}, {});
    if (!why.empty()) {
      std::printf("%-18s bf16_flash cannot run %s\n", s.name, why.c_str());
      continue;
    }
    const FlashRow r = time_flash(s.B, s.T, s.H, s.hd, a.causal, s.p, std::max(a.repeats, 3));
    const double pairs = a.causal ? double(s.T) * double(s.T + 1) / 2.0 : double(s.T) * double(s.T);
    const double ff = 4.0 * double(s.B * s.H) * double(s.hd) * pairs / 1e12, fb = 2.0 * ff;
    std::printf("%-18s %5lld %5lld %4lld %4lld %5.2f | %9.3f %9.3f %8.1f %8.1f | %9.3f %9.3f %8.1f %8.1f | %6.2fx\n",
                s.name, (long long)s.B, (long long)s.T, (long long)s.H, (long long)s.hd, double(s.p), r.fwd32, r.bwd32,
                ff / (r.fwd32 * 1e-3), fb / (r.bwd32 * 1e-3), r.fwdf, r.bwdf, ff / (r.fwdf * 1e-3),
                fb / (r.bwdf * 1e-3), (r.fwd32 + r.bwd32) / (r.fwdf + r.bwdf));
  }
  std::printf("(ms; TFLOP/s count the products the mask leaves: forward 4 B H hd pairs, backward 8 B H hd pairs;\n"
              " speedup: FP32 forward+backward over bf16_flash forward+backward)\n");
}
#endif

void run_bench_attention(const AttentionBenchArgs& a) {
  if (a.backend != "cuda")
    throw Error("--backend '" + a.backend + "': `bench attention` measures the CUDA attention only; valid: cuda");
  if (a.batch <= 0 || a.seq <= 0 || a.heads <= 0 || a.head_dim <= 0)
    throw Error("--batch, --seq, --heads and --head-dim must be positive, got " + std::to_string(a.batch) + ", " +
                std::to_string(a.seq) + ", " + std::to_string(a.heads) + ", " + std::to_string(a.head_dim));
  if (!(a.dropout >= 0.0f && a.dropout < 1.0f))
    throw Error("--dropout must be in [0, 1), got " + std::to_string(a.dropout));
  if (a.repeats <= 0) throw Error("--repeats must be positive, got " + std::to_string(a.repeats));
  if (a.gpt2_batch < 0) throw Error("--gpt2-batch must be >= 0, got " + std::to_string(a.gpt2_batch));
#ifdef FP4LAB_WITH_CUDA
  cuda::bench_attention(a.batch, a.seq, a.heads, a.head_dim, a.causal, a.dropout, a.repeats);
  if (a.flash) bench_flash(a);
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
      "forward and backward, ms and TFLOP/s, one run; then bf16_flash against the FP32 path at this shape,\n"
      "without dropout, and at GPT-2 small's. Defaults: the shakespeare_char GPT's geometry.\n"
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
  c->add_option("--flash", aa->flash,
                "Also time bf16_flash (BF16 tensor-core flash attention) against the FP32 path (true/false)")
      ->capture_default_str();
  c->add_option("--gpt2-batch", aa->gpt2_batch,
                "Batch of the GPT-2-small shape (T 1024, 12 heads of 64) in the bf16_flash table; 0: skip it")
      ->capture_default_str();
  c->callback([aa] { run_bench_attention(*aa); });
}

}  // namespace fp4lab
