// Grouped quantization and grouped GEMMs (grouped.hpp).
#include "cuda/grouped.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <tuple>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "cuda/quantize_grouped.cuh"

namespace fp4lab::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void fill_kernel(float* p, int64_t n, float v) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) p[i] = v;
}

// BF16 bits -> FP32 (exact). VEC: both pointers 16-byte aligned, 8 elements a thread.
template <bool VEC>
__global__ void __launch_bounds__(kThreads) widen_bf16_kernel(const uint16_t* in, float* out, int64_t n) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if constexpr (VEC) {
    const int64_t i = t * 8;
    if (i + 8 <= n) {
      const uint4 w = *reinterpret_cast<const uint4*>(in + i);
      const uint32_t h[4] = {w.x, w.y, w.z, w.w};
      float4 lo, hi;
      lo.x = __uint_as_float(h[0] << 16), lo.y = __uint_as_float(h[0] & 0xFFFF0000u);
      lo.z = __uint_as_float(h[1] << 16), lo.w = __uint_as_float(h[1] & 0xFFFF0000u);
      hi.x = __uint_as_float(h[2] << 16), hi.y = __uint_as_float(h[2] & 0xFFFF0000u);
      hi.z = __uint_as_float(h[3] << 16), hi.w = __uint_as_float(h[3] & 0xFFFF0000u);
      reinterpret_cast<float4*>(out + i)[0] = lo;
      reinterpret_cast<float4*>(out + i)[1] = hi;
    } else {
      for (int64_t j = i; j < n; ++j) out[j] = __uint_as_float(uint32_t(in[j]) << 16);
    }
  } else {
    if (t < n) out[t] = __uint_as_float(uint32_t(in[t]) << 16);
  }
}

void widen_bf16(const uint16_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const bool vec = ((reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out)) & 15) == 0;
  if (vec) {
    const int64_t threads = (n + 7) / 8;
    widen_bf16_kernel<true><<<unsigned((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(in, out, n);
  } else {
    widen_bf16_kernel<false><<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(in, out, n);
  }
  check_launch("widen_bf16_kernel");
}

int64_t total_rows(std::span<const int64_t> sizes) {
  int64_t s = 0;
  for (int64_t n : sizes) s += n;
  return s;
}

// ---- grouped GEMMs ----------------------------------------------------------

// One GEMM in cuBLAS's column-major terms: C [m, n] = alpha op(A) op(B) + beta C.
struct Problem {
  int m, n, k;
  const void* a;
  const void* b;
  void* c;
  float alpha, beta;
  const float* alpha_dev = nullptr;  // device pointer mode (loop only): alpha and beta read on the device
  const float* beta_dev = nullptr;
};

// What every problem of one operation shares.
struct OpForm {
  cublasOperation_t ta, tb;
  int lda, ldb, ldc;
};

void check_dim(const char* what, const char* name, int64_t v) {
  if (v < 0 || v > INT_MAX)
    throw Error(std::string(what) + ": " + name + " = " + std::to_string(v) +
                " is outside cuBLAS's int range [0, 2^31 - 1]");
}

// Checks the arguments common to the three products; returns alpha per group.
std::vector<float> check_grouped_args(const char* what, std::span<const int64_t> sizes, int64_t n, int64_t k,
                                      std::span<const float> alpha) {
  for (size_t g = 0; g < sizes.size(); ++g)
    if (sizes[g] < 0)
      throw Error(std::string(what) + ": group " + std::to_string(g) + " has " + std::to_string(sizes[g]) +
                  " rows; sizes must be >= 0");
  if (n <= 0 || k <= 0)
    throw Error(std::string(what) + ": n and k must be positive, got n=" + std::to_string(n) +
                " k=" + std::to_string(k));
  check_dim(what, "n", n);
  check_dim(what, "k", k);
  for (int64_t m : sizes) check_dim(what, "a group's rows", m);
  if (!alpha.empty() && alpha.size() != sizes.size())
    throw Error(std::string(what) + ": " + std::to_string(alpha.size()) + " alphas for " +
                std::to_string(sizes.size()) + " groups; give one per group or none");
  std::vector<float> a(sizes.size(), 1.0f);
  if (!alpha.empty()) std::copy(alpha.begin(), alpha.end(), a.begin());
  return a;
}

// Runs the problems (all of one OpForm) on blas's stream: one
// cublasGemmGroupedBatchedEx call (problems of equal shape, alpha and beta
// share a cuBLAS group), or one cublasGemmEx each.
void run_problems(Blas& blas, GroupedGemmWorkspace::Pointers& ptrs, const OpForm& f, const std::vector<Problem>& probs,
                  cudaDataType_t ab_type, cudaDataType_t c_type, cublasComputeType_t compute, GroupedImpl impl,
                  const char* what) {
  if (probs.empty()) return;
  const bool device_alpha = probs[0].alpha_dev != nullptr;  // all or none (grouped_gemm)
  check_cublas(cublasSetPointerMode(blas.handle(), device_alpha ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST),
               "cublasSetPointerMode");
  if (impl == GroupedImpl::loop) {
    for (const Problem& p : probs)
      check_cublas(cublasGemmEx(blas.handle(), f.ta, f.tb, p.m, p.n, p.k, device_alpha ? p.alpha_dev : &p.alpha, p.a,
                                ab_type, f.lda, p.b, ab_type, f.ldb, device_alpha ? p.beta_dev : &p.beta, p.c, c_type,
                                f.ldc, compute, CUBLAS_GEMM_DEFAULT),
                   (std::string("cublasGemmEx (") + what + ", loop)").c_str());
    if (device_alpha)
      check_cublas(cublasSetPointerMode(blas.handle(), CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
    return;
  }
  // Bucket by (m, n, k, alpha bits, beta bits), in order of first appearance.
  auto key = [](const Problem& p) {
    return std::make_tuple(p.m, p.n, p.k, float_bits(p.alpha), float_bits(p.beta));
  };
  std::vector<size_t> order(probs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<size_t> bucket_of(probs.size());
  std::vector<size_t> bucket_first;  // a representative problem of each bucket
  for (size_t i = 0; i < probs.size(); ++i) {
    size_t b = 0;
    while (b < bucket_first.size() && key(probs[bucket_first[b]]) != key(probs[i])) ++b;
    if (b == bucket_first.size()) bucket_first.push_back(i);
    bucket_of[i] = b;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return bucket_of[x] < bucket_of[y]; });
  const size_t np = probs.size(), nb = bucket_first.size();
  std::vector<const void*> host(3 * np);
  for (size_t j = 0; j < np; ++j) {
    const Problem& p = probs[order[j]];
    host[j] = p.a;
    host[np + j] = p.b;
    host[2 * np + j] = p.c;
  }
  if (ptrs.dev.size() < host.size() || ptrs.uploaded != host) {
    if (ptrs.dev.size() < host.size()) ptrs.dev.resize(host.size());
    // Pageable host -> device: cudaMemcpyAsync returns once `host` is staged.
    check(cudaMemcpyAsync(ptrs.dev.data(), host.data(), host.size() * sizeof(const void*), cudaMemcpyHostToDevice,
                          blas.stream()),
          "cudaMemcpyAsync (grouped GEMM pointer arrays)");
    ptrs.uploaded = host;
  }
  std::vector<cublasOperation_t> ta(nb, f.ta), tb(nb, f.tb);
  std::vector<int> m(nb), n(nb), k(nb), lda(nb, f.lda), ldb(nb, f.ldb), ldc(nb, f.ldc), gs(nb, 0);
  std::vector<float> alpha(nb), beta(nb);
  for (size_t b = 0; b < nb; ++b) {
    const Problem& p = probs[bucket_first[b]];
    m[b] = p.m, n[b] = p.n, k[b] = p.k, alpha[b] = p.alpha, beta[b] = p.beta;
  }
  for (size_t i = 0; i < np; ++i) ++gs[bucket_of[i]];
  const void* const* dev = ptrs.dev.data();
  check_cublas(cublasGemmGroupedBatchedEx(blas.handle(), ta.data(), tb.data(), m.data(), n.data(), k.data(),
                                          alpha.data(), dev, ab_type, lda.data(), dev + np, ab_type, ldb.data(),
                                          beta.data(), const_cast<void* const*>(dev + 2 * np), c_type, ldc.data(),
                                          int(nb), gs.data(), compute),
               (std::string("cublasGemmGroupedBatchedEx (") + what + ")").c_str());
}

enum class Op : uint8_t { forward = 0, dgrad = 1, wgrad = 2 };

// The operands of one call as cuBLAS sees them: its A-side buffer (W for
// forward / dgrad, x for wgrad) and B-side buffer (x / dy / dy), with their
// element counts, after widening to FP32 where the output is FP32 on one_call.
struct Sides {
  const char* a;
  const char* b;
  size_t elem;  // bytes of an operand element
  cudaDataType_t ab_type;
  cudaDataType_t c_type;
  size_t c_elem;
  cublasComputeType_t compute;
};

Sides prepare_sides(Blas& blas, GroupedGemmWorkspace& ws, const uint16_t* a_side, int64_t a_count,
                    const uint16_t* b_side, int64_t b_count, OutType out, GroupedImpl impl, bool any_problem) {
  Sides s{reinterpret_cast<const char*>(a_side),
          reinterpret_cast<const char*>(b_side),
          2,
          CUDA_R_16BF,
          out == OutType::f32 ? CUDA_R_32F : CUDA_R_16BF,
          size_t(out == OutType::f32 ? 4 : 2),
          CUBLAS_COMPUTE_32F};
  if (out == OutType::f32 && impl == GroupedImpl::one_call) {
    // cuBLAS's grouped GEMM has no BF16 x BF16 -> FP32 form: widen (exact),
    // multiply in TF32 (exact for BF16 values), accumulate in FP32.
    s.ab_type = CUDA_R_32F;
    s.elem = 4;
    s.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    if (any_problem) {
      float* a32 = ws.a32.at_least(size_t(std::max<int64_t>(a_count, 1)));
      float* b32 = ws.b32.at_least(size_t(std::max<int64_t>(b_count, 1)));
      widen_bf16(a_side, a32, a_count, blas.stream());
      widen_bf16(b_side, b32, b_count, blas.stream());
      s.a = reinterpret_cast<const char*>(a32);
      s.b = reinterpret_cast<const char*>(b32);
    }
  }
  return s;
}

// Device constants {0, 1} (beta in device pointer mode), made once per workspace.
const float* device_constants(GroupedGemmWorkspace& ws, cudaStream_t stream) {
  if (ws.constants.size() < 2) {
    static const float kConstants[2] = {0.0f, 1.0f};
    ws.constants.resize(2);
    check(cudaMemcpyAsync(ws.constants.data(), kConstants, sizeof(kConstants), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (grouped GEMM constants)");
  }
  return ws.constants.data();
}

void grouped_gemm(Op op, Blas& blas, GroupedGemmWorkspace& ws, std::span<const int64_t> sizes, int64_t N, int64_t K,
                  const uint16_t* act, const uint16_t* other, void* outp, OutType out, bool accumulate,
                  std::span<const float> alpha_in, GroupedImpl impl, const float* alpha_dev) {
  const char* what = op == Op::forward ? "grouped GEMM forward" : op == Op::dgrad ? "grouped GEMM dgrad" : "grouped GEMM wgrad";
  const std::vector<float> alpha = check_grouped_args(what, sizes, N, K, alpha_in);
  if (alpha_dev && !alpha_in.empty())
    throw Error(std::string(what) + ": give host alphas or device alphas, not both");
  if (alpha_dev && impl != GroupedImpl::loop)
    throw Error(std::string(what) + ": device alphas need the loop form (cuBLAS's grouped GEMM reads alpha from host "
                "memory only)");
  const float* constants = alpha_dev ? device_constants(ws, blas.stream()) : nullptr;
  const int64_t M = total_rows(sizes), E = int64_t(sizes.size());
  bool any = false;
  for (int64_t m : sizes) any = any || m > 0;
  // act: x (forward) or dy (dgrad, wgrad); other: W (forward, dgrad) or x
  // (wgrad). cuBLAS's A is `other`, its B `act`.
  const int64_t a_count = op == Op::wgrad ? M * K : E * N * K;
  const int64_t b_count = op == Op::forward ? M * K : M * N;
  const Sides s = prepare_sides(blas, ws, other, a_count, act, b_count, out, impl, any);
  char* c = static_cast<char*>(outp);
  const int iK = int(K), iN = int(N);
  const OpForm f = op == Op::forward ? OpForm{CUBLAS_OP_T, CUBLAS_OP_N, iK, iK, iN}
                   : op == Op::dgrad ? OpForm{CUBLAS_OP_N, CUBLAS_OP_N, iK, iN, iK}
                                     : OpForm{CUBLAS_OP_N, CUBLAS_OP_T, iK, iN, iK};
  std::vector<Problem> probs;
  int64_t row = 0;
  for (int64_t g = 0; g < E; ++g) {
    const int64_t mg = sizes[size_t(g)];
    Problem p{};
    p.alpha = alpha[size_t(g)];
    p.beta = accumulate ? 1.0f : 0.0f;
    if (alpha_dev) {
      p.alpha_dev = alpha_dev + g;
      p.beta_dev = constants + (accumulate ? 1 : 0);
    }
    switch (op) {
      case Op::forward:  // y_g^T [N, m_g] = (W_g^T [K, N])^T x_g^T [K, m_g]
        p.m = int(N), p.n = int(mg), p.k = int(K);
        p.a = s.a + size_t(g * N * K) * s.elem;
        p.b = s.b + size_t(row * K) * s.elem;
        p.c = c + size_t(row * N) * s.c_elem;
        break;
      case Op::dgrad:  // dx_g^T [K, m_g] = W_g^T [K, N] dy_g^T [N, m_g]
        p.m = int(K), p.n = int(mg), p.k = int(N);
        p.a = s.a + size_t(g * N * K) * s.elem;
        p.b = s.b + size_t(row * N) * s.elem;
        p.c = c + size_t(row * K) * s.c_elem;
        break;
      case Op::wgrad:  // dW_g^T [K, N] = x_g^T [K, m_g] dy_g [m_g, N]
        p.m = int(K), p.n = int(N), p.k = int(mg);
        p.a = s.a + size_t(row * K) * s.elem;
        p.b = s.b + size_t(row * N) * s.elem;
        p.c = c + size_t(g * N * K) * s.c_elem;
        break;
    }
    if (mg > 0) {
      probs.push_back(p);
    } else if (op == Op::wgrad && !accumulate) {
      // An expert without tokens has a zero gradient (cuBLAS is not asked to
      // run a k = 0 product).
      check(cudaMemsetAsync(c + size_t(g * N * K) * s.c_elem, 0, size_t(N * K) * s.c_elem, blas.stream()),
            "cudaMemsetAsync (wgrad of an empty group)");
    }
    row += mg;
  }
  run_problems(blas, ws.ptrs[int(op)], f, probs, s.ab_type, s.c_type, s.compute, impl, what);
}

}  // namespace

std::vector<int64_t> grouped_scale_row_offsets(const QuantizerSpec& q, std::span<const int64_t> sizes, int64_t cols,
                                               int64_t* scale_cols) {
  if (q.block_rows == 0 || q.block_cols == 0)
    throw Error("quantize_grouped (cuda): per-tensor scaling (block [0,0]) has no grouped form; quantize the group "
                "alone");
  std::vector<int64_t> off{0};
  int64_t sc = (cols + q.block_cols - 1) / q.block_cols;
  for (size_t g = 0; g < sizes.size(); ++g) {
    if (sizes[g] < 0)
      throw Error("quantize_grouped (cuda): group " + std::to_string(g) + " has " + std::to_string(sizes[g]) +
                  " rows; sizes must be >= 0");
    int64_t sr = 0;
    if (sizes[g] > 0) scale_grid(q, sizes[g], cols, sr, sc);
    off.push_back(off.back() + sr);
  }
  if (scale_cols) *scale_cols = sc;
  return off;
}

bool grouped_one_launch_applies(const QuantizerSpec& q, QuantPath path) {
  return qk::grouped_fused_supported(q, path);
}

namespace {

// The outputs of `out` from group g's slices on: codes from byte code_at,
// scales from scale_at, dequant and dequant_bf16 from element elem_at,
// global_decode from gdec_at (null stays null).
QuantOutputs group_outputs(const GroupedQuantOutputs& out, int64_t code_at, int64_t scale_at,
                           int64_t elem_at, int64_t gdec_at) {
  QuantOutputs o;
  o.codes = out.codes ? out.codes + code_at : nullptr;
  o.code_layout = out.code_layout;
  o.scale_codes = out.scale_codes ? out.scale_codes + scale_at : nullptr;
  o.scales = out.scales ? out.scales + scale_at : nullptr;
  o.dequant = out.dequant ? out.dequant + elem_at : nullptr;
  o.dequant_bf16 = out.dequant_bf16 ? out.dequant_bf16 + elem_at : nullptr;
  o.bf16_gemm_operand = out.bf16_gemm_operand;
  o.global_decode = out.global_decode ? out.global_decode + gdec_at : nullptr;
  return o;
}

// Elements of an amax work item of the one-launch form (one block of the amax
// pass each; a group's rows are cut into items of whole rows, at least one).
constexpr int64_t kAmaxItemElems = int64_t(1) << 15;

// Group g's first input element and first dequant / dequant_bf16 element
// (GroupedQuantOutputs::value_offsets; the concatenated layout where empty).
struct GroupStarts {
  std::span<const int64_t> input, values;
  int64_t cols = 0;
  int64_t in_at(size_t g, int64_t row) const { return input.empty() ? row * cols : input[g]; }
  int64_t values_at(size_t g, int64_t row) const { return values.empty() ? row * cols : values[g]; }
};

// The one-launch form: the groups' table to the device (one copy), the amax
// words armed, then quantize_grouped_fused with the plan of both decisions
// (computed once here).
void quantize_grouped_one_launch(const QuantizerSpec& q, const void* x, InputType type, int64_t rows, int64_t cols,
                                 std::span<const int64_t> sizes, std::span<const RandomStream> streams,
                                 const std::vector<int64_t>& soff, const GroupStarts& at,
                                 const GroupedQuantOutputs& out, GroupedQuantWorkspace& ws, cudaStream_t stream) {
  const int64_t groups = int64_t(sizes.size());
  const qk::KernelPlan plan = qk::grouped_plan(q, type);
  const bool amax = plan.amax != qk::AmaxStrategy::none;  // the rule needs each group's amax
  const bool cols_family = plan.family == qk::Family::cols;
  // Host image: soff [G+1], roff [G+1], seeds [G], streams [G], then where used xoff [G], ooff [G],
  // boff [G+1] (column kernels), items [3 I] (the element-wise amax pass).
  std::vector<int64_t>& h = ws.table_host;
  h.assign(soff.begin(), soff.end());
  int64_t row = 0;
  for (int64_t g = 0; g <= groups; ++g) {
    h.push_back(row);
    if (g < groups) row += sizes[size_t(g)];
  }
  for (int64_t g = 0; g < groups; ++g)
    h.push_back(int64_t(streams.empty() ? RandomStream{}.seed : streams[size_t(g)].seed));
  for (int64_t g = 0; g < groups; ++g)
    h.push_back(int64_t(streams.empty() ? RandomStream{}.stream : streams[size_t(g)].stream));
  const size_t xoff_at = h.size();
  if (!at.input.empty()) h.insert(h.end(), at.input.begin(), at.input.end());
  const size_t ooff_at = h.size();
  if (!at.values.empty()) h.insert(h.end(), at.values.begin(), at.values.end());
  const size_t boff_at = h.size();
  if (cols_family) {
    h.push_back(0);
    for (int64_t g = 0; g < groups; ++g)
      h.push_back(h.back() + qk::cols_grouped_blocks(plan.block, sizes[size_t(g)], cols));
  }
  const int64_t col_blocks = cols_family ? h.back() : 0;
  const size_t items_at = h.size();
  if (amax && !plan.rht && cols > 0) {  // the RHT's amax is the column kernel's own pass
    const int64_t rows_per_item = std::max<int64_t>(1, kAmaxItemElems / cols);
    for (int64_t g = 0, r0 = 0; g < groups; r0 += sizes[size_t(g)], ++g) {
      const int64_t e0 = at.in_at(size_t(g), r0);  // the group's first element in x
      for (int64_t r = 0; r < sizes[size_t(g)]; r += rows_per_item) {
        h.push_back(g);
        h.push_back(e0 + r * cols);
        h.push_back(e0 + std::min(r + rows_per_item, sizes[size_t(g)]) * cols);
      }
    }
  }
  const int64_t n_items = int64_t(h.size() - items_at) / 3;
  int64_t* d = ws.table.at_least(h.size());
  // Pageable host -> device: cudaMemcpyAsync returns once `h` is staged.
  check(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (grouped quantization table)");
  qk::GroupTable t;
  t.groups = int(groups);
  t.soff = d;
  t.roff = d + (groups + 1);
  t.seeds = reinterpret_cast<const uint64_t*>(d + 2 * (groups + 1));
  t.streams = reinterpret_cast<const uint64_t*>(d + 2 * (groups + 1) + groups);
  t.xoff = at.input.empty() ? nullptr : d + xoff_at;
  t.ooff = at.values.empty() ? nullptr : d + ooff_at;
  t.boff = cols_family ? d + boff_at : nullptr;
  t.items = d + items_at;
  t.n_items = n_items;
  t.gemm_alpha = out.gemm_alpha;
  t.gemm_alpha_other = out.gemm_alpha_other;
  if (amax) {
    if (ws.amax.size() < size_t(groups + 1)) {
      ws.amax.resize(size_t(groups + 1));
      ws.armed = false;
    }
    if (!ws.armed) {
      check(cudaMemsetAsync(ws.amax.data(), 0, ws.amax.size() * sizeof(uint32_t), stream),
            "cudaMemsetAsync (grouped amax)");
      ws.armed = true;  // the amax pass re-arms the words and the counter
    }
    t.amax = ws.amax.data();
    t.done = ws.amax.data() + groups;
    t.gparams = ws.gparams.at_least(size_t(3 * groups));
  }
  // The concatenated outputs' starts (the GEMM alphas travel in the table).
  const QuantOutputs o = group_outputs(out, 0, 0, 0, 0);
  // The tiles' unchecked form: whole 16-row tiles, and (given offsets) every group's input and value
  // starts 16-byte aligned as the bases are (full_spans_apply tests the bases alone, which covers the
  // concatenated layout only).
  bool rows16 = true;
  const int64_t in_vec = type == InputType::bf16 ? 8 : 4, value_vec = 8;  // elements a 16-byte vector
  for (size_t g = 0; g < sizes.size(); ++g)
    rows16 = rows16 && sizes[g] % 16 == 0 && (at.input.empty() || at.input[g] % in_vec == 0) &&
             (at.values.empty() || at.values[g] % value_vec == 0);
  qk::quantize_grouped_fused(q, plan, x, type, rows, cols, soff.back(), rows16, col_blocks, t, o, stream);
}

// Offsets of `what` ([groups] element starts, host): none or one per group, each >= 0.
void check_offsets(std::span<const int64_t> off, size_t groups, const char* what) {
  if (off.empty()) return;
  if (off.size() != groups)
    throw Error(std::string("quantize_grouped (cuda): ") + std::to_string(off.size()) + " " + what + " for " +
                std::to_string(groups) + " groups; give one per group or none");
  for (size_t g = 0; g < groups; ++g)
    if (off[g] < 0)
      throw Error(std::string("quantize_grouped (cuda): group ") + std::to_string(g) + "'s " + what + " entry is " +
                  std::to_string(off[g]) + "; offsets must be >= 0");
}

}  // namespace

void quantize_grouped_device(const QuantizerSpec& q, const void* x, InputType type, int64_t rows, int64_t cols,
                             std::span<const int64_t> sizes, std::span<const RandomStream> streams,
                             const GroupedQuantOutputs& out, GroupedQuantWorkspace& ws, cudaStream_t stream,
                             QuantPath path, GroupedLaunch launch, std::span<const int64_t> input_offsets) {
  validate(q, "quantize_grouped (cuda)");
  if (cols < 0) throw Error("quantize_grouped (cuda): negative column count " + std::to_string(cols));
  check_group_sizes("quantize_grouped (cuda)", sizes, rows);
  if (!streams.empty() && streams.size() != sizes.size())
    throw Error("quantize_grouped (cuda): " + std::to_string(streams.size()) + " random streams for " +
                std::to_string(sizes.size()) + " groups; give one per group or none");
  if (out.code_layout == CodeLayout::packed4 && q.element->bits() != 4)
    throw Error("quantize_grouped (cuda): packed4 codes need a 4-bit element, not " + describe(q));
  for (const RandomStream& rs : streams)
    if (rs.words)
      throw Error("quantize_grouped (cuda): given random words (RandomStream::words) are CPU-only; the GPU draws its "
                  "words from Philox (seed, stream): pass words = nullptr");
  check_offsets(input_offsets, sizes.size(), "input offsets");
  check_offsets(out.value_offsets, sizes.size(), "value offsets");
  const GroupStarts at{input_offsets, out.value_offsets, cols};
  const bool applies = grouped_one_launch_applies(q, path);
  const bool one = launch == GroupedLaunch::one_launch || (launch == GroupedLaunch::automatic && applies);
  if (one && !applies)
    throw Error(
        "quantize_grouped (cuda): the one-launch form runs fused row blocks without RHT, 16x16 tiles and "
        "column blocks [16,1] / [32,1], not " +
        describe(q) + (path == QuantPath::generic ? " on the generic path" : "") +
        "; use GroupedLaunch::per_group or automatic");
  int64_t sc = 0;
  const std::vector<int64_t> soff = grouped_scale_row_offsets(q, sizes, cols, &sc);
  const int64_t groups = int64_t(sizes.size());
  // Both launch forms: empty groups (every group when cols == 0) keep this 1;
  // the non-empty groups' quantizations overwrite theirs.
  bool any_empty = cols == 0;
  for (int64_t n : sizes) any_empty = any_empty || n == 0;
  if (out.global_decode && groups > 0 && any_empty) {
    fill_kernel<<<unsigned((groups + kThreads - 1) / kThreads), kThreads, 0, stream>>>(out.global_decode, groups, 1.0f);
    check_launch("fill_kernel");
  }
  if (one) {
    if (rows == 0 || cols == 0 || groups == 0) return;
    return quantize_grouped_one_launch(q, x, type, rows, cols, sizes, streams, soff, at, out, ws, stream);
  }
  const size_t in_bytes = type == InputType::f32 ? 4 : 2;
  const int64_t code_row = out.code_layout == CodeLayout::packed4 ? (cols + 1) / 2 : cols;
  // Group g's slices (any element alignment will do: quantize_device stages
  // an input slice its kernels need 16-byte aligned). The staging buffer is
  // grown once, for the largest group that needs it, before any group's launch.
  auto input_at = [&](int64_t g, int64_t row) {
    return static_cast<const char*>(x) + size_t(at.in_at(size_t(g), row)) * in_bytes;
  };
  size_t staging = 0;
  for (int64_t g = 0, row = 0; g < groups; row += sizes[size_t(g)], ++g)
    if (sizes[size_t(g)] > 0)
      staging = std::max(staging, quantize_staging_bytes(q, input_at(g, row), type, sizes[size_t(g)], cols, path));
  if (staging > 0) ws.quant.staging.at_least(staging);
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n = sizes[size_t(g)];
    if (n == 0) continue;
    const int64_t srow = soff[size_t(g)];
    QuantOutputs o = group_outputs(out, row * code_row, srow * sc, at.values_at(size_t(g), row), g);
    o.gemm_alpha = out.gemm_alpha ? out.gemm_alpha + g : nullptr;
    o.gemm_alpha_other = out.gemm_alpha_other ? out.gemm_alpha_other + g : nullptr;
    quantize_device(q, input_at(g, row), type, n, cols, streams.empty() ? RandomStream{} : streams[size_t(g)], o,
                    ws.quant, stream, path);
    row += n;
  }
}

GroupedQuantizedTensor quantize_grouped_gpu(const QuantizerSpec& q, MatrixView<const float> x,
                                            std::span<const int64_t> sizes, std::span<const RandomStream> streams,
                                            QuantPath path, bool bf16_input, GroupedLaunch launch) {
  const int64_t rows = x.rows, cols = x.cols, n = rows * cols;
  validate(q, "quantize_grouped_gpu");
  check_group_sizes("quantize_grouped_gpu", sizes, rows);
  const DeviceInput in = upload_input(x, bf16_input, "quantize_grouped_gpu");
  int64_t sc = 0;
  const std::vector<int64_t> soff = grouped_scale_row_offsets(q, sizes, cols, &sc);
  const int64_t ns = soff.back() * sc;
  const bool has_codes = q.scale != &float32;
  DeviceBuffer<uint8_t> codes(static_cast<size_t>(n)), scodes(has_codes ? static_cast<size_t>(ns) : 0);
  DeviceBuffer<float> scales(static_cast<size_t>(ns)), dq(static_cast<size_t>(n)), gdec(sizes.size());
  codes.fill_bytes(0xA5);
  scodes.fill_bytes(0xA5);
  scales.fill_bytes(0xA5);
  dq.fill_bytes(0xA5);
  gdec.fill_bytes(0xA5);
  GroupedQuantOutputs o;
  o.codes = codes.data();
  o.scale_codes = has_codes ? scodes.data() : nullptr;
  o.scales = scales.data();
  o.dequant = dq.data();
  o.global_decode = gdec.data();
  GroupedQuantWorkspace ws;
  quantize_grouped_device(q, in.data, in.type, rows, cols, sizes, streams, o, ws, nullptr, path, launch);
  check(cudaDeviceSynchronize(), "quantize_grouped_gpu");
  GroupedQuantizedTensor t;
  t.spec = q;
  t.rows = rows;
  t.cols = cols;
  t.group_rows.assign(sizes.begin(), sizes.end());
  t.codes = codes.download();
  t.scale_cols = sc;
  t.scale_row_offset = soff;
  if (has_codes) t.scale_codes = scodes.download();
  t.scales = scales.download();
  t.global_decode = gdec.download();
  t.dequant = dq.download();
  return t;
}

std::vector<float> grouped_alpha_host(const float* ga, const float* gb, size_t groups, cudaStream_t stream) {
  std::vector<float> a(groups, 1.0f), b(groups, 1.0f);
  if (groups == 0) return a;
  if (ga)
    check(cudaMemcpyAsync(a.data(), ga, groups * sizeof(float), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (grouped alpha)");
  if (gb)
    check(cudaMemcpyAsync(b.data(), gb, groups * sizeof(float), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (grouped alpha)");
  check(cudaStreamSynchronize(stream), "grouped_alpha_host");
  for (size_t g = 0; g < groups; ++g) a[g] = a[g] * b[g];
  return a;
}

void grouped_gemm_forward(Blas& blas, GroupedGemmWorkspace& ws, std::span<const int64_t> sizes, int64_t n, int64_t k,
                          const uint16_t* x, const uint16_t* w, void* y, OutType out, std::span<const float> alpha,
                          GroupedImpl impl, const float* alpha_device) {
  grouped_gemm(Op::forward, blas, ws, sizes, n, k, x, w, y, out, false, alpha, impl, alpha_device);
}

void grouped_gemm_dgrad(Blas& blas, GroupedGemmWorkspace& ws, std::span<const int64_t> sizes, int64_t n, int64_t k,
                        const uint16_t* dy, const uint16_t* w, void* dx, OutType out, std::span<const float> alpha,
                        GroupedImpl impl, const float* alpha_device) {
  grouped_gemm(Op::dgrad, blas, ws, sizes, n, k, dy, w, dx, out, false, alpha, impl, alpha_device);
}

void grouped_gemm_wgrad(Blas& blas, GroupedGemmWorkspace& ws, std::span<const int64_t> sizes, int64_t n, int64_t k,
                        const uint16_t* dy, const uint16_t* x, void* dw, OutType out, bool accumulate,
                        std::span<const float> alpha, GroupedImpl impl, const float* alpha_device) {
  grouped_gemm(Op::wgrad, blas, ws, sizes, n, k, dy, x, dw, out, accumulate, alpha, impl, alpha_device);
}

}  // namespace fp4lab::cuda
