// The shipped-config matrix: every experiment config of configs/ under every
// canned recipe, on one backend, trains a few steps and evaluates, with tiny
// overrides (generated data fixtures, 2 steps, small batches, GPT context at
// most 16) but the shipped model shapes and evaluation batch sizes, so a
// recipe that cannot run a shipped config (a block size the shapes do not
// allow, an evaluation batch whose row count a kernel rejects) fails here.
#pragma once

#include <string>
#include <vector>

namespace fp4lab::train::test {

// Runs the matrix on `backend` ("cpu" or "cuda") with doctest checks: each
// run completes, and its summary holds a finite final metric. FP4LAB_SOURCE_DIR
// (a compile definition) locates configs/. activations: the runs'
// precision.activations; configs: the configs' file stems to run (empty: all).
void check_config_matrix(const std::string& backend, int threads, const std::string& activations = "fp32",
                         const std::vector<std::string>& configs = {});

}  // namespace fp4lab::train::test
