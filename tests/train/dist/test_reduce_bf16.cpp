// distributed.reduce "bf16" (train/dist/grad_reduce.hpp) on in-process thread ranks, against an independent
// oracle: each rank's local gradient rounded to BF16 by this file's own rounding (float64 arithmetic and
// nearbyint from the definition, not core's codec) and summed in FP32 in rank order. On 2, 3 and 5 ranks:
// reduce_scatter_bf16 itself (edge values: ties, NaN, Inf, overflow, subnormals, -0; uneven and empty shards),
// and one DataParallel step's result under zero 0, 1 and 3 equal to one process's AdamW on the oracle's
// gradient; the bytes on the wire (CountingComm) exactly half the FP32 reduce-scatter's; the config key.
// Whole training runs (ZeRO-1 = ZeRO-3 under reduce bf16) are in test_reduce_bf16_runs.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "core/philox.hpp"
#include "train/config.hpp"
#include "train/dist/counting_comm.hpp"
#include "train/dist/data_parallel.hpp"
#include "odd_store.hpp"
#include "train/dist/grad_reduce.hpp"

using namespace fp4lab;
using namespace fp4lab::train;

namespace {

// BF16 round to nearest, ties to even, from the definition: BF16 keeps 8 significant bits and float32's exponent
// range (normal quantum 2^(e - 7) for |x| in [2^e, 2^(e+1)), subnormal quantum 2^-133); x / quantum is exact in
// float64 and nearbyint rounds it half to even; a result above BF16's largest finite, (2 - 2^-7) 2^127, is
// +-Inf; NaN gives a quiet NaN.
float bf16_oracle(float x) {
  if (std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
  if (std::isinf(x) || x == 0.0f) return x;
  int e = 0;
  std::frexp(double(x), &e);  // |x| = m 2^e, m in [0.5, 1): the leading bit is 2^(e - 1)
  const double q = std::ldexp(1.0, std::max(e - 1 - 7, -133));
  REQUIRE(std::fegetround() == FE_TONEAREST);
  const double r = std::nearbyint(double(x) / q) * q;
  if (std::fabs(r) > 0x1.fep127) return std::copysign(std::numeric_limits<float>::infinity(), x);
  return float(r);
}

uint32_t bits(float x) { return fp4lab::float_bits(x); }

// Rank r's contribution of element i: random magnitudes over many binades, with edge values at fixed places.
float local_grad(int r, int64_t i) {
  static const float edges[] = {fp4lab::bits_float(0x3F808000u),  // 1 + 2^-8: a tie, to even (1)
                                fp4lab::bits_float(0x3F818000u),  // a tie, to even (up)
                                fp4lab::bits_float(0xBF818000u),  // negative tie
                                fp4lab::bits_float(0x00008000u),  // subnormal tie, to even (0)
                                fp4lab::bits_float(0x00018000u),  // subnormal tie, up
                                fp4lab::bits_float(0x00000001u),  // the smallest subnormal: rounds to 0
                                fp4lab::bits_float(0x7F7FFFFFu),  // FLT_MAX: rounds to Inf
                                fp4lab::bits_float(0x7F7F7FFFu),  // just below the tie to Inf: BF16's max
                                -0.0f,
                                std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(),
                                fp4lab::bits_float(0xFFA00001u)};  // a signalling negative NaN
  const uint32_t w = random_bits(0xB16, uint64_t(r), uint64_t(i));
  if (w % 9 == 0) return edges[(w >> 8) % std::size(edges)];
  const float m = float(w >> 8) * 0x1p-24f - 0.5f;
  return std::ldexp(m, int((w >> 4) % 40) - 20);
}

// The oracle's shard of rank `me`: the rank-order FP32 sum of the rounded contributions.
std::vector<float> oracle_shard(const std::vector<std::vector<float>>& local, ShardRange s) {
  std::vector<float> out;
  for (int64_t i = s.begin; i < s.end; ++i) {
    float acc = bf16_oracle(local[0][size_t(i)]);
    for (size_t r = 1; r < local.size(); ++r) acc += bf16_oracle(local[r][size_t(i)]);
    out.push_back(acc);
  }
  return out;
}

// Bit for bit, except that any NaN equals any NaN (the semantics keep a NaN a NaN; its payload is the codec's
// convention: core's NaN code 0x7FFF, widened 0x7FFF0000).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i]) && !(std::isnan(a[i]) && std::isnan(b[i]))) return false;
  return true;
}

}  // namespace

TEST_CASE("bf16 oracle rounding: the definition's values at ties, overflow and subnormals") {
  CHECK(bits(bf16_oracle(fp4lab::bits_float(0x3F808000u))) == 0x3F800000u);
  CHECK(bits(bf16_oracle(fp4lab::bits_float(0x3F818000u))) == 0x3F820000u);
  CHECK(bits(bf16_oracle(fp4lab::bits_float(0x3F808001u))) == 0x3F810000u);
  CHECK(bits(bf16_oracle(fp4lab::bits_float(0x00008000u))) == 0x00000000u);
  CHECK(bits(bf16_oracle(fp4lab::bits_float(0x00018000u))) == 0x00020000u);
  CHECK(bits(bf16_oracle(fp4lab::bits_float(0x7F7FFFFFu))) == 0x7F800000u);
  CHECK(bits(bf16_oracle(fp4lab::bits_float(0x7F7F7FFFu))) == 0x7F7F0000u);
  CHECK(bits(bf16_oracle(-0.0f)) == 0x80000000u);
}

TEST_CASE("reduce_scatter_bf16 equals the oracle bit for bit on 2, 3 and 5 thread ranks (uneven and empty shards)") {
  for (int world : {2, 3, 5})
    for (int64_t n : {int64_t(3), int64_t(1001)}) {  // 3 elements on 5 ranks: empty shards
      CAPTURE(world);
      CAPTURE(n);
      std::vector<std::vector<float>> local(static_cast<size_t>(world)), got(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r)
        for (int64_t i = 0; i < n; ++i) local[size_t(r)].push_back(local_grad(r, i));
      const std::vector<ShardRange> shards = even_shards(n, world);
      auto comms = make_thread_comms(world);
      std::vector<std::thread> th;
      for (int r = 0; r < world; ++r)
        th.emplace_back([&, r] {
          auto be = make_cpu_backend(1);
          train::Tensor full = be->empty(1, n);
          be->upload(local[size_t(r)].data(), full);
          const ShardRange s = shards[size_t(r)];
          train::Tensor mine = be->empty(1, s.end - s.begin);
          reduce_scatter_bf16(*comms[size_t(r)], *be, full, shards, mine);
          got[size_t(r)].resize(size_t(mine.size()));
          if (mine.size() > 0) be->download(mine, got[size_t(r)].data());
        });
      for (auto& t : th) t.join();
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        CHECK(same_bits(got[size_t(r)], oracle_shard(local, shards[size_t(r)])));
      }
    }
}

namespace {

using test::declare_odd_store;  // odd_store.hpp; ZeRO-3 units {ln}, {a.*}, {b.weight}
const std::vector<std::vector<int>> kUnits = {{3}, {0, 1}, {2}};

struct Step {
  std::vector<float> values, m, v;
  std::map<std::string, CollectiveCounts> counts;  // rank 0's, the step's
};

// One DataParallel step (grad scale 1/3, share weight 1/world) on `world` thread ranks over CountingComm, the
// local gradient of rank r at element i = local_grad(r, i) (clipped to finite values: AdamW of a NaN is NaN
// everywhere); rank 0's outcome. Zero 3 writes the gradients unit by unit through the provider, as a backward.
Step one_step(int world, int zero, GradReduce reduce, const AdamWConfig& ac) {
  auto comms = make_thread_comms(world);
  std::vector<Step> out(static_cast<size_t>(world));
  std::vector<std::thread> th;
  for (int r = 0; r < world; ++r)
    th.emplace_back([&, r] {
      CountingComm comm(*comms[size_t(r)]);
      auto be = make_cpu_backend(1);
      ParamStore ps;
      declare_odd_store(ps);
      ps.finalize(*be, 7);
      DistributedConfig dc;
      dc.zero = zero;
      dc.reduce = reduce;
      DataParallel dp(comm, *be, ps, ac, dc, zero == 3 ? kUnits : std::vector<std::vector<int>>{});
      comm.set_step(0);
      dp.begin_step(1.0f / 3.0f, 1.0 / world);
      for (int p : {2, 1, 0, 3}) {  // units 2, 1, root: a backward's order
        float* g = ps.grad_ptr(p);
        for (int64_t j = 0; j < ps.info(p).size(); ++j) {
          const float x = local_grad(r, ps.info(p).offset + j);
          g[j] = std::isfinite(x) ? std::fmin(std::fabs(x), 1e30f) * (x < 0 ? -1.0f : 1.0f) : 0.5f;
        }
      }
      dp.step(1e-2);
      Step& o = out[size_t(r)];
      o.counts = comm.counts().at(0);  // the step's alone
      comm.set_step(1);
      o.values = dp.model_values();
      std::vector<float> master;
      dp.state(master, o.m, o.v);
    });
  for (auto& t : th) t.join();
  for (int r = 1; r < world; ++r) CHECK(same_bits(out[size_t(r)].values, out[0].values));
  return out[0];
}

}  // namespace

TEST_CASE("one DataParallel step under reduce bf16, zero 0, 1 and 3: AdamW on the oracle's gradient, bit for bit") {
  const AdamWConfig ac{0.9, 0.95, 1e-8, 0.1, 0.0};
  for (int world : {2, 3, 5}) {
    CAPTURE(world);
    // The oracle: each rank's contribution as the FP32 path scales it, (g / 3) * (1 / world), rounded by
    // bf16_oracle, summed in rank order; one process's AdamW step on it.
    auto be = make_cpu_backend(1);
    ParamStore ps;
    declare_odd_store(ps);
    ps.finalize(*be, 7);
    std::vector<std::vector<float>> local(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r)
      for (int64_t i = 0; i < ps.size(); ++i) {
        const float x = local_grad(r, i);
        const float g = std::isfinite(x) ? std::fmin(std::fabs(x), 1e30f) * (x < 0 ? -1.0f : 1.0f) : 0.5f;
        local[size_t(r)].push_back((g * (1.0f / 3.0f)) * float(1.0 / world));
      }
    const std::vector<float> sum = oracle_shard(local, ShardRange{0, ps.size()});
    std::copy(sum.begin(), sum.end(), ps.grads.data);
    AdamW ref(ac, ps, *be);
    ref.step(1e-2);
    const std::vector<float> want(ps.values.data, ps.values.data + ps.size());
    auto host = [&](const train::Tensor& t) {
      std::vector<float> h(size_t(t.size()));
      be->download(t, h.data());
      return h;
    };
    const std::vector<float> want_m = host(ref.m_f32()), want_v = host(ref.v_f32());
    for (int zero : {0, 1, 3}) {
      CAPTURE(zero);
      const Step s = one_step(world, zero, GradReduce::bf16, ac);
      CHECK(same_bits(s.values, want));
      CHECK(same_bits(s.m, want_m));  // m = (1 - beta1) g: the summed gradient itself, scaled
      CHECK(same_bits(s.v, want_v));
      const Step f = one_step(world, zero, GradReduce::fp32, ac);
      CHECK(!same_bits(f.m, want_m));  // the option changes the step (the FP32 sums differ)
      // The gradients' wire bytes: alltoallv of 2-byte codes, exactly half the FP32 reduce-scatter's ring bytes.
      const int64_t n = ps.size(), own = even_shards(n, world)[0].end;  // rank 0's shard (zero 0, 1)
      CHECK(s.counts.count("reduce_scatter_sum") == 0);
      if (zero == 3) {
        CHECK(s.counts.at("alltoallv").calls == 3);  // one a unit
        CHECK(2 * s.counts.at("alltoallv").ring_bytes == f.counts.at("reduce_scatter_sum").ring_bytes);
        CHECK(f.counts.at("reduce_scatter_sum").calls == 3);
        continue;
      }
      CHECK(s.counts.at("alltoallv") == CollectiveCounts{1, 2 * n, 2 * world * own, 2 * (n - own)});
      if (zero == 1) CHECK(f.counts.at("reduce_scatter_sum") == CollectiveCounts{1, 4 * n, 4 * own, 4 * (n - own)});
      if (zero == 0) {  // FP32: one all-reduce; BF16: the reduce then the FP32 all-gather of the sums
        CHECK(f.counts.at("allreduce_sum").ring_bytes == 2 * (world - 1) * 4 * n / world);
        CHECK(s.counts.at("allgather") == CollectiveCounts{1, 4 * own, 4 * n, 4 * (n - own)});
      }
    }
  }
}

TEST_CASE("distributed.reduce: parsed once, written only when bf16, a bad value rejected in one line") {
  using nlohmann::json;
  const json base = {{"model", {{"type", "gpt"}}}, {"data", {{"type", "char"}, {"path", "x.txt"}}}};
  json j = base;
  CHECK(config_from_json(j).distributed.reduce == GradReduce::fp32);
  j["distributed"]["reduce"] = "fp32";
  const RunConfig f = config_from_json(j);
  CHECK(f.distributed.reduce == GradReduce::fp32);
  CHECK(!config_to_json(f).contains("distributed"));  // the config (and hash) of earlier runs unchanged
  j["distributed"]["reduce"] = "bf16";
  const RunConfig b = config_from_json(j);
  CHECK(b.distributed.reduce == GradReduce::bf16);
  const json out = config_to_json(b);
  CHECK(out["distributed"]["reduce"] == "bf16");
  CHECK(config_from_json(out).distributed == b.distributed);
  j["distributed"]["reduce"] = "fp16";
  std::string msg;
  try {
    config_from_json(j);
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg == "config.distributed.reduce: \"fp16\" is not valid; valid: fp32, bf16");
  j["distributed"]["reduce"] = 16;
  CHECK_THROWS_AS(config_from_json(j), Error);
}
