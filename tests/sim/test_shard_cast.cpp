// NVFP4 primary weights cast shard by shard (sim/shard_cast.hpp): every split
// of the flat buffer among 1 to 8 in-process ranks, at the offsets that break
// byte-level gathers (odd, mid-byte, mid-tile, across tensors), assembles to
// exactly what quantize(nvfp4_2d, W) gives for each tensor alone; the
// column-wise copy (the nibble-packed transpose) equals quantizing W^T.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "sim/packing.hpp"
#include "sim/quantizer.hpp"
#include "sim/shard_cast.hpp"

using namespace fp4lab;

namespace {

struct Model {
  std::vector<FlatTensor> tensors;
  std::vector<float> flat;
  // The reference: each tensor quantized alone, packed, concatenated.
  std::vector<uint8_t> packed, scale_codes;
  std::vector<float> g_dec;
};

Model make_model(uint32_t seed, bool specials) {
  Model m;
  const int64_t shapes[][2] = {{37, 45}, {16, 16}, {50, 33}, {1, 7}, {20, 64}, {3, 1}};
  int64_t at = 0;
  for (const auto& s : shapes) {
    m.tensors.push_back({s[0], s[1], at});
    at += s[0] * s[1] + (s[0] == 16 ? 5 : 0);  // a gap after one tensor (not every buffer is dense)
  }
  m.flat.assign(size_t(at), 0.0f);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-6.0f, 3.0f);
  for (float& v : m.flat) v = nd(rng) * std::pow(10.0f, mag(rng));
  if (specials) {
    m.flat[size_t(m.tensors[2].offset + 40)] = NAN;                                    // tensor 2 all NaN
    m.flat[size_t(m.tensors[4].offset + 77)] = INFINITY;                               // tensor 4: Inf
    for (int64_t i = 0; i < 256; ++i) m.flat[size_t(m.tensors[1].offset + i)] = 0.0f;  // an all-zero tensor
  }
  const QuantizerSpec q = quantizer_by_name("nvfp4_2d");
  for (const FlatTensor& t : m.tensors) {
    const QuantizedTensor qt = quantize(q, MatrixView<const float>(m.flat.data() + t.offset, t.rows, t.cols));
    const std::vector<uint8_t> p = pack_fp4(qt.codes.data(), t.rows, t.cols);
    m.packed.insert(m.packed.end(), p.begin(), p.end());
    m.scale_codes.insert(m.scale_codes.end(), qt.scale_codes.begin(), qt.scale_codes.end());
    m.g_dec.push_back(qt.global_decode);
  }
  return m;
}

int64_t total(const Model& m) { return int64_t(m.flat.size()); }

// The protocol of shard_cast.hpp with in-process ranks; true when it equals the reference.
bool split_matches(const Model& m, const std::vector<ShardRange>& shards) {
  ShardAmax global = shard_partial_amax(m.tensors, m.flat.data(), shards[0]);
  for (size_t k = 1; k < shards.size(); ++k) max_into(global, shard_partial_amax(m.tensors, m.flat.data(), shards[k]));
  const ShardScales s = shard_scales(m.tensors, global);
  std::vector<ShardBytes> parts;
  for (const ShardRange& r : shards) parts.push_back(shard_cast(m.tensors, m.flat.data(), r, s));
  const std::vector<uint8_t> packed = assemble_packed(m.tensors, parts);
  bool ok = packed == m.packed && s.tile_code == m.scale_codes;
  // The equal-window form of step 5: each rank's span (packed_span from the geometry alone) inside its window
  // of its zeroed buffer; the windows ORed into place give the same buffer.
  const PackedWindows w = packed_windows(m.tensors, shards);
  std::vector<uint8_t> windows, by_windows(m.packed.size(), 0);
  for (size_t k = 0; k < shards.size(); ++k) {
    const ShardRange sp = packed_span(m.tensors, shards[k]);
    const ShardBytes& b = parts[k];
    ok = ok && (b.bytes.empty() ? sp.begin == sp.end
                                : sp.begin == b.first_byte && sp.end == b.first_byte + int64_t(b.bytes.size()));
    ok = ok &&
         (b.bytes.empty() || (w.at[k] <= b.first_byte && b.first_byte + int64_t(b.bytes.size()) <= w.at[k] + w.size));
    std::vector<uint8_t> own(m.packed.size(), 0);
    std::copy(b.bytes.begin(), b.bytes.end(), own.begin() + b.first_byte);
    windows.insert(windows.end(), own.begin() + w.at[k], own.begin() + w.at[k] + w.size);
  }
  or_windows(by_windows, windows, w);
  ok = ok && by_windows == m.packed;
  for (size_t i = 0; i < m.g_dec.size(); ++i) ok = ok && float_bits(s.g_dec[i]) == float_bits(m.g_dec[i]);
  return ok;
}

std::vector<ShardRange> cuts_to_shards(std::vector<int64_t> cuts, int64_t n) {
  std::vector<ShardRange> s;
  int64_t at = 0;
  for (int64_t c : cuts) {
    s.push_back({at, c});
    at = c;
  }
  s.push_back({at, n});
  return s;
}

}  // namespace

TEST_CASE("shard cast: 1 to 8 even ranks, and the offsets 0, 1, 15, 16, 17, 33, equal the full cast") {
  for (const bool specials : {false, true}) {
    CAPTURE(specials);
    const Model m = make_model(7, specials);
    const int64_t n = total(m);
    for (int ranks = 1; ranks <= 8; ++ranks) {
      CAPTURE(ranks);
      CHECK(split_matches(m, even_shards(n, ranks)));
    }
    // Boundaries at the offsets that break byte-level gathers, and at odd lengths, mid-tile and across tensors.
    CHECK(split_matches(m, cuts_to_shards({1, 15, 16, 17, 33}, n)));
    CHECK(split_matches(m, cuts_to_shards({0, 0, 33, 33}, n)));                               // empty shards
    CHECK(split_matches(m, cuts_to_shards({1665 - 1, 1665 + 1, 1665 + 256 + 2, n - 1}, n)));  // around tensor 1
    for (int64_t off : {int64_t(1), int64_t(15), int64_t(16), int64_t(17), int64_t(33)}) {
      CAPTURE(off);
      CHECK(split_matches(m, cuts_to_shards({off}, n)));
      CHECK(split_matches(m, cuts_to_shards({off, n - off}, n)));
    }
  }
}

TEST_CASE("shard cast: random splits (property), and a byte-level gather would keep a stale nibble") {
  const Model m = make_model(11, false);
  const int64_t n = total(m);
  std::mt19937 rng(3);
  int checked = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int ranks = 1 + int(rng() % 8);
    std::vector<int64_t> cuts;
    for (int k = 1; k < ranks; ++k) cuts.push_back(int64_t(rng() % uint32_t(n + 1)));
    std::sort(cuts.begin(), cuts.end());
    REQUIRE(split_matches(m, cuts_to_shards(cuts, n)));
    ++checked;
  }
  CHECK(checked == 200);
  // Why the OR: with a boundary at an odd element of a row, both ranks' spans hold the shared byte; a
  // gather that copies whole bytes (the later rank's byte over the earlier's) loses the earlier's nibble.
  const std::vector<ShardRange> s = cuts_to_shards({17}, n);
  ShardAmax g = shard_partial_amax(m.tensors, m.flat.data(), s[0]);
  max_into(g, shard_partial_amax(m.tensors, m.flat.data(), s[1]));
  const ShardScales sc = shard_scales(m.tensors, g);
  const ShardBytes a = shard_cast(m.tensors, m.flat.data(), s[0], sc),
                   b = shard_cast(m.tensors, m.flat.data(), s[1], sc);
  REQUIRE(a.first_byte + int64_t(a.bytes.size()) - 1 == b.first_byte);  // byte 8 is shared
  std::vector<uint8_t> copied(m.packed.size(), 0);
  for (const ShardBytes* p : {&a, &b}) std::copy(p->bytes.begin(), p->bytes.end(), copied.begin() + p->first_byte);
  CHECK(copied != m.packed);
  CHECK((a.bytes.back() & 0xF0u) == 0);  // rank 0 owns only the low nibble of the shared byte
  CHECK((b.bytes.front() & 0x0Fu) == 0);
}

TEST_CASE("shard cast: the column-wise copy (nibble-packed transpose) equals quantizing W^T") {
  const Model m = make_model(5, false);
  const QuantizerSpec q = quantizer_by_name("nvfp4_2d");
  const ShardAmax g = shard_partial_amax(m.tensors, m.flat.data(), {0, total(m)});
  const std::vector<uint8_t> packed = assemble_packed(
      m.tensors,
      std::vector<ShardBytes>{shard_cast(m.tensors, m.flat.data(), {0, total(m)}, shard_scales(m.tensors, g))});
  int64_t at = 0;
  for (const FlatTensor& t : m.tensors) {
    CAPTURE(t.rows);
    CAPTURE(t.cols);
    const std::vector<uint8_t> codes = unpack_fp4(packed.data() + at, t.rows, t.cols);
    std::vector<float> wt(size_t(t.rows * t.cols));
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = 0; c < t.cols; ++c) wt[size_t(c * t.rows + r)] = m.flat[size_t(t.offset + r * t.cols + c)];
    const QuantizedTensor qt = quantize(q, MatrixView<const float>(wt.data(), t.cols, t.rows));
    CHECK(pack_fp4_transposed(codes.data(), t.rows, t.cols) == pack_fp4(qt.codes.data(), t.cols, t.rows));
    at += t.rows * ((t.cols + 1) / 2);
  }
}

TEST_CASE(
    "dequantize_packed: the dequantized weights equal quantize(nvfp4_2d).dequant, bit for bit, specials included") {
  for (bool specials : {false, true}) {
    CAPTURE(specials);
    const Model m = make_model(11, specials);
    const ShardScales s = shard_scales(m.tensors, shard_partial_amax(m.tensors, m.flat.data(), {0, total(m)}));
    std::vector<float> out(m.flat.size(), -7.0f);  // elements outside the tensors (the gap) stay as they are
    dequantize_packed(m.tensors, m.packed, s, out.data());
    int64_t covered = 0;
    for (const FlatTensor& t : m.tensors) {
      const QuantizedTensor q =
          quantize(quantizer_by_name("nvfp4_2d"), MatrixView<const float>(m.flat.data() + t.offset, t.rows, t.cols));
      bool same = true;
      for (int64_t i = 0; i < t.rows * t.cols; ++i)
        same = same && float_bits(out[size_t(t.offset + i)]) == float_bits(q.dequant[size_t(i)]);
      CHECK_MESSAGE(same, "tensor at offset " << t.offset);
      covered += t.rows * t.cols;
    }
    CHECK(std::count(out.begin(), out.end(), -7.0f) == total(m) - covered);
  }
}

namespace {

// quantize(nvfp4_2d, W^T) of tensor t of m, W^T made dense element by element (the oracle of the transposes).
QuantizedTensor quantize_transposed(const Model& m, const FlatTensor& t) {
  std::vector<float> wt(size_t(t.rows * t.cols));
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < t.cols; ++c) wt[size_t(c * t.rows + r)] = m.flat[size_t(t.offset + r * t.cols + c)];
  return quantize(quantizer_by_name("nvfp4_2d"), MatrixView<const float>(wt.data(), t.cols, t.rows));
}

}  // namespace

TEST_CASE("transpose_packed: each tensor's column-wise copy equals quantize(nvfp4_2d, W^T) packed (dense oracle)") {
  const Model m = make_model(8, true);
  std::vector<ShardBytes> parts;
  const ShardScales s = shard_scales(m.tensors, shard_partial_amax(m.tensors, m.flat.data(), {0, total(m)}));
  for (const ShardRange& r : even_shards(total(m), 3)) parts.push_back(shard_cast(m.tensors, m.flat.data(), r, s));
  const std::vector<uint8_t> tr = transpose_packed(m.tensors, assemble_packed(m.tensors, parts));
  std::vector<uint8_t> want;
  for (const FlatTensor& t : m.tensors) {
    const QuantizedTensor q = quantize_transposed(m, t);
    const std::vector<uint8_t> p = pack_fp4(q.codes.data(), t.cols, t.rows);
    want.insert(want.end(), p.begin(), p.end());
  }
  CHECK(tr == want);
  CHECK_THROWS_AS(transpose_packed(m.tensors, std::vector<uint8_t>(3)), Error);
}

TEST_CASE("transpose_tile_codes: each tensor's column-wise tile codes equal quantize(nvfp4_2d, W^T)'s scale codes") {
  // Shapes with partial tiles on either axis and more tile rows than tile columns and the reverse, so that a
  // transpose that kept the row-of-tiles stride, or swapped a partial edge, differs.
  for (bool specials : {false, true}) {
    CAPTURE(specials);
    const Model m = make_model(21, specials);
    const ShardScales s = shard_scales(m.tensors, shard_partial_amax(m.tensors, m.flat.data(), {0, total(m)}));
    const std::vector<uint8_t> tr = transpose_tile_codes(m.tensors, s.tile_code);
    std::vector<uint8_t> want;
    for (const FlatTensor& t : m.tensors) {
      const QuantizedTensor q = quantize_transposed(m, t);
      CHECK(q.scale_rows == (t.cols + 15) / 16);
      CHECK(q.scale_cols == (t.rows + 15) / 16);
      want.insert(want.end(), q.scale_codes.begin(), q.scale_codes.end());
    }
    CHECK(tr == want);
    CHECK(tr != s.tile_code);  // the shapes make the transpose a different order (the check above has teeth)
  }
  CHECK_THROWS_AS(transpose_tile_codes(make_model(1, false).tensors, std::vector<uint8_t>(3)), Error);
}
