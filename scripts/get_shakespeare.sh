#!/usr/bin/env bash
# Fetch tiny Shakespeare (Karpathy's char-rnn input.txt, 1,115,394 bytes,
# sha256 86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed) and
# check its sha256. Idempotent.
#
#   scripts/get_shakespeare.sh [DEST]              find or download it
#   scripts/get_shakespeare.sh --from PATH [DEST]  copy a local copy (no network)
#
# DEST defaults to data/tinyshakespeare.txt of the repository (where the GPT
# configs read it, run from the repository root); an installed copy of this
# script (DIR/share/fp4lab/scripts) uses data/ of the working directory.
# Sources, in order: --from PATH (only that); a copy already at DEST;
# shared/data/tinyshakespeare.txt next to or inside the repository (the team's
# machines); the public URL (curl or wget; GET_SHAKESPEARE_URL overrides it).
# Without network it says where to put the file and its sha256. A file whose
# sha256 differs is never installed.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
if [ -f "$here/CMakeLists.txt" ] && [ -d "$here/configs" ]; then root="$here"; else root="$PWD"; fi
want=86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed
size=1115394
url="${GET_SHAKESPEARE_URL:-https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt}"
from=""
dest=""
while [ $# -gt 0 ]; do
  case "$1" in
    --from) [ $# -ge 2 ] || { echo "get_shakespeare: --from needs a PATH" >&2; exit 2; }; from="$2"; shift 2 ;;
    --from=*) from="${1#--from=}"; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "get_shakespeare: unknown option '$1' (valid: --from PATH, [DEST])" >&2; exit 2 ;;
    *) [ -z "$dest" ] || { echo "get_shakespeare: one DEST only, got '$dest' and '$1'" >&2; exit 2; }; dest="$1"; shift ;;
  esac
done
dest="${dest:-$root/data/tinyshakespeare.txt}"
sha() { sha256sum "$1" | cut -d' ' -f1; }
ok() { [ -f "$1" ] && [ "$(sha "$1")" = "$want" ]; }
tmp="$dest.tmp.$$"
install_from() {  # copy $1 to $dest atomically
  mkdir -p "$(dirname "$dest")"
  trap 'rm -f "$tmp"' EXIT
  cp "$1" "$tmp" && mv "$tmp" "$dest"
}
help_offline() {
  cat >&2 <<EOF
get_shakespeare: could not fetch $url.
  Put Karpathy's char-rnn tinyshakespeare input.txt ($size bytes, sha256
  $want)
  at $dest, or pass a copy: $0 --from PATH
EOF
}
if [ -n "$from" ]; then
  [ -f "$from" ] || { echo "get_shakespeare: --from $from: no such file" >&2; exit 2; }
  got="$(sha "$from")"
  if [ "$got" != "$want" ]; then
    echo "get_shakespeare: --from $from has sha256 $got, expected $want; not installed" >&2; exit 2
  fi
  install_from "$from"
  echo "get_shakespeare: copied $from to $dest (sha256 verified)"
  exit 0
fi
if ok "$dest"; then echo "get_shakespeare: $dest present and verified"; exit 0; fi
for src in "$root/../shared/data/tinyshakespeare.txt" "$root/shared/data/tinyshakespeare.txt"; do
  if ok "$src"; then install_from "$src"; echo "get_shakespeare: copied $src"; exit 0; fi
done
mkdir -p "$(dirname "$dest")"
trap 'rm -f "$tmp"' EXIT
echo "get_shakespeare: downloading $url"
fetched=0
if command -v curl >/dev/null; then
  curl -fsSL --connect-timeout 20 --max-time 300 "$url" -o "$tmp" && fetched=1
elif command -v wget >/dev/null; then
  wget -q --timeout=20 "$url" -O "$tmp" && fetched=1
else
  echo "get_shakespeare: neither curl nor wget is installed (apt-get install curl)" >&2
fi
if [ "$fetched" != 1 ]; then help_offline; exit 1; fi
got="$(sha "$tmp")"
if [ "$got" != "$want" ]; then
  echo "get_shakespeare: downloaded file has sha256 $got, expected $want; not installed" >&2; exit 1
fi
mv "$tmp" "$dest"
echo "get_shakespeare: $dest ready"
