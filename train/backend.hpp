// The trainer's compute backend (docs/DESIGN.md): every operation the models
// need, behind one small interface, so the models are written once. Two
// implementations: train/cpu/ (Eigen + OpenMP, the reference) and train/cuda/
// (kernels + cuBLAS).
//
// Tensors are 2-D row-major float32 in the backend's memory (host memory for
// the CPU backend). A Tensor either owns its memory (`mem`) or is a view into
// another buffer (the flat parameter buffer, a slice of an activation). A
// Tensor with a shape and data null holds no FP32 values: a producer's output
// written in BF16 alone (ProducerOutputs::f32 false), read only by the
// consumers that asked for it.
// All row counts are "tokens" (batch x sequence collapsed), all column counts
// are features. Integer inputs (token ids, class labels) are host arrays.
//
// Determinism: every operation of the CPU backend gives the same bits with 1 or
// N OpenMP threads (rows are independent; reductions over rows use a fixed
// blocking and a fixed summation order).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "recipes/linear_plan.hpp"
#include "train/grad_clip.hpp"
#include "train/param_storage.hpp"
#include "train/route.hpp"

namespace fp4lab::train {

// The precision of the activations (config precision.activations; the
// semantics: docs/DESIGN.md, "BF16 activations"). fp32: every op writes its
// FP32 result. bf16: PyTorch autocast's semantics, FP32 master weights, the
// residual stream and its gradient in FP32, and r() (round to nearest even
// FP32 -> BF16) applied at the places Backend's contract below names.
enum class ActivationPrecision : uint8_t { fp32, bf16 };

// Elements [offset, offset + size) of a flat buffer.
struct IndexRange {
  int64_t offset = 0, size = 0;
  bool operator==(const IndexRange&) const = default;
};

// Throws fp4lab::Error naming `what` unless each range is non-empty and the
// ranges are sorted, disjoint and inside [0, n).
void check_ranges(const char* what, std::span<const IndexRange> ranges, int64_t n);

// The tensor amaxes a linear layer's one-pass NVFP4 quantization of its
// input x (grad: output gradient dy) needs for its global scales: of the
// tensor, and (rht) of its RHT down 16-row column chunks.
struct AmaxRequest {
  bool rht = false;       // the second amax is of the RHT down 16-row column chunks
  uint64_t rht_seed = 0;  // its signs (sim/rht.hpp)
  bool operator==(const AmaxRequest&) const = default;
};

// One linear layer's plan for one pass: its context and linear_plan(ctx)
// (recipes/linear_plan.hpp), built once by the model at the start of a
// training step's forward (it serves that step's backward too) or of an
// evaluation forward, and handed to every backend call of the layer in that
// pass. The plan's pointers point into *ctx.recipe, which outlives the pass.
// w_stored: the layer's weight in its stored form where the backend keeps one
// (ParamStore::stored: the cuda backend's packed NVFP4 cast, which the layer
// may decode instead of reading W's values; null otherwise: W's values).
struct LayerPlan {
  LinearContext ctx;
  LinearPlan plan;
  const StoredWeight* w_stored = nullptr;
};
inline LayerPlan plan_layer(const LinearContext& ctx) { return LayerPlan{ctx, linear_plan(ctx), nullptr}; }

struct Tensor {
  float* data = nullptr;
  int64_t rows = 0, cols = 0;
  std::shared_ptr<float[]> mem;  // null for views
  int64_t size() const { return rows * cols; }
  float* row(int64_t r) const { return data + r * cols; }
};

// How AdamW stores its moments m and v (config training.moments; TransformerEngine's FusedAdam
// exp_avg_dtype / exp_avg_sq_dtype, multi_tensor_adam.cu's AdamFunctor):
//   fp32: as computed (the default);
//   bf16: each step reads m and v widened to FP32, updates them by the FP32 operations of fp32 storage, uses
//         those FP32 values in the parameter update, and stores their round-to-nearest-even BF16
//         (round_bf16_f32, train/cpu/bf16.hpp; NaN becomes the quiet NaN 0x7FC0). Half the bytes of each moment.
// A bf16 moment tensor of n values holds them packed, value i in the 16-bit half at byte 2i of its floats
// (little-endian): moment_floats(bf16, n) = ceil(n / 2) floats.
enum class MomentStorage : uint8_t { fp32, bf16 };
inline int64_t moment_floats(MomentStorage s, int64_t n) { return s == MomentStorage::bf16 ? (n + 1) / 2 : n; }

// Producer outputs: what a producer op (LayerNorm, GELU, attention, the
// dropout gradients) writes for the linear layer that consumes its output,
// besides or instead of the FP32 values, so that the layer does not read the
// tensor once more for it. The model asks the consumer what it needs
// (Backend::linear_input_needs), has the backend allocate it
// (Backend::producer_outputs), hands the object to the producer, then to the
// consumer's linear_forward (x) or linear_backward (dy). No other op sees it.
// The other direction, a linear layer producing for a non-linear op (BF16
// storage, Bf16Edge below), uses the same object: the layer's y_out / dx_out,
// the op's x_from (qkv_from, dy_from, dout_from).
//
// What a linear layer's plan wants of the producer of its input x (grad: of
// its output gradient dy):
struct LinearInputNeeds {
  // Both GEMM operands of the tensor are its round-to-nearest-even BF16 and
  // nothing else (the bf16 recipe; a layer kept in BF16): the producer can write that rounding.
  bool bf16 = false;
  // The tensor amaxes of its one-pass NVFP4 quantization of both operands.
  std::optional<AmaxRequest> amax;
  bool operator==(const LinearInputNeeds&) const = default;
};

// The buffers of one producer's outputs for a [rows, cols] tensor (backend
// memory; contents unspecified until written). A producer writes what it can
// and says so in *_written; a consumer uses only what is written and makes the
// rest itself (the same bits: a producer output only replaces the layer's own
// identical work, tests/train/cuda/test_backend.cpp).
struct ProducerOutputs {
  int64_t rows = 0, cols = 0;
  // rows*cols BF16 values, the RNE BF16 of the FP32 output; null: not wanted.
  uint16_t* bf16 = nullptr;
  std::shared_ptr<float[]> bf16_mem;  // owns bf16 (a consumer may keep a reference past the producer)
  bool bf16_written = false;
  // Two uint32 words: the amax bits `request` names (abs_bits of the tensor,
  // and of its RHT); null: not wanted.
  uint32_t* amax = nullptr;
  std::shared_ptr<float[]> amax_mem;
  AmaxRequest request;
  bool amax_written = false;
  // The FP32 output holds r(v), the BF16-activation rounding (the producer ran
  // under ActivationPrecision::bf16 and applied r() as its contract below
  // says): a consumer reading r(x) can read x as it is (r is idempotent).
  bool rounded = false;
  // false: the FP32 output is not written at all (its Tensor has data null;
  // output_tensor in train/model.hpp) and the BF16 stands alone. Only where
  // the consumers read nothing but bf16.
  bool f32 = true;
};

// BF16 storage (ActivationPrecision::bf16): the edges along which a linear layer's GEMM output, read by a
// non-linear op (no linear layer), may be stored in BF16 alone: the layer gets the edge's ProducerOutputs
// (bf16 set, f32 false; model.hpp bf16_storage_for) as linear_forward's y_out or linear_backward's dx_out,
// writes its r()-rounded output there and leaves the FP32 Tensor without data; the consumer gets the same
// object as its input's *_from and reads the BF16 (the same values). Backend::stores_bf16 says where a
// backend does it; StepContext::bf16_storage switches each edge (tests compare the two, bit for bit).
enum class Bf16Edge : uint8_t {
  fc_out,      // mlp.c_fc's y -> gelu_forward and gelu_backward (x)
  proj_dx,     // mlp.c_proj's dx -> gelu_backward (dy)
  flash_qkv,   // attn.c_attn's y -> attention_forward / attention_backward (qkv), bf16_flash attention only
  flash_dout,  // attn.c_proj's dx -> attention_backward (dout), bf16_flash attention only
  attn_branch,  // attn.c_proj's y -> dropout_add (the residual branch; the sum, FP32, a new tensor)
  mlp_branch,   // mlp.c_proj's y -> dropout_add (the same; the dense MLP only)
  lnf_dy,       // lm_head's dx -> ln_f's layernorm_backward (dy)
  ln1_dy,       // attn.c_attn's dx -> ln_1's layernorm_backward (dy)
  ln2_dy,       // mlp.c_fc's dx -> ln_2's layernorm_backward (dy; the dense MLP only)
};
inline constexpr int kBf16Edges = 9;
inline constexpr uint32_t bf16_edge_bit(Bf16Edge e) { return 1u << unsigned(e); }
inline constexpr uint32_t kAllBf16Edges = (1u << kBf16Edges) - 1;
inline const char* bf16_edge_name(Bf16Edge e) {
  constexpr const char* names[kBf16Edges] = {"mlp.c_fc y -> gelu (fc_out)", "mlp.c_proj dx -> gelu' dy (proj_dx)",
                                             "attn.c_attn y -> flash attention qkv (flash_qkv)",
                                             "attn.c_proj dx -> flash attention dout (flash_dout)",
                                             "attn.c_proj y -> dropout_add (attn_branch)",
                                             "mlp.c_proj y -> dropout_add (mlp_branch)",
                                             "lm_head dx -> ln_f backward dy (lnf_dy)",
                                             "attn.c_attn dx -> ln_1 backward dy (ln1_dy)",
                                             "mlp.c_fc dx -> ln_2 backward dy (ln2_dy)"};
  return names[unsigned(e)];
}

// A view of `rows x cols` floats at `p` (no ownership).
inline Tensor view_of(float* p, int64_t rows, int64_t cols) {
  Tensor t;
  t.data = p;
  t.rows = rows;
  t.cols = cols;
  return t;
}
// A view of rows [off, off + n) of t.
inline Tensor rows_of(const Tensor& t, int64_t off, int64_t n) { return view_of(t.data + off * t.cols, n, t.cols); }

// Throws fp4lab::Error naming `what` unless a and b have the same column count.
void check_same_cols(const char* what, const Tensor& a, const Tensor& b);
// Throws fp4lab::Error naming `what` unless idx[0..n) all lie in [0, rows) (or are -1: no row);
// returns how many name a row.
int64_t check_row_indices(const char* what, const int32_t* idx, int64_t n, int64_t rows);

// What a linear layer keeps between forward and backward (backend specific).
struct LinearState {
  virtual ~LinearState() = default;
};

// G linear layers applied to consecutive row groups of one tensor (a mixture
// of experts' experts): group g is rows [offsets[g], offsets[g + 1]) of x, with
// its own plan (so its own random streams), weight [out, in] and bias.
struct LinearGroups {
  std::span<const LayerPlan* const> plans;  // [G], each the group's plan for the pass
  std::span<const Tensor> w;                // [G]
  std::span<const float* const> b;          // [G] (null entries: no bias), or empty: no biases
  std::span<const int64_t> offsets;         // [G + 1] host, offsets[0] = 0, non-decreasing
  size_t size() const { return plans.size(); }
  int64_t rows(size_t g) const { return offsets[g + 1] - offsets[g]; }
  const float* bias(size_t g) const { return b.empty() ? nullptr : b[g]; }
};
// Throws InternalError unless the spans agree (G plans, G weights, G or no
// biases, G + 1 offsets from 0, non-decreasing, ending at `rows`).
void check_groups(const LinearGroups& g, int64_t rows);

// Attention geometry: `batch` sequences of `seq` tokens, `heads` heads of
// width cols/heads. scale multiplies q.k (1/sqrt(head_dim) normally).
struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0;
  bool causal = false;
  float scale = 1.0f;
  float dropout = 0.0f;  // on the attention probabilities (inverted dropout)
  // model.attention "bf16_flash" (CUDA backend only): BF16 tensor-core flash
  // attention; the saved tensor is then [B*H*T, hd + 1] (the output rows and
  // the log-sum-exp, attention_saved_cols), not the probabilities.
  bool bf16_flash = false;
};

// Columns of attention_forward's saved tensor ([B*H*T, cols]): T (the
// probabilities), or head_dim + 1 with bf16_flash.
inline int64_t attention_saved_cols(const AttentionShape& s, int64_t head_dim) {
  return s.bf16_flash ? head_dim + 1 : s.seq;
}

// Dropout masks are not stored: element i of a tensor dropped under
// (seed, stream) is dropped iff random_bits(seed, stream, i) < p * 2^32
// (core/philox.hpp), so backward regenerates the same mask.
struct DropoutKey {
  uint64_t seed = 0, stream = 0;
};

// The Backend's contract under ActivationPrecision::bf16 (docs/DESIGN.md,
// "BF16 activations"; r() = round to nearest even FP32 -> BF16, NaN quiet,
// overflow to Inf). Each op computes as in fp32 mode (the same FP32/FP64
// formula) and applies r() at these places only:
//   linear_forward     x read as r(x); y = r(acc + r(b)) (acc: the FP32 GEMM
//                      accumulator, the plan's operands made from r(x) as in fp32 mode)
//   linear_backward    dy read as r(dy); dx = r(acc); dW_acc += float(r(dW));
//                      db_acc += float(r(db)) (autocast's BF16 gradient of the
//                      BF16 copies of W and b, widened into the FP32 gradient)
//   layernorm_forward  y = r(y); mean, rstd FP32
//   layernorm_backward nothing: reads the (BF16-valued) dy, writes the FP32 dx
//   gelu_forward/backward          y = r(y), dx = r(dx)
//   attention_forward/backward     out = r(out), dqkv = r(dqkv) (the softmax,
//                      probabilities and sums in FP32 as in fp32 mode)
//   dropout_forward/backward (in place), dropout_add's dropped operand,
//   dropout_backward_to's and add_dropout_backward_to's dst: r(dropped value),
//                      p = 0 included (the tensor is a BF16 activation or its
//                      gradient). A model drops an FP32 tensor (GPT's embeddings
//                      and their gradient, the MoE MLP's FP32 combine) under
//                      ActivationScope(fp32).
//   cross_entropy      dlogits = r(dlogits) (loss and softmax in FP32/FP64)
//   everything else    as in fp32 mode: residual adds (add_inplace, the add
//                      of dropout_add) in FP32, embeddings, ViT tokens,
//                      gather/scatter/combine rows, routing, the optimiser.
// Tensors stay float: a CPU buffer holds BF16-representable values where r()
// applied. A backend may store such a tensor in BF16 (the same values): the
// CUDA backend does for a linear layer's y (dx) read only by the op named by a
// Bf16Edge, written by the GEMM as BF16 (y = r(acc + r(b)), dx = r(acc), the
// same bits) and read by that op from the BF16 (stores_bf16 below).
// Every op of fp32 mode is bit-identical to a backend without this mode.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Its tensors are host memory (cpu) or the device's (cuda): a host communicator (threads, MPI) takes the
  // former as they are; the latter are staged through host memory (train/dist/).
  virtual bool host_tensors() const = 0;

  // The activation precision the ops apply (the contract above); fp32 until
  // set. A model sets it at the start of every pass (StepContext::activations).
  // Throws fp4lab::Error naming the backend for a precision it does not
  // implement (implements()).
  virtual void set_activations(ActivationPrecision a) {
    if (!implements(a))
      throw Error("backend " + name() + " does not implement precision.activations \"bf16\" (yet); use \"fp32\"");
    activations_ = a;
  }
  ActivationPrecision activations() const { return activations_; }
  // Whether set_activations(a) is valid: fp32 everywhere; bf16 where a backend says so.
  virtual bool implements(ActivationPrecision a) const { return a == ActivationPrecision::fp32; }
  // Waits until every operation issued so far has finished (a no-op on the
  // CPU; the CUDA backend's calls are asynchronous). For timing.
  virtual void synchronize() {}

  // The memory of this backend's tensors, from the allocations themselves (bytes): in use (every empty()
  // tensor, and the CPU's linear outputs, until its last holder drops it) and reserved (in use + the
  // allocator's cache: the CUDA pool's blocks held from the driver; = in use on the CPU), at their peaks
  // since reset_device_memory_peaks(), and in use now. Not the layers' DeviceBuffer workspaces
  // (cuda/device.hpp), the CUDA context's, cuBLAS's or NCCL's own, nor the CPU's temporaries inside an op.
  struct DeviceMemory {
    int64_t tensors_in_use_peak = 0, tensors_reserved_peak = 0, tensors_in_use = 0;
  };
  virtual std::optional<DeviceMemory> device_memory() { return std::nullopt; }
  virtual void reset_device_memory_peaks() {}

  // Memory.
  virtual Tensor empty(int64_t rows, int64_t cols) = 0;  // contents unspecified
  Tensor zeros(int64_t rows, int64_t cols) {
    Tensor t = empty(rows, cols);
    fill(t, 0.0f);
    return t;
  }
  virtual void fill(Tensor& t, float v) = 0;
  virtual void upload(const float* host, Tensor& t) = 0;    // host -> t (t.size() floats)
  virtual void download(const Tensor& t, float* host) = 0;  // t -> host
  virtual void copy(const Tensor& src, Tensor& dst) = 0;    // same size
  virtual void copy_cols(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t ncols) = 0;
  // The cast of `tensors` (parts of a flat buffer of this backend's memory) to storage `s` (not fp32) in this
  // backend's memory (train/param_storage.hpp): what ParamStore::set_storage makes for its low-precision
  // tensors. Error for a form the backend has no cast for (cuda: bf16, fp8_e4m3).
  virtual std::unique_ptr<CastStore> make_cast_store(Storage s, std::span<const FlatTensor> tensors) = 0;

  // Linear y = x W^T + b through the recipe (recipes/linear_plan.hpp; train/cpu/linear.hpp is the reference).
  // dw (and db if non-null) are ACCUMULATED into (weight tying, several uses).
  // x must not be modified until the linear_backward of this state: a backend
  // may keep a reference to an owned x (Tensor::mem) instead of a copy, as
  // PyTorch's autograd keeps its inputs (the CUDA backend does, for FP32 x).
  // x_from (dy_from): what x's (dy's) producer wrote for this layer (null:
  // nothing); a layer takes only what is written, and x.data (dy.data) may be
  // null only where x_from->bf16 is written and the plan reads nothing else
  // (ProducerOutputs::f32 false).
  // y_out (dx_out): the producer outputs of y's (dx's) consumer, a non-linear op
  // (Bf16Edge), or null. Where y_out->f32 is false (only where stores_bf16 said
  // so), y is written into y_out->bf16 alone (BF16 storage; y keeps its shape and
  // data null) and y_out->bf16_written set; otherwise nothing is written there.
  virtual void linear_forward(const LayerPlan& l, const Tensor& x, const Tensor& w, const float* b, Tensor& y,
                              std::unique_ptr<LinearState>& state, const ProducerOutputs* x_from = nullptr,
                              ProducerOutputs* y_out = nullptr) = 0;
  virtual void linear_backward(const LayerPlan& l, const LinearState& state, const Tensor& w, const Tensor& dy,
                               Tensor& dx, Tensor& dw_acc, float* db_acc, const ProducerOutputs* dy_from = nullptr,
                               ProducerOutputs* dx_out = nullptr) = 0;
  // The same for a context planned on the spot (callers outside a model's pass: LinearFunction, tests).
  void linear_forward(const LinearContext& ctx, const Tensor& x, const Tensor& w, const float* b, Tensor& y,
                      std::unique_ptr<LinearState>& state) {
    linear_forward(plan_layer(ctx), x, w, b, y, state);
  }
  void linear_backward(const LinearContext& ctx, const LinearState& state, const Tensor& w, const Tensor& dy,
                       Tensor& dx, Tensor& dw_acc, float* db_acc) {
    linear_backward(plan_layer(ctx), state, w, dy, dx, dw_acc, db_acc);
  }

  // A grouped linear (LinearGroups): y [M, out] (written in place when it has
  // that shape, M = offsets[G]) from x [M, in]; the backward writes dx [M, in]
  // (in place when shaped) and ACCUMULATES group g's weight and bias
  // gradients into dw_acc[g] and db_acc[g] (db_acc empty: no biases). The
  // bits are those of linear_forward / linear_backward on each non-empty
  // group's rows with its plan, in group order: what this default does (the
  // reference for a backend's own implementation).
  virtual void grouped_linear_forward(const LinearGroups& g, const Tensor& x, Tensor& y,
                                      std::unique_ptr<LinearState>& state);
  virtual void grouped_linear_backward(const LinearGroups& g, const LinearState& state, const Tensor& dy, Tensor& dx,
                                       std::span<Tensor> dw_acc, std::span<float* const> db_acc);

  // Producer outputs (see ProducerOutputs above). What the layer of plan l
  // wants of the producer of its x (grad: of its dy), a [rows, cols] tensor.
  // Default: nothing (the layer makes every operand itself).
  virtual LinearInputNeeds linear_input_needs(const LayerPlan& l, bool grad, int64_t rows, int64_t cols) {
    (void)l, (void)grad, (void)rows, (void)cols;
    return {};
  }
  LinearInputNeeds linear_input_needs(const LinearContext& ctx, bool grad, int64_t rows, int64_t cols) {
    return linear_input_needs(plan_layer(ctx), grad, rows, cols);
  }
  // BF16 storage: whether this backend, in the current pass, stores the linear
  // output of edge e in BF16 alone for its consumer (Bf16Edge). Default: never
  // (the CPU backend keeps float tensors, and ignores the *_from of a BF16 form it never makes).
  virtual bool stores_bf16(Bf16Edge e) const {
    (void)e;
    return false;
  }
  // Buffers for `needs` of a [rows, cols] tensor (f32 true). Default: only
  // for empty needs (a backend that states needs allocates their buffers).
  virtual ProducerOutputs producer_outputs(const LinearInputNeeds& needs, int64_t rows, int64_t cols) {
    FP4LAB_CHECK(!needs.bf16 && !needs.amax, "backend " + name() + " states input needs it cannot allocate");
    ProducerOutputs o;
    o.rows = rows;
    o.cols = cols;
    return o;
  }

  // LayerNorm over each row: y = (x - mean) * rstd * gamma + beta (beta may be
  // null: nanoGPT's bias=False). mean/rstd [rows] are saved for backward.
  // out: its consumer's producer outputs (may be null), here BF16 only (no amax).
  virtual void layernorm_forward(const Tensor& x, const float* gamma, const float* beta, float eps, Tensor& y,
                                 Tensor& mean, Tensor& rstd, ProducerOutputs* out = nullptr) = 0;
  // dx written; dgamma/dbeta accumulated (dbeta may be null). With a residual
  // (same shape as x), dx = LayerNorm's input gradient + residual, one float
  // add per element: the bits of layernorm_backward then add_inplace(dx, *residual).
  // dy_from: what dy's producer, a linear layer, wrote for it (Bf16Edge lnf_dy,
  // ln1_dy, ln2_dy), or null; as gelu_forward's x_from.
  virtual void layernorm_backward(const Tensor& dy, const Tensor& x, const float* gamma, const Tensor& mean,
                                  const Tensor& rstd, Tensor& dx, float* dgamma_acc, float* dbeta_acc,
                                  const Tensor* residual = nullptr, const ProducerOutputs* dy_from = nullptr) = 0;

  // GELU, exact erf form (PyTorch nn.GELU()): y = x * Phi(x).
  // out: y's (dx's) consumer's producer outputs (may be null): BF16 and amaxes.
  // x_from (dy_from): what x's (dy's) producer, a linear layer, wrote for it
  // (Bf16Edge fc_out, proj_dx), or null; x.data (dy.data) may be null only where
  // its BF16 is written (BF16 storage).
  virtual void gelu_forward(const Tensor& x, Tensor& y, ProducerOutputs* out = nullptr,
                            const ProducerOutputs* x_from = nullptr) = 0;
  virtual void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, ProducerOutputs* out = nullptr,
                             const ProducerOutputs* x_from = nullptr, const ProducerOutputs* dy_from = nullptr) = 0;

  // Multi-head self-attention core on qkv [B*T, 3C] (q | k | v column blocks,
  // head h = columns h*hd..(h+1)*hd of each block): out [B*T, C].
  // probs [B*H*T, T] saves the softmax probabilities (before dropout); with
  // s.bf16_flash it is [B*H*T, attention_saved_cols] (CUDA backend only).
  // o: out's (dqkv's) consumer's producer outputs (may be null), here BF16 only (no amax).
  // qkv_from (dout_from): what qkv's (dout's) producer, a linear layer, wrote for
  // it (Bf16Edge flash_qkv, flash_dout), or null; as gelu_forward's x_from.
  virtual void attention_forward(const AttentionShape& s, const Tensor& qkv, Tensor& out, Tensor& probs,
                                 DropoutKey key, ProducerOutputs* o = nullptr,
                                 const ProducerOutputs* qkv_from = nullptr) = 0;
  virtual void attention_backward(const AttentionShape& s, const Tensor& qkv, const Tensor& probs, const Tensor& dout,
                                  Tensor& dqkv, DropoutKey key, ProducerOutputs* o = nullptr,
                                  const ProducerOutputs* qkv_from = nullptr,
                                  const ProducerOutputs* dout_from = nullptr) = 0;

  // Inverted dropout in place (p = 0 is a no-op); backward applies the same mask to dy.
  virtual void dropout_forward(Tensor& x, float p, DropoutKey key) = 0;
  virtual void dropout_backward(Tensor& dy, float p, DropoutKey key) = 0;
  // Out of place: dst = dropout_backward of src (src unchanged), i.e.
  // copy(src, dst) then dropout_backward(dst, p, key), which is what this
  // default does (writing no producer outputs); a backend may do it in one
  // pass (same bits). o: dst's consumer's producer outputs (may be null): BF16 and amaxes.
  virtual void dropout_backward_to(const Tensor& src, Tensor& dst, float p, DropoutKey key,
                                   ProducerOutputs* o = nullptr) {
    (void)o;
    copy(src, dst);
    dropout_backward(dst, p, key);
  }
  // The residual gradient step: y += x, then dst = dropout_backward of y (out
  // of place), i.e. add_inplace(y, x) then dropout_backward_to(y, dst, ...),
  // which is what this default does; a backend may do it in one pass.
  virtual void add_dropout_backward_to(Tensor& y, const Tensor& x, Tensor& dst, float p, DropoutKey key,
                                       ProducerOutputs* o = nullptr) {
    add_inplace(y, x);
    dropout_backward_to(y, dst, p, key, o);
  }

  // y += x (same shape).
  virtual void add_inplace(Tensor& y, const Tensor& x) = 0;
  // The residual branch y = dropout(y) + x: dropout_forward(y, p, key) then
  // add_inplace(y, x), which is what this default does; a backend may do both in
  // one pass (the same operations per element, so the same bits).
  // y_from: what y's producer, a linear layer, wrote for it (Bf16Edge attn_branch,
  // mlp_branch), or null; where y has no FP32 values (its BF16 is written), y is
  // made a new tensor (empty) holding the sum. Only a backend that stores_bf16 sees that.
  virtual void dropout_add(Tensor& y, const Tensor& x, float p, DropoutKey key,
                           const ProducerOutputs* y_from = nullptr) {
    (void)y_from;
    FP4LAB_CHECK(y.data || y.size() == 0, "backend " + name() + ": dropout_add of a BF16-only branch it cannot read");
    dropout_forward(y, p, key);
    add_inplace(y, x);
  }

  // GPT embeddings: out[b*T+t] = wte[idx[b*T+t]] + wpe[t]  (idx host, [B*T]).
  virtual void embed_forward(const int32_t* idx, int64_t batch, int64_t seq, const Tensor& wte, const Tensor& wpe,
                             Tensor& out) = 0;
  virtual void embed_backward(const int32_t* idx, int64_t batch, int64_t seq, const Tensor& dout, Tensor& dwte_acc,
                              Tensor& dwpe_acc) = 0;

  // ViT tokens: out[b*(P+1)] = cls + pos[0]; out[b*(P+1)+1+p] = patches[b*P+p] + pos[1+p].
  virtual void vit_tokens_forward(const Tensor& patches, int64_t batch, const float* cls, const Tensor& pos,
                                  Tensor& out) = 0;
  virtual void vit_tokens_backward(const Tensor& dout, int64_t batch, Tensor& dpatches, float* dcls_acc,
                                   Tensor& dpos_acc) = 0;
  // Rows r*stride (r < n) of x -> out [n, C], and the transpose scatter (dx zeroed elsewhere).
  virtual void gather_rows(const Tensor& x, int64_t stride, Tensor& out) = 0;
  virtual void scatter_rows(const Tensor& dout, int64_t stride, Tensor& dx) = 0;

  // x replaced by quantize(q, x).dequant (sim's fake_quantize with RandomStream {}: the same bits on every
  // backend). The default runs sim's on the host (download, quantize, upload).
  virtual void fake_quantize(Tensor& x, const QuantizerSpec& q);
  // The compact transport of such a quantization (the MoE dispatch cast's; train/mx_rows.hpp, for a q of
  // mx_rows_supported): encode_rows_mx writes the N rows of x [N, C] as N rows of mx_rows(q, C).row_bytes()
  // bytes (C element codes, then the E8M0 codes of the row's blocks) into `bytes`, a tensor of this
  // backend's memory read as bytes (empty_bytes); decode_rows_mx writes x [N, C] from them: the values
  // fake_quantize(x, q) writes, bit for bit. The defaults run mx_rows.hpp's codec on the host (download,
  // upload).
  virtual void encode_rows_mx(const QuantizerSpec& q, const Tensor& x, Tensor& bytes);
  virtual void decode_rows_mx(const QuantizerSpec& q, const Tensor& bytes, Tensor& x);
  // distributed.reduce "bf16" (train/dist/grad_reduce.hpp) on this backend's memory, by the element rules of
  // train/bf16_codes.hpp, so that the reduction moves only codes: round_bf16_codes writes reduce_bf16_code of
  // x's element i at code i of `codes` (a byte tensor, empty_bytes, of at least 2 x.size() bytes);
  // sum_bf16_codes writes out's element i = reduce_bf16_sum over `rows` rows of out.size() codes each.
  virtual void round_bf16_codes(const Tensor& x, Tensor& codes) = 0;
  virtual void sum_bf16_codes(const Tensor& codes, int64_t rows, Tensor& out) = 0;

  // Mixture-of-experts routing (train/moe.hpp). Index and weight arrays are
  // host arrays; `k` slots per token, slot (t, j) at t * k + j.
  // An index -1 names no row (capacity dispatch: an empty row, a dropped slot).
  // out[i] = x[idx[i]] for i < out.rows (each idx in [0, x.rows), or -1: a row of +0).
  virtual void gather_rows_indexed(const Tensor& x, const int32_t* idx, Tensor& out) = 0;
  // out [T, C] row t = sum over j < k, in order j, of w[t*k+j] * src[pos[t*k+j]]
  // (src [M, C]), each product and each sum rounded to float (no FMA),
  // starting from 0 (w null: every weight 1, i.e. plain sums), slots with pos
  // -1 skipped. Deterministic: the same bits on every backend and thread count.
  virtual void combine_rows(const Tensor& src, const int32_t* pos, const float* w, int64_t k, Tensor& out) = 0;
  // Backward of combine_rows (w non-null) when every row of src is named by
  // at most one slot: dsrc[pos[t*k+j]] = w[t*k+j] * dout[t], the rows no slot
  // names +0; and, on the host, dw[t*k+j] = the float64 sum over c in order of
  // dout[t,c] * src[pos[t*k+j],c] (each product exact in float64), rounded
  // once to float (+0 for pos -1). Blocks until dw is written.
  virtual void combine_rows_backward(const Tensor& dout, const Tensor& src, const int32_t* pos, const float* w,
                                     int64_t k, Tensor& dsrc, float* dw) = 0;

  // The routing seam (train/route.hpp), which MoeMlp calls: one batch's
  // routing kept in the backend's memory. The defaults route on the host
  // (HostRouteState): download of the logits and route(), then the host-index
  // calls above, router_logit_grad and an upload. A backend may keep the
  // routing in its own memory instead, with the same bits. N tokens, E
  // experts, k slots a token.
  // The routing of logits [N, E]; the state's offset is set on return (the
  // host may wait here: for the logits, or for the E counts of a dropless
  // routing), its summary() when first asked for (route.hpp).
  virtual std::unique_ptr<RouteState> moe_route(const RouteParams& p, const Tensor& logits);
  // grouped [N k, C] row r = x row token[r] (gather_rows_indexed).
  virtual void moe_gather(const Tensor& x, const RouteState& r, Tensor& grouped);
  // out [N, C] = combine_rows(src, pos, gated ? gate : null, k).
  virtual void moe_combine(const Tensor& src, const RouteState& r, bool gated, Tensor& out);
  // combine_rows_backward(dout, src, pos, gate, k, dsrc, dgate), the gates' gradient dgate kept in r.
  virtual void moe_combine_backward(const Tensor& dout, const Tensor& src, RouteState& r, Tensor& dsrc);
  // dlogits [N, E] = router_logit_grad(r's parameters and routing, r's dgate, loss_scale).
  virtual void moe_router_grad(const RouteState& r, float loss_scale, Tensor& dlogits);
  // The routing on the host (tests), and in *dgate (if non-null) the gates'
  // gradient (empty before moe_combine_backward).
  virtual Routing moe_download(const RouteState& r, std::vector<float>* dgate = nullptr);
  // Expert parallelism's form of moe_route (MoeMlp with an ExpertExchange;
  // docs/log/2026-12-02-expert-parallel-plan.md section 3), route.hpp's split:
  // moe_route_local routes per token (the state not yet grouped); its host
  // counts [E] and block sums [blocks, E + 1] (may wait) go to every rank;
  // moe_route_finish groups on every rank's: route_group and route_losses,
  // after which the state's offset is the send layout and its exchange fields
  // are set. The calls above then read the send layout.
  virtual std::unique_ptr<RouteState> moe_route_local(const RouteParams& p, const Tensor& logits);
  virtual std::vector<int64_t> moe_route_counts(const RouteState& r);
  virtual std::vector<double> moe_route_partials(const RouteState& r);
  virtual void moe_route_finish(RouteState& r, const ExpertShard& shard, std::vector<int64_t> count_all,
                                const std::vector<double>& block_sums_all, int64_t grad_tokens);
  // The received rows [sum recv_rows, C] (sources in rank order) into this
  // rank's experts' groups [expert_offset.back(), C]: row i = received row
  // recv_index[i] (-1: +0). moe_unreorder is its inverse on the named rows:
  // back row recv_index[i] = grouped row i.
  virtual void moe_reorder(const Tensor& received, const RouteState& r, Tensor& grouped);
  virtual void moe_unreorder(const Tensor& grouped, const RouteState& r, Tensor& back);

  // Softmax cross-entropy over rows of logits [N, V] with targets [N] (host).
  // Returns the mean loss (float64 accumulation in row order); writes
  // dlogits = (softmax - onehot) / N when dlogits is non-null; counts rows
  // whose argmax (first maximum) equals the target into *correct if non-null.
  virtual double cross_entropy(const Tensor& logits, const int32_t* targets, Tensor* dlogits, int64_t* correct) = 0;
  // The same in two halves, so that a backend which queues work need not wait
  // for the loss before the backward pass is queued: cross_entropy_start
  // validates the targets and issues the work (dlogits may be read by work
  // issued after it); cross_entropy_finish returns the mean loss and *correct
  // of the last start (an Error when there is no unfinished start; a start
  // replaces an unfinished one). This default computes everything in start
  // (the CPU backend).
  virtual void cross_entropy_start(const Tensor& logits, const int32_t* targets, Tensor* dlogits) {
    ce_pending_ = false;
    ce_loss_ = cross_entropy(logits, targets, dlogits, &ce_correct_);
    ce_pending_ = true;
  }
  virtual double cross_entropy_finish(int64_t* correct) {
    if (!ce_pending_) throw Error("cross_entropy_finish: no cross_entropy_start to finish");
    ce_pending_ = false;
    if (correct) *correct = ce_correct_;
    return ce_loss_;
  }

  // Optimiser support over flat buffers of n floats.
  virtual double sum_squares(const Tensor& g) = 0;  // float64, fixed order
  virtual void scale(Tensor& g, float s) = 0;
  // One AdamW step (PyTorch semantics): p -= lr*wd*p (if i lies in one of
  // `decayed`); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
  // `decayed`: sorted, disjoint ranges of the flat buffer (check_ranges).
  // grad_scale: the step reads g_i * grad_scale (one float multiply, rounded:
  // the bits of scale(g, grad_scale) before the step; gradient clipping) and
  // leaves g unchanged. `moments`: how m and v are stored (MomentStorage, above; bf16: m and v hold
  // moment_floats(bf16, n) floats of packed BF16, read widened and written rounded).
  virtual void adamw_step(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, std::span<const IndexRange> decayed,
                          float lr, float beta1, float beta2, float eps, float weight_decay, int64_t t,
                          float grad_scale = 1.0f, MomentStorage moments = MomentStorage::fp32) = 0;
  // adamw_step clipped by g's own global norm (g is the whole gradient): norm = sqrt(sum_squares(g)),
  // grad_scale = clip_grad_scale(norm, grad_clip) (train/grad_clip.hpp; grad_clip <= 0: none). Returns the
  // norm. This default reads the norm on the host between the two; the CUDA backend computes the factor on
  // the device and queues the step before it waits for the norm, so the GPU does not idle between them.
  // Both give the bits of the default.
  virtual double adamw_step_clipped(Tensor& p, const Tensor& g, Tensor& m, Tensor& v,
                                    std::span<const IndexRange> decayed, float lr, float beta1, float beta2, float eps,
                                    float weight_decay, int64_t t, double grad_clip, MomentStorage moments) {
    const double norm = std::sqrt(sum_squares(g));
    adamw_step(p, g, m, v, decayed, lr, beta1, beta2, eps, weight_decay, t, clip_grad_scale(norm, grad_clip), moments);
    return norm;
  }

 private:
  ActivationPrecision activations_ = ActivationPrecision::fp32;
  // The default cross_entropy_start / finish's result.
  bool ce_pending_ = false;
  double ce_loss_ = 0.0;
  int64_t ce_correct_ = 0;
};

// A tensor of be's memory holding at least `bytes` bytes (its floats read as bytes; contents unspecified):
// the byte buffers of encode_rows_mx / decode_rows_mx and of ExpertExchange::exchange_bytes.
inline Tensor empty_bytes(Backend& be, int64_t bytes) { return be.empty(1, (bytes + 3) / 4); }
inline uint8_t* byte_data(const Tensor& t) { return reinterpret_cast<uint8_t*>(t.data); }

// Sets be's activation precision for its lifetime, then restores the one
// before: the ops of an FP32 tensor (GPT's embedding dropout) in a bf16 pass.
class ActivationScope {
 public:
  ActivationScope(Backend& be, ActivationPrecision a) : be_(be), saved_(be.activations()) { be.set_activations(a); }
  ~ActivationScope() { be_.set_activations(saved_); }
  ActivationScope(const ActivationScope&) = delete;
  ActivationScope& operator=(const ActivationScope&) = delete;

 private:
  Backend& be_;
  ActivationPrecision saved_;
};

// The CPU backend (Eigen + OpenMP; train/cpu/backend.cpp). threads <= 0: OpenMP's default.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
#ifdef FP4LAB_WITH_CUDA
// The CUDA backend (train/cuda/backend.cpp); throws fp4lab::Error when no GPU is present.
std::unique_ptr<Backend> make_cuda_backend();
#endif
// "cpu" or "cuda" (the latter throws when fp4lab was built without CUDA or no GPU is present).
std::unique_ptr<Backend> make_backend(const std::string& name, int threads = 0);

}  // namespace fp4lab::train
