// Data-parallel optimiser steps (train/dist/data_parallel.hpp) on in-process
// thread ranks: ZeRO-1 at odd shard boundaries equals the unsharded step bit
// for bit and both equal one process stepping on the rank-order gradient sum;
// NVFP4 primary weights cast shard by shard equal the whole-tensor cast and
// quantize(nvfp4_2d, master).dequant; checkpoint state round-trips.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "core/philox.hpp"
#include "sim/quantizer.hpp"
#include "train/dist/data_parallel.hpp"
#include "odd_store.hpp"

using namespace fp4lab;
using namespace fp4lab::train;

namespace {

using test::declare_odd_store;  // odd_store.hpp

// Rank r's gradient at step t, element i: a reproducible function of (r, t, i).
float grad_of(int r, int t, int64_t i) {
  const uint32_t w = random_bits(0x5EED, uint64_t(r) << 40 | uint64_t(t) << 32, uint64_t(i));
  return (float(w >> 8) * 0x1p-24f - 0.5f) * float(1 + (i % 7));
}

struct Outcome {
  std::vector<float> values, master, m, v;
};

// DataParallel steps up to `steps` on `world` thread ranks; rank 0's outcome.
// With `from` (the state after `first` steps), each rank starts from another
// init and loads that state first: everything must come from the state.
Outcome run_dp(int world, const DistributedConfig& dc, const AdamWConfig& ac, int steps,
               const std::vector<int>& nvfp4 = {}, const Outcome* from = nullptr, int first = 0) {
  auto comms = make_thread_comms(world);
  std::vector<Outcome> out(static_cast<size_t>(world));
  std::vector<std::thread> th;
  for (int r = 0; r < world; ++r)
    th.emplace_back([&, r] {
      auto be = make_cpu_backend(1);
      ParamStore ps;
      declare_odd_store(ps);
      ps.finalize(*be, from ? 99 : 7);
      ps.set_storage(nvfp4, Storage::nvfp4_2d, *be);
      DataParallel dp(*comms[size_t(r)], *be, ps, ac, dc);
      if (from) dp.load_state(from->master, from->m, from->v, first);
      for (int t = from ? first : 0; t < steps; ++t) {
        dp.begin_step(1.0f, 1.0 / world);
        for (int64_t i = 0; i < ps.size(); ++i) ps.grads.data[i] = grad_of(r, t, i);
        dp.step(1e-2 * (t + 1));
      }
      Outcome& o = out[size_t(r)];
      o.values.assign(ps.values.data, ps.values.data + ps.size());
      dp.state(o.master, o.m, o.v);
    });
  for (auto& t : th) t.join();
  for (int r = 1; r < world; ++r) CHECK(out[size_t(r)].values == out[0].values);  // every rank the same
  return out[0];
}

}  // namespace

TEST_CASE("batch_share: contiguous shares covering the batch, sizes differing by at most one") {
  for (int64_t n : {1, 7, 64, 65}) {
    for (int w : {1, 2, 3, 8}) {
      int64_t at = 0, lo = n, hi = 0;
      for (int r = 0; r < w; ++r) {
        const ShardRange s = batch_share(n, r, w);
        CHECK(s.begin == at);
        at = s.end;
        lo = std::min(lo, s.end - s.begin), hi = std::max(hi, s.end - s.begin);
      }
      CHECK(at == n);
      CHECK(hi - lo <= 1);
    }
  }
}

TEST_CASE("ZeRO-1 at odd shard boundaries equals the unsharded step and one process on the gradient sum, bit for bit") {
  const AdamWConfig ac{0.9, 0.95, 1e-8, 0.1, 0.0};
  const int steps = 4;
  // One process on the rank-order sum of the weighted gradients (the thread communicator's order).
  for (int world : {1, 2, 3, 5}) {
    CAPTURE(world);
    auto be = make_cpu_backend(1);
    ParamStore ps;
    declare_odd_store(ps);
    ps.finalize(*be, 7);
    AdamW ref(ac, ps, *be);
    for (int t = 0; t < steps; ++t) {
      for (int64_t i = 0; i < ps.size(); ++i) {
        float s = 0.0f;
        for (int r = 0; r < world; ++r) s += world > 1 ? grad_of(r, t, i) * float(1.0 / world) : grad_of(r, t, i);
        ps.grads.data[i] = s;
      }
      ref.step(1e-2 * (t + 1));
    }
    const std::vector<float> want(ps.values.data, ps.values.data + ps.size());
    const Outcome z0 = run_dp(world, DistributedConfig{0, Storage::fp32, true}, ac, steps);
    const Outcome z1 = run_dp(world, DistributedConfig{1, Storage::fp32, true}, ac, steps);
    CHECK(z0.values == want);
    CHECK(z1.values == want);
    CHECK(z1.m == z0.m);
    CHECK(z1.v == z0.v);
    CHECK(z1.master == want);
  }
}

TEST_CASE("ZeRO-1 with clipping: the global norm from the shards' sums of squares") {
  const AdamWConfig ac{0.9, 0.95, 1e-8, 0.0, 0.05};
  const Outcome z0 = run_dp(3, DistributedConfig{0, Storage::fp32, true}, ac, 3);
  const Outcome z1 = run_dp(3, DistributedConfig{1, Storage::fp32, true}, ac, 3);
  // The norm's double sum differs in order only: the clipped updates agree to float rounding.
  REQUIRE(z0.values.size() == z1.values.size());
  for (size_t i = 0; i < z0.values.size(); ++i) CHECK(z1.values[i] == doctest::Approx(z0.values[i]).epsilon(1e-6));
}

TEST_CASE("NVFP4 primary weights: shard cast = whole cast = quantize(nvfp4_2d, master) on 1-5 ranks, zero 0 and 1") {
  const AdamWConfig ac{0.9, 0.95, 1e-8, 0.1, 0.0};
  const std::vector<int> nv{0, 2};  // the two weights
  for (int world : {1, 2, 3, 5}) {
    for (int zero : {0, 1}) {
      CAPTURE(world);
      CAPTURE(zero);
      const Outcome sc = run_dp(world, DistributedConfig{zero, Storage::nvfp4_2d, true}, ac, 3, nv);
      const Outcome whole = run_dp(world, DistributedConfig{zero, Storage::nvfp4_2d, false}, ac, 3, nv);
      CHECK(sc.values == whole.values);
      CHECK(sc.master == whole.master);
      // The model's weights are the dequantized NVFP4 cast of the master values; the rest is the master.
      auto be = make_cpu_backend(1);
      ParamStore ps;
      declare_odd_store(ps);
      ps.finalize(*be, 7);
      const QuantizerSpec q = quantizer_by_name("nvfp4_2d");
      for (int i = 0; i < 4; ++i) {
        const ParamInfo& p = ps.info(i);
        const float* master = sc.master.data() + p.offset;
        const float* model = sc.values.data() + p.offset;
        if (i == 0 || i == 2) {
          const QuantizedTensor qt = quantize(q, MatrixView<const float>(master, p.rows, p.cols));
          for (int64_t k = 0; k < p.size(); ++k) {
            CAPTURE(k);
            CHECK(std::memcmp(&model[k], &qt.dequant[size_t(k)], 4) == 0);
          }
        } else {
          CHECK(std::vector<float>(model, model + p.size()) == std::vector<float>(master, master + p.size()));
        }
      }
    }
  }
}

TEST_CASE("DataParallel state: saving after 2 steps and loading into fresh ranks continues bit for bit") {
  const AdamWConfig ac{0.9, 0.95, 1e-8, 0.1, 0.0};
  const DistributedConfig dc{1, Storage::nvfp4_2d, true};
  const std::vector<int> nv{0, 2};
  const int world = 3;
  const Outcome straight = run_dp(world, dc, ac, 4, nv);
  const Outcome half = run_dp(world, dc, ac, 2, nv);
  CHECK(run_dp(world, dc, ac, 4, nv, &half, 2).values == straight.values);  // run_dp checks every rank alike
}

TEST_CASE("DataParallel memory: ZeRO-1 holds 1/N of the moments") {
  auto comms = make_thread_comms(1);
  auto be = make_cpu_backend(1);
  ParamStore ps;
  declare_odd_store(ps);
  ps.finalize(*be, 7);
  DataParallel dp(*comms[0], *be, ps, AdamWConfig{}, DistributedConfig{1, Storage::fp32, true});
  const auto m = dp.memory();
  CHECK(m["moments_bytes"].get<int64_t>() == 2 * 4 * ps.size());
  CHECK(m["master_bytes"].get<int64_t>() == 0);
}

namespace {

// A model with a replicated region and 4 experts of 2 tensors each (odd sizes), declared in one process's order.
void declare_experts(ParamStore& ps) {
  ps.add("embed.weight", 11, 7, true, Init::normal, 0.5f);
  for (int64_t e = 0; e < 4; ++e) {
    ps.add("experts." + std::to_string(e) + ".weight", 5, 7, true, Init::normal, 0.5f, Placement{e, 4});
    ps.add("experts." + std::to_string(e) + ".bias", 1, 5, false, Init::normal, 0.1f, Placement{e, 4});
  }
  ps.add("ln.weight", 1, 7, false, Init::ones);
}

// Rank r's gradient at step t of tensor i's element j: a function of (r, t, i, j).
float tensor_grad(int r, int t, int i, int64_t j) { return grad_of(r, t, int64_t(i) << 20 | j); }

struct EpOutcome {
  std::vector<float> master, m, v;  // one process's layout (DataParallel::state)
};

// `steps` steps on `world` expert-parallel thread ranks (every rank an expert rank); rank 0's state, after checking
// that every rank's agrees. Rank r's gradient: tensor_grad of rank r for replicated tensors, of the owner for its
// experts. `from`: the state after `first` steps, loaded into ranks initialised from another seed.
EpOutcome run_ep(int world, int zero, const AdamWConfig& ac, int steps, const EpOutcome* from = nullptr, int first = 0,
                 std::vector<std::vector<float>>* held = nullptr) {
  auto comms = make_thread_comms(world);
  std::vector<EpOutcome> out(static_cast<size_t>(world));
  if (held) held->assign(size_t(world), {});
  std::vector<std::thread> th;
  for (int r = 0; r < world; ++r)
    th.emplace_back([&, r] {
      auto be = make_cpu_backend(1);
      ParamStore ps;
      ps.set_expert_parallel(world, r);
      declare_experts(ps);
      ps.finalize(*be, from ? 99 : 7);
      if (held) (*held)[size_t(r)].assign(ps.values.data, ps.values.data + ps.size());
      DataParallel dp(*comms[size_t(r)], *be, ps, ac, DistributedConfig{zero, Storage::fp32, true});
      if (from) dp.load_state(from->master, from->m, from->v, first);
      for (int t = from ? first : 0; t < steps; ++t) {
        dp.begin_step(1.0f, 1.0 / world);
        for (int i = 0; i < int(ps.infos().size()); ++i)
          if (ps.info(i).held)
            for (int64_t j = 0; j < ps.info(i).size(); ++j) ps.grad_ptr(i)[j] = tensor_grad(r, t, i, j);
        dp.step(1e-2 * (t + 1));
      }
      EpOutcome& o = out[size_t(r)];
      dp.state(o.master, o.m, o.v);
    });
  for (auto& t : th) t.join();
  for (int r = 1; r < world; ++r) {
    CHECK(out[size_t(r)].master == out[0].master);
    CHECK(out[size_t(r)].m == out[0].m);
  }
  return out[0];
}

}  // namespace

// Plan section 6, test 4: expert-parallel ranks hold their experts only (region B), each tensor one process's
// init; DataParallel's state is one process's layout; without clipping a step is elementwise, so the ranks equal
// one process stepping on the gradients the ranks reduce (replicated: the rank-order sum; an expert: its owner's),
// bit for bit; a checkpoint round trip continues bit for bit.
TEST_CASE("expert-parallel parameters: held experts, one process's init, state and steps") {
  const AdamWConfig ac{0.9, 0.95, 1e-8, 0.1, 0.0};
  for (int world : {2, 4}) {
    for (int zero : {0, 1}) {
      CAPTURE(world);
      CAPTURE(zero);
      auto be = make_cpu_backend(1);
      ParamStore ref;
      declare_experts(ref);
      ref.finalize(*be, 7);
      const std::vector<float> init(ref.values.data, ref.values.data + ref.size());
      // Construction: the held tensors and the state.
      std::vector<std::vector<float>> held;
      const EpOutcome s0 = run_ep(world, zero, ac, 0, nullptr, 0, &held);
      CHECK(s0.master == init);
      CHECK(s0.m == std::vector<float>(init.size(), 0.0f));
      for (int r = 0; r < world; ++r) {
        ParamStore ps;
        ps.set_expert_parallel(world, r);
        declare_experts(ps);
        ps.finalize(*be, 7);
        CHECK(ps.global_size() == ref.size());
        CHECK(ps.size() == ref.size() - (world - 1) * 4 / world * (5 * 7 + 5));  // E/R experts a rank
        int experts = 0;
        for (int i = 0; i < int(ps.infos().size()); ++i) {
          const ParamInfo& p = ps.info(i);
          CHECK(p.global_offset == ref.info(i).offset);
          if (!p.held) {
            CHECK_THROWS_WITH_AS(ps.value(i), doctest::Contains("held by another expert-parallel rank"), Error);
            continue;
          }
          experts += p.placement.expert >= 0;
          CHECK(std::vector<float>(held[size_t(r)].begin() + p.offset, held[size_t(r)].begin() + p.offset + p.size()) ==
                std::vector<float>(init.begin() + p.global_offset, init.begin() + p.global_offset + p.size()));
        }
        CHECK(experts == 2 * 4 / world);
      }
      // Steps: one process on the reduced gradients.
      const int steps = 3;
      AdamW opt(ac, ref, *be);
      for (int t = 0; t < steps; ++t) {
        for (int i = 0; i < int(ref.infos().size()); ++i) {
          const ParamInfo& p = ref.info(i);
          for (int64_t j = 0; j < p.size(); ++j) {
            float g = 0.0f;
            if (p.placement.expert >= 0) {
              const int owner = int(p.placement.expert / (4 / world));
              g = tensor_grad(owner, t, i, j) * float(1.0 / world);
            } else {
              for (int r = 0; r < world; ++r) g += tensor_grad(r, t, i, j) * float(1.0 / world);
            }
            ref.grads.data[p.offset + j] = g;
          }
        }
        opt.step(1e-2 * (t + 1));
      }
      const EpOutcome straight = run_ep(world, zero, ac, steps);
      CHECK(straight.master == std::vector<float>(ref.values.data, ref.values.data + ref.size()));
      const EpOutcome half = run_ep(world, zero, ac, 1);
      const EpOutcome resumed = run_ep(world, zero, ac, steps, &half, 1);
      CHECK(resumed.master == straight.master);
      CHECK(resumed.m == straight.m);
      CHECK(resumed.v == straight.v);
    }
  }
}

TEST_CASE("expert-parallel parameters: bad placements and shards name the values") {
  ParamStore ps;
  CHECK_THROWS_WITH_AS(ps.add("x", 1, 1, false, Init::zeros, 0.0f, Placement{4, 4}),
                       doctest::Contains("0 <= expert < experts"), Error);
  CHECK_THROWS_WITH_AS(ps.set_expert_parallel(2, 2), doctest::Contains("rank 2 of 2"), Error);
  ps.set_expert_parallel(3, 0);
  ps.add("e", 1, 1, false, Init::zeros, 0.0f, Placement{0, 4});
  auto be = make_cpu_backend(1);
  CHECK_THROWS_WITH_AS(ps.finalize(*be, 1), doctest::Contains("4 experts over 3 expert-parallel ranks"), Error);
}
