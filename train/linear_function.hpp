// A standalone quantized linear layer y = x W^T + b over the CALLER's memory:
// the trainer's own Backend::linear_forward / linear_backward (train/cpu/linear.*
// for "cpu", CudaLinear through the CUDA backend for "cuda") run on Tensor
// views of pointers the caller owns. This is what fp4lab.torch (python/) calls;
// nothing here re-implements a rule: the recipe is parsed as the trainer parses
// it (recipes/recipe.hpp parse_recipe) and executed by linear_plan().
//
// Shapes (row-major, float32, contiguous): x [rows, in], W [out, in],
// b [out] (or null), y [rows, out], dy [rows, out], dx [rows, in],
// dW [out, in], db [out]. rows = tokens (a caller flattens leading dims).
// Units: plain float32 values; no scaling beyond the recipe's own.
//
// Memory: backend "cpu": host pointers. Backend "cuda": device pointers of the
// current CUDA device (the one the CUDA backend was created on).
//
// Stream contract (cuda): every operation is issued on the LEGACY DEFAULT
// STREAM (cudaStreamLegacy, stream 0), as the whole CUDA backend is, and the
// calls return without synchronising. So the caller must (a) have finished
// writing x, W, b, dy in an order visible to the legacy default stream before
// calling, and (b) read y, dx, dW, db only after work it orders behind the
// legacy default stream. PyTorch's default stream IS the legacy default stream,
// so plain torch code needs nothing; under a side stream (torch.cuda.stream())
// fp4lab.torch records an event on the current stream that the default stream
// waits for before the call, and one on the default stream that the current
// stream waits for after it (no host synchronisation; python/fp4lab/torch.py).
// The wrapper does not synchronise itself: a host-side sync per layer would
// serialise the GPU with Python. The layer's saved state lives in the CUDA
// backend's own caching allocator, reused only by later work on the same stream.
//
// Stochastic rounding: operand op of this layer draws from the trainer's stream
//   RandomStream{seed, stream_id(layer_id, op, step)}  (recipes/linear_plan.hpp)
// so a layer given the trainer's (seed, layer_id, step) produces the trainer's
// bits exactly. `step` is the training step (update) index, 0-based, as the
// trainer's StepContext::step: every layer of one update uses the same step,
// and reusing a step reuses its random bits. Forward and backward of one pass
// must use the same step (the state remembers it).
//
// Gradients: backward WRITES dx, dW, db (the backend's dW/db accumulate, so
// they are zeroed first on the backend; a caller accumulating over uses adds
// itself, as torch autograd does).
//
// Thread safety: calls of all layers sharing a backend are serialised by one
// mutex (torch's autograd runs backward on its own thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "recipes/recipe.hpp"

namespace fp4lab::train {

class Backend;
struct LinearState;

struct LinearFunctionOptions {
  std::string backend = "cpu";   // "cpu" or "cuda" (make_backend)
  std::string recipe = "fp32";   // a canned name, a recipe JSON file or JSON object text (parse_recipe)
  std::string layer_name;        // matched against the recipe's keep_high_precision patterns
  uint64_t layer_id = 0;         // < 2^16 (stream_id)
  uint64_t seed = 0;
  int threads = 0;               // cpu: OpenMP threads (<= 0: OpenMP's default); bits do not depend on it
};

// What a forward keeps for its backward (opaque). Holds the layer alive.
class LinearFunctionSaved;

class LinearFunction {
 public:
  explicit LinearFunction(const LinearFunctionOptions& o);
  ~LinearFunction();

  // y = x W^T + b (b null: no bias). step: see above. backward false: an
  // evaluation forward (LinearContext::backward false: nothing kept, forward
  // quantizers only); the result is then null.
  std::shared_ptr<LinearFunctionSaved> forward(uint64_t step, const float* x, int64_t rows, int64_t in,
                                               const float* w, int64_t out, const float* b, float* y,
                                               bool backward = true);
  // dx, dW written (dx may be null: not needed, still computed into scratch);
  // db written when non-null. w must hold the forward's W unchanged.
  void backward(const LinearFunctionSaved& s, const float* w, const float* dy, float* dx, float* dw, float* db);

  const Recipe& recipe() const;
  const LinearFunctionOptions& options() const;
  // True when this layer's GEMMs are quantized (linear_is_quantized).
  bool quantized() const;
  // Waits for the backend's queued work (cuda); a no-op on the CPU.
  void synchronize();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace fp4lab::train
