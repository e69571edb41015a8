// The backend operation table and its runners (backend_cases.hpp).
//
// Tolerances (the CUDA backend against the CPU's; the CPU runner compares every
// output bit for bit instead): the two backends evaluate the same FP32/FP64
// operations and differ only in summation order (and erff/expf vs glibc,
// <= 2 ulp). A sum of K float terms reordered changes by about
// sqrt(K) * 2^-24 * max|term| typically, K * 2^-24 * sum|term| at worst; with
// K <= a few hundred and the chained GEMM -> softmax -> GEMM of attention this
// stays below ~1e-5 of the output's magnitude. So: max |gpu - cpu| <= tol *
// (1 + max |cpu|) with tol 2e-6 for elementwise ops, 1e-5 for row reductions
// and 3e-5 for attention. Bit for bit (tol 0) where both backends do the same
// operations in the same order: copies, dropout masks, embeddings and ViT
// tokens (float32 scatter-adds in row order, float64 column sums in row
// order), LayerNorm's dgamma/dbeta (the CPU's 256-row blocks), add_inplace,
// scale, gather/scatter, AdamW (no FMA contraction on either side, IEEE sqrt
// and division), a linear layer's db for up to 256 rows. Float64 results (loss,
// sum_squares): 1e-12. The linear layer (GEMMs of K <= 272 terms on operands
// the two backends quantize to the same bits, train/cuda/linear.hpp): 1e-4, as
// test_linear.cpp's worst-case bound 4 (K + 8) 2^-24 sum_k |a||b| stays below
// ~3e-5 (1 + max |y|) for these normal inputs (sum_k |a||b| < 2.5 max |y|).
#include "train/backend_cases.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <sstream>

#include "core/error.hpp"
#include "recipes/recipe.hpp"

namespace fp4lab::train::test {

namespace {

template <class... A>
std::string cat(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  return s.str();
}

Output host(std::string name, const std::vector<float>& h, int64_t rows, int64_t cols, double tol = -1.0) {
  Output o;
  o.name = std::move(name);
  o.v.assign(h.begin(), h.end());
  o.rows = rows;
  o.cols = cols;
  o.tol = tol;
  return o;
}
// t downloaded.
Output out(Backend& be, std::string name, const Tensor& t, double tol = -1.0) {
  std::vector<float> h(size_t(t.size()));
  be.download(t, h.data());
  return host(std::move(name), h, t.rows, t.cols, tol);
}
Output scalar(std::string name, double v, double tol = -1.0) {
  Output o;
  o.name = std::move(name);
  o.v = {v};
  o.f32 = false;
  o.tol = tol;
  return o;
}

// ---- The rows ---------------------------------------------------------------

void memory_cases(std::vector<OpCase>& cs) {
  cs.push_back({"upload/download",
                "7x13",
                0.0,
                [](Backend& be) {
                  const auto v = randv(7 * 13, 1);
                  Tensor t = put(be, v, 7, 13);
                  return Outputs{out(be, "downloaded", t), host("uploaded", v, 7, 13)};
                },
                {{"downloaded", "uploaded"}},
                {}});
  cs.push_back({"copy",
                "7x13 -> 13x7",
                0.0,
                [](Backend& be) {
                  const auto v = randv(7 * 13, 2);
                  Tensor s = put(be, v, 7, 13), d = be.empty(13, 7);
                  be.copy(s, d);
                  return Outputs{out(be, "dst", d), host("src", v, 7, 13)};
                },
                {{"dst", "src"}},
                {}});
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{13, 7}, {1, 1}, {300, 1001}}) {
    cs.push_back({"fill",
                  cat(rows, "x", cols, " with -2.5, zeros"),
                  0.0,
                  [rows, cols](Backend& be) {
                    Tensor t = put(be, randv(size_t(rows * cols), 3), rows, cols);
                    be.fill(t, -2.5f);
                    Tensor z = be.zeros(cols, rows);
                    return Outputs{out(be, "filled", t), out(be, "zeros", z)};
                  },
                  {},
                  [](const Outputs& o) {
                    const auto& f = find_output(o, "filled").v;
                    const auto& z = find_output(o, "zeros").v;
                    CHECK_MESSAGE(std::all_of(f.begin(), f.end(), [](double x) { return x == -2.5; }),
                                  "fill(-2.5) left other values");
                    CHECK_MESSAGE(
                        std::all_of(z.begin(), z.end(), [](double x) { return std::signbit(x) == 0 && x == 0; }),
                        "zeros() is not all +0");
                  }});
  }
  struct Cols {
    int64_t rows, src_cols, src_col, dst_cols, dst_col, n;
  };
  for (const Cols& g :
       {Cols{7, 13, 5, 9, 2, 4}, Cols{300, 64, 0, 200, 136, 64}, Cols{1, 1, 0, 3, 2, 1}, Cols{33, 96, 64, 32, 0, 32}}) {
    cs.push_back({"copy_cols",
                  cat("[", g.rows, ", ", g.src_cols, "] cols ", g.src_col, ".. -> [", g.rows, ", ", g.dst_cols,
                      "] col ", g.dst_col, ", ", g.n, " cols"),
                  0.0, [g](Backend& be) {
                    Tensor s = put(be, randv(size_t(g.rows * g.src_cols), 4), g.rows, g.src_cols);
                    Tensor d = put(be, randv(size_t(g.rows * g.dst_cols), 5), g.rows, g.dst_cols);
                    be.copy_cols(s, g.src_col, d, g.dst_col, g.n);
                    return Outputs{out(be, "dst", d)};
                  }});
  }
  cs.push_back({"empty",
                "0x5",
                0.0,
                [](Backend& be) {
                  Tensor e = be.empty(0, 5);
                  return Outputs{scalar("size", double(e.size()))};
                },
                {},
                [](const Outputs& o) { CHECK(find_output(o, "size").v[0] == 0.0); }});
}

struct LinShape {
  int64_t B, in, out;
  bool bias;
};
OpCase linear_case(std::optional<Recipe> rec, LinShape s, uint32_t seed) {
  OpCase c;
  c.op = "linear_forward/backward";
  c.params = cat(rec ? "recipe " + rec->name : std::string("FP32 (no recipe)"), ", B=", s.B, " in=", s.in,
                 " out=", s.out, s.bias ? " bias" : " no bias");
  c.tol = 1e-4;
  c.run = [rec, s, seed](Backend& be) {
    const LinearContext ctx{rec ? &*rec : nullptr, 987654321ull, 5, 11, "blocks.0.mlp.fc"};
    Tensor x = put(be, randv(size_t(s.B * s.in), seed), s.B, s.in);
    Tensor w = put(be, randv(size_t(s.out * s.in), seed + 1, 0.1f), s.out, s.in);
    Tensor b = put(be, randv(size_t(s.out), seed + 2), 1, s.out);
    Tensor dy = put(be, randv(size_t(s.B * s.out), seed + 3), s.B, s.out);
    Tensor dw = put(be, randv(size_t(s.out * s.in), seed + 4, 0.01f), s.out, s.in);
    Tensor db = put(be, randv(size_t(s.out), seed + 5, 0.01f), 1, s.out);
    Tensor y = be.empty(s.B, s.out), dx = be.empty(s.B, s.in);
    std::unique_ptr<LinearState> st;
    be.linear_forward(ctx, x, w, s.bias ? b.data : nullptr, y, st);
    be.linear_backward(ctx, *st, w, dy, dx, dw, s.bias ? db.data : nullptr);
    // db: float64 column sums of dy in row order, bit for bit up to 256 rows.
    return Outputs{out(be, "y", y), out(be, "dx", dx), out(be, "dW (accumulated)", dw),
                   out(be, "db (accumulated)", db, s.B <= 256 ? 0.0 : 1e-6)};
  };
  return c;
}
void linear_cases(std::vector<OpCase>& cs) {
  uint32_t seed = 200;
  for (const LinShape& s :
       {LinShape{37, 50, 29, true}, LinShape{1, 1, 1, false}, LinShape{272, 48, 75, true}, LinShape{64, 96, 64, false}})
    cs.push_back(linear_case(std::nullopt, s, seed += 10));
  // Every canned recipe on a shape all of them take (multiples of 32).
  for (const std::string& name : recipe_names())
    cs.push_back(linear_case(recipe_by_name(name), LinShape{64, 96, 64, true}, seed += 10));
}

void layernorm_cases(std::vector<OpCase>& cs) {
  const int64_t shapes[][2] = {{1, 1}, {1, 5}, {3, 7}, {37, 64}, {300, 130}, {513, 768}, {1100, 200}};
  uint32_t k = 0;
  for (auto [N, C] : shapes) {
    const bool with_beta = k++ % 2 == 0;
    OpCase c;
    c.op = "layernorm_forward/backward";
    c.params = cat("N=", N, " C=", C, with_beta ? " beta" : " no beta (dbeta not accumulated)");
    c.tol = 1e-5;
    c.run = [N, C, with_beta, k](Backend& be) {
      Tensor x = put(be, randv(size_t(N * C), 10 + k, 2.0f, 0.3f), N, C);
      Tensor g = put(be, randv(size_t(C), 20 + k, 0.5f, 1.0f), 1, C), b = put(be, randv(size_t(C), 30 + k), 1, C);
      Tensor y = be.empty(N, C), mean = be.empty(1, N), rstd = be.empty(1, N);
      be.layernorm_forward(x, g.data, with_beta ? b.data : nullptr, 1e-5f, y, mean, rstd);
      const auto dg0 = randv(size_t(C), 50 + k);
      Tensor dy = put(be, randv(size_t(N * C), 40 + k), N, C), dx = be.empty(N, C), dg = put(be, dg0, 1, C),
             db = put(be, randv(size_t(C), 60 + k), 1, C);
      be.layernorm_backward(dy, x, g.data, mean, rstd, dx, dg.data, with_beta ? db.data : nullptr);
      // The residual form: the bits of the plain form followed by add_inplace.
      Tensor res = put(be, randv(size_t(N * C), 70 + k), N, C), dxr = be.empty(N, C), dg2 = put(be, dg0, 1, C);
      be.layernorm_backward(dy, x, g.data, mean, rstd, dxr, dg2.data, nullptr, &res);
      Tensor sum = be.empty(N, C);
      be.copy(dx, sum);
      be.add_inplace(sum, res);
      // dgamma and dbeta: the CPU's summation order (256-row blocks in row order, then the blocks): bit for bit.
      return Outputs{out(be, "y", y),
                     out(be, "mean", mean),
                     out(be, "rstd", rstd),
                     out(be, "dx", dx),
                     out(be, "dgamma (accumulated)", dg, 0.0),
                     out(be, "dbeta (accumulated)", db, 0.0),
                     out(be, "dx with a residual", dxr),
                     out(be, "dx, then add_inplace(residual)", sum),
                     out(be, "dgamma with a residual", dg2, 0.0)};
    };
    c.same = {{"dx with a residual", "dx, then add_inplace(residual)"},
              {"dgamma with a residual", "dgamma (accumulated)"}};
    cs.push_back(std::move(c));
  }
}

// Both backends evaluate train/gelu_math.hpp: bit for bit (tolerance 0), the
// specials and the seams of erf_f32's fits included.
void gelu_cases(std::vector<OpCase>& cs) {
  for (int64_t n : {1, 257, 10007}) {
    cs.push_back({"gelu_forward/backward", cat("n=", n), 0.0, [n](Backend& be) {
                    std::vector<float> xv = randv(size_t(n), 3 + uint32_t(n), 3.0f);
                    // (No Inf or NaN: GELU makes NaNs of them, whose payloads differ by platform.)
                    const float special[] = {0.0f,   -0.0f,          1.0f,          -1.0f,   0.99999994f,
                                             2.5f,   2.4999998f,     -2.5f,         4.0f,    30.0f,
                                             -30.0f, 1e-40f,         1e30f,         -1e30f};
                    for (size_t i = 0; i < xv.size() && i < std::size(special); ++i) xv[i * 7 % xv.size()] = special[i];
                    Tensor x = put(be, xv, 1, n);
                    Tensor dy = put(be, randv(size_t(n), 4 + uint32_t(n)), 1, n), y = be.empty(1, n),
                           dx = be.empty(1, n);
                    be.gelu_forward(x, y);
                    be.gelu_backward(x, dy, dx);
                    return Outputs{out(be, "y", y), out(be, "dx", dx)};
                  }});
  }
}

void attention_cases(std::vector<OpCase>& cs) {
  uint32_t seed = 100;
  for (const AttentionGeometry& g : attention_geometries())
    for (bool causal : {false, true})
      for (float p : {0.0f, 0.1f}) {
        const int64_t B = g.B, T = g.T, H = g.H, C = H * g.hd;
        // Full attention with a large scale (sqrt(hd)): peaked softmax rows.
        const float scale = causal ? float(1.0 / std::sqrt(double(g.hd))) : float(std::sqrt(double(g.hd)));
        const AttentionShape s{B, T, H, causal, scale, p};
        seed += 2;
        OpCase c;
        c.op = "attention_forward/backward";
        c.params = cat("B=", B, " T=", T, " H=", H, " hd=", g.hd, causal ? " causal" : " full", " scale=", scale,
                       " dropout=", p);
        c.tol = 3e-5;
        c.run = [s, C, seed](Backend& be) {
          const int64_t N = s.batch * s.seq;
          const DropoutKey key{77, 0xABCDEF0123ull};
          Tensor qkv = put(be, randv(size_t(N * 3 * C), seed, 0.7f), N, 3 * C);
          Tensor dout = put(be, randv(size_t(N * C), seed + 1), N, C);
          Tensor o = be.empty(N, C), probs = be.empty(s.batch * s.heads * s.seq, s.seq), dqkv = be.empty(N, 3 * C);
          be.attention_forward(s, qkv, o, probs, key);
          be.attention_backward(s, qkv, probs, dout, dqkv, key);
          return Outputs{out(be, "probs", probs, 1e-5), out(be, "out", o), out(be, "dqkv", dqkv)};
        };
        if (causal && T > 1)
          c.check = [](const Outputs& o) {
            CHECK_MESSAGE(find_output(o, "probs").v[1] == 0.0, "causal: row 0 must see only token 0");
          };
        cs.push_back(std::move(c));
      }
}

void dropout_cases(std::vector<OpCase>& cs) {
  for (int64_t n : {1, 3, 4, 5, 1000, 4097})
    for (float p : {0.0f, 0.1f, 0.5f, 0.9f}) {
      OpCase c;
      c.op = "dropout_forward/backward, dropout_add, dropout_backward_to, add_dropout_backward_to";
      c.params = cat("n=", n, " p=", p);
      c.tol = 0.0;  // the masks: random_bits(seed, stream, i), the same everywhere
      c.run = [n, p](Backend& be) {
        const DropoutKey key{0x1234567890ull, (uint64_t(0xD) << 60) | 12345};
        const auto x = randv(size_t(n), 7 + uint32_t(n)), dy = randv(size_t(n), 8 + uint32_t(n));
        Tensor xf = put(be, x, 1, n), db = put(be, dy, 1, n);
        be.dropout_forward(xf, p, key);
        be.dropout_backward(db, p, key);
        Tensor r = put(be, x, 1, n), r2 = put(be, x, 1, n);
        be.dropout_add(r, db, p, key);  // the residual branch: drop(x) + db, fused where a backend can
        be.dropout_forward(r2, p, key);
        be.add_inplace(r2, db);
        Tensor src = put(be, dy, 1, n), dst = be.empty(1, n);
        be.dropout_backward_to(src, dst, p, key);
        Tensor y = put(be, dy, 1, n), yx = put(be, x, 1, n), dst2 = be.empty(1, n);
        be.add_dropout_backward_to(y, yx, dst2, p, key);
        Tensor y2 = put(be, dy, 1, n);
        be.add_inplace(y2, yx);
        Tensor d2 = be.empty(1, n);
        be.copy(y2, d2);
        be.dropout_backward(d2, p, key);
        return Outputs{out(be, "dropout_forward(x)", xf),
                       out(be, "dropout_backward(dy)", db),
                       out(be, "dropout_add", r),
                       out(be, "dropout_forward then add_inplace", r2),
                       out(be, "dropout_backward_to(dy)", dst),
                       out(be, "dy after dropout_backward_to", src),
                       out(be, "add_dropout_backward_to: y += x", y),
                       out(be, "add_dropout_backward_to: dst", dst2),
                       out(be, "add_inplace(y, x)", y2),
                       out(be, "add_inplace then dropout_backward", d2),
                       host("x", x, 1, n),
                       host("dy", dy, 1, n)};
      };
      c.same = {{"dropout_add", "dropout_forward then add_inplace"},
                {"dropout_backward_to(dy)", "dropout_backward(dy)"},
                {"dy after dropout_backward_to", "dy"},
                {"add_dropout_backward_to: y += x", "add_inplace(y, x)"},
                {"add_dropout_backward_to: dst", "add_inplace then dropout_backward"}};
      if (p == 0.0f) c.same.push_back({"dropout_forward(x)", "x"});  // p = 0 is a no-op (fp32 mode)
      if (n >= 1000 && p > 0.0f)
        c.check = [n, p](const Outputs& o) {  // the masks really drop about p of the elements
          const auto& v = find_output(o, "dropout_forward(x)").v;
          const double zeros = double(std::count(v.begin(), v.end(), 0.0));
          CHECK_MESSAGE(std::abs(zeros / double(n) - p) < 0.06, zeros, " of ", n, " dropped at p = ", p);
        };
      cs.push_back(std::move(c));
    }
}

void rows_cases(std::vector<OpCase>& cs) {
  struct Geo {
    int64_t N, C, stride, n;
  };
  for (const Geo& g : {Geo{37, 11, 9, 4}, Geo{1, 1, 1, 1}, Geo{1000, 130, 3, 333}, Geo{5, 300, 1, 5}}) {
    const std::string shape = cat(g.N, "x", g.C);
    cs.push_back({"add_inplace", shape, 0.0, [g](Backend& be) {
                    Tensor y = put(be, randv(size_t(g.N * g.C), 1), g.N, g.C);
                    be.add_inplace(y, put(be, randv(size_t(g.N * g.C), 2), g.N, g.C));
                    return Outputs{out(be, "y += x", y)};
                  }});
    cs.push_back({"scale", shape + " by -0.37", 0.0, [g](Backend& be) {
                    Tensor y = put(be, randv(size_t(g.N * g.C), 3), g.N, g.C);
                    be.scale(y, -0.37f);
                    return Outputs{out(be, "y", y)};
                  }});
    const std::string rows = cat(shape, " stride ", g.stride, ", ", g.n, " rows");
    cs.push_back({"gather_rows/scatter_rows",
                  rows,
                  0.0,
                  [g](Backend& be) {
                    Tensor x = put(be, randv(size_t(g.N * g.C), 4), g.N, g.C), o = be.empty(g.n, g.C);
                    be.gather_rows(x, g.stride, o);
                    const auto d = randv(size_t(g.n * g.C), 5);
                    Tensor dx = put(be, randv(size_t(g.N * g.C), 6), g.N, g.C), back = be.empty(g.n, g.C);
                    be.scatter_rows(put(be, d, g.n, g.C), g.stride, dx);
                    be.gather_rows(dx, g.stride, back);
                    return Outputs{out(be, "gathered", o), out(be, "scattered (zeros elsewhere)", dx),
                                   out(be, "gather of the scatter", back), host("dout", d, g.n, g.C)};
                  },
                  {{"gather of the scatter", "dout"}},
                  [g](const Outputs& o) {
                    const auto& dx = find_output(o, "scattered (zeros elsewhere)").v;
                    int64_t bad = 0;
                    for (int64_t r = 0; r < g.N; ++r)
                      if (r % g.stride != 0 || r / g.stride >= g.n)
                        for (int64_t c = 0; c < g.C; ++c) bad += dx[size_t(r * g.C + c)] != 0.0;
                    CHECK_MESSAGE(bad == 0, bad, " values of scatter_rows' dx outside the scattered rows are not 0");
                  }});
  }
}

// The mixture-of-experts routing ops: a random assignment of T tokens' k
// slots to the rows of a grouped tensor; checked against host loops written
// from the definitions in train/backend.hpp. With drops (capacity dispatch):
// every third slot dropped (pos -1) and the tensor 5 rows longer than the
// kept slots, so rows no slot names (idx -1) are zeros in and out.
void moe_cases(std::vector<OpCase>& cs) {
  struct Geo {
    int64_t T, k, C;
    bool drops;
  };
  // Widths of 4n take the CUDA kernels' float4 rows, the others their scalar rows; 130 > 128 columns a warp pass.
  for (const Geo& g : {Geo{1, 1, 1, false}, Geo{13, 2, 37, false}, Geo{64, 4, 130, false}, Geo{5, 3, 1, false},
                       Geo{13, 2, 37, true}, Geo{64, 4, 130, true}, Geo{70, 2, 384, false}, Geo{33, 3, 132, true}}) {
    const int64_t slots = g.T * g.k, kept = g.drops ? slots - (slots + 2) / 3 : slots, M = g.drops ? kept + 5 : slots;
    std::mt19937 rng(uint32_t(g.T * 7 + g.k * 3 + g.C + (g.drops ? 1 : 0)));
    std::vector<int32_t> rows(static_cast<size_t>(M)), pos(static_cast<size_t>(slots), -1),
        idx(static_cast<size_t>(M), -1);
    for (int64_t i = 0; i < M; ++i) rows[size_t(i)] = int32_t(i);
    std::shuffle(rows.begin(), rows.end(), rng);
    for (int64_t i = 0, next = 0; i < slots; ++i)
      if (!g.drops || i % 3 != 0) pos[size_t(i)] = rows[size_t(next++)];
    for (int64_t i = 0; i < slots; ++i)
      if (pos[size_t(i)] >= 0) idx[size_t(pos[size_t(i)])] = int32_t(i / g.k);  // row -> its token
    const std::vector<float> x = randv(size_t(g.T * g.C), 1), src = randv(size_t(M * g.C), 2),
                             w = randv(size_t(slots), 3), dout = randv(size_t(g.T * g.C), 4);
    cs.push_back({"gather_rows_indexed/combine_rows/combine_rows_backward",
                  cat("T=", g.T, " k=", g.k, " C=", g.C, g.drops ? " drops" : ""),
                  0.0,
                  [=](Backend& be) {
                    Tensor xt = put(be, x, g.T, g.C), gathered = be.empty(M, g.C);
                    be.fill(gathered, 7.0f);  // rows without a token must come out +0
                    be.gather_rows_indexed(xt, idx.data(), gathered);
                    Tensor st = put(be, src, M, g.C), y = be.empty(g.T, g.C), sums = be.empty(g.T, g.C);
                    be.combine_rows(st, pos.data(), w.data(), g.k, y);
                    be.combine_rows(st, pos.data(), nullptr, g.k, sums);
                    Tensor dsrc = be.empty(M, g.C);
                    be.fill(dsrc, 7.0f);  // rows no slot names must come out +0
                    std::vector<float> dw(static_cast<size_t>(slots), 7.0f);
                    be.combine_rows_backward(put(be, dout, g.T, g.C), st, pos.data(), w.data(), g.k, dsrc, dw.data());
                    // Host loops from the definitions (the oracle on every backend).
                    std::vector<float> hg(size_t(M * g.C)), hy(size_t(g.T * g.C)), hs(size_t(g.T * g.C)),
                        hd(size_t(M * g.C), 0.0f), hw(static_cast<size_t>(slots), 0.0f);
                    for (int64_t r = 0; r < M; ++r)
                      for (int64_t c = 0; c < g.C; ++c)
                        hg[size_t(r * g.C + c)] = idx[size_t(r)] < 0 ? 0.0f : x[size_t(idx[size_t(r)] * g.C + c)];
                    for (int64_t t = 0; t < g.T; ++t)
                      for (int64_t c = 0; c < g.C; ++c) {
                        float a = 0.0f, b = 0.0f;
                        for (int64_t j = 0; j < g.k; ++j) {
                          const int64_t i = t * g.k + j, r = pos[size_t(i)];
                          if (r < 0) continue;  // dropped
                          const float prod = w[size_t(i)] * src[size_t(r * g.C + c)];
                          a = a + prod;
                          b = b + src[size_t(r * g.C + c)];
                          hd[size_t(r * g.C + c)] = w[size_t(i)] * dout[size_t(t * g.C + c)];
                        }
                        hy[size_t(t * g.C + c)] = a;
                        hs[size_t(t * g.C + c)] = b;
                      }
                    for (int64_t i = 0; i < slots; ++i) {
                      if (pos[size_t(i)] < 0) continue;  // dropped: dw 0
                      double acc = 0.0;
                      for (int64_t c = 0; c < g.C; ++c)
                        acc +=
                            double(dout[size_t((i / g.k) * g.C + c)]) * double(src[size_t(pos[size_t(i)] * g.C + c)]);
                      hw[size_t(i)] = float(acc);
                    }
                    return Outputs{out(be, "gathered", gathered),
                                   host("gathered (definition)", hg, M, g.C),
                                   out(be, "combined", y),
                                   host("combined (definition)", hy, g.T, g.C),
                                   out(be, "summed (w null)", sums),
                                   host("summed (definition)", hs, g.T, g.C),
                                   out(be, "dsrc", dsrc),
                                   host("dsrc (definition)", hd, M, g.C),
                                   host("dw", dw, slots, 1),
                                   host("dw (definition)", hw, slots, 1)};
                  },
                  {{"gathered", "gathered (definition)"},
                   {"combined", "combined (definition)"},
                   {"summed (w null)", "summed (definition)"},
                   {"dsrc", "dsrc (definition)"},
                   {"dw", "dw (definition)"}}});
  }
}

void embedding_cases(std::vector<OpCase>& cs) {
  struct Geo {
    int64_t V, B, T, C;
  };
  for (const Geo& g : {Geo{37, 3, 11, 24}, Geo{5, 1, 1, 1}, Geo{65, 4, 64, 300}, Geo{3, 2, 300, 7}}) {
    // float32 scatter-add in row order, float64 column sums in row order: bit for bit.
    cs.push_back(
        {"embed_forward/backward", cat("V=", g.V, " B=", g.B, " T=", g.T, " C=", g.C), 0.0, [g](Backend& be) {
           const int64_t n = g.B * g.T;
           std::mt19937 rng(uint32_t(g.V * 31 + g.T));
           std::vector<int32_t> idx(static_cast<size_t>(n));
           for (auto& i : idx) i = int32_t(rng() % uint32_t(g.V));
           Tensor wte = put(be, randv(size_t(g.V * g.C), 1), g.V, g.C);
           Tensor wpe = put(be, randv(size_t(g.T * g.C), 2), g.T, g.C), o = be.empty(n, g.C);
           Tensor d = put(be, randv(size_t(n * g.C), 3), n, g.C);
           Tensor dwte = put(be, randv(size_t(g.V * g.C), 4), g.V, g.C);
           Tensor dwpe = put(be, randv(size_t(g.T * g.C), 5), g.T, g.C);
           be.embed_forward(idx.data(), g.B, g.T, wte, wpe, o);
           be.embed_backward(idx.data(), g.B, g.T, d, dwte, dwpe);
           return Outputs{out(be, "out", o), out(be, "dwte (accumulated)", dwte), out(be, "dwpe (accumulated)", dwpe)};
         }});
  }
}

void vit_cases(std::vector<OpCase>& cs) {
  struct Geo {
    int64_t B, P, C;
  };
  for (const Geo& g : {Geo{3, 16, 20}, Geo{1, 1, 3}, Geo{300, 2, 5}, Geo{64, 16, 64}}) {
    cs.push_back({"vit_tokens_forward/backward", cat("B=", g.B, " P=", g.P, " C=", g.C), 0.0, [g](Backend& be) {
                    const int64_t L = g.P + 1;
                    Tensor pt = put(be, randv(size_t(g.B * g.P * g.C), 1), g.B * g.P, g.C);
                    Tensor cls = put(be, randv(size_t(g.C), 2), 1, g.C),
                           pos = put(be, randv(size_t(L * g.C), 3), L, g.C);
                    Tensor o = be.empty(g.B * L, g.C);
                    be.vit_tokens_forward(pt, g.B, cls.data, pos, o);
                    Tensor d = put(be, randv(size_t(g.B * L * g.C), 4), g.B * L, g.C), dp = be.empty(g.B * g.P, g.C);
                    Tensor dcls = put(be, randv(size_t(g.C), 5), 1, g.C),
                           dpos = put(be, randv(size_t(L * g.C), 6), L, g.C);
                    be.vit_tokens_backward(d, g.B, dp, dcls.data, dpos);
                    return Outputs{out(be, "tokens", o), out(be, "dpatches", dp), out(be, "dcls (accumulated)", dcls),
                                   out(be, "dpos (accumulated)", dpos)};
                  }});
  }
}

void cross_entropy_cases(std::vector<OpCase>& cs) {
  const int64_t shapes[][2] = {{1, 1}, {1, 10}, {7, 65}, {300, 1000}, {513, 10}, {3, 129}};
  uint32_t seed = 9;
  for (auto [N, V] : shapes) {
    seed += 2;
    OpCase c;
    c.op = "cross_entropy, cross_entropy_start/finish";
    c.params = cat("N=", N, " V=", V, ", ties for the maximum every third row");
    c.tol = 2e-6;
    c.run = [N, V, seed](Backend& be) {
      auto logits = randv(size_t(N * V), seed, 3.0f);
      std::mt19937 rng(seed + 1);
      std::vector<int32_t> tg(static_cast<size_t>(N));
      for (auto& t : tg) t = int32_t(rng() % uint32_t(V));
      // Ties for the maximum in every third row: argmax must be the first one.
      for (int64_t r = 0; r < N && V > 1; r += 3) {
        float* l = logits.data() + r * V;
        const float mx = *std::max_element(l, l + V) + 1.0f;
        const int64_t j = int64_t(rng() % uint32_t(V - 1)), k = j + 1 + int64_t(rng() % uint32_t(V - 1 - j));
        l[j] = l[k] = mx;
        tg[size_t(r)] = int32_t(r % 2 ? j : k);  // a hit on odd rows, a miss on even rows
      }
      Tensor lt = put(be, logits, N, V), d = be.empty(N, V);
      int64_t correct = -1;
      const double loss = be.cross_entropy(lt, tg.data(), &d, &correct);
      const double eval_loss = be.cross_entropy(lt, tg.data(), nullptr, nullptr);
      // Split into start / finish, with the logits overwritten in the backend's
      // memory and the host's targets changed after the start: the loss, hits
      // and dlogits are those of the inputs at the start.
      Tensor lt2 = put(be, logits, N, V), d2 = be.empty(N, V);
      std::vector<int32_t> tg2 = tg;
      be.cross_entropy_start(lt2, tg2.data(), &d2);
      Output dl_split = out(be, "start/finish: dlogits", d2);  // before the logits change (a download waits)
      be.fill(lt2, 0.0f);
      std::fill(tg2.begin(), tg2.end(), 0);
      int64_t c2 = -1;
      const double loss2 = be.cross_entropy_finish(&c2);
      return Outputs{scalar("loss", loss, 1e-12),
                     scalar("correct", double(correct), 0.0),
                     out(be, "dlogits", d),
                     scalar("loss (no dlogits, no count)", eval_loss, 1e-12),
                     scalar("start/finish: loss", loss2, 1e-12),
                     scalar("start/finish: correct", double(c2), 0.0),
                     std::move(dl_split)};
    };
    c.same = {{"loss (no dlogits, no count)", "loss"},
              {"start/finish: loss", "loss"},
              {"start/finish: correct", "correct"},
              {"start/finish: dlogits", "dlogits"}};
    cs.push_back(std::move(c));
  }
}

void optimiser_cases(std::vector<OpCase>& cs) {
  for (int64_t n : {1, 1000, 16384, 16385, 100003}) {
    cs.push_back({"sum_squares", cat("n=", n), 1e-12, [n](Backend& be) {
                    Tensor g = put(be, randv(size_t(n), uint32_t(n)), 1, n);
                    return Outputs{scalar("sum of squares", be.sum_squares(g))};
                  }});
  }
  const int64_t n = 5003;
  // Decayed ranges: many short ones (edges everywhere, first element included),
  // then (from step 3) one long one that ends at the buffer's last element.
  std::vector<IndexRange> ranges, ranges2{{1000, n - 1000}};
  std::mt19937 rng(5);
  for (int64_t at = 0; at < n;) {
    const int64_t len = 1 + int64_t(rng() % 37), gap = int64_t(rng() % 29) + 1;
    if (at + len > n) break;
    ranges.push_back({at, len});
    at += len + gap;
  }
  for (float wd : {0.0f, 0.1f}) {
    // The same FP32 operations in the same order (no FMA contraction on either
    // side, IEEE sqrt and division): bit for bit.
    cs.push_back(
        {"adamw_step",
         cat("n=", n, " weight decay ", wd, ", 4 steps (2 and 4 with grad_scale 0.37), ", ranges.size(),
             " decayed ranges, then 1 from step 3"),
         0.0,
         [n, wd, ranges, ranges2](Backend& be) {
           auto v0 = randv(size_t(n), 4, 0.01f);
           for (auto& x : v0) x = std::abs(x);
           Tensor p = put(be, randv(size_t(n), 1), 1, n), m = put(be, randv(size_t(n), 3, 0.1f), 1, n),
                  v = put(be, v0, 1, n);
           for (int64_t t = 1; t <= 4; ++t) {
             Tensor g = put(be, randv(size_t(n), 10 + uint32_t(t)), 1, n);
             be.adamw_step(p, g, m, v, t < 3 ? ranges : ranges2, 1e-3f * float(t), 0.9f, 0.99f, 1e-8f, wd, t,
                           t % 2 == 0 ? 0.37f : 1.0f);
           }
           return Outputs{out(be, "p", p), out(be, "m", m), out(be, "v", v)};
         }});
    // BF16 moments (MomentStorage::bf16): n odd, so the last float holds a pad half; the moments compared
    // as the BF16 values they hold (widened on the host).
    cs.push_back(
        {"adamw_step",
         cat("n=", n, " weight decay ", wd, ", BF16 moments, 4 steps (2 and 4 with grad_scale 0.37)"), 0.0,
         [n, wd, ranges, ranges2](Backend& be) {
           const int64_t half = moment_floats(MomentStorage::bf16, n);
           Tensor p = put(be, randv(size_t(n), 1), 1, n), m = be.zeros(1, half), v = be.zeros(1, half);
           for (int64_t t = 1; t <= 4; ++t) {
             Tensor g = put(be, randv(size_t(n), 10 + uint32_t(t)), 1, n);
             be.adamw_step(p, g, m, v, t < 3 ? ranges : ranges2, 1e-3f * float(t), 0.9f, 0.99f, 1e-8f, wd, t,
                           t % 2 == 0 ? 0.37f : 1.0f, MomentStorage::bf16);
           }
           auto widened = [&](const char* name, const Tensor& x) {
             std::vector<float> packed(static_cast<size_t>(half)), wide(static_cast<size_t>(n));
             be.download(x, packed.data());
             const auto* h = reinterpret_cast<const uint16_t*>(packed.data());
             for (int64_t i = 0; i < n; ++i) wide[size_t(i)] = fp4lab::bits_float(uint32_t(h[i]) << 16);
             return host(name, wide, 1, n);
           };
           return Outputs{out(be, "p", p), widened("m", m), widened("v", v)};
         }});
  }
  // adamw_step_clipped (the norm and the clip factor where g lives) against its definition by parts: the host
  // reads sqrt(sum_squares(g)), the factor is torch's clip_grad_norm_ rule written out here, then adamw_step.
  // Same bits on every backend (on the GPU: the device's float64 against the host's). Max norms: off, one
  // that clips (the norm is ~180), one above the norm; a NaN gradient (NaN norm: the step reads g unscaled).
  for (double clip : {0.0, 0.05, 1e9, -1.0}) {
    const bool nan_case = clip < 0.0;
    const int64_t n2 = 100003;  // 7 sum chunks, a partial one
    cs.push_back(
        {"adamw_step_clipped",
         cat("n=", n2, nan_case ? " a NaN gradient, max norm 1" : " max norm ", nan_case ? 1.0 : clip,
             ", 3 steps, weight decay 0.1, FP32 and BF16 moments"),
         nan_case ? 0.0 : 1e-6,
         [n2, clip, nan_case](Backend& be) {
           const double max_norm = nan_case ? 1.0 : clip;
           std::vector<IndexRange> dec{{0, 5003}, {20000, 50000}};
           Outputs o;
           for (MomentStorage ms : {MomentStorage::fp32, MomentStorage::bf16}) {
             const int64_t mf = moment_floats(ms, n2);
             Tensor p = put(be, randv(size_t(n2), 1), 1, n2), m = be.zeros(1, mf), v = be.zeros(1, mf);
             Tensor p2 = put(be, randv(size_t(n2), 1), 1, n2), m2 = be.zeros(1, mf), v2 = be.zeros(1, mf);
             const std::string tag = ms == MomentStorage::bf16 ? " (bf16 moments)" : "";
             for (int64_t t = 1; t <= 3; ++t) {
               auto gh = randv(size_t(n2), 20 + uint32_t(t));
               if (nan_case) gh[777] = std::nanf("");
               Tensor g = put(be, gh, 1, n2);
               const double norm = be.adamw_step_clipped(p, g, m, v, dec, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t,
                                                         max_norm, ms);
               const double norm2 = std::sqrt(be.sum_squares(g));
               const double coef = max_norm / (norm2 + 1e-6);
               const float scale = max_norm > 0.0 && coef < 1.0 ? float(coef) : 1.0f;
               be.adamw_step(p2, g, m2, v2, dec, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, scale, ms);
               if (t == 3) {
                 o.push_back(scalar("norm" + tag, nan_case ? 0.0 : norm));
                 o.push_back(scalar("norm by parts" + tag, nan_case ? 0.0 : norm2));
                 o.push_back(scalar("NaN norm" + tag, nan_case ? double(std::isnan(norm) && std::isnan(norm2)) : 1.0));
               }
             }
             // The values (BF16 moments widened), from element 778 on in the NaN case: the NaN element's p, m, v
             // are NaN, whose payloads are the hardware's.
             auto tail = [&](const std::string& name, const Tensor& x, bool packed) {
               std::vector<float> h(size_t(x.size()));
               be.download(x, h.data());
               if (packed) {
                 const auto* c = reinterpret_cast<const uint16_t*>(h.data());
                 std::vector<float> w(static_cast<size_t>(n2));
                 for (int64_t i = 0; i < n2; ++i) w[size_t(i)] = fp4lab::bits_float(uint32_t(c[i]) << 16);
                 h = std::move(w);
               }
               const int64_t from = nan_case ? 778 : 0;
               return host(name + tag, std::vector<float>(h.begin() + from, h.end()), 1, n2 - from);
             };
             const bool packed = ms == MomentStorage::bf16;
             o.push_back(tail("p", p, false));
             o.push_back(tail("p by parts", p2, false));
             o.push_back(tail("m", m, packed));
             o.push_back(tail("m by parts", m2, packed));
             o.push_back(tail("v", v, packed));
             o.push_back(tail("v by parts", v2, packed));
           }
           return o;
         },
         {{"norm", "norm by parts"}, {"p", "p by parts"}, {"m", "m by parts"}, {"v", "v by parts"},
          {"norm (bf16 moments)", "norm by parts (bf16 moments)"}, {"p (bf16 moments)", "p by parts (bf16 moments)"},
          {"m (bf16 moments)", "m by parts (bf16 moments)"}, {"v (bf16 moments)", "v by parts (bf16 moments)"}},
         [](const Outputs& o) {
           for (const Output& x : o)
             if (x.name.rfind("NaN norm", 0) == 0) CHECK_MESSAGE(x.v[0] == 1.0, "the NaN gradient gives a NaN norm");
         }});
  }
}


// ---- The runners ------------------------------------------------------------

std::string where(const OpCase& c) { return c.op + " [" + c.params + "]"; }

std::string value_str(const Output& o, size_t i) {
  char b[80];
  if (o.f32) {
    const float f = float(o.v[i]);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    std::snprintf(b, sizeof b, "%.9g (0x%08x)", double(f), u);
  } else {
    uint64_t u;
    std::memcpy(&u, &o.v[i], 8);
    std::snprintf(b, sizeof b, "%.17g (0x%016llx)", o.v[i], static_cast<unsigned long long>(u));
  }
  return b;
}
std::string index_str(const Output& o, size_t i) {
  if (o.v.size() <= 1) return cat("index ", i);
  const int64_t cols = std::max<int64_t>(1, o.cols);
  return cat("index ", i, " (row ", int64_t(i) / cols, ", col ", int64_t(i) % cols, ")");
}
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Runs c on be; an exception is a failed check naming the row.
bool run_case(Backend& be, const OpCase& c, const std::string& label, Outputs& outs) {
  std::string err;
  try {
    outs = c.run(be);
    be.synchronize();
  } catch (const std::exception& e) {
    err = e.what();
  }
  CHECK_MESSAGE(err.empty(), label, ": ", where(c), " threw: ", err);
  return err.empty();
}

// The row's same-bits pairs and property checks on one backend's outputs.
void check_properties(const OpCase& c, const Outputs& outs, const std::string& label) {
  for (const auto& [a, b] : c.same) {
    const Output &oa = find_output(outs, a), &ob = find_output(outs, b);
    size_t bad = 0, first = 0;
    if (oa.v.size() == ob.v.size())
      for (size_t i = 0; i < oa.v.size(); ++i)
        if (!same_bits(oa.v[i], ob.v[i]) && !bad++) first = i;
    const bool sizes = oa.v.size() == ob.v.size();
    CHECK_MESSAGE((sizes && bad == 0), label, ": ", where(c), ": '", a, "' and '", b, "' must hold the same bits: ",
                  sizes ? cat(bad, " of ", oa.v.size(), " elements differ, first at ", index_str(oa, first), ": ",
                              bad ? value_str(oa, first) : "", " vs ", bad ? value_str(ob, first) : "")
                        : cat("sizes ", oa.v.size(), " and ", ob.v.size()));
  }
  if (c.check) {
    INFO(label, ": ", where(c));
    c.check(outs);
  }
}

// One output of test against ref's: sizes, finiteness, then bits or the tolerance.
void compare_output(const std::string& ctx, const std::string& rl, const std::string& tl, const Output& r,
                    const Output& t, double tol) {
  const std::string head = cat(tl, " vs ", rl, ": ", ctx, ", output '", r.name, "' [", r.rows, " x ", r.cols, "]");
  CHECK_MESSAGE(r.v.size() == t.v.size(), head, ": ", rl, " gave ", r.v.size(), " values, ", tl, " ", t.v.size());
  if (r.v.size() != t.v.size()) return;
  const size_t n = r.v.size();
  size_t nonfinite = 0, nf_at = 0;
  for (size_t i = 0; i < n; ++i)
    if ((!std::isfinite(r.v[i]) || !std::isfinite(t.v[i])) && !nonfinite++) nf_at = i;
  CHECK_MESSAGE(nonfinite == 0, head, ": ", nonfinite, " non-finite values, first at ", index_str(r, nf_at), ": ", rl,
                " ", n ? value_str(r, nf_at) : "", ", ", tl, " ", n ? value_str(t, nf_at) : "");
  if (tol == 0.0) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; ++i)
      if (!same_bits(r.v[i], t.v[i]) && !bad++) first = i;
    CHECK_MESSAGE(bad == 0, head, ": not bit for bit: ", bad, " of ", n, " elements differ, first at ",
                  index_str(r, first), ": ", rl, " ", bad ? value_str(r, first) : "", ", ", tl, " ",
                  bad ? value_str(t, first) : "");
    return;
  }
  double mref = 0.0, md = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    mref = std::max(mref, std::abs(r.v[i]));
    const double d = std::abs(t.v[i] - r.v[i]);
    if (d > md) md = d, at = i;
  }
  const double bound = tol * (1.0 + mref);
  size_t over = 0;
  for (size_t i = 0; i < n; ++i) over += std::abs(t.v[i] - r.v[i]) > bound;
  CHECK_MESSAGE(md <= bound, head, ": max |", tl, " - ", rl, "| = ", md, " at ", index_str(r, at), ": ", rl, " ",
                n ? value_str(r, at) : "", ", ", tl, " ", n ? value_str(t, at) : "", "; max |", rl, "| = ", mref,
                ", tol ", tol, " -> bound tol * (1 + max |", rl, "|) = ", bound, "; ", over, " of ", n,
                " elements over it");
}

std::vector<std::string> names(const Outputs& o) {
  std::vector<std::string> v;
  for (const Output& x : o) v.push_back(x.name);
  return v;
}

}  // namespace

// ---- The grouped linear against each group's own calls ----------------------

namespace {
std::vector<float> get_all(Backend& be, const Tensor& t) {
  std::vector<float> v(size_t(t.size()));
  be.download(t, v.data());
  return v;
}
bool same_f32_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}
}  // namespace

int64_t check_grouped_linear(Backend& be) {
  int64_t compared = 0;
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
            w.push_back(put(be, randv(size_t(out * in), 100 + uint32_t(g), 0.2f), out, in));
            bt.push_back(put(be, randv(size_t(out), 200 + uint32_t(g)), 1, out));
            dw.push_back(be.zeros(out, in));
            dw_ref.push_back(be.zeros(out, in));
          }
          std::vector<const LayerPlan*> plans;
          std::vector<const float*> b;
          std::vector<float*> db, db_ref;
          std::vector<Tensor> dbt, dbt_ref;
          for (size_t g = 0; g < G; ++g) {
            plans.push_back(&lp[g]);
            dbt.push_back(be.zeros(1, out));
            dbt_ref.push_back(be.zeros(1, out));
            if (bias) b.push_back(bt[g].data);
          }
          for (size_t g = 0; g < G && bias; ++g) db.push_back(dbt[g].data), db_ref.push_back(dbt_ref[g].data);
          const LinearGroups groups{plans, w, b, off};
          const Tensor x = put(be, randv(size_t(M * in), 5), M, in), dy = put(be, randv(size_t(M * out), 6), M, out);
          // The grouped calls.
          Tensor y;
          std::unique_ptr<LinearState> st;
          be.grouped_linear_forward(groups, x, y, st);
          REQUIRE(y.rows == M);
          REQUIRE(y.cols == out);
          // Each group's own calls.
          Tensor y_ref = be.zeros(M, out);
          std::vector<std::unique_ptr<LinearState>> sts(G);
          for (size_t g = 0; g < G; ++g) {
            if (sizes[g] == 0) continue;
            Tensor yg = rows_of(y_ref, off[g], sizes[g]);
            be.linear_forward(lp[g], rows_of(x, off[g], sizes[g]), w[g], bias ? bt[g].data : nullptr, yg, sts[g]);
          }
          CHECK(same_f32_bits(get_all(be, y), get_all(be, y_ref)));
          ++compared;
          if (!backward) continue;
          Tensor dx;
          be.grouped_linear_backward(groups, *st, dy, dx, dw, db);
          Tensor dx_ref = be.zeros(M, in);
          for (size_t g = 0; g < G; ++g) {
            if (sizes[g] == 0) continue;
            Tensor dxg = rows_of(dx_ref, off[g], sizes[g]);
            be.linear_backward(lp[g], *sts[g], w[g], rows_of(dy, off[g], sizes[g]), dxg, dw_ref[g],
                                bias ? dbt_ref[g].data : nullptr);
          }
          CHECK(same_f32_bits(get_all(be, dx), get_all(be, dx_ref)));
          for (size_t g = 0; g < G; ++g) {
            CHECK(same_f32_bits(get_all(be, dw[g]), get_all(be, dw_ref[g])));
            CHECK(same_f32_bits(get_all(be, dbt[g]), get_all(be, dbt_ref[g])));
          }
          compared += 2 + 2 * int64_t(G);
        }
      }
    }
  }
  return compared;
}

std::vector<float> randv(size_t n, uint32_t seed, float s, float shift) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, s);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = d(g) + shift;
    if (x == 0.0f) x = 0.5f;
  }
  return v;
}

const std::vector<AttentionGeometry>& attention_geometries() {
  static const std::vector<AttentionGeometry> geos = {{1, 1, 1, 1},   {2, 1, 2, 3},    {2, 5, 3, 8},   {3, 17, 2, 16},
                                                      {2, 64, 4, 16}, {1, 130, 2, 32}, {2, 256, 6, 8}, {1, 256, 2, 64}};
  return geos;
}

Tensor put(Backend& be, const std::vector<float>& v, int64_t rows, int64_t cols) {
  if (int64_t(v.size()) != rows * cols)
    throw Error(cat("backend_cases: ", v.size(), " values for a [", rows, ", ", cols, "] tensor"));
  Tensor t = be.empty(rows, cols);
  be.upload(v.data(), t);
  return t;
}

const Output& find_output(const Outputs& outs, const std::string& name) {
  for (const Output& o : outs)
    if (o.name == name) return o;
  std::string have;
  for (const Output& o : outs) have += (have.empty() ? "'" : ", '") + o.name + "'";
  throw Error("backend_cases: no output '" + name + "' (the row has " + have + ")");
}

std::vector<OpCase> backend_op_cases() {
  std::vector<OpCase> cs;
  memory_cases(cs);
  linear_cases(cs);
  layernorm_cases(cs);
  gelu_cases(cs);
  attention_cases(cs);
  flash_attention_cases(cs);
  dropout_cases(cs);
  rows_cases(cs);
  embedding_cases(cs);
  moe_cases(cs);
  vit_cases(cs);
  cross_entropy_cases(cs);
  optimiser_cases(cs);
  return cs;
}

std::vector<OpCase> backend_op_cases(ActivationPrecision a) {
  std::vector<OpCase> cs = backend_op_cases();
  if (a == ActivationPrecision::fp32) return cs;
  for (OpCase& c : cs) {
    c.op += " [bf16 activations]";
    // bf16 mode rounds a dropout's output at p = 0 too (train/backend.hpp): x is not BF16.
    std::erase(c.same, std::pair<std::string, std::string>{"dropout_forward(x)", "x"});
    // Tolerances: a row or output compared within a tolerance in fp32 mode (two backends' summation orders)
    // may now see a value on either side of a BF16 rounding boundary: within 1 BF16 ulp of its magnitude,
    // 2^-8 (the stated ulps of docs/DESIGN.md). Bit-for-bit rows and outputs stay bit for bit (the same
    // FP32 formula and one RNE on both backends: GELU, dropout, the memory and residual-stream ops).
    static constexpr double kBf16Ulp = 1.0 / 256.0;
    if (c.tol > 0.0) c.tol = std::max(c.tol, kBf16Ulp);
    c.run = [run = std::move(c.run), a](Backend& be) {
      be.set_activations(a);
      struct Restore {
        Backend& be;
        ~Restore() { be.set_activations(ActivationPrecision::fp32); }
      } restore{be};
      Outputs outs = run(be);
      for (Output& o : outs)
        if (o.tol > 0.0) o.tol = std::max(o.tol, kBf16Ulp);
      return outs;
    };
  }
  return cs;
}

int64_t compare_backends(Backend& ref, Backend& test, const std::vector<OpCase>& cases, const CompareOptions& opt) {
  const std::string rl = opt.ref_label.empty() ? ref.name() : opt.ref_label;
  const std::string tl = opt.test_label.empty() ? test.name() : opt.test_label;
  int64_t compared = 0;
  for (const OpCase& c : cases) {
    Outputs r, t;
    const bool ran_ref = run_case(ref, c, rl, r), ran_test = run_case(test, c, tl, t);
    if (ran_ref) check_properties(c, r, rl);
    if (ran_test) check_properties(c, t, tl);
    if (!ran_ref || !ran_test) continue;
    const std::string ctx = where(c) + (opt.bitwise ? " (bit for bit)" : "");
    CHECK_MESSAGE(names(r) == names(t), tl, " vs ", rl, ": ", ctx, ": the backends returned different outputs");
    if (names(r) != names(t)) continue;
    for (size_t i = 0; i < r.size(); ++i) {
      const double tol = opt.bitwise ? 0.0 : (r[i].tol >= 0.0 ? r[i].tol : c.tol);
      compare_output(ctx, rl, tl, r[i], t[i], tol);
    }
    compared += int64_t(r.size());
  }
  return compared;
}

int64_t check_run_to_run(Backend& be, const std::vector<OpCase>& cases, const std::string& label) {
  const std::string l = label.empty() ? be.name() : label;
  int64_t compared = 0;
  for (const OpCase& c : cases) {
    Outputs a, b;
    if (!run_case(be, c, l, a) || !run_case(be, c, l, b)) continue;
    const std::string ctx = where(c) + " (run to run, bit for bit)";
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) compare_output(ctx, l + " run 1", l + " run 2", a[i], b[i], 0.0);
    compared += int64_t(a.size());
  }
  return compared;
}

}  // namespace fp4lab::train::test
