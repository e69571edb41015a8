// MoeMlp's linear calls (train/moe.hpp LinearCalls) straight to a backend on a
// ParamStore's tensors, without operand capture: the MoE layer tests' model.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "train/moe.hpp"
#include "train/params.hpp"

namespace fp4lab::train {

class ParamCalls : public LinearCalls {
 public:
  ParamCalls(Backend& be, ParamStore& ps) : be_(be), ps_(ps) {}
  void forward(LinearLayer& l, const StepContext& s, const Tensor& x, Tensor& y) override {
    be_.linear_forward(l.context(s), x, ps_.value(l.w), l.b >= 0 ? ps_.value_ptr(l.b) : nullptr, y, l.state);
  }
  void backward(LinearLayer& l, const StepContext& s, const Tensor& dy, Tensor& dx) override {
    Tensor dw = ps_.grad(l.w);
    be_.linear_backward(l.context(s), *l.state, ps_.value(l.w), dy, dx, dw, l.b >= 0 ? ps_.grad_ptr(l.b) : nullptr);
  }
  // The experts through Backend::grouped_linear_* (plans: MoeMlp::forward's).
  void grouped_forward(std::span<LinearLayer* const> ls, const StepContext&, const Tensor& x,
                       std::span<const int64_t> offsets, Tensor& y, std::unique_ptr<LinearState>& state) override {
    const Groups g = groups(ls);
    be_.grouped_linear_forward(LinearGroups{g.plans, g.w, g.b, offsets}, x, y, state);
  }
  void grouped_backward(std::span<LinearLayer* const> ls, const StepContext&, const LinearState& state,
                        const Tensor& dy, std::span<const int64_t> offsets, Tensor& dx) override {
    Groups g = groups(ls);
    be_.grouped_linear_backward(LinearGroups{g.plans, g.w, g.b, offsets}, state, dy, dx, g.dw, g.db);
  }

 private:
  struct Groups {
    std::vector<const LayerPlan*> plans;
    std::vector<Tensor> w, dw;
    std::vector<const float*> b;
    std::vector<float*> db;
  };
  Groups groups(std::span<LinearLayer* const> ls) {
    Groups g;
    for (LinearLayer* l : ls) {
      g.plans.push_back(&l->lp);
      g.w.push_back(ps_.value(l->w));
      g.dw.push_back(ps_.grad(l->w));
      if (l->b >= 0) g.b.push_back(ps_.value_ptr(l->b)), g.db.push_back(ps_.grad_ptr(l->b));
    }
    return g;
  }
  Backend& be_;
  ParamStore& ps_;
};

}  // namespace fp4lab::train
