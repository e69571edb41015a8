#!/usr/bin/env python3
"""`fp4lab train --rendezvous threads:N` (train/dist/launch.hpp): N data-parallel ranks in one process, one
thread each, without mpirun (python3 stdlib only). Checks:
  - threads:2 trains a tiny GPT; rank 0 alone writes the one run directory and prints the one result line;
    summary.json says world 2, the thread communicator, and counts the collectives a step;
  - threads:1 is the one-process run bit for bit (losses and checkpoint arrays);
  - threads:2 with ZeRO-3 and the weights gathered as NVFP4 codes gives the ZeRO-1 NVFP4-primary run's losses
    and checkpoint arrays bit for bit (the thread engine sums in rank order; clipping off), and its weight gather
    moves fewer bytes;
  - threads:2 with distributed.reduce "bf16" (train/dist/grad_reduce.hpp): ZeRO-3 gives the ZeRO-1 run bit for
    bit, which differs from reduce fp32's, and the gradients' alltoallv moves half the FP32 reduce-scatter's
    ring bytes; reduce "fp16" is refused in one line naming the key and the valid values;
  - a bad N, --rank/--world with it: exit 2 and one line naming the flag and what is valid.
Usage: test_train_threads.py FP4LAB_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile

FP4LAB = os.path.abspath(sys.argv[1])
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def train(d, name, rendezvous=None, dist=None, recipe="fp32", extra=()):
    cfg = {"name": name, "model": {"type": "gpt", "layers": 1, "heads": 2, "width": 40, "context": 8,
                                   "dropout": 0.0},
           "data": {"type": "char", "path": os.path.join(d, "text.txt")},
           "training": {"batch_size": 6, "steps": 6, "lr": 1e-2, "grad_clip": 0.0, "eval_interval": 3,
                        "eval_iters": 1, "log_interval": 1},
           "recipe": recipe, "seed": 5, "threads": 1, "output": {"dir": os.path.join(d, "runs")}}
    if dist:
        cfg["distributed"] = dist
    path = os.path.join(d, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    cmd = [FP4LAB, "train", path, "--quiet"] + (["--rendezvous", rendezvous] if rendezvous else []) + list(extra)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600), os.path.join(d, "runs",
                                                                                          f"{name}-{recipe}-s5")


def results(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(l) for l in f]
    losses = [r["loss"] for r in records if "loss" in r and not r.get("eval")]
    losses += [r[k] for r in records if r.get("eval") for k in ("train_loss", "val_loss")]
    with open(os.path.join(run_dir, "checkpoint.bin"), "rb") as f:
        ckpt = f.read()
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    return losses, ckpt[20 + int.from_bytes(ckpt[8:16], "little"):], summary  # the arrays after the header


with tempfile.TemporaryDirectory() as d:
    words = ["the cat sat. ", "a dog ran! ", "we sing low; ", "to be or not. "]
    with open(os.path.join(d, "text.txt"), "w") as f:
        f.write("".join(words[(i * 7 + i // 3) % 4] for i in range(600)))
    runs = {}
    for name, rv, dist, recipe in (("one", None, None, "fp32"), ("t1", "threads:1", None, "fp32"),
                                   ("t2", "threads:2", None, "fp32"),
                                   ("z1nv", "threads:2", {"zero": 1, "primary_weights": "nvfp4"}, "nvfp4"),
                                   ("z3nv", "threads:2", {"zero": 3, "primary_weights": "nvfp4",
                                                          "gather": "nvfp4"}, "nvfp4"),
                                   ("z1", "threads:2", {"zero": 1}, "fp32"),
                                   ("z1bf", "threads:2", {"zero": 1, "reduce": "bf16"}, "fp32"),
                                   ("z3bf", "threads:2", {"zero": 3, "reduce": "bf16"}, "fp32")):
        p, rd = train(d, name, rv, dist, recipe)
        check(p.returncode == 0, f"{name}: exit {p.returncode}: {p.stderr[-1500:]}")
        if p.returncode == 0:
            runs[name] = results(rd)
            check(len(p.stdout.strip().splitlines()) == 1, f"{name}: stdout is not one result line: {p.stdout!r}")
    if len(runs) == 8:
        t2 = runs["t2"][2]["distributed"]
        check(t2.get("world") == 2, f"threads:2: summary distributed.world {t2.get('world')}")
        check("allreduce_sum" in t2.get("collectives", {}).get("per_step", {}),
              f"threads:2: no all-reduce counted a step: {t2.get('collectives')}")
        check(runs["t2"][0] != runs["one"][0], "threads:2 gave the one-process losses bit for bit (sums differ)")
        check(runs["t1"][0] == runs["one"][0] and runs["t1"][1] == runs["one"][1],
              "threads:1 differs from one process")
        check(runs["z3nv"][0] == runs["z1nv"][0], "ZeRO-3 gather nvfp4 vs ZeRO-1 NVFP4 primary: losses differ")
        check(runs["z3nv"][1] == runs["z1nv"][1], "ZeRO-3 gather nvfp4 vs ZeRO-1 NVFP4 primary: checkpoints differ")
        per = runs["z3nv"][2]["distributed"]["collectives"]["per_step"]
        check(per.get("allgather_equal", {}).get("calls") == 1,
              f"ZeRO-3 gather nvfp4: one block's codes gathered once a step, got {per.get('allgather_equal')}")
        print("test_train_threads: ZeRO-3 gather nvfp4 on threads:2, rank 0's collectives a step:",
              {k: v["ring_bytes"] for k, v in per.items()})
        check(runs["z3bf"][0] == runs["z1bf"][0], "reduce bf16: ZeRO-3 vs ZeRO-1 losses differ")
        check(runs["z3bf"][1] == runs["z1bf"][1], "reduce bf16: ZeRO-3 vs ZeRO-1 checkpoints differ")
        check(runs["z1bf"][0] != runs["z1"][0], "reduce bf16 gave the reduce fp32 losses bit for bit")
        bf = runs["z1bf"][2]["distributed"]["collectives"]["per_step"]
        fp = runs["z1"][2]["distributed"]["collectives"]["per_step"]
        check("reduce_scatter_sum" not in bf and 2 * bf.get("alltoallv", {}).get("ring_bytes", -1)
              == fp["reduce_scatter_sum"]["ring_bytes"],
              f"reduce bf16: the gradients' bytes are not half the FP32 reduce-scatter's: {bf} against {fp}")
        cfg = os.path.join(d, "runs", "z1bf-fp32-s5", "config.json")
        with open(cfg) as f:
            check(json.load(f).get("distributed", {}).get("reduce") == "bf16", "reduce bf16: not in config.json")
    names = sorted(n for n in os.listdir(os.path.join(d, "runs")) if not n.endswith(".lock"))
    check(len(names) == 8, f"run directories (rank 0 alone writes): {names}")
    p, _ = train(d, "badreduce", "threads:2", {"zero": 1, "reduce": "fp16"})
    lines = p.stderr.strip().splitlines()
    want = 'distributed.reduce: "fp16" is not valid; valid: fp32, bf16'
    check(p.returncode != 0 and len(lines) == 1 and want in lines[0],
          f"reduce fp16: exit {p.returncode}, stderr {p.stderr!r} (want one line with {want!r})")
    for rv, extra, want in (("threads:0", (), "--rendezvous threads:0: N must be 1..64"),
                            ("threads:65", (), "--rendezvous threads:65: N must be 1..64"),
                            ("threads:two", (), "--rendezvous threads:two: N must be 1..64"),
                            ("threads:2", ("--world", "2"), "--rank/--world go with file:PATH"),
                            ("thread:2", (), "valid: mpi, file:PATH, threads:N")):
        p, _ = train(d, "bad", rv, extra=extra)
        lines = p.stderr.strip().splitlines()
        check(p.returncode == 2 and len(lines) == 1 and want in lines[0],
              f"--rendezvous {rv} {extra}: exit {p.returncode}, stderr {p.stderr!r} (want exit 2, one line with "
              f"{want!r})")

for f in failures:
    print("FAIL", f)
print("test_train_threads:", "FAILED" if failures else "passed")
sys.exit(1 if failures else 0)
