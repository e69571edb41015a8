// The trainer's models, written once against the Backend interface with
// manual forward and backward passes (no autograd).
//
// vit: fp4-trainkit's one-block ViT on MNIST (vuiseng9/fp4-trainkit,
//   examples/models/vit.py TinyViT/ViTOneBlock + examples/models/transformer_block.py):
//   patch 7x7 -> width 64 (a Conv2d with stride = kernel, i.e. a linear layer on
//   flattened patches, named "patch_embed"), [CLS] token + learned position
//   embedding (trunc_normal std 0.02), one pre-LN block: attention with separate
//   q_proj/k_proj/v_proj/o_proj (4 heads, dropout 0.1 on the attention
//   probabilities, score scale sqrt(head_dim) as their `1 / (dh ** -0.5)`), MLP
//   up_proj (ratio 2) -> GELU -> dropout -> down_proj -> dropout, no final
//   LayerNorm, classification head "head" on the [CLS] token. Linear layers use
//   PyTorch's default init U(+-1/sqrt(fan_in)) for weights and biases.
// gpt: nanoGPT (karpathy/nanoGPT model.py): token + position embeddings, pre-LN
//   blocks (ln_1, c_attn [3C x C], causal attention, c_proj; ln_2, c_fc [4C x C],
//   GELU, c_proj [C x 4C]), dropout on embeddings, attention probabilities and
//   both residual branches, final ln_f, lm_head tied to the token embedding.
//   Init N(0, 0.02), c_proj weights N(0, 0.02/sqrt(2 n_layer)); bias as configured
//   (nanoGPT's train.py default bias=False: LayerNorms without bias, linears without bias).
//
// Every linear layer goes through the recipe (Backend::linear_forward) with a
// stable layer id (declaration order) and a name matched by the recipe's
// keep_high_precision patterns.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/backend.hpp"
#include "train/params.hpp"
#include "recipes/recipe.hpp"

namespace fp4lab::train {

// A GPT whose MLPs are mixtures of experts (train/moe.hpp); experts = 0: the dense MLP.
struct MoeConfig {
  int64_t experts = 0;
  int64_t top_k = 2;
  int64_t expert_hidden = 0;   // 0: 4 * width / top_k (the dense MLP's active parameters per token)
  bool shared_expert = false;  // one more expert (expert_hidden wide) that every token goes through
  bool normalize_top_k =
      true;  // gates: the top-k probabilities renormalised to sum 1 (Mixtral); false: as they are (Switch)
  double aux_loss = 0.01;        // load-balancing loss coefficient alpha: alpha E sum_e f_e P_e (Switch Transformer)
  double z_loss = 0.001;         // router z-loss coefficient beta: beta mean_t logsumexp(router logits of t)^2 (ST-MoE)
  bool quantize_router = false;  // false: the router is plain FP32 whatever the recipe (every anchor keeps it so)
  // How slots reach the experts (train/route.hpp): dropless (every slot; the groups' sizes change with the
  // routing) or capacity (at most expert_capacity slots an expert, the rest dropped and counted; fixed shapes).
  enum class Dispatch : uint8_t { dropless, capacity };
  Dispatch dispatch = Dispatch::dropless;
  double capacity_factor = 1.25;  // capacity dispatch: rows an expert = ceil(factor * N k / E), rounded up to 16
  // The precision of the rows on their way to the experts, as torchao's MXFP8 expert-parallel dispatch sends
  // them (train/moe.hpp "dispatch cast"): none (FP32), or mxfp8 (the experts' inputs in the forward and their
  // output gradients in the backward fake-quantized with the mxfp8 recipe's fwd_x quantizer: E4M3 in [1, 32]
  // blocks along the width, E8M0 scales rounded up; the gradients leaving the experts and the outputs coming
  // back stay FP32). In one process too, so that expert parallelism equals it.
  enum class DispatchCast : uint8_t { none, mxfp8 };
  DispatchCast dispatch_cast = DispatchCast::none;
  bool operator==(const MoeConfig&) const = default;
  RouteParams route_params() const {
    return {experts, top_k, normalize_top_k, aux_loss, z_loss, dispatch == Dispatch::capacity ? capacity_factor : 0.0};
  }
};

struct ModelConfig {
  std::string type = "gpt";  // "vit" | "gpt"
  // common
  int64_t layers = 1, heads = 4, width = 64;
  double dropout = 0.0;
  bool bias = true;
  double layernorm_eps = 1e-5;
  // model.attention, parsed once (train/config.cpp): "fp32", the FP32 attention
  // (materialised probabilities); "bf16_flash", the BF16 flash attention
  // (train/cuda/attention_flash.cu on the CUDA backend, its twin
  // train/cpu/attention_flash.cpp on the CPU; head dims 16, 32, 64, 128).
  // Not given: "bf16_flash" for a GPT whose head dim it takes, else "fp32"
  // (ViT: "fp32"). Its element bound: docs/DESIGN.md, "Flash attention";
  // the 3-seed check behind the default: docs/results/attention_flash.md.
  enum class Attention : uint8_t { fp32, bf16_flash };
  Attention attention = Attention::fp32;
  // vit
  int64_t image_size = 28, patch_size = 7, channels = 1, classes = 10;
  double mlp_ratio = 2.0;
  std::string attn_scale = "inv_sqrt_head_dim";  // or "sqrt_head_dim" (fp4-trainkit's)
  // gpt
  int64_t vocab_size = 65, context = 64;
  MoeConfig moe;
};

// One training or evaluation batch on the host.
struct Batch {
  int64_t size = 0;              // images or sequences
  std::vector<float> images;     // vit: [size, channels*image_size^2], already normalised
  std::vector<int32_t> tokens;   // gpt: [size, context]
  std::vector<int32_t> targets;  // vit: [size] labels; gpt: [size, context] next tokens
};

struct StepContext {
  const Recipe* recipe = nullptr;  // nullptr = plain FP32
  uint64_t seed = 0;               // stochastic rounding + dropout
  uint64_t step = 0;
  bool train = true;        // dropout on
  bool backward = true;     // a backward pass follows (Model::evaluate clears it: forward only)
  float loss_scale = 1.0f;  // the loss gradient's factor (training.loss_scale)
  // Per-layer recipes (config layer_recipes / eval_recipe, train/layer_recipes.hpp):
  // entry i is the recipe of the linear layer with id i (nullptr: plain FP32).
  // Null: every layer runs `recipe`.
  const std::vector<const Recipe*>* layer_recipes = nullptr;
  // Producers write what their consumer linear layers read (BF16 operands,
  // NVFP4 amaxes: outputs_for). False: none, every layer makes its
  // operands itself. The same bits either way (tested: a producer's output only
  // replaces the layer's identical work).
  bool producer_outputs = true;
  // The activations' precision (config precision.activations; Backend's
  // contract in train/backend.hpp): CrossEntropyModel sets it on the backend
  // at the start of every pass.
  ActivationPrecision activations = ActivationPrecision::fp32;
  // BF16 storage of linear outputs read by non-linear ops (Bf16Edge, train/backend.hpp): the edges the model
  // asks for (bf16_edge_bit of each), where the backend does it (Backend::stores_bf16). Cleared bits: that
  // edge keeps the FP32 output. The same bits either way (tests/train/cuda/test_backend.cpp compares them).
  uint32_t bf16_storage = kAllBf16Edges;
  bool stores_bf16(Bf16Edge e) const { return (bf16_storage & bf16_edge_bit(e)) != 0; }
};

struct LinearLayerInfo {
  std::string name;
  uint64_t id = 0;
  int64_t in = 0, out = 0;
  int weight_param = -1;  // ParamStore index of its [out, in] weight; -1: tied to another use (GPT's lm_head = wte)
};

// Operand capture (config output.capture_step): at training step `step` each
// linear layer hands its operands (x and W in the forward, dy in the backward,
// FP32 as the layer receives them, before any quantization) to `save` with
// the name "<layer>.<x|w|dy>".
struct OperandCapture {
  int64_t step = -1;  // -1: none
  std::function<void(const std::string& name, const Tensor& t)> save;
};

// What a task evaluates batches with (task.hpp): the mean loss of batch b,
// argmax hits in *correct (vit). A Model, or under expert parallelism every
// rank's share of b, summed over the ranks (ShareEvaluator, train/dist/data_parallel.hpp).
class BatchEvaluator {
 public:
  virtual ~BatchEvaluator() = default;
  virtual double evaluate(const Batch& b, const StepContext& ctx, int64_t* correct) = 0;
};

class Model : public BatchEvaluator {
 public:
  void set_capture(OperandCapture c) { capture_ = std::move(c); }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  // Forward + backward: returns the mean loss; ADDS the gradients to
  // params().grads (the caller zeroes them). *correct: argmax hits (vit).
  // The GPT releases what its forward saved as the backward consumes it, so
  // nothing of the step stays allocated after it.
  virtual double forward_backward(const Batch& b, const StepContext& ctx, int64_t* correct) = 0;
  // Forward only (no dropout when ctx.train is false; the linear layers run
  // with LinearContext::backward false): mean loss, hits. The GPT holds one
  // block's tensors at a time.
  double evaluate(const Batch& b, const StepContext& ctx, int64_t* correct) override = 0;
  virtual std::vector<LinearLayerInfo> linear_layers() const = 0;
  // Figures of the last training forward beyond the loss, for metrics.jsonl
  // (the MoE GPT: auxiliary losses and expert load); empty by default.
  virtual nlohmann::json step_metrics() const { return nlohmann::json::object(); }
  // Work per sample (an image or a token) for throughput figures.
  virtual int64_t items_per_sample() const = 0;
  // The parameters in units that ZeRO-3 gathers whole (train/dist/sharded_params.hpp), in forward order;
  // the first is the root, used at both ends of the pass (gathered for a whole step). Every parameter in
  // exactly one unit. Default: one unit of everything.
  virtual std::vector<std::vector<int>> param_units() const {
    std::vector<int> all(params_.infos().size());
    std::iota(all.begin(), all.end(), 0);
    return {all};
  }

 protected:
  // Hands operand `what` of layer `layer` to the capture at its step (training passes only).
  void capture(const std::string& layer, const char* what, const StepContext& s, const Tensor& t) const {
    if (capture_.save && s.train && s.backward && int64_t(s.step) == capture_.step)
      capture_.save(layer + "." + what, t);
  }
  ParamStore params_;
  OperandCapture capture_;
};

// A model whose loss is the cross-entropy of its logits (both of ours):
// forward_backward and evaluate in terms of the model's forward (logits) and
// backward (from dlogits).
class CrossEntropyModel : public Model {
 public:
  double forward_backward(const Batch& b, const StepContext& s, int64_t* correct) override {
    be_.set_activations(s.activations);
    Tensor logits = forward(b, s);
    Tensor dlogits = be_.empty(logits.rows, logits.cols);
    // The backward pass is issued before the loss is waited for (a GPU keeps
    // running while the host reads it).
    be_.cross_entropy_start(logits, b.targets.data(), &dlogits);
    if (s.loss_scale != 1.0f) be_.scale(dlogits, s.loss_scale);
    backward(b, s, dlogits);
    return be_.cross_entropy_finish(correct);
  }
  double evaluate(const Batch& b, const StepContext& s, int64_t* correct) override {
    StepContext fwd = s;
    fwd.backward = false;  // the layers prepare no backward operand
    be_.set_activations(s.activations);
    Tensor logits = forward(b, fwd);
    return be_.cross_entropy(logits, b.targets.data(), nullptr, correct);
  }

 protected:
  explicit CrossEntropyModel(Backend& be) : be_(be) {}
  virtual Tensor forward(const Batch& b, const StepContext& s) = 0;
  virtual void backward(const Batch& b, const StepContext& s, const Tensor& dlogits) = 0;
  Backend& be_;
};

class ExpertExchange;  // train/moe.hpp
// `ep`: expert parallelism (the MoE GPT only): the model holds its rank's
// experts (ParamStore::set_expert_parallel) and its MoE layers exchange tokens
// through `ep`, which outlives the model. Null: one process's model.
std::unique_ptr<Model> make_model(const ModelConfig& cfg, Backend& be, uint64_t seed, ExpertExchange* ep = nullptr);
std::unique_ptr<Model> make_vit(const ModelConfig& cfg, Backend& be, uint64_t seed);
std::unique_ptr<Model> make_gpt(const ModelConfig& cfg, Backend& be, uint64_t seed, ExpertExchange* ep = nullptr);

// Helper shared by the models: one linear layer's bookkeeping.
struct LinearLayer {
  std::string name;
  uint64_t id = 0;
  int w = -1, b = -1;  // parameter indices (b = -1: no bias)
  std::unique_ptr<LinearState> state;
  // The layer's plan for the current pass: plan(s, ps) at the start of every
  // forward (a training step's, whose backward uses it too, or an
  // evaluation's); every backend call of the pass takes it. ps: the model's
  // parameters, whose storage of the weight the plan takes (a weight stored as
  // a cast is W's operand as it is: LinearContext::weight_cast, and its
  // backend form, LayerPlan::w_stored).
  LayerPlan lp;
  void plan(const StepContext& s, const ParamStore& ps) {
    LinearContext c = context(s);
    if (w >= 0) c.weight_cast = ps.cast_spec(w);
    lp = plan_layer(c);
    if (w >= 0) lp.w_stored = ps.stored(w);
  }
  // Throws InternalError unless lp was planned for s's step and seed with a backward (a backward needs its
  // forward's plan).
  void check_backward_plan(const StepContext& s) const {
    FP4LAB_CHECK(
        lp.ctx.recipe == context(s).recipe && lp.ctx.step == s.step && lp.ctx.seed == s.seed && lp.ctx.backward,
        "linear layer " + name + ": backward without the plan of its forward");
  }
  LinearContext context(const StepContext& s) const {
    // The one place a layer's recipe is chosen: both backends read ctx.recipe only.
    const Recipe* r = s.layer_recipes ? s.layer_recipes->at(size_t(id)) : s.recipe;
    return LinearContext{r, s.seed, id, s.step, name, s.backward};
  }
};

// The producer outputs (train/backend.hpp ProducerOutputs) of the op that
// produces the input of the linear layers ls (grad: their output gradient), a
// [rows, cols] tensor, for this pass (their plans, LinearLayer::lp): the BF16
// rounding where every one of them reads it; the amaxes where there is one
// reader that wants them. only_linears: ls are the tensor's only readers;
// then, where they all read the BF16 (and, for an output gradient, none has a
// bias: its gradient sums the FP32 dy), the FP32 values are not written
// (f32 false). Nothing with !s.producer_outputs.
inline ProducerOutputs outputs_for(Backend& be, std::initializer_list<const LinearLayer*> ls, const StepContext& s,
                                   bool grad, int64_t rows, int64_t cols, bool only_linears = false) {
  LinearInputNeeds needs;
  bool bias = false;
  if (s.producer_outputs) {
    needs.bf16 = true;
    for (const LinearLayer* l : ls) {
      const LinearInputNeeds n = be.linear_input_needs(l->lp, grad, rows, cols);
      needs.bf16 = needs.bf16 && n.bf16;
      bias = bias || l->b >= 0;
      if (ls.size() == 1) needs.amax = n.amax;
    }
  }
  ProducerOutputs o = be.producer_outputs(needs, rows, cols);
  o.f32 = !(needs.bf16 && only_linears && !(grad && bias));
  return o;
}

// The producer outputs of the linear layer at edge e (train/backend.hpp Bf16Edge), a [rows, cols] output: its
// BF16 alone (f32 false) where s asks for the edge, `applies` (the edge exists in this model: the flash edges
// need bf16_flash attention) and the backend stores it; else nothing (f32 true: the FP32 output as before).
inline ProducerOutputs bf16_storage_for(Backend& be, const StepContext& s, Bf16Edge e, int64_t rows, int64_t cols,
                                        bool applies = true) {
  const bool on = applies && s.stores_bf16(e) && be.stores_bf16(e);
  LinearInputNeeds needs;
  needs.bf16 = on;
  ProducerOutputs o = be.producer_outputs(needs, rows, cols);
  o.f32 = !on;
  return o;
}

// The FP32 output tensor that goes with o: be.empty(rows, cols), or, where o
// drops the FP32 values, the shape alone (data null).
inline Tensor output_tensor(Backend& be, const ProducerOutputs& o) {
  if (o.f32) return be.empty(o.rows, o.cols);
  Tensor t;
  t.rows = o.rows;
  t.cols = o.cols;
  return t;
}

// Dropout stream of `site` (a model-specific index) at `step`.
inline DropoutKey dropout_key(const StepContext& s, uint64_t site) {
  return DropoutKey{s.seed, (uint64_t(0xD) << 60) | (site << 44) | s.step};
}

}  // namespace fp4lab::train
