// The backend operation table (ggml's tests/test-backend-ops.cpp): every
// operation of the Backend interface (train/backend.hpp) as rows of
// (op, shapes and parameters, tolerance), and runners that execute every row on
// two backends and compare what comes out.
//
// A row (OpCase) builds its inputs from fixed seeds on the backend it is given,
// runs the op forward (and backward, where it has one) and returns the named
// outputs downloaded to the host. The comparison of an output is
//   tol == 0: bit for bit;
//   tol  > 0: max |test - ref| <= tol * (1 + max |ref|), every value finite.
// Example: the row {op "gelu_forward/backward", params "n=257", tol 2e-6}
// returns outputs "y" and "dx"; compare_backends(cpu, cuda, cases) checks each
// against the CPU's and, on failure, names the op, the row, the output, the
// worst index (row, col), both values with their bits and the bound.
//
// Adding a backend is one more compare_backends(...) line (tests/train/cpu/
// test_backend.cpp, tests/train/cuda/test_backend.cpp); adding an op or a shape
// is one more row in backend_cases.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "train/backend.hpp"

namespace fp4lab::train::test {

// One result of a row: a tensor downloaded to the host, or a float64 scalar
// result (a loss, a sum, a count). Float values are widened exactly to double,
// so comparing the doubles' bits compares the floats' bits.
struct Output {
  std::string name;
  std::vector<double> v;
  int64_t rows = 1, cols = 1;  // the tensor's shape (for the (row, col) of an index in messages)
  bool f32 = true;             // false: float64 results
  double tol = -1.0;           // >= 0: overrides the row's tolerance for this output
};
using Outputs = std::vector<Output>;

// The output called `name` (throws fp4lab::Error naming the row's outputs if none).
const Output& find_output(const Outputs& outs, const std::string& name);

struct OpCase {
  std::string op;      // the Backend call(s) exercised, e.g. "layernorm_forward/backward"
  std::string params;  // shapes and parameters, e.g. "N=37 C=64 beta"
  double tol = 0.0;    // 0 = bit for bit; else max |test - ref| <= tol * (1 + max |ref|)
  // Seeded inputs on the backend -> the op(s) -> the outputs on the host.
  std::function<Outputs(Backend&)> run;
  // Pairs of outputs that must hold the same bits on every backend: an op and
  // its definition by simpler ops (dropout_add == dropout_forward then
  // add_inplace), an input the op must leave as it was, two ways to the same result.
  std::vector<std::pair<std::string, std::string>> same = {};
  // Further properties of one backend's outputs, checked on every backend (may be empty).
  std::function<void(const Outputs&)> check = {};
};

// Every row: memory ops, linear (FP32 and every canned recipe), layernorm,
// GELU, attention, dropout and its fused forms, add_inplace, scale, gather /
// scatter rows, embeddings, ViT tokens, cross-entropy (one call and
// start/finish), sum_squares, AdamW.
std::vector<OpCase> backend_op_cases();
// The same rows with the backend's activation precision set to `a` for each
// row's run (Backend::set_activations; restored to fp32 after), the op named
// "... [bf16 activations]" for bf16; the pairs in `same` that hold only in
// fp32 mode (dropout at p = 0 leaves x as it was) are left out; a tolerance
// that is not 0 becomes at least 2^-8 (1 BF16 ulp; 0 stays bit for bit). A
// backend that does not implement `a` fails every row (set_activations throws).
std::vector<OpCase> backend_op_cases(ActivationPrecision a);

// Test inputs: n normal draws (never exactly zero) times s, plus `shift`, from
// a fixed seed; and a backend tensor [rows, cols] holding them (an Error when
// v has another size).
std::vector<float> randv(size_t n, uint32_t seed, float s = 1.0f, float shift = 0.0f);
Tensor put(Backend& be, const std::vector<float>& v, int64_t rows, int64_t cols);

// Attention geometries of the table's attention rows (batch, sequence,
// heads, head width): single tokens, odd widths, partial 64-row tiles.
struct AttentionGeometry {
  int64_t B, T, H, hd;
};
const std::vector<AttentionGeometry>& attention_geometries();

// The BF16 flash attention's rows (backend_cases_flash.cpp), appended by backend_op_cases().
void flash_attention_cases(std::vector<OpCase>& cs);

struct CompareOptions {
  std::string ref_label, test_label;  // in messages; empty: Backend::name()
  bool bitwise = false;               // every output bit for bit, whatever the row's tolerance
};

// Runs every row on `ref` and on `test` and checks, with doctest assertions:
// both ran without an exception, the same outputs, every value finite, each
// output within its tolerance of ref's, and the rows' `same` pairs and `check`
// on each backend. Returns the number of outputs compared.
int64_t compare_backends(Backend& ref, Backend& test, const std::vector<OpCase>& cases, const CompareOptions& opt = {});

// Backend::grouped_linear_forward / backward on `be` against each group's own
// linear_forward / linear_backward on its row views, bit for bit (doctest
// CHECKs): every canned recipe and plain FP32, empty and odd-sized groups,
// bias on and off, a forward-only pass. Returns the number of comparisons.
int64_t check_grouped_linear(Backend& be);

// Runs every row twice on `be`: every output the same bits both times
// (run-to-run determinism; the second run reuses memory the first freed).
int64_t check_run_to_run(Backend& be, const std::vector<OpCase>& cases, const std::string& label = "");

}  // namespace fp4lab::train::test
