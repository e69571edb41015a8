// The backend operation table's BF16 flash attention rows (AttentionShape::
// bf16_flash: the CUDA kernels, the CPU backend's twin; backend_cases.hpp).
//
// Tolerance, derived per row from the float64 evaluation of the same roundings
// (attention_flash_ref.hpp): each backend's output element e lies within its
// bound b_e of the float64 value (b_e for the CPU twin's FP32 model, b'_e for
// the kernels': truncating tensor-core sums, ex2.approx), so two backends lie
// within b_e + b'_e of each other. The table compares max |test - ref| <=
// tol (1 + max |ref|); the row's tol is max_e (b_e + b'_e) over (1 + max |value|
// - max b_e), which that comparison implies. The whole chain runs on each
// backend (the backward of its own forward), so the bound carries the forward's
// error into D and P; the element-wise comparison, the backward on one saved
// forward, is tests/train/cuda/test_attention_flash_twin.cpp's.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "train/attention_flash_ref.hpp"
#include "train/backend_cases.hpp"

namespace fp4lab::train::test {

namespace {

// The row tolerance that max_e |x - y| <= max_e (b_e + b'_e) implies for the table's comparison.
double table_tol(const std::vector<double>& want, const std::vector<double>& b_cpu, const std::vector<double>& b_gpu) {
  double worst = 0.0, mx = 0.0, mb = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, b_cpu[i] + b_gpu[i]);
    mx = std::max(mx, std::fabs(want[i]));
    mb = std::max(mb, b_cpu[i]);
  }
  return worst / std::max(1.0, 1.0 + mx - mb) * (1.0 + 1e-9);
}

}  // namespace

void flash_attention_cases(std::vector<OpCase>& cs) {
  struct Geo {
    int64_t B, T, H, hd;
  };
  uint32_t seed = 900;
  for (const Geo& g : {Geo{1, 1, 1, 16}, Geo{2, 7, 2, 32}, Geo{1, 63, 2, 64}, Geo{1, 65, 1, 128}, Geo{2, 130, 2, 16}})
    for (bool causal : {false, true})
      for (float p : {0.0f, 0.1f}) {
        const int64_t C = g.H * g.hd;
        const AttentionShape s{g.B,  g.T, g.H, causal, float((causal ? 1.0 : 4.0) / std::sqrt(double(g.hd))),
                               p,    true};
        seed += 2;
        std::ostringstream params;
        params << "B=" << g.B << " T=" << g.T << " H=" << g.H << " hd=" << g.hd << (causal ? " causal" : " full")
               << " scale=" << s.scale << " dropout=" << p;
        OpCase c;
        c.op = "attention_forward/backward (bf16_flash)";
        c.params = params.str();
        c.tol = 1.0;  // not used: every output sets its own (below)
        c.run = [s, C, seed](Backend& be) {
          const int64_t N = s.batch * s.seq, hd = C / s.heads;
          const DropoutKey key{77, 0xF1A5ull};
          const std::vector<float> qkv = randv(size_t(N * 3 * C), seed, 0.7f), dout = randv(size_t(N * C), seed + 1);
          Tensor q = put(be, qkv, N, 3 * C), d = put(be, dout, N, C);
          Tensor o = be.empty(N, C), sv = be.empty(s.batch * s.heads * s.seq, attention_saved_cols(s, hd)),
                 dq = be.empty(N, 3 * C);
          be.attention_forward(s, q, o, sv, key);
          be.attention_backward(s, q, sv, d, dq, key);
          const FlashRef cpu = flash_reference(s, qkv, dout, key), gpu = flash_reference(s, qkv, dout, key, kFlashCudaModel);
          // The saved tensor's values and bounds: O ([B*H][T][hd], out's rows) then lse2.
          std::vector<double> saved, sb_cpu, sb_gpu;
          for (int64_t bh = 0; bh < s.batch * s.heads; ++bh)
            for (int64_t i = 0; i < s.seq; ++i)
              for (int64_t c = 0; c < hd; ++c) {
                const size_t oi = size_t(((bh / s.heads) * s.seq + i) * C + (bh % s.heads) * hd + c);
                saved.push_back(cpu.out[oi]), sb_cpu.push_back(cpu.tol_out[oi]), sb_gpu.push_back(gpu.tol_out[oi]);
              }
          saved.insert(saved.end(), cpu.lse.begin(), cpu.lse.end());
          sb_cpu.insert(sb_cpu.end(), cpu.tol_lse.begin(), cpu.tol_lse.end());
          sb_gpu.insert(sb_gpu.end(), gpu.tol_lse.begin(), gpu.tol_lse.end());
          Outputs outs;
          std::vector<float> h(size_t(o.size()));
          be.download(o, h.data());
          outs.push_back({"out", std::vector<double>(h.begin(), h.end()), N, C, true,
                          table_tol(cpu.out, cpu.tol_out, gpu.tol_out)});
          h.resize(size_t(sv.size()));
          be.download(sv, h.data());
          outs.push_back({"saved", std::vector<double>(h.begin(), h.end()), sv.rows, sv.cols, true,
                          table_tol(saved, sb_cpu, sb_gpu)});
          h.resize(size_t(dq.size()));
          be.download(dq, h.data());
          outs.push_back({"dqkv", std::vector<double>(h.begin(), h.end()), N, 3 * C, true,
                          table_tol(cpu.dqkv, cpu.tol_dqkv, gpu.tol_dqkv)});
          return outs;
        };
        cs.push_back(std::move(c));
      }
}

}  // namespace fp4lab::train::test
