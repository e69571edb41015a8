// Backend::grouped_linear_forward / backward (train/backend.hpp): the bits of
// linear_forward / linear_backward on each non-empty group's rows with its own
// plan, in group order, for every canned recipe, empty and odd-sized groups,
// with and without biases, and a forward-only pass (the check is
// tests/train/backend_cases.hpp's check_grouped_linear, which the CUDA tests
// run too: a backend's own grouped implementation, issue 47, is held to it).
#include <doctest/doctest.h>

#include "recipes/recipe.hpp"
#include "train/backend.hpp"
#include "train/backend_cases.hpp"

using namespace fp4lab::train;

TEST_CASE("grouped linear: the bits of each group's own linear, every canned recipe, empty and odd groups") {
  auto be = make_cpu_backend(2);
  CHECK(test::check_grouped_linear(*be) > 100);
}

TEST_CASE("grouped linear: mismatched groups are internal errors") {
  auto be = make_cpu_backend(1);
  const Tensor x = be->zeros(4, 8), w = be->zeros(3, 8);
  const LayerPlan lp = plan_layer(fp4lab::LinearContext{nullptr, 1, 0, 0, "e.0"});
  const LayerPlan* plans[] = {&lp};
  const Tensor ws[] = {w};
  const int64_t short_off[] = {0, 3};  // ends before x's 4 rows
  Tensor y;
  std::unique_ptr<LinearState> st;
  CHECK_THROWS_AS(be->grouped_linear_forward(LinearGroups{plans, ws, {}, short_off}, x, y, st), fp4lab::InternalError);
  const int64_t two[] = {0, 2, 4};  // two groups' offsets for one plan
  CHECK_THROWS_AS(be->grouped_linear_forward(LinearGroups{plans, ws, {}, two}, x, y, st), fp4lab::InternalError);
}
