// The trainer's CUDA backend: every Backend call (train/backend.hpp) on
// the GPU with the kernels of train/cuda/nn.hpp, the linear layer through CudaLinear
// (train/cuda/linear.hpp). Compiled only when fp4lab is built with CUDA.
//
// Memory: Tensors hold DEVICE pointers from a caching allocator (free lists by
// rounded size; a block goes back to its list when the last shared_ptr to it
// dies, so the per-step empty() calls stop calling cudaMalloc after the first
// step). Host inputs (token ids, targets) are uploaded into reusable device
// buffers through pinned staging buffers, and the cross-entropy's per-row
// results come back into pinned memory behind an event, so that neither blocks
// the host: a training step waits for the GPU only for the gradient norm and
// at its end. The AdamW decay mask is built on the device from its ranges. All
// work runs in order on the legacy default stream, so a block recycled by the
// allocator is only reused by work queued after the last use of its previous
// owner.
//
// Numerics: the same operations as the CPU backend in the same FP32/FP64
// precision; only summation orders differ (fixed ones, so every call gives the
// same bits run to run), and the dropout masks are the CPU's bit for bit.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <functional>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "train/backend.hpp"
#include "train/cuda/cast_store.hpp"
#include "train/cuda/device_pool.hpp"
#include "train/cuda/linear.hpp"
#include "train/cuda/linear_ops.hpp"
#include "core/error.hpp"
#include "cuda/device.hpp"
#include "cuda/quantize.hpp"
#include "train/cuda/grad_reduce_ops.hpp"
#include "train/cuda/moe_ops.hpp"
#include "train/cuda/moe_route.hpp"
#include "train/cuda/route_state.hpp"
#include "train/cuda/shape_check.hpp"
#include "train/cuda/nn.hpp"
#include "sim/rht.hpp"

namespace fp4lab::train {

namespace {

namespace nn = fp4lab::cuda::nn;
using fp4lab::cuda::check;
using fp4lab::cuda::DeviceBuffer;

// Grows `b` to at least n elements (contents lost on growth), 64 at least.
template <class T>
T* reserve(DeviceBuffer<T>& b, size_t n) {
  return b.size() < n ? b.at_least(std::max<size_t>(n, 64)) : b.data();
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() : pool_(std::make_shared<DevicePool>()) {}
  std::string name() const override { return "cuda"; }
  bool host_tensors() const override { return false; }
  std::unique_ptr<CastStore> make_cast_store(Storage s, std::span<const FlatTensor> tensors) override {
    return make_device_cast_store(s, tensors, *this);
  }
  // precision.activations "bf16" (train/backend.hpp's contract): FP32 storage of the BF16 values. Producers
  // round in their own pass (nn::OutputRounding: LayerNorm, GELU, dropout and the residual add, cross-entropy,
  // the bias add); the GEMM outputs without a bias, attention's outputs, and a linear layer's input its
  // producer did not round (ProducerOutputs::rounded) take one more one-pass rounding (round_inplace,
  // rounded_copy). BF16 storage (Bf16Edge): a linear output read only by GELU, the flash attention or the
  // residual add, or (dx) by a LayerNorm's backward is written by the GEMM in BF16 alone and read so
  // (stores_bf16).
  bool implements(ActivationPrecision) const override { return true; }
  bool stores_bf16(Bf16Edge) const override { return bf16(); }
  void synchronize() override { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
  std::optional<DeviceMemory> device_memory() override {
    const DevicePool::Bytes b = pool_->bytes();
    return DeviceMemory{int64_t(b.in_use_peak), int64_t(b.reserved_peak), int64_t(b.in_use)};
  }
  void reset_device_memory_peaks() override { pool_->reset_peaks(); }

  // ---- memory ----
  Tensor empty(int64_t rows, int64_t cols) override {
    if (rows < 0 || cols < 0)
      throw Error("cuda backend: negative tensor shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
    const size_t bytes = round_bytes(size_t(std::max<int64_t>(1, rows * cols)) * sizeof(float));
    float* p = static_cast<float*>(pool_->acquire(bytes));
    Tensor t;
    t.rows = rows;
    t.cols = cols;
    std::shared_ptr<DevicePool> pool = pool_;  // the pool outlives every tensor
    t.mem = std::shared_ptr<float[]>(p, [pool, bytes](float* q) { pool->release(q, bytes); });
    t.data = p;
    return t;
  }
  void fill(Tensor& t, float v) override { nn::fill(t.data, t.size(), v); }
  void upload(const float* host, Tensor& t) override {
    if (t.size() > 0)
      check(cudaMemcpy(t.data, host, size_t(t.size()) * 4, cudaMemcpyHostToDevice), "cuda backend upload");
  }
  void download(const Tensor& t, float* host) override {
    if (t.size() > 0)
      check(cudaMemcpy(host, t.data, size_t(t.size()) * 4, cudaMemcpyDeviceToHost), "cuda backend download");
  }
  void copy(const Tensor& src, Tensor& dst) override {
    FP4LAB_CHECK(src.size() == dst.size(), "cuda backend: copy between tensors of different sizes");
    if (src.size() > 0)
      check(cudaMemcpyAsync(dst.data, src.data, size_t(src.size()) * 4, cudaMemcpyDeviceToDevice, nullptr),
            "cuda backend copy");
  }
  void copy_cols(const Tensor& src, int64_t sc, Tensor& dst, int64_t dc, int64_t n) override {
    if (src.rows != dst.rows || sc < 0 || dc < 0 || n < 0 || sc + n > src.cols || dc + n > dst.cols)
      throw Error("cuda backend: copy_cols out of range");
    nn::copy_cols(src.data + sc, src.cols, dst.data + dc, dst.cols, src.rows, n);
  }

  // ---- producer outputs (train/backend.hpp) ----
  using Backend::linear_input_needs;
  LinearInputNeeds linear_input_needs(const LayerPlan& l, bool grad, int64_t rows, int64_t cols) override {
    return linear_.input_needs(l, grad, rows, cols);
  }
  ProducerOutputs producer_outputs(const LinearInputNeeds& needs, int64_t rows, int64_t cols) override {
    ProducerOutputs o;
    o.rows = rows;
    o.cols = cols;
    if (needs.bf16) {
      Tensor h = empty(1, (rows * cols + 1) / 2);  // rows * cols BF16 values
      o.bf16 = reinterpret_cast<uint16_t*>(h.data);
      o.bf16_mem = std::move(h.mem);
    }
    if (needs.amax) {
      Tensor w = empty(1, 2);  // two 32-bit words
      o.amax = reinterpret_cast<uint32_t*>(w.data);
      o.amax_mem = std::move(w.mem);
      o.request = *needs.amax;
    }
    return o;
  }

  // ---- linear ----
  using Backend::linear_forward;
  using Backend::linear_backward;
  void linear_forward(const LayerPlan& l, const Tensor& x, const Tensor& w, const float* b, Tensor& y,
                      std::unique_ptr<LinearState>& state, const ProducerOutputs* x_from,
                      ProducerOutputs* y_out) override {
    uint16_t* yh = bf16_storage("linear_forward", y_out);
    if (!bf16()) return linear_.forward(l, x, w, b, y, state, alloc(), x_from);
    // x read as r(x) (x itself where its producer rounded it, else a rounded copy, which the layer may keep),
    // y = r(acc + r(b)) in the bias add's pass, or written by the GEMM in BF16 alone (BF16 storage).
    const Tensor xr = x_from && x_from->rounded ? x : rounded_copy(x);
    if (yh) return linear_.forward(l, xr, w, b, y, state, alloc(), x_from, yh);
    linear_.forward(l, xr, w, nullptr, y, state, alloc(), x_from);
    if (b != nullptr && l.plan.add_bias)
      cuda::add_bias_bf16_device(y.data, b, y.rows, y.cols);
    else
      round_inplace(y);
  }
  void linear_backward(const LayerPlan& l, const LinearState& state, const Tensor& w, const Tensor& dy,
                       Tensor& dx, Tensor& dw_acc, float* db_acc, const ProducerOutputs* dy_from,
                       ProducerOutputs* dx_out) override {
    uint16_t* dxh = bf16_storage("linear_backward", dx_out);
    if (!bf16()) return linear_.backward(l, state, w, dy, dx, dw_acc, db_acc, alloc(), dy_from);
    // dy read as r(dy); dx = r(acc) (in the GEMM's BF16 output alone with BF16 storage); dW and db: their BF16
    // rounding added to the FP32 accumulators.
    const Tensor dyr = dy_from && dy_from->rounded ? dy : rounded_copy(dy);
    Tensor dw = zeros(dw_acc.rows, dw_acc.cols), db = db_acc ? zeros(1, w.rows) : Tensor{};
    linear_.backward(l, state, w, dyr, dx, dw, db.data, alloc(), dy_from, dxh);
    round_inplace(dx);
    nn::add_rounded_bf16(dw_acc.data, dw.data, dw.size());
    if (db_acc) nn::add_rounded_bf16(db_acc, db.data, w.rows);
  }
  // The grouped layer where CudaLinear groups the plans (linear.hpp), else the default (each group's own calls).
  void grouped_linear_forward(const LinearGroups& g, const Tensor& x, Tensor& y,
                              std::unique_ptr<LinearState>& state) override {
    // bf16 activations: each group's own calls (their roundings), until CudaLinear's grouped form has them.
    if (bf16() || !linear_.grouped_forward(g, x, y, state, alloc())) Backend::grouped_linear_forward(g, x, y, state);
  }
  void grouped_linear_backward(const LinearGroups& g, const LinearState& state, const Tensor& dy, Tensor& dx,
                               std::span<Tensor> dw_acc, std::span<float* const> db_acc) override {
    if (bf16() || !linear_.grouped_backward(g, state, dy, dx, dw_acc, db_acc, alloc()))
      Backend::grouped_linear_backward(g, state, dy, dx, dw_acc, db_acc);
  }

  // ---- LayerNorm, GELU ----
  void layernorm_forward(const Tensor& x, const float* gamma, const float* beta, float eps, Tensor& y, Tensor& mean,
                         Tensor& rstd, ProducerOutputs* o) override {
    check_shape("layernorm_forward", "y", y, x.rows, x.cols);
    check_size("layernorm_forward", "mean", mean, x.rows);
    check_size("layernorm_forward", "rstd", rstd, x.rows);
    nn::layernorm_forward(x.data, gamma, beta, eps, x.rows, x.cols, y.data, mean.data, rstd.data,
                          bf16_out("layernorm_forward", y, o), nullptr, rounding());
  }
  void layernorm_backward(const Tensor& dy, const Tensor& x, const float* gamma, const Tensor& mean, const Tensor& rstd,
                          Tensor& dx, float* dgamma, float* dbeta, const Tensor* residual,
                          const ProducerOutputs* dy_from) override {
    check_shape("layernorm_backward", "dy", dy, x.rows, x.cols);
    if (residual) check_shape("layernorm_backward", "residual", *residual, x.rows, x.cols);
    check_shape("layernorm_backward", "dx", dx, x.rows, x.cols);
    check_size("layernorm_backward", "mean", mean, x.rows);
    check_size("layernorm_backward", "rstd", rstd, x.rows);
    nn::layernorm_backward(dy.data, x.data, gamma, mean.data, rstd.data, x.rows, x.cols, dx.data, dgamma, dbeta,
                           scratch_, residual ? residual->data : nullptr, nullptr,
                           bf16_in("layernorm_backward dy", dy, dy_from));
  }
  void gelu_forward(const Tensor& x, Tensor& y, ProducerOutputs* o, const ProducerOutputs* x_from) override {
    check_size("gelu_forward", "y", y, x.size());
    const uint16_t* xh = bf16_in("gelu_forward x", x, x_from);
    uint16_t* h = bf16_out("gelu_forward", y, o);
    const std::optional<nn::ProducerAmax> a = producer_amax(o, {x.data, y.data, xh});
    nn::gelu_forward(x.data, y.data, x.size(), h, nullptr, a ? &*a : nullptr, rounding(), xh);
    if (a) o->amax_written = true;
  }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, ProducerOutputs* o, const ProducerOutputs* x_from,
                     const ProducerOutputs* dy_from) override {
    check_size("gelu_backward", "dy", dy, x.size());
    check_size("gelu_backward", "dx", dx, x.size());
    const uint16_t* xh = bf16_in("gelu_backward x", x, x_from);
    const uint16_t* dyh = bf16_in("gelu_backward dy", dy, dy_from);
    uint16_t* h = bf16_out("gelu_backward", dx, o);
    const std::optional<nn::ProducerAmax> a = producer_amax(o, {x.data, dy.data, dx.data, xh, dyh});
    nn::gelu_backward(x.data, dy.data, dx.data, x.size(), h, nullptr, a ? &*a : nullptr, rounding(), xh, dyh);
    if (a) o->amax_written = true;
  }

  // ---- attention ----
  void attention_forward(const AttentionShape& s, const Tensor& qkv, Tensor& out, Tensor& probs, DropoutKey key,
                         ProducerOutputs* o, const ProducerOutputs* qkv_from) override {
    const nn::AttentionDims d = dims(s, qkv, key);
    check_shape("attention_forward", "out", out, qkv.rows, d.width);
    check_shape("attention_forward", "probs", probs, s.batch * s.heads * s.seq,
                attention_saved_cols(s, d.width / d.heads));
    const uint16_t* qh = bf16_in("attention_forward qkv", qkv, qkv_from);
    attention_.forward(d, qkv.data, out.data, probs.data, bf16_out("attention_forward", out, o), qh);
    round_inplace(out);
  }
  void attention_backward(const AttentionShape& s, const Tensor& qkv, const Tensor& probs, const Tensor& dout,
                          Tensor& dqkv, DropoutKey key, ProducerOutputs* o, const ProducerOutputs* qkv_from,
                          const ProducerOutputs* dout_from) override {
    const nn::AttentionDims d = dims(s, qkv, key);
    check_shape("attention_backward", "probs", probs, s.batch * s.heads * s.seq,
                attention_saved_cols(s, d.width / d.heads));
    check_shape("attention_backward", "dout", dout, qkv.rows, d.width);
    check_shape("attention_backward", "dqkv", dqkv, qkv.rows, qkv.cols);
    const uint16_t* qh = bf16_in("attention_backward qkv", qkv, qkv_from);
    const uint16_t* oh = bf16_in("attention_backward dout", dout, dout_from);
    attention_.backward(d, qkv.data, probs.data, dout.data, dqkv.data, bf16_out("attention_backward", dqkv, o), qh,
                        oh);
    round_inplace(dqkv);
  }

  // ---- dropout, add ----
  void dropout_forward(Tensor& x, float p, DropoutKey key) override {
    nn::dropout(x.data, x.size(), p, key.seed, key.stream, nullptr, nullptr, rounding());
  }
  void dropout_backward(Tensor& dy, float p, DropoutKey key) override {
    nn::dropout(dy.data, dy.size(), p, key.seed, key.stream, nullptr, nullptr, rounding());
  }
  void dropout_backward_to(const Tensor& src, Tensor& dst, float p, DropoutKey key, ProducerOutputs* o) override {
    check_shape("dropout_backward_to", "dst", dst, src.rows, src.cols);
    uint16_t* h = bf16_out("dropout_backward_to", dst, o);
    const std::optional<nn::ProducerAmax> a = producer_amax(o, {src.data, dst.data});
    nn::dropout_to(src.data, nullptr, dst.data, src.size(), p, key.seed, key.stream, h, nullptr, a ? &*a : nullptr,
                   rounding());
    if (a) o->amax_written = true;
  }
  void add_dropout_backward_to(Tensor& y, const Tensor& x, Tensor& dst, float p, DropoutKey key,
                               ProducerOutputs* o) override {
    check_shape("add_dropout_backward_to", "x", x, y.rows, y.cols);
    check_shape("add_dropout_backward_to", "dst", dst, y.rows, y.cols);
    uint16_t* h = bf16_out("add_dropout_backward_to", dst, o);
    const std::optional<nn::ProducerAmax> a = producer_amax(o, {y.data, x.data, dst.data});
    nn::dropout_to(y.data, x.data, dst.data, y.size(), p, key.seed, key.stream, h, nullptr, a ? &*a : nullptr,
                   rounding());
    if (a) o->amax_written = true;
  }
  void add_inplace(Tensor& y, const Tensor& x) override {
    check_shape("add_inplace", "x", x, y.rows, y.cols);
    nn::add_inplace(y.data, x.data, y.size());
  }
  void dropout_add(Tensor& y, const Tensor& x, float p, DropoutKey key, const ProducerOutputs* y_from) override {
    check_shape("dropout_add", "x", x, y.rows, y.cols);
    if (const uint16_t* yh = bf16_in("dropout_add y", y, y_from)) {  // a BF16-only branch: the sum in a new tensor
      y = empty(y.rows, y.cols);
      return nn::dropout_add(nullptr, x.data, y.size(), p, key.seed, key.stream, nullptr, rounding(), yh, y.data);
    }
    nn::dropout_add(y.data, x.data, y.size(), p, key.seed, key.stream, nullptr, rounding());  // r(drop(y)) + x
  }

  // ---- embeddings ----
  void embed_forward(const int32_t* idx, int64_t batch, int64_t seq, const Tensor& wte, const Tensor& wpe,
                     Tensor& out) override {
    const int64_t n = batch * seq, C = wte.cols;
    check_ids(idx, n, wte.rows);
    if (wpe.rows < seq || wpe.cols != C)
      throw Error("embedding: wpe [" + std::to_string(wpe.rows) + ", " + std::to_string(wpe.cols) +
                  "] does not cover seq " + std::to_string(seq) + " x width " + std::to_string(C));
    check_shape("embed_forward", "out", out, n, C);
    int32_t* d_idx = ids_up_.put(idx, n);
    nn::embed_forward(d_idx, batch, seq, wte.data, wpe.data, C, out.data);
  }
  void embed_backward(const int32_t* idx, int64_t batch, int64_t seq, const Tensor& dout, Tensor& dwte,
                      Tensor& dwpe) override {
    const int64_t n = batch * seq, C = dout.cols;
    check_ids(idx, n, dwte.rows);
    check_shape("embed_backward", "dout", dout, n, dwte.cols);
    if (dwpe.rows < seq || dwpe.cols != C) throw Error("cuda backend embed_backward: dwpe too small");
    // Group the positions of each token id (counting sort, positions increasing
    // within a group): the GPU then adds each vocabulary row's gradients in the
    // CPU's row order without atomics.
    const int64_t V = dwte.rows;
    count_.assign(size_t(V), 0);
    for (int64_t i = 0; i < n; ++i) ++count_[size_t(idx[i])];
    start_.resize(size_t(V));
    group_rows_.clear();
    group_offsets_.assign(1, 0);
    int32_t acc = 0;
    for (int64_t v = 0; v < V; ++v) {
      start_[size_t(v)] = acc;
      acc += count_[size_t(v)];
      if (count_[size_t(v)] > 0) {
        group_rows_.push_back(int32_t(v));
        group_offsets_.push_back(acc);
      }
    }
    positions_.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) positions_[size_t(start_[size_t(idx[i])]++)] = int32_t(i);
    const int64_t ng = int64_t(group_rows_.size());
    int32_t* d_rows = group_rows_up_.put(group_rows_.data(), ng);
    int32_t* d_off = group_offsets_up_.put(group_offsets_.data(), ng + 1);
    int32_t* d_pos = positions_up_.put(positions_.data(), n);
    nn::embed_backward_grouped(d_rows, d_off, d_pos, ng, dout.data, C, dwte.data);
    nn::rows_mod_sum_acc(dout.data, n, C, seq, dwpe.data);
  }

  void vit_tokens_forward(const Tensor& patches, int64_t batch, const float* cls, const Tensor& pos,
                          Tensor& out) override {
    if (batch <= 0 || patches.rows % batch != 0)
      throw Error("vit_tokens_forward: " + std::to_string(patches.rows) + " patch rows do not split into batch " +
                  std::to_string(batch));
    const int64_t P = patches.rows / batch, C = patches.cols;
    check_shape("vit_tokens_forward", "pos", pos, P + 1, C);
    check_shape("vit_tokens_forward", "out", out, batch * (P + 1), C);
    nn::vit_tokens_forward(patches.data, batch, P, C, cls, pos.data, out.data);
  }
  void vit_tokens_backward(const Tensor& dout, int64_t batch, Tensor& dpatches, float* dcls, Tensor& dpos) override {
    if (batch <= 0 || dout.rows % batch != 0)
      throw Error("vit_tokens_backward: " + std::to_string(dout.rows) + " token rows do not split into batch " +
                  std::to_string(batch));
    const int64_t L = dout.rows / batch, P = L - 1, C = dout.cols;
    check_shape("vit_tokens_backward", "dpatches", dpatches, batch * P, C);
    check_shape("vit_tokens_backward", "dpos", dpos, L, C);
    // dpatches: per image, rows 1..L-1 of its token block (one strided copy).
    if (P > 0)
      check(cudaMemcpy2DAsync(dpatches.data, size_t(P * C) * 4, dout.data + C, size_t(L * C) * 4, size_t(P * C) * 4,
                              size_t(batch), cudaMemcpyDeviceToDevice, nullptr),
            "vit_tokens_backward (cudaMemcpy2DAsync)");
    nn::rows_mod_sum_acc(dout.data, dout.rows, C, L, dpos.data);
    nn::column_sum_acc(dout.data, L * C, batch, C, dcls, scratch_);
  }
  void gather_rows(const Tensor& x, int64_t stride, Tensor& out) override {
    if (out.cols != x.cols || (out.rows > 0 && (out.rows - 1) * stride >= x.rows))
      throw Error("cuda backend gather_rows: out of range");
    nn::gather_rows(x.data, x.cols, stride, out.data, out.rows);
  }
  void scatter_rows(const Tensor& dout, int64_t stride, Tensor& dx) override {
    if (dout.cols != dx.cols || (dout.rows > 0 && (dout.rows - 1) * stride >= dx.rows))
      throw Error("cuda backend scatter_rows: out of range");
    nn::scatter_rows(dout.data, dout.rows, dx.cols, stride, dx.data, dx.rows);
  }

  // ---- fake quantization (cuda/quantize.hpp: sim's bits) ----
  void fake_quantize(Tensor& x, const QuantizerSpec& q) override {
    cuda::fake_quantize_device(q, x.data, x.rows, x.cols, {}, fake_quant_ws_);
  }

  // The dispatch cast's compact rows (train/mx_rows.hpp's codec in nn's kernels: the CPU's bits).
  void encode_rows_mx(const QuantizerSpec& q, const Tensor& x, Tensor& bytes) override {
    const MxRows m = mx_rows_for("cuda backend encode_rows_mx", q, x.rows, x.cols, bytes.size() * 4);
    nn::encode_rows_mx(m, x.data, x.rows, byte_data(bytes));
  }
  void decode_rows_mx(const QuantizerSpec& q, const Tensor& bytes, Tensor& x) override {
    const MxRows m = mx_rows_for("cuda backend decode_rows_mx", q, x.rows, x.cols, bytes.size() * 4);
    nn::decode_rows_mx(m, byte_data(bytes), x.rows, x.data);
  }
  // distributed.reduce bf16's element rules (train/bf16_codes.hpp) in grad_reduce_ops.cu's kernels.
  void round_bf16_codes(const Tensor& x, Tensor& codes) override {
    nn::round_bf16_codes("cuda backend round_bf16_codes", x.data, x.size(), reinterpret_cast<uint16_t*>(codes.data),
                         codes.size() * 4);
  }
  void sum_bf16_codes(const Tensor& codes, int64_t rows, Tensor& out) override {
    nn::sum_bf16_codes("cuda backend sum_bf16_codes", reinterpret_cast<const uint16_t*>(codes.data), codes.size() * 4,
                       rows, out.size(), out.data);
  }

  // ---- mixture-of-experts routing (host indices and weights uploaded) ----
  void gather_rows_indexed(const Tensor& x, const int32_t* idx, Tensor& out) override {
    check_same_cols("gather_rows_indexed", x, out);
    check_row_indices("gather_rows_indexed", idx, out.rows, x.rows);
    nn::gather_rows_indexed(x.data, x.cols, moe_idx_up_.put(idx, out.rows), out.data, out.rows);
  }
  void combine_rows(const Tensor& src, const int32_t* pos, const float* w, int64_t k, Tensor& out) override {
    check_same_cols("combine_rows", src, out);
    check_row_indices("combine_rows", pos, out.rows * k, src.rows);
    const float* dw = w ? moe_w_up_.put(w, out.rows * k) : nullptr;
    nn::combine_rows(src.data, src.cols, moe_pos_up_.put(pos, out.rows * k), dw, k, out.data, out.rows);
  }
  void combine_rows_backward(const Tensor& dout, const Tensor& src, const int32_t* pos, const float* w, int64_t k,
                             Tensor& dsrc, float* dw) override {
    check_same_cols("combine_rows_backward", src, dout);
    check_same_cols("combine_rows_backward", src, dsrc);
    const int64_t slots = dout.rows * k;
    const int64_t named = check_row_indices("combine_rows_backward", pos, slots, src.rows);
    float* d_dw = reserve(moe_dw_, size_t(std::max<int64_t>(slots, 1)));
    nn::combine_rows_backward(dout.data, src.data, src.cols, moe_pos_up_.put(pos, slots), moe_w_up_.put(w, slots), k,
                              dout.rows, dsrc.data, src.rows, named == src.rows, d_dw);
    if (slots > 0)
      check(cudaMemcpy(dw, d_dw, size_t(slots) * sizeof(float), cudaMemcpyDeviceToHost), "combine_rows_backward (dw)");
  }

  // ---- mixture-of-experts routing on the device (train/cuda/moe_route.hpp):
  // route()'s bits with no host index arrays. Dropless: the one wait is
  // moe_route's download of the E counts (with the losses), whose host offsets
  // the grouped linear needs. Capacity: the offsets are e * capacity and the
  // step waits for nothing; the summary is downloaded when first asked for
  // (after the step, for metrics.jsonl). A state's arrays live in one pooled
  // block. ----
  std::unique_ptr<RouteState> moe_route(const RouteParams& p, const Tensor& logits) override {
    check_shape("moe_route", "logits", logits, logits.rows, p.experts);
    const int64_t N = logits.rows, E = p.experts;
    auto s = std::make_unique<CudaRouteState>();
    const int64_t cap = expert_capacity(p, N);
    s->mem = empty(1, int64_t((nn::route_bytes(N, E, p.top_k, cap) + 3) / 4));
    s->d = nn::route_layout(s->mem.data, N, E, p.top_k, cap);
    nn::route(logits.data, s->d, p.normalize_top_k, p.aux_loss, p.z_loss);
    s->params = p;
    s->tokens = N;
    // Dropless: the group sizes are the counts (the wait); capacity: cap rows each.
    const std::vector<int64_t> sizes = cap > 0 ? std::vector<int64_t>(size_t(E), cap) : s->summary().count;
    s->offset.assign(size_t(E + 1), 0);
    for (int64_t e = 0; e < E; ++e) s->offset[size_t(e + 1)] = s->offset[size_t(e)] + sizes[size_t(e)];
    // One process (RouteState's defaults for a shard of one).
    s->shard = ExpertShard{1, 0, E};
    s->global_tokens = s->grad_tokens = N;
    s->send_rows = s->recv_rows = {s->offset.back()};
    s->expert_offset = s->offset;
    return s;
  }
  // Expert parallelism's routing: train/cuda/route_state.hpp.
  std::unique_ptr<RouteState> moe_route_local(const RouteParams& p, const Tensor& logits) override {
    return expert_parallel_route_local(*this, p, logits);
  }
  std::vector<int64_t> moe_route_counts(const RouteState& r) override { return expert_parallel_counts(r); }
  std::vector<double> moe_route_partials(const RouteState& r) override { return expert_parallel_partials(r); }
  void moe_route_finish(RouteState& r, const ExpertShard& shard, std::vector<int64_t> count_all,
                        const std::vector<double>& block_sums_all, int64_t grad_tokens) override {
    expert_parallel_finish(*this, r, shard, std::move(count_all), block_sums_all, grad_tokens);
  }
  void moe_reorder(const Tensor& received, const RouteState& r, Tensor& grouped) override {
    expert_parallel_reorder(r, received, grouped);
  }
  void moe_unreorder(const Tensor& grouped, const RouteState& r, Tensor& back) override {
    expert_parallel_unreorder(r, grouped, back);
  }
  void moe_gather(const Tensor& x, const RouteState& r, Tensor& grouped) override {
    const nn::RouteDevice& d = device_route(r).d;
    check_shape("moe_gather", "x", x, d.tokens, x.cols);
    check_shape("moe_gather", "grouped", grouped, d.rows, x.cols);
    nn::gather_rows_indexed(x.data, x.cols, d.token, grouped.data, grouped.rows);
  }
  void moe_combine(const Tensor& src, const RouteState& r, bool gated, Tensor& out) override {
    const nn::RouteDevice& d = device_route(r).d;
    check_shape("moe_combine", "src", src, d.rows, out.cols);
    check_shape("moe_combine", "out", out, d.tokens, src.cols);
    nn::combine_rows(src.data, src.cols, d.pos, gated ? d.gate : nullptr, d.k, out.data, d.tokens);
  }
  void moe_combine_backward(const Tensor& dout, const Tensor& src, RouteState& r, Tensor& dsrc) override {
    CudaRouteState& c = device_route(r);
    const nn::RouteDevice& d = c.d;
    check_shape("moe_combine_backward", "dout", dout, d.tokens, src.cols);
    check_shape("moe_combine_backward", "src", src, d.rows, dout.cols);
    check_shape("moe_combine_backward", "dsrc", dsrc, src.rows, src.cols);
    nn::combine_rows_backward(dout.data, src.data, src.cols, d.pos, d.gate, d.k, d.tokens, dsrc.data, d.rows,
                              d.capacity == 0, d.dgate);
    c.dgate_written = true;
  }
  void moe_router_grad(const RouteState& r, float loss_scale, Tensor& dlogits) override {
    const CudaRouteState& c = device_route(r);
    FP4LAB_CHECK(c.dgate_written, "cuda backend moe_router_grad: no moe_combine_backward before it");
    check_shape("moe_router_grad", "dlogits", dlogits, c.d.tokens, c.d.experts);
    nn::router_grad(c.d, c.params.normalize_top_k, c.params.aux_loss, c.params.z_loss, loss_scale, c.global_tokens,
                    c.grad_tokens, dlogits.data);
  }
  Routing moe_download(const RouteState& r, std::vector<float>* dgate) override {
    const CudaRouteState& c = device_route(r);
    const nn::RouteDevice& d = c.d;
    const int64_t N = d.tokens, E = d.experts, M = N * d.k;
    auto get = [](auto& v, const auto* src, int64_t n) {
      v.resize(size_t(n));
      if (n > 0) check(cudaMemcpy(v.data(), src, size_t(n) * sizeof(v[0]), cudaMemcpyDeviceToHost), "moe_download");
    };
    Routing h;
    h.tokens = N, h.experts = E, h.k = d.k;
    get(h.probs, d.probs, N * E);
    get(h.lse, d.lse, N);
    get(h.expert, d.expert, M);
    get(h.gate, d.gate, M);
    get(h.pos, d.pos, M);
    get(h.token, d.token, d.rows);
    const RouteSummary& m = c.summary();
    h.count = m.count;  // one process: the counts are the global counts
    h.shard = c.shard;
    h.count_all = h.global_count = m.count;
    if (c.host) {  // expert parallelism: the grouping's figures as route_group made them
      h.count = c.host->count, h.count_all = c.host->count_all, h.global_count = c.host->global_count;
      h.recv_index = c.host->recv_index;
    }
    h.global_tokens = c.global_tokens, h.grad_tokens = c.grad_tokens;
    h.send_rows = c.send_rows, h.recv_rows = c.recv_rows, h.expert_offset = c.expert_offset;
    h.capacity = m.capacity, h.dropped = m.dropped;
    h.offset = c.offset;
    h.aux_loss = m.aux_loss, h.z_loss = m.z_loss;
    if (dgate) {
      dgate->clear();
      if (c.dgate_written) get(*dgate, d.dgate, M);
    }
    return h;
  }

  // ---- loss ----
  // Launched by cross_entropy_start (targets uploaded, per-row losses and hits
  // copied into pinned memory behind an event); cross_entropy_finish waits for
  // the event and sums on the host.
  double cross_entropy(const Tensor& logits, const int32_t* targets, Tensor* dlogits, int64_t* correct) override {
    cross_entropy_start(logits, targets, dlogits);
    return cross_entropy_finish(correct);
  }
  void cross_entropy_start(const Tensor& logits, const int32_t* targets, Tensor* dlogits) override {
    // An unfinished start's copies may still be writing the pinned buffers
    // that this one may reallocate.
    if (ce_pending_ && ce_rows_ > 0) ce_done_.wait("cross_entropy (the unfinished previous start)");
    ce_pending_ = false;
    const int64_t n = logits.rows, v = logits.cols;
    for (int64_t r = 0; r < n; ++r)
      if (targets[r] < 0 || targets[r] >= v)
        throw Error("cross_entropy: target " + std::to_string(targets[r]) + " outside [0, " + std::to_string(v) + ")");
    if (dlogits) check_shape("cross_entropy", "dlogits", *dlogits, n, v);
    ce_rows_ = n;
    if (n > 0) {
      int32_t* d_t = targets_up_.put(targets, n);
      double* d_loss = reserve(loss_rows_, size_t(n));
      uint8_t* d_ok = reserve(ok_rows_, size_t(n));
      nn::cross_entropy_rows(logits.data, d_t, n, v, 1.0f / float(n), dlogits ? dlogits->data : nullptr, d_loss, d_ok,
                             nullptr, rounding());
      check(cudaMemcpyAsync(loss_host_.at_least(size_t(n)), d_loss, size_t(n) * sizeof(double), cudaMemcpyDeviceToHost,
                            nullptr),
            "cross_entropy (download losses)");
      check(cudaMemcpyAsync(ok_host_.at_least(size_t(n)), d_ok, size_t(n), cudaMemcpyDeviceToHost, nullptr),
            "cross_entropy (download hits)");
      ce_done_.record(nullptr);
    }
    ce_pending_ = true;
  }
  double cross_entropy_finish(int64_t* correct) override {
    if (!ce_pending_) throw Error("cross_entropy_finish: no cross_entropy_start to finish");
    ce_pending_ = false;
    const int64_t n = ce_rows_;
    if (n == 0) {
      if (correct) *correct = 0;
      return std::numeric_limits<double>::quiet_NaN();  // the CPU's 0/0 as well
    }
    ce_done_.wait("cross_entropy (waiting for the losses)");
    // The CPU's float64 row-order mean.
    double s = 0.0;
    int64_t c = 0;
    for (int64_t r = 0; r < n; ++r) s += loss_host_.data()[r], c += ok_host_.data()[r];
    if (correct) *correct = c;
    return s / double(n);
  }

  // ---- optimiser ----
  double sum_squares(const Tensor& g) override { return nn::sum_squares(g.data, g.size(), scratch_); }
  void scale(Tensor& g, float s) override { nn::scale(g.data, g.size(), s); }
  void adamw_step(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, std::span<const IndexRange> decayed, float lr,
                  float b1, float b2, float eps, float wd, int64_t t, float grad_scale, MomentStorage moments) override {
    const nn::AdamWConstants k = adamw_constants(p, g, m, v, decayed, lr, b1, b2, eps, wd, t, grad_scale, moments);
    nn::adamw_step(p.data, g.data, m.data, v.data, decay_mask(k, decayed, p.size()), p.size(), k);
  }
  // The norm and the clip factor on the device (nn::clip_record), the step reading the factor there; the norm
  // comes back by an asynchronous copy waited for after the step is queued.
  double adamw_step_clipped(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, std::span<const IndexRange> decayed,
                            float lr, float b1, float b2, float eps, float wd, int64_t t, double grad_clip,
                            MomentStorage moments) override {
    const nn::AdamWConstants k = adamw_constants(p, g, m, v, decayed, lr, b1, b2, eps, wd, t, 1.0f, moments);
    const uint8_t* d_decay = decay_mask(k, decayed, p.size());
    nn::ClipRecord* rec = reserve(clip_dev_, 1);
    nn::clip_record(g.data, g.size(), grad_clip, scratch_, rec);
    check(cudaMemcpyAsync(clip_host_.at_least(1), rec, sizeof(nn::ClipRecord), cudaMemcpyDeviceToHost, nullptr),
          "adamw_step_clipped (the norm)");
    clip_done_.record(nullptr);
    nn::adamw_step(p.data, g.data, m.data, v.data, d_decay, p.size(), k, nullptr, &rec->grad_scale);
    clip_done_.wait("adamw_step_clipped (waiting for the norm)");
    return clip_host_.data()->norm;
  }

 private:
  // adamw_step's checks and its host constants (the CPU backend's, computed identically).
  nn::AdamWConstants adamw_constants(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                                     std::span<const IndexRange> decayed, float lr, float b1, float b2, float eps,
                                     float wd, int64_t t, float grad_scale, MomentStorage moments) {
    const int64_t n = p.size();
    check_size("adamw_step", "grad", g, n);
    check_size("adamw_step", "m", m, moment_floats(moments, n));
    check_size("adamw_step", "v", v, moment_floats(moments, n));
    check_ranges("cuda backend adamw_step (decayed)", decayed, n);
    nn::AdamWConstants k;
    k.beta1 = b1;
    k.beta2 = b2;
    k.eps = eps;
    // The CPU backend's host constants, computed identically.
    const float bc1 = float(1.0 - std::pow(double(b1), double(t)));
    k.bc2s = float(std::sqrt(1.0 - std::pow(double(b2), double(t))));
    k.step = lr / bc1;
    k.shrink = 1.0f - lr * wd;
    k.apply_decay = wd != 0.0f;
    k.grad_scale = grad_scale;
    k.bf16_moments = moments == MomentStorage::bf16;
    return k;
  }
  // The step's byte mask of decayed elements (null without weight decay).
  const uint8_t* decay_mask(const nn::AdamWConstants& k, std::span<const IndexRange> decayed, int64_t n) {
    const uint8_t* d_decay = nullptr;
    if (k.apply_decay) {
      // The kernel reads a byte mask; it is rebuilt on the device only when the
      // ranges change (comparing the ranges costs nothing next to the step).
      if (decay_mask_n_ != n ||
          !std::equal(decayed.begin(), decayed.end(), decay_ranges_.begin(), decay_ranges_.end())) {
        uint8_t* d = reserve(decay_dev_, size_t(n));
        check(cudaMemsetAsync(d, 0, size_t(n), nullptr), "adamw_step (decay mask)");
        for (const IndexRange& r : decayed)
          check(cudaMemsetAsync(d + r.offset, 1, size_t(r.size), nullptr), "adamw_step (decay mask)");
        decay_ranges_.assign(decayed.begin(), decayed.end());
        decay_mask_n_ = n;
      }
      d_decay = decay_dev_.data();
    }
    return d_decay;
  }

  bool bf16() const { return activations() == ActivationPrecision::bf16; }
  // How producers store their FP32 outputs in this pass (nn::OutputRounding).
  nn::OutputRounding rounding() const { return bf16() ? nn::OutputRounding::bf16 : nn::OutputRounding::none; }
  // r() of t's values in place under bf16 activations, one pass (a no-op in fp32 mode, or where t holds no FP32
  // values: its producer's BF16 output is the same rounding).
  void round_inplace(const Tensor& t) {
    if (bf16() && t.data != nullptr) nn::round_bf16_inplace(t.data, t.size());
  }
  // An owned copy of t, rounded in the copy's pass (t with data null: t itself, its consumer reads its
  // producer's BF16).
  Tensor rounded_copy(const Tensor& t) {
    if (t.data == nullptr) return t;
    Tensor c = empty(t.rows, t.cols);
    nn::copy_round_bf16(t.data, c.data, t.size());
    return c;
  }
  // The BF16 output the producer of y writes for o (marked written), or null
  // where o wants none. y (the FP32 output) must have o's shape; its data may
  // be null only when o drops the FP32 values (ProducerOutputs::f32).
  uint16_t* bf16_out(const char* op, const Tensor& y, ProducerOutputs* o) const {
    if (o == nullptr) {
      FP4LAB_CHECK(y.data || y.size() == 0, std::string(op) + ": an output without FP32 values needs its producer outputs");
      return nullptr;
    }
    FP4LAB_CHECK(o->rows == y.rows && o->cols == y.cols, std::string(op) + ": producer outputs of another shape");
    FP4LAB_CHECK(o->f32 == (y.data != nullptr || y.size() == 0) && (o->f32 || o->bf16),
                 std::string(op) + ": FP32 output present iff ProducerOutputs::f32, and BF16 where it is dropped");
    o->bf16_written = o->bf16 != nullptr;
    o->rounded = bf16();  // every producer calling this applies rounding() to its FP32 output
    return o->bf16;
  }
  // BF16 storage (Bf16Edge): the BF16 buffer a linear layer writes its output into alone, where out asks for
  // that (f32 false, only under bf16 activations: stores_bf16), marked written and rounded; else null.
  uint16_t* bf16_storage(const char* op, ProducerOutputs* out) const {
    if (out == nullptr || out->f32) return nullptr;
    FP4LAB_CHECK(bf16() && out->bf16, std::string(op) + ": BF16 storage asked for outside bf16 activations");
    out->bf16_written = out->rounded = true;
    return out->bf16;
  }
  // The BF16 values an op reads for its input t where t has no FP32 values (BF16 storage: its producer
  // wrote them into `from`); null where it reads t's FP32 values.
  static const uint16_t* bf16_in(const char* what, const Tensor& t, const ProducerOutputs* from) {
    if (t.data != nullptr || t.size() == 0) return nullptr;
    FP4LAB_CHECK(from && from->bf16_written && from->rows == t.rows && from->cols == t.cols,
                 std::string(what) + ": an input without FP32 values needs its producer's written BF16 of its shape");
    return from->bf16;
  }
  // The ProducerAmax of o's amax words, where o wants them and the producer
  // (its FP32 tensors at ptrs) can compute them (nn::producer_amax_fits);
  // else nothing (the linear layer then computes the amaxes).
  // Under bf16 activations the producer rounds in the same pass, so the amaxes are of the rounded values, which
  // the layer reads.
  std::optional<nn::ProducerAmax> producer_amax(const ProducerOutputs* o,
                                                std::initializer_list<const void*> ptrs) const {
    if (o == nullptr || o->amax == nullptr || !nn::producer_amax_fits(o->rows, o->cols, ptrs))
      return std::nullopt;
    nn::ProducerAmax a;
    a.words = o->amax;
    a.rows = o->rows;
    a.cols = o->cols;
    a.rht = o->request.rht;
    if (a.rht) {
      const std::array<float, 16> s = rht_signs(o->request.rht_seed);
      std::copy(s.begin(), s.end(), a.signs);
    }
    return a;
  }
  std::function<Tensor(int64_t, int64_t)> alloc() {
    return [this](int64_t r, int64_t c) { return empty(r, c); };
  }
  static nn::AttentionDims dims(const AttentionShape& s, const Tensor& qkv, DropoutKey key) {
    if (s.heads <= 0 || qkv.cols % 3 != 0 || (qkv.cols / 3) % s.heads != 0 || qkv.rows != s.batch * s.seq)
      throw Error("attention: qkv [" + std::to_string(qkv.rows) + ", " + std::to_string(qkv.cols) +
                  "] does not fit batch " + std::to_string(s.batch) + " x seq " + std::to_string(s.seq) + ", " +
                  std::to_string(s.heads) + " heads");
    nn::AttentionDims d;
    d.batch = s.batch;
    d.seq = s.seq;
    d.heads = s.heads;
    d.width = qkv.cols / 3;
    d.causal = s.causal;
    d.scale = s.scale;
    d.dropout = s.dropout;
    d.bf16_flash = s.bf16_flash;
    d.seed = key.seed;
    d.stream_id = key.stream;
    return d;
  }
  static void check_ids(const int32_t* idx, int64_t n, int64_t vocab) {
    for (int64_t i = 0; i < n; ++i)
      if (idx[i] < 0 || idx[i] >= vocab)
        throw Error("embedding: token id " + std::to_string(idx[i]) + " outside the vocabulary [0, " +
                    std::to_string(vocab) + ")");
  }
  // Host values (int32 ids, float weights) -> a reusable device buffer, without blocking the host:
  // through a pinned staging buffer and an async copy on the stream (a copy
  // from pageable memory may wait for the stream's queued work). The staging
  // buffer is rewritten only after its previous copy has completed.
  template <class T>
  struct HostUpload {
    DeviceBuffer<T> dev;
    fp4lab::cuda::PinnedBuffer<T> host;
    fp4lab::cuda::Event done;
    T* put(const T* src, int64_t n) {
      T* d = reserve(dev, size_t(std::max<int64_t>(n, 1)));
      if (n > 0) {
        done.wait("cuda backend (upload of host values: previous copy)");
        T* h = host.at_least(size_t(n));
        std::memcpy(h, src, size_t(n) * sizeof(T));
        check(cudaMemcpyAsync(d, h, size_t(n) * sizeof(T), cudaMemcpyHostToDevice, nullptr),
              "cuda backend (upload of host values)");
        done.record(nullptr);
      }
      return d;
    }
  };

  std::shared_ptr<DevicePool> pool_;  // first member: destroyed last
  nn::Scratch scratch_;
  nn::Attention attention_;
  CudaLinear linear_;
  using IntUpload = HostUpload<int32_t>;
  IntUpload ids_up_, group_rows_up_, group_offsets_up_, positions_up_, targets_up_, moe_idx_up_, moe_pos_up_;
  HostUpload<float> moe_w_up_;
  cuda::QuantWorkspace fake_quant_ws_;  // fake_quantize's
  DeviceBuffer<float> moe_dw_;
  DeviceBuffer<double> loss_rows_;
  DeviceBuffer<uint8_t> ok_rows_, decay_dev_;
  fp4lab::cuda::PinnedBuffer<uint8_t> ok_host_;
  std::vector<IndexRange> decay_ranges_;  // what decay_dev_ holds, for a buffer of decay_mask_n_ elements
  int64_t decay_mask_n_ = -1;
  fp4lab::cuda::PinnedBuffer<double> loss_host_;
  fp4lab::cuda::Event ce_done_;
  DeviceBuffer<nn::ClipRecord> clip_dev_;  // adamw_step_clipped's record, read by the step
  fp4lab::cuda::PinnedBuffer<nn::ClipRecord> clip_host_;
  fp4lab::cuda::Event clip_done_;
  int64_t ce_rows_ = 0;
  bool ce_pending_ = false;
  std::vector<int32_t> count_, start_, group_rows_, group_offsets_, positions_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() {
  if (!fp4lab::cuda::gpu_available()) throw Error("backend \"cuda\": no CUDA device found (valid backends here: cpu)");
  return std::make_unique<CudaBackend>();
}

}  // namespace fp4lab::train
