// Backend::grouped_linear_forward / backward (train/backend.hpp): the bits of
// linear_forward / linear_backward on each non-empty group's rows with its own
// plan, in group order, for every canned recipe, empty and odd-sized groups,
// with and without biases, and a forward-only pass. The reference here is
// written out per group in the test, so a backend's own grouped implementation
// (the CUDA one, issue 47) is held to it.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "recipes/recipe.hpp"
#include "train/backend.hpp"
#include "train/backend_cases.hpp"  // randv, put

using namespace fp4lab::train;
using fp4lab::train::test::put;
using fp4lab::train::test::randv;

namespace {

std::vector<float> get(Backend& be, const Tensor& t) {
  std::vector<float> v(size_t(t.size()));
  be.download(t, v.data());
  return v;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}
Tensor rows(const Tensor& t, int64_t off, int64_t n) { return view_of(t.data + off * t.cols, n, t.cols); }

}  // namespace

TEST_CASE("grouped linear: the bits of each group's own linear, every canned recipe, empty and odd groups") {
  auto be = make_cpu_backend(2);
  const int64_t in = 48, out = 40;
  std::vector<std::string> names = fp4lab::recipe_names();
  names.push_back("");  // plain FP32 (no recipe)
  const std::vector<std::vector<int64_t>> layouts = {{0, 1, 15, 16, 17, 37}, {33, 0, 0}, {0, 0}, {130}};
  for (const std::string& name : names) {
    const fp4lab::Recipe rec = name.empty() ? fp4lab::Recipe{} : fp4lab::recipe_by_name(name);
    const fp4lab::Recipe* r = name.empty() ? nullptr : &rec;
    for (const std::vector<int64_t>& sizes : layouts) {
      for (bool bias : {false, true}) {
        for (bool backward : {true, false}) {
          CAPTURE(name);
          CAPTURE(sizes.size());
          CAPTURE(bias);
          CAPTURE(backward);
          const size_t G = sizes.size();
          std::vector<int64_t> off{0};
          for (int64_t n : sizes) off.push_back(off.back() + n);
          const int64_t M = off.back();
          std::vector<LayerPlan> lp;
          std::vector<Tensor> w, dw, dw_ref;
          std::vector<Tensor> bt;
          for (size_t g = 0; g < G; ++g) {
            const std::string layer = "h.0.mlp.experts." + std::to_string(g) + ".c_fc";
            lp.push_back(plan_layer(fp4lab::LinearContext{r, 7, 10 + g, 3, layer, backward}));
            w.push_back(put(*be, randv(size_t(out * in), 100 + uint32_t(g), 0.2f), out, in));
            bt.push_back(put(*be, randv(size_t(out), 200 + uint32_t(g)), 1, out));
            dw.push_back(be->zeros(out, in));
            dw_ref.push_back(be->zeros(out, in));
          }
          std::vector<const LayerPlan*> plans;
          std::vector<const float*> b;
          std::vector<float*> db, db_ref;
          std::vector<Tensor> dbt, dbt_ref;
          for (size_t g = 0; g < G; ++g) {
            plans.push_back(&lp[g]);
            dbt.push_back(be->zeros(1, out));
            dbt_ref.push_back(be->zeros(1, out));
            if (bias) b.push_back(bt[g].data);
          }
          for (size_t g = 0; g < G && bias; ++g) db.push_back(dbt[g].data), db_ref.push_back(dbt_ref[g].data);
          const LinearGroups groups{plans, w, b, off};
          const Tensor x = put(*be, randv(size_t(M * in), 5), M, in), dy = put(*be, randv(size_t(M * out), 6), M, out);
          // The grouped calls.
          Tensor y;
          std::unique_ptr<LinearState> st;
          be->grouped_linear_forward(groups, x, y, st);
          REQUIRE(y.rows == M);
          REQUIRE(y.cols == out);
          // Each group's own calls.
          Tensor y_ref = be->zeros(M, out);
          std::vector<std::unique_ptr<LinearState>> sts(G);
          for (size_t g = 0; g < G; ++g) {
            if (sizes[g] == 0) continue;
            Tensor yg = rows(y_ref, off[g], sizes[g]);
            be->linear_forward(lp[g], rows(x, off[g], sizes[g]), w[g], bias ? bt[g].data : nullptr, yg, sts[g]);
          }
          CHECK(same_bits(get(*be, y), get(*be, y_ref)));
          if (!backward) continue;
          Tensor dx;
          be->grouped_linear_backward(groups, *st, dy, dx, dw, db);
          Tensor dx_ref = be->zeros(M, in);
          for (size_t g = 0; g < G; ++g) {
            if (sizes[g] == 0) continue;
            Tensor dxg = rows(dx_ref, off[g], sizes[g]);
            be->linear_backward(lp[g], *sts[g], w[g], rows(dy, off[g], sizes[g]), dxg, dw_ref[g],
                                bias ? dbt_ref[g].data : nullptr);
          }
          CHECK(same_bits(get(*be, dx), get(*be, dx_ref)));
          for (size_t g = 0; g < G; ++g) {
            CHECK(same_bits(get(*be, dw[g]), get(*be, dw_ref[g])));
            CHECK(same_bits(get(*be, dbt[g]), get(*be, dbt_ref[g])));
          }
        }
      }
    }
  }
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
