// Per-layer numerics statistics on the CPU (numerics.hpp has the definitions).
#include "train/numerics.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "schemes/fp4tk/scalar.hpp"
#include "sim/block_rules.hpp"
#include "sim/block_scales.hpp"
#include "sim/rht.hpp"

namespace fp4lab::train {

std::array<uint8_t, 256> scale_class_table(const QuantizerSpec& q) {
  const std::array<float, 256> t = decode_table(*q.scale);
  float minpos = INFINITY, maxfin = 0;
  for (float v : t)
    if (std::isfinite(v) && v > 0) minpos = std::min(minpos, v), maxfin = std::max(maxfin, v);
  // fp4-trainkit's MX scales never go below its eps, 2^-23 (schemes/fp4tk/scalar.hpp): its floor.
  if (block_rule_id(q) == BlockRuleId::fp4tk && q.scale == &float8_e8m0fnu) minpos = fp4tk_eps;
  std::array<uint8_t, 256> c{};
  for (size_t i = 0; i < 256; ++i) {
    const float v = t[i];
    if (std::isnan(v) || v < 0 || (v == 0 && std::signbit(v) && i != 0)) continue;  // NaN, negative codes
    if (v <= minpos) c[i] = kScaleFloor;
    else if (v == maxfin) c[i] = kScaleCeil;
  }
  return c;
}

double NumericsCounts::amax() const {
  float f;
  std::memcpy(&f, &amax_bits, 4);
  return f;
}

double NumericsCounts::sqnr_db() const {
  if (finite == 0 || sum_err2 == 0) return std::nan("");
  return 10.0 * std::log10(sum_x2 / sum_err2);
}

void merge(NumericsCounts& a, const NumericsCounts& b) {
  a.quantized = a.quantized || b.quantized;
  a.scale_codes = a.scale_codes || b.scale_codes;
  a.sr = a.sr || b.sr;
  a.elements += b.elements, a.nan += b.nan, a.nonzero += b.nonzero, a.flushed += b.flushed;
  a.saturated += b.saturated, a.inexact += b.inexact, a.finite += b.finite;
  a.blocks += b.blocks, a.zero_blocks += b.zero_blocks, a.floor_blocks += b.floor_blocks;
  a.ceil_blocks += b.ceil_blocks;
  a.amax_bits = std::max(a.amax_bits, b.amax_bits);
  a.sum_x2 += b.sum_x2, a.sum_err2 += b.sum_err2, a.sum_err += b.sum_err;
}

namespace {

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

}  // namespace

NumericsCounts numerics_of(const QuantizerSpec& q, MatrixView<const float> t, const float* dq, const uint8_t* codes,
                           const uint8_t* scale_codes) {
  NumericsCounts n;
  n.quantized = true;
  n.sr = q.round == Round::rs;
  const int64_t rows = t.rows, cols = t.cols;
  n.elements = rows * cols;
  const ElementRule er = element_rule(*q.element);
  // The lanes of numerics.hpp: element i (row-major) is lane i mod L's; lane
  // group g (kNumericsLaneGroup lanes) visits its runs base + [0, group) for
  // base = g * group, g * group + L, ... (one thread per group: lanes never
  // shared). Integer counts per group; float64 sums per lane, then the tree.
  constexpr int64_t L = kNumericsLanes, G = kNumericsLaneGroup;
  struct Group {
    int64_t nan = 0, nonzero = 0, flushed = 0, saturated = 0, inexact = 0, finite = 0;
    uint32_t amax = 0;
  };
  std::vector<Group> gs(size_t(L / G));
  std::vector<double> x2(size_t(L), 0.0), e2(size_t(L), 0.0), es(size_t(L), 0.0);
  const int64_t total = n.elements;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < L / G; ++g) {
    Group w;
    for (int64_t base = g * G; base < total; base += L) {
      const int64_t end = std::min(base + G, total);
      int64_t r = base / cols, c = base % cols;
      for (int64_t i = base; i < end; ++i) {
        const float v = t.data[r * t.stride + c], d = dq[i];
        const uint32_t f = element_flags(v, d, codes[i], er);
        w.nan += (f & kNumNan) ? 1 : 0;
        w.nonzero += (f & kNumNonzero) ? 1 : 0;
        w.flushed += (f & kNumFlushed) ? 1 : 0;
        w.saturated += (f & kNumSaturated) ? 1 : 0;
        w.inexact += (f & kNumInexact) ? 1 : 0;
        if (!(f & kNumNan)) w.amax = std::max(w.amax, abs_bits(bits_of(v)));
        if (f & kNumFinite) {
          ++w.finite;
          const double x = double(v), y = double(d), e = x - y;
          const size_t lane = size_t(i - base + g * G);
          x2[lane] += x * x;
          e2[lane] += e * e;
          es[lane] += y - x;
        }
        if (++c == cols) c = 0, ++r;
      }
    }
    gs[size_t(g)] = w;
  }
  for (const Group& w : gs) {
    n.nan += w.nan, n.nonzero += w.nonzero, n.flushed += w.flushed, n.saturated += w.saturated;
    n.inexact += w.inexact, n.finite += w.finite, n.amax_bits = std::max(n.amax_bits, w.amax);
  }
  n.sum_x2 = numerics_tree_sum(x2.data(), L);
  n.sum_err2 = numerics_tree_sum(e2.data(), L);
  n.sum_err = numerics_tree_sum(es.data(), L);
  const BlockGrid g = block_grid(q, rows, cols);
  n.blocks = g.nbr * g.nbc;
  n.scale_codes = scale_codes != nullptr;
  const std::array<uint8_t, 256> table = scale_class_table(q);
  // Block amaxes in one row-major pass (contiguous for every block shape).
  std::vector<uint32_t> bamax(size_t(n.blocks), 0u);
  for (int64_t r = 0; r < rows; ++r) {
    uint32_t* ba = bamax.data() + (r / g.br) * g.nbc;
    const float* tr = t.data + r * t.stride;
    for (int64_t bj = 0; bj < g.nbc; ++bj) {
      uint32_t a = ba[bj];
      const int64_t c1 = std::min(cols, (bj + 1) * g.bc);
      for (int64_t c = bj * g.bc; c < c1; ++c) a = std::max(a, abs_bits(bits_of(tr[c])));
      ba[bj] = a;
    }
  }
  for (int64_t i = 0; i < n.blocks; ++i) {
    const uint32_t a = bamax[size_t(i)];
    if (a == 0) ++n.zero_blocks;
    if (scale_codes) {
      const uint8_t f = block_flags(a, scale_codes[i], table.data());
      n.floor_blocks += (f & kScaleFloor) ? 1 : 0;
      n.ceil_blocks += (f & kScaleCeil) ? 1 : 0;
    }
  }
  return n;
}

NumericsCounts numerics_of(const QuantizedTensor& qt, MatrixView<const float> x) {
  if (x.rows != qt.rows || x.cols != qt.cols) throw Error("numerics_of: the input's shape differs from the quantized tensor's");
  const std::vector<float> t = quantizer_domain(qt.spec, x);
  return numerics_of(qt.spec, MatrixView<const float>(t.data(), qt.rows, qt.cols), qt.dequant.data(), qt.codes.data(),
                     qt.scale_codes.empty() ? nullptr : qt.scale_codes.data());
}

NumericsCounts amax_only(MatrixView<const float> t) {
  NumericsCounts n;
  n.elements = t.rows * t.cols;
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < t.cols; ++c) {
      const float v = t.data[r * t.stride + c];
      if (std::isnan(v)) ++n.nan;
      else n.amax_bits = std::max(n.amax_bits, abs_bits(bits_of(v)));
    }
  return n;
}

NumericsCounts operand_numerics(const OperandPlan& p, MatrixView<const float> src) {
  std::vector<float> buf(size_t(src.rows * src.cols));
  for (int64_t r = 0; r < src.rows; ++r)
    std::copy(src.data + r * src.stride, src.data + r * src.stride + src.cols, buf.data() + r * src.cols);
  MatrixView<float> m(buf.data(), src.rows, src.cols);
  if (p.pre) fake_quantize(*p.pre, m, p.pre_stream);
  if (p.rht) rht_forward(m, p.rht_axis, p.rht_kind, p.rht_seed);
  const MatrixView<const float> t(buf.data(), src.rows, src.cols);
  if (!p.quantizer) return amax_only(t);
  const QuantizedTensor qt = quantize(*p.quantizer, t, p.stream);
  if (p.quantizer->rht) return numerics_of(qt, t);  // in the quantizer's RHT domain
  return numerics_of(*p.quantizer, t, qt.dequant.data(), qt.codes.data(),
                     qt.scale_codes.empty() ? nullptr : qt.scale_codes.data());
}

std::string numerics_line(int64_t step, uint64_t layer_id, const std::string& layer, Operand op,
                          const QuantizerSpec* q, const NumericsCounts& c) {
  using nlohmann::json;
  auto frac = [](int64_t a, int64_t b) { return b > 0 ? double(a) / double(b) : 0.0; };
  json j{{"step", step}, {"layer", layer}, {"layer_id", layer_id}, {"operand", operand_name(op)}};
  j["quantizer"] = q ? json(describe(*q)) : json(nullptr);
  j["elements"] = c.elements;
  j["amax"] = c.amax();
  j["nan"] = c.nan;
  if (!c.quantized) return j.dump();
  j["flushed"] = frac(c.flushed, c.nonzero);
  j["saturated"] = frac(c.saturated, c.elements);
  j["inexact"] = frac(c.inexact, c.elements);
  j["scale_floor"] = c.scale_codes ? json(frac(c.floor_blocks, c.blocks)) : json(nullptr);
  j["scale_ceil"] = c.scale_codes ? json(frac(c.ceil_blocks, c.blocks)) : json(nullptr);
  j["zero_blocks"] = frac(c.zero_blocks, c.blocks);
  const double s = c.sqnr_db();
  j["sqnr_db"] = std::isnan(s) ? json(nullptr) : json(s);
  j["mean_error"] = c.sr && c.finite > 0 ? json(c.sum_err / double(c.finite)) : json(nullptr);
  j["counts"] = {{"nonzero", c.nonzero},     {"flushed", c.flushed},         {"saturated", c.saturated},
                 {"inexact", c.inexact},     {"finite", c.finite},           {"blocks", c.blocks},
                 {"zero_blocks", c.zero_blocks}, {"floor_blocks", c.floor_blocks}, {"ceil_blocks", c.ceil_blocks}};
  j["sums"] = {{"x2", c.sum_x2}, {"err2", c.sum_err2}, {"err", c.sum_err}};
  return j.dump();
}

void NumericsRecorder::add_entry(Entry e) {
  for (Entry& x : entries_)
    if (x.layer_id == e.layer_id && x.op == e.op) return merge(x.c, e.c);
  entries_.push_back(std::move(e));
}

void NumericsRecorder::add(const LinearContext& ctx, const OperandPlan& p, const NumericsCounts& c) {
  add_entry(Entry{ctx.layer_id, std::string(ctx.layer_name), p.op, p.quantizer != nullptr,
                  p.quantizer ? *p.quantizer : QuantizerSpec{}, c});
}

void NumericsRecorder::add_later(const LinearContext& ctx, const OperandPlan& p,
                                 std::function<NumericsCounts()> counts) {
  pending_.emplace_back(Entry{ctx.layer_id, std::string(ctx.layer_name), p.op, p.quantizer != nullptr,
                              p.quantizer ? *p.quantizer : QuantizerSpec{}, NumericsCounts{}},
                        std::move(counts));
}

std::vector<std::string> NumericsRecorder::lines() {
  for (auto& [e, counts] : pending_) {
    e.c = counts();
    add_entry(std::move(e));
  }
  pending_.clear();
  std::vector<const Entry*> order;
  for (const Entry& e : entries_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->layer_id != b->layer_id ? a->layer_id < b->layer_id : a->op < b->op;
  });
  std::vector<std::string> out;
  for (const Entry* e : order) out.push_back(numerics_line(step_, e->layer_id, e->layer, e->op, e->has_q ? &e->q : nullptr, e->c));
  return out;
}

namespace {
thread_local NumericsRecorder* t_recorder = nullptr;
}

NumericsRecorder* numerics_recorder() { return t_recorder; }
NumericsScope::NumericsScope(NumericsRecorder* r) : prev_(t_recorder) { t_recorder = r; }
NumericsScope::~NumericsScope() { t_recorder = prev_; }

const std::vector<std::pair<std::string, std::string>>& numerics_stat_names() {
  static const std::vector<std::pair<std::string, std::string>> v = {
      {"flushed", "fraction of non-zero inputs quantized to 0"},
      {"saturated", "fraction of elements clamped at the element format's max"},
      {"inexact", "fraction of elements whose quantized value differs from the input"},
      {"scale_floor", "fraction of blocks whose scale is at the scale format's smallest value (or 0)"},
      {"scale_ceil", "fraction of blocks whose scale is at the scale format's largest value"},
      {"zero_blocks", "fraction of blocks that are all zero"},
      {"sqnr_db", "10 log10(sum x^2 / sum (x - q)^2), dB (null: exact)"},
      {"mean_error", "mean of q - x (stochastic rounding operands only)"},
      {"amax", "max |x| of the quantizer input"},
  };
  return v;
}

}  // namespace fp4lab::train
