// `fp4lab bench quantize|gemm|attention --backend cuda` (bench.hpp). Timing: cudaEvents
// around each launch sequence, warm-up first, median of `repeats` (METHOD.md).
#include "apps/bench_cuda.hpp"

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/encode.hpp"
#include "core/philox.hpp"
#include "core/sr.hpp"
#include "cuda/device.hpp"
#include "cuda/gemm.hpp"
#include "train/cuda/nn.hpp"
#include "cuda/quantize.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab::cuda {
namespace {

// Standard normal values (Box-Muller on Philox bits), stored as f32 and bf16.
__global__ void fill_normal_kernel(float* x32, uint16_t* x16, int64_t n, uint64_t seed, float scale) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const Philox4 g = philox_group(seed, 7, uint64_t(i));
  const float u1 = (float(g.v[0] >> 8) + 1.0f) * 0x1p-24f, u2 = float(g.v[1] >> 8) * 0x1p-24f;
  float v = scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  const uint16_t h = uint16_t(encode_rn_f32<bfloat16>(v, Overflow::saturate));
  if (x16) x16[i] = h;
  if (x32) x32[i] = bits_float(uint32_t(h) << 16);  // the same values in both precisions
}

void fill_normal(float* x32, uint16_t* x16, int64_t n, uint64_t seed, float scale = 1.0f) {
  fill_normal_kernel<<<unsigned((n + 255) / 256), 256>>>(x32, x16, n, seed, scale);
  check_launch("fill_normal_kernel");
  check(cudaDeviceSynchronize(), "fill_normal");
}

// y [m, n] (BF16) = A [m, k] B [n, k]^T with E4M3 codes and no block scales:
// cuBLASLt's FP8 GEMM (one scale per tensor, here 1), the FP8 ceiling that a
// block-scaled kernel is measured against.
void gemm_fp8_tensor_scaled_nt(Blas& blas, const uint8_t* a, const uint8_t* b, uint16_t* y, int64_t m, int64_t n,
                               int64_t k) {
  LtGemmNT g(CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, m, n, k);
  const float alpha = 1.0f, beta = 0.0f;
  g.run(blas, &alpha, a, b, &beta, y, "FP8 e4m3, per-tensor scale");
}

// The floor of any stochastic-rounding quantizer under DESIGN.md's random-bit
// contracts (core/sr.hpp; philox.hpp: word i is word i % 4 of Philox4x32-10
// group i / 4): each thread reads 16 consecutive elements, draws their words
// and writes one nibble an element, with no block scale or amax. per_element
// (X4 false): element i takes word i, 4 groups a thread; ptx_x4 (X4): element
// i byte i % 4 of word i / 4 (sr_lsb), one group a thread. ENCODE == false:
// the nibble is the top 4 bits of the element's bits plus its random value
// (neither the loads nor the rounds can be dropped); true: core's E2M1 SR
// code of the element times `mult` (encode_rs_f32 with the contract's width,
// the quantizers' encoder), so the row is the floor of an E2M1 SR quantizer
// with this encoder. n % 16 == 0, x 16-byte aligned.
template <class In, bool ENCODE, bool X4 = false>
__global__ void philox_floor_kernel(const In* x, uint8_t* out, int64_t n, uint64_t seed, uint64_t stream, float mult) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t * 16 >= n) return;
  uint32_t bits[16];
  if constexpr (sizeof(In) == 2) {
    const uint4* src = reinterpret_cast<const uint4*>(x + t * 16);
    const uint4 a = __ldg(src), b = __ldg(src + 1);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) bits[2 * j] = w[j] << 16, bits[2 * j + 1] = w[j] & 0xFFFF0000u;
  } else {
    const float4* src = reinterpret_cast<const float4*>(x + t * 16);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 v = __ldg(src + j);
      bits[4 * j] = float_bits(v.x), bits[4 * j + 1] = float_bits(v.y);
      bits[4 * j + 2] = float_bits(v.z), bits[4 * j + 3] = float_bits(v.w);
    }
  }
  // ptx_x4: W bits from element j's lsb in its group's word (core/sr.hpp;
  // encode_rs_f32<F, W> reads the low W bits of what it is given).
  constexpr int W = sr_width(X4 ? SrBits::ptx_x4 : SrBits::per_element, float4_e2m1fn);
  constexpr int step = sr_lsb(SrBits::ptx_x4, float4_e2m1fn, 1);
  uint32_t packed[2] = {0u, 0u};
  Philox4 gx{};
  if constexpr (X4) gx = philox_group(seed, stream, uint64_t(t));
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    Philox4 g{};
    if constexpr (!X4) g = philox_group(seed, stream, uint64_t(t) * 4 + q);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int e = 4 * q + j;
      const uint32_t rb = X4 ? gx.v[q] >> (step * j) : g.v[j];
      const uint32_t nib =
          ENCODE ? encode_rs_f32<float4_e2m1fn, W>(bits_float(bits[e]) * mult, rb, Overflow::saturate)
                 : (bits[e] + (X4 ? rb << (32 - W) : rb)) >> 28;
      packed[e / 8] |= nib << (4 * (e % 8));
    }
  }
  *reinterpret_cast<uint2*>(out + t * 8) = make_uint2(packed[0], packed[1]);
}

QuantizerSpec with(QuantizerSpec q, Round r, bool rht, int br, int bc) {
  q.round = r;
  q.rht = rht;
  q.block_rows = br;
  q.block_cols = bc;
  return q;
}

struct Variant {
  std::string name;
  QuantizerSpec spec;
  bool amax_given = false;  // time the fused kernel alone (tensor amax supplied by the producer)
};

// The input of bench_quantize in both types (the same N(0,1) values), and
// the bandwidth of a device-to-device copy of each, the 100% of every row.
struct QuantBenchInput {
  int64_t rows = 0, cols = 0, n = 0;
  int repeats = 0;
  DeviceBuffer<float> x32, y32;
  DeviceBuffer<uint16_t> x16;
  double copy_bw[2] = {0, 0};  // GB/s, [0] bf16, [1] f32 (read + write)
  InputType type(int t) const { return t == 0 ? InputType::bf16 : InputType::f32; }
  const void* x(int t) const { return t == 0 ? (const void*)x16.data() : (const void*)x32.data(); }
  double in_bytes(int t) const { return double(n) * (t == 0 ? 2 : 4); }
};

// The canned (or named) quantizers, then the modes the targets name (SR, RHT)
// on NVFP4 (the gradient / wgrad operands of NVIDIA's recipe), and SR on MXFP4
// (one pass: E8M0 block scales, no tensor amax).
std::vector<Variant> quantize_variants(const std::vector<std::string>& quantizers) {
  const std::vector<std::string> names = quantizers.empty() ? quantizer_names() : quantizers;
  std::vector<Variant> vars;
  for (const auto& n : names) vars.push_back({n, parse_quantizer(n)});
  const QuantizerSpec nv = quantizer_by_name("nvfp4");
  vars.push_back({"mxfp4 rs", with(quantizer_by_name("mxfp4"), Round::rs, false, 1, 32)});
  vars.push_back({"nvfp4 rs", with(nv, Round::rs, false, 1, 16)});
  vars.push_back({"nvfp4 rs rht [1,16]", with(nv, Round::rs, true, 1, 16)});
  vars.push_back({"nvfp4 rs rht [16,1]", with(nv, Round::rs, true, 16, 1)});
  vars.push_back({"nvfp4_2d [16,16]", with(nv, Round::rn, false, 16, 16)});
  vars.push_back({"nvfp4 (amax given)", nv, true});
  vars.push_back({"nvfp4 rs (amax given)", with(nv, Round::rs, false, 1, 16), true});
  vars.push_back({"nvfp4 rs rht [1,16] (amax given)", with(nv, Round::rs, true, 1, 16), true});
  vars.push_back({"nvfp4 rs rht [16,1] (amax given)", with(nv, Round::rs, true, 16, 1), true});
  // RHT with rn: the wgrad x operand of NVIDIA's recipe.
  vars.push_back({"nvfp4 rht [1,16] (amax given)", with(nv, Round::rn, true, 1, 16), true});
  vars.push_back({"nvfp4 rht [16,1] (amax given)", with(nv, Round::rn, true, 16, 1), true});
  // The emulations of other tools' arithmetic (schemes/): the generic pipeline's rule kernels.
  QuantizerSpec q2 = with(nv, Round::rna, false, 1, 16);
  q2.emulate = Emulation::quartet2_triton;
  vars.push_back({"quartet2_triton [1,16]", q2});
  QuantizerSpec eden = q2;
  eden.emulate = Emulation::quartet2_eden_triton;
  for (const bool rht : {false, true})
    for (const bool col : {false, true}) {
      QuantizerSpec e = with(eden, Round::rna, false, col ? 16 : 1, col ? 1 : 16);
      e.rht = rht;
      e.rht_kind = rht ? RhtKind::quartet2_128 : RhtKind::rht16;
      vars.push_back({std::string("quartet2_eden_triton ") + (col ? "[16,1]" : "[1,16]") + (rht ? " rht128" : ""), e});
    }
  QuantizerSpec tj = with(nv, Round::rn, false, 1, 16);
  tj.global_scale = GlobalScale::none;
  tj.emulate = Emulation::tetrajet2_kernel;
  vars.push_back({"tetrajet2_kernel [1,16]", tj});
  QuantizerSpec tf = nv;
  tf.emulate = Emulation::te_fast_math;
  vars.push_back({"te_fast_math [1,16]", tf});
  // Every SR row also under the PTX cvt.rs random-bit contract (core/sr.hpp's
  // ptx_x4: one word per 4 elements of a row), right after it, where the
  // element format has it: "<name> rs ptx_x4 ...".
  std::vector<Variant> all;
  for (const Variant& v : vars) {
    all.push_back(v);
    Variant x4 = v;
    x4.spec.sr_bits = SrBits::ptx_x4;
    if (v.spec.round != Round::rs || v.spec.sr_bits != SrBits::per_element || !sr_ptx_format(*x4.spec.element)) continue;
    const size_t at = x4.name.find(" rs");
    if (at != std::string::npos && (at + 3 == x4.name.size() || x4.name[at + 3] == ' '))
      x4.name.insert(at + 3, " ptx_x4");
    else
      x4.name += " (rs ptx_x4)";
    all.push_back(x4);
  }
  return all;
}

void measure_copies(QuantBenchInput& in) {
  const int64_t n = in.n;
  const int repeats = in.repeats;
  auto& y32 = in.y32;
  auto& x16 = in.x16;
  auto& x32 = in.x32;
  auto& copy_bw = in.copy_bw;
  for (int t = 0; t < 2; ++t) {
    const size_t bytes = size_t(n) * (t == 0 ? 2 : 4);
    const double ms = time_median_ms(
        [&] {
          check(cudaMemcpyAsync(y32.data(), t == 0 ? (void*)x16.data() : (void*)x32.data(), bytes,
                                cudaMemcpyDeviceToDevice),
                "copy");
        },
        3, repeats);
    copy_bw[t] = 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
    std::printf("device-to-device copy (%s, %.0f MB): %.4f ms, %.0f GB/s (read + write)\n", t == 0 ? "bf16" : "f32",
                bytes / 1e6, ms, copy_bw[t]);
  }
}

// One row per quantizer and input type: its median time, and its bandwidth
// against the copy.
void bench_quantizers(const QuantBenchInput& in, const std::vector<Variant>& vars) {
  const int64_t rows = in.rows, cols = in.cols, n = in.n;
  const int repeats = in.repeats;
  DeviceBuffer<uint8_t> codes(static_cast<size_t>(n)), scodes(static_cast<size_t>(n / 16 + 1024));
  DeviceBuffer<float> gdec(1);
  QuantWorkspace ws;
  DeviceBuffer<uint32_t> amax_given(1);
  std::printf("\n%-42s %-5s %9s %9s %8s %8s %7s  %s\n", "quantizer", "in", "ms", "GB/s", "of copy", "moved", "passes",
              "outputs");
  for (const Variant& v : vars) {
    const QuantizerSpec& q = v.spec;
    int64_t sr = 0, sc = 0;
    scale_grid(q, rows, cols, sr, sc);
    const bool packed = q.element->bits() == 4;
    const bool has_codes = q.scale != &float32;
    QuantOutputs o;
    o.codes = codes.data();
    o.code_layout = packed ? CodeLayout::packed4 : CodeLayout::bytes;
    o.scale_codes = has_codes ? scodes.data() : nullptr;
    o.scales = has_codes ? nullptr : reinterpret_cast<float*>(scodes.data());
    o.global_decode = gdec.data();
    const double out_bytes = double(packed ? n / 2 : n) + double(sr * sc) * (has_codes ? 1 : 4);
    for (int t = 0; t < 2; ++t) {
      const InputType it = in.type(t);
      const void* x = in.x(t);
      const double in_bytes = in.in_bytes(t);
      const bool two_pass = q.scale_rule == ScaleRule::nv && q.global_scale == GlobalScale::tensor_amax;
      QuantizerSpec qq = q;
      if (v.amax_given) {
        // Compute the amax once (as a producer kernel would), then time the
        // fused quantization alone with the global scale taken from it (the
        // input's amax, also for RHT quantizers, whose own pass would take
        // their output's: the timing does not depend on the value).
        tensor_amax_device(x, it, rows * cols, amax_given.data());
      }
      auto run = [&] {
        if (v.amax_given) {
          quantize_device(qq, x, it, rows, cols, {1, 2}, o, ws, nullptr, QuantPath::automatic, amax_given.data());
        } else {
          quantize_device(qq, x, it, rows, cols, {1, 2}, o, ws);
        }
      };
      const double ms = time_median_ms(run, 3, repeats);
      const double bw = (in_bytes + out_bytes) / (ms * 1e-3) / 1e9;
      const int passes = (two_pass && !v.amax_given) ? 2 : 1;
      const double moved = (passes * in_bytes + out_bytes) / (ms * 1e-3) / 1e9;
      std::printf("%-42s %-5s %9.4f %9.0f %7.1f%% %7.1f%% %7d  codes%s + scales\n", v.name.c_str(),
                  t == 0 ? "bf16" : "f32", ms, bw, 100.0 * bw / in.copy_bw[t], 100.0 * moved / in.copy_bw[t], passes,
                  packed ? " (packed 4-bit)" : "");
    }
  }
}

// What any SR row could reach at best: reading the input, drawing the random
// words (one Philox word an element under per_element, one per 4 elements
// under ptx_x4) and writing 4-bit codes (with and without core's E2M1 SR
// encode), no amax or block scale.
void bench_sr_floor(const QuantBenchInput& in) {
  const int64_t n = in.n;
  const int repeats = in.repeats;
  const auto& x16 = in.x16;
  const auto& x32 = in.x32;
  DeviceBuffer<uint8_t> codes(static_cast<size_t>(n));
  for (bool x4 : {false, true}) {
    for (bool enc : {false, true}) {
      for (int t = 0; t < 2; ++t) {
        // mult 2: the N(0,1) input spread over E2M1's range, its normal and subnormal targets
        auto launch = [&](auto encode, auto ptx_x4, const auto* x) {
          using In = std::remove_cv_t<std::remove_pointer_t<decltype(x)>>;
          philox_floor_kernel<In, decltype(encode)::value, decltype(ptx_x4)::value>
              <<<unsigned((n / 16 + 255) / 256), 256>>>(x, codes.data(), n, 99, 5, 2.0f);
          check_launch("philox_floor_kernel");
        };
        auto run = [&](auto ptx_x4) {
          if (enc)
            t == 0 ? launch(std::true_type{}, ptx_x4, x16.data()) : launch(std::true_type{}, ptx_x4, x32.data());
          else
            t == 0 ? launch(std::false_type{}, ptx_x4, x16.data()) : launch(std::false_type{}, ptx_x4, x32.data());
        };
        const double ms = time_median_ms(
            [&] {
              if (x4)
                run(std::true_type{});
              else
                run(std::false_type{});
            },
            3, repeats);
        const double bw = (double(n) * (t == 0 ? 2 : 4) + double(n / 2)) / (ms * 1e-3) / 1e9;
        const std::string name = std::string(enc ? "SR floor: Philox + e2m1 SR encode" : "SR floor: Philox + 4-bit out") +
                                 (x4 ? " (ptx_x4)" : "");
        std::printf("%-42s %-5s %9.4f %9.0f %7.1f%% %7.1f%% %7d  4-bit codes (no scales)\n", name.c_str(),
                    t == 0 ? "bf16" : "f32", ms, bw, 100.0 * bw / in.copy_bw[t], 100.0 * bw / in.copy_bw[t], 1);
      }
    }
  }
}

// The trainer's two NVFP4 operands of one tensor (NVIDIA's recipe): [1,16]
// for the forward / dgrad GEMM and RHT + [16,1] for wgrad, both as BF16 GEMM
// operands; two quantize_device calls against one quantize_dual_device.
void bench_two_operands(const QuantBenchInput& in) {
  const int64_t rows = in.rows, cols = in.cols, n = in.n;
  const int repeats = in.repeats;
  const QuantizerSpec nv = quantizer_by_name("nvfp4");
  QuantWorkspace ws;
  std::printf("\n%-56s %-5s %9s %9s %8s\n", "two operands of one tensor (BF16 outputs)", "in", "ms", "GB/s", "of copy");
  DeviceBuffer<uint16_t> op_a(static_cast<size_t>(n)), op_b(static_cast<size_t>(n));
  DeviceBuffer<float> g2(2);
  QuantWorkspace ws_b;
  // rn, rs, and rs under the ptx_x4 random-bit contract (both operands).
  for (int mode = 0; mode < 3; ++mode) {
    const Round r = mode == 0 ? Round::rn : Round::rs;
    QuantizerSpec qa = with(nv, r, false, 1, 16), qb = with(nv, r, true, 16, 1);
    if (mode == 2) qa.sr_bits = qb.sr_bits = SrBits::ptx_x4;
    QuantOutputs oa, ob;
    oa.dequant_bf16 = op_a.data();
    ob.dequant_bf16 = op_b.data();
    oa.bf16_gemm_operand = ob.bf16_gemm_operand = true;
    oa.global_decode = g2.data();
    ob.global_decode = g2.data() + 1;
    for (int t = 0; t < 2; ++t) {
      const InputType it = in.type(t);
      const void* x = in.x(t);
      const double bytes = double(n) * (t == 0 ? 2 : 4) + 2.0 * double(n) * 2;
      for (bool dual : {false, true}) {
        const double ms = time_median_ms(
            [&] {
              if (dual) {
                quantize_dual_device(qa, {1, 2}, oa, qb, {1, 3}, ob, x, it, rows, cols, ws);
              } else {
                quantize_device(qa, x, it, rows, cols, {1, 2}, oa, ws);
                quantize_device(qb, x, it, rows, cols, {1, 3}, ob, ws_b);
              }
            },
            3, repeats);
        const double bw = bytes / (ms * 1e-3) / 1e9;
        const char* m = mode == 0 ? "rn" : mode == 1 ? "rs" : "rs ptx_x4";
        const std::string name =
            std::string(m) + " [1,16] + " + m + " rht [16,1], " + (dual ? "one pass" : "two calls");
        std::printf("%-56s %-5s %9.4f %9.0f %7.1f%%\n", name.c_str(), t == 0 ? "bf16" : "f32", ms, bw,
                    100.0 * bw / in.copy_bw[t]);
      }
    }
  }
  std::printf("(GB/s: the input once plus both BF16 outputs; each form reads the input twice or more.)\n");
}

}  // namespace

int bench_quantize(int64_t rows, int64_t cols, const std::vector<std::string>& quantizers, int repeats) {
  if (!gpu_available())
    throw Error("bench quantize --backend cuda: no CUDA GPU is visible (cudaGetDeviceCount reports none)");
  if (rows <= 0 || cols <= 0) throw Error("bench quantize: rows and cols must be positive");
  const std::vector<Variant> vars = quantize_variants(quantizers);
  QuantBenchInput in;
  in.rows = rows, in.cols = cols, in.n = rows * cols, in.repeats = std::max(repeats, 3);
  in.x32.resize(static_cast<size_t>(in.n));
  in.y32.resize(static_cast<size_t>(in.n));
  in.x16.resize(static_cast<size_t>(in.n));
  fill_normal(in.x32.data(), in.x16.data(), in.n, 1234);
  std::printf("device: %s\n", device_description().c_str());
  std::printf("input %lld x %lld, median of %d timed runs after warm-up (cudaEvent)\n", (long long)rows,
              (long long)cols, in.repeats);
  measure_copies(in);
  bench_quantizers(in, vars);
  if (in.n % 16 == 0) bench_sr_floor(in);
  std::printf(
      "\nGB/s counts the input once plus the outputs (codes, scales). Rules with a per-tensor amax (nvfp4)\n"
      "read the input twice (amax pass + quantize pass); '(amax given)' times the quantize pass alone, as\n"
      "when the producer of the tensor supplies its amax. 'moved' counts the bytes the passes move (the\n"
      "input once per pass), against the same copy. 'SR floor' reads the input, draws each element's\n"
      "Philox word (DESIGN.md's contract; '(ptx_x4)': one word per 4 elements, PTX cvt.rs's) and writes\n"
      "4 bits an element, with core's E2M1 SR encode of x * 2 or without: no amax or block scale, so no\n"
      "SR quantizer under that contract (and with that encoder) can be faster. 'rs ptx_x4' rows: the SR\n"
      "row above them under the ptx_x4 random-bit contract (core/sr.hpp).\n");

  bench_two_operands(in);
  return 0;
}

namespace {

// What bench_gemm's rows share: the BF16 operands, the cuBLAS handle, and the
// row printer that times a candidate interleaved with the BF16 reference.
struct GemmBench {
  int64_t m = 0, n = 0, k = 0;
  int repeats = 0;
  double flops = 0;
  DeviceBuffer<uint16_t> a16, b16, y16;
  Blas blas;
  void gemm_ref() { gemm_bf16_nt(blas, a16.data(), b16.data(), y16.data(), OutType::bf16, m, n, k); }
  // One row: fn timed interleaved with the BF16 reference ("of BF16" is the
  // ratio of the two medians; "BF16 ms" is that reference's median).
  template <class F>
  void row(const std::string& name, const F& fn) {
    const auto [ms_ref, ms] = time_interleaved_median_ms([&] { gemm_ref(); }, fn, 3, repeats);
    std::printf("%-58s %9.4f %9.1f %8.1f%% %9.4f\n", name.c_str(), ms, flops / (ms * 1e-3) / 1e12, 100.0 * ms_ref / ms,
                ms_ref);
  }
};

// One quantized operand of a GEMM row: its buffers and its QuantOperand view.
struct Side {
  DeviceBuffer<uint8_t> codes, scodes;
  DeviceBuffer<uint16_t> op16;
  DeviceBuffer<float> gdec;
  QuantWorkspace ws;
  QuantOperand op;
};
// Sizes s for q on a [rows, k] operand; the outputs a fused quantization
// writes for a BF16-tensor-core GEMM (codes, scales, g_dec, exact BF16 operand).
QuantOutputs prep(Side& s, const QuantizerSpec& q, int64_t rows, int64_t k) {
  int64_t sr = 0, sc = 0;
  scale_grid(q, rows, k, sr, sc);
  const bool packed = q.element->bits() == 4;
  s.codes.resize(size_t(packed ? rows * ((k + 1) / 2) : rows * k));
  s.scodes.resize(size_t(sr * sc));
  s.op16.resize(size_t(rows * k));
  s.gdec.resize(1);
  s.op.spec = q;
  s.op.rows = rows;
  s.op.cols = k;
  s.op.codes = s.codes.data();
  s.op.layout = packed ? CodeLayout::packed4 : CodeLayout::bytes;
  s.op.scale_codes = s.scodes.data();
  s.op.global_decode = s.gdec.data();
  QuantOutputs o;
  o.codes = s.codes.data();
  o.code_layout = s.op.layout;
  o.scale_codes = s.scodes.data();
  o.global_decode = s.gdec.data();
  o.dequant_bf16 = s.op16.data();
  o.bf16_gemm_operand = true;
  return o;
}

// NVFP4 / MXFP4 / MXFP8 GEMMs on the BF16 tensor cores: quantize + GEMM, the
// GEMM alone, and dequantize + GEMM from codes.
void bench_bf16_tensor_core_rows(GemmBench& g) {
  const int64_t m = g.m, n = g.n, k = g.k;
  auto& blas = g.blas;
  auto& a16 = g.a16;
  auto& b16 = g.b16;
  auto& y16 = g.y16;
  auto row = [&](const std::string& name, const auto& fn) { g.row(name, fn); };
  struct Case {
    const char* name;
    const char* qa;
    const char* qb;
  };
  const Case cases[] = {{"NVFP4 (x: nvfp4 [1,16], W: nvfp4_2d [16,16])", "nvfp4", "nvfp4_2d"},
                        {"NVFP4 (both nvfp4 [1,16])", "nvfp4", "nvfp4"},
                        {"MXFP4 (both mxfp4 [1,32])", "mxfp4", "mxfp4"},
                        {"MXFP8 e4m3 (both [1,32]) via BF16 tensor cores", "mxfp8_e4m3", "mxfp8_e4m3"}};
  DeviceBuffer<float> alpha(2);
  GemmWorkspace gws;
  for (const Case& c : cases) {
    const QuantizerSpec qa = quantizer_by_name(c.qa), qb = quantizer_by_name(c.qb);
    Side sa, sb;
    const QuantOutputs oa = prep(sa, qa, m, k), ob = prep(sb, qb, n, k);
    // The BF16 GEMM of the exact operands with alpha = g_dec(A) g_dec(B).
    auto gemm_only = [&] {
      gemm_bf16_nt(blas, sa.op16.data(), sb.op16.data(), y16.data(), OutType::bf16, m, n, k, 1.0f, alpha.data());
    };
    // (1) from BF16 inputs: quantize both operands (fused kernel writing codes,
    // scales and the exact BF16 operand) + that GEMM.
    auto full = [&] {
      quantize_device(qa, a16.data(), InputType::bf16, m, k, {1, 1}, oa, sa.ws);
      quantize_device(qb, b16.data(), InputType::bf16, n, k, {1, 2}, ob, sb.ws);
      set_alpha_device(sa.gdec.data(), sb.gdec.data(), alpha.data(), blas.stream());
      gemm_only();
    };
    row(std::string(c.name) + ": quantize A,B + GEMM", full);
    // The GEMM of (1) alone, on the operands (1) made: what the quantization adds.
    row(std::string(c.name) + ": its GEMM alone", gemm_only);
    // (2) from already quantized operands (codes + scales): dequantize + GEMM.
    auto from_q = [&] {
      quantized_gemm_device(blas, sa.op, sb.op, y16.data(), OutType::bf16, gws, GemmPath::hopper_bf16);
    };
    row(std::string(c.name) + ": dequant + GEMM", from_q);
  }
}

// MXFP8 on the FP8 tensor cores (per-32-block promotion), and cuBLASLt's FP8
// GEMM with one scale per tensor as the FP8 ceiling of this GPU.
void bench_fp8_tensor_core_rows(GemmBench& g) {
  const int64_t m = g.m, n = g.n, k = g.k;
  auto& blas = g.blas;
  auto& a16 = g.a16;
  auto& b16 = g.b16;
  auto& y16 = g.y16;
  auto row = [&](const std::string& name, const auto& fn) { g.row(name, fn); };
  if (compute_capability() >= 89) {
    for (const char* qname : {"mxfp8_e4m3", "mxfp8_e5m2"}) {
      const QuantizerSpec q = quantizer_by_name(qname);
      Side sa, sb;
      QuantOutputs oa = prep(sa, q, m, k), ob = prep(sb, q, n, k);
      oa.dequant_bf16 = ob.dequant_bf16 = nullptr;  // codes and scales only
      oa.bf16_gemm_operand = ob.bf16_gemm_operand = false;
      auto from_q = [&] {
        mxfp8_gemm_fp8_tensor_cores(sa.op, sb.op, y16.data(), OutType::bf16, nullptr, blas.stream());
      };
      auto full = [&] {
        quantize_device(q, a16.data(), InputType::bf16, m, k, {1, 1}, oa, sa.ws);
        quantize_device(q, b16.data(), InputType::bf16, n, k, {1, 2}, ob, sb.ws);
        from_q();
      };
      full();  // quantize once so that the codes-only timing below reads real codes
      const std::string name = std::string("MXFP8 ") + (qname + 6) + " (both [1,32]) on FP8 tensor cores";
      row(name + ": quantize A,B + GEMM", full);
      row(name + ": GEMM from codes", from_q);
    }
    // FP8 block scaling (DeepSeek-V3's x [1,128] x W [128,128]; TE's Float8BlockScaling) through cuBLASLt's
    // block-scaled FP8 matmul (GemmPath::hopper_fp8_block).
    for (const auto& [label, qa_name, qb_name] :
         {std::tuple{"FP8 block (x 1x128, W 128x128, FP32 scales) cuBLASLt", "fp8_block_1x128", "fp8_block_128x128"},
          std::tuple{"FP8 block (TE pow2 scales, x 1x128, W 128x128) cuBLASLt", "te_fp8_block_1x128",
                     "te_fp8_block_128x128"}}) {
      const QuantizerSpec qa = quantizer_by_name(qa_name), qb = quantizer_by_name(qb_name);
      Side sa, sb;
      QuantOutputs oa = prep(sa, qa, m, k), ob = prep(sb, qb, n, k);
      DeviceBuffer<float> fa, fb;
      int64_t sr = 0, sc = 0;
      if (qa.scale == &float32) {  // FP32 scales: the operand reads them, not scale codes
        scale_grid(qa, m, k, sr, sc);
        fa.resize(size_t(sr * sc));
        oa.scale_codes = nullptr, oa.scales = fa.data(), sa.op.scale_codes = nullptr, sa.op.scales = fa.data();
        scale_grid(qb, n, k, sr, sc);
        fb.resize(size_t(sr * sc));
        ob.scale_codes = nullptr, ob.scales = fb.data(), sb.op.scale_codes = nullptr, sb.op.scales = fb.data();
      }
      oa.dequant_bf16 = ob.dequant_bf16 = nullptr;
      oa.bf16_gemm_operand = ob.bf16_gemm_operand = false;
      GemmWorkspace bws;
      auto from_q = [&] {
        quantized_gemm_device(blas, sa.op, sb.op, y16.data(), OutType::bf16, bws, GemmPath::hopper_fp8_block);
      };
      auto full = [&] {
        quantize_device(qa, a16.data(), InputType::bf16, m, k, {1, 1}, oa, sa.ws);
        quantize_device(qb, b16.data(), InputType::bf16, n, k, {1, 2}, ob, sb.ws);
        from_q();
      };
      try {
        full();
        row(std::string(label) + ": quantize A,B + GEMM", full);
        row(std::string(label) + ": GEMM from codes", from_q);
      } catch (const Error& e) {
        std::printf("%-58s %s\n", label, e.what());
      }
    }
    try {
      DeviceBuffer<uint8_t> a8(static_cast<size_t>(m * k)), b8(static_cast<size_t>(n * k));
      a8.fill_bytes(0x38);  // 1.0 in E4M3: the values do not change the speed
      b8.fill_bytes(0x30);  // 0.5
      row("cuBLASLt FP8 e4m3, one scale per tensor (FP8 ceiling)",
          [&] { gemm_fp8_tensor_scaled_nt(blas, a8.data(), b8.data(), y16.data(), m, n, k); });
    } catch (const Error& e) {
      std::printf("%-58s %s\n", "cuBLASLt FP8 e4m3, one scale per tensor", e.what());
    }
  }
}

}  // namespace

int bench_gemm(int64_t m, int64_t n, int64_t k, int repeats) {
  if (!gpu_available())
    throw Error("bench gemm --backend cuda: no CUDA GPU is visible (cudaGetDeviceCount reports none)");
  GemmBench g;
  g.m = m, g.n = n, g.k = k, g.repeats = std::max(repeats, 3);
  g.flops = 2.0 * double(m) * double(n) * double(k);
  g.a16.resize(static_cast<size_t>(m * k));
  g.b16.resize(static_cast<size_t>(n * k));
  g.y16.resize(static_cast<size_t>(m * n));
  fill_normal(nullptr, g.a16.data(), m * k, 11);
  fill_normal(nullptr, g.b16.data(), n * k, 12, 0.05f);
  std::printf("device: %s\n", device_description().c_str());
  std::printf("GEMM y[m,n] = A[m,k] B[n,k]^T, m=%lld n=%lld k=%lld, BF16 output, median of %d after warm-up\n",
              (long long)m, (long long)n, (long long)k, g.repeats);
  const double ms_bf16 = time_median_ms([&] { g.gemm_ref(); }, 3, g.repeats);
  const double tf_bf16 = g.flops / (ms_bf16 * 1e-3) / 1e12;
  std::printf("\n%-58s %9s %9s %9s %9s\n", "GEMM", "ms", "TFLOP/s", "of BF16", "BF16 ms");
  std::printf("%-58s %9.4f %9.1f %8.1f%% %9.4f\n", "cuBLAS BF16 (reference)", ms_bf16, tf_bf16, 100.0, ms_bf16);
  bench_bf16_tensor_core_rows(g);
  if (compute_capability() >= 89) bench_fp8_tensor_core_rows(g);
  std::printf(
      "\nNVFP4/MXFP4 GEMMs run on the BF16 tensor cores (dequantized operands are exact in BF16). MXFP8 runs\n"
      "both ways: dequantized to BF16, and on the FP8 tensor cores with each 32-element block's partial\n"
      "promoted into FP32 (mma.sync m16n8k32, not wgmma). GemmPath::automatic takes the BF16 path.\n"
      "Each row is timed interleaved with the cuBLAS BF16 GEMM (run, reference, run, ...): 'of BF16' is the\n"
      "ratio of the two medians and 'BF16 ms' the reference's median during that row. 'its GEMM alone' is\n"
      "the BF16 GEMM of the row above on the operands that row made (alpha read from device memory).\n");
  if (compute_capability() >= 100)
    std::printf("(sm_100+: the native block-scaled cuBLASLt path exists but is not benchmarked here.)\n");
  return 0;
}

int bench_attention(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, bool causal, float dropout,
                    int repeats) {
  if (!gpu_available())
    throw Error("bench attention --backend cuda: no CUDA GPU is visible (cudaGetDeviceCount reports none)");
  repeats = std::max(repeats, 3);
  nn::AttentionDims d;
  d.batch = batch, d.seq = seq, d.heads = heads, d.width = heads * head_dim, d.causal = causal;
  d.scale = float(1.0 / std::sqrt(double(head_dim))), d.dropout = dropout, d.seed = 1, d.stream_id = 2;
  const int64_t BT = batch * seq, C = d.width;
  DeviceBuffer<float> qkv(size_t(BT * 3 * C)), out(size_t(BT * C)), probs(size_t(batch * heads * seq * seq)),
      dout(size_t(BT * C)), dqkv(size_t(BT * 3 * C));
  fill_normal(qkv.data(), nullptr, BT * 3 * C, 21);
  fill_normal(dout.data(), nullptr, BT * C, 22);
  const double pairs = causal ? double(seq) * double(seq + 1) / 2.0 : double(seq) * double(seq);
  const double fwd_flops = 4.0 * double(batch * heads) * double(head_dim) * pairs;  // QK^T and PV
  std::printf("device: %s\n", device_description().c_str());
  std::printf("attention B=%lld T=%lld H=%lld hd=%lld %s, dropout %g, FP32; median of %d after warm-up\n",
              (long long)batch, (long long)seq, (long long)heads, (long long)head_dim, causal ? "causal" : "full",
              double(dropout), repeats);
  std::printf("TFLOP/s count the products the mask leaves (forward 4 B H hd pairs, backward 8 B H hd pairs)\n\n");
  std::printf("%-28s %10s %10s %10s %10s\n", "path", "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s");
  double fused_total = 0.0, cublas_total = 0.0;
  for (nn::AttentionPath path : {nn::AttentionPath::fused, nn::AttentionPath::cublas}) {
    const bool fused = path == nn::AttentionPath::fused;
    if (fused) {
      const std::string why = nn::Attention::fused_unsupported(d, {qkv.data(), out.data(), probs.data()});
      if (!why.empty()) {
        std::printf("%-28s the fused kernels cannot run %s\n", "fused FP32 kernels", why.c_str());
        continue;
      }
    }
    nn::Attention att(nullptr, path);
    const double f = time_median_ms([&] { att.forward(d, qkv.data(), out.data(), probs.data()); }, 2, repeats);
    const double b =
        time_median_ms([&] { att.backward(d, qkv.data(), probs.data(), dout.data(), dqkv.data()); }, 2, repeats);
    (fused ? fused_total : cublas_total) = f + b;
    std::printf("%-28s %10.3f %10.1f %10.3f %10.1f\n", fused ? "fused FP32 kernels" : "cuBLAS pedantic SGEMM", f,
                fwd_flops / (f * 1e-3) / 1e12, b, 2.0 * fwd_flops / (b * 1e-3) / 1e12);
  }
  if (fused_total > 0.0 && cublas_total > 0.0)
    std::printf("\nfused forward+backward: %.2fx the speed of the cuBLAS path\n", cublas_total / fused_total);
  return 0;
}

}  // namespace fp4lab::cuda
