#!/usr/bin/env bash
# Fetch tiny Shakespeare (Karpathy's char-rnn input.txt, 1,115,394 bytes) into
# data/tinyshakespeare.txt (or $1), checking its sha256. Idempotent. Sources, in
# order: a copy already in place; shared/data/tinyshakespeare.txt next to the
# repository (the team's machines); the file's usual public URL (curl or wget).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$root/data/tinyshakespeare.txt}"
want=86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed
url=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$want" ]; }
if ok "$dest"; then echo "get_shakespeare: $dest present and verified"; exit 0; fi
mkdir -p "$(dirname "$dest")"
tmp="$dest.tmp.$$"
trap 'rm -f "$tmp"' EXIT
for src in "$root/../shared/data/tinyshakespeare.txt" "$root/shared/data/tinyshakespeare.txt"; do
  if ok "$src"; then cp "$src" "$tmp" && mv "$tmp" "$dest"; echo "get_shakespeare: copied $src"; exit 0; fi
done
echo "get_shakespeare: downloading $url"
if command -v curl >/dev/null; then curl -fsSL "$url" -o "$tmp"
elif command -v wget >/dev/null; then wget -q "$url" -O "$tmp"
else echo "get_shakespeare: neither curl nor wget is installed (apt-get install curl)" >&2; exit 1; fi
got="$(sha256sum "$tmp" | cut -d' ' -f1)"
if [ "$got" != "$want" ]; then
  echo "get_shakespeare: downloaded file has sha256 $got, expected $want; not installed" >&2; exit 1
fi
mv "$tmp" "$dest"
echo "get_shakespeare: $dest ready"
