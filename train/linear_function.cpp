// The standalone quantized linear layer over caller memory (linear_function.hpp):
// Tensor views of the caller's pointers handed to the trainer's backend.
#include "train/linear_function.hpp"

#include <cstring>
#include <map>
#include <mutex>

#include "core/error.hpp"
#include "recipes/linear_plan.hpp"
#include "train/backend.hpp"

namespace fp4lab::train {

namespace {

// One backend per (name, threads) while any layer uses it: the CUDA backend's
// cuBLAS handles, scratch and allocator are shared by all layers.
struct SharedBackend {
  std::unique_ptr<Backend> backend;
  std::mutex mutex;  // serialises every call on it
};

std::shared_ptr<SharedBackend> shared_backend(const std::string& name, int threads) {
  static std::mutex m;
  static std::map<std::pair<std::string, int>, std::weak_ptr<SharedBackend>> cache;
  const std::lock_guard<std::mutex> lock(m);
  const auto key = std::make_pair(name, name == "cpu" ? threads : 0);
  if (auto p = cache[key].lock()) return p;
  auto p = std::make_shared<SharedBackend>();
  p->backend = make_backend(name, threads);
  cache[key] = p;
  return p;
}

Tensor view(const float* p, int64_t rows, int64_t cols) { return view_of(const_cast<float*>(p), rows, cols); }

void check_shape(const char* what, int64_t v) {
  if (v < 0) throw Error(std::string("LinearFunction: negative ") + what);
}

}  // namespace

struct LinearFunction::Impl {
  LinearFunctionOptions opt;
  Recipe recipe;
  std::shared_ptr<SharedBackend> be;
};

class LinearFunctionSaved {
 public:
  std::shared_ptr<LinearFunction::Impl> layer;  // keeps recipe, name and backend alive
  LinearContext ctx;
  std::unique_ptr<LinearState> state;
  int64_t rows = 0, in = 0, out = 0;
  bool has_bias = false;
};

LinearFunction::LinearFunction(const LinearFunctionOptions& o) : impl_(std::make_shared<Impl>()) {
  impl_->opt = o;
  try {
    impl_->recipe = parse_recipe(o.recipe);
  } catch (const Error& e) {
    throw Error(std::string("LinearFunction: recipe: ") + e.what());
  }
  if (impl_->recipe.switch_to)
    throw Error("LinearFunction: recipe \"" + impl_->recipe.name + "\" switches to \"" + *impl_->recipe.switch_to +
                "\" for the last part of a run (switch_to); a standalone layer knows no run length: pass the "
                "recipe in force instead");
  if (o.layer_id >= (uint64_t(1) << 16))
    throw Error("LinearFunction: layer_id " + std::to_string(o.layer_id) + " >= 2^16 (the SR stream's field)");
  impl_->be = shared_backend(o.backend, o.threads);
}

LinearFunction::~LinearFunction() = default;

const Recipe& LinearFunction::recipe() const { return impl_->recipe; }
const LinearFunctionOptions& LinearFunction::options() const { return impl_->opt; }

bool LinearFunction::quantized() const {
  LinearContext c{&impl_->recipe, impl_->opt.seed, impl_->opt.layer_id, 0, impl_->opt.layer_name, true};
  return linear_is_quantized(c);
}

void LinearFunction::synchronize() {
  const std::lock_guard<std::mutex> lock(impl_->be->mutex);
  impl_->be->backend->synchronize();
}

std::shared_ptr<LinearFunctionSaved> LinearFunction::forward(uint64_t step, const float* x, int64_t rows, int64_t in,
                                                             const float* w, int64_t out, const float* b, float* y,
                                                             bool backward) {
  check_shape("rows", rows);
  check_shape("in_features", in);
  check_shape("out_features", out);
  if (step >= (uint64_t(1) << 41)) throw Error("LinearFunction: step " + std::to_string(step) + " >= 2^41");
  auto s = std::make_shared<LinearFunctionSaved>();
  s->layer = impl_;
  s->ctx = LinearContext{&impl_->recipe, impl_->opt.seed, impl_->opt.layer_id, step, impl_->opt.layer_name, backward};
  s->rows = rows;
  s->in = in;
  s->out = out;
  s->has_bias = b != nullptr;
  const Tensor xt = view(x, rows, in), wt = view(w, out, in);
  Tensor yt = view(y, rows, out);
  {
    const std::lock_guard<std::mutex> lock(impl_->be->mutex);
    impl_->be->backend->linear_forward(s->ctx, xt, wt, b, yt, s->state);
  }
  if (rows * out > 0 && yt.data != y)  // the backend must write into the caller's y (it has y's shape)
    throw Error("LinearFunction::forward: the backend did not write into the given y");
  if (!backward) return nullptr;
  return s;
}

void LinearFunction::backward(const LinearFunctionSaved& s, const float* w, const float* dy, float* dx, float* dw,
                              float* db) {
  if (s.layer != impl_) throw Error("LinearFunction::backward: the saved state belongs to another layer");
  if (!s.state) throw Error("LinearFunction::backward: the forward kept no state (backward false)");
  if (dw == nullptr) throw Error("LinearFunction::backward: dW is required");
  Backend& be = *impl_->be->backend;
  const std::lock_guard<std::mutex> lock(impl_->be->mutex);
  const Tensor wt = view(w, s.out, s.in), dyt = view(dy, s.rows, s.out);
  Tensor dxt = dx ? view(dx, s.rows, s.in) : Tensor{};  // null: the backend allocates scratch
  Tensor dwt = view(dw, s.out, s.in);
  be.fill(dwt, 0.0f);  // the backend accumulates dW and db
  if (db) {
    Tensor dbt = view(db, 1, s.out);
    be.fill(dbt, 0.0f);
  }
  be.linear_backward(s.ctx, *s.state, wt, dyt, dxt, dwt, db);
  if (dx && s.rows * s.in > 0 && dxt.data != dx) throw Error("LinearFunction::backward: the backend did not write into the given dx");
}

}  // namespace fp4lab::train
