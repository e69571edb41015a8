// The `fp4lab` executable: the command line of apps/cli.cpp (run_cli).
#include "apps/commands.hpp"

int main(int argc, char** argv) { return fp4lab::run_cli(argc, argv); }
