// The tokenizing half of scripts/prepare_tokens.sh (which fetches and checks the tokenizer and the corpus,
// then runs this): text files -> GPT-2 BPE token ids in llm.c shards, plus manifest.json.
//
//   node prepare_tokens.mjs TOKENIZER --source PATH --name NAME --out DIR.tmp [--max-mb N] [--shard-tokens N]
//        [--val-every N]
//   node prepare_tokens.mjs TOKENIZER --check DIR   exit 0 when DIR/manifest.json has this request and
//                                                   tokenizer and every shard its recorded sha256, else 1
//   TOKENIZER: --tokenizer DIR --tok-package P --tok-version V --tok-integrity I --tok-sha256 S
//              --request R --source-desc D (recorded in the manifest)
//
// Tokenizer: gpt-tokenizer's r50k_base encoding (GPT-2's BPE: 50256 merges + <|endoftext|> = 50256), from the
// unpacked npm tarball in --tokenizer (checked by the shell script). Text is encoded as ordinary text: a
// literal "<|endoftext|>" in a file is BPE-encoded as characters, not the special token (tiktoken's
// encode_ordinary, as llm.c's dev/data/fineweb.py does).
// Documents: every text file (no NUL byte, valid UTF-8; others are skipped and counted) of --source (a file
// or a directory walked recursively, symbolic links not followed), in byte order of the relative path, each
// preceded by <|endoftext|> (llm.c's fineweb.py: tokens = [eot] + encode_ordinary(text)).
// --max-mb N: the first files of that order up to N MB of text (at least one file; a single file is cut at
// the last newline before N MB).
// Split by file: a file is held out for validation when FNV-1a 32 of its relative path is 0 mod --val-every
// (default 100: about 1%), a choice that does not move when --max-mb changes; when that picks no file, the
// last file is held out. A single source file cannot be split by file: its last 10% (from the first newline
// at or after 90% of its bytes) is the validation text, as nanoGPT's prepare.py splits tiny Shakespeare.
// Shards: llm.c's format (dev/data/data_common.py write_datafile: 256 little-endian int32 header, magic
// 20240520, version 1, token count; then uint16 tokens), train_NNNNNN.bin of --shard-tokens tokens
// (default 100M) and val_NNNNNN.bin; the last shard of a split also takes a remainder under 1M tokens, so
// no shard but a split's only one is that short.
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import { createRequire } from "node:module";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
const need = (k) => {
  if (args[k] === undefined) throw new Error(`prepare_tokens.mjs: --${k} is required`);
  return args[k];
};
const tokDir = need("tokenizer");
const meta = {
  request: need("request"),
  source: need("source-desc"),
  tokenizer: {
    package: need("tok-package"),
    version: need("tok-version"),
    integrity: need("tok-integrity"),
    sha256: need("tok-sha256"),
    encoding: "r50k_base (GPT-2)",
  },
};
if (args.check !== undefined) process.exit(upToDate(args.check) ? 0 : 1);
const source = need("source"), name = need("name"), out = need("out");
const maxBytes = args["max-mb"] ? Number(args["max-mb"]) * 1e6 : Infinity;
const shardTokens = Number(args["shard-tokens"] ?? 100e6);
const valEvery = Number(args["val-every"] ?? 100);
const MIN_LAST = Math.min(1e6, shardTokens);
const EOT = 50256;

// DIR's manifest has meta's request and tokenizer, and every shard listed is there with its sha256.
function upToDate(dir) {
  try {
    const m = JSON.parse(fs.readFileSync(path.join(dir, "manifest.json"), "utf8"));
    if (m.request !== meta.request || JSON.stringify(m.tokenizer) !== JSON.stringify(meta.tokenizer)) return false;
    const listed = new Set(m.shards.map((s) => s.file));
    const present = fs.readdirSync(dir).filter((f) => f.endsWith(".bin"));
    if (present.length !== listed.size || !present.every((f) => listed.has(f))) return false;
    return m.shards.every(
      (s) => crypto.createHash("sha256").update(fs.readFileSync(path.join(dir, s.file))).digest("hex") === s.sha256,
    );
  } catch {
    return false;
  }
}

const require = createRequire(import.meta.url);
const enc = require(path.join(tokDir, "package/cjs/encoding/r50k_base.js"));
const encode = (s) => enc.encode(s, { disallowedSpecial: new Set() });

function fnv1a32(s) {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(s, "utf8")) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return h;
}

// The documents: [relative path, absolute path, bytes], in byte order of the relative path.
function listFiles(root) {
  const st = fs.statSync(root);
  if (st.isFile()) return [[path.basename(root), root, st.size]];
  const outList = [];
  const walk = (rel) => {
    for (const e of fs.readdirSync(path.join(root, rel), { withFileTypes: true })) {
      const r = rel ? rel + "/" + e.name : e.name;
      if (e.isDirectory()) walk(r);
      else if (e.isFile()) outList.push([r, path.join(root, r), 0]);
    }
  };
  walk("");
  outList.sort((a, b) => Buffer.compare(Buffer.from(a[0]), Buffer.from(b[0])));
  for (const f of outList) f[2] = fs.statSync(f[1]).size;
  return outList;
}

const decoder = new TextDecoder("utf-8", { fatal: true });
function readText(abs) {
  const buf = fs.readFileSync(abs);
  if (buf.includes(0)) return null;
  try {
    return decoder.decode(buf);
  } catch {
    return null;
  }
}

// One split's shard writer: tokens accumulate; a shard is written once a full one plus MIN_LAST are held.
class ShardWriter {
  constructor(split) {
    this.split = split;
    this.buf = new Uint16Array(1 << 20);
    this.n = 0;
    this.shards = [];
  }
  push(ids) {
    if (this.n + ids.length > this.buf.length) {
      const bigger = new Uint16Array(Math.max(this.buf.length * 2, this.n + ids.length));
      bigger.set(this.buf.subarray(0, this.n));
      this.buf = bigger;
    }
    this.buf.set(ids, this.n);
    this.n += ids.length;
    while (this.n >= shardTokens + MIN_LAST) {
      this.write(this.buf.subarray(0, shardTokens));
      this.buf.copyWithin(0, shardTokens, this.n);
      this.n -= shardTokens;
    }
  }
  finish() {
    if (this.n > 0 || this.shards.length === 0) this.write(this.buf.subarray(0, this.n));
  }
  write(tokens) {
    const file = `${this.split}_${String(this.shards.length).padStart(6, "0")}.bin`;
    const header = new Int32Array(256);
    header[0] = 20240520, header[1] = 1, header[2] = tokens.length;
    const h = Buffer.from(header.buffer), t = Buffer.from(tokens.buffer, tokens.byteOffset, tokens.byteLength);
    fs.writeFileSync(path.join(out, file), Buffer.concat([h, t]));
    const sha256 = crypto.createHash("sha256").update(h).update(t).digest("hex");
    this.shards.push({ file, tokens: tokens.length, bytes: h.length + t.length, sha256 });
  }
}

const t0 = process.hrtime.bigint();
let files = listFiles(source);
const single = files.length === 1 && fs.statSync(source).isFile();
// The text files (read once here to tell, again to encode), up to --max-mb of them: a prefix of the order.
let total = 0, skipped = 0;
const taken = [];
for (const f of files) {
  if (taken.length > 0 && total >= maxBytes) break;
  if (readText(f[1]) === null) {
    skipped++;
    continue;
  }
  taken.push(f), (total += f[2]);
}
if (taken.length === 0) throw new Error(`prepare_tokens.mjs: ${source}: no text file (UTF-8 without NUL bytes)`);
files = taken;
let valSet = new Set(files.filter((f) => fnv1a32(f[0]) % valEvery === 0).map((f) => f[0]));
if (!single && valSet.size === 0) valSet = new Set([files[files.length - 1][0]]);
if (!single && valSet.size === files.length) throw new Error(`prepare_tokens.mjs: ${source}: every file is held out`);

fs.mkdirSync(out, { recursive: true });
const writers = { train: new ShardWriter("train"), val: new ShardWriter("val") };
const stats = { train: { files: 0, bytes: 0 }, val: { files: 0, bytes: 0 }, skipped_files: skipped };
let textBytes = 0, lastReport = Date.now();
for (const [rel, abs] of files) {
  const text = readText(abs);
  if (single) {
    let cut = Buffer.from(text, "utf8");
    if (cut.length > maxBytes) {
      const nl = cut.lastIndexOf(10, maxBytes - 1);
      cut = cut.subarray(0, nl > 0 ? nl + 1 : maxBytes);
    }
    const at = cut.indexOf(10, Math.floor(cut.length * 0.9));
    const split = at < 0 ? Math.floor(cut.length * 0.9) : at + 1;
    const parts = { train: cut.subarray(0, split), val: cut.subarray(split) };
    for (const s of ["train", "val"]) {
      writers[s].push([EOT, ...encode(parts[s].toString("utf8"))]);
      stats[s].files++, (stats[s].bytes += parts[s].length), (textBytes += parts[s].length);
    }
    continue;
  }
  const s = valSet.has(rel) ? "val" : "train";
  const ids = encode(text);
  writers[s].push([EOT]);
  writers[s].push(ids);
  const b = Buffer.byteLength(text, "utf8");
  stats[s].files++, (stats[s].bytes += b), (textBytes += b);
  if (Date.now() - lastReport > 10000) {
    const secs = Number(process.hrtime.bigint() - t0) / 1e9;
    process.stderr.write(`prepare_tokens: ${(textBytes / 1e6).toFixed(0)} MB of text, ${(textBytes / 1e6 / secs).toFixed(2)} MB/s\n`);
    lastReport = Date.now();
  }
}
for (const s of ["train", "val"])
  if (writers[s].n === 0 && writers[s].shards.length === 0)
    throw new Error(`prepare_tokens.mjs: ${source}: no ${s} text (the files give no tokens to that split)`);
writers.train.finish();
writers.val.finish();
const secs = Number(process.hrtime.bigint() - t0) / 1e9;
const manifest = {
  format: "llm.c GPT-2 shards (magic 20240520, version 1, uint16 tokens)",
  corpus: name,
  ...meta,
  eot: EOT,
  vocab_size: 50257,
  max_mb: Number.isFinite(maxBytes) ? maxBytes / 1e6 : null,
  shard_tokens: shardTokens,
  split: single
    ? "one file: its last 10% (from the first newline at or after 90% of its bytes) is val"
    : `by file: val holds the files whose FNV-1a 32 of the relative path is 0 mod ${valEvery}`,
  val_files: single ? [] : [...valSet].sort(),
  stats,
  text_bytes: textBytes,
  seconds: Math.round(secs * 10) / 10,
  mb_per_s: Math.round((textBytes / 1e6 / secs) * 100) / 100,
  shards: [...writers.train.shards, ...writers.val.shards],
};
fs.writeFileSync(path.join(out, "manifest.json"), JSON.stringify(manifest, null, 1) + "\n");
const tok = (s) => writers[s].shards.reduce((a, x) => a + x.tokens, 0);
console.log(
  `prepare_tokens: ${(textBytes / 1e6).toFixed(1)} MB of text from ${stats.train.files + stats.val.files} files ` +
    `(${stats.skipped_files} not text, skipped) -> ${tok("train")} train + ${tok("val")} val tokens in ` +
    `${manifest.shards.length} shards, ${secs.toFixed(1)} s (${manifest.mb_per_s} MB/s)`,
);
