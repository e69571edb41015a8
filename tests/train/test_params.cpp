// Parameter store (train/params.cpp): layout, names, reproducible init with the right statistics.
#include <doctest/doctest.h>

#include <cmath>

#include "train/params.hpp"
#include "core/error.hpp"

using namespace fp4lab::train;

TEST_CASE("flat buffer with named views; init statistics") {
  auto be = make_cpu_backend(1);
  ParamStore ps;
  const int a = ps.add("a", 100, 100, true, Init::normal, 0.02f);
  const int b = ps.add("b", 1, 10000, false, Init::uniform, 0.5f);
  const int c = ps.add("c", 50, 200, false, Init::trunc_normal, 1.5f);
  CHECK_THROWS_AS(ps.add("a", 1, 1, false, Init::zeros), fp4lab::Error);
  ps.finalize(*be, 7);
  CHECK(ps.size() == 30000);
  CHECK(ps.info(b).offset == 10000);
  CHECK(ps.index("c") == c);
  CHECK_THROWS_AS(ps.index("d"), fp4lab::Error);
  REQUIRE(ps.decay_ranges.size() == 1);
  CHECK(ps.decay_ranges[0] == IndexRange{0, 10000});
  double s2 = 0, mx = 0, umax = 0;
  for (int64_t i = 0; i < 10000; ++i) s2 += double(ps.value(a).data[i]) * ps.value(a).data[i];
  CHECK(std::sqrt(s2 / 10000) == doctest::Approx(0.02).epsilon(0.05));
  for (int64_t i = 0; i < 10000; ++i) umax = std::max(umax, double(std::abs(ps.value(b).data[i])));
  CHECK(umax <= 0.5);
  CHECK(umax > 0.49);
  for (int64_t i = 0; i < 10000; ++i) mx = std::max(mx, double(std::abs(ps.value(c).data[i])));
  CHECK(mx <= 2.0);  // truncated at +-2 (absolute)
  // Reproducible: the same seed gives the same values.
  ParamStore p2;
  p2.add("a", 100, 100, true, Init::normal, 0.02f);
  p2.finalize(*be, 7);
  CHECK(p2.value(0).data[1234] == ps.value(a).data[1234]);
}

TEST_CASE("storage: FP32 unless set; set_storage records it per parameter; params_with lists them in order") {
  auto be = make_cpu_backend(1);
  ParamStore ps;
  const int a = ps.add("a.weight", 4, 8, true, Init::normal, 0.02f);
  const int b = ps.add("a.bias", 1, 4, false, Init::zeros);
  const int c = ps.add("b.weight", 8, 4, true, Init::normal, 0.02f);
  const int idx[] = {c, a};
  CHECK_THROWS_AS(ps.set_storage(idx, Storage::nvfp4_2d, *be), fp4lab::InternalError);  // before finalize
  ps.finalize(*be, 7);
  for (int i : {a, b, c}) {
    CHECK(ps.storage(i) == Storage::fp32);
    CHECK(ps.cast_spec(i) == nullptr);
  }
  CHECK(ps.params_with(Storage::fp32) == std::vector<int>{a, b, c});
  CHECK(ps.params_with(Storage::nvfp4_2d).empty());
  ps.set_storage(idx, Storage::nvfp4_2d, *be);
  CHECK(ps.storage(a) == Storage::nvfp4_2d);
  CHECK(ps.storage(b) == Storage::fp32);
  CHECK(ps.storage(c) == Storage::nvfp4_2d);
  CHECK(ps.params_with(Storage::nvfp4_2d) == std::vector<int>{a, c});  // increasing, whatever the order given
  CHECK(ps.params_with(Storage::fp32) == std::vector<int>{b});
  REQUIRE(ps.cast_spec(a) != nullptr);
  CHECK(*ps.cast_spec(a) == fp4lab::quantizer_by_name("nvfp4_2d"));
  CHECK(ps.cast_spec(a) == storage_cast(Storage::nvfp4_2d));
  CHECK(ps.cast_spec(b) == nullptr);
  CHECK(storage_name(Storage::fp32) == "fp32");
  CHECK(storage_name(Storage::nvfp4_2d) == "nvfp4_2d");
  // Bad indices: one line naming the index and the valid range, or the parameter listed twice.
  const int out_of_range[] = {3};
  const int negative[] = {-1};
  const int twice[] = {a, a};
  for (auto bad : {std::span<const int>(out_of_range), std::span<const int>(negative), std::span<const int>(twice)}) {
    try {
      ps.set_storage(bad, Storage::fp32, *be);
      FAIL("no error");
    } catch (const fp4lab::Error& e) {
      const std::string m = e.what();
      CHECK(m.find("storage fp32") != std::string::npos);
      CHECK(
          (m.find("valid: 0 <= index < 3") != std::string::npos || m.find("\"a.weight\" twice") != std::string::npos));
    }
  }
  CHECK(ps.storage(a) == Storage::nvfp4_2d);  // a failed call changes nothing
  // The nvfp4_2d tensors' cast store: theirs, in index order; the cpu backend keeps no stored form.
  REQUIRE(ps.cast_store() != nullptr);
  const std::span<const fp4lab::FlatTensor> t = ps.cast_store()->tensors();
  REQUIRE(t.size() == 2);
  CHECK((t[0].rows == 4 && t[0].cols == 8 && t[0].offset == ps.info(a).offset));
  CHECK((t[1].rows == 8 && t[1].cols == 4 && t[1].offset == ps.info(c).offset));
  CHECK(!ps.cast_store()->device());
  for (int i : {a, b, c}) CHECK(ps.stored(i) == nullptr);
  const int all[] = {a, c};
  ps.set_storage(all, Storage::fp32, *be);
  CHECK(ps.cast_store() == nullptr);  // nothing stored as nvfp4_2d
}

namespace {
// A provider that hands out its own buffers and a stored form for parameter 0 only (what ZeRO-3's
// ShardedParams does per unit on the cuda backend).
struct FakeProvider final : ParamProvider {
  StoredWeight form;
  std::vector<float> v = std::vector<float>(64, 1.5f), g = std::vector<float>(64, 0.0f);
  float* value_ptr(int i) override { return v.data() + i; }
  float* grad_ptr(int i) override { return g.data() + i; }
  const StoredWeight* stored(int i) const override { return i == 0 ? &form : nullptr; }
};
}  // namespace

TEST_CASE("storage with a provider: stored() asks the provider; the whole-model cast store is released") {
  auto be = make_cpu_backend(1);
  ParamStore ps;
  const int a = ps.add("a.weight", 4, 8, true, Init::normal, 0.02f);
  const int b = ps.add("a.bias", 1, 4, false, Init::zeros);
  ps.finalize(*be, 7);
  const int idx[] = {a};
  ps.set_storage(idx, Storage::nvfp4_2d, *be);
  REQUIRE(ps.cast_store() != nullptr);
  CHECK(ps.stored(a) == nullptr);  // the cpu backend's store keeps no form
  FakeProvider p;
  ps.set_provider(&p);
  CHECK(ps.has_provider());
  CHECK(ps.cast_store() == nullptr);                // the provider's stores hold the cast from now on
  CHECK(ps.storage(a) == Storage::nvfp4_2d);        // the storage stays recorded
  CHECK(ps.cast_spec(a) == storage_cast(Storage::nvfp4_2d));
  CHECK(ps.stored(a) == &p.form);                   // the provider's form, not a store's
  CHECK(ps.stored(b) == nullptr);
  CHECK(ps.value_ptr(b) == p.v.data() + b);
  CHECK(ps.grad_ptr(a) == p.g.data() + a);
  CHECK(ps.values.data == nullptr);
  CHECK_THROWS_AS(ps.set_provider(&p), fp4lab::Error);  // once
}
