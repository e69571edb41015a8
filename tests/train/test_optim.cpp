// Optimiser (train/optim.cpp): nanoGPT's schedule and PyTorch's AdamW step, by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "train/optim.hpp"

using namespace fp4lab::train;

TEST_CASE("warmup + cosine schedule (nanoGPT get_lr)") {
  ScheduleConfig s{"cosine", 1e-3, 1e-4, 100, 2000};
  CHECK(learning_rate(s, 0, 2000) == doctest::Approx(1e-3 / 101));
  CHECK(learning_rate(s, 99, 2000) == doctest::Approx(1e-3 * 100 / 101));
  CHECK(learning_rate(s, 100, 2000) == doctest::Approx(1e-3));
  CHECK(learning_rate(s, 1050, 2000) == doctest::Approx(5.5e-4));  // half way: (lr + min_lr) / 2
  CHECK(learning_rate(s, 2000, 2000) == doctest::Approx(1e-4));
  CHECK(learning_rate(s, 3000, 2000) == doctest::Approx(1e-4));
  ScheduleConfig c{"constant", 3e-4, 0, 0, 0};
  CHECK(learning_rate(c, 500, 1000) == 3e-4);
}

TEST_CASE("AdamW: one step by hand, decay only on marked parameters, clipping") {
  auto be = make_cpu_backend(1);
  ParamStore ps;
  ps.add("w", 1, 2, true, Init::ones);
  ps.add("b", 1, 1, false, Init::ones);
  ps.finalize(*be, 0);
  ps.grads.data[0] = 0.5f, ps.grads.data[1] = -2.0f, ps.grads.data[2] = 0.0f;
  AdamW opt(AdamWConfig{0.9, 0.99, 1e-8, 0.1, 0.0}, ps, *be);
  const double norm = opt.step(0.01);
  CHECK(norm == doctest::Approx(std::sqrt(4.25)));
  // Step 1: m_hat = g, v_hat = g^2 -> update = lr * sign(g) (up to eps); decay: p *= 1 - lr*wd.
  CHECK(ps.values.data[0] == doctest::Approx(0.999 - 0.01).epsilon(1e-6));
  CHECK(ps.values.data[1] == doctest::Approx(0.999 + 0.01).epsilon(1e-6));
  CHECK(ps.values.data[2] == 1.0f);  // zero gradient, no decay
  // Clipping scales the gradients the step reads to the max norm (m = (1 - beta1) g
  // after one step) and leaves the gradient buffer as it was.
  ps.grads.data[0] = 3.0f, ps.grads.data[1] = 4.0f, ps.grads.data[2] = 0.0f;
  AdamW clip(AdamWConfig{0.9, 0.99, 1e-8, 0.0, 1.0}, ps, *be);
  CHECK(clip.step(0.0) == doctest::Approx(5.0));
  CHECK(clip.m().data[0] == doctest::Approx(0.1 * 0.6).epsilon(1e-5));
  CHECK(clip.m().data[1] == doctest::Approx(0.1 * 0.8).epsilon(1e-5));
  CHECK(ps.grads.data[0] == 3.0f);
  CHECK(ps.grads.data[1] == 4.0f);
}

TEST_CASE("AdamW: decayed ranges merge where adjacent; each element decays exactly when its range says so") {
  auto be = make_cpu_backend(2);
  ParamStore ps;
  const bool decay[] = {true, true, false, true, false, false, true};
  const int64_t sizes[] = {3, 5, 2, 7, 1, 4, 6};
  for (int k = 0; k < 7; ++k) ps.add(std::to_string(k), 1, sizes[k], decay[k], Init::normal, 1.0f);
  ps.finalize(*be, 3);
  const std::vector<IndexRange> want{{0, 8}, {10, 7}, {22, 6}};
  CHECK(ps.decay_ranges == want);
  // Zero gradients and moments: the update is exactly p * (1 - lr*wd) where decayed, p elsewhere.
  const std::vector<float> before(ps.values.data, ps.values.data + ps.size());
  AdamW opt(AdamWConfig{0.9, 0.99, 1e-8, 0.25, 0.0}, ps, *be);
  opt.step(0.5);
  const float shrink = 1.0f - 0.5f * 0.25f;
  for (int64_t i = 0; i < ps.size(); ++i) {
    CAPTURE(i);
    const bool decayed = (i < 8) || (i >= 10 && i < 17) || (i >= 22);
    CHECK(ps.values.data[i] == (decayed ? before[size_t(i)] * shrink : before[size_t(i)]));
  }
}

TEST_CASE("check_ranges: names the range at fault") {
  CHECK_NOTHROW(check_ranges("t", std::vector<IndexRange>{}, 0));
  CHECK_NOTHROW(check_ranges("t", std::vector<IndexRange>{{0, 2}, {2, 3}}, 5));
  CHECK_THROWS_WITH_AS(check_ranges("t", std::vector<IndexRange>{{0, 2}, {1, 3}}, 5),
                       doctest::Contains("range 1 [1, 4) is not after the previous range's end 2"), fp4lab::Error);
  CHECK_THROWS_WITH_AS(check_ranges("t", std::vector<IndexRange>{{3, 3}}, 5),
                       doctest::Contains("range 0 [3, 6) is outside the buffer of 5 elements"), fp4lab::Error);
  CHECK_THROWS_WITH_AS(check_ranges("t", std::vector<IndexRange>{{1, 0}}, 5), doctest::Contains("is empty"),
                       fp4lab::Error);
}
